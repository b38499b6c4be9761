//! Split-K decode (FlashDecoding, onnxruntime-web's decode): a decode's one query row per
//! head has too little work for one workgroup per head to keep a GPU's memory busy, so the
//! cache is cut into slices along the key axis.
//!
//! `decode_split`: one workgroup per (slice, KV head, batch) serving up to 4 query heads of
//! that KV head, the heads riding in the components of a vec4, so each K and V row of the
//! slice is read once for all of them. Pass 1 stages the slice's scores in workgroup memory
//! (K read as vec4 by `LANES` invocations per key), then the slice's exact max and sum
//! (tree reductions), then P·V (V read as vec4 by `V4` invocations per row); it flushes
//! the unnormalized output and (m, l) per head to scratch.
//!
//! `decode_reduce`: one workgroup per (head, batch) owns the head's output:
//! `O = Σ_s e^(m_s − M)·o_s / Σ_s e^(m_s − M)·l_s`, M the largest m_s.

use super::coop::Phases;
use super::numerics::Helper;
use super::served::COMPONENTS;
use super::writer::{Fragment, Template, Wgsl, concat, lines, uint};

use crate::spec::{KernelSpec, Op};

use crate::layout::decode::{Stream, lanes, max_slice, pv_unroll, word};

pub(super) fn constants(out: &mut Wgsl, spec: &KernelSpec) {
    let pass = if let Some(Ok(s)) = Stream::of(spec) {
        super::decode_stream::constants(spec, &s)
    } else if spec.op == Op::DecodeSplit {
        staged_constants(spec)
    } else {
        Fragment::default()
    };
    out.put(CONSTANTS.fill([
        ("wg", uint(spec.workgroup_size)),
        ("widths", widths(spec)),
        ("pass", pass),
    ]));
}

/// Both passes' constants: the workgroup, the rows' widths, the score no key has, and
/// `$pass`, the split pass's own.
const CONSTANTS: Template = Template {
    name: "decode_constants",
    needs: &[],
    text: r#"const WG: u32 = $wg;
$widths
// A finite stand-in for -inf: exp(NEG_BIG - m) is 0 for any real m.
const NEG_BIG: f32 = -3.0e38;
$pass

"#,
};

/// The staged split pass's constants.
fn staged_constants(spec: &KernelSpec) -> Fragment {
    STAGED_CONSTANTS.fill([
        ("tile", uint(spec.grid.tile)),
        ("word", Fragment::from(word(spec).to_string())),
        ("k_words", uint(spec.head_dim / word(spec))),
        ("v_words", uint(spec.v_dim() / word(spec))),
        ("quads", uint(word(spec) / 4)),
        ("lanes", uint(lanes(spec))),
        ("max_slice", uint(max_slice(spec))),
        ("pv_unroll", uint(pv_unroll(spec))),
    ])
}

const STAGED_CONSTANTS: Template = Template {
    name: "staged_constants",
    needs: &[],
    text: r#"// Query heads per workgroup, one per vec4 component.
const TILE: u32 = $tile;
// Words ($word elements) of a K row and of a V row, and the vec4s of a word.
const K_WORDS: u32 = $k_words;
const V_WORDS: u32 = $v_words;
const QUADS: u32 = $quads;
// Invocations per key in the scores pass, each summing K_WORDS / LANES words.
const LANES: u32 = $lanes;
const KEY_TILE: u32 = WG / LANES;
// Keys a slice may hold (dims.slice_len is at most this).
const MAX_SLICE: u32 = $max_slice;
// Rows of V read at once in P·V, one word column per invocation, and the
// groups of them whose loads each invocation issues together.
const PV_ROWS: u32 = WG / V_WORDS;
const PV_UNROLL: u32 = $pv_unroll;
const PV_STEP: u32 = PV_UNROLL * PV_ROWS;
"#,
};

/// The rows' widths in vec4s: `V4` of V, O and the partials; of Q and K `QK4` where it
/// differs (MLA's 192 beside V's 128), else `V4` too.
fn widths(spec: &KernelSpec) -> Fragment {
    match spec.split_dims() {
        false => ONE_WIDTH.fill([("head_dim", uint(spec.head_dim))]),
        true => TWO_WIDTHS.fill([
            ("qk_dim", uint(spec.head_dim)),
            ("v_dim", uint(spec.v_dim())),
        ]),
    }
}

const ONE_WIDTH: Template = Template {
    name: "decode_one_width",
    needs: &[],
    text: r#"const HEAD_DIM: u32 = $head_dim;
// vec4 columns of a row.
const V4: u32 = HEAD_DIM / 4u;
"#,
};

const TWO_WIDTHS: Template = Template {
    name: "decode_two_widths",
    needs: &[],
    text: r#"// Q and K rows, V and O rows.
const QK_DIM: u32 = $qk_dim;
const V_DIM: u32 = $v_dim;
// vec4 columns of a Q or K row and of a V or O row.
const QK4: u32 = QK_DIM / 4u;
const V4: u32 = V_DIM / 4u;
"#,
};

/// The constant naming the vec4 width of a Q or K row.
pub(super) fn qk4(spec: &KernelSpec) -> &'static str {
    match spec.split_dims() {
        false => "V4",
        true => "QK4",
    }
}

