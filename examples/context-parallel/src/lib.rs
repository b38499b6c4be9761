//! One sequence over several GPUs (context parallelism), as a framework that spreads work
//! over devices would run it with this runtime's ops. The keys and values are split over
//! the devices (two chunks each, see [`plan`]); every device holds every query and attends
//! them to its own keys, writing a part of O and LSE per key chunk; the parts travel to
//! device 0 (through the host: wgpu devices share no memory), where `Merge` makes the
//! result. The backward runs the same blocks from the merged O and LSE (sent back to every
//! device): each device adds its blocks' dQ for every query and owns dK and dV of its
//! keys; the partial dQs travel to device 0 and `Sum` adds them. The same work on one
//! GPU runs beside it, and both are judged against the f64 reference by `check`'s rule.

pub mod one;
pub mod plan;
pub mod shard;
pub mod split;
pub mod transfer;
pub mod verify;

use std::time::Instant;

use anyhow::{Context, Result, bail};
use attn_dsl::{Dtype, Scalar};
use rand::{Rng, SeedableRng, rngs::StdRng};
use runtime::tensor::buffers::rounded;
use runtime::verify::compare::Verdict;
use runtime::verify::reference::Problem;
use runtime::{Gpu, Heads, Tensor, kernels};

use one::Whole;
use plan::Plan;
use shard::Tensors;
use split::{Mode, Split};
use verify::{Inputs, Outputs};

#[derive(Clone, Debug)]
pub struct Config {
    pub seq: u32,
    pub heads: Heads,
    pub dtype: Dtype,
    pub causal: bool,
    pub devices: usize,
    /// Run (and time, and judge) the backward too.
    pub backward: bool,
    /// Timed runs after one untimed run (which compiles).
    pub runs: u32,
    pub check: Check,
    pub seed: u64,
}

/// How much of the result is judged against the f64 reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    Off,
    /// This many query rows, spread over the sequence (the reference of a row reads every
    /// key); dK and dV against the one-GPU backward's.
    Rows(usize),
    /// Every output: small sequences only (the reference is quadratic on the host).
    Full,
}

/// Wall milliseconds of one step over several devices (medians over the runs): whole,
/// and each phase alone (the phase model: the whole below their sum is their overlap).
#[derive(Clone, Copy, Debug, Default)]
pub struct Phases {
    /// The step: blocks, transfers (overlapping them) and the merge or sum.
    pub whole: f64,
    /// Every device's blocks, recorded and submitted together, until the last finished.
    pub compute: f64,
    /// States and gradients between devices through the host, until written.
    pub transfer: f64,
    /// The merge (forward) or sum (backward) on device 0.
    pub combine: f64,
    /// Bytes moved between devices.
    pub bytes: u64,
}

#[derive(Clone, Debug)]
pub struct Report {
    pub adapters: Vec<String>,
    pub plan: Plan,
    /// Visible (query, key) pairs each device scores, per head.
    pub pairs: Vec<u64>,
    /// Wall ms of the forward (and backward) on device 0 alone, medians.
    pub one: (f64, Option<f64>),
    pub forward: Phases,
    pub backward: Option<Phases>,
    pub verdicts: Vec<(String, Verdict)>,
    /// Largest difference of dK and dV from the one-GPU backward's, as a fraction of its
    /// largest magnitude (where the reference judged only some rows).
    pub dkv_difference: Option<f64>,
}

/// How far dK and dV may differ from the one-GPU backward's (the same kernels, their sums
/// over query chunks added in another order).
pub const DKV_TOLERANCE: f64 = 1e-4;

impl Report {
    /// Whether the split met the reference (the one-GPU verdicts are there to compare).
    pub fn passed(&self) -> bool {
        self.verdicts
            .iter()
            .filter(|(name, _)| name.starts_with("split"))
            .all(|(_, v)| v.pass())
            && self.dkv_difference.is_none_or(|d| d <= DKV_TOLERANCE)
    }
}

