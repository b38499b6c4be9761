//! `attention_kernel!` with user-written modifiers, as a crate outside the runtime writes
//! them: two kernels whose scores and masks are closures, run forward and backward by the
//! runtime, and this crate's own CPU code for the same attention to compare with.

use attn_macros::attention_kernel;
use runtime::ops::backward::BackwardSpec;
use runtime::{Backward, BackwardInput, BlockOn, ForwardInput, Gpu, Heads, Kernel, Modifiers};

attention_kernel! {
    /// T5's relative-position bias (a learned table per head, clamped at ±32 positions:
    /// `grad`, so the backward returns its gradient, `drel_bias`) over a prefix-LM mask:
    /// each query sees the keys before it and its sequence's first `prefix[b]` keys. Its
    /// backward binds 10 storage buffers (the two tensors and the table's gradient beside
    /// attention's own), two past WebGPU's default: an adapter offering 10 runs it.
    pub t5_prefix_lm {
        op: forward,
        grid: s_major(flash),
        head_dim: 64,
        target: native(storage_buffers = 10),
        tensors: { rel_bias: [heads, 2 * 32 + 1] f32 grad, prefix: [batch] u32 },
        score_mod: |score, _b, h, q, k| score + rel_bias[h][clamp(q - k, -32, 32) + 32],
        mask_mod: |b, _h, q, k| k <= q || k < prefix[b] as i32,
        writes: { o: owned, lse: owned },
    }
}

attention_kernel! {
    /// Gemma 2's soft cap over StreamingLLM's mask: a causal window of 16 keys plus the
    /// first 4 keys of the stream.
    pub capped_window_sinks {
        op: forward,
        grid: s_major(flash),
        head_dim: 64,
        score_mod: |score, _b, _h, _q, _k| 20.0 * tanh(score / 20.0),
        mask_mod: |_b, _h, q, k| k <= q && (q - k < 16 || k < 4),
        writes: { o: owned, lse: owned },
    }
}

/// The same modifiers in plain Rust, for the CPU: the score and its derivative with
/// respect to the score, and the mask, each of (b, h, q, k); with a learnable table, its
/// length and the element a pair's score adds (with slope 1).
pub struct CpuModifiers<'a> {
    pub score: ScoreFn<'a>,
    pub visible: Box<dyn Fn(usize, usize, usize, usize) -> bool + 'a>,
    pub table: Option<(usize, ElementFn<'a>)>,
}

/// The modified score and its derivative with respect to the score, of (score, b, h, q, k).
pub type ScoreFn<'a> = Box<dyn Fn(f64, usize, usize, usize, usize) -> (f64, f64) + 'a>;

/// The table element a pair's score adds, of (b, h, q, k).
pub type ElementFn<'a> = Box<dyn Fn(usize, usize, usize, usize) -> usize + 'a>;

/// The T5 table and prefix lengths of `t5_prefix_lm`, as CPU modifiers.
pub fn t5_prefix_lm_cpu<'a>(rel_bias: &'a [f32], prefix: &'a [f32]) -> CpuModifiers<'a> {
    CpuModifiers {
        score: Box::new(move |s, _b, h, q, k| {
            let d = (q as i64 - k as i64).clamp(-32, 32) + 32;
            (s + f64::from(rel_bias[h * 65 + d as usize]), 1.0)
        }),
        visible: Box::new(move |b, _h, q, k| k <= q || (k as f32) < prefix[b]),
        table: Some((
            rel_bias.len(),
            Box::new(|_b, h, q, k| h * 65 + ((q as i64 - k as i64).clamp(-32, 32) + 32) as usize),
        )),
    }
}

pub fn capped_window_sinks_cpu() -> CpuModifiers<'static> {
    CpuModifiers {
        score: Box::new(|s, _, _, _, _| {
            let t = (s / 20.0).tanh();
            (20.0 * t, 1.0 - t * t)
        }),
        visible: Box::new(|_, _, q, k| k <= q && (q - k < 16 || k < 4)),
        table: None,
    }
}

