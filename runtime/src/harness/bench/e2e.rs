//! End-to-end rows through the recording API, as an engine runs the kernels: wall time per
//! step (record, submit, and the GPU's work) against the GPU time of the same commands.
//!
//! - decode: each step records RoPE on the new query and key rows (positions from the
//!   cache's lengths), the cache append and split-K decode into one encoder; steps are
//!   submitted back to back (what a loop that samples on the GPU does) and, separately,
//!   waited for one by one (a loop that reads every token back).
//! - prefill: the prompt's forward and its append into the cache.
//! - training step: the forward and the backward in one encoder, waited for.
//! - projections: a decode step's Q, K, V and O Linears at a few rows, waited for.

use std::time::Instant;

use attn_dsl::{Dtype, Fp8, Masks, Scalar};

use crate::device::Gpu;
use crate::dispatch::Recorder;
use crate::error::Error;
use crate::ops::backward::BackwardArgs;
use crate::ops::backward::BackwardSpec;
use crate::ops::cache::{CacheLayout, CacheSpec, KvCache};
use crate::ops::decode::{Decode, DecodeArgs, DecodeSpec, QueryRows};
use crate::ops::forward::{Forward, ForwardArgs, ForwardSpec};
use crate::ops::rope::{Rope, RopeArgs, RopeSpec};
use crate::shape::Heads;
use crate::tensor::Tensor;
use crate::timing::Spans;

