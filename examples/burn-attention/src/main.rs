//! Our attention kernels on the tensors of a Burn program (Burn's wgpu backend), on one
//! shared wgpu device, checked and timed against Burn's own attention.
//!
//! `cargo run --release -- --help` (from this directory; the crate is outside the main
//! workspace).

mod bridge;
mod share;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use attn_dsl::{Dtype, Masks};
use burn::backend::Cube;
use burn::backend::ops::ModuleOps;
use burn::tensor::module::{attention, attention_fallback};
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, DType, Device, Tensor, TensorData};
use clap::Parser;
use runtime::ops::backward::{BackwardArgs, BackwardSpec};
use runtime::ops::forward::{Forward, ForwardArgs, ForwardSpec};
use runtime::{Backward, Gpu, Heads, Schedule};

use bridge::{Binding, Placement, Region, Role, region};
use share::{Memory, Owner, share};

/// Causal f32 attention in a Burn program: our forward and backward on Burn's own wgpu
/// tensors (in place; an output that shares its buffer with another tensor of the dispatch
/// goes through a copy), on the device Burn computes on, against Burn's `attention` and its
/// autodiff backward. Exits non-zero when ours disagrees.
#[derive(Parser, Debug)]
#[command(name = "burn-attention")]
struct Args {
    #[arg(long, default_value_t = 1)]
    batch: u32,
    #[arg(long, default_value_t = 128)]
    seq: u32,
    #[arg(long, default_value_t = 4)]
    heads: u32,
    #[arg(long, default_value_t = 64)]
    head_dim: u32,
    /// Timed runs of each measurement (the median is reported).
    #[arg(long, default_value_t = 10)]
    runs: u32,
    /// Untimed runs before them.
    #[arg(long, default_value_t = 2)]
    warmup: u32,
    /// Who creates the shared device.
    #[arg(long, value_enum, default_value_t = Owner::Burn)]
    device_owner: Owner,
    /// Burn's memory pool.
    #[arg(long, value_enum, default_value_t = Memory::Adaptive)]
    memory: Memory,
    /// Build our kernels without wgpu's shader runtime checks (index clamping), as cubecl
    /// builds Burn's (it turns wgpu's bounds checks off).
    #[arg(long)]
    unchecked: bool,
    /// Largest max |ours - Burn| accepted, relative to max(1, max |Burn|) per tensor.
    #[arg(long, default_value_t = 1e-3)]
    tol: f32,
    /// Skip the backward (check and timing).
    #[arg(long)]
    forward_only: bool,
    /// Also check both sides against an f64 host reference: `auto` does where
    /// batch * heads * seq^2 * head_dim is at most 2^31 (seconds on a CPU).
    #[arg(long, value_enum, default_value_t = Check::Auto)]
    host_check: Check,
    /// Also run Burn's decomposed attention (`attention_fallback`, with autodiff) as a
    /// second Burn reference: `auto` does where its [b, h, s, s] f32 scores take at most 2 GiB.
    #[arg(long, value_enum, default_value_t = Check::Auto)]
    decomposed: Check,
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Check {
    Auto,
    On,
    Off,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("FAILED: our attention disagrees with Burn's beyond --tol");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

struct Shape {
    b: usize,
    s: usize,
    h: usize,
    d: usize,
}

impl Shape {
    fn len(&self) -> usize {
        self.b * self.s * self.h * self.d
    }
    /// [batch, seq, heads, head_dim]: our layout.
    fn bshd(&self) -> [usize; 4] {
        [self.b, self.s, self.h, self.d]
    }
    /// [batch, heads, seq, head_dim]: Burn's.
    fn bhsd(&self) -> [usize; 4] {
        [self.b, self.h, self.s, self.d]
    }
    /// [b, x, y, d] row-major to [b, y, x, d]: between the two layouts (either way).
    fn swap12(&self, data: &[f32], x: usize, y: usize) -> Vec<f32> {
        let mut out = vec![0.0; data.len()];
        for b in 0..self.b {
            for i in 0..x {
                for j in 0..y {
                    let from = ((b * x + i) * y + j) * self.d;
                    let to = ((b * y + j) * x + i) * self.d;
                    out[to..to + self.d].copy_from_slice(&data[from..from + self.d]);
                }
            }
        }
        out
    }
    fn to_bhsd(&self, data: &[f32]) -> Vec<f32> {
        self.swap12(data, self.s, self.h)
    }
    fn to_bshd(&self, data: &[f32]) -> Vec<f32> {
        self.swap12(data, self.h, self.s)
    }
}

/// Uniform in [-1, 1) from a seed (SplitMix64).
fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..n)
        .map(|_| {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

fn upload<const D: usize>(device: &Device, data: Vec<f32>, shape: [usize; D]) -> Tensor<D> {
    Tensor::from_data(TensorData::new(data, shape), (device, DType::F32))
}

fn host<const D: usize>(t: &Tensor<D>) -> Result<Vec<f32>> {
    t.to_data()
        .try_into_vec::<f32>()
        .map_err(|e| anyhow!("reading a tensor back: {e:?}"))
}

fn burn_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("Burn: {e:?}")
}

/// Max |a - b| and max |b|.
fn diff(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold((0.0f32, 0.0f32), |(d, m), (x, y)| {
        let e = if x.is_finite() && y.is_finite() {
            (x - y).abs()
        } else {
            f32::INFINITY
        };
        (d.max(e), m.max(y.abs()))
    })
}

/// Median wall time of `runs` calls of `f` after `warmup` untimed ones. `f` must return only
/// once the GPU has finished its work.
fn median(warmup: u32, runs: u32, mut f: impl FnMut() -> Result<()>) -> Result<Duration> {
    for _ in 0..warmup {
        f()?;
    }
    let mut times = Vec::with_capacity(runs as usize);
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        f()?;
        times.push(start.elapsed());
    }
    times.sort();
    Ok(times[times.len() / 2])
}

/// Waits for everything submitted on the shared queue, ours included, through Burn
/// (`Device::sync`: a flush, then `on_submitted_work_done` on the queue). Not `device.poll`
/// of our own: wgpu-core 30.0.x can panic when two threads poll one device at once (the
/// "If the queue is empty, the current submission index ... should be at least the wait
/// submission index" assert, fixed upstream in gfx-rs/wgpu#9958), and cubecl polls from its
/// own threads.
fn sync(device: &Device) -> Result<()> {
    device.sync().map_err(burn_err)
}

/// Burn's logsumexp, `[b, h, s]`: the backend op its autodiff forward uses, reached through
/// the extension API.
fn burn_logsumexp(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    opts: AttentionModuleOptions,
) -> Result<Tensor<3>> {
    let prim = |t: &Tensor<4>| {
        t.clone()
            .try_into_primitive::<Cube>()
            .map_err(|e| anyhow!("{e:?}"))
    };
    let (_, lse) =
        <Cube as ModuleOps<Cube>>::attention_with_logsumexp(prim(q)?, prim(k)?, prim(v)?, opts);
    Ok(Tensor::<3>::from_primitive::<Cube>(lse))
}

/// One output of both sides, in our layout, with the references it is judged by.
struct Value {
    name: &'static str,
    ours: Vec<f32>,
    burn: Vec<f32>,
    decomposed: Option<Vec<f32>>,
    exact: Option<Vec<f32>>,
}

impl Value {
    fn new(name: &'static str, ours: Vec<f32>, burn: Vec<f32>) -> Value {
        Value {
            name,
            ours,
            burn,
            decomposed: None,
            exact: None,
        }
    }

