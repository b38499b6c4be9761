//! One sequence over several GPUs (context parallelism), as a framework that spreads work
//! over devices would run it with this runtime's ops. The keys and values are split over
//! the devices (two chunks each, see [`plan`]); every device holds every query and attends
//! them to its own keys, writing a part of O and LSE per key chunk; the parts travel to
//! device 0 (through the host: wgpu devices share no memory), where `Merge` makes the
//! result. The backward runs the same blocks from the merged O and LSE (sent back to every
//! device): each device adds its blocks' dQ for every query and owns dK and dV of its
//! keys; the partial dQs travel to device 0 and `Sum` adds them. The same work on one
//! GPU runs beside it, and both are judged against the f64 reference by `check`'s rule.

pub mod plan;
pub mod shard;
pub mod transfer;
pub mod verify;

use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use attn_dsl::{Dtype, Masks, Scalar};
use rand::{Rng, SeedableRng, rngs::StdRng};
use runtime::host::buffers::rounded;
use runtime::ops::backward::{BackwardArgs, BackwardSpec};
use runtime::ops::forward::{Forward, ForwardArgs, ForwardSpec};
use runtime::ops::merge::{Merge, MergeArgs, MergeSpec};
use runtime::ops::sum::{Sum, SumArgs};
use runtime::verify::compare::Verdict;
use runtime::verify::reference::Problem;
use runtime::{Backward, Gpu, Heads, Tensor, kernels};

use plan::Plan;
use shard::{Shard, Tensors, filled, part, rows};
use transfer::Route;
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

/// Wall milliseconds of one step over several devices, by phase (medians over the runs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Phases {
    /// Every device's blocks, recorded and submitted together, until the last finished.
    pub compute: f64,
    /// States and gradients between devices through the host, until written.
    pub transfer: f64,
    /// The merge (forward) or sum (backward) on device 0.
    pub combine: f64,
    /// Bytes moved between devices.
    pub bytes: u64,
}

impl Phases {
    pub fn total(&self) -> f64 {
        self.compute + self.transfer + self.combine
    }
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

/// Chunks hold a multiple of this many rows: their views are then aligned for binding
/// (256 bytes) whatever the heads and widths.
pub const CHUNK_ROWS: u32 = 64;

/// Host copies of the inputs, rounded to the dtype as the devices hold them.
struct Host {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_o: Vec<f32>,
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

fn wait(gpu: &Gpu) -> Result<()> {
    gpu.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| anyhow!("waiting for {}: {e}", gpu.describe()))?;
    Ok(())
}

/// Records `f` into a fresh encoder on `gpu` and submits it.
fn submit(gpu: &Gpu, f: impl FnOnce(&mut wgpu::CommandEncoder) -> Result<()>) -> Result<()> {
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    f(&mut enc)?;
    gpu.queue.submit([enc.finish()]);
    Ok(())
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn median(mut x: Vec<f64>) -> f64 {
    x.sort_by(f64::total_cmp);
    x[x.len() / 2]
}

/// The sequence's tensors on one device: the whole sequence for the one-GPU run.
struct Whole {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    d_o: Tensor,
    o: Tensor,
    lse: Tensor,
    dq: Tensor,
    dk: Tensor,
    dv: Tensor,
}

fn upload(gpu: &Gpu, c: &Config, host: &Host) -> Result<Whole> {
    let h = c.heads;
    let data = Scalar::from(c.dtype);
    let (qs, ks) = (
        [1, c.seq, h.n_heads, h.head_dim],
        [1, c.seq, h.n_kv_heads, h.head_dim],
    );
    let up = |shape: &[u32], x: &[f32]| Tensor::from_f32(gpu, shape, data, x);
    let zeros = |shape: &[u32], s| Tensor::zeros(gpu, shape, s);
    Ok(Whole {
        q: up(&qs, &host.q)?,
        k: up(&ks, &host.k)?,
        v: up(&ks, &host.v)?,
        d_o: up(&qs, &host.d_o)?,
        o: zeros(&qs, data)?,
        lse: zeros(&qs[..3], Scalar::F32)?,
        dq: zeros(&qs, Scalar::F32)?,
        dk: zeros(&ks, Scalar::F32)?,
        dv: zeros(&ks, Scalar::F32)?,
    })
}

/// Key chunk `key`'s rows of a `[seq, width]` host tensor.
fn chunk_of<'a>(x: &'a [f32], plan: &Plan, key: usize, width: usize) -> &'a [f32] {
    let m = plan.chunk as usize;
    &x[key * m * width..][..m * width]
}

