//! Loads and stores of the data tensors in the spec's dtype: every kernel body reads Q, K
//! and V as f32 through `query_at`, `key_at` and `value_at`, and writes O through
//! `store_out4` (or `store_out`, one element), so the dtype is decided here alone.
//!
//! bf16 is the upper half of an f32's bits; two share a u32 word, element 2i in the low
//! half. Loads widen exactly (a shift); stores round to nearest even and write whole
//! words, so `store_out` (one element) does not exist for bf16: two invocations writing
//! the halves of one word would race.

use super::writer::{Fragment, Template, Wgsl, uint};

use crate::spec::{Dtype, Fp8, KernelSpec};

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
    let load = match spec.dtype {
        Dtype::F32 => &LOADS_F32,
        Dtype::F16 => &LOADS_F16,
        Dtype::Bf16 => &LOADS_BF16,
    };
    for (name, tensor) in names {
        let stem = name.strip_suffix("_at").unwrap_or(name);
        out.put(load.fill([
            ("name", Fragment::from(*name)),
            ("name4", Fragment::from(format!("{stem}4_at"))),
            ("tensor", Fragment::from(*tensor)),
        ]));
    }
}

/// [`loads`] of an f32 tensor: a vec4 is four loads.
const LOADS_F32: Template = Template {
    name: "loads_f32",
    needs: &[],
    text: r#"fn $name(i: u32) -> f32 {
    return $tensor[i];
}

fn $name4(i: u32) -> vec4<f32> {
    return vec4<f32>($tensor[i], $tensor[i + 1u], $tensor[i + 2u], $tensor[i + 3u]);
}

"#,
};

/// [`loads`] of an f16 tensor, `array<vec4<f16>>`.
const LOADS_F16: Template = Template {
    name: "loads_f16",
    needs: &[],
    text: r#"fn $name(i: u32) -> f32 {
    return f32($tensor[i >> 2u][i & 3u]);
}

fn $name4(i: u32) -> vec4<f32> {
    return vec4<f32>($tensor[i >> 2u]);
}

"#,
};

/// [`loads`] of a bf16 tensor, two elements a u32 word: each widened exactly by a shift.
const LOADS_BF16: Template = Template {
    name: "loads_bf16",
    needs: &[],
    text: r#"fn $name(i: u32) -> f32 {
    let w = $tensor[i >> 1u];
    return bitcast<f32>(select(w << 16u, w & 0xffff0000u, (i & 1u) == 1u));
}

fn $name4(i: u32) -> vec4<f32> {
    let a = $tensor[i >> 1u];
    let b = $tensor[(i >> 1u) + 1u];
    return bitcast<vec4<f32>>(vec4<u32>(a << 16u, a & 0xffff0000u, b << 16u, b & 0xffff0000u));
}

"#,
};

/// `widen4(x) -> vec4<f32>` and `narrow4(x: vec4<f32>)`: an element of an `Elem::Data4`
/// tensor (four values) to and from f32, for kernels that move data four at a time.
pub(super) fn vec4_codec(out: &mut Wgsl, dtype: Dtype) {
    let narrow = match dtype {
        Dtype::F32 => "x",
        Dtype::F16 => "vec4<f16>(x)",
        Dtype::Bf16 => {
            "vec2<u32>(bf16_bits(x.x) | (bf16_bits(x.y) << 16u), bf16_bits(x.z) | (bf16_bits(x.w) << 16u))"
        }
    };
    if dtype == Dtype::Bf16 {
        out.put(BF16_BITS.plain());
    }
    out.put(VEC4_CODEC.fill([
        ("t", Fragment::from(vec4_type(dtype))),
        ("widen", Fragment::from(widen4(dtype))),
        ("narrow", Fragment::from(narrow)),
    ]));
}

/// Four elements `x` of a `Elem::Data4` tensor in `dtype`, widened to a `vec4<f32>`
/// (exactly), as one WGSL expression.
pub(super) fn widen4(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::F32 => "x",
        Dtype::F16 => "vec4<f32>(x)",
        Dtype::Bf16 => {
            "bitcast<vec4<f32>>(vec4<u32>(x.x << 16u, x.x & 0xffff0000u, x.y << 16u, x.y & 0xffff0000u))"
        }
    }
}