    /// Whether ours agrees, and the table row. Ours must agree with Burn's attention, or,
    /// where Burn's native kernels disagree with Burn's own decomposed attention, with that;
    /// and with the f64 reference where there is one.
    fn judge(&self, tol: f32) -> (bool, String) {
        let (d_burn, scale) = diff(&self.ours, &self.burn);
        let bound = tol * scale.max(1.0);
        let against = |r: &Option<Vec<f32>>, x: &[f32]| r.as_ref().map(|r| diff(x, r).0);
        let d_dec = against(&self.decomposed, &self.ours);
        let burn_dec = against(&self.decomposed, &self.burn);
        let d_exact = against(&self.exact, &self.ours);
        let burn_exact = against(&self.exact, &self.burn);
        let within = |d: Option<f32>| d.is_none_or(|d| d <= bound);
        let burn_off = burn_dec.is_some_and(|d| d > bound) || burn_exact.is_some_and(|d| d > bound);
        let (ok, verdict) = if !within(d_exact) {
            (false, "OURS OFF the f64 reference")
        } else if d_burn <= bound && within(d_dec) {
            (true, "ok")
        } else if burn_off && d_dec.is_some_and(|d| d <= bound) {
            (
                true,
                "ok vs Burn's decomposed attention; Burn's native kernel is off",
            )
        } else {
            (false, "DISAGREE")
        };
        let cell = |d: Option<f32>| d.map_or("-".to_string(), |d| format!("{d:.2e}"));
        let line = format!(
            "{:<4} {:>10.3e} {:>13.2e} {:>14} {:>14} {:>13} {:>13}  {verdict}",
            self.name,
            scale,
            d_burn,
            cell(d_dec),
            cell(burn_dec),
            cell(d_exact),
            cell(burn_exact),
        );
        (ok, line)
    }
}

/// Our forward (and backward) over bound tensors in one encoder, submitted on the shared
/// queue. Burn's pending work must have been flushed before (`Device::flush`).
struct Ours {
    forward: Forward,
    backward: Backward,
    schedule: Option<Schedule>,
}

impl Ours {
    fn record(&mut self, gpu: &Gpu, t: &Binding, backward: bool) -> Result<wgpu::CommandBuffer> {
        let mut enc = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("our attention"),
            });
        t.record_in(&mut enc);
        let fargs = ForwardArgs {
            q: t.get("q"),
            k: t.get("k"),
            v: t.get("v"),
            o: t.get("o"),
            lse: t.get("lse"),
            seg: None,
            scale: None,
            mods: Default::default(),
        };
        self.forward.record(gpu, &mut enc, &fargs)?;
        if backward {
            let bargs = BackwardArgs {
                q: t.get("q"),
                k: t.get("k"),
                v: t.get("v"),
                o: t.get("o"),
                lse: t.get("lse"),
                d_o: t.get("d_o"),
                dq: t.get("dq"),
                dk: t.get("dk"),
                dv: t.get("dv"),
                dbias: None,
                dsinks: None,
                flex_grads: &[],
                seg: None,
                scale: None,
                mods: Default::default(),
                accumulate: false,
            };
            self.schedule = Some(self.backward.record(gpu, &mut enc, &bargs, self.schedule)?);
        }
        t.record_out(&mut enc);
        Ok(enc.finish())
    }
}