/// Both passes; the split pass with only the phases in `keep` (all but for a phase-cut
/// timing: [`super::coop::Phases::decode_sets`]).
pub(super) fn body(out: &mut Wgsl, spec: &KernelSpec, keep: Phases) {
    super::dtype::vec4_codec(out, spec.dtype);
    if spec.op == Op::DecodeSplit {
        super::dtype::cache_codec(out, spec);
    }
    if let Some(Ok(s)) = Stream::of(spec) {
        super::decode_stream::split(out, spec, &s);
        return;
    }
    out.push_str("var<workgroup> sh_red: array<vec4<f32>, WG>;\n\n");
    if spec.op == Op::DecodeSplit {
        out.put(reductions(spec.grid.subgroups, lanes(spec)));
    }
    out.put(PARTIALS.plain());
    match spec.op {
        Op::DecodeSplit => split(out, spec, keep),
        _ => reduce(out, spec),
    }
}

/// The staged pass's reductions across invocations: the slice's max and sum, and with
/// `subgroups` each key's `lanes` by `group_sum4`; the subgroup steps each fall back to
/// workgroup memory where the adapter's subgroups do not hold a key's lanes.
fn reductions(subgroups: bool, lanes: u32) -> Fragment {
    if !subgroups {
        let plain = [("params", ""), ("fast_max", ""), ("fast_sum", "")];
        return REDUCE4.fill(plain.map(|(h, f)| (h, Fragment::from(f))));
    }
    let fast = |op: &str, combine: &str| {
        SUBGROUP_REDUCE4.fill([("op", op.into()), ("combine", combine.into())])
    };
    Fragment::from(super::decode_stream::SUBGROUP_FLAG)
        .then(super::decode_stream::group_sum_fn("sh_red", true, lanes))
        .then(REDUCE4.fill([
            ("params", ", sg_size: u32, use_sg: bool".into()),
            ("fast_max", fast("subgroupMax", "max(r, sh_red[i])")),
            ("fast_sum", fast("subgroupAdd", "r + sh_red[i]")),
        ]))
}

/// A subgroup reduction, then one across the workgroup's subgroups, every invocation
/// reading the same slots in the same order.
const SUBGROUP_REDUCE4: Template = Template {
    name: "subgroup_reduce4",
    needs: &[],
    text: r#"if (use_sg) {
    sh_red[tid] = $op(x);
    workgroupBarrier();
    var r = sh_red[0];
    for (var i = sg_size; i < WG; i = i + sg_size) {
        r = $combine;
    }
    workgroupBarrier();
    return r;
}
"#,
};

/// Tree reductions of one vec4 per invocation (a value per served head), pairwise, after
/// `$fast_max` / `$fast_sum` (the subgroup steps, where the pass has them).
const REDUCE4: Template = Template {
    name: "reduce4",
    needs: &[],
    text: r#"fn wg_max4(tid: u32, x: vec4<f32>$params) -> vec4<f32> {
    $fast_max
    sh_red[tid] = x;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (tid < stride) {
            sh_red[tid] = max(sh_red[tid], sh_red[tid + stride]);
        }
        workgroupBarrier();
    }
    let r = sh_red[0];
    workgroupBarrier();
    return r;
}

fn wg_sum4(tid: u32, x: vec4<f32>$params) -> vec4<f32> {
    $fast_sum
    sh_red[tid] = x;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (tid < stride) {
            sh_red[tid] = sh_red[tid] + sh_red[tid + stride];
        }
        workgroupBarrier();
    }
    let r = sh_red[0];
    workgroupBarrier();
    return r;
}

"#,
};

/// The partials' indexing and the four-wide exponential, for both passes.
const PARTIALS: Template = Template {
    name: "partials",
    needs: &[Helper::Exp],
    text: r#"// This sequence's first row in the packed Q and O, set by the entry point.
var<private> q_row0: u32;

// Queries in the partials: every sequence's rows at the longest's count.
fn n_queries() -> u32 {
    return dims.n_rows * dims.n_heads;
}

fn exp4(x: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(exp_f32(x.x), exp_f32(x.y), exp_f32(x.z), exp_f32(x.w));
}

// The record of query q (a row's head, row · n_heads + h) in slice `slice`, [b, slice,
// q] in vec4s: V4 of the unnormalized output, then (m, l, 0, 0).
fn part_index(slice: u32, q: u32) -> u32 {
    return ((batch * dims.n_slices + slice) * n_queries() + q) * (V4 + 1u);
}

// The slice's max m and sum l for query q.
fn part_ml(slice: u32, q: u32) -> vec2<f32> {
    return partials[part_index(slice, q) + V4].xy;
}

"#,
};

/// [`PARTIALS`], for the streamed pass.
pub(super) fn partials() -> super::writer::Fragment {
    PARTIALS.plain()
}

/// `kv_row(j, kv_h)`: the cache row of the sequence's key j (head kv_h), in either layout.
pub(super) fn kv_row(spec: &KernelSpec) -> Fragment {
    let blank = Fragment::from("\n");
    super::cache::cache_row(spec)
        .then(blank)
        .then(KV_ROW.plain())
}

const KV_ROW: Template = Template {
    name: "decode_kv_row",
    needs: &[],
    text: r#"fn kv_row(j: u32, kv_h: u32) -> u32 {
    return cache_row(cache_slot(), j, kv_h);
}
"#,
};

