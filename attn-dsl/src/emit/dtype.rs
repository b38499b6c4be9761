//! Loads and stores of the data tensors in the spec's dtype: every kernel body reads Q, K
//! and V as f32 through `query_at`, `key_at` and `value_at`, and writes O through
//! `store_out4` (or `store_out`, one element), so the dtype is decided here alone.
//!
//! bf16 is the upper half of an f32's bits; two share a u32 word, element 2i in the low
//! half. Loads widen exactly (a shift); stores round to nearest even and write whole
//! words, so `store_out` (one element) does not exist for bf16: two invocations writing
//! the halves of one word would race.

use super::writer::Wgsl;
use std::fmt::Write;

use crate::spec::{Dtype, KernelSpec};

/// The `enable` directive the dtype needs, before any declaration.
/// (bf16 travels as u32 words: WGSL has no type to enable for it; but a tensor-core
/// kernel multiplies f16 operands whatever its data.)
pub(super) fn directive(out: &mut Wgsl, spec: &KernelSpec) {
    if spec.uses_f16() {
        out.push_str("enable f16;\n\n");
    }
}

/// [`loads`] and the stores into `o`.
pub(super) fn accessors(out: &mut Wgsl, spec: &KernelSpec, names: &[(&str, &str)]) {
    loads(out, spec, names);
    stores(out, spec.dtype);
}

/// `{name}_at(i) -> f32` and `{stem}4_at(i) -> vec4<f32>` (elements i..i+4, `i` a
/// multiple of 4) for each (accessor, tensor). f16 tensors are
/// `array<vec4<f16>>` (a vec4 in one 8-byte load; WGSL's memory locations are scalars, so
/// invocations writing different halves of one vec4 do not race); bf16 vec4s are two
/// word loads.
pub(super) fn loads(out: &mut Wgsl, spec: &KernelSpec, names: &[(&str, &str)]) {
    for (name, tensor) in names {
        let (one, four) = match spec.dtype {
            Dtype::F32 => (
                format!("return {tensor}[i];"),
                format!(
                    "return vec4<f32>({tensor}[i], {tensor}[i + 1u], {tensor}[i + 2u], \
                     {tensor}[i + 3u]);"
                ),
            ),
            Dtype::F16 => (
                format!("return f32({tensor}[i >> 2u][i & 3u]);"),
                format!("return vec4<f32>({tensor}[i >> 2u]);"),
            ),
            Dtype::Bf16 => (
                format!(
                    "let w = {tensor}[i >> 1u];\n    \
                     return bitcast<f32>(select(w << 16u, w & 0xffff0000u, (i & 1u) == 1u));"
                ),
                format!(
                    "let a = {tensor}[i >> 1u];\n    let b = {tensor}[(i >> 1u) + 1u];\n    \
                     return bitcast<vec4<f32>>(vec4<u32>(a << 16u, a & 0xffff0000u, b << 16u, \
                     b & 0xffff0000u));"
                ),
            ),
        };
        let stem = name.strip_suffix("_at").unwrap_or(name);
        let _ = write!(
            out,
            "fn {name}(i: u32) -> f32 {{\n    {one}\n}}\n\n\
             fn {stem}4_at(i: u32) -> vec4<f32> {{\n    {four}\n}}\n\n"
        );
    }
}

/// `widen4(x) -> vec4<f32>` and `narrow4(x: vec4<f32>)`: an element of an `Elem::Data4`
/// tensor (four values) to and from f32, for kernels that move data four at a time.
pub(super) fn vec4_codec(out: &mut Wgsl, dtype: Dtype) {
    let t = vec4_type(dtype);
    let (widen, narrow) = match dtype {
        Dtype::F32 => ("x", "x"),
        Dtype::F16 => ("vec4<f32>(x)", "vec4<f16>(x)"),
        Dtype::Bf16 => (
            "bitcast<vec4<f32>>(vec4<u32>(x.x << 16u, x.x & 0xffff0000u, x.y << 16u, x.y & 0xffff0000u))",
            "vec2<u32>(bf16_bits(x.x) | (bf16_bits(x.y) << 16u), bf16_bits(x.z) | (bf16_bits(x.w) << 16u))",
        ),
    };
    if dtype == Dtype::Bf16 {
        out.push_str(BF16_BITS);
    }
    let _ = write!(
        out,
        "fn widen4(x: {t}) -> vec4<f32> {{\n    return {widen};\n}}\n\n\
         fn narrow4(x: vec4<f32>) -> {t} {{\n    return {narrow};\n}}\n\n"
    );
}

/// The WGSL type of four elements of a `Elem::Data4` tensor as stored.
pub(super) fn vec4_type(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::F32 => "vec4<f32>",
        Dtype::F16 => "vec4<f16>",
        Dtype::Bf16 => "vec2<u32>",
    }
}

const BF16_BITS: &str = r#"// Round to nearest even; a NaN keeps a mantissa bit so that it stays NaN.
fn bf16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return (b >> 16u) | 0x40u;
    }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}

"#;

fn stores(out: &mut Wgsl, dtype: Dtype) {
    match dtype {
        Dtype::F32 => out.push_str(
            "fn store_out(i: u32, x: f32) {\n    o[i] = x;\n}\n\n\
             fn store_out4(i: u32, x: vec4<f32>) {\n    o[i] = x.x;\n    o[i + 1u] = x.y;\n    \
             o[i + 2u] = x.z;\n    o[i + 3u] = x.w;\n}\n\n",
        ),
        Dtype::F16 => out.push_str(
            "fn store_out(i: u32, x: f32) {\n    o[i >> 2u][i & 3u] = f16(x);\n}\n\n\
             fn store_out4(i: u32, x: vec4<f32>) {\n    o[i >> 2u] = vec4<f16>(x);\n}\n\n",
        ),
        Dtype::Bf16 => {
            out.push_str(BF16_BITS);
            out.push_str(
                r#"// `i` is a multiple of 4: the vec4 fills two whole words.
fn store_out4(i: u32, x: vec4<f32>) {
    o[i >> 1u] = bf16_bits(x.x) | (bf16_bits(x.y) << 16u);
    o[(i >> 1u) + 1u] = bf16_bits(x.z) | (bf16_bits(x.w) << 16u);
}

"#,
            );
        }
    }
}
