//! Token-by-token decode on the device, as an engine runs it: a random-weight attention
//! layer (one LayerNorm and one Linear projecting to Q, K and V together, written in the
//! cache's dtype; RoPE on them in place; attention against a KV cache on the device; a
//! Linear from the attention's output, as written, back to the model width in f32)
//! prefills a prompt, then each step feeds its output back as the next token's input, so
//! no step waits on the host.
//! Every op records into one encoder per step; the cache's lengths and RoPE's positions
//! live on the device, so a step records the same commands every time.
//!
//! The host reference runs the same layer in f64 (the device's roundings to the cache's
//! dtype included) and the final outputs must agree.

use runtime::BlockOn;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use attn_dsl::{Cache, Dtype, Masks, Scalar};
use rand::{Rng, SeedableRng, rngs::StdRng};
use runtime::dispatch::{Record, Recorder};
use runtime::ops::cache::{CacheLayout, CacheSpec, KvCache};
use runtime::ops::decode::{Decode, DecodeArgs, DecodeSpec};
use runtime::ops::forward::{Forward, ForwardArgs, ForwardSpec};
use runtime::ops::layernorm::{LayerNorm, NormArgs};
use runtime::ops::linear::{Linear, LinearArgs, LinearSpec};
use runtime::ops::rope::{Rope, RopeArgs, RopeSpec};
use runtime::verify::layernorm::reference as ln_ref;
use runtime::verify::reference::{self, Problem};
use runtime::{Gpu, Heads, Tensor};

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Sequences decoded together (the cache's slots).
    pub slots: u32,
    pub prompt: u32,
    pub tokens: u32,
    /// Rows each sequence's cache holds.
    pub capacity: u32,
    pub heads: Heads,
    pub dtype: Dtype,
    /// The dtype the projections' weights are held in (f16 and bf16: half the bytes a
    /// step reads).
    pub weights: Dtype,
    /// Pages of this many rows; `None`: contiguous.
    pub page_size: Option<u32>,
    /// Wait for every submission (latency); otherwise submissions go back to back.
    pub sync: bool,
    /// Steps recorded into one encoder and submitted together (each step's input is the
    /// previous step's output, on the device): a submission costs the GPU a gap of its own
    /// between two steps, which this many steps then share.
    pub steps_per_submit: u32,
    /// Compare with the f64 host reference.
    pub check: bool,
    /// Time each op of a step on its own (timestamps between them), where the adapter has
    /// timestamps.
    pub profile: bool,
    pub seed: u64,
}

/// The ops of a decode step, in recording order, as `Report::op_gpu_ms` names them.
pub const STEP_OPS: [&str; 5] = [
    "Q, K and V projection (one LayerNorm, one Linear)",
    "RoPE on Q and K",
    "append to the cache",
    "decode (split pass + reduce)",
    "O projection",
];

/// A decode step's CPU time, phase by phase.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepCpu {
    pub record: Duration,
    pub finish: Duration,
    pub submit: Duration,
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct Report {
    pub adapter: String,
    /// Wall time of the prefill (record, submit and wait).
    pub prefill: Duration,
    /// Wall time of each decode step: record, and for the last of a submission the submit
    /// and with `sync` the wait.
    pub step_wall: Vec<Duration>,
    /// Wall time of all decode steps, from the first record to the last result.
    pub decode_wall: Duration,
    /// Each step's CPU time on the host's side of the queue: recording its commands and,
    /// for the last step of a submission, finishing the encoder (where wgpu validates and
    /// encodes the commands for the driver) and submitting it.
    pub step_cpu: Vec<StepCpu>,
    /// GPU time of each step's commands (timestamp queries), where the adapter has them.
    pub step_gpu_ms: Option<Vec<f64>>,
    /// The GPU's time from each step's last command to the next step's first: with steps
    /// back to back, what a submission costs the GPU beside the step's own work.
    pub step_gap_ms: Option<Vec<f64>>,
    /// Largest difference from the host reference, and the tolerance it is held to.
    pub check: Option<(f64, f64)>,
    /// Pipelines compiled for the whole run.
    pub pipelines: u64,
    /// With `profile`: each op's GPU time ([`STEP_OPS`]), median ms over the steps after
    /// the first.
    pub op_gpu_ms: Option<Vec<f64>>,
}

