//! Parity with another framework on your own tensors: reads Q, K, V (and optionally dO and
//! the document starts) from `.npy` files, runs the forward and, given dO, the backward,
//! and writes O, LSE, dQ, dK, dV as `.npy`.

// The argument docs below are the tool's --help text, written as plain text for a terminal
// (`[batch, seq]`, `d<name>.npy`), not as rustdoc markup.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]
// The command-line tools are native; in a browser the page in examples/web runs the kernels.
#![cfg_attr(target_arch = "wasm32", no_main)]
#![cfg(not(target_arch = "wasm32"))]

use runtime::BlockOn;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use attn_dsl::{BiasHeads, Dtype, KernelSpec, Op};
use clap::Parser;
use runtime::harness::npy;
use runtime::kernels::BackwardKernels;
use runtime::ops::backward::BackwardSpec;
use runtime::plan::kernels::AttentionSpec;
use runtime::plan::tuning::Table;
use runtime::{
    Backward, BackwardInput, Bias, Dropout, ForwardInput, Gpu, Heads, Kernel, Modifiers, Schedule,
};

/// Runs attention on tensors from `.npy` files (float32, float16, or bf16 saved as its
/// uint16 bits with `x.view(np.uint16)`; layout [batch, seq, heads, head_dim], or [seq,
/// heads, head_dim] for one sequence; K and V may have fewer heads, for GQA) and writes
/// o.npy (Q's shape and element type) and lse.npy ([batch,] seq, heads; float32) to the
/// output folder; with --do, also dq.npy, dk.npy and dv.npy (the inputs' element type:
/// half inputs run the half-precision backward, on tensor cores where the device has
/// them). Kernels are specialized for the tensors' head_dim and masks when the tool starts.
#[derive(Parser)]
#[command(name = "attn", allow_negative_numbers = true)]
struct Args {
    #[arg(long)]
    q: PathBuf,
    #[arg(long)]
    k: PathBuf,
    #[arg(long)]
    v: PathBuf,
    /// Upstream gradient of O, same shape as Q; runs the backward.
    #[arg(long = "do")]
    d_o: Option<PathBuf>,
    /// Document start of each row (integers, seg[s] <= s, non-decreasing, counted within
    /// the sequence): [seq] for every sequence alike, or [batch, seq].
    #[arg(long, conflicts_with = "cu_seqlens")]
    seg: Option<PathBuf>,
    /// Sequences packed along seq, FlashAttention's `cu_seqlens` (1-D integers: 0, the
    /// start of each next sequence, then seq): no row sees another sequence's keys.
    #[arg(long)]
    cu_seqlens: Option<PathBuf>,
    /// Query s sees only keys j <= s.
    #[arg(long)]
    causal: bool,
    /// Score scale; defaults to 1/sqrt(head_dim).
    #[arg(long)]
    scale: Option<f32>,
    /// Backward schedule: auto (the planner), split, recompute, or streaming-C, tiled-C,
    /// flash-C with C a configuration of runtime::plan::tuning::backward_candidates for the
    /// tensors' head_dim (e.g. tiled-16x8/2@64; a wrong one lists those that run); or
    /// `all`: every schedule the adapter runs, each writing its gradients to a subfolder
    /// of --out named for it (`/` as `_`, e.g. tiled-16x8_2@64/dq.npy). Half-precision
    /// inputs run tiled-C, C of runtime::plan::tuning::backward_configs, and on tensor
    /// cores scattered-C (the dK/dV half spread over query heads).
    #[arg(long, default_value = "auto")]
    schedule: String,
    /// Folder for the outputs (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// A sliding window: each query sees the W keys up to it (with --causal), or those
    /// within W of it.
    #[arg(long, value_name = "W")]
    window: Option<u32>,
    /// ALiBi: one slope per query head (float32 [heads]), adding slope·(j − s) to scores.
    #[arg(long, value_name = "SLOPES.npy")]
    alibi: Option<PathBuf>,
    /// Attention sinks: one logit per query head (float32 [heads]) joined to every row's
    /// softmax denominator; with --do, its gradient is written to dsinks.npy.
    #[arg(long, value_name = "SINKS.npy")]
    sinks: Option<PathBuf>,
    /// An additive bias, float32 [batch,] heads or 1, seq, seq (1: shared by the heads);
    /// with --do, its gradient is written to dbias.npy in the same shape.
    #[arg(long, value_name = "BIAS.npy")]
    bias: Option<PathBuf>,
    /// Soft-capping: scores become C·tanh(score / C) before the softmax.
    #[arg(long, value_name = "C")]
    softcap: Option<f32>,
    /// Dropout on P with this probability (kept values scaled by 1 / (1 − P)), the mask
    /// drawn by Philox-4x32-10 under --seed, the same in the forward and the backward.
    #[arg(long, value_name = "P")]
    dropout: Option<f32>,
    /// The dropout mask's key.
    #[arg(long, default_value_t = 0, requires = "dropout")]
    seed: u64,
    /// A user-written modifier preset of attn_dsl::flex::library, with its parameters
    /// (`t5-bias:31`, `prefix-lm`, `window-sinks:256,4`, `sliding-window:256`, `softcap-alibi:5`,
    /// `block-diagonal:16`); its tensors come from --tensor.
    #[arg(long, value_name = "PRESET[:P,..]")]
    flex: Option<String>,
    /// A tensor the --flex preset reads, float32 in its declared shape (a u32 tensor's
    /// values as whole numbers), e.g. `--tensor rel_bias=rel_bias.npy`; repeat per tensor.
    /// With --do, the gradient of one the preset declares learnable (t5-bias's rel_bias) is
    /// written to d<name>.npy (drel_bias.npy) in the same shape.
    #[arg(long, value_name = "NAME=FILE.npy", requires = "flex")]
    tensor: Vec<String>,
    /// Bit-identical gradients run to run: only schedules that own every output (no
    /// atomic adds); a --schedule that adds by atomics is refused.
    #[arg(long, requires = "d_o")]
    deterministic: bool,
}

