//! The flash forward on cooperative matrices (tensor cores): S = Q·Kᵀ and O += P·V are
//! 16x16x16 products of f16 operands into f32 accumulators, one or two subgroups of 32
//! invocations per 16 query rows (two split the block's keys in Q·Kᵀ and head_dim in
//! P·V); the softmax between them runs on S in workgroup memory, two or four invocations
//! per row.
//!
//! A cooperative matrix has no element access, so O cannot be rescaled row by row in
//! registers. The softmax therefore keeps a reference max per row and moves it only when a
//! block's max passes it by more than `TAU` (FlashAttention-4's lazy rescale,
//! [`CoopTiling::rescale_threshold`]): P is then at most e^TAU, well inside f16, and the rare
//! rescale goes through workgroup memory. The decision is workgroup-uniform (a flag in
//! workgroup memory), so every barrier is a workgroup barrier.
//!
//! Workgroup memory: Q (whole or a few columns at a time, until its fragments are in
//! registers) and then each block's K and V over it, as f16 rows of head_dim (padded by 8
//! halves, so that 8 consecutive rows start on different banks); S as f32 (each
//! subgroup's 16 rows, reused for rescales and the output); P as f16, over K's rows where
//! it fits there (`CoopTiling::p_over_k`). The less memory a workgroup declares, the more
//! of them an SM runs at once.

use super::coop_scale;
use super::numerics::Helper;
use super::tiles::{Pair, visibility};
use super::writer::{Fragment, Template, Wgsl, concat, lines, uint};

use super::index::{Row, Rows, and_within};
use crate::spec::KernelSpec;

pub use crate::layout::coop::{CoopTiling, FRAG, SUBGROUP};

pub(super) fn directive(out: &mut Wgsl) {
    out.push_str("enable wgpu_cooperative_matrix;\n\n");
}

/// The phases of one block of a tensor-core kernel, each of which the phase model times
/// alone (`bench --only phases`): a kernel built without one keeps its barriers, so what it
/// saves is the phase's own work. The backward halves read `scores` as S (or Sᵀ), `grads`
/// as dP, `softmax` as the elementwise step (P and dS) and `accumulate` as the weighted
/// sums; they always stage (their loads run ahead of the products). The forward has no
/// dP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Phases {
    /// The block's K and V from global memory into workgroup memory.
    pub stage: bool,
    /// S = Q·Kᵀ on cooperative matrices, stored to workgroup memory as f32.
    pub scores: bool,
    /// Masks, the row max and sum, P = exp(S − m) stored as f16.
    pub softmax: bool,
    /// O += P·V on cooperative matrices.
    pub accumulate: bool,
    /// The backward's dP = dO·Vᵀ (dPᵀ in the key-major half).
    pub grads: bool,
}

impl Phases {
    /// Every phase: the kernel itself, the only set whose output is attention.
    pub const ALL: Phases = Phases {
        stage: true,
        scores: true,
        softmax: true,
        accumulate: true,
        grads: true,
    };
    /// No phase: the block loop alone, and the base of the sets that hold only some.
    pub const NONE: Phases = Phases {
        stage: false,
        scores: false,
        softmax: false,
        accumulate: false,
        grads: false,
    };