impl Report {
    /// Tokens per second after the first step, which compiles the decode's pipelines on
    /// first use (over every step where there is only one).
    pub fn tokens_per_second(&self, c: &Config) -> f64 {
        let (steps, wall) = self.steady();
        f64::from(c.slots) * steps as f64 / wall.as_secs_f64()
    }

    /// The steps after the first and their wall time (all steps where there is only one).
    pub fn steady(&self) -> (usize, Duration) {
        match self.step_wall.first() {
            Some(first) if self.step_wall.len() > 1 => (
                self.step_wall.len() - 1,
                self.decode_wall.saturating_sub(*first),
            ),
            _ => (self.step_wall.len(), self.decode_wall),
        }
    }

    pub fn passed(&self) -> bool {
        self.check.is_none_or(|(err, tol)| err <= tol)
    }
}

/// A Linear's random weights, on the host (W rounded to its dtype, as held) and on the
/// device: W and b.
struct Weights {
    w: Vec<f32>,
    b: Vec<f32>,
    device: [Tensor; 2],
    hidden: u32,
}

/// A LayerNorm's random γ and β, on the host and on the device.
struct NormParams {
    gamma: Vec<f32>,
    beta: Vec<f32>,
    device: [Tensor; 2],
}

const EPS: f32 = 1e-5;

/// `n` values drawn uniformly from [lo, hi).
fn draw(rng: &mut StdRng, n: u32, [lo, hi]: [f32; 2]) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

fn upload(gpu: &Gpu, shape: &[u32], data: &[f32]) -> Result<Tensor> {
    Ok(Tensor::from_f32(gpu, shape, Scalar::F32, data)?)
}

impl Weights {
    fn new(gpu: &Gpu, rng: &mut StdRng, [hidden, out]: [u32; 2], dtype: Dtype) -> Result<Weights> {
        let scale = 1.0 / (hidden as f32).sqrt();
        // The weights as held: rounded to their dtype, which the reference reads too.
        let w: Vec<f32> = draw(rng, out * hidden, [-scale, scale])
            .into_iter()
            .map(|x| round(&[f64::from(x)], dtype)[0] as f32)
            .collect();
        let b = draw(rng, out, [-0.1, 0.1]);
        let device = [
            Tensor::from_f32(gpu, &[out, hidden], scalar(dtype), &w)?,
            upload(gpu, &[out], &b)?,
        ];
        Ok(Weights {
            w,
            b,
            device,
            hidden,
        })
    }

    /// `W·x + b` of x's rows on the host (x exact in f32: rows as the device holds them).
    fn reference(&self, x: &[f64]) -> Vec<f64> {
        let x: Vec<f32> = x.iter().map(|v| *v as f32).collect();
        reference::linear(&x, &self.w, Some(&self.b), self.hidden as usize)
    }
}

impl NormParams {
    fn new(gpu: &Gpu, rng: &mut StdRng, hidden: u32) -> Result<NormParams> {
        let gamma = draw(rng, hidden, [0.8, 1.2]);
        let beta = draw(rng, hidden, [-0.1, 0.1]);
        let device = [
            upload(gpu, &[hidden], &gamma)?,
            upload(gpu, &[hidden], &beta)?,
        ];
        Ok(NormParams {
            gamma,
            beta,
            device,
        })
    }
}

/// The output projection: a Linear from the attention's output as the decode wrote it (in
/// the cache's dtype) back to the model width, in f32.
struct Projection {
    params: Weights,
    op: Linear,
}

impl Projection {
    fn new(
        gpu: &Gpu,
        rng: &mut StdRng,
        [hidden, out]: [u32; 2],
        [weights, x]: [Dtype; 2],
    ) -> Result<Projection> {
        let params = Weights::new(gpu, rng, [hidden, out], weights)?;
        let spec = LinearSpec {
            bias: true,
            x,
            ..LinearSpec::new(hidden, out, weights)
        };
        let op = Linear::new(gpu, spec)?;
        Ok(Projection { params, op })
    }

