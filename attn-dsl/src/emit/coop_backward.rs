//! The tiled recompute backward (schedule (d)) on cooperative matrices: the five products
//! of the flash backward as 16x16x16 products of f16 operands into f32 accumulators, in
//! the two halves of [`super::flash_backward`]:
//!
//! - `backward_q` (s-major) owns BR query rows: per block of BC keys, S = Q·Kᵀ and
//!   dP = dO·Vᵀ, then dS = scale·P·(dP − D) with P = exp(S − LSE) elementwise, then
//!   dQ += dS·K.
//! - `backward_kv` (j-major) owns BR key rows: per block of BC query rows of each query
//!   head of its KV head (K and V loaded once for the group), Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ,
//!   then Pᵀ and dSᵀ, then dV += Pᵀ·dO and dK += dSᵀ·Q.
//!
//! Each subgroup holds its 16 owned rows of both operand tensors as A fragments for the
//! whole pass (staged once through workgroup memory, which the blocks then reuse). P and
//! dS are rounded to f16 as the products' operands, as FlashAttention does; S and dP stay
//! f32 in workgroup memory for the elementwise step. The gradients are summed in the
//! accumulators over every block and added into the f32 outputs once, at the end.

use super::writer::{Fragment, Template, Wgsl, concat, lines, uint};

use super::coop::{self, A, C, CoopTiling, FRAG, Phases, expr, phase};
use super::coop_scale;
use super::index::{self, Row, Rows};
use crate::spec::{KernelSpec, Op, WriteMode};

/// The half's names: its body, the owned and streamed (fetch name, tensor, index)
/// triples, the row and head of an owned row, and the accumulators with their outputs.
struct Half {
    body: &'static str,
    /// The two owned operands, and for the dQ half O, for D.
    own: &'static [(&'static str, &'static str, Rows)],
    streamed: [(&'static str, &'static str, Rows); 2],
    /// (accumulator, output tensor, weights in workgroup memory, their fragments' tag,
    /// the staged tensor they multiply: 0 the block's first, 1 its second)
    sums: &'static [(&'static str, &'static str, &'static str, &'static str, u32)],
}

const Q_HALF: Half = Half {
    body: "coop_backward_q",
    own: &[
        ("q", "q", Rows::Q),
        ("do", "d_o", Rows::O),
        ("o", "o", Rows::O),
    ],
    streamed: [("k", "k", Rows::K), ("v", "v", Rows::V)],
    sums: &[("dq", "dq", "sh_ds", "ds", 0)],
};

const KV_HALF: Half = Half {
    body: "coop_backward_kv",
    own: &[("k", "k", Rows::K), ("v", "v", Rows::V)],
    streamed: [("q", "q", Rows::Q), ("do", "d_o", Rows::O)],
    sums: &[("dv", "dv", "sh_p", "p", 1), ("dk", "dk", "sh_ds", "ds", 0)],
};

/// Whether an accumulator's output has V's rows (dV) rather than Q's and K's (dQ, dK).
fn v_rows(output: &str) -> bool {
    output == "dv"
}

/// Whether the key-major half adds dK and dV by atomics: then each workgroup serves one
/// query head (the grid walks query heads, not KV heads), so a small problem spreads over
/// `n_heads / n_kv_heads` times the workgroups, at the price of loading K and V per query
/// head.
fn scatters(spec: &KernelSpec) -> bool {
    spec.op == Op::BackwardKv && spec.write_mode("dk") == Some(WriteMode::AtomicScatter)
}

pub(super) fn kernel(out: &mut Wgsl, spec: &KernelSpec, t: &CoopTiling, keep: Phases) {
    let kv = spec.op == Op::BackwardKv;
    let half = if kv { &KV_HALF } else { &Q_HALF };
    let scattered = scatters(spec);
    constants(out, t);
    workgroup_memory(out, t, kv);
    super::flash_backward::helpers(out, spec);
    if scattered {
        for (_, output, ..) in half.sums {
            super::scatter::atomic_add(out, spec, output);
        }
    }
    let (own_rows, block_rows) = ("BR", "BC");
    if t.scaled {
        coop_scale::row_bits(out, spec, false);
        coop_scale::note_scales(out, false);
        coop_scale::reference_constants(out);
    }
    for &(name, tensor, of) in half.own {
        coop::block_fetch(out, spec, t, (name, tensor, of, own_rows), false);
    }
    for &(name, tensor, of) in &half.streamed {
        coop::block_fetch(out, spec, t, (name, tensor, of, block_rows), true);
    }
    coop::put(out);
    for (i, (name, ..)) in half.own.iter().enumerate() {
        coop::stage_rows(out, &format!("stage_own{i}"), "BR", &[(name, "0u")]);
    }
    match kv {
        true => super::flash_backward::query_tiles(out, spec),
        false => super::flash::tile_key_range(out, spec),
    }
    out.put(body(spec, t, half, keep));
    coop::entry(out, spec, half.body);
}

