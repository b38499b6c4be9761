//! bf16 operands on f16 tensor cores (`CoopTiling::scaled`). naga has no bf16 cooperative
//! matrix, but a bf16 value (8 significant bits) is an f16 one (11) wherever its magnitude
//! lies in f16's range. So each row of every operand is scaled by a power of two that puts
//! its largest magnitude in [2^14, 2^15): every value within 2^31 of its row's largest
//! converts exactly (f16's subnormals hold 8 bits down to 2^-17), a smaller one within
//! 2^-39 of the largest, and the scales come back exactly, as powers of two.
//!
//! In the forward:
//!
//! - Q's row scale and K's row scale multiply S = Q·Kᵀ element by element before the
//!   softmax (in f32, where the score lives anyway);
//! - V's row scale 2^v_j joins the softmax's weights: O accumulates
//!   2^(s·log2 e + v_j − mo)·V'_j, where `mo` is a second lazy reference max per row (that
//!   of s·log2 e + v_j), so that the f16 weights stay below e^TAU whatever V's range, and
//!   O = O_acc · 2^(mo − m·log2 e) / l at the end. The row sum l keeps its own max. Each
//!   weight is P = 2^(s·log2 e − m·log2 e) times 2^v_j times the row's 2^(m·log2 e − mo),
//!   so a score takes one exponential.
//!
//! Each row's largest magnitude comes from the `row_scale` pass (`row_max`: Q, K, V, and
//! for the backward O and dO), so staging converts each vec4 as it is fetched. (The forward
//! once gathered its maxima itself, with `atomicMax` on the f32 bits in workgroup memory per
//! block and a barrier between the maxima and the conversion: on an H100 at seq 4096, d 128
//! its staging took 0.98 ms against f16's 0.19.)
//!
//! In the backward S and dP (and D) are scaled back to
//! their true values before the elementwise step, which so runs as in f16. Each weighted
//! sum then folds the row scale of the tensor it multiplies into its weights (dQ: dS_ij ·
//! 2^k_j; dV: P_ij · 2^do_i; dK: dS_ij · 2^q_i) and divides them by a lazy power-of-two
//! reference per output row, moved (and the accumulator's row rescaled through workgroup
//! memory) only when a block's largest weight would pass 2^15; the output row is multiplied
//! by 2^reference at the end.

use super::coop::expr;
use super::index::Rows;
use super::writer::{Fragment, Template, Wgsl, lines, uint};
use crate::spec::KernelSpec;

/// Where a row's largest magnitude lands: [2^TOP, 2^(TOP + 1)).
const TOP: i32 = 14;

/// Each key's scales of the staged block.
pub(super) fn key_scale_memory(out: &mut Wgsl) {
    out.put(KEY_SCALE_MEMORY.plain());
}

/// The forward's scales of each staged key: S's factor and V's.
const KEY_SCALE_MEMORY: Template = Template {
    name: "coop_key_scale_memory",
    needs: &[],
    text: r#"// bf16 operands: each staged key's scale of S and of its V row (powers of two).
var<workgroup> sh_ks: array<f32, BC>;
var<workgroup> sh_vs: array<f32, BC>;

"#,
};

/// Four bf16 values, two to a word, widened into f32.
const WIDEN: Template = Template {
    name: "coop_widen",
    needs: &[],
    text: r#"fn bf16x4(w: vec2<u32>) -> vec4<f32> {
    return bitcast<vec4<f32>>(vec4<u32>(w.x << 16u, w.x & 0xffff0000u, w.y << 16u, w.y & 0xffff0000u));
}

"#,
};

/// The row exponent and the conversion into f16 by a row's scale, and back.
const EXPONENTS: Template = Template {
    name: "coop_exponents",
    needs: &[],
    text: r#"// The exponent of a row's largest magnitude (its f32 bits), kept where 2^(±e ± $top) is
// a normal f32 (a NaN or an infinity still converts to itself).
fn row_exp(bits: u32) -> i32 {
    return clamp(i32(bits >> 23u) - 127, -100, 127);
}

fn pow2(e: i32) -> f32 {
    return bitcast<f32>(u32(e + 127) << 23u);
}

// Four values of a row whose largest magnitude has f32 bits `bits`, scaled into f16.
fn to_half(w: vec2<u32>, bits: u32) -> vec4<f16> {
    return vec4<f16>(bf16x4(w) * pow2($top - row_exp(bits)));
}

// The factor that undoes `to_half` for a row.
fn from_half(bits: u32) -> f32 {
    return pow2(row_exp(bits) - $top);
}

"#,
};