    /// Records `y = W·x + b`.
    fn record(&mut self, gpu: &Gpu, enc: &mut impl Record, x: &Tensor, y: &Tensor) -> Result<()> {
        let [w, b] = &self.params.device;
        let args = LinearArgs {
            x,
            w,
            b: Some(b),
            y,
        };
        Ok(self.op.record(gpu, enc, &args)?)
    }

    fn reference(&self, x: &[f64]) -> Vec<f64> {
        self.params.reference(x)
    }
}

/// Q, K and V projected together: one LayerNorm, then one Linear over W's Q, K and V rows
/// stacked, its output cut into Q, K and V parts (each a tensor of its own) and written in
/// the cache's dtype, so that a decode step reads all three weights in one dispatch and
/// hands its parts to RoPE and the cache as they are.
struct Qkv {
    norm: LayerNorm,
    linear: Linear,
    /// W `[q + 2·kv, hidden]` and b, and the LayerNorm's γ and β.
    params: Weights,
    norm_params: NormParams,
    /// The normalized rows of the widest call.
    xn: Tensor,
}

impl Qkv {
    fn new(
        gpu: &Gpu,
        rng: &mut StdRng,
        [hidden, q, kv, rows]: [u32; 4],
        [weights, y]: [Dtype; 2],
    ) -> Result<Qkv> {
        let out = q + 2 * kv;
        let spec = LinearSpec {
            bias: true,
            parts: [q, kv, kv],
            y,
            ..LinearSpec::new(hidden, out, weights)
        };
        Ok(Qkv {
            norm: LayerNorm::new(gpu, hidden)?,
            linear: Linear::new(gpu, spec)?,
            params: Weights::new(gpu, rng, [hidden, out], weights)?,
            norm_params: NormParams::new(gpu, rng, hidden)?,
            xn: Tensor::zeros(gpu, &[rows, hidden], Scalar::F32)?,
        })
    }

    /// Records y = [Q | K | V] of x's rows, each part `[rows, its width]` in turn in y.
    fn record(&mut self, gpu: &Gpu, enc: &mut impl Record, x: &Tensor, y: &Tensor) -> Result<()> {
        let ([gamma, beta], [w, b]) = (&self.norm_params.device, &self.params.device);
        let xn = self.xn.view(x.shape())?;
        let norm = NormArgs {
            x,
            gamma,
            beta,
            y: &xn,
            eps: EPS,
        };
        self.norm.record(gpu, enc, &norm, None)?;
        let args = LinearArgs {
            x: &xn,
            w,
            b: Some(b),
            y,
        };
        Ok(self.linear.record(gpu, enc, &args)?)
    }

    /// Each part of `y` (the Linear's output), its first `rows` rows: y holds
    /// [`Qkv::rows_for`] rows, so that each part starts where the device can bind it.
    fn parts(&self, y: &Tensor, rows: u32) -> Result<Vec<Tensor>> {
        let parts = self.linear.parts(y)?;
        let first = |p: &Tensor| p.view(&[rows, p.shape()[1]]);
        Ok(parts.iter().map(first).collect::<Result<_, _>>()?)
    }

    /// The rows y holds for a call of `rows` rows.
    fn rows_for(&self, gpu: &Gpu, rows: u32) -> u32 {
        self.linear.part_rows(gpu, rows, self.linear.spec().y)
    }

    /// `W·LN(x) + b` of x's rows on the host, row by row.
    fn ln_reference(&self, x: &[f64]) -> Vec<f64> {
        let (w, n) = (&self.params, &self.norm_params);
        let hidden = w.hidden as usize;
        let shape = ln_ref::Shape {
            rows: x.len() / hidden,
            hidden,
            out: w.b.len(),
            eps: f64::from(EPS),
        };
        let c = reference::cast::<f64>;
        let (gamma, beta, wt, b) = (c(&n.gamma), c(&n.beta), c(&w.w), c(&w.b));
        ln_ref::forward(shape, [x, &gamma, &beta, &wt, &b], ln_ref::exact).y
    }

    /// Q, K and V of x's rows on the host.
    fn reference(&self, x: &[f64]) -> [Vec<f64>; 3] {
        let [q, kv, _] = self.linear.spec().parts.map(|w| w as usize);
        let y = self.ln_reference(x);
        let row = q + 2 * kv;
        let part = |from: usize, width: usize| -> Vec<f64> {
            y.chunks(row)
                .flat_map(|r| r[from..from + width].to_vec())
                .collect()
        };
        [part(0, q), part(q, kv), part(q + kv, kv)]
    }
}

