//! bf16 operands on f16 tensor cores (`CoopTiling::scaled`). naga has no bf16 cooperative
//! matrix, but a bf16 value (8 significant bits) is an f16 one (11) wherever its magnitude
//! lies in f16's range. So each row of every operand is scaled by a power of two that puts
//! its largest magnitude in [2^14, 2^15): every value within 2^38 of its row's largest
//! converts exactly (f16's subnormals hold 8 bits down to 2^-17), and the scales come back
//! exactly, as powers of two.
//!
//! In the forward:
//!
//! - Q's row scale and K's row scale multiply S = Q·Kᵀ element by element before the
//!   softmax (in f32, where the score lives anyway);
//! - V's row scale 2^v_j joins the softmax's weights: O accumulates
//!   2^(s·log2 e + v_j − mo)·V'_j, where `mo` is a second lazy reference max per row (that
//!   of s·log2 e + v_j), so that the f16 weights stay below e^TAU whatever V's range, and
//!   O = O_acc · 2^(mo − m·log2 e) / l at the end. The row sum l keeps its own max.
//!
//! A forward row's largest magnitude is gathered with `atomicMax` on the f32 bits
//! (monotone for non-negative floats) in workgroup memory: for Q once per tile, for K and
//! V per block, into one of two slots by the block's parity, so that the next block's
//! maxima gather while this block's are still read; a slot is cleared after the barrier
//! that ends its reads.
//!
//! In the backward the maxima come from the `row_scale` pass (`row_max`: Q, K, V, O, dO),
//! so staging converts each vec4 as it is fetched. S and dP (and D) are scaled back to
//! their true values before the elementwise step, which so runs as in f16. Each weighted
//! sum then folds the row scale of the tensor it multiplies into its weights (dQ: dS_ij ·
//! 2^k_j; dV: P_ij · 2^do_i; dK: dS_ij · 2^q_i) and divides them by a lazy power-of-two
//! reference per output row, moved (and the accumulator's row rescaled through workgroup
//! memory) only when a block's largest weight would pass 2^15; the output row is multiplied
//! by 2^reference at the end.

use std::fmt::Write;

use super::index::Rows;
use super::writer::Wgsl;
use crate::spec::KernelSpec;

/// Where a row's largest magnitude lands: [2^TOP, 2^(TOP + 1)).
const TOP: i32 = 14;
/// Log2 of the scale of an all-zero V row: far below any weight that survives f16.
const ZERO_ROW: f32 = -256.0;

/// The row maxima and the block's key scales.
pub(super) fn workgroup_memory(out: &mut Wgsl) {
    out.push_str(
        "// bf16 operands: each row's largest magnitude (f32 bits) of Q, and of K and V for\n\
         // two blocks (slot kt % 2); each key's scale of S (2^e) and log2 of its V scale.\n\
         var<workgroup> sh_qmax: array<atomic<u32>, BR>;\n\
         var<workgroup> sh_kmax: array<atomic<u32>, 2 * BC>;\n\
         var<workgroup> sh_vmax: array<atomic<u32>, 2 * BC>;\n\
         var<workgroup> sh_ks: array<f32, BC>;\nvar<workgroup> sh_vs: array<f32, BC>;\n\n",
    );
}

/// Widening, the row exponent and the scaled conversion; `note_{name}` (a fetched vec4
/// into its row's max) for Q, K and V, and `half_{name}` (into f16 by its row's scale)
/// for K and V.
pub(super) fn helpers(out: &mut Wgsl) {
    widen(out);
    out.push_str(
        r#"fn max_bits(w: vec2<u32>) -> u32 {
    let a = abs(bf16x4(w));
    return bitcast<u32>(max(max(a.x, a.y), max(a.z, a.w)));
}

"#,
    );
    exponents(out);
    gather(out);
}

fn widen(out: &mut Wgsl) {
    out.push_str(
        r#"fn bf16x4(w: vec2<u32>) -> vec4<f32> {
    return bitcast<vec4<f32>>(vec4<u32>(w.x << 16u, w.x & 0xffff0000u, w.y << 16u, w.y & 0xffff0000u));
}

"#,
    );
}

/// The row exponent and the conversion into f16 by a row's scale, and back.
fn exponents(out: &mut Wgsl) {
    let _ = write!(
        out,
        r#"// The exponent of a row's largest magnitude (its f32 bits), kept where 2^(±e ± {TOP}) is
// a normal f32 (a NaN or an infinity still converts to itself).
fn row_exp(bits: u32) -> i32 {{
    return clamp(i32(bits >> 23u) - 127, -100, 127);
}}

fn pow2(e: i32) -> f32 {{
    return bitcast<f32>(u32(e + 127) << 23u);
}}

// Four values of a row whose largest magnitude has f32 bits `bits`, scaled into f16.
fn to_half(w: vec2<u32>, bits: u32) -> vec4<f16> {{
    return vec4<f16>(bf16x4(w) * pow2({TOP} - row_exp(bits)));
}}

// The factor that undoes `to_half` for a row.
fn from_half(bits: u32) -> f32 {{
    return pow2(row_exp(bits) - {TOP});
}}

"#
    );
}