fn constants(out: &mut Wgsl, t: &CoopTiling) {
    let (ks, ss, ps) = t.strides();
    let (rows, lanes, keys) = coop::softmax_layout(t);
    out.put(BACKWARD_CONSTANTS.fill([
        ("br", uint(t.br)),
        ("bc", uint(t.bc)),
        ("nrg", uint(t.br / FRAG)),
        ("split", uint(t.split)),
        ("ks", uint(ks)),
        ("ss", uint(ss)),
        ("ps", uint(ps)),
        ("rows", uint(rows)),
        ("lanes", uint(lanes)),
        ("cols", uint(keys)),
    ]));
}

/// The backward's tiling, the elementwise step's layout and the base-2 exponent's factor.
const BACKWARD_CONSTANTS: Template = Template {
    name: "coop_backward_constants",
    needs: &[],
    text: r#"// Cooperative-matrix tiling: BR owned rows per workgroup, 16 per subgroup; BC rows
// per staged block; row strides KS (staged f16 rows), SS (S and dP, f32), PS (P and
// dS, f16).
const BR: u32 = $br;
const BC: u32 = $bc;
// Row groups of 16 owned rows, and subgroups per row group.
const NRG: u32 = $nrg;
const SPLIT: u32 = $split;
const KS: u32 = $ks;
const SS: u32 = $ss;
const PS: u32 = $ps;
// The elementwise step: rows per subgroup, invocations per row, columns each
// (interleaved, so that the row's invocations read consecutive words).
const EROWS: u32 = $rows;
const ELANES: u32 = $lanes;
const ECOLS: u32 = $cols;
// P = 2^((s − LSE)·LOG2E) by the hardware's exp2: P and dS are rounded to f16
// (2^-11) before their products, far above its error.
const LOG2E: f32 = 1.442695041;

"#,
};

fn workgroup_memory(out: &mut Wgsl, t: &CoopTiling, kv: bool) {
    let (ks, ss, ps) = t.strides();
    let key_major = match kv {
        true => KEY_MAJOR_MEMORY.fill([("p", expr(t.br * ps))]),
        false => Fragment::default(),
    };
    let references = match (t.scaled, kv) {
        (false, _) => Fragment::default(),
        (true, true) => coop_scale::reference_memory(&["dv", "dk"]),
        (true, false) => coop_scale::reference_memory(&["dq"]),
    };
    out.put(BACKWARD_MEMORY.fill([
        ("staged", expr(t.backward_staged_rows() * ks / 4)),
        ("s", expr(t.br * ss)),
        ("p", expr(t.br * ps)),
        ("key_major", key_major),
        ("references", references),
    ]));
}

/// The backward's workgroup memory: the staging area, S, dP, dS and the tile's range;
/// the key-major half's P and query statistics; with bf16 operands the references'.
const BACKWARD_MEMORY: Template = Template {
    name: "coop_backward_memory",
    needs: &[],
    text: r#"// Each owned tensor (rows 0..BR) in turn until its fragments are loaded; then each
// block's two tensors, from rows 0 and BC.
var<workgroup> sh_kv: array<vec4<f16>, $staged>;
var<workgroup> sh_s: array<f32, $s>;
var<workgroup> sh_dp: array<f32, $s>;
var<workgroup> sh_ds: array<f16, $p>;
var<workgroup> sh_range: vec4<u32>;
$key_major
$references

"#,
};

/// The key-major half's Pᵀ and its staged queries' statistics.
const KEY_MAJOR_MEMORY: Template = Template {
    name: "coop_key_major_memory",
    needs: &[],
    text: r#"var<workgroup> sh_p: array<f16, $p>;
// (LSE, D) of each staged query row.
var<workgroup> sh_stats: array<vec2<f32>, BC>;
"#,
};

/// The half's body: its prologue, the block loop and the outputs.
fn body(spec: &KernelSpec, t: &CoopTiling, half: &Half, keep: Phases) -> Fragment {
    let kv = spec.op == Op::BackwardKv;
    let scattered = scatters(spec);
    let (head, row0) = match kv {
        true => ("kv_h", "col0"),
        false => ("h", "row0"),
    };
    let (param, kv_head) = match scattered {
        true => ("qh", Fragment::from("let kv_h = kv_head(qh);")),
        false => (head, Fragment::default()),
    };
    let range = match kv {
        true => "tile_query_range",
        false => "tile_key_range",
    };
    let accumulators = half.sums.iter().flat_map(|(acc, output, ..)| {
        let mine = t.sum_frags(v_rows(output)) / t.split;
        (0..mine).map(move |n| format!("var {acc}_{n} = {C}();"))
    });
    let block_loop = match kv {
        true => kv_loop(
            t,
            scattered,
            (super::tiles::share_batch(spec), super::tiles::sparse(spec)),
        ),
        false => q_loop(t, &super::tiles::KeyLoop::of(spec, true)),
    };
    let final_factors = phase(t.scaled, || {
        concat(
            half.sums
                .iter()
                .map(|(acc, ..)| coop_scale::final_factor(acc)),
        )
    });
    BACKWARD.fill([
        ("name", expr(half.body)),
        ("param", expr(param)),
        ("kv_head", kv_head),
        ("row0", expr(row0)),
        ("range", expr(range)),
        ("own", own_fragments(t, (row0, head), kv)),
        ("accumulators", lines(accumulators)),
        ("scaled", scaled_prologue(t.scaled, half, kv)),
        ("block_loop", block_loop),
        (
            "products",
            products(t, half, (kv, super::tiles::sparse(spec)), keep),
        ),
        ("final_factors", final_factors),
        ("finish", finish((spec, t), half, kv, scattered)),
    ])
}