/// The layer: projections and RoPE around the attention.
struct Layer {
    qkv: Qkv,
    o: Projection,
    rope: Rope,
}

/// Rounds to the dtype the device stores, to nearest even (as the device's bf16 stores do;
/// WGSL leaves an f32's conversion to f16 to the implementation, which rounds to nearest
/// on the adapters measured).
fn round(x: &[f64], dtype: Dtype) -> Vec<f64> {
    x.iter()
        .map(|v| match dtype {
            Dtype::F32 => f64::from(*v as f32),
            Dtype::F16 => f64::from(half::f16::from_f64(*v).to_f32()),
            Dtype::Bf16 => f64::from(half::bf16::from_f64(*v).to_f32()),
        })
        .collect()
}

fn scalar(dtype: Dtype) -> Scalar {
    match dtype {
        Dtype::F32 => Scalar::F32,
        Dtype::F16 => Scalar::F16,
        Dtype::Bf16 => Scalar::Bf16,
    }
}

impl Layer {
    /// Records RoPE on the Q and K parts of `qkv` (the Q, K and V Linear's output, in the
    /// cache's dtype), each sequence's rows from its cache length on, in one dispatch (K's
    /// part follows Q's).
    fn rotate(
        &mut self,
        gpu: &Gpu,
        enc: &mut impl Record,
        qkv: &Tensor,
        cache: &KvCache,
        [b, seq]: [u32; 2],
        h: Heads,
    ) -> Result<()> {
        let parts = self.qkv.parts(qkv, b * seq)?;
        let args = RopeArgs {
            x: &parts[0].reshape(&[b, seq, h.n_heads, h.head_dim])?,
            positions: cache.lengths(),
            base: 10000.0,
        };
        let k = parts[1].reshape(&[b, seq, h.n_kv_heads, h.head_dim])?;
        Ok(self.rope.record_pair(gpu, enc, &args, &k)?)
    }

    /// Q, K and V `[b, seq, heads, head_dim]`: the parts of `qkv`.
    fn heads(&self, qkv: &Tensor, [b, seq]: [u32; 2], h: Heads) -> Result<[Tensor; 3]> {
        let parts = self.qkv.parts(qkv, b * seq)?;
        let shaped = |p: &Tensor, heads: u32| p.reshape(&[b, seq, heads, h.head_dim]);
        Ok([
            shaped(&parts[0], h.n_heads)?,
            shaped(&parts[1], h.n_kv_heads)?,
            shaped(&parts[2], h.n_kv_heads)?,
        ])
    }
}