fn split(out: &mut Wgsl, spec: &KernelSpec, keep: Phases) {
    super::index::kv_head(out, spec);
    out.put(super::served::helpers(spec));
    super::index::key_visible(out, spec);
    if super::tiles::sparse(spec) {
        next_tile(out, spec);
    }
    super::scores::helpers(out, spec, false);
    out.put(super::decode_stream::words(
        spec,
        word(spec),
        false,
        keep.stage,
    ));
    out.put(SPLIT_MEMORY.fill([("qk4", Fragment::from(qk4(spec)))]));
    if spec.combines_slices() {
        out.put(combine_common());
        out.put(combine_served(spec));
        out.push_str("// Whether this workgroup was its group's last to flush.\nvar<workgroup> sh_arrived_last: u32;\n\n");
    }
    out.put(split_entry(spec, keep));
}

/// The staged split pass's workgroup memory, and the functions of its P·V.
const SPLIT_MEMORY: Template = Template {
    name: "split_memory",
    needs: &[],
    text: r#"var<workgroup> sh_q: array<vec4<f32>, TILE * $qk4>;
// The slice's scores, then its P, one vec4 (the served queries) per key.
var<workgroup> sh_s: array<vec4<f32>, MAX_SLICE>;

// P of the slice's key i (the served heads), zeros past its n keys.
fn p_at(i: u32, n: u32) -> vec4<f32> {
    return select(vec4<f32>(0.0), sh_s[min(i, MAX_SLICE - 1u)], i < n);
}

// Sums vec4 `quad` of head `h`'s P·V words over the PV_ROWS row groups (each a chain over
// its rows) and flushes it with the head's (m, l); every invocation reaches the barriers.
fn flush_head(tid: u32, slice: u32, h: u32, real: bool, quad: u32, acc: vec4<f32>, ml: vec2<f32>) {
    sh_red[tid] = acc;
    workgroupBarrier();
    if (real && tid < V_WORDS) {
        var sum = vec4<f32>(0.0);
        for (var r = 0u; r < PV_ROWS; r = r + 1u) {
            sum = sum + sh_red[r * V_WORDS + tid];
        }
        partials[part_index(slice, h) + tid * QUADS + quad] = sum;
        if (tid == 0u) {
            partials[part_index(slice, h) + V4] = vec4<f32>(ml, 0.0, 0.0);
        }
    }
    workgroupBarrier();
}

"#,
};

/// The staged split pass's entry point: each invocation's share of a key is
/// `K_WORDS / LANES` words, `lane` apart by LANES, its Q columns held in registers.
fn split_entry(spec: &KernelSpec, keep: Phases) -> Fragment {
    let loops = Loops::of(spec);
    // An fp8 cache's scales: K's folds into the staged query (s = (q·σ_K)·k), V's into the
    // P·V sums as they leave.
    let (q_scale, v_scale) = match spec.kv_fp8 {
        Some(_) => (
            " * (kv_scales[kv_h] * FP8_UNIT)",
            " * (kv_scales[dims.n_kv_heads + kv_h] * FP8_UNIT)",
        ),
        None => ("", ""),
    };
    let heads = spec.grid.tile as usize;
    let flush = (0..heads).flat_map(|i| {
        let c = COMPONENTS[i];
        (0..word(spec) / 4).map(move |u| {
            format!(
                "flush_head(tid, slice, sv.q.{c}, {i}u < n_here, {u}u, o{i}_{u}{v_scale}, vec2<f32>(m.{c}, l.{c}));"
            )
        })
    });
    let [first_v, value_pass] = value_pass(spec, &loops, keep.accumulate);
    let (builtins, sg_check, sg_args) = subgroup_parts(spec);
    let softmax = match keep.softmax {
        true => SPLIT_SOFTMAX.fill([("sg_args", Fragment::from(sg_args))]),
        false => Fragment::from(CUT_SOFTMAX),
    };
    let key_pass = match keep.scores {
        true => key_pass(spec, &loops),
        false => Fragment::from(CUT_KEY_PASS),
    };
    SPLIT_ENTRY.fill([
        ("name", Fragment::from(spec.name.as_str())),
        ("prologue", super::served::prologue(spec)),
        ("builtins", builtins),
        ("sg_check", sg_check),
        ("qk4", Fragment::from(qk4(spec))),
        ("q_scale", Fragment::from(q_scale)),
        ("fill", loops.fill.clone()),
        ("key_pass", key_pass),
        ("softmax", softmax),
        ("first_v", first_v),
        ("value_pass", value_pass),
        ("flush", lines(flush)),
        (
            "combine",
            match spec.combines_slices() {
                true => SPLIT_COMBINE.plain(),
                false => Fragment::default(),
            },
        ),
    ])
}

/// The entry's subgroup builtins, its check that subgroups hold a key's lanes, and the
/// reductions' extra arguments, where the grid sums by subgroups.
fn subgroup_parts(spec: &KernelSpec) -> (Fragment, Fragment, &'static str) {
    if !spec.grid.subgroups {
        return (Fragment::default(), Fragment::default(), "");
    }
    let builtins =
        ", @builtin(subgroup_size) sg_size: u32, @builtin(subgroup_invocation_id) sg_id: u32";
    let check = super::decode_stream::SUBGROUP_CHECK
        .plain()
        .then(Fragment::from(
            "let use_sg = workgroupUniformLoad(&sh_subgroups_off) == 0u;\n",
        ));
    (Fragment::from(builtins), check, ", sg_size, use_sg")
}