/// [`vec4_codec`]'s two functions, `$t` the stored type of four elements.
const VEC4_CODEC: Template = Template {
    name: "vec4_codec",
    needs: &[],
    text: r#"fn widen4(x: $t) -> vec4<f32> {
    return $widen;
}

fn narrow4(x: vec4<f32>) -> $t {
    return $narrow;
}

"#,
};

/// The WGSL type of four elements of a `Elem::Data4` tensor as stored.
pub(super) fn vec4_type(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::F32 => "vec4<f32>",
        Dtype::F16 => "vec4<f16>",
        Dtype::Bf16 => "vec2<u32>",
    }
}

/// `bf16_bits(x) -> u32`, for a kernel that packs bf16 words itself.
pub(super) fn bf16_bits(out: &mut Wgsl) {
    out.put(BF16_BITS.plain());
}

/// An f32 rounded to bf16's bits, for the stores and `narrow4`.
const BF16_BITS: Template = Template {
    name: "bf16_bits",
    needs: &[],
    text: r#"// Round to nearest even; a NaN keeps a mantissa bit so that it stays NaN.
fn bf16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return (b >> 16u) | 0x40u;
    }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}

"#,
};

fn stores(out: &mut Wgsl, dtype: Dtype) {
    match dtype {
        Dtype::F32 => out.put(STORES_F32.plain()),
        Dtype::F16 => out.put(STORES_F16.plain()),
        Dtype::Bf16 => {
            out.put(BF16_BITS.plain());
            out.put(STORES_BF16.plain());
        }
    }
}

/// The stores into an f32 O: an element, or four.
const STORES_F32: Template = Template {
    name: "stores_f32",
    needs: &[],
    text: r#"fn store_out(i: u32, x: f32) {
    o[i] = x;
}

fn store_out4(i: u32, x: vec4<f32>) {
    o[i] = x.x;
    o[i + 1u] = x.y;
    o[i + 2u] = x.z;
    o[i + 3u] = x.w;
}

"#,
};

/// The stores into an f16 O, `array<vec4<f16>>`: an element, or a whole vec4.
const STORES_F16: Template = Template {
    name: "stores_f16",
    needs: &[],
    text: r#"fn store_out(i: u32, x: f32) {
    o[i >> 2u][i & 3u] = f16(x);
}

fn store_out4(i: u32, x: vec4<f32>) {
    o[i >> 2u] = vec4<f16>(x);
}

"#,
};

/// The store into a bf16 O: whole words only (no `store_out`: two invocations writing the
/// halves of one word would race).
const STORES_BF16: Template = Template {
    name: "stores_bf16",
    needs: &[],
    text: r#"// `i` is a multiple of 4: the vec4 fills two whole words.
fn store_out4(i: u32, x: vec4<f32>) {
    o[i >> 1u] = bf16_bits(x.x) | (bf16_bits(x.y) << 16u);
    o[(i >> 1u) + 1u] = bf16_bits(x.z) | (bf16_bits(x.w) << 16u);
}

"#,
};

/// What [`cache_codec`]'s `widen_kv4` divides the values by: the power of two between an
/// fp8 byte read as the upper bits of an f16 and its value.
fn fp8_unit(f: Fp8) -> f32 {
    match f {
        Fp8::E5m2 => 1.0,
        Fp8::E4m3 => 256.0,
    }
}

/// The statements that leave elements 0, 2 of word `w` in `even` and 1, 3 in `odd`.
fn widen_halves(f: Fp8) -> Fragment {
    match f {
        Fp8::E5m2 => WIDEN_E5M2.plain(),
        Fp8::E4m3 => WIDEN_E4M3.plain(),
    }
}

/// An e5m2 byte is the upper byte of the f16 of its value.
const WIDEN_E5M2: Template = Template {
    name: "widen_e5m2",
    needs: &[],
    text: r#"let even = unpack2x16float((w << 8u) & 0xff00ff00u);
let odd = unpack2x16float(w & 0xff00ff00u);
"#,
};

// Magnitude bits 0..6 to f16 bits 7..13, the sign bit 7 to bit 15.
const WIDEN_E4M3: Template = Template {
    name: "widen_e4m3",
    needs: &[],
    text: r#"let hi = w >> 8u;
let even = unpack2x16float(((w & 0x007f007fu) << 7u) | ((w & 0x00800080u) << 8u));
let odd = unpack2x16float(((hi & 0x007f007fu) << 7u) | ((hi & 0x00800080u) << 8u));
"#,
};