/// The flags' values, checked before the device starts: each refusal names the flag to
/// change.
pub fn check(c: &Config) -> Result<()> {
    let h = c.heads;
    if c.prompt == 0 || c.tokens == 0 || c.slots == 0 || c.steps_per_submit == 0 {
        bail!("--prompt, --tokens, --slots and --steps-per-submit must be at least 1");
    }
    if c.page_size == Some(0) {
        bail!("--page-size must be at least 1 row (or leave it out for a contiguous cache)");
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
    if let Some(p) = c.page_size.filter(|p| *p > c.capacity) {
        bail!(
            "--page-size {p} is over --capacity {}: give pages of at most that",
            c.capacity
        );
    }
    let rows = u64::from(c.prompt) + u64::from(c.tokens);
    if rows > u64::from(c.capacity) {
        bail!(
            "the prompt ({}) and the tokens ({}) need {rows} rows; raise --capacity (now {})",
            c.prompt,
            c.tokens,
            c.capacity
        );
    }
    let hidden = u64::from(h.n_heads) * u64::from(h.head_dim);
    let cache = u64::from(c.slots) * u64::from(c.capacity) * hidden;
    for (elements, what) in [
        (
            hidden.saturating_mul(hidden),
            "a projection's weights (--heads × --head-dim, squared)",
        ),
        (
            cache,
            "the cache (--slots × --capacity × --heads × --head-dim)",
        ),
    ] {
        if elements > u64::from(u32::MAX) {
            bail!("{what} would be {elements} values, over 2^32 in one tensor; lower them");
        }
    }
    Ok(())
}

/// Builds the layer and its cache on the best adapter, prefills the prompt, then decodes
/// `c.tokens` steps, each fed the previous step's output, timing each.
pub fn run(c: &Config) -> Result<Report> {
    check(c)?;
    let gpu = Gpu::new([]).block_on().context("no adapter")?;
    if c.dtype == Dtype::F16 && !gpu.has_f16() {
        bail!(
            "{} has no shader-f16; use --dtype bf16 or f32",
            gpu.describe()
        );
    }
    let mut rng = StdRng::seed_from_u64(c.seed);
    let mut engine = Engine::new(&gpu, c, &mut rng)?;
    let x0: Vec<f32> = (0..c.slots * c.prompt * engine.width())
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let t0 = Instant::now();
    engine.prefill(&gpu, &x0)?;
    let prefill = t0.elapsed();
    let steps = engine.decode(&gpu)?;
    let out = runtime::block_on(engine.xs[(c.tokens % 2) as usize].to_f32(&gpu))?;
    let check = match c.check {
        true => Some(compare(&out, &host_reference(c, &engine.layer, &x0))),
        false => None,
    };
    Ok(Report {
        adapter: gpu.describe(),
        prefill,
        step_wall: steps.wall,
        decode_wall: steps.decode_wall,
        step_cpu: steps.cpu,
        step_gpu_ms: steps.gpu_ms,
        step_gap_ms: steps.gap_ms,
        check,
        pipelines: gpu.pipelines_created(),
        op_gpu_ms: steps.op_gpu_ms,
    }
    .with_tolerance(c.dtype))
}

/// What an engine holds for one layer: its weights and ops, the KV cache, and the
/// buffers its steps write.
struct Engine<'c> {
    c: &'c Config,
    layer: Layer,
    cache: KvCache,
    forward: Forward,
    decode: Decode,
    /// Q, K and V of the widest call in the cache's dtype, each call's rows padded so
    /// that its parts bind, and a step's view of it.
    qkv_all: Tensor,
    qkv_step: Tensor,
    /// O of every prompt row in the cache's dtype, and a step's view of it (its first).
    o_all: Tensor,
    o_step: Tensor,
    /// Step t reads `xs[t % 2]` and writes `xs[(t + 1) % 2]`.
    xs: [Tensor; 2],
}

/// A decode loop's timings ([`Report`]'s fields of the same names).
struct Steps {
    wall: Vec<Duration>,
    cpu: Vec<StepCpu>,
    decode_wall: Duration,
    gpu_ms: Option<Vec<f64>>,
    gap_ms: Option<Vec<f64>>,
    op_gpu_ms: Option<Vec<f64>>,
}