/// The staged pass's entry: the served queries staged, the slice's scores (`$key_pass`),
/// the first rows of V fetched (`$first_v`), the slice's exact max and sum, P·V
/// (`$value_pass`) and the flush.
const SPLIT_ENTRY: Template = Template {
    name: "split_entry",
    needs: &[],
    text: r#"@compute @workgroup_size(WG)
fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32$builtins) {
    $prologue
    $sg_check

    // Absent queries get q = 0; their results are never written.
    for (var i = tid; i < TILE * $qk4; i = i + WG) {
        let hq = i / $qk4;
        var x = vec4<f32>(0.0);
        if (hq < n_here) {
            x = widen4(q[q4_index(sv.q[hq]) + i % $qk4])$q_scale;
        }
        sh_q[i] = x;
    }
    $fill
    workgroupBarrier();

    $key_pass

    $first_v

    $softmax

    $value_pass
    $flush
    $combine
}
"#,
};

/// The slice's max and sum, and P in place of its scores.
const SPLIT_SOFTMAX: Template = Template {
    name: "split_softmax",
    needs: &[],
    text: r#"// The slice's exact max and sum: no rescaling within a slice.
var mx = vec4<f32>(NEG_BIG);
for (var i = first - lo + tid; i < hi - lo; i = i + WG) {
    mx = max(mx, sh_s[i]);
}
let m = wg_max4(tid, mx$sg_args);
var ls = vec4<f32>(0.0);
for (var i = first - lo + tid; i < hi - lo; i = i + WG) {
    let p = exp4(sh_s[i] - m);
    sh_s[i] = p;
    ls = ls + p;
}
let l = wg_sum4(tid, ls$sg_args);
"#,
};

/// A phase-cut pass's stand-ins for what a cut phase would have made.
// m reads a staged score, so that the key pass's stores stay live when P·V is cut too.
const CUT_SOFTMAX: &str =
    "// Phase cut: no max, sum or exponentials.\nlet m = sh_s[0];\nlet l = vec4<f32>(1.0);\n";
const CUT_KEY_PASS: &str = "// Phase cut: no key pass; the scores stay zero.\n";

/// The scores loop: the query's columns in registers (`$q_regs`), the key tiles'
/// prefetches, the dot products and each served head's score staged in `sh_s`
/// (`$stage`: [`STAGE_SCORES`] or [`STAGE_SCORES_SG`]), then `$after` the loop.
const KEY_PASS: Template = Template {
    name: "split_key_pass",
    // The scores are hsum of four chains.
    needs: &[Helper::Hsum],
    text: r#"// Scores: LANES invocations per key, each a strided share of its words. Each
// invocation carries its share of the next key tile in registers, fetched before this
// tile's products and reduction, so the loads' latency hides behind them.
let lane = tid % LANES;
let kr = tid / LANES;
$q_regs
$k_pre
$first_fetch
$k_head
    $next_fetch
    $widen_k
    $accs
    $fmas
    $stage
    $rotate
}
$after
"#,
};

/// A key tile's scores summed through workgroup memory by one invocation per key.
const STAGE_SCORES: Template = Template {
    name: "split_stage_scores",
    needs: &[],
    text: r#"sh_red[tid] = vec4<f32>($dots);
workgroupBarrier();
if (tid < KEY_TILE) {
    let j = t0 + tid;
    if (j < hi) {
        var s = vec4<f32>(0.0);
        for (var l = 0u; l < LANES; l = l + 1u) {
            s = s + sh_red[tid * LANES + l];
        }
        var x = vec4<f32>(NEG_BIG);
        $scores
        sh_s[j - lo] = x;
    }
}
workgroupBarrier();
"#,
};

/// A key tile's scores summed over each key's lanes by `group_sum4` (where subgroups hold
/// them, no barrier until the loop ends), the key's first lane staging its score.
const STAGE_SCORES_SG: Template = Template {
    name: "split_stage_scores_subgroups",
    needs: &[],
    text: r#"let s = group_sum4(vec4<f32>($dots), tid, use_sg);
let j = t0 + kr;
if (lane == 0u && j < hi) {
    var x = vec4<f32>(NEG_BIG);
    $scores
    sh_s[j - lo] = x;
}
"#,
};

/// P·V's first rows, fetched before the slice's max and sum so that their latency hides
/// behind them.
const FIRST_V: Template = Template {
    name: "split_first_v",
    needs: &[],
    text: r#"// P·V's first rows of V, fetched now so that their latency hides behind the max and
// the sum: invocation (r, c) reads word column c of rows r, r + PV_ROWS, ..
let c = tid % V_WORDS;
let r = tid / V_WORDS;
$v_pre
let i0 = $v_first - lo + r;
$first_v
"#,
};

