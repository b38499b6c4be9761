//! Parity with another framework on your own tensors: reads Q, K, V (and optionally dO and
//! the document starts) from `.npy` files, runs the forward and, given dO, the backward,
//! and writes O, LSE, dQ, dK, dV as `.npy`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use attn_dsl::{KernelSpec, Masks, Op};
use clap::Parser;
use runtime::kernels::BackwardKernels;
use runtime::npy;
use runtime::tuning::{self, Table};
use runtime::{Backward, BackwardInput, ForwardInput, Gpu, Heads, Kernel, Schedule};

/// Runs attention on tensors from `.npy` files (float32, layout [seq, heads, head_dim];
/// K and V may have fewer heads, for GQA) and writes o.npy [seq, heads, head_dim] and
/// lse.npy [seq, heads] to the output folder; with --do, also dq.npy, dk.npy and dv.npy.
/// Kernels are specialized for the tensors' head_dim and masks when the tool starts.
#[derive(Parser)]
#[command(name = "attn")]
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
    /// Document start of each row (1-D integers, seg[s] <= s, non-decreasing).
    #[arg(long)]
    seg: Option<PathBuf>,
    /// Query s sees only keys j <= s.
    #[arg(long)]
    causal: bool,
    /// Score scale; defaults to 1/sqrt(head_dim).
    #[arg(long)]
    scale: Option<f32>,
    /// Backward schedule: auto (the planner), split, recompute, or streaming-N, tiled-N,
    /// flash-N (configuration N of runtime::tuning::backward_candidates).
    #[arg(long, default_value = "auto")]
    schedule: String,
    /// Folder for the outputs (created if missing).
    #[arg(long)]
    out: PathBuf,
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
    seq: u32,
    heads: Heads,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_o: Option<Vec<f32>>,
    seg: Option<Vec<u32>>,
}

fn run(args: Args) -> anyhow::Result<()> {
    let schedule = match args.schedule.as_str() {
        "auto" => None,
        name => Some(name.parse::<Schedule>().map_err(anyhow::Error::msg)?),
    };
    let t = load(&args)?;
    let masks = Masks {
        causal: args.causal,
        document: t.seg.is_some(),
    };
    let d = t.heads.head_dim;
    let forward_abi = attn_dsl::compile(&KernelSpec::standard(
        "attention_forward",
        Op::Forward,
        d,
        masks,
    ))
    .with_context(|| format!("no forward kernel for head_dim {d}"))?;
    let backward = match &t.d_o {
        Some(_) => Some(
            BackwardKernels::compile(d, masks)
                .with_context(|| format!("no backward kernels for head_dim {d}"))?,
        ),
        None => None,
    };
    let mut abis = vec![&forward_abi];
    abis.extend(backward.iter().flat_map(|b| b.all()));
    let gpu = Gpu::new(abis)?;
    println!("adapter: {}", gpu.describe());
    println!(
        "shape: seq={} heads={} kv_heads={} head_dim={}; masks: causal={} documents={}",
        t.seq,
        t.heads.n_heads,
        t.heads.n_kv_heads,
        d,
        masks.causal,
        t.seg.as_ref().map_or(1, |s| count_documents(s))
    );
    std::fs::create_dir_all(&args.out).with_context(|| format!("{}", args.out.display()))?;

    let started = Instant::now();
    // The tuned flash forward where this head_dim has candidates, else the per-row one.
    let tuned = Table::for_gpu(&gpu)?.forward(&gpu, d);
    let forward = match tuned {
        Some(config) => {
            let abi = tuning::flash_forward(d, masks, config)
                .with_context(|| format!("flash forward {}", config.label()))?;
            println!("forward: flash {}", config.label());
            Kernel::new(&gpu, &abi)?
        }
        None => Kernel::new(&gpu, &forward_abi)?,
    };
    let input = ForwardInput {
        seq_len: t.seq,
        heads: t.heads,
        q: &t.q,
        k: &t.k,
        v: &t.v,
        seg: t.seg.as_deref(),
        scale: args.scale,
    };
    let out = runtime::forward(&gpu, &forward, &input)?;
    let (s, h) = (u64::from(t.seq), u64::from(t.heads.n_heads));
    write(&args.out, "o", &[s, h, u64::from(d)], &out.o)?;
    write(&args.out, "lse", &[s, h], &out.lse)?;
    println!("forward: {:.1} ms", started.elapsed().as_secs_f64() * 1e3);

    if let (Some(d_o), Some(kernels)) = (&t.d_o, backward) {
        let started = Instant::now();
        let mut backward = Backward::new(&gpu, &[kernels])?;
        let input = BackwardInput {
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
        };
        let (g, ran) = backward.run(&gpu, &input, schedule)?;
        let kv = [s, u64::from(t.heads.n_kv_heads), u64::from(d)];
        write(&args.out, "dq", &[s, h, u64::from(d)], &g.dq)?;
        write(&args.out, "dk", &kv, &g.dk)?;
        write(&args.out, "dv", &kv, &g.dv)?;
        println!(
            "backward ({ran}): {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
    }
    Ok(())
}

fn load(args: &Args) -> anyhow::Result<Tensors> {
    let (q_shape, q) = npy::read_f32(&args.q, 3)?;
    let (k_shape, k) = npy::read_f32(&args.k, 3)?;
    let (v_shape, v) = npy::read_f32(&args.v, 3)?;
    let [seq, n_heads, head_dim] = [q_shape[0], q_shape[1], q_shape[2]];
    if k_shape[0] != seq || k_shape[2] != head_dim {
        bail!(
            "{}: shape {k_shape:?} does not fit q's {q_shape:?}: k needs [{seq}, kv_heads, {head_dim}]",
            args.k.display()
        );
    }
    if v_shape != k_shape {
        bail!(
            "{}: shape {v_shape:?}, expected k's shape {k_shape:?}",
            args.v.display()
        );
    }
    let d_o = match &args.d_o {
        Some(path) => {
            let (shape, data) = npy::read_f32(path, 3)?;
            if shape != q_shape {
                bail!(
                    "{}: shape {shape:?}, expected q's shape {q_shape:?}",
                    path.display()
                );
            }
            Some(data)
        }
        None => None,
    };
    let seg = args.seg.as_deref().map(npy::read_indices).transpose()?;
    if let (Some(seg), Some(path)) = (&seg, &args.seg) {
        // Before any device exists: bad input costs no GPU start-up.
        runtime::attention::validate_seg(seg).with_context(|| format!("{}", path.display()))?;
    }
    let small =
        |x: u64, what: &str| u32::try_from(x).with_context(|| format!("{what} {x} is too large"));
    Ok(Tensors {
        seq: small(seq, "seq")?,
        heads: Heads {
            n_heads: small(n_heads, "heads")?,
            n_kv_heads: small(k_shape[1], "kv_heads")?,
            head_dim: small(head_dim, "head_dim")?,
        },
        q,
        k,
        v,
        d_o,
        seg,
    })
}

fn write(dir: &Path, name: &str, shape: &[u64], data: &[f32]) -> anyhow::Result<()> {
    let path = dir.join(format!("{name}.npy"));
    npy::write_f32(&path, shape, data)?;
    println!("wrote {}", path.display());
    Ok(())
}

fn count_documents(seg: &[u32]) -> usize {
    seg.iter()
        .enumerate()
        .filter(|(s, start)| **start as usize == *s)
        .count()
}