/// The Burn tensors our kernels read and write, all `[batch, seq, heads, head_dim]` but
/// LSE (`[batch, seq, heads]`).
struct OurTensors {
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    d_o: Tensor<4>,
    o: Tensor<4>,
    lse: Tensor<3>,
    dq: Tensor<4>,
    dk: Tensor<4>,
    dv: Tensor<4>,
}

impl OurTensors {
    /// Each tensor's buffer, offset and pin, fetched from cubecl now.
    fn regions(&self, backward: bool) -> Result<Vec<(&'static str, Role, Region)>> {
        use Role::{Input, Output};
        let mut r = vec![
            ("q", Input, region(&self.q)?),
            ("k", Input, region(&self.k)?),
            ("v", Input, region(&self.v)?),
            ("o", Output, region(&self.o)?),
            ("lse", Output, region(&self.lse)?),
        ];
        if backward {
            r.extend([
                ("d_o", Input, region(&self.d_o)?),
                ("dq", Output, region(&self.dq)?),
                ("dk", Output, region(&self.dk)?),
                ("dv", Output, region(&self.dv)?),
            ]);
        }
        Ok(r)
    }

    /// Bound for our kernels, with Burn's pending work (the uploads and the zero fills of
    /// the outputs) flushed to the queue first.
    fn bind(&self, gpu: &Gpu, device: &Device, backward: bool) -> Result<Binding> {
        let binding = Binding::new(gpu, self.regions(backward)?)?;
        device.flush().map_err(burn_err)?;
        Ok(binding)
    }
}