/// P·V's loop, PV_UNROLL rows a step.
const VALUE_PASS: Template = Template {
    name: "split_value_pass",
    needs: &[],
    text: r#"// P·V: invocation (r, c) sums word column c over its rows, PV_UNROLL rows a step,
// the next step's rows fetched before this step's products.
$pv_accs
if (r < PV_ROWS) {
    $v_head
        $pv_loads
        $pv_fmas
        $pv_rotate
    }
}
"#,
};

/// The scores loop ([`KEY_PASS`]): the query's columns in registers (or read from
/// workgroup memory per key, the layout's rule), the key tiles' prefetches, the dot
/// products and each served head's score.
fn key_pass(spec: &KernelSpec, loops: &Loops) -> Fragment {
    let heads = spec.grid.tile as usize;
    let quads = word(spec) / 4;
    let per_lane = spec.head_dim / word(spec) / lanes(spec);
    let held = crate::layout::decode::query_in_registers(spec);
    let q_at = move |i: usize, e: u32, u: u32| {
        format!(
            "sh_q[{i}u * {qk4} + (lane + {e}u * LANES) * QUADS + {u}u]",
            qk4 = qk4(spec)
        )
    };
    // Every (word, quad, head) of the lane's share, in the order the products are summed.
    let each = move || {
        (0..per_lane)
            .flat_map(move |e| (0..quads).flat_map(move |u| (0..heads).map(move |i| (e, u, i))))
    };
    let q_regs = each()
        .filter(|_| held)
        .map(|(e, u, i)| format!("let q{i}_{e}_{u} = {};", q_at(i, e, u)));
    let q_col = move |i: usize, e: u32, u: u32| match held {
        true => format!("q{i}_{e}_{u}"),
        false => q_at(i, e, u),
    };
    // The lane's words of key `first` + kr into `{var}{e}`.
    let fetch = |var: &str, first: &str| {
        let words = (0..per_lane)
            .map(|e| format!("{var}{e} = fetch_k({first} + kr, hi, lane + {e}u * LANES, kv_h);"));
        lines(words)
    };
    let mut dots = vec!["0.0".to_string(); 4];
    for (i, d) in dots.iter_mut().enumerate().take(heads) {
        *d = format!("hsum(a{i})");
    }
    let scores = (0..heads).map(|i| super::served::score_head(i, "x", "j", "s"));
    let fills = [
        ("dots", Fragment::from(dots.join(", "))),
        ("scores", concat(scores)),
    ];
    let (stage, after) = match spec.grid.subgroups {
        true => (STAGE_SCORES_SG.fill(fills), "workgroupBarrier();\n"),
        false => (STAGE_SCORES.fill(fills), ""),
    };
    KEY_PASS.fill([
        ("q_regs", lines(q_regs)),
        ("k_pre", loops.keys.pre.clone()),
        ("first_fetch", fetch("var k", loops.keys.first)),
        ("k_head", loops.keys.head.clone()),
        ("next_fetch", fetch("let n", &loops.keys.next)),
        (
            "widen_k",
            lines((0..per_lane).map(|e| format!("let w{e} = widen_w(k{e});"))),
        ),
        (
            "accs",
            lines((0..heads).map(|i| format!("var a{i} = vec4<f32>(0.0);"))),
        ),
        (
            "fmas",
            lines(
                each().map(|(e, u, i)| format!("a{i} = fma({}, w{e}[{u}], a{i});", q_col(i, e, u))),
            ),
        ),
        ("stage", stage),
        ("after", Fragment::from(after)),
        (
            "rotate",
            lines((0..per_lane).map(|e| format!("k{e} = n{e};"))),
        ),
    ])
}

/// P·V: its first rows' fetches ([`FIRST_V`]), and its loop ([`VALUE_PASS`]): the heads'
/// accumulators and each step's prefetches, products and rotation, PV_UNROLL rows a step.
fn value_pass(spec: &KernelSpec, loops: &Loops, keep: bool) -> [Fragment; 2] {
    let heads = spec.grid.tile as usize;
    let quads = word(spec) / 4;
    let rows = pv_unroll(spec);
    let each_acc = move || (0..quads).flat_map(move |u| (0..heads).map(move |i| (u, i)));
    let v_next = loops.v_next;
    let fmas = (0..rows).flat_map(|r| {
        [
            format!("let p{r} = p_at(i + {r}u * PV_ROWS, hi - lo);"),
            format!("let w{r} = widen_w(v{r});"),
        ]
        .into_iter()
        .chain(each_acc().map(move |(u, i)| {
            let c = COMPONENTS[i];
            format!("o{i}_{u} = fma(vec4<f32>(p{r}.{c}), w{r}[{u}], o{i}_{u});")
        }))
    });
    let first_v = FIRST_V.fill([
        ("v_pre", loops.v_pre.clone()),
        ("v_first", Fragment::from(loops.v_first)),
        (
            "first_v",
            lines(
                (0..rows)
                    .map(|u| format!("var v{u} = fetch_v(lo + i0 + {u}u * PV_ROWS, hi, c, kv_h);")),
            ),
        ),
    ]);
    let accs = each_acc().map(|(u, i)| format!("var o{i}_{u} = vec4<f32>(0.0);"));
    if !keep {
        let cut = Fragment::from("// Phase cut: no P·V; the sums stay zero.\n");
        return [cut, lines(accs)];
    }
    let loads =
        (0..rows).map(|u| format!("let n{u} = fetch_v({v_next} + {u}u * PV_ROWS, hi, c, kv_h);"));
    let pass = VALUE_PASS.fill([
        ("pv_accs", lines(accs)),
        ("v_head", loops.v_head.clone()),
        ("pv_loads", lines(loads)),
        ("pv_fmas", lines(fmas)),
        (
            "pv_rotate",
            lines((0..rows).map(|u| format!("v{u} = n{u};"))),
        ),
    ]);
    [first_v, pass]
}

