//! Rotary position embedding, in place on `x: [b, s, h, d]`: element pairs (i, i + d/2) of
//! row `s` of sequence `b` are rotated by `(positions[b] + s) · inv_freq[i]`, `inv_freq[i] = base^(-2i/d)`. The backward is the same
//! rotation by minus the angle (the rotation is orthonormal, so Rᵀ = R(-θ)).

use super::writer::{Fragment, Template, Wgsl};

pub(super) fn rope(out: &mut Wgsl, backward: bool) {
    let sign = if backward { "-1.0" } else { "1.0" };
    out.put(ROPE.fill([("sign", Fragment::from(sign))]));
}

/// The rotation of one row, `$sign` 1.0 forward and -1.0 for the backward. The angle is
/// reduced to [-π, π] before sin and cos, and (c, s) put back on the unit circle, so that
/// the backward undoes the forward to f32 rounding at any position.
const ROPE: Template = Template {
    name: "rope",
    needs: &[],
    text: r#"// +1 rotates forward; -1 applies the transpose (the backward).
const SIGN: f32 = $sign;
const HALF: u32 = HEAD_DIM / 2u;
// 2π split so that k · TWO_PI_HI is exact for k < 2^16 (TWO_PI_HI = 201/32 has 8 bits).
const TWO_PI_HI: f32 = 6.28125;
const TWO_PI_LO: f32 = 0.0019353071795864769;
const INV_TWO_PI: f32 = 0.15915494309189535;

// GPU sin and cos are only accurate near zero, and angles reach the sequence length:
// reduce to [-π, π] first (Cody-Waite, with fma keeping the products exact).
fn reduce_angle(a: f32) -> f32 {
    let k = round(a * INV_TWO_PI);
    return fma(-k, TWO_PI_LO, fma(-k, TWO_PI_HI, a));
}

// Head h of row `row`: of the first tensor's n_heads - n_kv_heads heads, else of the
// second's n_kv_heads, whose rows start second_at head rows after the first's (K after Q
// in one buffer).
fn rope_row(row: u32, h: u32, tid: u32) {
    let first = dims.n_heads - dims.n_kv_heads;
    let token = batch * dims.seq_len + row;
    var base = (token * first + h) * HEAD_DIM;
    if (h >= first) {
        base = (dims.second_at + token * dims.n_kv_heads + h - first) * HEAD_DIM;
    }
    let pos = f32(row + positions[batch]);
    for (var i = tid; i < HALF; i = i + WG) {
        let angle = reduce_angle(SIGN * pos * inv_freq[i]);
        // GPU sin and cos may be approximations with c² + s² a few 1e-7 off 1, which
        // backward(forward(x)) would not cancel: put (c, s) back on the unit circle.
        let norm = inverseSqrt(fma(cos(angle), cos(angle), sin(angle) * sin(angle)));
        let c = cos(angle) * norm;
        let s = sin(angle) * norm;
        let x0 = x[base + i];
        let x1 = x[base + i + HALF];
        x[base + i] = x0 * c - x1 * s;
        x[base + i + HALF] = x0 * s + x1 * c;
    }
}

"#,
};