/// One end-to-end row.
#[derive(Clone, Debug)]
pub struct Row {
    pub what: String,
    /// Wall ms per step, steps submitted back to back.
    pub wall_ms: f64,
    /// Wall ms per step, each waited for.
    pub waited_ms: Option<f64>,
    /// GPU ms per step (median of the steps' timestamp spans).
    pub gpu_ms: f64,
    /// CPU ms per step: recording, finishing the encoder and submitting it, the wait
    /// excluded (the mean over steps submitted back to back, else the median). Where it is
    /// close to `wall_ms`, the CPU sets the pace.
    pub cpu_ms: f64,
    /// Steps submitted back to back: the GPU's ms from one step's last command to the next
    /// step's first (the mean, so a submission's gap is shared by its steps), which
    /// `wall_ms` pays beside `gpu_ms` where the CPU keeps up.
    pub gap_ms: Option<f64>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn wait(gpu: &Gpu) -> Result<(), Error> {
    gpu.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map(|_| ())
        .map_err(|e| Error::Readback(e.to_string()))
}

/// Random values in [-1, 1) for a tensor of `shape` in `dtype`.
pub(crate) fn random(gpu: &Gpu, shape: &[u32], dtype: Dtype, seed: u64) -> Result<Tensor, Error> {
    random_in(gpu, shape, Scalar::from(dtype), seed)
}

/// [`random`] stored as `scalar` (an fp8 cache's bytes too).
pub(crate) fn random_in(
    gpu: &Gpu,
    shape: &[u32],
    scalar: Scalar,
    seed: u64,
) -> Result<Tensor, Error> {
    let n = shape.iter().map(|d| *d as usize).product();
    let data: Vec<f32> = crate::verify::random(n, seed)
        .iter()
        .map(|x| x / 2.0)
        .collect();
    Tensor::from_f32(gpu, shape, scalar, &data)
}

/// A one-sequence contiguous cache of `capacity` rows, filled to `len` rows of random K (V
/// the same rows) a block at a time, the fill submitted.
fn filled_cache(
    gpu: &Gpu,
    h: Heads,
    (dtype, kv_fp8): (Dtype, Option<Fp8>),
    [len, capacity]: [u32; 2],
) -> Result<KvCache, Error> {
    let spec = CacheSpec {
        slots: 1,
        n_kv_heads: h.n_kv_heads,
        head_dim: h.head_dim,
        head_dim_v: h.head_dim_v,
        dtype,
        layout: CacheLayout::Contiguous { capacity },
        kv_fp8,
    };
    let mut cache = KvCache::new(gpu, spec)?;
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    cache.open(&mut enc, 0)?;
    let block = 1024.min(len);
    let rows = random(gpu, &[1, block, h.n_kv_heads, h.head_dim], dtype, 1)?;
    let mut filled = 0;
    while filled < len {
        let n = block.min(len - filled);
        let r = rows.view(&[1, n, h.n_kv_heads, h.head_dim])?;
        cache.append(gpu, &mut enc, 0, &r, &r)?;
        filled += n;
    }
    gpu.queue.submit([enc.finish()]);
    Ok(cache)
}

/// Decode steps against a cache filled to `cache_len` rows (one sequence), `per_submit` of
/// them recorded into one encoder: `steps` back to back, then `steps` with each submission
/// waited for.
pub fn decode(
    gpu: &Gpu,
    h: Heads,
    cache_len: u32,
    dtype: Dtype,
    steps: u32,
    per_submit: u32,
) -> Result<Row, Error> {
    let mut cache = filled_cache(gpu, h, (dtype, None), [cache_len, cache_len + 3 * steps])?;
    let mut decode = Decode::new(gpu, DecodeSpec::new(h.head_dim, h.head_dim_v, dtype))?;
    let mut rope = Rope::new(gpu, RopeSpec::new(h.head_dim))?;
    // The step rotates f32 copies of Q and K it does not feed on (the cost of the
    // dispatch is what is measured; the rows were f32 when the step's figures were taken).
    let q32 = random(gpu, &[1, 1, h.n_heads, h.head_dim], Dtype::F32, 2)?;
    let k32 = random(gpu, &[1, 1, h.n_kv_heads, h.head_dim], Dtype::F32, 3)?;
    let q = random(gpu, &[1, h.n_heads, h.head_dim], dtype, 4)?;
    let kv = random(gpu, &[1, 1, h.n_kv_heads, h.head_dim], dtype, 5)?;
    let o = Tensor::zeros(gpu, &[1, h.n_heads, h.head_dim], Scalar::from(dtype))?;
    let spans = Spans::new(gpu, steps).ok_or(crate::error::InputError::Unsupported {
        what: "GPU timing",
        needs: "an adapter with TIMESTAMP_QUERY",
    })?;
    let mut step = |enc: &mut wgpu::CommandEncoder, spans: Option<&Spans>, t: u32| {
        if let Some(s) = spans {
            s.mark(enc, t, false);
        }
        // The step in one compute pass, as an engine records it.
        let mut rec = Recorder::new(enc);
        for x in [&q32, &k32] {
            let args = RopeArgs {
                x,
                positions: cache.lengths(),
                base: 10000.0,
            };
            rope.record(gpu, &mut rec, &args)?;
        }
        cache.append(gpu, &mut rec, 0, &kv, &kv)?;
        let args = DecodeArgs {
            rows: Default::default(),
            q: &q,
            cache: cache.view(),
            o: &o,
            scale: None,
            mods: Default::default(),
            slice_len: None,
        };
        decode.record(gpu, &mut rec, &args)?;
        drop(rec);
        if let Some(s) = spans {
            s.mark(enc, t, true);
        }
        Ok::<(), Error>(())
    };
    // `n` steps, `per_submit` to an encoder, each submission waited for with `waits`.
    let mut run = |n: u32, spans: Option<&Spans>, waits: bool| -> Result<f64, Error> {
        let start = Instant::now();
        for first in (0..n).step_by(per_submit as usize) {
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            for t in first..(first + per_submit).min(n) {
                step(&mut enc, spans, t)?;
            }
            gpu.queue.submit([enc.finish()]);
            if waits {
                wait(gpu)?;
            }
        }
        Ok(start.elapsed().as_secs_f64() * 1e3 / f64::from(n))
    };
    // Warm up: pipelines, bind groups, the GPU's clocks.
    run(steps.min(20), None, false)?;
    wait(gpu)?;
    let start = Instant::now();
    let cpu_ms = run(steps, Some(&spans), false)?;
    wait(gpu)?;
    let wall_ms = start.elapsed().as_secs_f64() * 1e3 / f64::from(steps);
    let (times, gaps) = spans.read(gpu)?;
    let gpu_ms = median(times);
    let waited_ms = run(steps, None, true)?;
    Ok(Row {
        what: format!(
            "decode step, cache {cache_len}, {}/{}/{} {}{}",
            h.n_heads,
            h.n_kv_heads,
            h.head_dim,
            dtype.name(),
            match per_submit {
                1 => String::new(),
                n => format!(", {n} a submission"),
            }
        ),
        wall_ms,
        waited_ms: Some(waited_ms),
        gpu_ms,
        cpu_ms,
        gap_ms: Some(gaps.iter().sum::<f64>() / gaps.len().max(1) as f64),
    })
}

/// Recorded steps, each waited for: wall, GPU and CPU time (medians).
pub(crate) fn waited(
    gpu: &Gpu,
    runs: u32,
    mut record: impl FnMut(&mut wgpu::CommandEncoder) -> Result<(), Error>,
) -> Result<(f64, f64, f64), Error> {
    let spans = Spans::new(gpu, runs).ok_or(crate::error::InputError::Unsupported {
        what: "GPU timing",
        needs: "an adapter with TIMESTAMP_QUERY",
    })?;
    for warm in 0..2 {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        record(&mut enc)?;
        gpu.queue.submit([enc.finish()]);
        wait(gpu)?;
        let _ = warm;
    }
    let (mut walls, mut cpu) = (Vec::new(), Vec::new());
    for t in 0..runs {
        let start = Instant::now();
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        spans.mark(&mut enc, t, false);
        record(&mut enc)?;
        spans.mark(&mut enc, t, true);
        gpu.queue.submit([enc.finish()]);
        cpu.push(start.elapsed().as_secs_f64() * 1e3);
        wait(gpu)?;
        walls.push(start.elapsed().as_secs_f64() * 1e3);
    }
    Ok((median(walls), median(spans.read_ms(gpu)?), median(cpu)))
}

/// How a continued cache's rows run in [`continued`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Continue {
    /// As the decode plans them.
    Planned,
    /// On the split-K passes, however many rows.
    SplitK,
    /// Keys cut into slices of this many (a chunk's; `u32::MAX`: one slice).
    Slices(u32),
    /// As planned, the rows given as a ragged batch (of one sequence: each sequence's
    /// rows read from its start, as an engine's batch of mixed lengths is).
    Ragged,
}