impl<'c> Engine<'c> {
    fn new(gpu: &Gpu, c: &'c Config, rng: &mut StdRng) -> Result<Engine<'c>> {
        let h = c.heads;
        let (width, kv_width) = (h.n_heads * h.head_dim, h.n_kv_heads * h.head_dim);
        let rows = c.slots * c.prompt;
        let io = [c.weights, c.dtype];
        let layer = Layer {
            qkv: Qkv::new(gpu, rng, [width, width, kv_width, rows], io)?,
            o: Projection::new(gpu, rng, [width, width], io)?,
            rope: Rope::new(
                gpu,
                RopeSpec {
                    dtype: c.dtype,
                    ..RopeSpec::new(h.head_dim)
                },
            )?,
        };
        let forward = ForwardSpec {
            head_dim: h.head_dim,
            head_dim_v: h.head_dim,
            masks: Masks::new(true, false),
            dtype: c.dtype,
        };
        let decode = DecodeSpec {
            cache: match c.page_size {
                None => Cache::Contiguous,
                Some(_) => Cache::Paged,
            },
            ..DecodeSpec::new(h.head_dim, h.head_dim_v, c.dtype)
        };
        let padded = [rows, c.slots].map(|r| layer.qkv.rows_for(gpu, r));
        let (data, f) = (scalar(c.dtype), Scalar::F32);
        let qkv_width = width + 2 * kv_width;
        let x = || Tensor::zeros(gpu, &[c.slots, width], f);
        let qkv_all = Tensor::zeros(gpu, &[padded[0].max(padded[1]), qkv_width], data)?;
        let o_all = Tensor::zeros(gpu, &[rows * width], data)?;
        Ok(Engine {
            c,
            layer,
            cache: new_cache(gpu, c)?,
            forward: Forward::new(gpu, forward)?,
            decode: Decode::new(gpu, decode)?,
            qkv_step: qkv_all.view(&[padded[1], qkv_width])?,
            o_step: o_all.view(&[c.slots, width])?,
            qkv_all,
            o_all,
            xs: [x()?, x()?],
        })
    }

    /// The model width: query heads × head_dim.
    fn width(&self) -> u32 {
        self.c.heads.n_heads * self.c.heads.head_dim
    }

    /// Projects, rotates and attends the prompt `x0` (`[slots × prompt, width]`), filling
    /// the cache, then projects each sequence's last row of O into `xs[0]`, the first
    /// step's input; waits for it.
    fn prefill(&mut self, gpu: &Gpu, x0: &[f32]) -> Result<()> {
        let (c, h, width) = (self.c, self.c.heads, self.width());
        let (b, p) = (c.slots, c.prompt);
        let x = Tensor::from_f32(gpu, &[b * p, width], Scalar::F32, x0)?;
        let rows = self.layer.qkv.rows_for(gpu, b * p);
        let qkv = self.qkv_all.view(&[rows, self.qkv_all.shape()[1]])?;
        let lse = Tensor::zeros(gpu, &[b, p, h.n_heads], Scalar::F32)?;
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for slot in 0..b {
            self.cache.open(&mut enc, slot)?;
        }
        self.layer.qkv.record(gpu, &mut enc, &x, &qkv)?;
        self.layer
            .rotate(gpu, &mut enc, &qkv, &self.cache, [b, p], h)?;
        let [qd, kd, vd] = self.layer.heads(&qkv, [b, p], h)?;
        let od = self.o_all.view(&[b, p, h.n_heads, h.head_dim])?;
        let args = ForwardArgs::new(&qd, &kd, &vd, &od, &lse);
        self.cache
            .prefill(gpu, &mut enc, &mut self.forward, 0, &args)?;
        // Each sequence's last prompt row goes on: a copy of its row of O.
        let row_bytes = u64::from(width) * u64::from(c.dtype.bytes());
        let last = Tensor::zeros(gpu, &[b, width], scalar(c.dtype))?;
        for s in 0..u64::from(b) {
            let from = od.offset() + (s * u64::from(p) + u64::from(p) - 1) * row_bytes;
            enc.copy_buffer_to_buffer(od.buffer(), from, last.buffer(), s * row_bytes, row_bytes);
        }
        self.layer.o.record(gpu, &mut enc, &last, &self.xs[0])?;
        gpu.queue.submit([enc.finish()]);
        wait(gpu)
    }

    /// Records decode step `t` into one compute pass (each pass costs the CPU its own
    /// validation and encoding), each op between `ops`' timestamps where it has them.
    fn record_step(&mut self, gpu: &Gpu, rec: &mut Recorder, t: u32, ops: &OpSpans) -> Result<()> {
        let (b, h) = (self.c.slots, self.c.heads);
        let (qkv, o) = (&self.qkv_step, &self.o_step);
        ops.mark(rec, 0, false);
        self.layer
            .qkv
            .record(gpu, rec, &self.xs[(t % 2) as usize], qkv)?;
        ops.mark(rec, 0, true);
        ops.mark(rec, 1, false);
        self.layer.rotate(gpu, rec, qkv, &self.cache, [b, 1], h)?;
        ops.mark(rec, 1, true);
        let [qd, kd, vd] = self.layer.heads(qkv, [b, 1], h)?;
        ops.mark(rec, 2, false);
        self.cache.append(gpu, rec, 0, &kd, &vd)?;
        ops.mark(rec, 2, true);
        let args = DecodeArgs {
            rows: Default::default(),
            q: &qd.reshape(&[b, h.n_heads, h.head_dim])?,
            cache: self.cache.view(),
            o: &o.reshape(&[b, h.n_heads, h.head_dim])?,
            scale: None,
            mods: Default::default(),
            slice_len: None,
        };
        ops.mark(rec, 3, false);
        self.decode.record(gpu, rec, &args)?;
        ops.mark(rec, 3, true);
        ops.mark(rec, 4, false);
        let next = &self.xs[((t + 1) % 2) as usize];
        self.layer.o.record(gpu, rec, o, next)?;
        ops.mark(rec, 4, true);
        Ok(())
    }

    /// Runs the decode steps, `c.steps_per_submit` to an encoder, timing each on the CPU
    /// and (where the adapter has timestamps) on the GPU.
    fn decode(&mut self, gpu: &Gpu) -> Result<Steps> {
        let c = self.c;
        let stamps = runtime::timing::Spans::new(gpu, c.tokens);
        let n_ops = STEP_OPS.len() as u32;
        let profile = match c.profile {
            true => runtime::timing::Spans::new(gpu, c.tokens * n_ops),
            false => None,
        };
        let mut wall = Vec::with_capacity(c.tokens as usize);
        let mut cpu = Vec::with_capacity(c.tokens as usize);
        let start = Instant::now();
        let mut open = None;
        for t in 0..c.tokens {
            let t_step = Instant::now();
            let enc =
                open.get_or_insert_with(|| gpu.device.create_command_encoder(&Default::default()));
            if let Some(spans) = &stamps {
                spans.mark(enc, t, false);
            }
            let mut rec = Recorder::new(enc);
            self.record_step(gpu, &mut rec, t, &OpSpans(profile.as_ref(), t))?;
            drop(rec);
            if let Some(spans) = &stamps {
                spans.mark(enc, t, true);
            }
            let recorded = Instant::now();
            let mut step = StepCpu {
                record: recorded - t_step,
                ..StepCpu::default()
            };
            let last = (t + 1) % c.steps_per_submit == 0 || t + 1 == c.tokens;
            if let Some(enc) = open.take_if(|_| last) {
                let commands = enc.finish();
                let finished = Instant::now();
                gpu.queue.submit([commands]);
                step.finish = finished - recorded;
                step.submit = finished.elapsed();
                if c.sync {
                    wait(gpu)?;
                }
            }
            cpu.push(step);
            wall.push(t_step.elapsed());
        }
        wait(gpu)?;
        let decode_wall = start.elapsed();
        let (gpu_ms, gap_ms) = match &stamps {
            Some(spans) => {
                let (times, gaps) = spans.read(gpu)?;
                (Some(times), Some(gaps))
            }
            None => (None, None),
        };
        let op_gpu_ms = match &profile {
            Some(spans) => Some(op_medians(&spans.read_ms(gpu)?, n_ops as usize)),
            None => None,
        };
        Ok(Steps {
            wall,
            cpu,
            decode_wall,
            gpu_ms,
            gap_ms,
            op_gpu_ms,
        })
    }
}

/// The cache of `c`'s slots, contiguous or in pages of `--page-size` rows.
fn new_cache(gpu: &Gpu, c: &Config) -> Result<KvCache> {
    let layout = match c.page_size {
        None => CacheLayout::Contiguous {
            capacity: c.capacity,
        },
        Some(page_size) => {
            let per_seq = c.capacity.div_ceil(page_size);
            CacheLayout::Paged {
                page_size,
                n_pages: per_seq * c.slots,
                pages_per_seq: per_seq,
            }
        }
    };
    let spec = CacheSpec {
        slots: c.slots,
        n_kv_heads: c.heads.n_kv_heads,
        head_dim: c.heads.head_dim,
        head_dim_v: c.heads.head_dim_v,
        dtype: c.dtype,
        layout,
        kv_fp8: None,
    };
    Ok(KvCache::new(gpu, spec)?)
}

/// The timestamps of one step's ops, where `--profile` asked for them.
struct OpSpans<'a>(Option<&'a runtime::timing::Spans>, u32);