/// The score modifiers' values read from the flags.
struct ModifierValues {
    slopes: Option<Vec<f32>>,
    bias: Option<(Vec<u64>, BiasHeads, Vec<f32>)>,
    sinks: Option<Vec<f32>>,
    /// The --flex preset and its --tensor values by name.
    flex: Option<(attn_dsl::flex::FlexRef, Vec<FlexValues>)>,
}

/// A --tensor's name and its values.
type FlexValues = (String, Vec<f32>);

/// The --flex preset and the --tensor files it reads, each in its declared rank.
fn flex_values(args: &Args) -> anyhow::Result<Option<(attn_dsl::flex::FlexRef, Vec<FlexValues>)>> {
    let Some(spec) = &args.flex else {
        return Ok(None);
    };
    let flex = attn_dsl::flex::library::preset(spec).map_err(anyhow::Error::msg)?;
    let mut tensors = Vec::new();
    for given in &args.tensor {
        let Some((name, path)) = given.split_once('=') else {
            bail!("--tensor {given}: write NAME=FILE.npy");
        };
        let Some(decl) = flex.tensor(name) else {
            let names: Vec<&str> = flex.tensors.iter().map(|t| t.name.as_str()).collect();
            bail!(
                "--tensor {name}: preset {spec} reads {}",
                if names.is_empty() {
                    "no tensor".to_string()
                } else {
                    names.join(", ")
                }
            );
        };
        let (_, values) = npy::read_f32(Path::new(path), &[decl.dims.len()])?;
        tensors.push((name.to_string(), values));
    }
    if let Some(t) = flex
        .tensors
        .iter()
        .find(|t| !tensors.iter().any(|(n, _)| *n == t.name))
    {
        bail!(
            "preset {spec} reads {} {}: give --tensor {}=FILE.npy",
            t.name,
            t.describe(),
            t.name
        );
    }
    Ok(Some((flex.intern(), tensors)))
}

/// A `[heads]` float32 file (ALiBi's slopes, the sinks).
fn per_head(path: Option<&PathBuf>, t: &Tensors) -> anyhow::Result<Option<Vec<f32>>> {
    let Some(path) = path else {
        return Ok(None);
    };
    let (shape, values) = npy::read_f32(path, &[1])?;
    if shape != [u64::from(t.heads.n_heads)] {
        bail!(
            "{}: shape {shape:?}, expected [{}]",
            path.display(),
            t.heads.n_heads
        );
    }
    Ok(Some(values))
}

