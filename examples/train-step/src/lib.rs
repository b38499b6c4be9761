//! A training step on device tensors, as a framework runs one: RoPE on Q and K, the
//! attention forward, its backward, and RoPE's backward on dQ and dK, all recorded into
//! one encoder and submitted once; the host reads back one scalar at the end. Steps run
//! back to back and are timed on the GPU.
//!
//! The host reference runs the same step in f64 (Q, K, V and dO rounded to the dtype as
//! the device rounds them) and the gradients must agree.

use runtime::BlockOn;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use attn_dsl::{Dtype, Masks, Scalar};
use rand::{Rng, SeedableRng, rngs::StdRng};
use runtime::dispatch::Recorder;
use runtime::ops::backward::{BackwardArgs, BackwardSpec};
use runtime::ops::convert::{Convert, ConvertArgs};
use runtime::ops::forward::{Forward, ForwardArgs, ForwardSpec};
use runtime::ops::rope::{Rope, RopeArgs, RopeSpec};
use runtime::verify::reference::{self, Problem};
use runtime::{Backward, Gpu, Heads, Schedule, Tensor, kernels};

#[derive(Clone, Debug)]
pub struct Config {
    pub batch: u32,
    pub seq: u32,
    pub heads: Heads,
    pub dtype: Dtype,
    pub causal: bool,
    pub steps: u32,
    /// A backward schedule by name; `None`: the planner's.
    pub schedule: Option<Schedule>,
    pub check: bool,
    pub seed: u64,
}

#[derive(Clone, Debug)]
pub struct Report {
    pub adapter: String,
    pub schedule: Schedule,
    /// The scalar read back: dQ's last element.
    pub scalar: f32,
    /// Wall time to a ready device and ops (nothing compiled yet).
    pub setup: Duration,
    /// Wall time of the first step, waited for: its kernels compile here (or come from the
    /// pipeline caches).
    pub first_step: Duration,
    /// Wall time of the other steps, from the first record until the GPU has run the last.
    pub wall: Duration,
    /// Wall time of reading the scalar back once the steps have run: a cost of the run,
    /// not of a step.
    pub readback: Duration,
    /// GPU time of each step, where the adapter has timestamps.
    pub step_gpu_ms: Option<Vec<f64>>,
    /// CPU time of the later steps' recording (every op's `record`) and of their
    /// `Queue::submit`, median ms: where a step's wall time goes beside its GPU time.
    pub record_ms: f64,
    pub submit_ms: f64,
    /// Largest difference of dQ, dK, dV from the reference, as a fraction of each one's
    /// largest value, and the tolerance.
    pub check: Option<(f64, f64)>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.check.is_none_or(|(e, t)| e <= t)
    }
}

fn scalar(dtype: Dtype) -> Scalar {
    match dtype {
        Dtype::F32 => Scalar::F32,
        Dtype::F16 => Scalar::F16,
        Dtype::Bf16 => Scalar::Bf16,
    }
}

/// The flags' values, checked before the device starts: each refusal names the flag to
/// change.
pub fn check(c: &Config) -> Result<()> {
    let h = c.heads;
    if c.steps == 0 || c.batch == 0 || c.seq == 0 {
        bail!("--steps, --batch and --seq must be at least 1");
    }
    if h.n_heads == 0 || h.n_kv_heads == 0 || !h.n_heads.is_multiple_of(h.n_kv_heads) {
        bail!(
            "--heads {} over --kv-heads {}: give at least one KV head, a divisor of --heads",
            h.n_heads,
            h.n_kv_heads
        );
    }
    if h.head_dim == 0 || h.head_dim > 256 || !h.head_dim.is_multiple_of(4) {
        bail!(
            "--head-dim {}: give a multiple of 4 from 4 to 256 (the kernels read rows as \
             vec4)",
            h.head_dim
        );
    }
    Ok(())
}

/// Q (the largest tensor) fits in one binding of `gpu`, checked before the host draws it.
fn check_fits(gpu: &Gpu, c: &Config) -> Result<()> {
    let h = c.heads;
    let bytes = [c.batch, c.seq, h.n_heads, h.head_dim, 4]
        .iter()
        .fold(1u64, |n, d| n.saturating_mul(u64::from(*d)));
    let limit = gpu.limits().max_storage_buffer_binding_size;
    if bytes > limit {
        bail!(
            "Q (--batch × --seq × --heads × --head-dim) would be {bytes} bytes, over {}'s \
             {limit} for one tensor; lower them",
            gpu.describe()
        );
    }
    Ok(())
}

