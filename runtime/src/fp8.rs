//! The host side of an fp8 KV cache: values to bytes and back as the kernels' quantizer
//! and loads do them (round to nearest even, saturate to the largest finite value, NaN to
//! 0), by the `float8` crate (CUDA's cuda_fp8.hpp conversions), an implementation
//! independent of the WGSL one it checks.

use attn_dsl::Fp8;
use float8::{F8E4M3, F8E5M2};

/// `x` as a byte of format `f`: nearest even, saturating; NaN gives 0 (a cache never
/// holds NaN), as the append kernel stores it.
pub fn to_bits(f: Fp8, x: f32) -> u8 {
    if x.is_nan() {
        return 0;
    }
    match f {
        Fp8::E4m3 => F8E4M3::from_f32(x).to_bits(),
        Fp8::E5m2 => F8E5M2::from_f32(x).to_bits(),
    }
}

/// The value of byte `b` of format `f` (exact in f32).
pub fn to_f32(f: Fp8, b: u8) -> f32 {
    match f {
        Fp8::E4m3 => F8E4M3::from_bits(b).to_f32(),
        Fp8::E5m2 => F8E5M2::from_bits(b).to_f32(),
    }
}

/// `x` rounded to format `f` and back.
pub fn round(f: Fp8, x: f32) -> f32 {
    to_f32(f, to_bits(f, x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_saturate() {
        for f in Fp8::ALL {
            // Every finite byte widens and rounds back to itself (−0 to itself too).
            for b in 0..=255u8 {
                let x = to_f32(f, b);
                if x.is_finite() {
                    assert_eq!(to_bits(f, x), b, "{f:?} byte {b:#x} = {x}");
                }
            }
            assert_eq!(round(f, 1e30), f.max());
            assert_eq!(round(f, -f32::INFINITY), -f.max());
            assert_eq!(to_bits(f, f32::NAN), 0);
        }
        // Ties go to even: 1 + 1/16 lies between 1 and 1.125 in e4m3.
        assert_eq!(round(Fp8::E4m3, 1.0625), 1.0);
        assert_eq!(round(Fp8::E4m3, 1.1875), 1.25);
        // The smallest subnormals: 2^-9 (e4m3), 2^-16 (e5m2).
        assert_eq!(to_f32(Fp8::E4m3, 1), 2f32.powi(-9));
        assert_eq!(to_f32(Fp8::E5m2, 1), 2f32.powi(-16));
    }
}