/// A backward half on cooperative matrices: the owned rows' fragments, the accumulators
/// and the elementwise step's row; per block (`$block_loop` opens the loop) the products,
/// the elementwise step and the weighted sums; then the outputs.
const BACKWARD: Template = Template {
    name: "coop_backward",
    needs: &[],
    text: r#"fn $name(tile: u32, $param: u32, tid: u32, sg: u32, lane: u32) {
    $kv_head
    let $row0 = tile * BR;
    // The subgroup's 16 owned rows (row group) and its half of their products, if split.
    let rg = sg % NRG;
    let part = sg / NRG;
    if (tid == 0u) {
        sh_range = $range($row0);
    }
    $own
    $accumulators
    // The elementwise step's row of the tile and its first column.
    let r = sg * EROWS + lane / ELANES;
    let c0 = lane % ELANES;
    let range = workgroupUniformLoad(&sh_range);
    $scaled
    $block_loop
        $products
    }
    $final_factors
    $finish
}

"#,
};

/// The owned rows' fragments: the first owned tensor is Q or K (S's operand) as `oa_k`,
/// the second dO or V (dP's) as `ob_k`; then in the query-major half D.
fn own_fragments(t: &CoopTiling, (row0, head): (&str, &str), kv: bool) -> Fragment {
    let owned = [("oa", t.qk_frags), ("ob", t.v_frags)];
    let each = owned.into_iter().enumerate().map(|(i, (tag, frags))| {
        let loads = (0..frags).map(|k| {
            let at = coop::staged(&format!("rg * {FRAG}u * KS + {}u", k * FRAG));
            let stride = coop::staged_stride("KS");
            format!("let {tag}_{k} = coopLoadT<{A}>({at}, {stride});")
        });
        OWN_FRAGMENTS.fill([
            ("i", expr(i)),
            ("row0", expr(row0)),
            ("head", expr(head)),
            ("loads", lines(loads)),
        ])
    });
    let own = concat(each);
    match kv {
        true => own,
        false => own.then(tensor_core_delta(t)),
    }
}

/// Owned tensor `$i` staged, and its fragments `$loads` loaded.
const OWN_FRAGMENTS: Template = Template {
    name: "coop_own_fragments",
    needs: &[],
    text: r#"workgroupBarrier();
stage_own$i($row0, $head, tid);
workgroupBarrier();
$loads
"#,
};

/// With bf16 operands: the row each invocation rescales and stores, each accumulator's
/// reference, and the exponents of the elementwise step's own row (Q, dO and O of a query
/// row; K and V of a key row).
fn scaled_prologue(scaled: bool, half: &Half, kv: bool) -> Fragment {
    if !scaled {
        return Fragment::default();
    }
    let references = half
        .sums
        .iter()
        .map(|(acc, ..)| format!("var ref_{acc} = REF_LOW;"));
    let exponents = match kv {
        false => QUERY_ROW_EXPONENTS.plain(),
        true => KEY_ROW_EXPONENTS.plain(),
    };
    SCALED_PROLOGUE.fill([("references", lines(references)), ("exponents", exponents)])
}

/// bf16's row that the invocation rescales, the accumulators' `$references` and the
/// elementwise row's `$exponents`.
const SCALED_PROLOGUE: Template = Template {
    name: "coop_scaled_prologue",
    needs: &[],
    text: r#"let pr = rg * 16u + lane / 2u;
$references
$exponents
"#,
};

/// A query row's exponents: Q's, dO's and O's.
const QUERY_ROW_EXPONENTS: Template = Template {
    name: "coop_query_row_exponents",
    needs: &[],
    text: r#"let qe = shift_of(q_bits(0u, row0 + r, h));
let oe = shift_of(q_bits(4u, row0 + r, h));
let ooe = shift_of(q_bits(3u, row0 + r, h));
"#,
};

/// A key row's exponents: K's and V's.
const KEY_ROW_EXPONENTS: Template = Template {
    name: "coop_key_row_exponents",
    needs: &[],
    text: r#"let ke = shift_of(kv_bits(1u, col0 + r, kv_h));
let ve = shift_of(kv_bits(2u, col0 + r, kv_h));
"#,
};