pub fn run(c: &Config) -> Result<Report> {
    let h = c.heads;
    check(c)?;
    let setup = Instant::now();
    let gpu = Gpu::new(kernels::FAMILY.iter().copied())
        .block_on()
        .context("no adapter")?;
    check_fits(&gpu, c)?;
    if c.dtype == Dtype::F16 && !gpu.has_f16() {
        bail!(
            "{} has no shader-f16; use --dtype bf16 or f32",
            gpu.describe()
        );
    }
    let (b, s) = (c.batch, c.seq);
    let q_shape = [b, s, h.n_heads, h.head_dim];
    let kv_shape = [b, s, h.n_kv_heads, h.head_dim];
    let n = |shape: &[u32]| shape.iter().map(|d| *d as usize).product::<usize>();
    let mut rng = StdRng::seed_from_u64(c.seed);
    let mut draw =
        |len: usize| -> Vec<f32> { (0..len).map(|_| rng.random_range(-2.0..2.0)).collect() };
    let (q, k, v, d_o) = (
        draw(n(&q_shape)),
        draw(n(&kv_shape)),
        draw(n(&kv_shape)),
        draw(n(&q_shape)),
    );
    let f = Scalar::F32;
    let data = scalar(c.dtype);
    let up = |shape: &[u32], x: &[f32]| Tensor::from_f32(&gpu, shape, f, x);
    // The step's inputs, as a framework holds them: f32, before RoPE.
    let (q0, k0, v0, do0) = (
        up(&q_shape, &q)?,
        up(&kv_shape, &k)?,
        up(&kv_shape, &v)?,
        up(&q_shape, &d_o)?,
    );
    let rotated = [
        Tensor::zeros(&gpu, &q_shape, f)?,
        Tensor::zeros(&gpu, &kv_shape, f)?,
    ];
    let staged = |shape: &[u32]| Tensor::zeros(&gpu, shape, data);
    let [qd, kd, vd, dod, od] = [
        staged(&q_shape)?,
        staged(&kv_shape)?,
        staged(&kv_shape)?,
        staged(&q_shape)?,
        staged(&q_shape)?,
    ];
    let lse = Tensor::zeros(&gpu, &[b, s, h.n_heads], f)?;
    let (dq, dk, dv) = (
        Tensor::zeros(&gpu, &q_shape, f)?,
        Tensor::zeros(&gpu, &kv_shape, f)?,
        Tensor::zeros(&gpu, &kv_shape, f)?,
    );
    let positions = Tensor::from_u32(&gpu, &[b], &vec![0; b as usize])?;
    let masks = Masks::new(c.causal, false);
    let mut forward = Forward::new(
        &gpu,
        ForwardSpec {
            head_dim: h.head_dim,
            head_dim_v: h.head_dim,
            masks,
            dtype: c.dtype,
        },
    )?;
    let mut backward = Backward::new(&gpu, BackwardSpec::new(h.head_dim, masks, c.dtype))?;
    let mut rope = Rope::new(&gpu, RopeSpec::new(h.head_dim))?;
    let mut rope_back = Rope::new(&gpu, RopeSpec::backward(h.head_dim))?;
    let mut convert = (c.dtype != Dtype::F32)
        .then(|| Convert::new(&gpu, c.dtype))
        .transpose()?;
    let stamps = runtime::timing::Spans::new(&gpu, c.steps);
    let setup = setup.elapsed();
    let mut start = Instant::now();
    let mut first_step = Duration::ZERO;
    let mut ran = None;
    let (mut records, mut submits) = (Vec::new(), Vec::new());
    for step in 0..c.steps {
        if step == 1 {
            gpu.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| anyhow::anyhow!("waiting for the GPU: {e}"))?;
            first_step = start.elapsed();
            start = Instant::now();
        }
        let recording = Instant::now();
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        if let Some(spans) = &stamps {
            spans.mark(&mut enc, step, false);
        }
        // The step in one compute pass (each pass costs the CPU its own validation and
        // encoding), the copies first: a copy ends the recorder's pass. RoPE rotates copies
        // in place, so that every step starts from the same inputs; in f32 the copies are
        // the staged inputs themselves.
        let mut rec = Recorder::new(&mut enc);
        let [rq, rk] = match convert {
            None => [&qd, &kd],
            Some(_) => [&rotated[0], &rotated[1]],
        };
        let mut copies = vec![(&q0, rq), (&k0, rk)];
        if convert.is_none() {
            copies.extend([(&v0, &vd), (&do0, &dod)]);
        }
        for (from, to) in copies {
            rec.encoder()
                .copy_buffer_to_buffer(from.buffer(), 0, to.buffer(), 0, from.bytes());
        }
        for x in [rq, rk] {
            rope.record(
                &gpu,
                &mut rec,
                &RopeArgs {
                    x,
                    positions: &positions,
                    base: 10000.0,
                },
            )?;
        }
        if let Some(convert) = convert.as_mut() {
            for (src, dst) in [(rq, &qd), (rk, &kd), (&v0, &vd), (&do0, &dod)] {
                convert.record(&gpu, &mut rec, &ConvertArgs { src, dst })?;
            }
        }
        let fargs = ForwardArgs::new(&qd, &kd, &vd, &od, &lse);
        forward.record(&gpu, &mut rec, &fargs)?;
        let bargs = BackwardArgs {
            q: &qd,
            k: &kd,
            v: &vd,
            o: &od,
            lse: &lse,
            d_o: &dod,
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
        ran = Some(backward.record(&gpu, &mut rec, &bargs, c.schedule)?);
        for x in [&dq, &dk] {
            rope_back.record(
                &gpu,
                &mut rec,
                &RopeArgs {
                    x,
                    positions: &positions,
                    base: 10000.0,
                },
            )?;
        }
        drop(rec);
        if let Some(spans) = &stamps {
            spans.mark(&mut enc, step, true);
        }
        let commands = enc.finish();
        let submitting = Instant::now();
        gpu.queue.submit([commands]);
        if step > 0 {
            records.push((submitting - recording).as_secs_f64() * 1e3);
            submits.push(submitting.elapsed().as_secs_f64() * 1e3);
        }
    }
    gpu.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| anyhow::anyhow!("waiting for the GPU: {e}"))?;
    let wall = start.elapsed();
    if c.steps == 1 {
        first_step = wall;
    }
    let reading = Instant::now();
    let at = dq.offset() + dq.bytes() - 4;
    let word = runtime::block_on(runtime::tensor::buffers::read_range(
        &gpu,
        dq.buffer(),
        at,
        4,
    ))?;
    let scalar = f32::from_le_bytes([word[0], word[1], word[2], word[3]]);
    let readback = reading.elapsed();
    let step_gpu_ms = match &stamps {
        Some(spans) => Some(spans.read_ms(&gpu)?),
        None => None,
    };
    let check = match c.check {
        true => {
            let got = [&dq, &dk, &dv].map(|t| runtime::block_on(t.to_f32(&gpu)));
            let got = [got[0].as_ref(), got[1].as_ref(), got[2].as_ref()];
            let got: Vec<&Vec<f32>> = got
                .into_iter()
                .collect::<Result<_, _>>()
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let want = host_reference(c, [&q, &k, &v, &d_o]);
            let err = got
                .iter()
                .zip(&want)
                .map(|(g, w)| relative(g, w))
                .fold(0.0, f64::max);
            let tol = match c.dtype {
                Dtype::F32 => 1e-4,
                Dtype::F16 => 5e-3,
                Dtype::Bf16 => 3e-2,
            };
            Some((err, tol))
        }
        false => None,
    };
    Ok(Report {
        adapter: gpu.describe(),
        schedule: ran.expect("at least one step"),
        scalar,
        setup,
        first_step,
        wall,
        readback,
        step_gpu_ms,
        record_ms: median(records),
        submit_ms: median(submits),
        check,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn relative(got: &[f32], want: &[f64]) -> f64 {
    let scale = want.iter().fold(1e-30f64, |m, x| m.max(x.abs()));
    got.iter()
        .zip(want)
        .map(|(g, w)| (f64::from(*g) - w).abs())
        .fold(0.0, f64::max)
        / scale
}

fn round(x: &[f64], dtype: Dtype) -> Vec<f64> {
    x.iter()
        .map(|v| match dtype {
            Dtype::F32 => f64::from(*v as f32),
            Dtype::F16 => f64::from(half::f16::from_f64(*v).to_f32()),
            Dtype::Bf16 => f64::from(half::bf16::from_f64(*v).to_f32()),
        })
        .collect()
}

/// dQ, dK and dV of the step in f64: RoPE, the exact attention backward, RoPE's backward.
fn host_reference(c: &Config, [q, k, v, d_o]: [&[f32]; 4]) -> [Vec<f64>; 3] {
    let h = c.heads;
    let (nh, nkv, d) = (
        h.n_heads as usize,
        h.n_kv_heads as usize,
        h.head_dim as usize,
    );
    let s = c.seq as usize;
    let inv: Vec<f64> = runtime::ops::rope::inv_freq(10000.0, h.head_dim)
        .iter()
        .map(|x| f64::from(*x))
        .collect();
    let rot = |x: &[f64], heads: usize, sign: f64| reference::rope(x, s, heads, d, 0, &inv, sign);
    let c64 = reference::cast::<f64>;
    let qr = round(&rot(&c64(q), nh, 1.0), c.dtype);
    let kr = round(&rot(&c64(k), nkv, 1.0), c.dtype);
    let (vr, dor) = (round(&c64(v), c.dtype), round(&c64(d_o), c.dtype));
    let problem = Problem {
        batch: c.batch as usize,
        n_q: s,
        n_k: s,
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: d,
        scale: f64::from(h.default_scale()),
        causal: c.causal,
        ..Problem::default()
    };
    let g = reference::attention_backward(&problem, [&qr, &kr, &vr, &dor], None);
    [rot(&g.dq, nh, -1.0), rot(&g.dk, nkv, -1.0), g.dv]
}