/// `note_scales(row, a, b)`: staged block row `row`'s scales from the maxima `a` and `b` of
/// its two tensors' rows: the forward's each key's factor of S and log2 of its V scale
/// (`sh_ks`, `sh_vs`), a backward half's two row exponents (`sh_e`).
pub(super) fn note_scales(out: &mut Wgsl, forward: bool) {
    let body = match forward {
        true => FORWARD_SCALES.plain(),
        false => Fragment::from("sh_e[row] = vec2<i32>(shift_of(a), shift_of(b));"),
    };
    out.put(NOTE_SCALES.fill([("body", body)]));
}

/// A staged block row's scales (`$body`), from its two tensors' row maxima.
const NOTE_SCALES: Template = Template {
    name: "coop_note_scales",
    needs: &[],
    text: r#"fn note_scales(row: u32, a: u32, b: u32) {
    $body
}

"#,
};

/// The forward's scales of a key: S's factor, and V's (0 for an all-zero row, whose
/// weight then never moves O's reference).
const FORWARD_SCALES: Template = Template {
    name: "coop_forward_scales",
    needs: &[],
    text: r#"sh_ks[row] = from_half(a);
sh_vs[row] = select(from_half(b), 0.0, b == 0u);
"#,
};

/// Beside the stores of carried vec4 `i` of a block's `tensors`: where it starts a row of
/// the block, the row's scales from the maxima held with the words (see
/// `CoopTiling::converts_at_store`), so that no other load waits for them.
pub(super) fn note_at_store(tensors: [&str; 2], (e, i): (&str, u32)) -> Fragment {
    NOTE_AT_STORE.fill([
        ("e", expr(e)),
        ("a", expr(format!("b{}_{i}", tensors[0]))),
        ("b", expr(format!("b{}_{i}", tensors[1]))),
    ])
}

/// The scales of the block row that carried vec4 `$e` starts, if it starts one.
const NOTE_AT_STORE: Template = Template {
    name: "coop_note_at_store",
    needs: &[],
    text: r#"if (($e) % (HEAD_DIM / 4u) == 0u && $e < BC * (HEAD_DIM / 4u)) {
    note_scales(($e) / (HEAD_DIM / 4u), $a, $b);
}
"#,
};

/// The conversions and each row's maximum: from `row_max` (`q_bits` for rows of Q, O and
/// dO by query head, `kv_bits` for K and V by KV head; a row past the sequence reads the
/// last one's), or where the kernel scales at fetch, Q's from `sh_qb` (`q_row_maxima`)
/// and K's and V's from the lanes that fetched them (`lanes_row_bits`).
pub(super) fn row_bits(out: &mut Wgsl, spec: &KernelSpec, at_fetch: bool) {
    out.put(WIDEN.plain());
    out.put(EXPONENTS.fill([("top", expr(TOP))]));
    out.put(SCALING.fill([("top", expr(TOP))]));
    match at_fetch {
        true => {
            fetch_words(out, spec, ("qw", "q"), Rows::Q, "BR");
            out.put(FETCHED_BITS.fill([("reduce", lanes_max(spec.width()))]));
        }
        false => out.put(PASS_BITS.plain()),
    }
}