/// D = rowsum(dO ∘ O) of the row group's rows, as the diagonal of dO·Oᵀ on the tensor
/// cores, into the diagonal of the row group's 16x16 corner of sh_s: summed as dP = dO·Vᵀ
/// is, so that dP − D is exactly 0 where O equals the one key's V a row attends to (the
/// prep's D, summed otherwise, left dK off by rounding where it should be 0).
fn tensor_core_delta(t: &CoopTiling) -> Fragment {
    let rows = |k: u32| coop::staged(&format!("rg * {FRAG}u * KS + {}u", k * FRAG));
    let (chains, sum) = coop::chained_product((t.v_frags, &|k| format!("ob_{k}")), &rows, "dd");
    DELTA.fill([("chains", chains), ("sum", expr(sum))])
}

/// O staged, and dO·Oᵀ (`$chains`, summed in `$sum`) into sh_s.
///
/// Cooperative operations need workgroup-uniform control flow, so both subgroups of a
/// split row group compute D, each into its own 16 columns.
const DELTA: Template = Template {
    name: "coop_delta",
    needs: &[],
    text: r#"workgroupBarrier();
stage_own2(row0, h, tid);
workgroupBarrier();
$chains
coopStoreT($sum, &sh_s[rg * 16u * SS + part * 16u], SS);
workgroupBarrier();
"#,
};

/// The query-major loop head: the row's key range and statistics (LSE and D from the
/// tensor cores, packed into `stats` for the key-major half: this half runs without the
/// prep), then per block of keys its K and V staged.
fn q_loop(t: &CoopTiling, lp: &super::tiles::KeyLoop) -> Fragment {
    // With bf16 operands D = dO'·O' · 2^(oe + ooe).
    let delta = match t.scaled {
        true => "scale2(sh_s[r * SS + r % 16u], oe + ooe)",
        false => "sh_s[r * SS + r % 16u]",
    };
    let tensors = [("k", "0u"), ("v", "BC")];
    let blocks = match t.prefetches() {
        false => KEY_BLOCKS.fill([
            ("loop_head", lp.head.clone()),
            ("stage", coop::stage_block(t, &tensors, "j0", "kv_h")),
        ]),
        true => {
            let fetch = |r0: &str, decl: &str| coop::fetches(t, &tensors, (r0, "kv_h"), decl);
            KEY_BLOCKS_AHEAD.fill([
                ("first_fetch", fetch(lp.first, "var ")),
                ("loop_head", lp.head.clone()),
                ("puts", coop::puts(t, &tensors)),
                ("has_next", expr(lp.has_next)),
                ("next_fetch", fetch(lp.next, "")),
            ])
        }
    };
    QUERY_ROWS.fill([
        ("delta", expr(delta)),
        ("pre", lp.pre.clone()),
        ("blocks", blocks),
    ])
}

/// The query-major half's row: its key range, LSE and D (into `stats` for the key-major
/// half), then the key loop's `$pre` statements and its `$blocks`.
const QUERY_ROWS: Template = Template {
    name: "coop_query_rows",
    needs: &[],
    text: r#"let kv_h = kv_head(h);
let row = row0 + r;
var lo = 0u;
var hi = 0u;
var row_lse = 0.0;
var delta = 0.0;
if (row < dims.seq_len) {
    let keys = key_range(row);
    lo = keys.x;
    hi = keys.y;
    row_lse = lse[row_index(row, h)];
    delta = $delta;
    if (c0 == 0u) {
        stats[stats_part(0u, row, h)] = row_lse;
        stats[stats_part(1u, row, h)] = delta;
    }
}
let kt_end = (range.y + BC - 1u) / BC;
$pre
$blocks
"#,
};

/// Each block of keys, its K and V staged (`$stage`).
const KEY_BLOCKS: Template = Template {
    name: "coop_key_blocks",
    needs: &[],
    text: r#"$loop_head
    let j0 = kt * BC;
    // The previous block is done with sh_kv, sh_s, sh_dp and sh_ds.
    workgroupBarrier();
    $stage
"#,
};

/// Each block of keys with the next block's K and V in flight: `$first_fetch` loads the
/// first into the carried registers, `$puts` stores them, `$next_fetch` loads the next.
const KEY_BLOCKS_AHEAD: Template = Template {
    name: "coop_key_blocks_ahead",
    needs: &[],
    text: r#"$first_fetch
$loop_head
    let j0 = kt * BC;
    // The previous block is done with sh_kv, sh_s, sh_dp and sh_ds.
    workgroupBarrier();
    $puts
    workgroupBarrier();
    // The next block's loads are in flight during this one's products.
    if ($has_next) {
        $next_fetch
    }
"#,
};