/// The flags' values, checked before any device starts: each refusal names the flag.
pub fn check(c: &Config) -> Result<()> {
    let h = c.heads;
    if c.devices == 0 || c.runs == 0 {
        bail!("--devices and --runs must be at least 1");
    }
    if c.devices > MAX_DEVICES {
        bail!(
            "--devices {}: at most {MAX_DEVICES} (a host's GPUs, or one adapter taken again)",
            c.devices
        );
    }
    if h.n_heads == 0 || h.n_kv_heads == 0 || !h.n_heads.is_multiple_of(h.n_kv_heads) {
        bail!(
            "--kv-heads {} must divide --heads {}",
            h.n_kv_heads,
            h.n_heads
        );
    }
    if h.head_dim == 0 || h.head_dim > 256 || !h.head_dim.is_multiple_of(4) {
        bail!(
            "--head-dim {}: give a multiple of 4 from 4 to 256",
            h.head_dim
        );
    }
    let unit = 2 * c.devices as u32 * CHUNK_ROWS;
    let q_bytes = [c.seq, h.n_heads, h.head_dim, 4]
        .iter()
        .fold(1u64, |n, d| n.saturating_mul(u64::from(*d)));
    if q_bytes > MAX_Q_BYTES {
        bail!(
            "Q in f32 on the host (--seq × --heads × --head-dim × 4 bytes) would be {q_bytes} \
             bytes, over {MAX_Q_BYTES}: lower them"
        );
    }
    if c.seq == 0 || !c.seq.is_multiple_of(unit) {
        bail!(
            "--seq {} must be a positive multiple of {unit}: {} chunks (two per device) of a \
             multiple of {CHUNK_ROWS} rows each, so that each chunk's rows start where a \
             tensor can be bound",
            c.seq,
            2 * c.devices
        );
    }
    Ok(())
}

/// The most devices a run spreads over.
pub const MAX_DEVICES: usize = 64;

/// The largest Q the host draws (it holds Q, K, V and dO in f32, and copies of them).
pub const MAX_Q_BYTES: u64 = 16 << 30;

/// Chunks hold a multiple of this many rows: their views are then aligned for binding
/// (256 bytes) whatever the heads and widths.
pub const CHUNK_ROWS: u32 = 64;

/// Host copies of the inputs, rounded to the dtype as the devices hold them.
pub struct Host {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub d_o: Vec<f32>,
}

fn draw(c: &Config) -> Host {
    let h = c.heads;
    let n = c.seq as usize;
    let (qn, kn) = (
        n * (h.n_heads * h.head_dim) as usize,
        n * (h.n_kv_heads * h.head_dim) as usize,
    );
    let mut rng = StdRng::seed_from_u64(c.seed);
    let scalar = Scalar::from(c.dtype);
    let mut draw = |len: usize| -> Vec<f32> {
        let x: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0..1.0)).collect();
        rounded(&x, scalar)
    };
    Host {
        q: draw(qn),
        k: draw(kn),
        v: draw(kn),
        d_o: draw(qn),
    }
}

/// Waits for everything submitted to `gpu`.
pub(crate) fn wait(gpu: &Gpu) -> Result<()> {
    transfer::wait(gpu, None)
}

/// Key chunk `key`'s rows of a `[seq, width]` host tensor.
fn chunk_of<'a>(x: &'a [f32], plan: &Plan, key: usize, width: usize) -> &'a [f32] {
    let m = plan.chunk as usize;
    &x[key * m * width..][..m * width]
}

/// Device `d`'s tensors: `whole`'s Q and dO on device 0, fresh copies elsewhere.
fn shard_tensors(
    gpu: &Gpu,
    d: usize,
    c: &Config,
    plan: &Plan,
    host: &Host,
    whole: &Whole,
) -> Result<Tensors> {
    let h = c.heads;
    let data = Scalar::from(c.dtype);
    let n = c.seq;
    let kw = (h.n_kv_heads * h.head_dim) as usize;
    let ks = [1, 2 * plan.chunk, h.n_kv_heads, h.head_dim];
    let held = |x: &[f32]| -> Result<Tensor> {
        let rows: Vec<f32> = plan
            .owned(d)
            .iter()
            .flat_map(|&j| chunk_of(x, plan, j, kw))
            .copied()
            .collect();
        Ok(Tensor::from_f32(gpu, &ks, data, &rows)?)
    };
    let qs = [1, n, h.n_heads, h.head_dim];
    let (q, d_o, o, lse) = match d {
        0 => (
            whole.q.clone(),
            whole.d_o.clone(),
            Tensor::zeros(gpu, &qs, data)?,
            Tensor::zeros(gpu, &qs[..3], Scalar::F32)?,
        ),
        _ => (
            Tensor::from_f32(gpu, &qs, data, &host.q)?,
            Tensor::from_f32(gpu, &qs, data, &host.d_o)?,
            Tensor::zeros(gpu, &qs, data)?,
            Tensor::zeros(gpu, &qs[..3], Scalar::F32)?,
        ),
    };
    Ok(Tensors {
        q,
        k: held(&host.k)?,
        v: held(&host.v)?,
        d_o,
        o,
        lse,
        dq: Tensor::zeros(gpu, &qs, Scalar::F32)?,
        dk: Tensor::zeros(gpu, &ks, Scalar::F32)?,
        dv: Tensor::zeros(gpu, &ks, Scalar::F32)?,
    })
}