/// `n` new rows of one sequence attended over its cache of `cache_len` rows (the new rows
/// the last n of them, causal among themselves; the cache in `dtype`, or in `kv_fp8`'s
/// bytes with Q and O in `dtype`): what continuing a cache costs beside its
/// append, run as `how` says. Returns the GPU ms (median of `runs`, timed as every
/// kernel row is: after a spin-up, so that the upload of the next row's cache leaves no
/// idle GPU behind) and the slicing's label.
pub fn continued(
    gpu: &Gpu,
    h: Heads,
    (cache_len, n): (u32, u32),
    (dtype, kv_fp8): (Dtype, Option<Fp8>),
    (runs, how): (u32, Continue),
) -> Result<(f64, String), Error> {
    let cache = filled_cache(gpu, h, (dtype, kv_fp8), [cache_len, cache_len])?;
    let spec = DecodeSpec {
        kv_fp8,
        ..DecodeSpec::new(h.head_dim, h.head_dim_v, dtype)
    };
    let mut decode = Decode::new(gpu, spec)?;
    if how == Continue::SplitK {
        decode = decode.without_chunks();
    }
    let slice_len = match how {
        Continue::Slices(len) => Some(len),
        _ => None,
    };
    // A ragged batch's Q and O are [rows, heads, width]; a uniform one's [1, n, ..].
    let lead: &[u32] = if how == Continue::Ragged { &[] } else { &[1] };
    let shape = |width: u32| [lead, &[n, h.n_heads, width]].concat();
    let q = random(gpu, &shape(h.head_dim), dtype, 4)?;
    let o = Tensor::zeros(gpu, &shape(h.head_dim_v), Scalar::from(dtype))?;
    let starts = [0, n];
    let (t, s) = crate::timing::time_recorded(gpu, 2, runs as usize, |enc| {
        let args = DecodeArgs {
            q: &q,
            rows: match how {
                Continue::Ragged => QueryRows::Ragged(&starts),
                _ => QueryRows::Each(n),
            },
            cache: cache.view(),
            o: &o,
            scale: None,
            mods: Default::default(),
            slice_len,
        };
        decode.record(gpu, enc, &args)
    })?;
    let gpu_ms = t.median_ms;
    Ok((gpu_ms, format!("{}x{}", s.n_slices, s.slice_len)))
}