/// The key-major loop head: every block of queries that sees the tile, last first, and
/// within a block every query head of the KV head (the weights of a key shrink with the
/// query's distance under a causal mask, so the small terms are added first), each with
/// its Q, dO and (LSE, D) staged. `share` is the sequence's batch shared for the block
/// mask.
fn kv_loop(t: &CoopTiling, scattered: bool, (share, sparse): (Fragment, bool)) -> Fragment {
    // (A scattering workgroup walks its one query head.)
    let (group, h0) = match scattered {
        true => ("1u", "qh"),
        false => ("q_per_kv()", "kv_h * group"),
    };
    let blocks = match t.prefetches() {
        false => query_blocks(t, h0, sparse),
        true => query_blocks_ahead(t, h0, sparse),
    };
    KEY_ROWS.fill([("share", share), ("group", expr(group)), ("blocks", blocks)])
}

/// The key-major half's row and the range of its blocks of queries, after the `$share`d
/// batch; then the `$blocks`.
const KEY_ROWS: Template = Template {
    name: "coop_key_rows",
    needs: &[],
    text: r#"$share
let col = col0 + r;
let group = $group;
let first = range.x / BC;
let blocks = (range.y + BC - 1u) / BC - first;
$blocks
"#,
};

/// Each block of queries, with a mask_mod only the blocks whose tile it may show: its
/// statistics, Q and dO staged.
fn query_blocks(t: &CoopTiling, h0: &str, sparse: bool) -> Fragment {
    let (pre, start, step, found) = match sparse {
        true => {
            let next = format!(
                "group * blocks, col0, min(col0 + BR, dims.seq_len) - 1u, {h0}, group, first, blocks, wg_b)"
            );
            (
                format!("var found = next_block(0u, {next};"),
                "found.x",
                "found.x",
                lines([
                    "let tile_full = found.y != 0u;".to_string(),
                    format!("found = next_block(it + 1u, {next};"),
                ]),
            )
        }
        false => (String::new(), "0u", "it + 1u", Fragment::default()),
    };
    QUERY_BLOCKS.fill([
        ("pre", Fragment::from(pre)),
        ("start", expr(start)),
        ("step", expr(step)),
        ("found", found),
        ("h0", expr(h0)),
        (
            "stage",
            coop::stage_block(t, &[("q", "0u"), ("do", "BC")], "s0", "h"),
        ),
    ])
}