/// The forward's `note_{name}` and `half_{name}`, through the row maxima in workgroup
/// memory.
fn gather(out: &mut Wgsl) {
    // (Each invocation adds its own max: taking a row's max among the invocations that
    // hold it first, by shuffles, and one atomic per row and subgroup, made the bf16
    // forward slower on an H200, 1.717 -> 2.335 ms at seq 4096, d 128.)
    for (name, rows) in [("q", "BR"), ("k", "BC"), ("v", "BC")] {
        let _ = write!(
            out,
            r#"fn note_{name}(e: u32, base: u32, w: vec2<u32>) {{
    if (e < {rows} * (HEAD_DIM / 4u)) {{
        atomicMax(&sh_{name}max[base + e / (HEAD_DIM / 4u)], max_bits(w));
    }}
}}

"#
        );
    }
    for name in ["k", "v"] {
        let _ = write!(
            out,
            r#"fn half_{name}(e: u32, slot: u32, w: vec2<u32>) -> vec4<f16> {{
    let row = min(e / (HEAD_DIM / 4u), BC - 1u);
    return to_half(w, atomicLoad(&sh_{name}max[slot * BC + row]));
}}

"#
        );
    }
}

/// `fetch_{name}(r0, h, e)`: vec4 `e` of `rows` rows of bf16 `tensor` from r0 as its two
/// words (zeros past the sequence and past the block), held narrow until its store.
pub(super) fn fetch(
    out: &mut Wgsl,
    spec: &KernelSpec,
    name: &str,
    tensor: &str,
    of: Rows,
    rows: &str,
) {
    let _ = write!(
        out,
        r#"fn fetch_{name}(r0: u32, h: u32, e: u32) -> vec2<u32> {{
    let r = r0 + e / (HEAD_DIM / 4u);
    let c = (e % (HEAD_DIM / 4u)) * 4u;
    var x = vec2<u32>(0u);
    if ({cond}) {{
        let i = ({index} + c) >> 1u;
        x = vec2<u32>({tensor}[i], {tensor}[i + 1u]);
    }}
    return x;
}}

"#,
        cond = super::coop::fetch_guard(spec, of, rows),
        index = of.index("r", "h"),
    );
}

/// Clears every slot, then gathers the maxima of the tile's Q rows (before Q is staged).
pub(super) fn q_maxima(b: &mut String) {
    b.push_str(
        "    for (var e = tid; e < 2u * BC; e = e + WG) {\n        \
         atomicStore(&sh_kmax[e], 0u);\n        atomicStore(&sh_vmax[e], 0u);\n    }\n    \
         for (var e = tid; e < BR; e = e + WG) {\n        atomicStore(&sh_qmax[e], 0u);\n    }\n    \
         workgroupBarrier();\n    \
         for (var e = tid; e < BR * (HEAD_DIM / 4u); e = e + WG) {\n        \
         note_q(e, 0u, fetch_q(row0, h, e));\n    }\n",
    );
}

/// Q's raw words `w` in f16, scaled by the power of two of its tile row `row`.
pub(super) fn q_half(w: &str, row: &str) -> String {
    format!("to_half({w}, atomicLoad(&sh_qmax[{row}]))")
}

/// Before the block's loads are stored: each key's scales, from the gathered maxima.
pub(super) fn key_scales(b: &mut String) {
    let _ = write!(
        b,
        "        if (tid < BC) {{\n            \
         sh_ks[tid] = from_half(atomicLoad(&sh_kmax[slot * BC + tid]));\n            \
         let vb = atomicLoad(&sh_vmax[slot * BC + tid]);\n            \
         sh_vs[tid] = select(f32(row_exp(vb) - {TOP}), {ZERO_ROW:.1}, vb == 0u);\n        }}\n"
    );
}

/// After the barrier that ends the block's reads of its slot: the slot cleared for the
/// block after next.
pub(super) fn clear_slot(b: &mut String) {
    b.push_str(
        "        if (tid < BC) {\n            atomicStore(&sh_kmax[slot * BC + tid], 0u);\n            \
         atomicStore(&sh_vmax[slot * BC + tid], 0u);\n        }\n",
    );
}