    /// Each phase of the forward by name, with the set holding only it.
    pub fn each() -> [(&'static str, Phases); 4] {
        let none = Phases::NONE;
        [
            (
                "stage",
                Phases {
                    stage: true,
                    ..none
                },
            ),
            (
                "scores",
                Phases {
                    scores: true,
                    ..none
                },
            ),
            (
                "softmax",
                Phases {
                    softmax: true,
                    ..none
                },
            ),
            (
                "accumulate",
                Phases {
                    accumulate: true,
                    ..none
                },
            ),
        ]
    }

    /// Each phase of a backward half by name (staging is not one), with the set holding
    /// only it.
    pub fn each_backward() -> [(&'static str, Phases); 4] {
        let none = Phases::NONE;
        [
            (
                "S",
                Phases {
                    scores: true,
                    ..none
                },
            ),
            (
                "dP",
                Phases {
                    grads: true,
                    ..none
                },
            ),
            (
                "elementwise",
                Phases {
                    softmax: true,
                    ..none
                },
            ),
            (
                "sums",
                Phases {
                    accumulate: true,
                    ..none
                },
            ),
        ]
    }

    /// The split-K decode's phase sets `bench --decode --phases` times, by name: the
    /// staged split pass whole and with none; each of the key pass (with its loads of K),
    /// the slice's max, exponentials and sum, and P·V (with its loads of V) alone; all but
    /// each; and all but the cache's loads (each word then made from its index, so the
    /// products still run). The flush runs in every set: without it nothing is written.
    pub fn decode_sets() -> Vec<(String, Phases)> {
        let none = Phases::NONE;
        let loads = Phases {
            stage: true,
            ..none
        };
        let each = [
            (
                "scores",
                Phases {
                    scores: true,
                    ..loads
                },
            ),
            (
                "softmax",
                Phases {
                    softmax: true,
                    ..none
                },
            ),
            (
                "values",
                Phases {
                    accumulate: true,
                    ..loads
                },
            ),
        ];
        let mut sets = vec![("all".to_string(), Phases::ALL), ("none".into(), none)];
        for (name, only) in each {
            let own = Phases {
                stage: false,
                ..only
            };
            sets.push((format!("only {name}"), only));
            sets.push((format!("without {name}"), Phases::ALL.without(own)));
        }
        sets.push(("without loads".into(), Phases::ALL.without(loads)));
        sets
    }

    /// Every phase but those in `other`.
    pub fn without(self, other: Phases) -> Phases {
        Phases {
            stage: self.stage && !other.stage,
            scores: self.scores && !other.scores,
            softmax: self.softmax && !other.softmax,
            accumulate: self.accumulate && !other.accumulate,
            grads: self.grads && !other.grads,
        }
    }
}

pub(super) fn kernel(out: &mut Wgsl, spec: &KernelSpec, t: &CoopTiling, keep: Phases) {
    constants(out, t);
    workgroup_memory(out, t);
    let fetches = [
        ("q", Rows::Q, "BR"),
        ("k", Rows::K, "BC"),
        ("v", Rows::V, "BC"),
    ];
    if t.fp8 {
        super::dtype::cache_codec(out, spec);
        out.put(KV_UNIT.plain());
    }
    for (name, of, rows) in fetches {
        let streamed = of != Rows::Q;
        match (spec.kv_fp8, of) {
            (Some(_), Rows::K | Rows::V) => fp8_fetch(out, spec, name, of, rows),
            _ => block_fetch(out, spec, t, (name, name, of, rows), streamed),
        }
    }
    if t.scaled {
        coop_scale::key_scale_memory(out);
        coop_scale::row_bits(out, spec, t.scales_at_fetch());
        coop_scale::note_scales(out, true);
    }
    put(out);
    match t.q_in_passes() {
        true => stage_q_columns(out, spec, t.q_columns(), t.scaled),
        false => stage_rows(out, "stage_q", "BR", &[("q", "0u")]),
    }
    super::flash::tile_key_range(out, spec);
    body(out, spec, t, keep);
    entry(out, spec, "flash_forward_coop");
}

/// The templates write a fragment's side, [`FRAG`], as `16` (their matrices are
/// `coop_mat16x16`).
const _: () = assert!(FRAG == 16);

/// A one-line fill: a name, a number or an expression.
pub(super) fn expr(x: impl ToString) -> Fragment {
    Fragment::from(x.to_string())
}

/// A workgroup barrier, as a line.
fn barrier() -> Fragment {
    Fragment::from("workgroupBarrier();\n")
}

fn constants(out: &mut Wgsl, t: &CoopTiling) {
    let (ks, ss, ps) = t.strides();
    let (kb, vb) = t.kv_rows();
    out.put(FORWARD_CONSTANTS.fill([
        ("br", uint(t.br)),
        ("bc", uint(t.bc)),
        ("nrg", uint(t.br / FRAG)),
        ("split", uint(t.split)),
        ("ks", uint(ks)),
        ("ss", uint(ss)),
        ("ps", uint(ps)),
        ("kb", uint(kb)),
        ("vb", uint(vb)),
        ("tau", expr(format!("{:?}", t.rescale_threshold()))),
    ]));
}

/// The forward's tiling, its lazy rescale's threshold and the base-2 exponent's factor.
const FORWARD_CONSTANTS: Template = Template {
    name: "coop_forward_constants",
    needs: &[],
    text: r#"// Cooperative-matrix tiling: BR query rows per workgroup, 16 per subgroup; BC keys
// per staged block; row strides KS (staged f16 rows), SS (S, f32), PS (P, f16).
const BR: u32 = $br;
const BC: u32 = $bc;
// Row groups of 16 query rows, and subgroups per row group.
const NRG: u32 = $nrg;
const SPLIT: u32 = $split;
const KS: u32 = $ks;
const SS: u32 = $ss;
const PS: u32 = $ps;
// The first staged rows of K and of V.
const KB: u32 = $kb;
const VB: u32 = $vb;
// The reference max moves only when a block's max passes it by more than TAU, so
// P = exp(s - m) stays below e^TAU.
const TAU: f32 = $tau;
// P = 2^(s·LOG2E − m·LOG2E), rounded to f16 (2^-11) on its way to P·V, needs no
// more than the hardware's exp2: the exactly split exp_f32 (0.5 ulp of f32) took a
// quarter of the softmax's time on an H100.
const LOG2E: f32 = 1.442695041;

"#,
};

fn workgroup_memory(out: &mut Wgsl, t: &CoopTiling) {
    let (ks, ss, ps) = t.strides();
    out.put(FORWARD_MEMORY.fill([
        ("staged", expr(t.staged_rows() * ks / 4)),
        ("s", expr(t.br * ss)),
    ]));
    match t.p_over_k() {
        true => out.put(P_OVER_K.plain()),
        false => out.put(P_APART.fill([("p", expr(t.br * ps))])),
    }
}

/// P in an area of its own.
const P_APART: Template = Template {
    name: "coop_p_apart",
    needs: &[],
    text: r#"var<workgroup> sh_p: array<f16, $p>;

// P's half i.
fn put_p(i: u32, x: f16) {
    sh_p[i] = x;
}

"#,
};

/// P over K's staged rows ([`CoopTiling::p_over_k`]).
const P_OVER_K: Template = Template {
    name: "coop_p_over_k",
    needs: &[],
    text: r#"// P's half i, over K's staged rows.
fn put_p(i: u32, x: f16) {
    let at = KB * KS + i;
    sh_kv[at / 4u][at % 4u] = x;
}

"#,
};

/// The forward's workgroup memory: the staging area, S, P, the tile's key range and the
/// rows' rescale factors, sums and flag.
const FORWARD_MEMORY: Template = Template {
    name: "coop_forward_memory",
    needs: &[],
    text: r#"// Q (whole, or QC columns at a time) until its fragments are in registers; then the
// current block's K from row KB and V from row VB over it; P in sh_p or, where it fits,
// over K (put_p).
var<workgroup> sh_kv: array<vec4<f16>, $staged>;
var<workgroup> sh_s: array<f32, $s>;
var<workgroup> sh_range: vec4<u32>;
// Each row's rescale factor in the current block, and its sum at the end.
var<workgroup> sh_c: array<f32, BR>;
var<workgroup> sh_l: array<f32, BR>;
// Word 0 nonzero when some row of the tile moved its reference max in this block (four
// words: every workgroup variable a multiple of 16 bytes).
var<workgroup> sh_rescale: array<atomic<u32>, 4>;

"#,
};

/// `fetch_{name}` of `rows` rows of `tensor` (`of`) in the kernel's operand dtype: f16, or
/// bf16 converted into f16 by its rows' scales as loaded, or, for a `streamed` block
/// tensor converted at its store, raw.
pub(super) fn block_fetch(
    out: &mut Wgsl,
    spec: &KernelSpec,
    t: &CoopTiling,
    (name, tensor, of, rows): (&str, &str, Rows, &str),
    streamed: bool,
) {
    match (t.scaled, streamed && t.converts_at_store()) {
        (true, true) => coop_scale::fetch_words(out, spec, (name, tensor), of, rows),
        (true, false) => coop_scale::fetch_half(out, spec, (name, tensor), of, rows),
        (false, _) => fetch(out, spec, name, tensor, of, rows),
    }
}

/// `fetch_{name}(r0, h, e)`: vec4 `e` of `rows` rows of `tensor` from r0 (zeros past the
/// sequence and past the block), into registers ahead of its store.
pub(super) fn fetch(
    out: &mut Wgsl,
    spec: &KernelSpec,
    name: &str,
    tensor: &str,
    of: Rows,
    rows: &str,
) {
    let load = |index: &str| Fragment::from(format!("x = {tensor}[({index} + c) >> 2u];"));
    fetch_with(out, spec, (name, of, rows), &load);
}

/// `kv_unit(i)`: what an fp8 cache's widened value is multiplied by to give the value it
/// stands for, `kv_scales[i]` (K's scale of KV head i; V's at `n_kv_heads + i`) times
/// [`FP8_UNIT`](super::dtype::cache_codec).
const KV_UNIT: Template = Template {
    name: "coop_kv_unit",
    needs: &[],
    text: r#"fn kv_unit(i: u32) -> f32 {
    return kv_scales[i] * FP8_UNIT;
}

"#,
};

/// `fetch_{name}(r0, h, e)` of an fp8 cache: the raw word of four values (0 past the
/// block), widened at its store (a conversion as loaded would wait on each load in turn).
fn fp8_fetch(out: &mut Wgsl, spec: &KernelSpec, name: &str, of: Rows, rows: &str) {
    out.put(FETCH_WORD.fill([
        ("name", expr(name)),
        ("cond", expr(fetch_guard(spec, of, rows))),
        ("index", expr(row_index(spec, of))),
    ]));
}

/// One word of a block's rows of an fp8 cache into registers, 0 where the guard `cond`
/// fails.
const FETCH_WORD: Template = Template {
    name: "coop_fetch_word",
    needs: &[],
    text: r#"fn fetch_$name(r0: u32, h: u32, e: u32) -> u32 {
    let r = r0 + e / (HEAD_DIM / 4u);
    let c = (e % (HEAD_DIM / 4u)) * 4u;
    var x = 0u;
    if ($cond) {
        x = $name[($index + c) >> 2u];
    }
    return x;
}

"#,
};

/// `fetch_{name}(r0, h, e)` whose load within the block is `load(index)`: statements that
/// set the vec4<f16> `x` from the row's first element `index` and its column `c`.
pub(super) fn fetch_with(
    out: &mut Wgsl,
    spec: &KernelSpec,
    (name, of, rows): (&str, Rows, &str),
    load: &dyn Fn(&str) -> Fragment,
) {
    out.put(FETCH.fill([
        ("name", expr(name)),
        ("cond", expr(fetch_guard(spec, of, rows))),
        ("load", load(&row_index(spec, of))),
    ]));
}

/// One vec4 of a block's rows into registers, zeros where the guard `cond` fails.
const FETCH: Template = Template {
    name: "coop_fetch",
    needs: &[],
    text: r#"fn fetch_$name(r0: u32, h: u32, e: u32) -> vec4<f16> {
    let r = r0 + e / (HEAD_DIM / 4u);
    let c = (e % (HEAD_DIM / 4u)) * 4u;
    var x = vec4<f16>(0.0);
    if ($cond) {
        $load
    }
    return x;
}

"#,
};

/// The flat index of row `r` of `of` for head `h`: a query row of a tile at its position
/// and head ([`super::index::row_at`]).
fn row_index(spec: &KernelSpec, of: Rows) -> String {
    match of {
        Rows::Q => {
            let (pos, head) = super::index::row_at(spec, "r", "h");
            of.index(&pos, &head)
        }
        _ => of.index("r", "h"),
    }
}

/// The end of the rows of `of` a tile reads: its query rows' ([`super::index::tile_rows_end`])
/// or the keys'.
fn rows_end_of(spec: &KernelSpec, of: Rows) -> &'static str {
    match of {
        Rows::Q => super::index::tile_rows_end(spec),
        _ => super::index::rows_end(spec),
    }
}