/// Scaling by powers of two.
const SCALING: Template = Template {
    name: "coop_scaling",
    needs: &[],
    text: r#"// log2 of the factor that undoes `to_half` for a row.
fn shift_of(bits: u32) -> i32 {
    return row_exp(bits) - $top;
}

// x·2^n for |n| <= 252, by two exact multiplications by normal powers of two (WGSL's
// ldexp: the bf16 backward at seq 4096, d 128 took 8.70 ms with it on an H100, 6.47 with this).
fn scale2(x: f32, n: i32) -> f32 {
    let m = clamp(n, -252, 252);
    let a = m / 2;
    return x * pow2(a) * pow2(m - a);
}

// x·2^n in one multiplication, for a row's or key's exponent n (shift_of: within
// -114..113, a normal power of two) or a reference's negation.
fn mulp2(x: f32, n: i32) -> f32 {
    return x * pow2(n);
}

// x·2^n for a sum of two exponents (a score's or dP's scales) in one multiplication: zero
// below f32's normal range, where |x·2^n| < 2^37·2^-126 lies far under the rule's 1e-6
// floor; clamped at its top, where the true value overflows f32 as well. (With scale2's
// two multiplications here and for the weights, the bf16 backward took 4.13 ms at seq
// 4096, d 128 on an H100; 3.79 with these.)
fn mulp2_sum(x: f32, n: i32) -> f32 {
    return select(0.0, x * pow2(min(n, 127)), n >= -126);
}

"#,
};

/// Each row's maximum from `row_max`, the `row_scale` pass's.
const PASS_BITS: Template = Template {
    name: "coop_pass_bits",
    needs: &[],
    text: r#"// Part p of row_max: 0 Q, 1 K, 2 V, 3 O, 4 dO.
fn part_at(p: u32) -> u32 {
    return p * dims.batch * dims.seq_len * dims.n_heads;
}

fn q_bits(p: u32, row: u32, h: u32) -> u32 {
    return row_max[part_at(p) + row_index(min(row, dims.seq_len - 1u), h)];
}

fn kv_bits(p: u32, j: u32, kv_h: u32) -> u32 {
    return row_max[part_at(p) + (batch * dims.seq_len + min(j, dims.seq_len - 1u)) * dims.n_kv_heads + kv_h];
}

"#,
};

/// Each row's maximum from its own values: a cached row's over the lanes that fetch it
/// (the row's HEAD_DIM / 4 vec4s lie in consecutive lanes of one subgroup: the carried
/// index is by subgroup and lane), the tile's rows of Q's once, before Q is staged.
const FETCHED_BITS: Template = Template {
    name: "coop_fetched_bits",
    needs: &[],
    text: r#"// Each of the tile's rows of Q: its largest magnitude's f32 bits, and the tile's first row.
var<workgroup> sh_qb: array<u32, BR>;
var<private> q_origin: u32;

// The largest magnitude's f32 bits of the row that this invocation's four values `w` lie
// in, over the HEAD_DIM / 4 consecutive lanes that hold that row's values (a NaN's bits
// pass every number's, as in `row_max`).
fn lanes_row_bits(w: vec2<u32>) -> u32 {
    var m = max(max(w.x & 0x7fffu, (w.x >> 16u) & 0x7fffu), max(w.y & 0x7fffu, (w.y >> 16u) & 0x7fffu));
    $reduce
}

fn q_bits(p: u32, row: u32, h: u32) -> u32 {
    return sh_qb[row - q_origin];
}

// The maxima of the tile's rows of Q from row r0 into sh_qb; `me` numbers the invocation
// by subgroup and lane.
fn q_row_maxima(r0: u32, h: u32, me: u32) {
    q_origin = r0;
    for (var e = me; e < BR * (HEAD_DIM / 4u); e = e + WG) {
        let b = lanes_row_bits(fetch_qw(r0, h, e));
        if (e % (HEAD_DIM / 4u) == 0u) {
            sh_qb[e / (HEAD_DIM / 4u)] = b;
        }
    }
}

"#,
};

/// The body of `lanes_row_bits` for rows `width` wide: `m`'s maximum over each row's
/// lanes, a butterfly of `subgroupShuffleXor` written out step by step. On an H200
/// (2026-12-03, `bench --decode 32768 --heads 32 --kv-heads 8 --head-dim 128 --continued`,
/// bf16, 512 new rows, the maxima taken beside the stores) the chunk took 5.19 ms so, 13.4
/// with the butterfly as a loop, 5.65 with `subgroupMax` (one reduction per row a subgroup
/// holds), and 3.77 with no maxima at all (its results wrong, its time the point).
fn lanes_max(width: u32) -> Fragment {
    let steps = (0..).map(|k| 1u32 << k).take_while(|s| *s < width / 4);
    let each = steps.map(|s| format!("m = max(m, subgroupShuffleXor(m, {s}u));"));
    lines(each.chain(["return m << 16u;".to_string()]))
}