/// The loop over the blocks of queries (after `$pre`, from `$start`, by `$step`, the next
/// one `$found` first) and the query heads, each block's (LSE, D) and its Q and dO
/// (`$stage`) staged.
const QUERY_BLOCKS: Template = Template {
    name: "coop_query_blocks",
    needs: &[],
    text: r#"$pre
for (var it = $start; it < group * blocks; it = $step) {
    $found
    let h = $h0 + it % group;
    let s0 = (first + blocks - 1u - it / group) * BC;
    // The previous block is done with sh_kv, sh_s, sh_dp, sh_p, sh_ds and sh_stats.
    workgroupBarrier();
    for (var e = tid; e < BC; e = e + WG) {
        put_stats(e, fetch_stats(s0, h, e));
    }
    $stage
"#,
};

/// [`query_blocks`] with the next block's Q, dO and statistics in flight
/// ([`super::flash_backward::blocks_ahead`]).
fn query_blocks_ahead(t: &CoopTiling, h0: &str, sparse: bool) -> Fragment {
    let tensors = [("q", "0u"), ("do", "BC")];
    let stats = t.bc.div_ceil(t.workgroup_size());
    let fetch = |decl: &str| {
        let each = (0..stats)
            .map(|i| format!("{decl}ps_{i} = fetch_stats(next_s0, next_h, tid + {i}u * WG);"));
        coop::fetches(t, &tensors, ("next_s0", "next_h"), decl).then(lines(each))
    };
    let puts_stats = lines((0..stats).map(|i| format!("put_stats(tid + {i}u * WG, ps_{i});")));
    super::flash_backward::blocks_ahead(
        sparse,
        h0,
        (
            fetch("var "),
            "sh_kv, sh_s, sh_dp, sh_p, sh_ds and sh_stats",
        ),
        puts_stats.then(coop::puts(t, &tensors)),
        fetch(""),
    )
}

/// The mask's test of the elementwise step's pair within its range: where the loops step
/// by tile tests (`sparse`), asked only in a tile the test did not find full.
fn elementwise_visible(kv: bool, sparse: bool) -> String {
    match (kv, sparse) {
        (true, _) => super::tiles::key_major_visible(sparse, "q", "col"),
        (false, true) => "(tile_full || key_visible(row, h, j))".to_string(),
        (false, false) => "key_visible(row, h, j)".to_string(),
    }
}

/// The block's two transposed products, the elementwise step and the weighted sums.
fn products(t: &CoopTiling, half: &Half, (kv, sparse): (bool, bool), keep: Phases) -> Fragment {
    let product = |kept: bool, frags, own: &str, base, dest, tag| {
        phase(kept, || {
            coop::transposed_product(t, (frags, &|k| format!("{own}_{k}")), base, dest, tag)
        })
    };
    let visible = Fragment::from(elementwise_visible(kv, sparse));
    let elementwise = match (keep.softmax, kv, t.scaled) {
        (false, ..) => Fragment::default(),
        (true, true, false) => KV_ELEMENTWISE.fill([("visible", visible)]),
        (true, false, false) => Q_ELEMENTWISE.fill([("visible", visible)]),
        (true, _, true) => scaled_elementwise(t, half, (kv, visible)),
    };
    let rescales = phase(t.scaled && keep.softmax, || rescales(t, half));
    let sums = half.sums.iter().map(|(acc, output, src, tag, which)| {
        let base = if *which == 0 { "0u" } else { "BC" };
        let frags = t.sum_frags(v_rows(output));
        coop::weighted_sum(t, frags, (coop::Weights::Area(src), tag), base, acc)
    });
    let sums = phase(keep.accumulate, || concat(sums));
    BLOCK_PRODUCTS.fill([
        ("key_fragments", coop::key_fragments(t)),
        (
            "scores",
            product(keep.scores, t.qk_frags, "oa", "0u", "sh_s", "sm"),
        ),
        (
            "grads",
            product(keep.grads, t.v_frags, "ob", "BC", "sh_dp", "dm"),
        ),
        ("elementwise", elementwise),
        ("rescales", rescales),
        ("sums", sums),
    ])
}

/// A block's work after its staging: S (`$scores`) and dP (`$grads`) into workgroup
/// memory, the elementwise step, with bf16 operands the accumulators' `$rescales`, and the
/// weighted `$sums`.
const BLOCK_PRODUCTS: Template = Template {
    name: "coop_block_products",
    needs: &[],
    text: r#"$key_fragments
$scores
$grads
workgroupBarrier();
$elementwise
workgroupBarrier();
$rescales
$sums
"#,
};

/// With bf16 operands, each accumulator's rows rescaled where its reference moved.
fn rescales(t: &CoopTiling, half: &Half) -> Fragment {
    let each = half.sums.iter().enumerate().map(|(i, (acc, output, ..))| {
        let frags = t.sum_frags(v_rows(output)) / t.split;
        let cond = format!("(moved & {}u) != 0u", coop_scale::moved_bit(i));
        coop::rescale_rows(frags, (acc, &cond, &format!("sh_c_{acc}")))
    });
    RESCALES.fill([("moved", expr(coop_scale::MOVED)), ("each", concat(each))])
}

/// The moved flags read, `$each` accumulator rescaled, and the flags cleared after the
/// rescales' barriers, which follow every invocation's load.
const RESCALES: Template = Template {
    name: "coop_rescales",
    needs: &[],
    text: r#"let moved = workgroupUniformLoad(&$moved);
$each
if (moved != 0u && tid == 0u) {
    atomicStore(&$moved, 0u);
}
"#,
};

/// P = exp(S − LSE) and dS = scale·P·(dP − D) for the invocation's ECOLS keys of its row.
const Q_ELEMENTWISE: Template = Template {
    name: "q_elementwise",
    needs: &[],
    text: r#"for (var i = 0u; i < ECOLS; i = i + 1u) {
    let c = c0 + i * ELANES;
    let j = j0 + c;
    let v = j >= lo && j < hi && $visible;
    let x = scored(row, h, j, sh_s[r * SS + c]);
    let p = exp2((x.x - row_lse) * LOG2E);
    let g = score_grads(row, h, j, sh_s[r * SS + c], x, p * (dropped(row, h, j, sh_dp[r * SS + c]) - delta), v);
    sh_ds[r * PS + c] = f16(params.scale * g);
}
"#,
};

/// Pᵀ (dropped) and dSᵀ for the invocation's ECOLS queries of its key.
const KV_ELEMENTWISE: Template = Template {
    name: "kv_elementwise",
    needs: &[],
    text: r#"for (var i = 0u; i < ECOLS; i = i + 1u) {
    let c = c0 + i * ELANES;
    let q = s0 + c;
    let st = sh_stats[c];
    let v = q < dims.seq_len && col < dims.seq_len && $visible;
    let x = scored(q, h, col, sh_s[r * SS + c]);
    let p = select(0.0, exp2((x.x - st.x) * LOG2E), v);
    let g = score_grads(q, h, col, sh_s[r * SS + c], x, p * (dropped(q, h, col, sh_dp[r * SS + c]) - st.y), v);
    sh_p[r * PS + c] = f16(dropped(q, h, col, p));
    sh_ds[r * PS + c] = f16(params.scale * g);
}
"#,
};