impl ModifierValues {
    fn load(args: &Args, t: &Tensors) -> anyhow::Result<ModifierValues> {
        let slopes = per_head(args.alibi.as_ref(), t)?;
        let sinks = per_head(args.sinks.as_ref(), t)?;
        let bias = match &args.bias {
            Some(path) => {
                let (shape, values) = npy::read_f32(path, &[3, 4])?;
                let (seq, n) = (u64::from(t.seq), u64::from(t.heads.n_heads));
                let heads = match shape[..] {
                    [.., h, a, b] if a == seq && b == seq && (h == n || h == 1) => h,
                    _ => bail!(
                        "{}: shape {shape:?}, expected [{}{n} or 1, {seq}, {seq}]",
                        path.display(),
                        if t.batched {
                            format!("{}, ", t.batch)
                        } else {
                            String::new()
                        }
                    ),
                };
                let batch = if shape.len() == 4 { shape[0] } else { 1 };
                if batch != u64::from(t.batch) {
                    bail!(
                        "{}: shape {shape:?} holds {batch} sequence(s), q {}: give the bias \
                         [{}, heads or 1, {seq}, {seq}]",
                        path.display(),
                        t.batch,
                        t.batch
                    );
                }
                let heads = if heads == 1 && n != 1 {
                    BiasHeads::Shared
                } else {
                    BiasHeads::PerHead
                };
                Some((shape, heads, values))
            }
            None => None,
        };
        Ok(ModifierValues {
            slopes,
            bias,
            sinks,
            flex: flex_values(args)?,
        })
    }

    /// The --tensor values by name, for [`ModifierValues::mods`].
    fn flex_tensors(&self) -> Vec<(&str, &[f32])> {
        self.flex
            .iter()
            .flat_map(|(_, t)| t.iter().map(|(n, v)| (n.as_str(), &v[..])))
            .collect()
    }

    fn mods<'a>(&'a self, args: &Args, tensors: &'a [(&'a str, &'a [f32])]) -> Modifiers<'a> {
        Modifiers {
            window: args.window,
            alibi: self.slopes.as_deref(),
            bias: self.bias.as_ref().map(|(_, heads, values)| Bias {
                values: &values[..],
                heads: *heads,
            }),
            softcap: args.softcap,
            dropout: args.dropout.map(|p| Dropout {
                p,
                seed: args.seed,
                offset: 0,
            }),
            sinks: self.sinks.as_deref(),
            flex: self.flex.as_ref().map(|(modifiers, _)| runtime::FlexOf {
                modifiers: *modifiers,
                tensors,
                block_mask: None,
            }),
        }
    }
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

struct Tensors {
    /// Whether the inputs were 4-D (outputs keep the inputs' rank).
    batched: bool,
    batch: u32,
    seq: u32,
    heads: Heads,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_o: Option<Vec<f32>>,
    seg: Option<Vec<u32>>,
    /// The element type Q, K, V (and dO) were stored in; the outputs are written in it.
    dtype: Dtype,
}

fn run(args: Args) -> anyhow::Result<()> {
    check_flags(&args)?;
    let schedule = match args.schedule.as_str() {
        "auto" | "all" => None,
        name => Some(name.parse::<Schedule>().map_err(anyhow::Error::msg)?),
    };
    check_out(&args.out)?;
    let t = load(&args)?;
    let values = ModifierValues::load(&args, &t)?;
    let flex_tensors = values.flex_tensors();
    let mods = values.mods(&args, &flex_tensors);
    let masks = mods.masks(args.causal, t.seg.is_some());
    let dims = (t.heads.head_dim, t.heads.head_dim_v);
    let forward_abi = attn_dsl::compile(
        &KernelSpec::standard("attention_forward", Op::Forward, dims.0, masks)
            .with_head_dim_v(dims.1),
    )
    .map_err(|e| kernel_error(&args, e, "forward", dims))?;
    let backward = match &t.d_o {
        Some(_) => Some(
            BackwardKernels::compile(dims, masks)
                .map_err(|e| kernel_error(&args, e, "backward", dims))?,
        ),
        None => None,
    };
    let mut abis = vec![&forward_abi];
    abis.extend(backward.iter().flat_map(|b| b.all()));
    let gpu = Gpu::new(abis).block_on()?;
    println!("adapter: {}", gpu.describe());
    print_shape(&t, masks);
    check_device(&gpu, &args, &t)?;
    let ctx = Run {
        args: &args,
        gpu: &gpu,
        t: &t,
        values: &values,
        mods,
        masks,
    };
    let out = forward(&ctx, &forward_abi)?;
    let grads = match backward {
        Some(kernels) => backward_runs(&ctx, kernels, &out, schedule)?,
        None => Vec::new(),
    };
    // Every output is written only once everything ran: a refusal leaves no files.
    write_forward(&ctx, &out)?;
    for (dir, g) in &grads {
        write_backward(&ctx, dir, g)?;
    }
    Ok(())
}

/// What the forward and the backward share.
struct Run<'a> {
    args: &'a Args,
    gpu: &'a Gpu,
    t: &'a Tensors,
    values: &'a ModifierValues,
    mods: Modifiers<'a>,
    masks: attn_dsl::Masks,
}