impl OpSpans<'_> {
    /// Ends `rec`'s pass only where the ops are timed.
    fn mark(&self, rec: &mut Recorder, op: u32, end: bool) {
        if let Some(spans) = self.0 {
            spans.mark(rec.encoder(), self.1 * STEP_OPS.len() as u32 + op, end);
        }
    }
}

/// Each op's median over the steps after the first, from spans laid out step by step.
fn op_medians(spans: &[f64], n_ops: usize) -> Vec<f64> {
    let steps = spans.len() / n_ops;
    let from = usize::from(steps > 1);
    (0..n_ops)
        .map(|op| {
            let mut v: Vec<f64> = (from..steps).map(|t| spans[t * n_ops + op]).collect();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        })
        .collect()
}

impl Report {
    fn with_tolerance(mut self, dtype: Dtype) -> Report {
        // The reference rounds where the device does; what remains is f32 arithmetic
        // against f64 (and the device's exp), through every step.
        let tol = match dtype {
            Dtype::F32 => 1e-5,
            Dtype::F16 => 5e-3,
            Dtype::Bf16 => 3e-2,
        };
        self.check = self.check.map(|(err, _)| (err, tol));
        self
    }
}

fn compare(got: &[f32], want: &[f64]) -> (f64, f64) {
    let scale = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
    let err = got
        .iter()
        .zip(want)
        .map(|(g, w)| (f64::from(*g) - w).abs())
        .fold(0.0, f64::max);
    (err / scale, 0.0)
}