/// The elementwise step with bf16 operands: S and dP (scaled back by their rows' and
/// keys' exponents) as in f16, then each weighted sum's weights with the row scale of the
/// tensor they multiply folded in, held in registers (the step unrolled over the
/// invocation's columns) until each row's reference has moved where it must, then divided
/// by it into f16. (Kept in f32 in sh_s and sh_dp between the two, the step took 1.34 of
/// the bf16 backward's 3.70 ms at seq 4096, d 128 on an H100.)
fn scaled_elementwise(t: &CoopTiling, half: &Half, (kv, visible): (bool, Fragment)) -> Fragment {
    let (_, lanes, cols) = coop::softmax_layout(t);
    // (accumulator, its weight in the step, where its f16 weights go), in `half.sums`' order
    let (body, weights): (&Template, &[(&str, &str, &str)]) = match kv {
        false => (&SCALED_Q_WEIGHTS, &[("dq", "w", "sh_ds")]),
        true => (
            &SCALED_KV_WEIGHTS,
            &[("dv", "wv", "sh_p"), ("dk", "wk", "sh_ds")],
        ),
    };
    let maxima = lines(
        weights
            .iter()
            .map(|(acc, ..)| format!("var wm_{acc} = 0.0;")),
    );
    let columns = (0..cols).map(|i| {
        let declared = weights
            .iter()
            .map(|(acc, ..)| format!("var w_{acc}_{i} = 0.0;"));
        let kept = weights.iter().flat_map(|(acc, w, _)| {
            [
                format!("w_{acc}_{i} = {w};"),
                format!("wm_{acc} = max(wm_{acc}, abs({w}));"),
            ]
        });
        SCALED_COLUMN.fill([
            ("declared", lines(declared)),
            ("i", uint(i)),
            ("weights", body.fill([("visible", visible.clone())])),
            ("kept", lines(kept)),
        ])
    });
    let references = half.sums.iter().enumerate().map(|(i, (acc, ..))| {
        debug_assert_eq!(*acc, weights[i].0);
        coop_scale::move_reference((acc, i), lanes)
    });
    let stores = (0..cols).flat_map(|i| {
        weights.iter().map(move |(acc, _, to)| {
            format!("{to}[r * PS + c0 + {i}u * ELANES] = f16(mulp2(w_{acc}_{i}, -ref_{acc}));")
        })
    });
    maxima
        .then(concat(columns))
        .then(concat(references))
        .then(lines(stores))
}

/// Column `$i` of the invocation's share of its row: its `$weights`, `$kept` in registers
/// (`$declared` before the column's scope) with the row's largest magnitudes.
const SCALED_COLUMN: Template = Template {
    name: "coop_scaled_column",
    needs: &[],
    text: r#"$declared
{
    let i = $i;
    $weights
    $kept
}
"#,
};

/// dQ's weight `w` = scale·dS_ij·2^k_j of column `i`.
const SCALED_Q_WEIGHTS: Template = Template {
    name: "coop_scaled_q_weights",
    needs: &[],
    text: r#"let c = c0 + i * ELANES;
let j = j0 + c;
let v = j >= lo && j < hi && $visible;
let ke = sh_e[c].x;
let s = mulp2_sum(sh_s[r * SS + c], qe + ke);
let x = scored(row, h, j, s);
let p = exp2((x.x - row_lse) * LOG2E);
let dp = mulp2_sum(sh_dp[r * SS + c], oe + sh_e[c].y);
let g = score_grads(row, h, j, s, x, p * (dropped(row, h, j, dp) - delta), v);
let w = mulp2(params.scale * g, ke);
"#,
};

/// dV's weight `wv` = P_ij·2^do_i (dropped) and dK's `wk` = scale·dS_ij·2^q_i of column
/// `i`.
const SCALED_KV_WEIGHTS: Template = Template {
    name: "coop_scaled_kv_weights",
    needs: &[],
    text: r#"let c = c0 + i * ELANES;
let q = s0 + c;
let st = sh_stats[c];
let v = q < dims.seq_len && col < dims.seq_len && $visible;
let qe = sh_e[c].x;
let oe = sh_e[c].y;
let s = mulp2_sum(sh_s[r * SS + c], ke + qe);
let x = scored(q, h, col, s);
let p = select(0.0, exp2((x.x - st.x) * LOG2E), v);
let dp = mulp2_sum(sh_dp[r * SS + c], ve + oe);
let g = score_grads(q, h, col, s, x, p * (dropped(q, h, col, dp) - st.y), v);
let wv = mulp2(dropped(q, h, col, p), oe);
let wk = mulp2(params.scale * g, qe);
"#,
};

/// Each accumulator into its output through the subgroup's 16x16 corner of sh_s, a
/// fragment at a time, added to what the output holds.
fn finish(
    (spec, t): (&KernelSpec, &CoopTiling),
    half: &Half,
    kv: bool,
    scattered: bool,
) -> Fragment {
    let (row0, index) = match kv {
        true => ("col0", "kv_index(out_row, kv_h)"),
        false => ("row0", "q_index(out_row, h)"),
    };
    let pr = match t.scaled {
        // (bf16's prologue has it.)
        true => Fragment::default(),
        false => Fragment::from(format!("let pr = rg * {FRAG}u + lane / 2u;")),
    };
    // dV's rows have their own width and offsets where the widths differ.
    let split_v = spec.split_dims() && half.sums.iter().any(|(_, o, ..)| v_rows(o));
    let base_v = match split_v {
        true => Fragment::from("let base_v = v_index(out_row, kv_h);"),
        false => Fragment::default(),
    };
    let stores = half
        .sums
        .iter()
        .map(|&(acc, output, ..)| add_output((spec, t), (acc, output), split_v, scattered));
    BACKWARD_FINISH.fill([
        ("pr", pr),
        ("row0", expr(row0)),
        ("index", expr(index)),
        ("base_v", base_v),
        ("stores", concat(stores)),
    ])
}