fn print_shape(t: &Tensors, masks: attn_dsl::Masks) {
    let (d, dv) = (t.heads.head_dim, t.heads.head_dim_v);
    println!(
        "shape: batch={} seq={} heads={} kv_heads={} head_dim={}{}; masks: causal={} documents={}",
        t.batch,
        t.seq,
        t.heads.n_heads,
        t.heads.n_kv_heads,
        d,
        match dv == d {
            true => String::new(),
            false => format!(" head_dim_v={dv}"),
        },
        masks.causal,
        t.seg
            .as_ref()
            .map_or(t.batch as usize, |s| count_documents(s, t.seq))
    );
}

/// The numeric flags, checked before any file is read or device started.
fn check_flags(args: &Args) -> anyhow::Result<()> {
    if let Some(s) = args.scale.filter(|s| !s.is_finite()) {
        bail!("--scale {s}: give a finite number (or leave it out for 1/sqrt(head_dim))");
    }
    if let Some(c) = args.softcap.filter(|c| !(c.is_finite() && *c > 0.0)) {
        bail!(
            "--softcap {c}: the cap C must be a finite number over 0 (scores become \
             C·tanh(score / C)); leave --softcap out for uncapped scores"
        );
    }
    if let Some(p) = args.dropout.filter(|p| !(0.0..1.0).contains(p)) {
        bail!("--dropout {p}: give a probability with 0 <= P < 1 (0 keeps every value)");
    }
    if args.window == Some(0) {
        bail!("--window 0: a query always sees itself; give a window of at least 1 key");
    }
    Ok(())
}

/// `--out` is a folder, or a path where one can be made.
fn check_out(out: &Path) -> anyhow::Result<()> {
    match out.exists() && !out.is_dir() {
        true => bail!("--out {}: it is a file; give a folder", out.display()),
        false => Ok(()),
    }
}

/// A kernel the flags' inputs do not fit: over WebGPU's limit of storage buffers, the advice
/// is which flags to drop (the library's is for kernel authors).
fn kernel_error(args: &Args, e: attn_dsl::DslError, op: &str, dims: (u32, u32)) -> anyhow::Error {
    let bound: Vec<&str> = [
        (args.alibi.is_some(), "--alibi"),
        (args.sinks.is_some(), "--sinks"),
        (args.bias.is_some(), "--bias"),
        (args.seg.is_some(), "--seg"),
        (args.cu_seqlens.is_some(), "--cu-seqlens"),
        (args.flex.is_some(), "--flex"),
    ]
    .into_iter()
    .filter_map(|(given, flag)| given.then_some(flag))
    .collect();
    if e.field() == Some(&attn_dsl::Field::Target) && bound.len() > 1 {
        return anyhow::anyhow!(
            "{} together need more storage buffers in one {op} kernel than WebGPU's limit \
             of 8: each is one more tensor the kernel reads; drop one of them (or run \
             those modifiers in separate calls)",
            bound.join(", ")
        );
    }
    anyhow::Error::new(e).context(format!(
        "no {op} kernel for head_dim {}, head_dim_v {}",
        dims.0, dims.1
    ))
}

/// Every tensor the run makes fits in one binding on this device; else the file to split.
fn check_device(gpu: &Gpu, args: &Args, t: &Tensors) -> anyhow::Result<()> {
    let limit = gpu
        .limits()
        .max_storage_buffer_binding_size
        .min(gpu.limits().max_buffer_size);
    let (b, s, h) = (t.batch, t.seq, t.heads);
    let rows = u64::from(b) * u64::from(s);
    let per = |heads: u32, dim: u32| rows * u64::from(heads) * u64::from(dim);
    let element = u64::from(t.dtype.bytes());
    let tensors = [
        (args.q.display().to_string(), per(h.n_heads, h.head_dim)),
        (args.k.display().to_string(), per(h.n_kv_heads, h.head_dim)),
        (
            args.v.display().to_string(),
            per(h.n_kv_heads, h.head_dim_v),
        ),
        (
            "o (q's rows, v's width)".into(),
            per(h.n_heads, h.head_dim_v),
        ),
    ];
    for (name, elements) in tensors {
        let bytes = elements * element;
        if bytes > limit {
            bail!(
                "{name}: {bytes} bytes on the device, over {}'s limit of {limit} bytes for \
                 one tensor (max_storage_buffer_binding_size); split the batch or the \
                 sequence into smaller files",
                gpu.describe()
            );
        }
    }
    Ok(())
}