/// The test that vec4 `e` (row `r`, first column `c`) of a block of `rows` rows of `of`
/// lies in the block, the sequence and its tensor's row.
pub(super) fn fetch_guard(spec: &KernelSpec, of: Rows, rows: &str) -> String {
    let within_block = format!(
        "e < {rows} * (HEAD_DIM / 4u) && r < {}",
        rows_end_of(spec, of)
    );
    and_within(spec, &within_block, of.row(), "c")
}

/// `put4(at, x)`: four halves into the staging area from half `at`;
/// `put_row4(row, c4, x)`: into staged row `row` at vec4 column `c4`;
/// `put(e, base, x)`: a fetched vec4 of a block of BC rows into staged row
/// `base + e / (HEAD_DIM / 4)`.
pub(super) fn put(out: &mut Wgsl) {
    out.put(PUT.plain());
}

/// The stores into the staging area ([`put`]).
///
/// (The staging area holds vec4s of halves, so a fetched vec4 is one store and one
/// index clamp, not four; NVIDIA's compiler refuses cooperative loads of f16 through a
/// u32 pointer, but takes them through a vec4<f16> one. Storing the second word first
/// in the upper half of each subgroup, so that no two invocations of a store hit one
/// bank, was slower on an H100: the seq 4096 backward 2.816 ms against 2.599.)
const PUT: Template = Template {
    name: "coop_put",
    needs: &[],
    text: r#"fn put4(at: u32, x: vec4<f16>) {
    sh_kv[at / 4u] = x;
}

fn put_row4(row: u32, c4: u32, x: vec4<f16>) {
    put4(row * KS + c4 * 4u, x);
}

fn put(e: u32, base: u32, x: vec4<f16>) {
    if (e < BC * (HEAD_DIM / 4u)) {
        put_row4(base + e / (HEAD_DIM / 4u), e % (HEAD_DIM / 4u), x);
    }
}

"#,
};

/// `{name}(r0, h, tid)`: `rows` rows of each fetched tensor from r0 into the staged rows
/// from its base, once per workgroup (not per block).
pub(super) fn stage_rows(out: &mut Wgsl, name: &str, rows: &str, tensors: &[(&str, &str)]) {
    let puts = lines(tensors.iter().map(|(fetch, base)| {
        format!(
            "put_row4({base} + e / (HEAD_DIM / 4u), e % (HEAD_DIM / 4u), fetch_{fetch}(r0, h, e));"
        )
    }));
    out.put(STAGE_ROWS.fill([("name", expr(name)), ("rows", expr(rows)), ("puts", puts)]));
}

/// Rows of fetched tensors into the staging area, a vec4 per invocation at a time.
const STAGE_ROWS: Template = Template {
    name: "coop_stage_rows",
    needs: &[],
    text: r#"fn $name(r0: u32, h: u32, tid: u32) {
    for (var e = tid; e < $rows * (HEAD_DIM / 4u); e = e + WG) {
        $puts
    }
}

"#,
};

/// `stage_q(r0, h, tid, c0)`: columns c0..c0 + QC of the tile's BR rows of Q into the
/// staging area, rows QS halves apart (bf16 rows scaled into f16 by their power of two).
fn stage_q_columns(out: &mut Wgsl, spec: &KernelSpec, cols: u32, scaled: bool) {
    let at = format!("{} + c0 + (e % (QC / 4u)) * 4u", row_index(spec, Rows::Q));
    let load = match scaled {
        true => SCALED_Q_LOAD.fill([("at", expr(&at))]),
        false => Fragment::from(format!("w = q[({at}) >> 2u];")),
    };
    let within = format!("r < {}", super::index::tile_rows_end(spec));
    let cond = and_within(spec, &within, Row::Qk, "c0 + (e % (QC / 4u)) * 4u");
    out.put(STAGE_Q_COLUMNS.fill([
        ("cols", uint(cols)),
        ("stride", uint(cols + 8)),
        ("cond", expr(cond)),
        ("load", load),
    ]));
}

/// Q staged in passes of QC columns, where its whole rows would not fit beside K and V.
const STAGE_Q_COLUMNS: Template = Template {
    name: "coop_stage_q_columns",
    needs: &[],
    text: r#"// Q is staged QC columns at a time, rows QS halves apart.
const QC: u32 = $cols;
const QS: u32 = $stride;

fn stage_q(r0: u32, h: u32, tid: u32, c0: u32) {
    for (var e = tid; e < BR * (QC / 4u); e = e + WG) {
        let r = r0 + e / (QC / 4u);
        var w = vec4<f16>(0.0);
        if ($cond) {
            $load
        }
        put4((e / (QC / 4u)) * QS + (e % (QC / 4u)) * 4u, w);
    }
}

"#,
};

/// Four bf16 values of Q from half `at` into f16, scaled by their row's power of two.
const SCALED_Q_LOAD: Template = Template {
    name: "coop_scaled_q_load",
    needs: &[],
    text: r#"let i = ($at) >> 1u;
w = to_half(vec2<u32>(q[i], q[i + 1u]), q_bits(0u, r, h));
"#,
};

pub(super) const A: &str = "coop_mat16x16<f16, A>";
pub(super) const B: &str = "coop_mat16x16<f16, B>";
pub(super) const C: &str = "coop_mat16x16<f32, C>";

/// A pointer to staged half `i` (an expression in halves, a multiple of 4: the area holds
/// vec4s of halves). Loads through it take their stride in vec4s ([`staged_stride`]).
pub(super) fn staged(i: &str) -> String {
    format!("&sh_kv[({i}) / 4u]")
}

/// A cooperative load's stride through a [`staged`] pointer, from a stride in halves: it
/// counts the pointer's elements, vec4s (a stride in halves reads the wrong rows).
pub(super) fn staged_stride(halves: &str) -> String {
    format!("{halves} / 4u")
}

/// How the softmax spreads a block's S over the workgroup: rows per subgroup, invocations
/// per row, keys per invocation.
pub(super) fn softmax_layout(t: &CoopTiling) -> (u32, u32, u32) {
    let rows = FRAG / t.split;
    let lanes = SUBGROUP / rows;
    (rows, lanes, t.bc / lanes)
}

fn body(out: &mut Wgsl, spec: &crate::KernelSpec, t: &CoopTiling, keep: Phases) {
    let lp = super::tiles::KeyLoop::of(spec, true);
    let (rows, lanes, keys) = softmax_layout(t);
    let (names, who) = row_names(spec);
    let mine = t.v_frags / t.split;
    let kv = [("k", "KB"), ("v", "VB")];
    // With V over K, V's stores wait for the barrier that ends S (or stands in for it in a
    // phase-cut pass), and the rescale's uniform load (a barrier, emitted in every pass)
    // publishes them to P·V. Never with scaled operands, whose stores note both tensors'
    // scales together (`CoopTiling::v_over_k`).
    let staged_first = match t.v_over_k() {
        true => 1,
        false => 2,
    };
    let (softmax, row_sum) = match keep.softmax {
        true => softmax((lanes, keys), t.scaled, lp.full_tiles, who),
        false => Default::default(),
    };
    out.put(FORWARD.fill([
        ("origin", expr(super::index::tile_origin(spec))),
        ("q_maxima", q_maxima(t)),
        ("stage_q", stage_q(t)),
        (
            "accumulators",
            lines((0..mine).map(|n| format!("var o_{n} = {C}();"))),
        ),
        ("rows", uint(rows)),
        ("lanes", uint(lanes)),
        ("names", names),
        ("end", expr(super::index::tile_rows_end(spec))),
        ("pos", expr(who.0)),
        ("scaled", scaled_row_state(t.scaled)),
        ("pre", lp.pre.clone()),
        ("loop_head", lp.head.clone()),
        (
            "fetch",
            phase(keep.stage, || fetch_block(t, &kv, "j0", "kv_h")),
        ),
        (
            "stage",
            phase_or_barrier(keep.stage, || put_block(t, &kv[..staged_first])),
        ),
        ("scores", phase_or_barrier(keep.scores, || scores(t))),
        (
            "stage_v",
            phase(keep.stage && t.v_over_k(), || puts(t, &kv[1..])),
        ),
        ("softmax", softmax),
        ("row_sum", row_sum),
        ("rescale", rescale(mine)),
        ("accumulate", phase(keep.accumulate, || accumulate(t))),
        ("finish", finish(spec, t, (lanes, who))),
    ]));
}