/// The reduce: each of PARTS groups of V4 invocations merges its share of the slices in
/// one pass ([`super::states::STATES`]: each slice's record read once), then the groups
/// meet once. A sink joins the denominator there, once per head (the partials carry none):
/// as a slice of max `sinks[h]` and sum 1 with no value.
/// Written `lse` (each query's log-sum-exp, the sinks counted as in O) lets a caller merge
/// the decode with attention over other keys.
fn reduce(out: &mut Wgsl, spec: &KernelSpec) {
    out.put(combine_common());
    out.put(combine(spec));
    out.put(REDUCE.fill([("name", Fragment::from(spec.name.as_str()))]));
}

/// The reduce's LSE store: no key (and no sink) stores +inf, as the forward does.
const REDUCE_LSE: Template = Template {
    name: "decode_reduce_lse",
    needs: &[Helper::Lse],
    text: r#"if ($storer) {
    // Not a constant expression: WGSL rejects non-finite constants.
    var merged = bitcast<f32>(0x7f800000u);
    if (st.l != 0.0) {
        merged = lse_f32(st.m, st.l);
    }
    lse[q_row0 * dims.n_heads + h] = merged;
}
"#,
};

const REDUCE: Template = Template {
    name: "decode_reduce",
    needs: &[],
    text: r#"// This sequence's first row in O, and its rows.
var<workgroup> sh_rows: vec2<u32>;

@compute @workgroup_size(WG)
fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    batch = wg.y;
    // Query h: row h / n_heads of the sequence's rows, head h % n_heads.
    let h = wg.x;
    if (tid == 0u) {
        sh_rows = vec2<u32>(q_starts[batch], q_starts[batch + 1u] - q_starts[batch]);
    }
    let rows = workgroupUniformLoad(&sh_rows);
    if (h / dims.n_heads >= rows.y) {
        return;
    }
    q_row0 = rows.x;
    combine_query(tid, h);
}
"#,
};

/// `combine_query(tid, h)`: query h's slices merged into its row of O (the sinks joined,
/// its LSE stored where the kernel writes it), by the reduce pass's workgroup of the query
/// and by a split pass that combines its slices itself. Every invocation reaches its
/// barriers; the last lets a caller combine another query at once.
const COMBINE: Template = Template {
    name: "decode_combine",
    needs: &[],
    text: r#"// Slices merged in turn by each of PARTS groups of V4 invocations.
const PARTS: u32 = WG / V4;

// Each group's running max and sum.
var<workgroup> sh_ml: array<vec2<f32>, PARTS>;

fn combine_query(tid: u32, h: u32) {
    let c = tid % V4;
    let part = tid / V4;
    // A slice the window hides has m_s = NEG_BIG and l_s = 0, and weighs nothing.
    if (part < PARTS) {
        var st = state_empty();
        for (var s = part; s < dims.n_slices; s = s + PARTS) {
            let ml = part_ml(s, h);
            st = merge_state(st, ml.x, ml.y, partials[part_index(s, h) + c]);
        }
        sh_red[tid] = st.acc;
        if (c == 0u) {
            sh_ml[part] = vec2<f32>(st.m, st.l);
        }
    }
    workgroupBarrier();
    if (tid < V4) {
        var st = state_empty();
        for (var p = 0u; p < PARTS; p = p + 1u) {
            st = merge_state(st, sh_ml[p].x, sh_ml[p].y, sh_red[p * V4 + tid]);
        }
        $sink
        var result = vec4<f32>(0.0);
        if (st.l != 0.0) {
            result = st.acc / st.l;
        }
        o[o4_index(h) + tid] = narrow4(result);
        $lse
    }
    workgroupBarrier();
}

"#,
};

/// [`COMBINE`] for `spec`: its sinks and its LSE where it has them.
fn combine(spec: &KernelSpec) -> Fragment {
    COMBINE.fill(combine_holes(spec, "tid == 0u"))
}

/// What every combine reads: the running states, and O's indexing.
const COMBINE_COMMON: &str = r#"// [row, h, d] in vec4s, of query q (row · n_heads + h) of this sequence's rows.
fn o4_index(q: u32) -> u32 {
    return (q_row0 * dims.n_heads + q) * V4;
}

"#;

fn combine_common() -> Fragment {
    super::states::STATES
        .plain()
        .then(Fragment::from(COMBINE_COMMON))
}