/// The part of `row_max` holding the rows of fetch `name` (Q, K, V, O, dO).
pub(super) fn part(name: &str) -> u32 {
    match name {
        "q" => 0,
        "k" => 1,
        "v" => 2,
        "o" => 3,
        _ => 4,
    }
}

/// `fetch_{name}(r0, h, e)`: vec4 `e` of `rows` rows of bf16 `tensor` from r0 as its two
/// words (zeros past the sequence and past the block), held narrow until its store.
pub(super) fn fetch_words(
    out: &mut Wgsl,
    spec: &KernelSpec,
    (name, tensor): (&str, &str),
    of: Rows,
    rows: &str,
) {
    out.put(FETCH_WORDS.fill([
        ("name", expr(name)),
        ("cond", expr(super::coop::fetch_guard(spec, of, rows))),
        ("index", expr(of.index("r", "h"))),
        ("tensor", expr(tensor)),
    ]));
}

/// One vec4 of a block's bf16 rows into registers as its two words, zeros where the guard
/// `$cond` fails.
const FETCH_WORDS: Template = Template {
    name: "coop_fetch_words",
    needs: &[],
    text: r#"fn fetch_$name(r0: u32, h: u32, e: u32) -> vec2<u32> {
    let r = r0 + e / (HEAD_DIM / 4u);
    let c = (e % (HEAD_DIM / 4u)) * 4u;
    var x = vec2<u32>(0u);
    if ($cond) {
        let i = ($index + c) >> 1u;
        x = vec2<u32>($tensor[i], $tensor[i + 1u]);
    }
    return x;
}

"#,
};

/// The maximum of the row of fetch `name` (Q, K, V, O, dO) that carried vec4 `e` of a
/// block from row `r0` lies in, of head `head` (a KV head for K and V).
pub(super) fn block_row_bits(name: &str, r0: &str, head: &str, e: &str) -> String {
    let bits = match name {
        "k" | "v" => "kv_bits",
        _ => "q_bits",
    };
    format!(
        "{bits}({}u, {r0} + min(({e}) / (HEAD_DIM / 4u), BC - 1u), {head})",
        part(name)
    )
}

/// `fetch_{name}(r0, h, e)`: vec4 `e` of `rows` rows of bf16 `tensor` from r0 in f16,
/// scaled by its row's power of two (zeros past the sequence and the block).
pub(super) fn fetch_half(
    out: &mut Wgsl,
    spec: &KernelSpec,
    (name, tensor): (&str, &str),
    of: Rows,
    rows: &str,
) {
    let bits = match of {
        Rows::Q | Rows::O => "q_bits",
        Rows::K | Rows::V => "kv_bits",
    };
    let load = |index: &str| {
        HALF_LOAD.fill([
            ("index", expr(index)),
            ("tensor", expr(tensor)),
            ("bits", expr(bits)),
            ("part", uint(part(name))),
        ])
    };
    super::coop::fetch_with(out, spec, (name, of, rows), &load);
}

/// Four bf16 values of `$tensor` from element `$index + c` into f16, scaled by their
/// row's power of two (its maximum from `$bits`).
const HALF_LOAD: Template = Template {
    name: "coop_half_load",
    needs: &[],
    text: r#"let i = ($index + c) >> 1u;
x = to_half(vec2<u32>($tensor[i], $tensor[i + 1u]), $bits($part, r, h));
"#,
};

/// A weighted sum's reference moves to the exponent of a block's largest weight (which
/// then lands in f16 at [2^0, 2^1)) when that weight would reach 2^15 against the old one:
/// the weights may grow 2^14 between moves, and weights 2^14 below the largest stay
/// normal f16.
const REF_ROOM: i32 = 14;
/// The references' range: 2^-REF_LOW .. 2^REF_HIGH scale an f32 weight without leaving f32.
const REF_LOW: i32 = -126;
const REF_HIGH: i32 = 111;