/// An engine's four attention projections of one decode step at `rows` rows (Q and O
/// `hidden` -> `hidden`, K and V `hidden` -> `kv`), W held in `weights`, recorded into one
/// encoder and waited for: what the few-rows Linear costs a step beside its GPU time.
/// `fused`: Q, K and V as one Linear cut into three parts, as an engine runs them.
pub fn projections(
    gpu: &Gpu,
    rows: u32,
    [hidden, kv]: [u32; 2],
    (weights, fused): (Dtype, bool),
    runs: u32,
) -> Result<Row, Error> {
    use crate::ops::linear::{Linear, LinearArgs, LinearSpec};
    let x = random(gpu, &[rows, hidden], Dtype::F32, 1)?;
    let mut layers = Vec::new();
    let specs = match fused {
        false => [hidden, kv, kv, hidden]
            .map(|out| LinearSpec::new(hidden, out, weights))
            .to_vec(),
        true => vec![
            LinearSpec {
                parts: [hidden, kv, kv],
                ..LinearSpec::new(hidden, hidden + 2 * kv, weights)
            },
            LinearSpec::new(hidden, hidden, weights),
        ],
    };
    for (i, spec) in specs.into_iter().enumerate() {
        let out = spec.out;
        let w = random(gpu, &[out, hidden], weights, 2 + i as u64)?;
        let y = Tensor::zeros(gpu, &[rows, out], Scalar::F32)?;
        layers.push((Linear::new(gpu, spec)?, w, y));
    }
    let (wall_ms, gpu_ms, cpu_ms) = waited(gpu, runs, |enc| {
        for (op, w, y) in layers.iter_mut() {
            let args = LinearArgs {
                x: &x,
                w,
                b: None,
                y,
            };
            op.record(gpu, enc, &args)?;
        }
        Ok(())
    })?;
    Ok(Row {
        what: format!(
            "projections {}, {rows} row{}, {hidden} -> {hidden}/{kv}, {} W",
            if fused { "QKV O" } else { "Q K V O" },
            if rows == 1 { "" } else { "s" },
            weights.name()
        ),
        wall_ms,
        waited_ms: None,
        gpu_ms,
        cpu_ms,
        gap_ms: None,
    })
}