fn run(a: &Args) -> Result<bool> {
    if a.head_dim % 4 != 0 || a.head_dim == 0 || a.head_dim > 256 {
        bail!("--head-dim must be a multiple of 4 from 4 to 256");
    }
    let sh = Shape {
        b: a.batch as usize,
        s: a.seq as usize,
        h: a.heads as usize,
        d: a.head_dim as usize,
    };
    let backward = !a.forward_only;

    // One device for both.
    let shared = share(a.device_owner, a.memory)?;
    let device = shared.device.clone();
    let gpu = match a.unchecked {
        true => shared.gpu.unchecked(),
        false => shared.gpu,
    };
    println!(
        "adapter:   {} ({:?}, {:?}), driver {} {}",
        shared.adapter.name,
        shared.adapter.backend,
        shared.adapter.device_type,
        shared.adapter.driver,
        shared.adapter.driver_info
    );
    println!(
        "sharing:   one wgpu {} device, created by {}; Burn device {device:?}; Burn memory \
         pool {:?}; min_storage_buffer_offset_alignment {}",
        WGPU_VERSION,
        match a.device_owner {
            Owner::Burn => "Burn (runtime attached with Gpu::from_wgpu)",
            Owner::Ours => "us (registered with Burn as a WgpuSetup)",
        },
        a.memory,
        gpu.limits().min_storage_buffer_offset_alignment,
    );
    let feats = gpu.feature_names();
    println!(
        "runtime:   {}; features: {}; shader runtime checks {}",
        gpu.describe(),
        if feats.is_empty() {
            "none".to_string()
        } else {
            feats.join(", ")
        },
        if gpu.runtime_checks() { "on" } else { "off" },
    );
    // The kernels of the default family this device can run are checked against its limits.
    for abi in runtime::kernels::FAMILY.iter().copied() {
        if gpu.supports(abi) {
            gpu.require(abi)
                .context("the shared device's limits are below what the runtime needs")?;
        }
    }
    println!(
        "problem:   f32 causal, batch {}, seq {}, heads {}, head_dim {} (ours [b, s, h, d], \
         Burn's [b, h, s, d]); {} warm-up + {} timed runs, median",
        sh.b, sh.s, sh.h, sh.d, a.warmup, a.runs
    );

    // The data, in both layouts. Each side gets contiguous tensors in its own layout, so that
    // neither pays for a transpose.
    let n = sh.len();
    let (q, k, v, d_o) = (
        random(n, a.seed),
        random(n, a.seed + 1),
        random(n, a.seed + 2),
        random(n, a.seed + 3),
    );
    let ours = OurTensors {
        q: upload(&device, q.clone(), sh.bshd()),
        k: upload(&device, k.clone(), sh.bshd()),
        v: upload(&device, v.clone(), sh.bshd()),
        d_o: upload(&device, d_o.clone(), sh.bshd()),
        o: Tensor::zeros(sh.bshd(), (&device, DType::F32)),
        lse: Tensor::zeros([sh.b, sh.s, sh.h], (&device, DType::F32)),
        dq: Tensor::zeros(sh.bshd(), (&device, DType::F32)),
        dk: Tensor::zeros(sh.bshd(), (&device, DType::F32)),
        dv: Tensor::zeros(sh.bshd(), (&device, DType::F32)),
    };
    let qb = upload(&device, sh.to_bhsd(&q), sh.bhsd());
    let kb = upload(&device, sh.to_bhsd(&k), sh.bhsd());
    let vb = upload(&device, sh.to_bhsd(&v), sh.bhsd());
    let dob = upload(&device, sh.to_bhsd(&d_o), sh.bhsd());
    device.sync().map_err(burn_err)?;

    // Our ops.
    let masks = Masks::new(true, false);
    let heads = Heads {
        n_heads: a.heads,
        n_kv_heads: a.heads,
        head_dim: a.head_dim,
        head_dim_v: a.head_dim,
    };
    let mut mine = Ours {
        forward: Forward::new(
            &gpu,
            ForwardSpec {
                head_dim: a.head_dim,
                head_dim_v: a.head_dim,
                masks,
                dtype: Dtype::F32,
            },
        )?,
        backward: Backward::new(&gpu, BackwardSpec::new(a.head_dim, masks, Dtype::F32))?,
        schedule: None,
    };

    let opts = AttentionModuleOptions {
        is_causal: true,
        ..Default::default()
    };

    // Where Burn put the tensors, and how each is bound.
    let binding = ours.bind(&gpu, &device, backward)?;
    report_placement(&binding);

    // Values: one run of ours, then Burn's.
    let cmd = mine.record(&gpu, &binding, backward)?;
    gpu.queue.submit([cmd]);
    sync(&device)?;
    let forward_kernel = mine
        .forward
        .kernel_for(&gpu, a.batch, a.seq, heads)?
        .abi()
        .name
        .to_string();
    let mut values = vec![
        Value::new(
            "O",
            host(&ours.o)?,
            sh.to_bshd(&host(&attention(
                qb.clone(),
                kb.clone(),
                vb.clone(),
                None,
                None,
                opts,
            ))?),
        ),
        Value::new(
            "LSE",
            host(&ours.lse)?,
            // [b, h, s] -> [b, s, h]: the same permutation with d = 1.
            Shape { d: 1, ..sh }.to_bshd(&host(&burn_logsumexp(&qb, &kb, &vb, opts)?)?),
        ),
    ];
    if backward {
        let (dq, dk, dv) = burn_train(&device, &qb, &kb, &vb, &dob, opts, attention)?;
        for (name, ours_t, burn_t) in [
            ("dQ", &ours.dq, dq),
            ("dK", &ours.dk, dk),
            ("dV", &ours.dv, dv),
        ] {
            values.push(Value::new(name, host(ours_t)?, sh.to_bshd(&host(&burn_t)?)));
        }
    }
    // Burn's decomposed attention (matmul, mask, softmax, matmul; autodiff through those),
    // a second reference from Burn, where its [b, h, s, s] scores fit.
    let scores = 4.0 * (sh.b * sh.h) as f64 * (sh.s as f64).powi(2);
    if match a.decomposed {
        Check::On => true,
        Check::Off => false,
        Check::Auto => scores <= 2f64.powi(31),
    } {
        let o = attention_fallback(qb.clone(), kb.clone(), vb.clone(), None, None, opts);
        values[0].decomposed = Some(sh.to_bshd(&host(&o)?));
        if backward {
            let (dq, dk, dv) = burn_train(&device, &qb, &kb, &vb, &dob, opts, attention_fallback)?;
            for (i, t) in [(2, dq), (3, dk), (4, dv)] {
                values[i].decomposed = Some(sh.to_bshd(&host(&t)?));
            }
        }
    }
    let work = (sh.b * sh.h * sh.d) as f64 * (sh.s as f64).powi(2);
    if match a.host_check {
        Check::On => true,
        Check::Off => false,
        Check::Auto => work <= 2f64.powi(31),
    } {
        let reference = host_reference(&sh, [&q, &k, &v, &d_o], backward);
        for (value, r) in values.iter_mut().zip(reference) {
            value.exact = Some(r);
        }
    }
    println!();
    println!(
        "values: max |difference| (forward kernel {forward_kernel}{}; ok: within --tol {} \
         x max(1, max |Burn|)):",
        match mine.schedule {
            Some(s) => format!(", backward schedule {s}"),
            None => String::new(),
        },
        a.tol
    );
    println!(
        "  {:<4} {:>10} {:>13} {:>14} {:>14} {:>13} {:>13}  verdict",
        "", "max |Burn|", "ours-Burn", "ours-Burn dec", "Burn-Burn dec", "ours-f64", "Burn-f64"
    );
    let mut agree = true;
    for value in &values {
        let (ok, line) = value.judge(a.tol);
        agree &= ok;
        println!("  {line}");
    }
    println!(
        "  Burn: Burn's attention (its native kernels; autodiff's backward for dQ, dK, dV). \
         Burn dec: Burn's decomposed attention_fallback. f64: a host reference."
    );

    // Speed.
    let mut rows = Vec::new();
    let burn_fwd = median(a.warmup, a.runs, || {
        let o = attention(qb.clone(), kb.clone(), vb.clone(), None, None, opts);
        device.sync().map_err(burn_err)?;
        drop(o);
        Ok(())
    })?;
    let mut timed = |backward: bool, fresh: bool| -> Result<Duration> {
        let held = match fresh {
            true => None,
            false => Some(ours.bind(&gpu, &device, backward)?),
        };
        median(a.warmup, a.runs, || {
            let fresh_binding;
            let t = match &held {
                Some(t) => t,
                None => {
                    fresh_binding = ours.bind(&gpu, &device, backward)?;
                    &fresh_binding
                }
            };
            let cmd = mine.record(&gpu, t, backward)?;
            gpu.queue.submit([cmd]);
            sync(&device)
        })
    };
    let ours_fwd = timed(false, true)?;
    let ours_fwd_held = timed(false, false)?;
    rows.push(("forward", burn_fwd, ours_fwd, ours_fwd_held));
    if backward {
        let burn_train_t = median(a.warmup, a.runs, || {
            let grads = burn_train(&device, &qb, &kb, &vb, &dob, opts, attention)?;
            drop(grads);
            Ok(())
        })?;
        let ours_train = timed(true, true)?;
        let ours_train_held = timed(true, false)?;
        rows.push((
            "forward+backward",
            burn_train_t,
            ours_train,
            ours_train_held,
        ));
    }
    println!();
    println!("wall time, median of {} runs (ms):", a.runs.max(1));
    println!(
        "  {:<17} {:>10} {:>14} {:>14} {:>9}",
        "", "Burn", "ours (wrap)", "ours (held)", "speedup"
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for (name, burn, ours_t, held) in rows {
        println!(
            "  {name:<17} {:>10.3} {:>14.3} {:>14.3} {:>8.2}x",
            ms(burn),
            ms(ours_t),
            ms(held),
            ms(burn) / ms(ours_t)
        );
    }
    println!(
        "  Burn: the op(s), then Device::sync. ours (wrap): fetch the buffers from cubecl, \
         wrap them, Device::flush, record, submit, Device::sync. ours (held): the buffers \
         wrapped once before; record, submit, Device::sync. Staging copies, where there are \
         any, are in both. speedup: Burn / ours (wrap)."
    );
    if backward {
        println!(
            "  Burn's forward+backward also runs the loss (O * dO).sum() that seeds dO, and \
             reads dQ, dK, dV out of its gradients."
        );
    }
    Ok(agree)
}

/// O, LSE and (with `backward`) dQ, dK, dV of the problem in f64 on the host, our layout.
fn host_reference(sh: &Shape, [q, k, v, d_o]: [&[f32]; 4], backward: bool) -> Vec<Vec<f32>> {
    use runtime::verify::reference::{Problem, attention, attention_backward, cast};
    let p = Problem {
        batch: sh.b,
        n_q: sh.s,
        n_k: sh.s,
        n_heads: sh.h,
        n_kv_heads: sh.h,
        head_dim: sh.d,
        scale: 1.0 / (sh.d as f64).sqrt(),
        causal: true,
        ..Problem::default()
    };
    let [q, k, v, d_o] = [q, k, v, d_o].map(cast::<f64>);
    let f = |x: Vec<f64>| x.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
    let fwd = attention(&p, &q, &k, &v);
    let mut out = vec![f(fwd.o), f(fwd.lse)];
    if backward {
        let g = attention_backward(&p, [&q, &k, &v, &d_o], None);
        out.extend([f(g.dq), f(g.dk), f(g.dv)]);
    }
    out
}

/// `burn::tensor::module::attention` or `attention_fallback`.
type AttentionFn = fn(
    Tensor<4>,
    Tensor<4>,
    Tensor<4>,
    Option<Tensor<4, Bool>>,
    Option<Tensor<4>>,
    AttentionModuleOptions,
) -> Tensor<4>;

/// Burn's autodiff forward and backward with upstream gradient dO, returning dQ, dK, dV
/// (`[b, h, s, d]`) once the device has finished.
fn burn_train(
    device: &Device,
    qb: &Tensor<4>,
    kb: &Tensor<4>,
    vb: &Tensor<4>,
    dob: &Tensor<4>,
    opts: AttentionModuleOptions,
    attend: AttentionFn,
) -> Result<(Tensor<4>, Tensor<4>, Tensor<4>)> {
    let q = qb.clone().autodiff().require_grad();
    let k = kb.clone().autodiff().require_grad();
    let v = vb.clone().autodiff().require_grad();
    let o = attend(q.clone(), k.clone(), v.clone(), None, None, opts);
    // d(sum(O * dO))/dO = dO: the upstream gradient our backward gets.
    let loss = (o * dob.clone()).sum();
    let grads = loss.backward();
    let grad = |t: &Tensor<4>| t.grad(&grads).context("Burn computed no gradient");
    let out = (grad(&q)?, grad(&k)?, grad(&v)?);
    device.sync().map_err(burn_err)?;
    Ok(out)
}

fn report_placement(binding: &Binding) {
    let mut buffers: Vec<&wgpu::Buffer> = Vec::new();
    println!();
    println!("where Burn put the tensors (cubecl get_resource), and how our kernels bind them:");
    println!(
        "  {:<4} {:<6} {:>7} {:>12} {:>12} {:>12}  binding",
        "", "role", "buffer", "buffer bytes", "offset", "bytes"
    );
    for b in &binding.bound {
        let id = match buffers.iter().position(|x| **x == b.region.buffer) {
            Some(i) => i,
            None => {
                buffers.push(&b.region.buffer);
                buffers.len() - 1
            }
        };
        println!(
            "  {:<4} {:<6} {:>7} {:>12} {:>12} {:>12}  {}",
            b.name,
            match b.role {
                Role::Input => "in",
                Role::Output => "out",
            },
            format!("#{id}"),
            b.region.buffer.size(),
            b.region.offset,
            b.region.bytes,
            match b.placement {
                Placement::InPlace => "in place (no copy)".to_string(),
                Placement::Staged(why) => format!("STAGED through a copy: {why}"),
            }
        );
    }
    let shared = binding.bound.len() - buffers.len();
    println!(
        "  {} tensors in {} buffers{}",
        binding.bound.len(),
        buffers.len(),
        if shared == 0 {
            ": each its own buffer".to_string()
        } else {
            format!(" ({shared} share a buffer with another)")
        }
    );
}

/// The wgpu both sides use (pinned in Cargo.toml; `cargo tree -i wgpu` shows one).
const WGPU_VERSION: &str = "30.0.1";