pub fn run(c: &Config) -> Result<Report> {
    check(c)?;
    let plan = Plan {
        devices: c.devices,
        chunk: c.seq / (2 * c.devices as u32),
        causal: c.causal,
    };
    let gpus = runtime::block_on(Gpu::several(c.devices, kernels::FAMILY.iter().copied()))
        .context("no adapter")?;
    for gpu in &gpus {
        if !gpu.supports_dtype(c.dtype) {
            bail!(
                "{} has no {}; use --dtype f32",
                gpu.describe(),
                c.dtype.name()
            );
        }
    }
    let adapters = gpus.iter().map(|g| g.describe()).collect();
    let host = draw(c);
    let mut whole = Whole::new(&gpus[0], c, &host)?;
    let tensors = gpus
        .iter()
        .enumerate()
        .map(|(d, gpu)| shard_tensors(gpu, d, c, &plan, &host, &whole))
        .collect::<Result<Vec<_>>>()?;
    let mut split = Split::new(gpus, plan, (c.dtype, c.heads), tensors)?;
    let t = timed(c, &mut split, &mut whole)?;
    let (got, one) = read_back(c, &plan, &split, &whole)?;
    let verdicts = judge(c, &plan, &host, &got, &one);
    let dkv_difference = (c.backward && matches!(c.check, Check::Rows(_)))
        .then(|| verify::relative(&got.dk, &one.dk).max(verify::relative(&got.dv, &one.dv)));
    Ok(Report {
        adapters,
        plan,
        pairs: (0..c.devices).map(|d| plan.pairs(d)).collect(),
        one: (t.one.0, c.backward.then_some(t.one.1)),
        forward: t.forward,
        backward: c.backward.then_some(t.backward),
        verdicts,
        dkv_difference,
    })
}

/// Wall times, medians: one GPU's forward and backward, the split's phases.
#[derive(Clone, Copy, Debug, Default)]
struct Times {
    one: (f64, f64),
    forward: Phases,
    backward: Phases,
}

/// `f` run `runs` times after an untimed first: the median wall ms, and the bytes of a run.
fn median_of(runs: u32, mut f: impl FnMut() -> Result<(f64, u64)>) -> Result<(f64, u64)> {
    let mut times = Vec::new();
    let mut bytes = 0;
    for run in 0..=runs {
        let (ms, b) = f()?;
        if run > 0 {
            times.push(ms);
        }
        bytes = b;
    }
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], bytes))
}

/// Every kind of run once, untimed (their kernels compile here), then whole steps for a
/// second: the first runs after a batch of pipelines is created run slow (on an H100 4-5x,
/// docs/performance.md; here, on an H200, the whole forward at 32k rows took 0.4x one
/// GPU's time where later runs reached 1.3x).
fn warm_up(c: &Config, split: &mut Split, whole: &mut Whole) -> Result<()> {
    whole.forward(&split.shards[0].gpu)?;
    if c.backward {
        whole.backward(&split.shards[0].gpu)?;
    }
    let mut step = |mode| -> Result<()> {
        split.forward(mode)?;
        if c.backward {
            split.backward(mode)?;
        }
        Ok(())
    };
    for mode in [Mode::Compute, Mode::Transfer, Mode::Combine, Mode::Whole] {
        step(mode)?;
    }
    let t = Instant::now();
    while t.elapsed().as_secs_f64() < 1.0 {
        step(Mode::Whole)?;
    }
    Ok(())
}