/// The forward's outputs, O and LSE, on the host.
fn forward(ctx: &Run, forward_abi: &attn_dsl::KernelAbi) -> anyhow::Result<runtime::ForwardOutput> {
    let (gpu, t) = (ctx.gpu, ctx.t);
    let started = Instant::now();
    let dims = (t.heads.head_dim, t.heads.head_dim_v);
    // The tuned flash forward where this head_dim has candidates (on tensor cores for f16
    // where the device has them), else the per-row one.
    if !gpu.supports_dtype(t.dtype) {
        bail!(
            "{} has no SHADER_F16 for float16 inputs; save them as float32",
            gpu.describe()
        );
    }
    let tuned = Table::for_gpu(gpu)?.forward_for(gpu, t.heads, (t.batch, t.seq), t.dtype);
    let forward = match tuned {
        Some(config) => {
            let abi = runtime::plan::kernels::flash_forward(
                AttentionSpec::new(dims.0, ctx.masks, t.dtype).with_head_dim_v(dims.1),
                config,
            )
            .map_err(|e| kernel_error(ctx.args, e, "flash forward", dims))?;
            println!("forward: flash {} {}", config.label(), t.dtype.name());
            Kernel::new(gpu, &abi).block_on()?
        }
        None if t.dtype == Dtype::F32 => Kernel::new(gpu, forward_abi).block_on()?,
        None => bail!(
            "no {} forward for head_dim {}; save the inputs as float32",
            t.dtype.name(),
            dims.0
        ),
    };
    let input = ForwardInput {
        batch: t.batch,
        seq_len: t.seq,
        heads: t.heads,
        q: &t.q,
        k: &t.k,
        v: &t.v,
        seg: t.seg.as_deref(),
        scale: ctx.args.scale,
        mods: ctx.mods,
    };
    let out = runtime::forward(gpu, &forward, &input).block_on()?;
    println!("forward: {:.1} ms", started.elapsed().as_secs_f64() * 1e3);
    Ok(out)
}

