//! Long rows' LSE to the ulp. Its magnitude grows with the row (ln of the keys seen), and
//! the pass rule's floor of 1e-6 is one ulp from 8 to 16, so the rule leaves about two ulp
//! there: a forward that lets its row sum drift over thousands of blocks spends them (an
//! f16 forward at 128k rows on an H200 was at 2.56x the bound before the row sum kept its
//! rounding error). On lavapipe, 256 rows of a 16k-row f32 forward are within 1.02 ulp
//! (2026-11-30; rounding m + ln l twice, 1.16).

use attn_dsl::{Dtype, Masks, Scalar};
use runtime::ops::forward::{Forward, ForwardArgs, ForwardSpec};
use runtime::verify::random;
use runtime::{BlockOn, Gpu, Tensor, kernels};

/// The f64 LSE of query row `row` (causal: keys 0..=row), one head of width `d`.
fn lse(q: &[f32], k: &[f32], row: usize, d: usize, scale: f64) -> f64 {
    let s: Vec<f64> = (0..=row)
        .map(|j| {
            let dot: f64 = (0..d)
                .map(|c| f64::from(q[row * d + c]) * f64::from(k[j * d + c]))
                .sum();
            dot * scale
        })
        .collect();
    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    m + s.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

#[test]
fn long_causal_rows_have_their_lse_within_an_ulp() {
    let gpu = Gpu::new(kernels::FAMILY.iter().copied())
        .block_on()
        .unwrap_or_else(|e| panic!("{e}"));
    let (seq, d) = (16384usize, 32usize);
    let (q, k, v) = (
        random(seq * d, 11),
        random(seq * d, 12),
        random(seq * d, 13),
    );
    let f = Scalar::F32;
    let shape = [1, seq as u32, 1, d as u32];
    let up = |x: &[f32]| Tensor::from_f32(&gpu, &shape, f, x).unwrap();
    let (qt, kt, vt) = (up(&q), up(&k), up(&v));
    let o = Tensor::zeros(&gpu, &shape, f).unwrap();
    let lse_t = Tensor::zeros(&gpu, &shape[..3], f).unwrap();
    let spec = ForwardSpec::new(d as u32, Masks::new(true, false), Dtype::F32);
    let mut forward = Forward::new(&gpu, spec).unwrap();
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    let args = ForwardArgs::new(&qt, &kt, &vt, &o, &lse_t);
    forward.record(&gpu, &mut enc, &args).unwrap();
    gpu.queue.submit([enc.finish()]);
    let got = lse_t.to_f32(&gpu).block_on().unwrap();
    let scale = f64::from(1.0 / (d as f32).sqrt());
    // Rows spread over the second half, each seeing 8k-16k keys.
    let (worst, at) = (0..256)
        .map(|i| seq / 2 + i * (seq / 2 - 1) / 255)
        .map(|row| {
            let want = lse(&q, &k, row, d, scale);
            let ulp = f64::from((want as f32).abs().next_up() - (want as f32).abs());
            ((f64::from(got[row]) - want).abs() / ulp, row)
        })
        .fold((0.0, 0), |a, b| if b.0 > a.0 { b } else { a });
    assert!(
        worst <= 1.5,
        "row {at}: LSE {worst:.2} ulp off on {}",
        gpu.describe()
    );
}