/// A phase's code where the kernel keeps it, else nothing.
pub(super) fn phase(kept: bool, code: impl FnOnce() -> Fragment) -> Fragment {
    match kept {
        true => code(),
        false => Fragment::default(),
    }
}

/// A phase's code (which ends with a barrier) where the kernel keeps it, else the barrier.
fn phase_or_barrier(kept: bool, code: impl FnOnce() -> Fragment) -> Fragment {
    match kept {
        true => code(),
        false => barrier(),
    }
}

/// The forward on cooperative matrices: per block of keys, K and V staged, S = Q·Kᵀ, the
/// softmax, the rare rescale of O, O += P·V; then O / l and the LSE.
///
/// The softmax's rows: `lanes` invocations per row, each `keys` keys of a block, `lanes`
/// apart (interleaved: a row's invocations read consecutive words of S, and a subgroup's
/// rows, SS words apart, fall in distinct banks; in runs of `keys` consecutive keys four
/// invocations shared each bank, and the H100's forward at seq 4096, d 128 took 1.017 ms
/// against 0.931 interleaved).
///
/// The block's loads (`$fetch`) are issued before the barrier that waits for the previous
/// block to be done with workgroup memory, so that their latency overlaps the wait.
const FORWARD: Template = Template {
    name: "coop_forward",
    needs: &[],
    text: r#"fn flash_forward_coop(tile: u32, h: u32, tid: u32, sg: u32, lane: u32) {
    let kv_h = kv_head(h);
    let row0 = $origin;
    // The subgroup's 16 rows (row group) and its half of their products, if split.
    let rg = sg % NRG;
    let part = sg / NRG;
    if (tid == 0u) {
        sh_range = tile_key_range(row0);
    }
    $q_maxima
    $stage_q
    $accumulators
    let r = sg * $rows + lane / $lanes;
    let row = row0 + r;
    $names
    let k0 = lane % $lanes;
    var lo = 0u;
    var hi = 0u;
    if (row < $end) {
        let range = key_range($pos);
        lo = range.x;
        hi = range.y;
    }
    var m = NEG_BIG;
    var l = 0.0;
    var lc = 0.0;
    $scaled
    // The row of P·V's fragments this invocation rescales and stores.
    let pr = rg * 16u + lane / 2u;
    let range = workgroupUniformLoad(&sh_range);
    let kt_end = (range.y + BC - 1u) / BC;
    $pre
    $loop_head
        let j0 = kt * BC;
        $fetch
        // The previous block is done with workgroup memory (K, V, S, P, sh_c).
        workgroupBarrier();
        if (tid == 0u) {
            atomicStore(&sh_rescale[0], 0u);
        }
        $stage
        $scores
        $stage_v
        $softmax
        $row_sum
        $rescale
        $accumulate
    }
    $finish
}

"#,
};

/// Where bf16 rows are scaled at fetch, the maxima of the tile's rows of Q, before Q is
/// staged by them.
fn q_maxima(t: &CoopTiling) -> Fragment {
    match t.scales_at_fetch() {
        true => Q_MAXIMA.fill([("subgroup", uint(SUBGROUP))]),
        false => Fragment::default(),
    }
}

/// The tile's rows of Q's maxima into `sh_qb`, seen by every invocation before Q's staging.
const Q_MAXIMA: Template = Template {
    name: "coop_q_maxima",
    needs: &[],
    text: r#"q_row_maxima(row0, h, sg * $subgroup + lane);
workgroupBarrier();
"#,
};

/// With bf16 operands: O's own reference max (log2 units) and the row's Q scale.
fn scaled_row_state(scaled: bool) -> Fragment {
    match scaled {
        true => SCALED_ROW_STATE.plain(),
        false => Fragment::default(),
    }
}

/// bf16's row state beside m, l and lc: O's reference max `mo` and the row's Q scale.
const SCALED_ROW_STATE: Template = Template {
    name: "coop_scaled_row_state",
    needs: &[],
    text: r#"var mo = NEG_BIG;
let qs = from_half(q_bits(0u, row, h));
"#,
};

/// The statements that name a softmax row's position and query head, and those names:
/// none and (`row`, `h`), or with packed heads `pos` and `hr` from the row.
fn row_names(spec: &KernelSpec) -> (Fragment, (&'static str, &'static str)) {
    match spec.grid.pack_heads {
        true => (PACKED_ROW_NAMES.plain(), ("pos", "hr")),
        false => (Fragment::default(), ("row", "h")),
    }
}

/// A packed tile's row: its position and its query head.
const PACKED_ROW_NAMES: Template = Template {
    name: "coop_packed_row_names",
    needs: &[],
    text: r#"let pos = row_pos(row);
let hr = row_head(row, h);
"#,
};

/// Q into workgroup memory and its fragments `qa_k` into registers: whole, or in column
/// passes, each pass's fragments loaded before the next overwrites them.
fn stage_q(t: &CoopTiling) -> Fragment {
    if !t.q_in_passes() {
        let loads = lines((0..t.qk_frags).map(|k| format!("let qa_{k} = {};", q_fragment(k))));
        return STAGE_Q_WHOLE.fill([("loads", loads)]);
    }
    let cols = t.q_columns();
    concat((0..t.head_dim / cols).map(|pass| {
        let first = pass * cols / FRAG;
        let loads = (0..cols / FRAG)
            .filter(|k| first + k < t.qk_frags)
            .map(|k| {
                let at = staged(&format!("rg * {FRAG}u * QS + {}u", k * FRAG));
                let stride = staged_stride("QS");
                format!("let qa_{} = coopLoadT<{A}>({at}, {stride});", first + k)
            });
        STAGE_Q_PASS.fill([("c0", uint(pass * cols)), ("loads", lines(loads))])
    }))
}

/// The tile's Q staged whole, and its fragments `$loads`.
const STAGE_Q_WHOLE: Template = Template {
    name: "coop_stage_q_whole",
    needs: &[],
    text: r#"stage_q(row0, h, tid);
workgroupBarrier();
$loads
"#,
};

/// One column pass of the tile's Q, and the pass's fragments `$loads`.
const STAGE_Q_PASS: Template = Template {
    name: "coop_stage_q_pass",
    needs: &[],
    text: r#"workgroupBarrier();
stage_q(row0, h, tid, $c0);
workgroupBarrier();
$loads
"#,
};

/// Row group `rg`'s Q fragment `k` (head_dim columns 16k..16k + 16), from workgroup memory.
fn q_fragment(k: u32) -> String {
    format!(
        "coopLoadT<{A}>({}, {})",
        staged(&format!("rg * {FRAG}u * KS + {}u", k * FRAG)),
        staged_stride("KS")
    )
}

/// The block's K and V into workgroup memory: every load issued before any store, so
/// that their latencies overlap. (Loading the next block during this one's products
/// instead held 32 more registers and was 1.1-1.3x slower on an H100; a loop of
/// load-store pairs was 1.9x slower.)
pub(super) fn stage_block(
    t: &CoopTiling,
    tensors: &[(&str, &str)],
    r0: &str,
    head: &str,
) -> Fragment {
    fetch_block(t, tensors, r0, head).then(put_block(t, tensors))
}

/// The loads of [`stage_block`], declared.
fn fetch_block(t: &CoopTiling, tensors: &[(&str, &str)], r0: &str, head: &str) -> Fragment {
    fetches(t, tensors, (r0, head), "let ")
}