/// The lazy references' constants.
pub(super) fn reference_constants(out: &mut Wgsl) {
    out.put(REFERENCE_CONSTANTS.fill([
        ("room", expr(REF_ROOM)),
        ("low", expr(REF_LOW)),
        ("high", expr(REF_HIGH)),
    ]));
}

/// The weighted sums' lazy references: their room and range.
const REFERENCE_CONSTANTS: Template = Template {
    name: "coop_reference_constants",
    needs: &[],
    text: r#"// bf16: a weighted sum's weights are divided by 2^ref of their output row, ref moved
// to a block's largest weight's exponent when that passes ref + REF_ROOM.
const REF_ROOM: i32 = $room;
const REF_LOW: i32 = $low;
const REF_HIGH: i32 = $high;

"#,
};

/// The workgroup memory of the accumulators' references: each row's rescale factor in a
/// block (its final factor after the loop), and the word whose bit `i` says that some row
/// of accumulator `i` moved (one word, so that one uniform load reads them all), in a
/// 16-byte array: with two 4-byte flags of their own, NVIDIA's driver left a later f16
/// array off 16-byte alignment, and cooperative loads from it read zeros.
pub(super) fn reference_memory(accs: &[&str]) -> Fragment {
    let factors = accs
        .iter()
        .map(|acc| format!("var<workgroup> sh_c_{acc}: array<f32, BR>;"));
    REFERENCE_MEMORY.fill([("factors", lines(factors))])
}

/// The staged block's row exponents, each accumulator's row `$factors` and the moved
/// flags.
const REFERENCE_MEMORY: Template = Template {
    name: "coop_reference_memory",
    needs: &[],
    text: r#"// The staged block's row exponents: K's and V's of each key (the dQ half), Q's and
// dO's of each query (the dK/dV half).
var<workgroup> sh_e: array<vec2<i32>, BC>;
$factors
var<workgroup> sh_rescale_of: array<atomic<u32>, 4>;
"#,
};

/// The word of the accumulators' moved bits.
pub(super) const MOVED: &str = "sh_rescale_of[0]";

/// Accumulator `i`'s bit in [`MOVED`].
pub(super) fn moved_bit(i: usize) -> u32 {
    1 << i
}

/// After a block's weights of `acc` are in `wm_{acc}` (the invocation's largest magnitude)
/// and its row's invocations are `lanes` consecutive lanes: the row's reference moved
/// where it must, its rescale factor into `sh_c_{acc}`, and the flag.
pub(super) fn move_reference((acc, i): (&str, usize), lanes: u32) -> Fragment {
    MOVE_REFERENCE.fill([
        (
            "reduce",
            super::coop::row_reduce(&format!("wm_{acc}"), "max", lanes),
        ),
        ("acc", expr(acc)),
        ("moved", expr(MOVED)),
        ("bit", uint(moved_bit(i))),
    ])
}

/// The row's largest weight of `$acc` (`$reduce`d over the row's invocations) moves its
/// reference where it passes it by more than REF_ROOM.
const MOVE_REFERENCE: Template = Template {
    name: "coop_move_reference",
    needs: &[],
    text: r#"$reduce
let e_$acc = i32(bitcast<u32>(wm_$acc) >> 23u) - 127;
let moved_$acc = wm_$acc > 0.0 && e_$acc > ref_$acc + REF_ROOM;
let next_$acc = select(ref_$acc, clamp(e_$acc, REF_LOW, REF_HIGH), moved_$acc);
if (moved_$acc) {
    atomicOr(&$moved, $bit);
}
if (c0 == 0u) {
    sh_c_$acc[r] = scale2(1.0, ref_$acc - next_$acc);
}
ref_$acc = next_$acc;
"#,
};

/// After the loop: each row's factor from `acc`'s accumulators to its output, 2^ref.
pub(super) fn final_factor(acc: &str) -> Fragment {
    FINAL_FACTOR.fill([("acc", expr(acc))])
}

/// A row's final factor of accumulator `$acc`.
const FINAL_FACTOR: Template = Template {
    name: "coop_final_factor",
    needs: &[],
    text: r#"if (c0 == 0u) {
    sh_c_$acc[r] = scale2(1.0, ref_$acc);
}
"#,
};