/// Device `d`'s tensors: `whole`'s Q and dO on device 0, fresh copies elsewhere; the
/// parts stacked by key chunk on device 0 (where they are merged) and by slot elsewhere.
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
    let parts = match d {
        0 => plan.chunks() as u32,
        _ => 2,
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
        o_parts: Tensor::zeros(gpu, &[parts, 1, n, h.n_heads, h.head_dim], data)?,
        // A part's rows its keys do not show (before the chunk, under a causal mask) are
        // never written: their LSE weighs nothing in the merge.
        lse_parts: filled(
            gpu,
            &[parts, 1, n, h.n_heads],
            Scalar::F32,
            f32::NEG_INFINITY,
        )?,
        o,
        lse,
        dq: Tensor::zeros(gpu, &qs, Scalar::F32)?,
        dk: Tensor::zeros(gpu, &ks, Scalar::F32)?,
        dv: Tensor::zeros(gpu, &ks, Scalar::F32)?,
    })
}

/// What device 0 runs beside its shard: the merge, the sum, and the one-GPU op.
struct Lead {
    merge: Merge,
    sum: Sum,
    /// The other devices' partial dQ, `[devices − 1, 1, seq, n_heads, head_dim]` f32.
    dq_parts: Option<Tensor>,
    forward: Forward,
    backward: Backward,
    whole: Whole,
    routes: Routes,
}

/// What travels between devices: the parts to device 0, the merged O and LSE back to
/// every device, the partial dQs to device 0.
#[derive(Default)]
struct Routes {
    parts: Vec<Route>,
    merged: Vec<Route>,
    dq: Vec<Route>,
}

fn routes(plan: &Plan, shards: &[Shard], dq_parts: Option<&Tensor>) -> Result<Routes> {
    let gpus: Vec<&Gpu> = shards.iter().map(|s| &s.gpu).collect();
    let (lead, others) = shards.split_first().expect("one device at least");
    let g0 = &lead.gpu;
    let mut r = Routes::default();
    for sh in others {
        let g = &sh.gpu;
        let mut items = Vec::new();
        for (slot, key) in plan.owned(sh.device).into_iter().enumerate() {
            let shown = plan.shown(key);
            let first = shown.start as u32 * plan.chunk;
            let count = shown.len() as u32 * plan.chunk;
            for (local, global) in [
                (&sh.t.o_parts, &lead.t.o_parts),
                (&sh.t.lse_parts, &lead.t.lse_parts),
            ] {
                let src = rows(g, &part(g, local, slot)?, first, count)?;
                items.push((src, rows(g0, &part(g0, global, key)?, first, count)?));
            }
        }
        r.parts.push(Route::new(&gpus, sh.device, 0, items));
        let back = vec![
            (lead.t.o.clone(), sh.t.o.clone()),
            (lead.t.lse.clone(), sh.t.lse.clone()),
        ];
        r.merged.push(Route::new(&gpus, 0, sh.device, back));
        if let Some(dq_parts) = dq_parts {
            let to = part(g0, dq_parts, sh.device - 1)?;
            r.dq.push(Route::new(&gpus, sh.device, 0, vec![(sh.t.dq.clone(), to)]));
        }
    }
    Ok(r)
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
    let (mut shards, mut lead) = build(gpus, c, &plan, &host)?;
    let mut times = Times::default();
    for run in 0..=c.runs {
        let t = step(c, &mut shards, &mut lead)?;
        if run > 0 {
            times.push(t);
        }
    }
    let (split, one) = read_back(c, &plan, &shards, &lead)?;
    let verdicts = judge(c, &plan, &host, &split, &one);
    let dkv_difference = (c.backward && matches!(c.check, Check::Rows(_)))
        .then(|| verify::relative(&split.dk, &one.dk).max(verify::relative(&split.dv, &one.dv)));
    Ok(Report {
        adapters,
        plan,
        pairs: (0..c.devices).map(|d| plan.pairs(d)).collect(),
        one: times.one(),
        forward: times.forward(),
        backward: times.backward(),
        verdicts,
        dkv_difference,
    })
}