/// `{decl}p{name}_{i} = fetch_{name}(r0, head, ..)` for each carried vec4 of each tensor
/// (`decl` is `let `/`var ` where the registers are declared); where the block's bf16
/// words are converted at their store, each row's maximum into `b{name}_{i}` beside them
/// (from `row_max`, or from the fetched values: [`fetched_maxima`]).
pub(super) fn fetches(
    t: &CoopTiling,
    tensors: &[(&str, &str)],
    (r0, head): (&str, &str),
    decl: &str,
) -> Fragment {
    let mut each = Vec::new();
    for i in 0..t.carried() {
        for (name, _) in tensors {
            let e = carried_index(t, i);
            each.push(format!(
                "{decl}p{name}_{i} = fetch_{name}({r0}, {head}, {e});"
            ));
            if t.converts_at_store() && !t.scales_at_fetch() {
                let bits = coop_scale::block_row_bits(name, r0, head, &e);
                each.push(format!("{decl}b{name}_{i} = {bits};"));
            }
        }
    }
    lines(each).then(fetched_maxima(t, tensors, decl))
}

/// Where rows are scaled at fetch, each carried vec4's row maximum `b{name}_{i}` from the
/// lanes that fetched the row, once every load is issued and before the barrier the stores
/// wait for. (After the barrier, beside the stores, a bf16 chunk of 512 rows over a 32k
/// cache took 5.27 ms on an H200, 2026-12-03, against 4.86 here; one butterfly of K's and
/// V's maxima packed into a word, 5.53.)
fn fetched_maxima(t: &CoopTiling, tensors: &[(&str, &str)], decl: &str) -> Fragment {
    let each = (0..t.carried()).flat_map(|i| {
        tensors
            .iter()
            .map(move |(name, _)| format!("{decl}b{name}_{i} = lanes_row_bits(p{name}_{i});"))
    });
    match t.scales_at_fetch() {
        true => lines(each),
        false => Fragment::default(),
    }
}

/// Carried vec4 `i`'s index in a block: by invocation, or where each row's scale is
/// reduced over the lanes that fetched it, by subgroup and lane, so that a row's lanes are
/// consecutive lanes of one subgroup whatever order the adapter numbers invocations in.
fn carried_index(t: &CoopTiling, i: u32) -> String {
    match t.scales_at_fetch() {
        true => format!("sg * {SUBGROUP}u + lane + {i}u * WG"),
        false => format!("tid + {i}u * WG"),
    }
}

/// The stores of [`stage_block`], then a barrier.
fn put_block(t: &CoopTiling, tensors: &[(&str, &str)]) -> Fragment {
    puts(t, tensors).then(barrier())
}

/// The carried vec4s into the staged rows (converted into f16 where they are held raw),
/// and with bf16 operands each row's scales beside them.
pub(super) fn puts(t: &CoopTiling, tensors: &[(&str, &str)]) -> Fragment {
    concat((0..t.carried()).map(|i| {
        let e = carried_index(t, i);
        let stores = lines(tensors.iter().map(|(name, base)| {
            let x = match (t.converts_at_store(), t.fp8) {
                (true, _) => format!("to_half(p{name}_{i}, b{name}_{i})"),
                // Exact: the widened values are f16's own.
                (false, true) if matches!(*name, "k" | "v") => {
                    format!("vec4<f16>(widen_kv4(p{name}_{i}))")
                }
                _ => format!("p{name}_{i}"),
            };
            format!("put({e}, {base}, {x});")
        }));
        match t.scaled {
            true => stores.then(coop_scale::note_at_store(
                [tensors[0].0, tensors[1].0],
                (&e, i),
            )),
            false => stores,
        }
    }))
}

/// Independent accumulation chains of each score fragment: a tensor core's f32 sums are
/// not IEEE (products are aligned and truncated), so one chain over head_dim / 16 steps
/// left the LSE at 0.89 of the pass bound on an H100 at head_dim 256 (seed 1); two
/// chains, summed at the end, at most 0.64 over seeds 1-2 (four: 0.60 over seeds 1-3,
/// for more registers), at the same speed.
const SCORE_CHAINS: u32 = 2;

/// S = Q·Kᵀ for the row group's 16 rows, the subgroup's share of the block's key
/// fragments, into sh_s; then a barrier.
fn scores(t: &CoopTiling) -> Fragment {
    let q = |k: u32| format!("qa_{k}");
    key_fragments(t)
        .then(transposed_product(t, (t.qk_frags, &q), "KB", "sh_s", "sm"))
        .then(barrier())
}

/// `n{n}`: the first column of each of the subgroup's share of the block's fragments.
pub(super) fn key_fragments(t: &CoopTiling) -> Fragment {
    let mine = t.bc / FRAG / t.split;
    lines((0..mine).map(|n| format!("let n{n} = (part * {mine}u + {n}u) * {FRAG}u;")))
}

/// `dest` = own · (staged rows from `base`)ᵀ for the row group's 16 rows and the
/// subgroup's key fragments `n{n}`, over head_dim: `own(k)` is the row group's A fragment
/// of head_dim columns 16k..16k + 16; accumulators are named from `tag`.
pub(super) fn transposed_product(
    t: &CoopTiling,
    (depth, own): (u32, &dyn Fn(u32) -> String),
    base: &str,
    dest: &str,
    tag: &str,
) -> Fragment {
    concat((0..t.bc / FRAG / t.split).map(|n| {
        let rows = |k: u32| staged(&format!("({base} + n{n}) * KS + {}u", k * FRAG));
        let (chains, sum) = chained_product((depth, own), &rows, &format!("{tag}_{n}"));
        let store = format!("coopStoreT({sum}, &{dest}[rg * {FRAG}u * SS + n{n}], SS);");
        chains.then(lines([store]))
    }))
}

/// own · (the 16 staged rows at `rows(k)`, column block k)ᵀ over head_dim in
/// [`SCORE_CHAINS`] chains named from `tag`: declares and accumulates them, and returns
/// those statements and the chains' pairwise sum. Every product over head_dim goes
/// through here, so that two of them on equal operands agree to the bit.
pub(super) fn chained_product(
    (dk, own): (u32, &dyn Fn(u32) -> String),
    rows: &dyn Fn(u32) -> String,
    tag: &str,
) -> (Fragment, String) {
    let chains = SCORE_CHAINS.min(dk);
    let declared = (0..chains).map(|c| format!("var {tag}_{c} = {C}();"));
    let summed = (0..dk).map(|k| {
        let acc = format!("{tag}_{}", k % chains);
        let b = format!("coopLoad<{B}>({}, {})", rows(k), staged_stride("KS"));
        format!("{acc} = coopMultiplyAdd({}, {b}, {acc});", own(k))
    });
    let sum = pairwise(
        &(0..chains)
            .map(|c| format!("{tag}_{c}"))
            .collect::<Vec<_>>(),
    );
    (lines(declared.chain(summed)), sum)
}

/// `terms` summed in pairs: ((a + b) + (c + d)).
pub(super) fn pairwise(terms: &[String]) -> String {
    match terms.len() {
        1 => terms[0].clone(),
        n => format!(
            "({} + {})",
            pairwise(&terms[..n / 2]),
            pairwise(&terms[n / 2..])
        ),
    }
}