/// Attention's outputs and gradients, `[batch, seq, heads, 64]` (LSE `[batch, seq, heads]`).
#[derive(Default)]
pub struct Results {
    pub o: Vec<f32>,
    pub lse: Vec<f32>,
    pub dq: Vec<f32>,
    pub dk: Vec<f32>,
    pub dv: Vec<f32>,
    /// The learnable table's gradient (`drel_bias`), where the kernel has one.
    pub dtable: Vec<f32>,
}

/// Random inputs of one problem: Q, K, V and dO.
pub struct Problem {
    pub batch: u32,
    pub seq: u32,
    pub heads: Heads,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub d_o: Vec<f32>,
}

impl Problem {
    pub fn new(batch: u32, seq: u32, n_heads: u32, n_kv_heads: u32) -> Problem {
        let heads = Heads {
            n_heads,
            n_kv_heads,
            head_dim: 64,
            head_dim_v: 64,
        };
        let rows = (batch * seq) as usize * 64;
        let q = runtime::verify::random(rows * n_heads as usize, 1);
        let k = runtime::verify::random(rows * n_kv_heads as usize, 2);
        let v = runtime::verify::random(rows * n_kv_heads as usize, 3);
        let d_o = runtime::verify::random(rows * n_heads as usize, 4);
        Problem {
            batch,
            seq,
            heads,
            q,
            k,
            v,
            d_o,
        }
    }

    /// Forward on `kernel`, then the backward (every schedule compiled with the kernel's
    /// modifiers; the planner's pick), with `tensors` for the modifiers.
    pub fn run_gpu(
        &self,
        gpu: &Gpu,
        abi: &'static attn_dsl::KernelAbi,
        tensors: &[(&str, &[f32])],
    ) -> anyhow::Result<Results> {
        let kernel = Kernel::new(gpu, abi).block_on()?;
        let mods = Modifiers::with_flex(abi.masks, tensors);
        let out = runtime::forward(
            gpu,
            &kernel,
            &ForwardInput {
                batch: self.batch,
                seq_len: self.seq,
                heads: self.heads,
                q: &self.q,
                k: &self.k,
                v: &self.v,
                seg: None,
                scale: None,
                mods,
            },
        )
        .block_on()?;
        let spec = BackwardSpec::new(64, abi.masks, runtime::Dtype::F32);
        let mut backward = Backward::new(gpu, spec)?;
        let input = BackwardInput {
            batch: self.batch,
            seq_len: self.seq,
            heads: self.heads,
            q: &self.q,
            k: &self.k,
            v: &self.v,
            o: &out.o,
            lse: &out.lse,
            d_o: &self.d_o,
            seg: None,
            scale: None,
            mods,
        };
        let (g, _) = backward
            .run(gpu, &input, None, runtime::Dtype::F32)
            .block_on()?;
        Ok(Results {
            dtable: g.flex("drel_bias").unwrap_or(&[]).to_vec(),
            o: out.o,
            lse: out.lse,
            dq: g.dq,
            dk: g.dk,
            dv: g.dv,
        })
    }