/// The function that widens four cache elements as stored to f32 (before the cache's
/// scales): the dtype's `widen4`, or [`cache_codec`]'s `widen_kv4`.
pub(super) fn cache_widen(spec: &KernelSpec) -> &'static str {
    match spec.kv_fp8 {
        Some(_) => "widen_kv4",
        None => "widen4",
    }
}

/// With an fp8 cache: `widen_kv4(w: u32) -> vec4<f32>`, four values exactly, and
/// `narrow_kv4(x: vec4<f32>) -> u32`, four values rounded to nearest even, saturated and
/// packed (NaN stored as 0). Nothing for a cache in the kernel's dtype.
pub(super) fn cache_codec(out: &mut Wgsl, spec: &KernelSpec) {
    let Some(f) = spec.kv_fp8 else {
        return;
    };
    let m = f.mantissa_bits();
    // The subnormals' quantum 2^(1 − bias − M), and the smallest normal 2^(1 − bias).
    let quantum = 2f32.powi(1 - (f.bias() + m) as i32);
    let min_normal = 2f32.powi(1 - f.bias() as i32);
    let f16_note = match f {
        Fp8::E5m2 => "e5m2 is the upper byte of an f16",
        Fp8::E4m3 => "e4m3's bias is 8 below f16's: the f16 is the value / 256",
    };
    out.put(FP8_CODEC.fill([
        ("name", Fragment::from(f.name())),
        ("m", Fragment::from(m.to_string())),
        ("bias", Fragment::from(f.bias().to_string())),
        ("max", Fragment::from(format!("{:?}", f.max()))),
        ("unit", Fragment::from(format!("{:?}", fp8_unit(f)))),
        ("shift", uint(23 - m)),
        ("rebias", uint(127 - f.bias())),
        ("quantum", Fragment::from(format!("{quantum:e}"))),
        ("min_normal", Fragment::from(format!("{min_normal:e}"))),
        ("f16_note", Fragment::from(f16_note)),
        ("widen", widen_halves(f)),
    ]));
}

/// [`cache_codec`]'s constants and functions for the fp8 format `$name`.
const FP8_CODEC: Template = Template {
    name: "fp8_codec",
    needs: &[],
    text: r#"// $name: $m mantissa bits, exponent bias $bias, largest $max.
// widen_kv4 gives the values over FP8_UNIT; the scales carry it back.
const FP8_UNIT: f32 = $unit;
const FP8_SHIFT: u32 = $shift;
const FP8_REBIAS: u32 = $rebias;
const FP8_QUANTUM: f32 = $quantum;
const FP8_MIN_NORMAL: f32 = $min_normal;
const FP8_MAX: f32 = $max;

// Four $name values of a word (element t in byte t), exactly, over FP8_UNIT: each byte
// becomes the f16 whose bits carry its sign, exponent and mantissa ($f16_note),
// and one conversion widens two f16 at once.
fn widen_kv4(w: u32) -> vec4<f32> {
    $widen
    return vec4<f32>(even.x, odd.x, even.y, odd.y);
}

// x rounded to nearest even, saturated to ±FP8_MAX; NaN (tested on the bits: a compiler
// may fold x != x away) stored as 0, so the cache never holds a NaN or an infinity.
fn fp8_bits(x: f32) -> u32 {
    let u = bitcast<u32>(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return 0u;
    }
    let a = min(abs(x), FP8_MAX);
    var bits = 0u;
    if (a < FP8_MIN_NORMAL) {
        bits = u32(round(a / FP8_QUANTUM));
    } else {
        let f = bitcast<u32>(a);
        bits = ((f + ((1u << (FP8_SHIFT - 1u)) - 1u) + ((f >> FP8_SHIFT) & 1u)) >> FP8_SHIFT) - (FP8_REBIAS << ${m}u);
    }
    return bits | ((u >> 24u) & 0x80u);
}

fn narrow_kv4(x: vec4<f32>) -> u32 {
    return fp8_bits(x.x) | (fp8_bits(x.y) << 8u) | (fp8_bits(x.z) << 16u) | (fp8_bits(x.w) << 24u);
}

"#,
};