fn build(gpus: Vec<Gpu>, c: &Config, plan: &Plan, host: &Host) -> Result<(Vec<Shard>, Lead)> {
    let h = c.heads;
    let masks = Masks::new(c.causal, false);
    let gpu0 = &gpus[0];
    let whole = upload(gpu0, c, host)?;
    let mut lead = Lead {
        merge: Merge::new(gpu0, MergeSpec::new(h.head_dim, c.dtype))?,
        sum: Sum::new(),
        dq_parts: (c.devices > 1)
            .then(|| {
                Tensor::zeros(
                    gpu0,
                    &[c.devices as u32 - 1, 1, c.seq, h.n_heads, h.head_dim],
                    Scalar::F32,
                )
            })
            .transpose()?,
        forward: Forward::new(gpu0, ForwardSpec::new(h.head_dim, masks, c.dtype))?,
        backward: Backward::new(gpu0, BackwardSpec::new(h.head_dim, masks, c.dtype))?,
        whole,
        routes: Routes::default(),
    };
    let mut shards = Vec::new();
    for (d, gpu) in gpus.into_iter().enumerate() {
        let t = shard_tensors(&gpu, d, c, plan, host, &lead.whole)?;
        let part_of = move |b: &plan::Block| if d == 0 { b.key } else { b.slot };
        shards.push(Shard::new(gpu, d, plan, c.dtype, h, t, part_of)?);
    }
    lead.routes = routes(plan, &shards, lead.dq_parts.as_ref())?;
    Ok((shards, lead))
}

/// One run's wall times: one GPU's forward and backward, the split's phases.
#[derive(Clone, Copy, Debug, Default)]
struct Step {
    one: (f64, f64),
    forward: Phases,
    backward: Phases,
}

#[derive(Default)]
struct Times {
    steps: Vec<Step>,
}

impl Times {
    fn push(&mut self, s: Step) {
        self.steps.push(s);
    }

    fn med(&self, f: impl Fn(&Step) -> f64) -> f64 {
        median(self.steps.iter().map(f).collect())
    }

    fn phases(&self, f: impl Fn(&Step) -> Phases) -> Phases {
        Phases {
            compute: self.med(|s| f(s).compute),
            transfer: self.med(|s| f(s).transfer),
            combine: self.med(|s| f(s).combine),
            bytes: self.steps.first().map_or(0, |s| f(s).bytes),
        }
    }

    fn one(&self) -> (f64, Option<f64>) {
        let b = self.med(|s| s.one.1);
        (self.med(|s| s.one.0), (b > 0.0).then_some(b))
    }

    fn forward(&self) -> Phases {
        self.phases(|s| s.forward)
    }

    fn backward(&self) -> Option<Phases> {
        let b = self.phases(|s| s.backward);
        (b.compute > 0.0).then_some(b)
    }
}

fn step(c: &Config, shards: &mut [Shard], lead: &mut Lead) -> Result<Step> {
    let mut s = Step {
        one: one_gpu(c, &shards[0].gpu, lead)?,
        ..Step::default()
    };
    s.forward = split_forward(shards, lead)?;
    if c.backward {
        s.backward = split_backward(shards, lead)?;
    }
    Ok(s)
}

/// The forward (and backward) over the whole sequence on device 0: wall ms of each.
fn one_gpu(c: &Config, gpu: &Gpu, lead: &mut Lead) -> Result<(f64, f64)> {
    let w = &lead.whole;
    let t = Instant::now();
    submit(gpu, |enc| {
        let args = ForwardArgs::new(&w.q, &w.k, &w.v, &w.o, &w.lse);
        Ok(lead.forward.record(gpu, enc, &args)?)
    })?;
    wait(gpu)?;
    let forward = ms(t);
    if !c.backward {
        return Ok((forward, 0.0));
    }
    let t = Instant::now();
    submit(gpu, |enc| {
        let args = BackwardArgs {
            q: &w.q,
            k: &w.k,
            v: &w.v,
            o: &w.o,
            lse: &w.lse,
            d_o: &w.d_o,
            dq: &w.dq,
            dk: &w.dk,
            dv: &w.dv,
            dbias: None,
            dsinks: None,
            flex_grads: &[],
            seg: None,
            scale: None,
            mods: Default::default(),
            accumulate: false,
        };
        lead.backward.record(gpu, enc, &args, None)?;
        Ok(())
    })?;
    wait(gpu)?;
    Ok((forward, ms(t)))
}