/// Where a [`weighted_sum`]'s 16-bit weights live: an area of their own (by name), or the
/// staging area from a half (an expression).
#[derive(Clone, Copy)]
pub(super) enum Weights<'a> {
    Area(&'a str),
    Staged(&'a str),
}

/// O += P·V for the row group's 16 rows, the subgroup's share of head_dim.
fn accumulate(t: &CoopTiling) -> Fragment {
    let src = match t.p_over_k() {
        true => Weights::Staged("KB * KS"),
        false => Weights::Area("sh_p"),
    };
    weighted_sum(t, t.v_frags, (src, "p"), "VB", "o")
}

/// `acc_n` += src · (staged rows from `base`) for the row group's 16 rows: `src` holds
/// 16-bit weights (rows of the tile, PS apart, a column per staged row), its A fragments
/// named from `tag`; the subgroup takes its share of head_dim.
pub(super) fn weighted_sum(
    t: &CoopTiling,
    frags: u32,
    (src, tag): (Weights, &str),
    base: &str,
    acc: &str,
) -> Fragment {
    let mine = frags / t.split;
    let mut each = Vec::new();
    for k in 0..t.bc / FRAG {
        let at = format!("rg * {FRAG}u * PS + {}u", k * FRAG);
        let weights = match src {
            Weights::Area(area) => format!("&{area}[{at}], PS"),
            Weights::Staged(from) => format!(
                "{}, {}",
                staged(&format!("{from} + {at}")),
                staged_stride("PS")
            ),
        };
        each.push(format!("let {tag}a_{k} = coopLoadT<{A}>({weights});"));
        for n in 0..mine {
            let value = staged(&format!(
                "({base} + {}u) * KS + (part * {mine}u + {n}u) * {FRAG}u",
                k * FRAG
            ));
            let b = format!("coopLoadT<{B}>({value}, {})", staged_stride("KS"));
            each.push(format!(
                "{acc}_{n} = coopMultiplyAdd({tag}a_{k}, {b}, {acc}_{n});"
            ));
        }
    }
    lines(each)
}

/// Row max or sum over the row's `lanes` invocations (consecutive lanes).
pub(super) fn row_reduce(x: &str, op: &str, lanes: u32) -> Fragment {
    let masks = std::iter::successors(Some(1), |m| Some(m * 2)).take_while(|&m| m < lanes);
    lines(masks.map(|mask| {
        let shuffled = format!("subgroupShuffleXor({x}, {mask}u)");
        match op {
            "max" => format!("{x} = max({x}, {shuffled});"),
            _ => format!("{x} = {x} + {shuffled};"),
        }
    }))
}

/// The invocation's share of a row of S: masked and modified scores, the lazy max, P (by
/// `put_p`), the row's rescale factor into sh_c. Ends with the rescale flag read, a workgroup
/// barrier that also publishes P and sh_c. Returns the statements and, apart, the row sum's
/// step ([`super::flash::row_sum`]).
fn softmax(
    (lanes, keys): (u32, u32),
    scaled: bool,
    full_tiles: bool,
    (row, h): (&str, &str),
) -> (Fragment, Fragment) {
    // With bf16 operands S holds Q'·K'ᵀ: each row's and each key's scale undo the
    // conversion.
    let scale = |c: u32| match scaled {
        true => format!(" * qs * sh_ks[x_{c}]"),
        false => String::new(),
    };
    let pairs: Vec<Pair> = (0..keys)
        .map(|c| Pair {
            v: format!("v_{c}"),
            range: format!("j_{c} >= lo && j_{c} < hi"),
            row: row.to_string(),
            j: format!("j_{c}"),
        })
        .collect();
    let positions = |c: usize| {
        vec![
            format!("let x_{c} = k0 + {}u;", c as u32 * lanes),
            format!("let j_{c} = j0 + x_{c};"),
        ]
    };
    let score = |c: usize| {
        vec![format!(
            "let s_{c} = select(NEG_BIG, score({row}, {h}, j_{c}, sh_s[r * SS + x_{c}]{}), v_{c});",
            scale(c as u32)
        )]
    };
    let each_key = visibility(&pairs, h, full_tiles, positions, score);
    let max =
        lines([format!("var rm = {};", max_of("s", keys))]).then(row_reduce("rm", "max", lanes));
    let (weights, row_sum) = match scaled {
        true => scaled_weights(lanes, keys),
        false => weights(keys, (row, h)),
    };
    (each_key.then(max).then(weights), row_sum)
}

/// `max(max({v}_0, {v}_1), ..)` over `keys` values.
fn max_of(v: &str, keys: u32) -> String {
    (1..keys).fold(format!("{v}_0"), |acc, c| format!("max({acc}, {v}_{c})"))
}

/// The lazy max of S (the rescale factor of O into sh_c), l, and P (by `put_p`); and
/// apart, l's step.
fn weights(keys: u32, (row, h): (&str, &str)) -> (Fragment, Fragment) {
    let each = (0..keys).flat_map(|c| {
        [
            format!("let p_{c} = select(0.0, exp2(fma(s_{c}, LOG2E, -ml)), v_{c});"),
            format!("put_p(r * PS + x_{c}, f16(dropped({row}, {h}, j_{c}, p_{c})));"),
        ]
    });
    (
        LAZY_MAX.fill([("weights", lines(each))]),
        row_sum("c", keys),
    )
}

/// The row's reference max moved where a block's max passes it by more than TAU, its
/// rescale factor `c` (into sh_c, and the flag raised where O holds something to rescale),
/// then the `$weights` P against it.
const LAZY_MAX: Template = Template {
    name: "coop_lazy_max",
    needs: &[Helper::Exp],
    text: r#"// An empty row keeps NEG_BIG; a first visible key always moves it.
let moved = rm > m + TAU;
// O holds nothing to rescale before the row's first visible key.
let rescales = moved && m != NEG_BIG;
let mn = select(m, rm, moved);
let c = exp_f32(m - mn);
m = mn;
if (rescales) {
    atomicStore(&sh_rescale[0], 1u);
}
if (k0 == 0u) {
    sh_c[r] = c;
}
let ml = m * LOG2E;
$weights
"#,
};

/// l rescaled by `c` and the block's P added, compensated (`softmax` exponentiates and
/// compensates l).
fn row_sum(c: &str, keys: u32) -> Fragment {
    super::flash::row_sum("", c, &pairwise_of("p", keys))
}

/// `{v}_0 + {v}_1 + ..` over `keys` values, summed pairwise.
fn pairwise_of(v: &str, keys: u32) -> String {
    pairwise(&(0..keys).map(|c| format!("{v}_{c}")).collect::<Vec<_>>())
}

/// With bf16 operands (see `coop_scale`): l follows the max of S in registers, block by
/// block; O's weights 2^(s·log2 e + v_j − mo), with V's row scales 2^v_j, follow their own
/// lazy max `mo`, whose moves rescale O. Each weight is the score's P times 2^v_j times the
/// row's 2^(m·log2 e − mo): one exponential per score, not two. Returns those and, apart,
/// l's step.
fn scaled_weights(lanes: u32, keys: u32) -> (Fragment, Fragment) {
    let products = (0..keys).flat_map(|c| {
        [
            format!("let p_{c} = select(0.0, exp2(fma(s_{c}, LOG2E, -ml)), v_{c});"),
            format!("let u_{c} = p_{c} * sh_vs[x_{c}];"),
        ]
    });
    let each = (0..keys).flat_map(|c| {
        [
            format!("let w_{c} = u_{c} * g0 * g1;"),
            format!("put_p(r * PS + x_{c}, f16(dropped(row, h, j_{c}, w_{c})));"),
        ]
    });
    let weights = SCALED_LAZY_MAX.fill([
        ("products", lines(products)),
        ("max", expr(max_of("u", keys))),
        ("reduce", row_reduce("ru", "max", lanes)),
        ("weights", lines(each)),
    ]);
    (weights, row_sum("cl", keys))
}

/// bf16's row state: l's max follows S's, and O's reference `mo` (log2 units) moves
/// lazily with the block's largest s·log2 e + v_j, read off the largest of the `$products`
/// 2^(s·log2 e − m·log2 e + v_j); its rescale factor `c` into sh_c; then O's `$weights`.
/// The row's factor 2^(m·log2 e − mo) multiplies as two halves, so that neither
/// overflows f32; past 2^252 every product is 0 anyway (each is at most
/// 2^(TAU·log2 e + mo − m·log2 e) once mo has moved).
const SCALED_LAZY_MAX: Template = Template {
    name: "coop_scaled_lazy_max",
    needs: &[Helper::Exp],
    text: r#"let mn = max(m, rm);
let cl = exp_f32(m - mn);
m = mn;
let ml = m * LOG2E;
$products
var ru = $max;
$reduce
let rt = select(NEG_BIG, log2(ru) + ml, ru > 0.0);
let moved = rt > mo + TAU * LOG2E;
let rescales = moved && mo != NEG_BIG;
let mon = select(mo, rt, moved);
let c = exp2(mo - mon);
mo = mon;
if (rescales) {
    atomicStore(&sh_rescale[0], 1u);
}
if (k0 == 0u) {
    sh_c[r] = c;
}
let d = clamp(ml - mo, -252.0, 252.0);
let g0 = exp2(0.5 * d);
let g1 = exp2(d - 0.5 * d);
$weights
"#,
};

/// O *= c row by row, through the subgroup's 16x16 corner of sh_s, in a block where some
/// row moved its reference max (rare: the max of a causal row settles within a few blocks).
fn rescale(frags: u32) -> Fragment {
    let moved = "workgroupUniformLoad(&sh_rescale[0]) != 0u";
    rescale_rows(frags, ("o", moved, "sh_c"))
}

/// `acc_n` *= `factors[pr]` row by row (`pr` the row this invocation rescales), through
/// the subgroup's 16x16 corner of sh_s, when the workgroup-uniform `moved` holds.
pub(super) fn rescale_rows(frags: u32, (acc, moved, factors): (&str, &str, &str)) -> Fragment {
    let each = (0..frags).map(|n| RESCALE_FRAGMENT.fill([("acc", expr(format!("{acc}_{n}")))]));
    RESCALE_ROWS.fill([
        ("moved", expr(moved)),
        ("factors", expr(factors)),
        ("each", concat(each)),
    ])
}

/// Accumulator rows scaled by their factors where `$moved`, a fragment (`$each`) at a
/// time: the invocation scales half of row `pr`.
const RESCALE_ROWS: Template = Template {
    name: "coop_rescale_rows",
    needs: &[],
    text: r#"if ($moved) {
    let cr = $factors[pr];
    let at = pr * SS + part * 16u + (lane % 2u) * 8u;
    $each
}
"#,
};