/// The backward under each schedule asked for, with the folder its gradients go to.
fn backward_runs(
    ctx: &Run,
    kernels: BackwardKernels,
    out: &runtime::ForwardOutput,
    schedule: Option<Schedule>,
) -> anyhow::Result<Vec<(PathBuf, runtime::Gradients)>> {
    let (gpu, t, args) = (ctx.gpu, ctx.t, ctx.args);
    let dims = (t.heads.head_dim, t.heads.head_dim_v);
    let mut backward = Backward::from_kernels(gpu, &[kernels])?;
    backward.deterministic = args.deterministic;
    if t.dtype != Dtype::F32 {
        backward.add(
            gpu,
            BackwardSpec::new(dims.0, ctx.masks, t.dtype).with_head_dim_v(dims.1),
        )?;
    }
    let input = BackwardInput {
        batch: t.batch,
        seq_len: t.seq,
        heads: t.heads,
        q: &t.q,
        k: &t.k,
        v: &t.v,
        o: &out.o,
        lse: &out.lse,
        d_o: t.d_o.as_deref().unwrap_or(&[]),
        seg: t.seg.as_deref(),
        scale: args.scale,
        mods: ctx.mods,
    };
    let runs: Vec<(Option<Schedule>, PathBuf)> = match args.schedule.as_str() {
        "all" => backward
            .schedules(dims, t.dtype)
            .into_iter()
            .map(|s| (Some(s), args.out.join(s.to_string().replace('/', "_"))))
            .collect(),
        _ => vec![(schedule, args.out.clone())],
    };
    let mut grads = Vec::new();
    for (schedule, dir) in runs {
        let started = Instant::now();
        let (g, ran) = backward.run(gpu, &input, schedule, t.dtype).block_on()?;
        println!(
            "backward ({ran}): {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        grads.push((dir, g));
    }
    Ok(grads)
}

/// The output shape of `heads` rows of `dim` (none: LSE's), in the inputs' rank.
fn out_shape(t: &Tensors, heads: u32, dim: Option<u32>) -> Vec<u64> {
    let lead = t.batched.then_some(t.batch).into_iter();
    lead.chain([t.seq, heads])
        .chain(dim)
        .map(u64::from)
        .collect()
}

fn write_forward(ctx: &Run, out: &runtime::ForwardOutput) -> anyhow::Result<()> {
    let (t, dir) = (ctx.t, &ctx.args.out);
    std::fs::create_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
    let o_shape = out_shape(t, t.heads.n_heads, Some(t.heads.head_dim_v));
    write(dir, "o", &o_shape, &out.o, t.dtype)?;
    // LSE is f32 in every dtype, as frameworks keep it.
    let lse_shape = out_shape(t, t.heads.n_heads, None);
    write(dir, "lse", &lse_shape, &out.lse, Dtype::F32)
}

fn write_backward(ctx: &Run, dir: &Path, g: &runtime::Gradients) -> anyhow::Result<()> {
    let (t, values) = (ctx.t, ctx.values);
    let h = t.heads;
    std::fs::create_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
    write(
        dir,
        "dq",
        &out_shape(t, h.n_heads, Some(h.head_dim)),
        &g.dq,
        t.dtype,
    )?;
    let kv_shape = out_shape(t, h.n_kv_heads, Some(h.head_dim));
    write(dir, "dk", &kv_shape, &g.dk, t.dtype)?;
    let v_shape = out_shape(t, h.n_kv_heads, Some(h.head_dim_v));
    write(dir, "dv", &v_shape, &g.dv, t.dtype)?;
    if let Some((shape, _, _)) = &values.bias {
        write(dir, "dbias", shape, &g.dbias, Dtype::F32)?;
    }
    if values.sinks.is_some() {
        write(
            dir,
            "dsinks",
            &[u64::from(h.n_heads)],
            &g.dsinks,
            Dtype::F32,
        )?;
    }
    // A preset's tensor declared `grad` (t5-bias's rel_bias): d<name>.npy, its shape.
    if let Some((flex, _)) = &values.flex {
        for decl in &flex.get().tensors {
            if let Some(grad) = decl.grad_name() {
                let shape = decl.shape(t.batch, h.n_heads, t.seq);
                let shape: Vec<u64> = shape.into_iter().map(u64::from).collect();
                let data = g.flex(&grad).unwrap_or(&[]);
                write(dir, &grad, &shape, data, Dtype::F32)?;
            }
        }
    }
    Ok(())
}

/// A Q/K/V-shaped tensor read from a file: its dims as `[batch, seq, heads, head_dim]`
/// (3-D is batch 1), whether it was 4-D, its values and the element type they were in.
struct Read {
    dims: [u32; 4],
    batched: bool,
    data: Vec<f32>,
    dtype: Dtype,
}

/// Reads a Q/K/V-shaped file, each dimension at least 1 and under 2^32, in the element type
/// `dtype` (the first tensor's: all share it).
fn read_tensor(path: &Path, dtype: Option<Dtype>) -> anyhow::Result<Read> {
    let (shape, data, found) = npy::read_float(path, &[3, 4])?;
    if let Some(expected) = dtype.filter(|d| *d != found) {
        bail!(
            "{}: {} data, but q is {}; q, k, v and dO share one element type",
            path.display(),
            found.name(),
            expected.name()
        );
    }
    let batched = shape.len() == 4;
    let lead = [1].into_iter().filter(|_| !batched);
    let full: Vec<u64> = lead.chain(shape.iter().copied()).collect();
    let mut dims = [0u32; 4];
    for (i, (dim, name)) in full
        .iter()
        .zip(["batch", "seq", "heads", "head_dim"])
        .enumerate()
    {
        dims[i] = match u32::try_from(*dim) {
            Ok(0) | Err(_) => bail!(
                "{}: shape {shape:?} has {name} {dim}; every dimension must be 1 to {}",
                path.display(),
                u32::MAX
            ),
            Ok(d) => d,
        };
    }
    Ok(Read {
        dims,
        batched,
        data,
        dtype: found,
    })
}

fn load(args: &Args) -> anyhow::Result<Tensors> {
    let q = read_tensor(&args.q, None)?;
    let k = read_tensor(&args.k, Some(q.dtype))?;
    let v = read_tensor(&args.v, Some(q.dtype))?;
    let [batch, seq, n_heads, head_dim] = q.dims;
    if k.batched != q.batched || k.dims[..2] != q.dims[..2] || k.dims[3] != head_dim {
        bail!(
            "{}: shape {:?} does not fit q's {:?}: k needs [{batch}, {seq}, kv_heads, \
             {head_dim}] (3-D inputs are batch 1; q, k and v share their rank)",
            args.k.display(),
            k.dims,
            q.dims
        );
    }
    // V may be wider or narrower than K (MLA: head_dim 192, head_dim_v 128).
    if v.batched != q.batched || v.dims[..3] != k.dims[..3] {
        bail!(
            "{}: shape {:?} does not fit k's {:?}: v needs [{}, {}, {}, head_dim_v]",
            args.v.display(),
            v.dims,
            k.dims,
            k.dims[0],
            k.dims[1],
            k.dims[2]
        );
    }
    let head_dim_v = v.dims[3];
    let d_o = match &args.d_o {
        Some(path) => {
            let d_o = read_tensor(path, Some(q.dtype))?;
            let o_shape = [batch, seq, n_heads, head_dim_v];
            if d_o.dims != o_shape || d_o.batched != q.batched {
                bail!(
                    "{}: shape {:?}, expected o's shape {o_shape:?}",
                    path.display(),
                    d_o.dims
                );
            }
            Some(d_o.data)
        }
        None => None,
    };
    let seg = load_seg(args, u64::from(batch), u64::from(seq))?;
    Ok(Tensors {
        batched: q.batched,
        batch,
        seq,
        heads: Heads {
            n_heads,
            n_kv_heads: k.dims[2],
            head_dim,
            head_dim_v,
        },
        q: q.data,
        k: k.data,
        v: v.data,
        d_o,
        seg,
        dtype: q.dtype,
    })
}

/// `seg` for every sequence, `[batch, seq]`, from `--seg` or `--cu-seqlens`, checked
/// before any device exists (bad input costs no GPU start-up).
fn load_seg(args: &Args, batch: u64, seq: u64) -> anyhow::Result<Option<Vec<u32>>> {
    if (args.seg.is_some() || args.cu_seqlens.is_some()) && (seq == 0 || batch == 0) {
        bail!("q has {batch} sequences of {seq} rows: documents need at least one row to divide");
    }
    let (path, one_or_all) = match (&args.seg, &args.cu_seqlens) {
        (Some(path), _) => {
            let (shape, seg) = npy::read_indices(path)?;
            let fits = shape == [seq] || shape == [batch, seq];
            if !fits {
                bail!(
                    "{}: shape {shape:?}, expected [{seq}] or [{batch}, {seq}]",
                    path.display()
                );
            }
            (path, seg)
        }
        (None, Some(path)) => {
            let (shape, cu) = npy::read_indices(path)?;
            let seg = runtime::shape::seg_from_cu_seqlens(&cu)
                .filter(|_| shape.len() == 1 && cu.last().map(|&x| u64::from(x)) == Some(seq));
            let Some(seg) = seg else {
                bail!(
                    "{}: cu_seqlens must be 1-D, start at 0, never decrease and end at seq \
                     ({seq})",
                    path.display()
                );
            };
            (path, seg)
        }
        (None, None) => return Ok(None),
    };
    let per_sequence = one_or_all.len() as u64 > seq;
    for (b, one) in one_or_all.chunks(seq as usize).enumerate() {
        runtime::shape::validate_seg(one).with_context(|| match per_sequence {
            true => format!("{} (sequence {b})", path.display()),
            false => format!("{}", path.display()),
        })?;
    }
    Ok(Some(match one_or_all.len() as u64 == seq {
        true => one_or_all.repeat(batch as usize),
        false => one_or_all,
    }))
}

fn write(dir: &Path, name: &str, shape: &[u64], data: &[f32], dtype: Dtype) -> anyhow::Result<()> {
    let path = dir.join(format!("{name}.npy"));
    npy::write_as(&path, shape, data, dtype)?;
    println!("wrote {}", path.display());
    Ok(())
}

/// Documents over every sequence of `seg` (`[batch, seq]`).
fn count_documents(seg: &[u32], seq: u32) -> usize {
    seg.chunks(seq as usize)
        .flat_map(|one| one.iter().enumerate())
        .filter(|(s, start)| **start as usize == *s)
        .count()
}
