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
use runtime::ops::backward::BackwardSpec;
use runtime::plan::kernels::AttentionSpec;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use attn_dsl::{BiasHeads, Dtype, KernelSpec, Op};
use clap::Parser;
use runtime::kernels::BackwardKernels;
use runtime::npy;
use runtime::tuning::Table;
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
    /// flash-C with C a configuration of runtime::tuning::backward_candidates for the
    /// tensors' head_dim (e.g. tiled-16x8/2@64; a wrong one lists those that run); or
    /// `all`: every schedule the adapter runs, each writing its gradients to a subfolder
    /// of --out named for it (`/` as `_`, e.g. tiled-16x8_2@64/dq.npy). Half-precision
    /// inputs run tiled-C, C of runtime::tuning::backward_configs, and on tensor
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
    flex: Option<(attn_dsl::flex::FlexRef, Vec<(String, Vec<f32>)>)>,
}

/// The --flex preset and the --tensor files it reads, each in its declared rank.
fn flex_values(
    args: &Args,
) -> anyhow::Result<Option<(attn_dsl::flex::FlexRef, Vec<(String, Vec<f32>)>)>> {
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
    let schedule = match args.schedule.as_str() {
        "auto" | "all" => None,
        name => Some(name.parse::<Schedule>().map_err(anyhow::Error::msg)?),
    };
    let t = load(&args)?;
    let values = ModifierValues::load(&args, &t)?;
    let flex_tensors = values.flex_tensors();
    let mods = values.mods(&args, &flex_tensors);
    let masks = mods.masks(args.causal, t.seg.is_some());
    let (d, dv) = (t.heads.head_dim, t.heads.head_dim_v);
    let forward_abi = attn_dsl::compile(
        &KernelSpec::standard("attention_forward", Op::Forward, d, masks).with_head_dim_v(dv),
    )
    .with_context(|| format!("no forward kernel for head_dim {d}, head_dim_v {dv}"))?;
    let backward =
        match &t.d_o {
            Some(_) => Some(BackwardKernels::compile((d, dv), masks).with_context(|| {
                format!("no backward kernels for head_dim {d}, head_dim_v {dv}")
            })?),
            None => None,
        };
    let mut abis = vec![&forward_abi];
    abis.extend(backward.iter().flat_map(|b| b.all()));
    let gpu = Gpu::new(abis).block_on()?;
    println!("adapter: {}", gpu.describe());
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
    std::fs::create_dir_all(&args.out).with_context(|| format!("{}", args.out.display()))?;

    let started = Instant::now();
    // The tuned flash forward where this head_dim has candidates (on tensor cores for f16
    // where the device has them), else the per-row one.
    if !gpu.supports_dtype(t.dtype) {
        bail!(
            "{} has no SHADER_F16 for float16 inputs; save them as float32",
            gpu.describe()
        );
    }
    let tuned = Table::for_gpu(&gpu)?.forward_for(&gpu, t.heads, (t.batch, t.seq), t.dtype);
    let forward = match tuned {
        Some(config) => {
            let abi = runtime::plan::kernels::flash_forward(
                AttentionSpec::new(d, masks, t.dtype).with_head_dim_v(dv),
                config,
            )
            .with_context(|| format!("flash forward {}", config.label()))?;
            println!("forward: flash {} {}", config.label(), t.dtype.name());
            Kernel::new(&gpu, &abi).block_on()?
        }
        None if t.dtype == Dtype::F32 => Kernel::new(&gpu, &forward_abi).block_on()?,
        None => bail!(
            "no {} forward for head_dim {d}; save the inputs as float32",
            t.dtype.name()
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
        scale: args.scale,
        mods,
    };
    let out = runtime::forward(&gpu, &forward, &input).block_on()?;
    let shape = |heads: u32, dim: Option<u32>| -> Vec<u64> {
        let lead = t.batched.then_some(t.batch).into_iter();
        lead.chain([t.seq, heads])
            .chain(dim)
            .map(u64::from)
            .collect()
    };
    let (q_shape, kv_shape, v_shape) = (
        shape(t.heads.n_heads, Some(d)),
        shape(t.heads.n_kv_heads, Some(d)),
        shape(t.heads.n_kv_heads, Some(dv)),
    );
    write(
        &args.out,
        "o",
        &shape(t.heads.n_heads, Some(dv)),
        &out.o,
        t.dtype,
    )?;
    // LSE is f32 in every dtype, as frameworks keep it.
    let lse_shape = shape(t.heads.n_heads, None);
    write(&args.out, "lse", &lse_shape, &out.lse, Dtype::F32)?;
    println!("forward: {:.1} ms", started.elapsed().as_secs_f64() * 1e3);

    if let (Some(d_o), Some(kernels)) = (&t.d_o, backward) {
        let started = Instant::now();
        let mut backward = Backward::from_kernels(&gpu, &[kernels])?;
        backward.deterministic = args.deterministic;
        if t.dtype != Dtype::F32 {
            backward.add(
                &gpu,
                BackwardSpec::new(d, masks, t.dtype).with_head_dim_v(dv),
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
            d_o,
            seg: t.seg.as_deref(),
            scale: args.scale,
            mods,
        };
        let runs: Vec<(Option<Schedule>, PathBuf)> = match args.schedule.as_str() {
            "all" => backward
                .schedules((d, dv), t.dtype)
                .into_iter()
                .map(|s| (Some(s), args.out.join(s.to_string().replace('/', "_"))))
                .collect(),
            _ => vec![(schedule, args.out.clone())],
        };
        for (schedule, dir) in runs {
            std::fs::create_dir_all(&dir).with_context(|| format!("{}", dir.display()))?;
            let (g, ran) = backward.run(&gpu, &input, schedule, t.dtype).block_on()?;
            write(&dir, "dq", &q_shape, &g.dq, t.dtype)?;
            write(&dir, "dk", &kv_shape, &g.dk, t.dtype)?;
            write(&dir, "dv", &v_shape, &g.dv, t.dtype)?;
            if let Some((shape, _, _)) = &values.bias {
                write(&dir, "dbias", shape, &g.dbias, Dtype::F32)?;
            }
            if values.sinks.is_some() {
                let heads = [u64::from(t.heads.n_heads)];
                write(&dir, "dsinks", &heads, &g.dsinks, Dtype::F32)?;
            }
            // A preset's tensor declared `grad` (t5-bias's rel_bias): d<name>.npy, its shape.
            if let Some((flex, _)) = &values.flex {
                for decl in &flex.get().tensors {
                    if let Some(grad) = decl.grad_name() {
                        let shape = decl.shape(t.batch, t.heads.n_heads, t.seq);
                        let shape: Vec<u64> = shape.into_iter().map(u64::from).collect();
                        let data = g.flex(&grad).unwrap_or(&[]);
                        write(&dir, &grad, &shape, data, Dtype::F32)?;
                    }
                }
            }
            println!(
                "backward ({ran}): {:.1} ms",
                started.elapsed().as_secs_f64() * 1e3
            );
        }
    }
    Ok(())
}

/// A Q/K/V-shaped tensor as `[batch, seq, heads, head_dim]` (3-D is batch 1),
/// and whether it was 4-D, in the element type `dtype` (the first tensor's: all share it).
fn read_tensor(
    path: &Path,
    dtype: Option<Dtype>,
) -> anyhow::Result<([u64; 4], bool, Vec<f32>, Dtype)> {
    let (shape, data, found) = npy::read_float(path, &[3, 4])?;
    if let Some(expected) = dtype.filter(|d| *d != found) {
        bail!(
            "{}: {} data, but q is {}; q, k, v and dO share one element type",
            path.display(),
            found.name(),
            expected.name()
        );
    }
    Ok(match shape[..] {
        [s, h, d] => ([1, s, h, d], false, data, found),
        [b, s, h, d] => ([b, s, h, d], true, data, found),
        _ => unreachable!("read_float checked the rank"),
    })
}

fn load(args: &Args) -> anyhow::Result<Tensors> {
    let (q_shape, batched, q, dtype) = read_tensor(&args.q, None)?;
    let (k_shape, k_batched, k, _) = read_tensor(&args.k, Some(dtype))?;
    let (v_shape, _, v, _) = read_tensor(&args.v, Some(dtype))?;
    let [batch, seq, n_heads, head_dim] = q_shape;
    if k_batched != batched || k_shape[..2] != q_shape[..2] || k_shape[3] != head_dim {
        bail!(
            "{}: shape {k_shape:?} does not fit q's {q_shape:?}: k needs [{batch}, {seq}, \
             kv_heads, {head_dim}] (3-D inputs are batch 1; q, k and v share their rank)",
            args.k.display()
        );
    }
    // V may be wider or narrower than K (MLA: head_dim 192, head_dim_v 128).
    if v_shape[..3] != k_shape[..3] {
        bail!(
            "{}: shape {v_shape:?} does not fit k's {k_shape:?}: v needs [{}, {}, {}, \
             head_dim_v]",
            args.v.display(),
            k_shape[0],
            k_shape[1],
            k_shape[2]
        );
    }
    let head_dim_v = v_shape[3];
    let d_o = match &args.d_o {
        Some(path) => {
            let (shape, _, data, _) = read_tensor(path, Some(dtype))?;
            let o_shape = [batch, seq, n_heads, head_dim_v];
            if shape != o_shape {
                bail!(
                    "{}: shape {shape:?}, expected o's shape {o_shape:?}",
                    path.display()
                );
            }
            Some(data)
        }
        None => None,
    };
    let seg = load_seg(args, batch, seq)?;
    let small =
        |x: u64, what: &str| u32::try_from(x).with_context(|| format!("{what} {x} is too large"));
    Ok(Tensors {
        batched,
        batch: small(batch, "batch")?,
        seq: small(seq, "seq")?,
        heads: Heads {
            n_heads: small(n_heads, "heads")?,
            n_kv_heads: small(k_shape[2], "kv_heads")?,
            head_dim: small(head_dim, "head_dim")?,
            head_dim_v: small(head_dim_v, "head_dim_v")?,
        },
        q,
        k,
        v,
        d_o,
        seg,
        dtype,
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
            let seg = runtime::attention::seg_from_cu_seqlens(&cu)
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
        runtime::attention::validate_seg(one).with_context(|| match per_sequence {
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