/// Accumulator fragment `$acc` through the subgroup's corner of sh_s, its rows scaled.
const RESCALE_FRAGMENT: Template = Template {
    name: "coop_rescale_fragment",
    needs: &[],
    text: r#"coopStoreT($acc, &sh_s[rg * 16u * SS + part * 16u], SS);
workgroupBarrier();
for (var e = 0u; e < 8u; e = e + 1u) {
    sh_s[at + e] = sh_s[at + e] * cr;
}
workgroupBarrier();
$acc = coopLoadT<coop_mat16x16<f32, C>>(&sh_s[rg * 16u * SS + part * 16u], SS);
workgroupBarrier();
"#,
};

/// O / l into the output through the subgroup's corner of sh_s, a 16-column fragment at a
/// time, and the LSE.
fn finish(spec: &KernelSpec, t: &CoopTiling, (lanes, who): (u32, (&str, &str))) -> Fragment {
    let end = super::index::tile_rows_end(spec);
    let (pos, head) = who;
    let (out_pos, out_head) = super::index::row_at(spec, "out_row", "h");
    let mine = t.v_frags / t.split;
    // The row's factor from O's accumulators to O: 1 / l, or with bf16 operands
    // 2^(mo − m·log2 e) / l (O's weights were taken against mo); 0 for an empty row. With a
    // sink joined, m and l include it: the f16 factor gains e^(m_old − m), and the bf16
    // one, 2^(mo − m·log2 e) / l on the new m and l, already has it.
    let join = super::sinks::join(spec.masks.sinks, head, "m", "lt", "corr");
    let sliced = super::extend::sliced(spec);
    let (slot, factor) = match (t.scaled, join.is_some()) {
        // Key slices leave their outputs unnormalized for the reduce, against m.
        (true, false) if sliced => (
            "select(0.0, exp2(mo - m * LOG2E), lt != 0.0)",
            Fragment::from("let inv = sh_l[pr];\n"),
        ),
        (true, _) => (
            "select(0.0, exp2(mo - m * LOG2E - log2(lt)), lt != 0.0)",
            Fragment::from("let inv = sh_l[pr];\n"),
        ),
        (false, true) => (
            "select(0.0, corr / lt, lt != 0.0)",
            Fragment::from("let inv = sh_l[pr];\n"),
        ),
        // Key slices leave their outputs unnormalized for the reduce.
        (false, false) if sliced => ("lt", Fragment::from("let inv = 1.0;\n")),
        (false, false) => ("lt", INVERSE_SUM.plain()),
    };
    // Over an fp8 cache's widened values, O also takes its KV head's V scale.
    let (o_unit, inv) = match t.fp8 {
        true => (
            Fragment::from(format!(
                "let o_unit = kv_unit(dims.n_kv_heads + kv_head({out_head}));"
            )),
            "(inv * o_unit)",
        ),
        false => (Fragment::default(), "inv"),
    };
    let stores = (0..mine).map(|n| {
        let first = fragment_column(mine, n);
        let cond = and_within(
            spec,
            &format!("out_row < {end}"),
            Row::V,
            &format!("col_{n}"),
        );
        STORE_O.fill([
            ("n", expr(n)),
            ("first", expr(first)),
            ("cond", expr(cond)),
            ("inv", expr(inv)),
        ])
    });
    FORWARD_FINISH.fill([
        ("reduce", row_reduce("lt", "sum", lanes)),
        ("join", join.unwrap_or_default()),
        ("slot", expr(slot)),
        ("end", expr(end)),
        ("pos", expr(pos)),
        ("head", expr(head)),
        ("factor", factor),
        ("out_pos", expr(out_pos)),
        ("out_head", expr(out_head)),
        ("o_unit", o_unit),
        ("stores", concat(stores)),
    ])
}

/// The first column of accumulator fragment `n` of the subgroup's `mine`.
pub(super) fn fragment_column(mine: u32, n: u32) -> String {
    format!("(part * {mine}u + {n}u) * {FRAG}u")
}

/// After the block loop: the row's l (its sink `$join`ed), its factor `$slot` into sh_l
/// and its LSE; then each of O's fragments (`$stores`) through sh_s, scaled by the row's
/// `inv` (`$factor`).
const FORWARD_FINISH: Template = Template {
    name: "coop_forward_finish",
    needs: &[],
    text: r#"var lt = l + lc;
$reduce
$join
if (k0 == 0u) {
    sh_l[r] = $slot;
}
if (row < $end && k0 == 0u) {
    store_lse($pos, $head, m, lt);
}
workgroupBarrier();
$factor
let out_row = row0 + pr;
$o_unit
let base = o_index($out_pos, $out_head);
let c8 = (lane % 2u) * 8u;
let x = pr * SS + part * 16u + c8;
$stores
"#,
};

/// 1 / l, 0 for an empty row.
const INVERSE_SUM: Template = Template {
    name: "coop_inverse_sum",
    needs: &[],
    text: r#"var inv = 0.0;
if (sh_l[pr] != 0.0) {
    inv = 1.0 / sh_l[pr];
}
"#,
};

/// O's fragment `$n` (first column `$first`) into the output, its half of row `pr` where
/// `$cond` holds, times `$inv`.
const STORE_O: Template = Template {
    name: "coop_store_o",
    needs: &[],
    text: r#"workgroupBarrier();
coopStoreT(o_$n, &sh_s[rg * 16u * SS + part * 16u], SS);
workgroupBarrier();
let col_$n = $first + c8;
if ($cond) {
    let col = col_$n;
    store_out4(base + col, vec4<f32>(sh_s[x], sh_s[x + 1u], sh_s[x + 2u], sh_s[x + 3u]) * $inv);
    store_out4(base + col + 4u, vec4<f32>(sh_s[x + 4u], sh_s[x + 5u], sh_s[x + 6u], sh_s[x + 7u]) * $inv);
}
"#,
};

/// A row tile of a head (the KV head for a key-major backward half) of a sequence into
/// `body`, the longest tiles first (see `grid_order`). The layout assumes subgroups of
/// exactly [`SUBGROUP`] invocations; the runtime refuses adapters whose subgroups may be
/// any other size.
pub(super) fn entry(out: &mut Wgsl, spec: &KernelSpec, body: &str) {
    let at = super::grid_order::mapping(
        spec,
        super::grid_order::Order::LongestFirst { chunked: true },
    );
    // With packed heads the grid's heads are KV heads; the body takes their first query head.
    let head = match spec.grid.pack_heads {
        true => format!("({}) * q_per_kv()", at.head),
        false => at.head.to_string(),
    };
    out.put(ENTRY.fill([
        ("name", expr(&spec.name)),
        ("builtin", expr(at.builtin)),
        ("prologue", at.prologue),
        ("body", expr(body)),
        ("tile", expr(at.tile)),
        ("head", expr(head)),
        ("flush", super::flex::flush_call(spec)),
        ("enter", super::residency::enter(spec)),
        ("leave", super::residency::leave(spec)),
    ]));
}

