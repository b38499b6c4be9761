//! Attention states merged on the device (`ops::merge`): the parts of a key split, each
//! attention over its keys (O and LSE computed here in f64, rounded as a kernel stores
//! them), merged into attention over all the keys, against the same computed at once.

use runtime::ops::merge::{Merge, MergeArgs, MergeSpec};
use runtime::{BlockOn, Dtype, Gpu, Scalar, Tensor, kernels};

fn gpu() -> Gpu {
    Gpu::new(kernels::FAMILY.iter().copied())
        .block_on()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A problem of `rows` queries (batch 1) against `keys` keys per head, d wide, values in
/// [-1, 1) from a small generator (deterministic).
struct Problem {
    rows: usize,
    keys: usize,
    heads: usize,
    d: usize,
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    sinks: Vec<f64>,
}

impl Problem {
    fn new(rows: usize, keys: usize, heads: usize, d: usize) -> Problem {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: usize| -> Vec<f64> {
            (0..n)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((state >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
                })
                .collect()
        };
        Problem {
            rows,
            keys,
            heads,
            d,
            q: next(rows * heads * d),
            k: next(keys * heads * d),
            v: next(keys * heads * d),
            sinks: next(heads),
        }
    }

    /// O and LSE of every (row, head) over keys `range` with causal alignment to the end
    /// (row r sees keys up to `keys - rows + r`), plus the sinks when asked; an empty row
    /// has O = 0 and LSE = +inf, as the kernels store it.
    fn attend(&self, range: std::ops::Range<usize>, sinks: bool) -> (Vec<f64>, Vec<f64>) {
        let (h_n, d) = (self.heads, self.d);
        let scale = 1.0 / (d as f64).sqrt();
        let mut o = vec![0.0; self.rows * h_n * d];
        let mut lse = vec![f64::INFINITY; self.rows * h_n];
        for r in 0..self.rows {
            let last = self.keys - self.rows + r;
            for h in 0..h_n {
                let qi = (r * h_n + h) * d;
                let seen: Vec<usize> = range.clone().filter(|j| *j <= last).collect();
                let scores: Vec<f64> = seen
                    .iter()
                    .map(|j| {
                        let kj = (j * h_n + h) * d;
                        (0..d).map(|c| self.q[qi + c] * self.k[kj + c]).sum::<f64>() * scale
                    })
                    .collect();
                let sink = sinks.then(|| self.sinks[h]);
                let m = scores
                    .iter()
                    .copied()
                    .chain(sink)
                    .fold(f64::NEG_INFINITY, f64::max);
                if m == f64::NEG_INFINITY {
                    continue;
                }
                let l: f64 = scores
                    .iter()
                    .chain(sink.iter())
                    .map(|s| (s - m).exp())
                    .sum();
                for (j, s) in seen.iter().zip(&scores) {
                    let p = (s - m).exp() / l;
                    let vj = (j * h_n + h) * d;
                    for c in 0..d {
                        o[qi + c] += p * self.v[vj + c];
                    }
                }
                lse[r * h_n + h] = m + l.ln();
            }
        }
        (o, lse)
    }
}

fn upload(gpu: &Gpu, shape: &[u32], scalar: Scalar, data: &[f64]) -> Tensor {
    let x: Vec<f32> = data.iter().map(|v| *v as f32).collect();
    Tensor::from_f32(gpu, shape, scalar, &x).unwrap()
}

/// Merges the parts of `problem` split at `cuts` on the device and returns the largest
/// error of O and of LSE against attention over all keys.
fn merged_error(gpu: &Gpu, p: &Problem, cuts: &[usize], dtype: Dtype, sinks: bool) -> (f64, f64) {
    let mut bounds = vec![0];
    bounds.extend_from_slice(cuts);
    bounds.push(p.keys);
    let parts: Vec<(Vec<f64>, Vec<f64>)> = bounds
        .windows(2)
        .map(|w| p.attend(w[0]..w[1], false))
        .collect();
    let (n, h, d) = (p.rows as u32, p.heads as u32, p.d as u32);
    let k = parts.len() as u32;
    let data = Scalar::from(dtype);
    let o_parts: Vec<f64> = parts.iter().flat_map(|(o, _)| o.clone()).collect();
    let lse_parts: Vec<f64> = parts.iter().flat_map(|(_, l)| l.clone()).collect();
    let o_parts = upload(gpu, &[k, 1, n, h, d], data, &o_parts);
    let lse_parts = upload(gpu, &[k, 1, n, h], Scalar::F32, &lse_parts);
    let o = Tensor::zeros(gpu, &[1, n, h, d], data).unwrap();
    let lse = Tensor::zeros(gpu, &[1, n, h], Scalar::F32).unwrap();
    let sink_logits = upload(gpu, &[h], Scalar::F32, &p.sinks);
    let spec = MergeSpec {
        sinks,
        ..MergeSpec::new(d, dtype)
    };
    let mut merge = Merge::new(gpu, spec).unwrap();
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    let args = MergeArgs {
        o_parts: &o_parts,
        lse_parts: &lse_parts,
        o: &o,
        lse: &lse,
        sinks: sinks.then_some(&sink_logits),
    };
    merge.record(gpu, &mut enc, &args).unwrap();
    gpu.queue.submit([enc.finish()]);
    let (want_o, want_lse) = p.attend(0..p.keys, sinks);
    let got_o = o.to_f32(gpu).block_on().unwrap();
    let got_lse = lse.to_f32(gpu).block_on().unwrap();
    let worst = |got: &[f32], want: &[f64]| {
        got.iter()
            .zip(want)
            .map(|(g, w)| match w.is_finite() {
                true => (f64::from(*g) - w).abs(),
                false if f64::from(*g) == *w => 0.0,
                false => f64::INFINITY,
            })
            .fold(0.0, f64::max)
    };
    (worst(&got_o, &want_o), worst(&got_lse, &want_lse))
}

/// Every split point of a causal problem (so that early rows have parts with no key),
/// two and three parts, f32: the merge equals attention over all keys to f32 rounding.
#[test]
fn merged_parts_equal_attention_over_all_keys() {
    let gpu = gpu();
    let p = Problem::new(6, 24, 3, 16);
    for cut in 1..p.keys {
        let (o, lse) = merged_error(&gpu, &p, &[cut], Dtype::F32, false);
        assert!(
            o < 2e-6 && lse < 4e-6,
            "cut {cut}: O off by {o:e}, LSE by {lse:e}"
        );
    }
    let (o, lse) = merged_error(&gpu, &p, &[5, 19, 20], Dtype::F32, false);
    assert!(
        o < 2e-6 && lse < 4e-6,
        "four parts: O off by {o:e}, LSE by {lse:e}"
    );
}

/// Sinks join the merged denominator once: the parts are made without them, the merge
/// equals attention over all keys with them.
#[test]
fn sinks_join_the_merge_once() {
    let gpu = gpu();
    let p = Problem::new(5, 17, 2, 8);
    for cuts in [&[3][..], &[8, 12]] {
        let (o, lse) = merged_error(&gpu, &p, cuts, Dtype::F32, true);
        assert!(
            o < 2e-6 && lse < 4e-6,
            "{cuts:?}: O off by {o:e}, LSE by {lse:e}"
        );
    }
}

/// Half-precision parts: the merge reads and writes O in the dtype (its error is the
/// dtype's rounding of the inputs and of the result), LSE in f32.
#[test]
fn half_precision_parts_merge_within_their_rounding() {
    let gpu = gpu();
    let p = Problem::new(4, 20, 2, 32);
    for (dtype, bound) in [(Dtype::F16, 2e-3), (Dtype::Bf16, 1.6e-2)] {
        if !gpu.supports_dtype(dtype) {
            continue;
        }
        let (o, lse) = merged_error(&gpu, &p, &[7], dtype, false);
        assert!(
            o < bound && lse < 4e-6,
            "{dtype:?}: O off by {o:e}, LSE by {lse:e}"
        );
    }
}

/// Refusals: wrong widths, a missing or unexpected sinks tensor, mismatched shapes; nothing
/// is recorded (the encoder submits cleanly after them).
#[test]
fn a_merge_refuses_mismatched_tensors() {
    let gpu = gpu();
    assert!(Merge::new(&gpu, MergeSpec::new(6, Dtype::F32)).is_err());
    let mut merge = Merge::new(&gpu, MergeSpec::new(8, Dtype::F32)).unwrap();
    let f = Scalar::F32;
    let o_parts = Tensor::zeros(&gpu, &[2, 1, 3, 2, 8], f).unwrap();
    let lse_parts = Tensor::zeros(&gpu, &[2, 1, 3, 2], f).unwrap();
    let o = Tensor::zeros(&gpu, &[1, 3, 2, 8], f).unwrap();
    let lse = Tensor::zeros(&gpu, &[1, 3, 2], f).unwrap();
    let wide = Tensor::zeros(&gpu, &[2, 1, 3, 2, 12], f).unwrap();
    let short = Tensor::zeros(&gpu, &[1, 3, 2], f).unwrap();
    let sinks = Tensor::zeros(&gpu, &[2], f).unwrap();
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    let ok = MergeArgs {
        o_parts: &o_parts,
        lse_parts: &lse_parts,
        o: &o,
        lse: &lse,
        sinks: None,
    };
    for (what, args) in [
        (
            "wider parts",
            MergeArgs {
                o_parts: &wide,
                ..ok
            },
        ),
        (
            "lse_parts without the parts axis",
            MergeArgs {
                lse_parts: &short,
                ..ok
            },
        ),
        (
            "sinks to a merge without them",
            MergeArgs {
                sinks: Some(&sinks),
                ..ok
            },
        ),
    ] {
        let e = merge.record(&gpu, &mut enc, &args);
        assert!(e.is_err(), "{what} was accepted");
    }
    merge.record(&gpu, &mut enc, &ok).unwrap();
    gpu.queue.submit([enc.finish()]);
    gpu.device
        .poll(wgpu::PollType::wait_indefinitely())
        .unwrap();
}

/// The parts made by the forward kernels, as an engine would: each part is the causal
/// forward with a shared bias that hides the other part's keys (-1e30: they weigh e^-1e30,
/// nothing), the full forward is the same kernel with a zero bias; the merge of the parts
/// equals the full forward within the check's kind of bound (f32: 2e-6 here). Rows before
/// the cut see no key of the second part: its LSE there is about -1e30, and it weighs
/// nothing.
#[test]
fn parts_made_by_the_forward_merge_into_the_forward_over_all_keys() {
    use attn_dsl::{BiasHeads, Masks};
    use runtime::DeviceModifiers;
    use runtime::modifiers::BiasOf;
    use runtime::ops::forward::{Forward, ForwardArgs, ForwardSpec};
    let gpu = gpu();
    let (seq, h, kv, d) = (40u32, 4u32, 2u32, 64u32);
    let p = Problem::new(seq as usize, seq as usize, h as usize, d as usize);
    let q = upload(&gpu, &[1, seq, h, d], Scalar::F32, &p.q);
    // K and V of Problem have `heads` heads; the first `kv` of them are the KV heads.
    let pick = |x: &[f64]| -> Vec<f64> {
        x.chunks(d as usize)
            .enumerate()
            .filter(|(i, _)| (i % h as usize) < kv as usize)
            .flat_map(|(_, c)| c.to_vec())
            .collect()
    };
    let k = upload(&gpu, &[1, seq, kv, d], Scalar::F32, &pick(&p.k));
    let v = upload(&gpu, &[1, seq, kv, d], Scalar::F32, &pick(&p.v));
    let masks = Masks {
        bias: Some(BiasHeads::Shared),
        ..Masks::new(true, false)
    };
    let mut forward = Forward::new(&gpu, ForwardSpec::new(d, masks, Dtype::F32)).unwrap();
    let n = seq as usize;
    let bias = |keep: &dyn Fn(usize) -> bool| -> Tensor {
        let values: Vec<f64> = (0..n * n)
            .map(|i| if keep(i % n) { 0.0 } else { -1e30 })
            .collect();
        upload(&gpu, &[1, 1, seq, seq], Scalar::F32, &values)
    };
    for cut in [1usize, 13, 39] {
        let biases = [bias(&|j| j < cut), bias(&|j| j >= cut), bias(&|_| true)];
        let o_parts = Tensor::zeros(&gpu, &[2, 1, seq, h, d], Scalar::F32).unwrap();
        let lse_parts = Tensor::zeros(&gpu, &[2, 1, seq, h], Scalar::F32).unwrap();
        let full_o = Tensor::zeros(&gpu, &[1, seq, h, d], Scalar::F32).unwrap();
        let full_lse = Tensor::zeros(&gpu, &[1, seq, h], Scalar::F32).unwrap();
        // Each part's forward writes its own O and LSE, copied into the stacked tensors
        // (a part's LSE is not at a binding offset WebGPU allows, 256 bytes).
        let part = || {
            let o = Tensor::zeros(&gpu, &[1, seq, h, d], Scalar::F32).unwrap();
            let lse = Tensor::zeros(&gpu, &[1, seq, h], Scalar::F32).unwrap();
            (o, lse)
        };
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        let outs = [part(), part(), (full_o.clone(), full_lse.clone())];
        for (b, (o, lse)) in biases.iter().zip(&outs) {
            let mods = DeviceModifiers {
                bias: Some(BiasOf {
                    values: b,
                    heads: BiasHeads::Shared,
                }),
                ..Default::default()
            };
            let args = ForwardArgs {
                mods,
                ..ForwardArgs::new(&q, &k, &v, o, lse)
            };
            forward.record(&gpu, &mut enc, &args).unwrap();
        }
        for (i, (o, lse)) in outs[..2].iter().enumerate() {
            let i = i as u64;
            enc.copy_buffer_to_buffer(o.buffer(), 0, o_parts.buffer(), i * o.bytes(), o.bytes());
            let at = i * lse.bytes();
            enc.copy_buffer_to_buffer(lse.buffer(), 0, lse_parts.buffer(), at, lse.bytes());
        }
        let merged_o = Tensor::zeros(&gpu, &[1, seq, h, d], Scalar::F32).unwrap();
        let merged_lse = Tensor::zeros(&gpu, &[1, seq, h], Scalar::F32).unwrap();
        let mut merge = Merge::new(&gpu, MergeSpec::new(d, Dtype::F32)).unwrap();
        let args = MergeArgs {
            o_parts: &o_parts,
            lse_parts: &lse_parts,
            o: &merged_o,
            lse: &merged_lse,
            sinks: None,
        };
        merge.record(&gpu, &mut enc, &args).unwrap();
        gpu.queue.submit([enc.finish()]);
        let read = |t: &Tensor| t.to_f32(&gpu).block_on().unwrap();
        let worst = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max)
        };
        let (o_err, lse_err) = (
            worst(&read(&merged_o), &read(&full_o)),
            worst(&read(&merged_lse), &read(&full_lse)),
        );
        assert!(
            o_err < 2e-6 && lse_err < 4e-6,
            "cut {cut}: O {o_err:e}, LSE {lse_err:e}"
        );
    }
}