/// After the block loop: the row this invocation stores (`$pr`, where the prologue has
/// not named it), its output rows' first elements, then each accumulator's `$stores`.
const BACKWARD_FINISH: Template = Template {
    name: "coop_backward_finish",
    needs: &[],
    text: r#"$pr
let out_row = $row0 + pr;
let base = $index;
let c8 = (lane % 2u) * 8u;
let x = pr * SS + part * 16u + c8;
$base_v
$stores
"#,
};

/// Accumulator `acc`'s fragments added into `output`, by atomics where the half scatters.
fn add_output(
    (spec, t): (&KernelSpec, &CoopTiling),
    (acc, output): (&str, &str),
    split_v: bool,
    scattered: bool,
) -> Fragment {
    let row = match v_rows(output) {
        true => Row::V,
        false => Row::Qk,
    };
    let mine = t.sum_frags(row == Row::V) / t.split;
    let base = if split_v && row == Row::V {
        "base_v"
    } else {
        "base"
    };
    // With bf16 operands each row's accumulators are 2^-ref of its gradient.
    let value = match t.scaled {
        true => format!("sh_s[x + e] * sh_c_{acc}[pr]"),
        false => "sh_s[x + e]".to_string(),
    };
    let add = match scattered {
        true => format!("add_{output}(at + e, {value});"),
        false => format!("{output}[at + e] = {output}[at + e] + {value};"),
    };
    concat((0..mine).map(|n| {
        // A fragment past the end of its tensor's row (the width's fragments summed
        // where the split cannot share the row's evenly) is not stored.
        let first = coop::fragment_column(mine, n);
        let stored = index::and_within(spec, "out_row < dims.seq_len", row, &first);
        ADD_FRAGMENT.fill([
            ("acc", expr(format!("{acc}_{n}"))),
            ("stored", expr(stored)),
            ("base", expr(base)),
            ("first", expr(first)),
            ("add", expr(&add)),
        ])
    }))
}

/// Accumulator fragment `$acc` through the subgroup's corner of sh_s, its half of row
/// `pr` added (`$add`) from `$base + $first` where `$stored` holds.
const ADD_FRAGMENT: Template = Template {
    name: "coop_add_fragment",
    needs: &[],
    text: r#"workgroupBarrier();
coopStoreT($acc, &sh_s[rg * 16u * SS + part * 16u], SS);
workgroupBarrier();
if ($stored) {
    let at = $base + $first + c8;
    for (var e = 0u; e < 8u; e = e + 1u) {
        $add
    }
}
"#,
};

#[cfg(test)]
mod tests {
    use crate::{Dtype, KernelSpec, Masks, Op, Scatter, WriteMode};

    /// The bf16 halves compile (naga validates them) in every configuration, owning dK and
    /// dV or adding them by atomics, and bind the row maxima; f16's bind none.
    #[test]
    fn bf16_halves_compile_with_their_row_scales() {
        let bytes = crate::configs::CANDIDATE_WORKGROUP_BYTES;
        for head_dim in [64, 128] {
            for config in crate::configs::coop_backward_in(head_dim, bytes, Dtype::Bf16) {
                let halves = [
                    (Op::BackwardQ, vec![], None),
                    (Op::BackwardKv, vec![WriteMode::Owned; 2], None),
                    (
                        Op::BackwardKv,
                        vec![WriteMode::AtomicScatter; 2],
                        Some(Scatter::F32Atomic),
                    ),
                ];
                for (op, modes, scatter) in halves {
                    for dtype in [Dtype::Bf16, Dtype::F16] {
                        let mut spec = KernelSpec {
                            dtype,
                            ..KernelSpec::flash("b", op, head_dim, Masks::new(true, false), config)
                        };
                        if op == Op::BackwardKv {
                            spec.writes = ["dk", "dv"]
                                .into_iter()
                                .zip(modes.iter().copied())
                                .map(|(n, m)| (n.into(), m))
                                .collect();
                        }
                        if let Some(s) = scatter {
                            spec.scatter = s;
                        }
                        spec.fit_target();
                        let abi = crate::compile(&spec)
                            .unwrap_or_else(|e| panic!("{op:?} d{head_dim} {config:?}: {e}"));
                        assert_eq!(
                            abi.binding("row_max").is_some(),
                            dtype == Dtype::Bf16,
                            "{op:?} {dtype:?}"
                        );
                    }
                }
            }
        }
    }
}