/// The entry point: the grid's mapping (`$prologue`) to a tile and a head, then the
/// kernel's body and any flush of the modifiers' sums.
const ENTRY: Template = Template {
    name: "coop_entry",
    needs: &[],
    text: r#"@compute @workgroup_size(WG)
fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32,
    @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32$builtin) {
    $prologue
    $enter
    $body($tile, $head, tid, sg, lane);
    $flush
    $leave
}
"#,
};

#[cfg(test)]
mod tests {
    use super::Phases;

    /// The sizes of `wgsl`'s workgroup variables that are not a multiple of 16 bytes.
    fn unpadded_workgroup_variables(wgsl: &str) -> Vec<String> {
        let module = naga::front::wgsl::parse_str(wgsl).expect("parses");
        let mut layouter = naga::proc::Layouter::default();
        layouter.update(module.to_ctx()).expect("lays out");
        module
            .global_variables
            .iter()
            .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup)
            .map(|(_, g)| (g.name.clone().unwrap_or_default(), layouter[g.ty].size))
            .filter(|(_, size)| size % 16 != 0)
            .map(|(name, size)| format!("{name}: {size} bytes"))
            .collect()
    }

    /// Every workgroup variable of a tensor-core kernel is a multiple of 16 bytes, so that
    /// wherever a driver places them the areas that cooperative matrices load and store
    /// start on 16-byte boundaries. On an H200 a 4-byte variable added to the dK/dV half
    /// left its f16 P unaligned, and dV came out infinite while dK, whose dS sits in another
    /// area, held (docs/flex.md).
    #[test]
    fn workgroup_variables_keep_16_byte_boundaries() {
        use crate::{Dtype, KernelSpec, Masks, Op, configs};
        let bytes = configs::CANDIDATE_WORKGROUP_BYTES;
        let flex = |name: &str| {
            let f = crate::flex::library::preset(name)
                .expect("a preset")
                .intern();
            Masks {
                flex: Some(f.with_block_mask()),
                ..Masks::default()
            }
        };
        let masks = [
            Masks::new(true, false),
            flex("documents"),
            flex("prefix-lm"),
        ];
        for dtype in [Dtype::F16, Dtype::Bf16] {
            for head_dim in [64, 128] {
                let forward = configs::coop_forward_in(head_dim, bytes, dtype)
                    .into_iter()
                    .map(|c| (Op::Forward, c));
                let backward = configs::coop_backward_in(head_dim, bytes, dtype)
                    .into_iter()
                    .flat_map(|c| [(Op::BackwardQ, c), (Op::BackwardKv, c)]);
                for ((op, config), scattered) in forward
                    .chain(backward)
                    .flat_map(|k| {
                        [
                            Some((k, false)),
                            (k.0 == Op::BackwardKv).then_some((k, true)),
                        ]
                    })
                    .flatten()
                {
                    for masks in masks {
                        let mut spec = KernelSpec {
                            dtype,
                            ..KernelSpec::flash("kernel", op, head_dim, masks, config)
                        };
                        if scattered {
                            spec.writes = ["dk", "dv"]
                                .map(|n| (n.to_string(), crate::WriteMode::AtomicScatter))
                                .to_vec();
                        }
                        spec.fit_target();
                        let wgsl = crate::compile(&spec)
                            .unwrap_or_else(|e| {
                                panic!("{op:?} {} {dtype:?} {masks:?}: {e}", config.label())
                            })
                            .wgsl;
                        let bad = unpadded_workgroup_variables(&wgsl);
                        assert!(
                            bad.is_empty(),
                            "{op:?} {} {dtype:?}: {bad:?}",
                            config.label()
                        );
                    }
                }
            }
        }
    }

    /// The phase model's kernels (`bench --only phases`) compile with every phase set, and
    /// cutting a phase removes its work: only the whole set multiplies S by V.
    #[test]
    fn every_phase_set_compiles() {
        let config =
            crate::configs::coop_forward(128, crate::configs::CANDIDATE_WORKGROUP_BYTES)[0];
        let spec = crate::KernelSpec {
            dtype: crate::Dtype::F16,
            ..crate::KernelSpec::flash(
                "phases",
                crate::Op::Forward,
                128,
                crate::Masks::new(true, false),
                config,
            )
        };
        let products = |keep| {
            let abi =
                crate::compile_phases(&spec, keep).unwrap_or_else(|e| panic!("{keep:?}: {e}"));
            abi.wgsl.matches("coopMultiplyAdd").count()
        };
        let all = products(Phases::ALL);
        assert_eq!(products(Phases::NONE), 0);
        for (name, only) in Phases::each() {
            let cut = products(Phases::ALL.without(only));
            assert_eq!(
                cut < all,
                name == "scores" || name == "accumulate",
                "{name}"
            );
            assert_eq!(products(only) > 0, cut < all, "{name}");
        }
    }

    /// The bf16 forward compiles in every configuration (at a head_dim staged whole and one
    /// staged in column passes), binds the row maxima and gathers nothing itself; f16's
    /// binds none. Its softmax takes one exponential per score, as f16's does: O's weights
    /// are P times the key's and the row's factors.
    #[test]
    fn bf16_forward_reads_its_row_scales() {
        let bytes = crate::configs::CANDIDATE_WORKGROUP_BYTES;
        for head_dim in [64, 128, 256] {
            for config in crate::configs::coop_forward_in(head_dim, bytes, crate::Dtype::Bf16) {
                for dtype in [crate::Dtype::Bf16, crate::Dtype::F16] {
                    let mut spec = crate::KernelSpec {
                        dtype,
                        ..crate::KernelSpec::flash(
                            "f",
                            crate::Op::Forward,
                            head_dim,
                            crate::Masks::new(true, false),
                            config,
                        )
                    };
                    spec.fit_target();
                    let abi = crate::compile(&spec)
                        .unwrap_or_else(|e| panic!("d{head_dim} {config:?} {dtype:?}: {e}"));
                    let scaled = dtype == crate::Dtype::Bf16;
                    assert_eq!(abi.binding("row_max").is_some(), scaled, "{dtype:?}");
                    assert_eq!(abi.wgsl.contains("kv_bits(1u"), scaled);
                    assert!(!abi.wgsl.contains("atomicMax"));
                    assert!(!abi.wgsl.contains("exp2(t_"));
                    assert_eq!(abi.wgsl.contains("let w_0 = u_0 * g0 * g1;"), scaled);
                }
            }
        }
    }

    /// The backward halves' phase kernels compile with every phase set, and cutting S, dP
    /// or the sums removes exactly their products.
    #[test]
    fn every_backward_phase_set_compiles() {
        let config =
            crate::configs::coop_backward(128, crate::configs::CANDIDATE_WORKGROUP_BYTES)[0];
        for op in [crate::Op::BackwardQ, crate::Op::BackwardKv] {
            let mut spec = crate::KernelSpec {
                dtype: crate::Dtype::F16,
                ..crate::KernelSpec::flash(
                    "phases",
                    op,
                    128,
                    crate::Masks::new(true, false),
                    config,
                )
            };
            if op == crate::Op::BackwardKv {
                spec.writes = vec![
                    ("dk".into(), crate::WriteMode::Owned),
                    ("dv".into(), crate::WriteMode::Owned),
                ];
            }
            spec.fit_target();
            let products = |keep| {
                let abi = crate::compile_phases(&spec, keep)
                    .unwrap_or_else(|e| panic!("{op:?} {keep:?}: {e}"));
                abi.wgsl.matches("coopMultiplyAdd").count()
            };
            // (The dQ half's D = rowsum(dO ∘ O) is a product before the loop.)
            let (all, outside) = (products(Phases::ALL), products(Phases::NONE));
            for (name, only) in Phases::each_backward() {
                let cut = products(Phases::ALL.without(only));
                assert_eq!(cut < all, name != "elementwise", "{op:?} {name}");
                assert_eq!(products(only) - outside + cut, all, "{op:?} {name}");
            }
        }
    }
}
