//! Rotary position embedding, in place on `x: [b, s, h, d]` in the spec's dtype: element
//! pairs (i, i + d/2) of row `s` of sequence `b` are rotated by `(positions[b] + s) ·
//! inv_freq[i]`, `inv_freq[i] = base^(-2i/d)`, in f32, each result rounded once into the
//! dtype. The backward is the same rotation by minus the angle (the rotation is
//! orthonormal, so Rᵀ = R(-θ)).

use super::writer::{Fragment, Template, Wgsl};

use crate::spec::{Dtype, KernelSpec};

pub(super) fn rope(out: &mut Wgsl, spec: &KernelSpec) {
    let sign = match spec.op == crate::spec::Op::RopeBackward {
        true => "-1.0",
        false => "1.0",
    };
    // bf16 halves share a u32 word: an invocation rotates two adjacent pairs, so that it
    // writes whole words.
    let (access, turns) = match spec.dtype {
        Dtype::F32 => (&ACCESS_F32, ONE_TURN),
        Dtype::F16 => (&ACCESS_F16, ONE_TURN),
        Dtype::Bf16 => {
            super::dtype::bf16_bits(out);
            (&ACCESS_BF16, TWO_TURNS)
        }
    };
    let group = match spec.dtype {
        Dtype::Bf16 => "2u",
        _ => "1u",
    };
    out.put(access.plain());
    out.put(ROPE.fill([
        ("sign", Fragment::from(sign)),
        ("group", Fragment::from(group)),
        ("turns", Fragment::from(turns)),
    ]));
}

/// An invocation's one pair: its (cos, sin).
const ONE_TURN: &str = "let t = turn(pos, i);\nlet c = t.x;\nlet s = t.y;";

/// An invocation's two adjacent pairs: their (cos, sin) side by side.
const TWO_TURNS: &str = "let t0 = turn(pos, i);\nlet t1 = turn(pos, i + 1u);\n\
                         let c = vec2<f32>(t0.x, t1.x);\nlet s = vec2<f32>(t0.y, t1.y);";

/// x as f32, one element at a time.
const ACCESS_F32: Template = Template {
    name: "rope_access_f32",
    needs: &[],
    text: r#"fn ld_x(i: u32) -> f32 {
    return x[i];
}

fn st_x(i: u32, v: f32) {
    x[i] = v;
}

"#,
};

/// x in f16 (`array<vec4<f16>>`), one element at a time: WGSL's memory locations are
/// scalars, so invocations writing different halves of one vec4 do not race.
const ACCESS_F16: Template = Template {
    name: "rope_access_f16",
    needs: &[],
    text: r#"fn ld_x(i: u32) -> f32 {
    return f32(x[i >> 2u][i & 3u]);
}

fn st_x(i: u32, v: f32) {
    x[i >> 2u][i & 3u] = f16(v);
}

"#,
};

/// x in bf16 (`array<u32>`, element 2k in word k's low half), elements i and i + 1 (i
/// even) at a time, rounded to nearest even.
const ACCESS_BF16: Template = Template {
    name: "rope_access_bf16",
    needs: &[],
    text: r#"fn ld_x(i: u32) -> vec2<f32> {
    let w = x[i >> 1u];
    return vec2<f32>(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xffff0000u));
}

fn st_x(i: u32, v: vec2<f32>) {
    x[i >> 1u] = bf16_bits(v.x) | (bf16_bits(v.y) << 16u);
}

"#,
};

/// The rotation of one row, `$sign` 1.0 forward and -1.0 for the backward, `$group`
/// adjacent pairs an invocation (`$turns` their cos and sin). The angle is reduced to
/// [-π, π] before sin and cos, and (c, s) put back on the unit circle, so that the backward
/// undoes the forward to f32 rounding at any position.
const ROPE: Template = Template {
    name: "rope",
    needs: &[],
    text: r#"// +1 rotates forward; -1 applies the transpose (the backward).
const SIGN: f32 = $sign;
const HALF: u32 = HEAD_DIM / 2u;
// Adjacent pairs an invocation rotates.
const GROUP: u32 = $group;
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

// (cos, sin) of pair i's angle at `pos`. GPU sin and cos may be approximations with
// c² + s² a few 1e-7 off 1, which backward(forward(x)) would not cancel: put (c, s) back
// on the unit circle.
fn turn(pos: f32, i: u32) -> vec2<f32> {
    let angle = reduce_angle(SIGN * pos * inv_freq[i]);
    let norm = inverseSqrt(fma(cos(angle), cos(angle), sin(angle) * sin(angle)));
    return vec2<f32>(cos(angle) * norm, sin(angle) * norm);
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
    for (var g = tid; g < HALF / GROUP; g = g + WG) {
        let i = g * GROUP;
        $turns
        let x0 = ld_x(base + i);
        let x1 = ld_x(base + i + HALF);
        st_x(base + i, x0 * c - x1 * s);
        st_x(base + i + HALF, x0 * s + x1 * c);
    }
}

"#,
};