fn wait(gpu: &Gpu) -> Result<()> {
    gpu.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| anyhow::anyhow!("waiting for the GPU: {e}"))?;
    Ok(())
}

/// The whole run in f64 on the host, rounding where the device stores the cache's dtype
/// (Q, K and V as projected and as rotated, O as the attention writes it).
fn host_reference(c: &Config, layer: &Layer, x0: &[f32]) -> Vec<f64> {
    let h = c.heads;
    let (b, p) = (c.slots as usize, c.prompt as usize);
    let (nh, nkv, d) = (
        h.n_heads as usize,
        h.n_kv_heads as usize,
        h.head_dim as usize,
    );
    let inv: Vec<f64> = runtime::ops::rope::inv_freq(10000.0, h.head_dim)
        .iter()
        .map(|x| f64::from(*x))
        .collect();
    let x = reference::cast::<f64>(x0);
    let rot = |x: &[f64], seq: usize, heads: usize, pos: u32| {
        reference::rope(x, seq, heads, d, pos, &inv, 1.0)
    };
    // Q, K and V as the Linear stores them, rotated in f32 and rounded again.
    let qkv = |x: &[f64]| layer.qkv.reference(x).map(|p| round(&p, c.dtype));
    let [q, k, mut v] = qkv(&x);
    let q = round(&rot(&q, p, nh, 0), c.dtype);
    let mut k = round(&rot(&k, p, nkv, 0), c.dtype);
    let scale = f64::from(h.default_scale());
    let problem = Problem {
        batch: b,
        n_q: p,
        n_k: p,
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: d,
        scale,
        causal: true,
        ..Problem::default()
    };
    let o = round(&reference::attention(&problem, &q, &k, &v).o, c.dtype);
    let last: Vec<f64> = (0..b)
        .flat_map(|s| o[(s * p + p - 1) * nh * d..][..nh * d].to_vec())
        .collect();
    let mut x = layer.o.reference(&last);
    let kv_row = nkv * d;
    for t in 0..c.tokens as usize {
        let len = p + t;
        let [q, kn, vn] = qkv(&x);
        let q = round(&rot(&q, 1, nh, len as u32), c.dtype);
        let kn = round(&rot(&kn, 1, nkv, len as u32), c.dtype);
        // Each sequence's cache grows by its new row.
        let grow = |cache: &[f64], new: &[f64]| -> Vec<f64> {
            (0..b)
                .flat_map(|s| {
                    let mut rows = cache[s * len * kv_row..][..len * kv_row].to_vec();
                    rows.extend_from_slice(&new[s * kv_row..][..kv_row]);
                    rows
                })
                .collect()
        };
        k = grow(&k, &kn);
        v = grow(&v, &vn);
        let problem = Problem {
            batch: b,
            n_q: 1,
            n_k: len + 1,
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: d,
            scale,
            q_pos: len,
            ..Problem::default()
        };
        let o = round(&reference::attention(&problem, &q, &k, &v).o, c.dtype);
        x = layer.o.reference(&o);
    }
    x
}