    /// The same attention on the CPU in f64: softmax(score_mod(q·k / 8)) masked, its
    /// LSE, and the gradients by the chain rule through the modifier.
    pub fn run_cpu(&self, m: &CpuModifiers) -> Results {
        let (nh, nkv) = (self.heads.n_heads as usize, self.heads.n_kv_heads as usize);
        let (batch, seq, d) = (self.batch as usize, self.seq as usize, 64);
        let mut r = Results {
            o: vec![0.0; self.q.len()],
            lse: vec![0.0; batch * seq * nh],
            dq: vec![0.0; self.q.len()],
            dk: vec![0.0; self.k.len()],
            dv: vec![0.0; self.v.len()],
            dtable: vec![0.0; m.table.as_ref().map_or(0, |t| t.0)],
        };
        let mut dtable = vec![0.0f64; r.dtable.len()];
        let at = |rows: usize, b: usize, s: usize, h: usize| ((b * seq + s) * rows + h) * d;
        for b in 0..batch {
            for h in 0..nh {
                let kh = h / (nh / nkv);
                for s in 0..seq {
                    let qi = at(nh, b, s, h);
                    let row: Vec<Option<(f64, f64)>> = (0..seq)
                        .map(|j| {
                            let ki = at(nkv, b, j, kh);
                            let dot: f64 = (0..d)
                                .map(|i| f64::from(self.q[qi + i]) * f64::from(self.k[ki + i]))
                                .sum();
                            (m.visible)(b, h, s, j).then(|| (m.score)(dot / 8.0, b, h, s, j))
                        })
                        .collect();
                    let max = row.iter().flatten().map(|x| x.0).fold(f64::MIN, f64::max);
                    let w: Vec<f64> = row
                        .iter()
                        .map(|x| x.map_or(0.0, |x| (x.0 - max).exp()))
                        .collect();
                    let sum: f64 = w.iter().sum();
                    r.lse[(b * seq + s) * nh + h] = (max + sum.ln()) as f32;
                    let p: Vec<f64> = w.iter().map(|x| x / sum).collect();
                    let dp: Vec<f64> = (0..seq)
                        .map(|j| {
                            let vi = at(nkv, b, j, kh);
                            (0..d)
                                .map(|i| f64::from(self.d_o[qi + i]) * f64::from(self.v[vi + i]))
                                .sum()
                        })
                        .collect();
                    let big_d: f64 = (0..seq).map(|j| p[j] * dp[j]).sum();
                    for j in 0..seq {
                        let (vi, slope) = (at(nkv, b, j, kh), row[j].map_or(0.0, |x| x.1));
                        // dS with respect to the modified score: the table's gradient.
                        let g = p[j] * (dp[j] - big_d);
                        if let Some((_, element)) = &m.table
                            && row[j].is_some()
                        {
                            dtable[element(b, h, s, j)] += g;
                        }
                        let ds = g * slope / 8.0;
                        for i in 0..d {
                            r.o[qi + i] += (p[j] * f64::from(self.v[vi + i])) as f32;
                            r.dv[vi + i] += (p[j] * f64::from(self.d_o[qi + i])) as f32;
                            r.dq[qi + i] += (ds * f64::from(self.k[vi + i])) as f32;
                            r.dk[vi + i] += (ds * f64::from(self.q[qi + i])) as f32;
                        }
                    }
                }
            }
        }
        r.dtable = dtable.iter().map(|&x| x as f32).collect();
        r
    }
}

/// The largest absolute difference of each output, by name.
pub fn max_errors(gpu: &Results, cpu: &Results) -> Vec<(&'static str, f32)> {
    let worst = |a: &[f32], b: &[f32]| match a.len() == b.len() {
        true => a
            .iter()
            .zip(b)
            .map(|(x, y)| match (x.is_nan(), y.is_nan()) {
                (false, false) => (x - y).abs(),
                (true, true) => 0.0,
                // f32::max would pass over a NaN on one side.
                _ => f32::INFINITY,
            })
            .fold(0.0, f32::max),
        false => f32::INFINITY,
    };
    vec![
        ("o", worst(&gpu.o, &cpu.o)),
        ("lse", worst(&gpu.lse, &cpu.lse)),
        ("dq", worst(&gpu.dq, &cpu.dq)),
        ("dk", worst(&gpu.dk, &cpu.dk)),
        ("dv", worst(&gpu.dv, &cpu.dv)),
        ("drel_bias", worst(&gpu.dtable, &cpu.dtable)),
    ]
    .into_iter()
    .filter(|(name, _)| *name != "drel_bias" || !cpu.dtable.is_empty())
    .collect()
}

/// The largest absolute difference from the CPU code an output may have.
pub const BOUND: f32 = 1e-4;

/// One line per output of a case (its error, the bound, pass or FAIL) and whether every
/// output passed.
pub fn verdict(errors: &[(&str, f32)]) -> (Vec<String>, bool) {
    let lines = errors
        .iter()
        .map(|(name, e)| {
            let pass = *e <= BOUND;
            format!(
                "  {name:<9} max abs error {e:.2e}, bound {BOUND:.0e}: {}",
                if pass { "pass" } else { "FAIL" }
            )
        })
        .collect();
    (lines, errors.iter().all(|(_, e)| *e <= BOUND))
}