/// Each kind of run back to back: the split whole (whose merged O and LSE the phases
/// alone start from), each phase alone, one untimed split whole whose outputs are read
/// back (a sum alone adds into dQ each time), then one GPU. A device left idle through
/// the other's runs starts its next run slowly (an H200 idle for the seconds of a
/// 128k-row backward on the other took about twice as long for its share's forward), so
/// no kind of run follows a long idle.
fn timed(c: &Config, split: &mut Split, whole: &mut Whole) -> Result<Times> {
    warm_up(c, split, whole)?;
    let mut t = Times::default();
    for mode in [Mode::Whole, Mode::Compute, Mode::Transfer, Mode::Combine] {
        let (f, fb) = median_of(c.runs, || split.forward(mode))?;
        let (b, bb) = match c.backward {
            true => median_of(c.runs, || split.backward(mode))?,
            false => (0.0, 0),
        };
        let set = |p: &mut Phases, ms: f64| match mode {
            Mode::Compute => p.compute = ms,
            Mode::Transfer => p.transfer = ms,
            Mode::Combine => p.combine = ms,
            Mode::Whole => p.whole = ms,
        };
        set(&mut t.forward, f);
        set(&mut t.backward, b);
        if mode == Mode::Whole {
            (t.forward.bytes, t.backward.bytes) = (fb, bb);
        }
    }
    split.forward(Mode::Whole)?;
    if c.backward {
        split.backward(Mode::Whole)?;
    }
    let g0 = &split.shards[0].gpu;
    t.one.0 = median_of(c.runs, || Ok((whole.forward(g0)?, 0)))?.0;
    if c.backward {
        t.one.1 = median_of(c.runs, || Ok((whole.backward(g0)?, 0)))?.0;
    }
    Ok(t)
}

fn read(gpu: &Gpu, t: &Tensor) -> Result<Vec<f32>> {
    Ok(runtime::block_on(t.to_f32(gpu))?)
}

/// The split's and one GPU's outputs, in sequence order.
fn read_back(c: &Config, plan: &Plan, split: &Split, w: &Whole) -> Result<(Outputs, Outputs)> {
    let shards = &split.shards;
    let g0 = &shards[0].gpu;
    let mut split = Outputs {
        o: read(g0, &shards[0].t.o)?,
        lse: read(g0, &shards[0].t.lse)?,
        ..Outputs::default()
    };
    let mut one = Outputs {
        o: read(g0, &w.o)?,
        lse: read(g0, &w.lse)?,
        ..Outputs::default()
    };
    if c.backward {
        split.dq = read(g0, &shards[0].t.dq)?;
        let kw = (c.heads.n_kv_heads * c.heads.head_dim) as usize;
        let (mut dk, mut dv) = (
            vec![0.0; c.seq as usize * kw],
            vec![0.0; c.seq as usize * kw],
        );
        for sh in shards {
            let (k, v) = (read(&sh.gpu, &sh.t.dk)?, read(&sh.gpu, &sh.t.dv)?);
            let m = plan.chunk as usize * kw;
            for (slot, key) in plan.owned(sh.device).into_iter().enumerate() {
                dk[key * m..][..m].copy_from_slice(&k[slot * m..][..m]);
                dv[key * m..][..m].copy_from_slice(&v[slot * m..][..m]);
            }
        }
        (split.dk, split.dv) = (dk, dv);
        one.dq = read(g0, &w.dq)?;
        one.dk = read(g0, &w.dk)?;
        one.dv = read(g0, &w.dv)?;
    }
    Ok((split, one))
}

fn judge(
    c: &Config,
    plan: &Plan,
    host: &Host,
    split: &Outputs,
    one: &Outputs,
) -> Vec<(String, Verdict)> {
    let h = c.heads;
    let p = Problem {
        batch: 1,
        n_q: c.seq as usize,
        n_k: c.seq as usize,
        n_heads: h.n_heads as usize,
        n_kv_heads: h.n_kv_heads as usize,
        head_dim: h.head_dim as usize,
        head_dim_v: h.head_dim as usize,
        scale: f64::from(h.default_scale()),
        causal: c.causal,
        ..Problem::default()
    };
    let rows = match c.check {
        Check::Off => return Vec::new(),
        Check::Full => verify::Rows::All,
        Check::Rows(k) => verify::Rows::Some(spread(c.seq as usize, k)),
    };
    let x = Inputs {
        q: &host.q,
        k: &host.k,
        v: &host.v,
        d_o: &host.d_o,
    };
    verify::verdicts(&p, plan, c.dtype, &x, &rows, split, one)
}

/// `k` rows spread over `n` (at most `n`): the last alone (which sees every key under a
/// causal mask), or the first, the last, and evenly between.
fn spread(n: usize, k: usize) -> Vec<usize> {
    match k.min(n) {
        0 | 1 => vec![n - 1],
        k => (0..k).map(|i| i * (n - 1) / (k - 1)).collect(),
    }
}