/// The prompt's forward (causal) and its append into a fresh cache, waited for.
pub fn prefill(gpu: &Gpu, h: Heads, seq: u32, dtype: Dtype, runs: u32) -> Result<Row, Error> {
    let q = random(gpu, &[1, seq, h.n_heads, h.head_dim], dtype, 1)?;
    let k = random(gpu, &[1, seq, h.n_kv_heads, h.head_dim], dtype, 2)?;
    let o = Tensor::zeros(gpu, q.shape(), Scalar::from(dtype))?;
    let lse = Tensor::zeros(gpu, &[1, seq, h.n_heads], Scalar::F32)?;
    let spec = ForwardSpec {
        head_dim: h.head_dim,
        head_dim_v: h.head_dim,
        masks: Masks::new(true, false),
        dtype,
    };
    let mut forward = Forward::new(gpu, spec)?;
    let cache_spec = CacheSpec {
        slots: 1,
        n_kv_heads: h.n_kv_heads,
        head_dim: h.head_dim,
        head_dim_v: h.head_dim_v,
        dtype,
        layout: CacheLayout::Contiguous { capacity: seq },
        kv_fp8: None,
    };
    let mut cache = KvCache::new(gpu, cache_spec)?;
    let (wall_ms, gpu_ms, cpu_ms) = waited(gpu, runs, |enc| {
        // Each run starts the sequence over.
        if cache.len(0).is_some() {
            cache.free(enc, 0)?;
        }
        cache.open(enc, 0)?;
        let args = ForwardArgs::new(&q, &k, &k, &o, &lse);
        cache.prefill(gpu, enc, &mut forward, 0, &args)
    })?;
    Ok(Row {
        what: format!(
            "prefill {seq} rows, {}/{}/{} {}",
            h.n_heads,
            h.n_kv_heads,
            h.head_dim,
            dtype.name()
        ),
        wall_ms,
        waited_ms: None,
        gpu_ms,
        cpu_ms,
        gap_ms: None,
    })
}

/// A training step's forward and backward (causal) in one encoder, waited for.
pub fn train_step(gpu: &Gpu, h: Heads, seq: u32, dtype: Dtype, runs: u32) -> Result<Row, Error> {
    let q_shape = [1, seq, h.n_heads, h.head_dim];
    let kv_shape = [1, seq, h.n_kv_heads, h.head_dim];
    let q = random(gpu, &q_shape, dtype, 1)?;
    let k = random(gpu, &kv_shape, dtype, 2)?;
    let d_o = random(gpu, &q_shape, dtype, 3)?;
    let o = Tensor::zeros(gpu, &q_shape, Scalar::from(dtype))?;
    let f = Scalar::F32;
    let lse = Tensor::zeros(gpu, &[1, seq, h.n_heads], f)?;
    let (dq, dk, dv) = (
        Tensor::zeros(gpu, &q_shape, f)?,
        Tensor::zeros(gpu, &kv_shape, f)?,
        Tensor::zeros(gpu, &kv_shape, f)?,
    );
    let masks = Masks::new(true, false);
    let mut forward = Forward::new(
        gpu,
        ForwardSpec {
            head_dim: h.head_dim,
            head_dim_v: h.head_dim,
            masks,
            dtype,
        },
    )?;
    let spec = BackwardSpec::new(h.head_dim, masks, dtype);
    let mut backward = crate::ops::backward::Backward::new(gpu, spec)?;
    let mut schedule = None;
    let (wall_ms, gpu_ms, cpu_ms) = waited(gpu, runs, |enc| {
        let mut rec = Recorder::new(enc);
        let fargs = ForwardArgs::new(&q, &k, &k, &o, &lse);
        forward.record(gpu, &mut rec, &fargs)?;
        let bargs = BackwardArgs {
            q: &q,
            k: &k,
            v: &k,
            o: &o,
            lse: &lse,
            d_o: &d_o,
            dq: &dq,
            dk: &dk,
            dv: &dv,
            dbias: None,
            dsinks: None,
            flex_grads: &[],
            seg: None,
            scale: None,
            mods: Default::default(),
            accumulate: false,
        };
        schedule = Some(backward.record(gpu, &mut rec, &bargs, None)?);
        Ok(())
    })?;
    Ok(Row {
        what: format!(
            "forward + backward {seq}, {}/{}/{} {} ({})",
            h.n_heads,
            h.n_kv_heads,
            h.head_dim,
            dtype.name(),
            schedule.map_or(String::new(), |s| s.to_string())
        ),
        wall_ms,
        waited_ms: None,
        gpu_ms,
        cpu_ms,
        gap_ms: None,
    })
}