/// A combine's `$sink` (a sink joins a query's state as a slice of max `sinks[h]`, sum 1
/// and no value) and `$lse` (its LSE stored, by the invocation `storer` names, where the
/// kernel writes it).
fn combine_holes(spec: &KernelSpec, storer: &str) -> [(&'static str, Fragment); 2] {
    let sink = match spec.masks.sinks {
        true => "st = merge_state(st, sinks[h % dims.n_heads], 1.0, vec4<f32>(0.0));",
        false => "",
    };
    let lse = match spec.write_mode("lse") {
        Some(_) => REDUCE_LSE.fill([("storer", Fragment::from(storer))]),
        None => Fragment::from(""),
    };
    [("sink", Fragment::from(sink)), ("lse", lse)]
}

/// A split pass's end where it combines its slices itself: each workgroup counts itself
/// in its group's `arrivals` once its partials are stored (the device-scope barrier before
/// makes them visible first), and the last to arrive, which sees every other's count and
/// so (after its own barrier) their partials, merges the group's queries
/// ([`COMBINE_SERVED`]) and sets the count back to 0 for the next dispatch.
const SPLIT_COMBINE: Template = Template {
    name: "split_combine",
    needs: &[],
    text: r#"storageBarrier();
if (tid == 0u) {
    let group = batch * dims.n_kv_heads * groups_per_kv + wg.y;
    let arrived = atomicAdd(&arrivals[group], 1u) + 1u;
    sh_arrived_last = select(0u, 1u, arrived == dims.n_slices);
    if (arrived == dims.n_slices) {
        atomicStore(&arrivals[group], 0u);
    }
}
if (workgroupUniformLoad(&sh_arrived_last) == 1u) {
    storageBarrier();
    combine_served(tid, sv);
}
"#,
};

/// `combine_served(tid, sv)`: the served queries merged at once, Q_LANES invocations each:
/// a query's max and sum over its slices (lane-strided, then a tree over its lanes), then
/// its output columns, each column's slices shared by the lanes the columns leave, every
/// slice's loads independent of the sums before them.
const COMBINE_SERVED: Template = Template {
    name: "combine_served",
    needs: &[],
    text: r#"// Invocations per served query (a power of two, for the tree), and the slice shares of
// each output column.
const Q_LANES: u32 = $q_lanes;
const Q_PARTS: u32 = Q_LANES / V4;

fn combine_served(tid: u32, sv: Served) {
    let i = min(tid / Q_LANES, TILE);
    let lane = tid % Q_LANES;
    let real = i < sv.n;
    let h = sv.q[min(i, TILE - 1u)];
    var m = NEG_BIG;
    var l = 0.0;
    if (real) {
        for (var s = lane; s < dims.n_slices; s = s + Q_LANES) {
            let ml = part_ml(s, h);
            let mx = max(m, ml.x);
            l = fma(exp_f32(m - mx), l, exp_f32(ml.x - mx) * ml.y);
            m = mx;
        }
    }
    sh_red[tid] = vec4<f32>(m, l, 0.0, 0.0);
    workgroupBarrier();
    for (var stride = Q_LANES / 2u; stride > 0u; stride = stride / 2u) {
        if (lane < stride) {
            let a = sh_red[tid];
            let b = sh_red[tid + stride];
            let mx = max(a.x, b.x);
            sh_red[tid] = vec4<f32>(mx, fma(exp_f32(a.x - mx), a.y, exp_f32(b.x - mx) * b.y), 0.0, 0.0);
        }
        workgroupBarrier();
    }
    let total = sh_red[min(i * Q_LANES, WG - 1u)].xy;
    workgroupBarrier();
    let c = lane % V4;
    let part = lane / V4;
    var acc = vec4<f32>(0.0);
    if (real) {
        for (var s = part; s < dims.n_slices; s = s + Q_PARTS) {
            acc = fma(vec4<f32>(exp_f32(part_ml(s, h).x - total.x)), partials[part_index(s, h) + c], acc);
        }
    }
    sh_red[tid] = acc;
    workgroupBarrier();
    if (real && part == 0u) {
        var sum = vec4<f32>(0.0);
        for (var p = 0u; p < Q_PARTS; p = p + 1u) {
            sum = sum + sh_red[tid + p * V4];
        }
        var st = State(total.x, total.y, sum);
        $sink
        var result = vec4<f32>(0.0);
        if (st.l != 0.0) {
            result = st.acc / st.l;
        }
        o[o4_index(h) + c] = narrow4(result);
        $lse
    }
    workgroupBarrier();
}

"#,
};

/// [`COMBINE_SERVED`] for `spec`. A query's columns always fit its share: head_dim is at
/// most the workgroup, both powers of two, and a workgroup serves at most 4 queries.
fn combine_served(spec: &KernelSpec) -> Fragment {
    let share = spec.workgroup_size / spec.grid.tile.max(1);
    // The largest power of two in each query's share of the workgroup.
    let q_lanes = 1u32 << share.max(1).ilog2();
    let mut holes = combine_holes(spec, "c == 0u").to_vec();
    holes.push(("q_lanes", uint(q_lanes)));
    COMBINE_SERVED.fill(holes)
}

/// How the split pass's two loops walk a slice: every key, or with a `mask_mod` only the
/// tiles where a served head may see one (the K pass by `KEY_TILE` keys, P·V by `PV_STEP`
/// rows), their scores left at `NEG_BIG` (P = 0) and their rows never loaded.
struct Loops {
    /// The K pass's loop.
    keys: KeySteps,
    /// The same for P·V, whose `i` is the slice's row of this invocation's first V row.
    v_pre: Fragment,
    v_first: &'static str,
    v_head: Fragment,
    v_next: &'static str,
    /// The staged scores' initial `NEG_BIG`, where tiles are skipped.
    fill: Fragment,
}

impl Loops {
    fn of(spec: &KernelSpec) -> Loops {
        let sparse = super::tiles::sparse(spec);
        let keys = key_steps("KEY_TILE", sparse);
        match sparse {
            false => Loops {
                keys,
                v_pre: Fragment::default(),
                v_first: "first",
                v_head: Fragment::from("for (var i = i0; i < hi - lo; i = i + PV_STEP) {"),
                v_next: "lo + i + PV_STEP",
                fill: Fragment::default(),
            },
            true => Loops {
                keys,
                v_pre: Fragment::from("let v_first = next_tile(first, hi, PV_STEP, sv, wg_b);"),
                v_first: "v_first",
                v_head: SPARSE_V_HEAD.plain(),
                v_next: "v_next + r",
                fill: SPARSE_FILL.plain(),
            },
        }
    }
}

/// A split pass's loop over its slice's keys by steps of a constant's keys (the staged
/// pass's `KEY_TILE`, the streamed pass's `STEP`): statements before its first prefetch, its
/// head, and the first key of its first step and of the next one.
pub(super) struct KeySteps {
    pub pre: Fragment,
    pub head: Fragment,
    pub first: &'static str,
    pub next: String,
}

/// Every step, or with a `mask_mod` (`sparse`) only the steps a served query may see a key
/// of, the next one found at the top.
pub(super) fn key_steps(step: &str, sparse: bool) -> KeySteps {
    let step_hole = || [("step", Fragment::from(step))];
    match sparse {
        false => KeySteps {
            pre: Fragment::default(),
            head: DENSE_KEY_HEAD.fill(step_hole()),
            first: "first",
            next: format!("t0 + {step}"),
        },
        true => KeySteps {
            pre: SPARSE_KEY_PRE.fill(step_hole()),
            head: SPARSE_KEY_HEAD.fill(step_hole()),
            first: "k_first",
            next: "k_next".into(),
        },
    }
}

const DENSE_KEY_HEAD: Template = Template {
    name: "dense_key_head",
    needs: &[],
    text: "for (var t0 = first; t0 < hi; t0 = t0 + $step) {",
};

const SPARSE_KEY_PRE: Template = Template {
    name: "sparse_key_pre",
    needs: &[],
    text: r#"let k_first = next_tile(first, hi, $step, sv, wg_b);
var k_next = k_first;
"#,
};

const SPARSE_KEY_HEAD: Template = Template {
    name: "sparse_key_head",
    needs: &[],
    text: r#"for (var t0 = k_first; t0 < hi; t0 = k_next) {
    k_next = next_tile(t0 + $step, hi, $step, sv, wg_b);
"#,
};

const SPARSE_V_HEAD: Template = Template {
    name: "sparse_v_head",
    needs: &[],
    text: r#"var v_next = v_first;
for (var t = v_first; t < hi; t = v_next) {
    v_next = next_tile(t + PV_STEP, hi, PV_STEP, sv, wg_b);
    let i = t - lo + r;
"#,
};

const SPARSE_FILL: Template = Template {
    name: "sparse_fill",
    needs: &[],
    text: r#"// Keys of the tiles the loops skip keep this score: their P is 0.
for (var i = tid; i < MAX_SLICE; i = i + WG) {
    sh_s[i] = vec4<f32>(NEG_BIG);
}
"#,
};

/// `next_tile(t0, end, n, sv)`: the first tile of `n` keys from key `t0` (stepping by `n`)
/// before `end` where one of the served queries may see a key by `mask_tile` (over their
/// positions, first to last), or a key at or past `end`.
pub(super) fn next_tile(out: &mut Wgsl, spec: &KernelSpec) {
    let by_head = spec
        .flex()
        .and_then(|f| f.mask_mod)
        .is_some_and(|m| m.mentions("h"));
    let seen = match by_head {
        true => SEEN_BY_HEAD.plain(),
        false => Fragment::from("return mask_tile(q0, q1, k0, k1, sv.h.x, b).x;"),
    };
    out.put(NEXT_TILE.fill([("seen", seen)]));
}

/// A mask_mod that reads the head: a tile is seen where any served head sees it.
const SEEN_BY_HEAD: Template = Template {
    name: "seen_by_head",
    needs: &[],
    text: r#"var seen = false;
for (var i = 0u; i < sv.n; i = i + 1u) {
    seen = seen || mask_tile(q0, q1, k0, k1, sv.h[i], b).x;
}
return seen;
"#,
};

/// [`next_tile`] and its test, `$seen` deciding a tile over the served queries' positions.
const NEXT_TILE: Template = Template {
    name: "next_tile",
    needs: &[],
    text: r#"// Whether a served query may see a key of [k0, k1].
fn tile_seen(k0: u32, k1: u32, sv: Served, b: u32) -> bool {
    let q0 = sv.pos.x;
    let q1 = sv.pos[max(sv.n, 1u) - 1u];
    $seen
}

fn next_tile(t0: u32, end: u32, n: u32, sv: Served, b: u32) -> u32 {
    var t = t0;
    while (t < end && !tile_seen(t, min(t + n, end) - 1u, sv, b)) {
        t = t + n;
    }
    return t;
}

"#,
};