/// Every device's blocks, their parts carried to device 0, merged there.
fn split_forward(shards: &mut [Shard], lead: &mut Lead) -> Result<Phases> {
    let t = Instant::now();
    for sh in shards.iter_mut() {
        let gpu = sh.gpu.device.clone();
        let mut enc = gpu.create_command_encoder(&Default::default());
        sh.record_forward(&mut enc)?;
        sh.gpu.queue.submit([enc.finish()]);
    }
    for sh in shards.iter() {
        wait(&sh.gpu)?;
    }
    let compute = ms(t);
    let t = Instant::now();
    let gpus: Vec<&Gpu> = shards.iter().map(|s| &s.gpu).collect();
    let bytes = transfer::carry(&gpus, &lead.routes.parts)?;
    let transfer = ms(t);
    let t = Instant::now();
    let lead_shard = &shards[0];
    let g0 = &lead_shard.gpu;
    submit(g0, |enc| {
        let args = MergeArgs {
            o_parts: &lead_shard.t.o_parts,
            lse_parts: &lead_shard.t.lse_parts,
            o: &lead_shard.t.o,
            lse: &lead_shard.t.lse,
            sinks: None,
        };
        Ok(lead.merge.record(g0, enc, &args)?)
    })?;
    wait(g0)?;
    Ok(Phases {
        compute,
        transfer,
        combine: ms(t),
        bytes,
    })
}

/// The merged O and LSE sent to every device, every device's blocks' backward, the partial
/// dQs carried to device 0 and summed there.
fn split_backward(shards: &mut [Shard], lead: &mut Lead) -> Result<Phases> {
    let t = Instant::now();
    let gpus: Vec<&Gpu> = shards.iter().map(|s| &s.gpu).collect();
    let mut bytes = transfer::carry(&gpus, &lead.routes.merged)?;
    let mut transfer = ms(t);
    let t = Instant::now();
    for sh in shards.iter_mut() {
        let device = sh.gpu.device.clone();
        let mut enc = device.create_command_encoder(&Default::default());
        sh.record_backward(&mut enc)?;
        sh.gpu.queue.submit([enc.finish()]);
    }
    for sh in shards.iter() {
        wait(&sh.gpu)?;
    }
    let compute = ms(t);
    let Some(dq_parts) = &lead.dq_parts else {
        return Ok(Phases {
            compute,
            transfer,
            combine: 0.0,
            bytes,
        });
    };
    let t = Instant::now();
    let gpus: Vec<&Gpu> = shards.iter().map(|s| &s.gpu).collect();
    bytes += transfer::carry(&gpus, &lead.routes.dq)?;
    transfer += ms(t);
    let t = Instant::now();
    let (lead_shard, g0) = (&shards[0], &shards[0].gpu);
    submit(g0, |enc| {
        let args = SumArgs {
            parts: dq_parts,
            into: &lead_shard.t.dq,
        };
        Ok(lead.sum.record(g0, enc, &args)?)
    })?;
    wait(g0)?;
    Ok(Phases {
        compute,
        transfer,
        combine: ms(t),
        bytes,
    })
}

fn read(gpu: &Gpu, t: &Tensor) -> Result<Vec<f32>> {
    Ok(runtime::block_on(t.to_f32(gpu))?)
}

/// The split's and one GPU's outputs, in sequence order.
fn read_back(c: &Config, plan: &Plan, shards: &[Shard], lead: &Lead) -> Result<(Outputs, Outputs)> {
    let g0 = &shards[0].gpu;
    let w = &lead.whole;
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

/// `k` rows spread over `n`: the first, the last, and evenly between.
fn spread(n: usize, k: usize) -> Vec<usize> {
    let mut rows: Vec<usize> = (0..k.max(2))
        .map(|i| i * (n - 1) / (k.max(2) - 1))
        .collect();
    rows.dedup();
    rows
}