/// The backward's conversions and each row's maximum from `row_max` (`q_bits` for rows of
/// Q, O and dO by query head, `kv_bits` for K and V by KV head; a row past the sequence
/// reads the last one's).
pub(super) fn row_bits(out: &mut Wgsl) {
    widen(out);
    exponents(out);
    let _ = write!(
        out,
        r#"// log2 of the factor that undoes `to_half` for a row.
fn shift_of(bits: u32) -> i32 {{
    return row_exp(bits) - {TOP};
}}

// x·2^n for |n| <= 252, by two exact multiplications by normal powers of two (WGSL's
// ldexp: the bf16 backward at seq 4096, d 128 took 8.70 ms with it on an H100, 6.47 with this).
fn scale2(x: f32, n: i32) -> f32 {{
    let m = clamp(n, -252, 252);
    let a = m / 2;
    return x * pow2(a) * pow2(m - a);
}}

// Part p of row_max: 0 Q, 1 K, 2 V, 3 O, 4 dO.
fn part_at(p: u32) -> u32 {{
    return p * dims.batch * dims.seq_len * dims.n_heads;
}}

fn q_bits(p: u32, row: u32, h: u32) -> u32 {{
    return row_max[part_at(p) + row_index(min(row, dims.seq_len - 1u), h)];
}}

fn kv_bits(p: u32, j: u32, kv_h: u32) -> u32 {{
    return row_max[part_at(p) + (batch * dims.seq_len + min(j, dims.seq_len - 1u)) * dims.n_kv_heads + kv_h];
}}

"#
    );
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

/// The backward's `fetch_{name}(r0, h, e)`: vec4 `e` of `rows` rows of bf16 `tensor` from
/// r0 in f16, scaled by its row's power of two (zeros past the sequence and the block).
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
    let p = part(name);
    let load = |index: &str| {
        format!(
            "let i = ({index} + c) >> 1u;\n        \
             x = to_half(vec2<u32>({tensor}[i], {tensor}[i + 1u]), {bits}({p}u, r, h));"
        )
    };
    super::coop::fetch_with(out, spec, (name, of, rows), &load);
}

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
    let _ = write!(
        out,
        "// bf16: a weighted sum's weights are divided by 2^ref of their output row, ref moved\n\
         // to a block's largest weight's exponent when that passes ref + REF_ROOM.\n\
         const REF_ROOM: i32 = {REF_ROOM};\nconst REF_LOW: i32 = {REF_LOW};\nconst REF_HIGH: i32 = {REF_HIGH};\n\n"
    );
}

/// The workgroup memory of the accumulators' references: each row's rescale factor in a
/// block (its final factor after the loop), and per accumulator the flag that some row
/// moved, in one 16-byte array: with two 4-byte flags of their own, NVIDIA's driver left a
/// later f16 array off 16-byte alignment, and cooperative loads from it read zeros.
pub(super) fn reference_memory(out: &mut Wgsl, accs: &[&str]) {
    out.push_str(
        "// The staged block's row exponents: K's and V's of each key (the dQ half), Q's and\n\
         // dO's of each query (the dK/dV half).\nvar<workgroup> sh_e: array<vec2<i32>, BC>;\n",
    );
    for acc in accs {
        let _ = writeln!(out, "var<workgroup> sh_c_{acc}: array<f32, BR>;");
    }
    out.push_str("var<workgroup> sh_rescale_of: array<atomic<u32>, 4>;\n");
}

/// Each staged block row's two exponents into `sh_e`, beside its staging (published by
/// the barrier that ends it): K's and V's for the query-major half (`kv` false), Q's and
/// dO's for the key-major one.
pub(super) fn block_exponents(kv: bool) -> String {
    let (first, second) = match kv {
        false => ("kv_bits(1u, j0 + e, kv_h)", "kv_bits(2u, j0 + e, kv_h)"),
        true => ("q_bits(0u, s0 + e, h)", "q_bits(4u, s0 + e, h)"),
    };
    format!(
        "        for (var e = tid; e < BC; e = e + WG) {{\n            \
         sh_e[e] = vec2<i32>(shift_of({first}), shift_of({second}));\n        }}\n"
    )
}

/// Accumulator `i`'s flag.
pub(super) fn flag(i: usize) -> String {
    format!("sh_rescale_of[{i}]")
}

/// After a block's weights of `acc` are in `wm_{acc}` (the invocation's largest magnitude)
/// and its row's invocations are `lanes` consecutive lanes: the row's reference moved
/// where it must, its rescale factor into `sh_c_{acc}`, and the flag.
pub(super) fn move_reference(b: &mut String, (acc, i): (&str, usize), lanes: u32) {
    let _ = write!(
        b,
        "{}        let e_{acc} = i32(bitcast<u32>(wm_{acc}) >> 23u) - 127;\n        \
         let moved_{acc} = wm_{acc} > 0.0 && e_{acc} > ref_{acc} + REF_ROOM;\n        \
         let next_{acc} = select(ref_{acc}, clamp(e_{acc}, REF_LOW, REF_HIGH), moved_{acc});\n        \
         if (moved_{acc}) {{\n            atomicStore(&{flag}, 1u);\n        }}\n        \
         if (c0 == 0u) {{\n            sh_c_{acc}[r] = scale2(1.0, ref_{acc} - next_{acc});\n        }}\n        \
         ref_{acc} = next_{acc};\n",
        super::coop::row_reduce(&format!("wm_{acc}"), "max", lanes, "        "),
        flag = flag(i),
    );
}

/// After the loop: each row's factor from `acc`'s accumulators to its output, 2^ref.
pub(super) fn final_factor(b: &mut String, acc: &str) {
    let _ = writeln!(
        b,
        "    if (c0 == 0u) {{\n        sh_c_{acc}[r] = scale2(1.0, ref_{acc});\n    }}"
    );
}
