//! GPU-timed forward and backward (every schedule) with TFLOP/s by FlashAttention's
//! convention, on the reference shapes or one given by flags.

// The command-line tools are native; in a browser the page in examples/web runs the kernels.
#![cfg_attr(target_arch = "wasm32", no_main)]
#![cfg(not(target_arch = "wasm32"))]

use runtime::BlockOn;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use runtime::harness::bench::{self, BenchRow, BenchShape};
use runtime::{Dtype, Gpu, Heads, kernels};

/// Times each kernel and backward schedule with GPU timestamp queries (warm-up runs, then
/// the median of the timed ones) and prints ms and TFLOP/s (forward 4·S²·H·D, halved when
/// causal; backward 2.5× forward). Without shape flags it runs the seeds' production layer
/// (seq 512, 12 heads, 4 KV heads, head_dim 64, causal) and a long one (seq 4096, 16 heads,
/// 16 KV heads, head_dim 128, causal). Needs an adapter with TIMESTAMP_QUERY.
#[derive(Parser)]
#[command(name = "bench", allow_negative_numbers = true)]
struct Args {
    /// Sequence length (with any shape flag, one shape is run; unset flags take the seeds'
    /// layer's values).
    #[arg(long)]
    seq: Option<u32>,
    #[arg(long)]
    heads: Option<u32>,
    #[arg(long)]
    kv_heads: Option<u32>,
    /// One or more head_dims (e.g. `64,80,96`): one shape each.
    #[arg(long, value_delimiter = ',')]
    head_dim: Vec<u32>,
    /// Independent sequences of `--seq` rows (the kernels' batch grid axis).
    #[arg(long)]
    batch: Option<u32>,
    /// Sequences of these lengths packed along seq (e.g. `512,512,300`), each attending
    /// only to itself (FlashAttention's varlen batch); sets the shape's seq to their sum.
    #[arg(long, value_delimiter = ',', conflicts_with = "seq")]
    packed: Vec<u32>,
    /// Attend to every key instead of only earlier ones.
    #[arg(long)]
    no_causal: bool,
    /// A sliding window: each query sees the W keys up to it (or within W of it with
    /// --no-causal); kernels built with `masks: [window]`
    #[arg(long)]
    window: Option<u32>,
    /// Attention sinks: kernels built with `masks: [sinks]`, the backward followed by the
    /// kernel that writes dSinks.
    #[arg(long)]
    sinks: bool,
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// Time the fused LayerNorm + Linear instead: [ROWS, 768] -> 3072 (rows = batch · seq;
    /// 8192 is the issue's [8, 1024, 768]), forward and both backward schedules.
    #[arg(long, value_name = "ROWS")]
    layernorm: Option<u32>,
    /// Time only the projections of `--layernorm`: the Linear at each of these row counts
    /// (`1,2,8,16`: an engine's decode steps), [ROWS, 768] -> 3072, 4096 -> 4096 and 4096 ->
    /// 14336, W in f32 and each half dtype the adapter has, in GB/s of weights read and as a
    /// fraction of the copy kernel's GB/s measured first.
    #[arg(long, value_name = "ROWS", value_delimiter = ',',
        conflicts_with_all = ["layernorm", "decode", "e2e", "tune", "only", "flex"])]
    linear: Vec<u32>,
    /// Time decode instead: one query row per head against a KV cache of this many rows, the
    /// plain decode (one workgroup per head) beside split-K (slices, then a reduce), in
    /// GB/s and as a fraction of the adapter's copy bandwidth measured in the same run.
    /// --heads, --kv-heads, --head-dim and --batch apply (default 32 heads over 8, d 128).
    #[arg(long, value_name = "CACHE_LEN")]
    decode: Option<u32>,
    /// With --decode: only the continued-cache rows (n new rows over the cache, as planned
    /// and on the split-K passes), after the copy kernel.
    #[arg(long, requires = "decode")]
    continued: bool,
    /// With --decode PREFIX: cascade rows instead, n = 4, 16 and 64 sequences sharing a
    /// prefix of PREFIX rows with 512 rows each after it (`ops::cascade`: the prefix read
    /// once for all of them) beside the paged decode of the same work, after the copy kernel.
    #[arg(long, requires = "decode", conflicts_with = "continued")]
    cascade: bool,
    /// With --decode: keys per split-K slice instead of the runtime's rule (a multiple of
    /// the split kernel's key tile, 32 at head_dim 128, up to the longest slice its
    /// workgroup memory holds, 1024 at most).
    #[arg(long, value_name = "KEYS", requires = "decode")]
    slice_len: Option<u32>,
    /// With --decode: the split-K rows of only these caches (comma-separated `f32`, `f16`,
    /// `bf16`, `e4m3`, `e5m2`; default every one the adapter has), for shorter runs.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "DTYPES",
        requires = "decode"
    )]
    cache_dtypes: Vec<String>,
    /// With --decode: after each cache's staged split-K rows, its split pass cut to its
    /// phases (the key pass, the max and sum, P·V, the cache's loads): whole, none, each
    /// alone, all but each.
    #[arg(long, requires = "decode")]
    phases: bool,
    /// Time end-to-end steps through the recording API instead: decode steps at caches of
    /// 4096 and 32768 rows (32 heads over 8, d 128; f16 and f32), wall time per step
    /// against its GPU time; a 4096-row prefill; a forward + backward step at 4096 (16
    /// heads, d 128, f16). --decode CACHE_LEN narrows the decode rows to one cache.
    #[arg(long)]
    e2e: bool,
    /// Every row of the performance targets' table in one run (16 heads, causal): f16 and bf16 forwards
    /// (every tensor-core configuration) and backward schedules at seq 4096, 8192 and 16384
    /// with head_dim 128 and at 4096 with 64 and 256; f32 (every kernel) at 4096, d 128;
    /// decode at a 32768-row cache; LayerNorm + Linear at [8192, 768] -> 3072.
    #[arg(long, conflicts_with_all = ["seq", "heads", "kv_heads", "head_dim", "batch", "packed",
        "no_causal", "window", "layernorm", "decode", "e2e", "tune", "only"])]
    suite: bool,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Skip wgpu's shader runtime checks (index clamping, loop bounding) in every kernel.
    #[arg(long)]
    unchecked: bool,
    /// Check every candidate on this adapter (the check matrix for the shapes' head_dims),
    /// then write the fastest passing forward configuration and backward schedule per
    /// head_dim to this tuning table. Point ATTN_TUNING at it to use it.
    #[arg(long, value_name = "PATH")]
    tune: Option<std::path::PathBuf>,
    /// Time the forward with user-written modifiers instead: each built-in mask or score
    /// modifier beside the `mask_mod` / `score_mod` that writes it, and a sliding window
    /// with 4 sink tokens beside the dense and causal forwards (f16 and f32; --seq default
    /// 16384, --heads 16, --head-dim 128, --window 256); then the backward of a causal T5
    /// bias at a quarter of --seq, its table fixed and learnable (`grad`), beside the
    /// built-in causal backward. Between them the same variants' decodes (split-K, one row
    /// per head against a cache of --decode rows, default 32768; 32 heads over 8).
    #[arg(long, conflicts_with_all = ["suite", "e2e", "layernorm", "tune", "only"])]
    flex: bool,
    /// Time the forward with V and O rows this wide beside Q and K's --head-dim (MLA: 192
    /// and 128), and beside the same problem at one width (all at --head-dim, all at
    /// --head-dim-v), causal, in f32 and each half dtype the adapter has (--seq default
    /// 4096, --heads 16). With --decode: the decode's V and O rows this wide (its rows as
    /// they are, each beside the same cache's bytes).
    #[arg(long, conflicts_with_all = ["suite", "e2e", "layernorm", "tune", "only", "flex"])]
    head_dim_v: Option<u32>,
    /// Measure how many workgroups of 256 invocations the adapter runs at once (what
    /// --tune stores, and the planner's workgroup targets scale by), print it and exit.
    #[arg(long, conflicts_with_all = ["suite", "decode", "e2e", "layernorm", "tune"])]
    probe: bool,
    /// Time only the forward kernels, only the backward schedules, only the
    /// half-precision (f16, bf16) forwards and tiled backwards in every configuration, only
    /// their planned configurations, or the phases of the tensor-core kernels: the planned
    /// forward and the first tiled backward in each half dtype, their block loops cut to
    /// each phase alone and to all but each (the phase model of docs/performance.md). bf16
    /// rows on tensor cores include the `row_scale` passes they read.
    #[arg(long, value_enum)]
    only: Option<Only>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Only {
    Forward,
    Backward,
    Half,
    Planned,
    Phases,
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

fn shapes(args: &Args) -> anyhow::Result<Vec<BenchShape>> {
    let causal = !args.no_causal;
    let seeds = BenchShape {
        seq: 512,
        batch: 1,
        packed: None,
        heads: Heads {
            n_heads: 12,
            n_kv_heads: 4,
            head_dim: 64,
            head_dim_v: 64,
        },
        causal,
        window: args.window,
        sinks: args.sinks,
    };
    let shape_flags = args.seq.is_some()
        || args.heads.is_some()
        || args.kv_heads.is_some()
        || !args.head_dim.is_empty()
        || args.batch.is_some()
        || !args.packed.is_empty()
        || args.window.is_some()
        || args.sinks;
    if !shape_flags {
        let long = BenchShape {
            seq: 4096,
            heads: Heads {
                n_heads: 16,
                n_kv_heads: 16,
                head_dim: 128,
                head_dim_v: 128,
            },
            ..seeds.clone()
        };
        return Ok(vec![seeds, long]);
    }
    anyhow::ensure!(
        args.packed.iter().all(|&l| l > 0),
        "--packed lengths must be at least 1"
    );
    let packed = (!args.packed.is_empty()).then(|| args.packed.clone());
    let seq = match &packed {
        Some(lengths) => lengths.iter().sum(),
        None => args.seq.unwrap_or(seeds.seq),
    };
    let h = seeds.heads;
    let head_dims = match args.head_dim.is_empty() {
        true => vec![h.head_dim],
        false => args.head_dim.clone(),
    };
    Ok(head_dims
        .into_iter()
        .map(|head_dim| BenchShape {
            seq,
            batch: args.batch.unwrap_or(1),
            packed: packed.clone(),
            heads: Heads {
                n_heads: args.heads.unwrap_or(h.n_heads),
                n_kv_heads: args.kv_heads.unwrap_or(h.n_kv_heads),
                head_dim,
                head_dim_v: head_dim,
            },
            causal,
            window: args.window,
            sinks: args.sinks,
        })
        .collect())
}

/// `--flex`: every variant of `bench::flex` in f16 and f32, with its time against the
/// dense forward's and the share of pairs its mask keeps.
fn flex(gpu: &Gpu, args: &Args) -> anyhow::Result<()> {
    let seq = args.seq.unwrap_or(16384);
    let heads = args.heads.unwrap_or(16);
    let h = Heads {
        n_heads: heads,
        n_kv_heads: args.kv_heads.unwrap_or(heads),
        head_dim: args.head_dim.first().copied().unwrap_or(128),
        head_dim_v: args.head_dim.first().copied().unwrap_or(128),
    };
    let window = args.window.unwrap_or(256);
    println!("adapter: {}", gpu.describe());
    for dtype in [runtime::Dtype::F16, runtime::Dtype::F32] {
        println!(
            "forward, seq {seq}, {}/{}/{}, {}:",
            h.n_heads,
            h.n_kv_heads,
            h.head_dim,
            dtype.name()
        );
        println!(
            "  {:<64} {:>10} {:>9} {:>9}",
            "mask / modifier", "ms", "/ dense", "visible"
        );
        let rows = bench::flex::flex(gpu, h, seq, window, dtype, (args.warmup, args.runs))?;
        flex_table(&rows);
    }
    // Masks that read tensors beside the built-in masks they extend: documents over ids
    // tested per pair and skipped by a block mask made on the device, prefix-LM's range.
    for dtype in [runtime::Dtype::F16, runtime::Dtype::F32] {
        println!(
            "block masks, forward, seq {seq}, {}/{}/{}, {} (/ the first row):",
            h.n_heads,
            h.n_kv_heads,
            h.head_dim,
            dtype.name()
        );
        println!(
            "  {:<64} {:>10} {:>9} {:>9}",
            "mask / modifier", "ms", "/ causal", "visible"
        );
        // The backward in half precision only: f32's takes seconds a run at 16384 rows.
        let backward = dtype != runtime::Dtype::F32;
        let rows =
            bench::flex::block_masks(gpu, h, seq, dtype, backward, (args.warmup, args.runs))?;
        flex_table(&rows.forward);
        if backward {
            println!(
                "block masks, backward, seq {seq}, {} (/ the first row):",
                dtype.name()
            );
            println!(
                "  {:<64} {:>10} {:>9} {:>9}",
                "mask / modifier (schedule)", "ms", "/ causal", "visible"
            );
            flex_table(&rows.backward);
        }
    }
    // Decode: one row per head against a long cache, where a window's time should follow
    // the slices it visits.
    let cache_len = args.decode.unwrap_or(32768);
    let h = Heads {
        n_heads: args.heads.unwrap_or(32),
        n_kv_heads: args.kv_heads.unwrap_or(8),
        ..h
    };
    for dtype in [runtime::Dtype::F16, runtime::Dtype::F32] {
        println!(
            "decode, cache {cache_len}, {}/{}/{}, {}:",
            h.n_heads,
            h.n_kv_heads,
            h.head_dim,
            dtype.name()
        );
        println!(
            "  {:<64} {:>10} {:>9} {:>9}",
            "mask / modifier", "ms", "/ dense", "visible"
        );
        let rows = bench::flex::decode(gpu, h, cache_len, window, dtype, (args.warmup, args.runs))?;
        flex_table(&rows);
    }
    // The backward of a learnable T5 table beside the fixed one, at a quarter of the
    // sequence (its runs take longer), twice: a few-millisecond backward after the
    // pipelines' compilation needs more warm-up than --warmup for the clocks to settle.
    let seq = (seq / 4).max(64);
    let warmup = args.warmup.max(20);
    for dtype in [runtime::Dtype::F16, runtime::Dtype::F32] {
        for round in 1..=2 {
            println!(
                "backward, seq {seq}, {}/{}/{}, {}, round {round} (/ the first row):",
                h.n_heads,
                h.n_kv_heads,
                h.head_dim,
                dtype.name()
            );
            let rows = bench::flex::t5_backward(gpu, h, seq, dtype, (warmup, args.runs))?;
            flex_table(&rows);
        }
    }
    Ok(())
}

fn print_width_row(r: &bench::head_dim_v::WidthRow) {
    println!(
        "  {:<10} {:>6} {:>6} {:>10.3} {:>8.1}  {}",
        r.dtype.name(),
        r.heads.head_dim,
        r.heads.head_dim_v,
        r.ms,
        r.tflops,
        r.config
    );
}

/// `--head-dim-v`: the forward and the backward with V rows of another width, beside one
/// width.
fn widths(gpu: &Gpu, args: &Args, head_dim_v: u32) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.head_dim.len() <= 1,
        "--head-dim-v takes one --head-dim"
    );
    let seq = args.seq.unwrap_or(4096);
    let heads = args.heads.unwrap_or(16);
    let head_dim = args.head_dim.first().copied().unwrap_or(192);
    let at = |head_dim, head_dim_v| Heads {
        n_heads: heads,
        n_kv_heads: args.kv_heads.unwrap_or(heads),
        head_dim,
        head_dim_v,
    };
    println!("adapter: {}", gpu.describe());
    let mut dtypes = vec![runtime::Dtype::F32];
    dtypes.extend(gpu.half_dtypes());
    let shapes = [
        at(head_dim, head_dim_v),
        at(head_dim, head_dim),
        at(head_dim_v, head_dim_v),
    ];
    let passes: [(&str, &str, bench::head_dim_v::Timer); 2] = [
        ("forward", "2·S²·H·(d + dv) / 2", bench::head_dim_v::forward),
        (
            "backward",
            "2·S²·H·(3·d + 2·dv) / 2",
            bench::head_dim_v::backward,
        ),
    ];
    for (pass, flops, time) in passes {
        println!("{pass}, seq {seq}, {heads} heads, causal (TFLOP/s: {flops}):");
        println!(
            "  {:<10} {:>6} {:>6} {:>10} {:>8}  planned",
            "dtype", "d", "dv", "ms", "TFLOP/s"
        );
        for &dtype in &dtypes {
            for &h in &shapes {
                match time(gpu, h, seq, (true, dtype), (args.warmup, args.runs)) {
                    Ok(r) => print_width_row(&r),
                    Err(e) => println!(
                        "  {:<10} {:>6} {:>6}  {e}",
                        dtype.name(),
                        h.head_dim,
                        h.head_dim_v
                    ),
                }
            }
        }
    }
    Ok(())
}

/// Rows of `bench --flex`, each against the first.
fn flex_table(rows: &[bench::flex::FlexRow]) {
    let first = rows.first().map_or(1.0, |r| r.ms);
    for r in rows {
        println!(
            "  {:<64} {:>10.3} {:>9.3} {:>9.3}",
            r.what,
            r.ms,
            r.ms / first,
            r.visible
        );
    }
}

/// The shape flags' values, checked before any device or host buffer exists.
fn check_shape_flags(args: &Args) -> anyhow::Result<()> {
    let counts = [
        ("--seq", args.seq),
        ("--heads", args.heads),
        ("--kv-heads", args.kv_heads),
        ("--batch", args.batch),
        ("--window", args.window),
        ("--head-dim-v", args.head_dim_v),
    ];
    if let Some((flag, _)) = counts.iter().find(|(_, v)| *v == Some(0)) {
        anyhow::bail!("{flag} 0: give at least 1");
    }
    if let Some(d) = args
        .head_dim
        .iter()
        .find(|d| !(4..=256).contains(*d) || *d % 4 != 0)
    {
        anyhow::bail!("--head-dim {d}: give multiples of 4 from 4 to 256");
    }
    let seq = match args.packed.is_empty() {
        true => u64::from(args.seq.unwrap_or(512)),
        false => args.packed.iter().map(|l| u64::from(*l)).sum(),
    };
    let widest = args
        .head_dim
        .iter()
        .chain(&args.head_dim_v)
        .max()
        .unwrap_or(&128);
    let bytes = [
        seq,
        u64::from(args.batch.unwrap_or(1)),
        u64::from(args.heads.unwrap_or(16)),
        u64::from(*widest),
        4,
    ]
    .iter()
    .fold(1u64, |n, d| n.saturating_mul(*d));
    anyhow::ensure!(
        bytes <= u64::from(u32::MAX),
        "Q (--seq or --packed × --batch × --heads × --head-dim) would be {bytes} bytes, over \
         the 4 GiB one binding can hold; lower them"
    );
    Ok(())
}

fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.runs > 0, "--runs must be at least 1");
    check_shape_flags(&args)?;
    anyhow::ensure!(
        args.only.is_none() || args.tune.is_none(),
        "--tune times every kernel; drop --only"
    );
    let parts = match args.only {
        None => bench::Parts::All,
        Some(Only::Forward) => bench::Parts::Forward,
        Some(Only::Backward) => bench::Parts::Backward,
        Some(Only::Half) => bench::Parts::Half,
        Some(Only::Planned) => bench::Parts::Planned,
        Some(Only::Phases) => bench::Parts::Phases,
    };
    let mut gpu = Gpu::new(kernels::FAMILY.iter().copied()).block_on()?;
    if args.unchecked {
        gpu = gpu.unchecked();
    }
    if args.probe {
        let resident = bench::probe::resident_workgroups(&gpu)?;
        println!("adapter: {}", gpu.describe());
        println!("resident workgroups (256 invocations): {resident}");
        return Ok(());
    }
    if let Some(rows) = args.layernorm {
        return layernorm(&gpu, rows, args.runs, args.tune.as_deref());
    }
    if !args.linear.is_empty() {
        return linear(&gpu, &args);
    }
    if args.e2e {
        return e2e(&gpu, &args);
    }
    if args.flex {
        return flex(&gpu, &args);
    }
    if let Some(cache_len) = args.decode {
        return decode(&gpu, &args, cache_len);
    }
    if args.suite {
        return suite(&gpu, &args);
    }
    if let Some(head_dim_v) = args.head_dim_v {
        return widths(&gpu, &args, head_dim_v);
    }
    let shapes = shapes(&args)?;
    header(&gpu, &args);
    let mut all = Vec::new();
    for shape in shapes {
        all.extend(shape_rows(&gpu, &args, shape, parts)?);
    }
    tune(&gpu, &args, &all)
}

/// The table's header (none with `--json`).
fn header(gpu: &Gpu, args: &Args) {
    if !args.json {
        println!("adapter: {}", gpu.describe());
        println!(
            "x tile-1: speed-up over the seeds' per-query design on the same work (forward: \
             tile 1; backward: the per-row recompute split)"
        );
        println!(
            "{:<40} {:<50} {:>10} {:>10} {:>9} {:>9}  note",
            "shape", "kernel", "median ms", "min ms", "TFLOP/s", "x tile-1"
        );
    }
}

/// Times `shape`'s `parts` and prints each row as it is measured.
fn shape_rows(
    gpu: &Gpu,
    args: &Args,
    shape: BenchShape,
    parts: bench::Parts,
) -> anyhow::Result<Vec<BenchRow>> {
    let label = shape.label();
    let rows = bench::run(gpu, shape, args.warmup, args.runs, parts).context(label)?;
    for row in &rows {
        match args.json {
            true => println!("{}", json(gpu, row)),
            false => print_row(row),
        }
    }
    if !args.json {
        deterministic_cost(&rows);
    }
    Ok(rows)
}

/// Per dtype, the fastest backward that owns its outputs (what `Backward::deterministic`
/// may plan) beside the fastest of all.
fn deterministic_cost(rows: &[BenchRow]) {
    fn dtype(r: &BenchRow) -> &'static str {
        match r.kernel.rsplit(' ').next() {
            Some("f16") => "f16",
            Some("bf16") => "bf16",
            _ => "f32",
        }
    }
    for name in ["f32", "f16", "bf16"] {
        let fastest = |deterministic: bool| {
            rows.iter()
                .filter(|r| r.kernel.starts_with("backward") && dtype(r) == name)
                .filter(|r| !deterministic || r.note == bench::DETERMINISTIC)
                .filter_map(|r| Some((r.timing?.median_ms, r)))
                .min_by(|a, b| a.0.total_cmp(&b.0))
        };
        if let (Some((f, fr)), Some((d, dr))) = (fastest(false), fastest(true)) {
            println!(
                "{:<40} backward deterministic, {name}: {} {d:.3} ms, {:.2}x the fastest ({} {f:.3} ms)",
                dr.shape.label(),
                dr.kernel.trim_start_matches("backward "),
                d / f,
                fr.kernel.trim_start_matches("backward "),
            );
        }
    }
}

/// `--suite`: the attention shapes, then decode, then LayerNorm + Linear.
fn suite(gpu: &Gpu, args: &Args) -> anyhow::Result<()> {
    header(gpu, args);
    let shape = |seq, head_dim| BenchShape {
        seq,
        batch: 1,
        packed: None,
        heads: Heads {
            n_heads: 16,
            n_kv_heads: 16,
            head_dim,
            head_dim_v: head_dim,
        },
        causal: true,
        window: None,
        sinks: false,
    };
    let half = bench::Parts::Half;
    let runs = [
        (shape(4096, 128), bench::Parts::All),
        (shape(8192, 128), half),
        (shape(16384, 128), half),
        (shape(4096, 64), half),
        (shape(4096, 256), half),
    ];
    for (shape, parts) in runs {
        shape_rows(gpu, args, shape, parts)?;
    }
    decode(gpu, args, 32768)?;
    layernorm(gpu, 8192, args.runs, None)
}

/// With `--tune`, checks every candidate and writes the fastest that passed to the table.
fn tune(gpu: &Gpu, args: &Args, all: &[BenchRow]) -> anyhow::Result<()> {
    let Some(path) = &args.tune else {
        return Ok(());
    };
    // Checked after timing: on the H100 the check's many small dispatches left the
    // next few milliseconds of kernels several times slower.
    let mut head_dims: Vec<u32> = all.iter().map(|r| r.shape.heads.head_dim).collect();
    head_dims.sort_unstable();
    head_dims.dedup();
    eprintln!("tune: checking every candidate for head_dim {head_dims:?} on this adapter");
    let failed = bench::failing_kernels(gpu, &head_dims)?;
    eprintln!(
        "tune: {} kernel(s) failed the check: {failed:?}",
        failed.len()
    );
    let mut table = bench::tune(gpu, all, &failed);
    let resident = bench::probe::resident_workgroups(gpu)?;
    eprintln!("tune: the adapter runs {resident} workgroups of 256 invocations at once");
    table.resident_workgroups = Some(resident);
    // Keep the LayerNorm + Linear measurements a table already holds (written by
    // `--layernorm ROWS --tune`, a separate run).
    if path.exists() {
        table.layernorm = runtime::plan::tuning::Table::read(path)?.layernorm;
    }
    table
        .write(path)
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!(
        "tune: wrote {} (forward {:?}, backward {:?}); set ATTN_TUNING={} to use it",
        path.display(),
        table
            .forward
            .iter()
            .map(|(d, c)| (d, c.label()))
            .collect::<Vec<_>>(),
        table.backward,
        path.display()
    );
    Ok(())
}

fn print_row(r: &BenchRow) {
    let (median, min) = match r.timing {
        Some(t) => (format!("{:.3}", t.median_ms), format!("{:.3}", t.min_ms)),
        None => ("-".into(), "-".into()),
    };
    let tflops = r.tflops().map_or("-".into(), |f| format!("{f:.4}"));
    let speedup = r.speedup().map_or("-".into(), |x| format!("{x:.2}"));
    println!(
        "{:<40} {:<50} {median:>10} {min:>10} {tflops:>9} {speedup:>9}  {}",
        r.shape.label(),
        r.kernel,
        r.note
    );
}

fn json(gpu: &Gpu, r: &BenchRow) -> serde_json::Value {
    serde_json::json!({
        "adapter": gpu.describe(),
        "seq": r.shape.seq,
        "batch": r.shape.batch,
        "packed": r.shape.packed,
        "heads": r.shape.heads.n_heads,
        "kv_heads": r.shape.heads.n_kv_heads,
        "head_dim": r.shape.heads.head_dim,
        "causal": r.shape.causal,
        "kernel": r.kernel,
        "median_ms": r.timing.map(|t| t.median_ms),
        "min_ms": r.timing.map(|t| t.min_ms),
        "runs": r.timing.map(|t| t.runs),
        "tflops": r.tflops(),
        "speedup_over_tile1": r.speedup(),
        "flops": r.flops,
        "note": r.note,
    })
}

/// The fused LayerNorm + Linear rows: median time, TFLOP/s and effective bandwidth.
fn layernorm(
    gpu: &Gpu,
    rows: u32,
    runs: usize,
    tune: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    anyhow::ensure!(rows > 0, "--layernorm needs at least 1 row");
    println!("adapter: {}", gpu.describe());
    println!(
        "{:<40} {:<40} {:>10} {:>10} {:>9} {:>9}",
        "shape", "kernel", "median ms", "min ms", "TFLOP/s", "GB/s"
    );
    let shape = format!("[{rows}, 768] -> 3072");
    let measured = runtime::harness::layernorm::bench::run(gpu, rows, 768, 3072, runs)?;
    for row in &measured {
        println!(
            "{:<40} {:<40} {:>10.3} {:>10.3} {:>9.2} {:>9.1}",
            shape,
            row.label,
            row.timing.median_ms,
            row.timing.min_ms,
            row.tflops(),
            row.gbps()
        );
    }
    projections(gpu, rows, runs, None)?;
    if let (Some(path), Some(sums)) = (
        tune,
        runtime::harness::layernorm::bench::fastest_sums(&measured),
    ) {
        use runtime::plan::tuning::{Table, layernorm_key, row_sums_name};
        let mut table = Table::read_or_new(path, &gpu.info().name)?;
        let name = row_sums_name(sums);
        table
            .layernorm
            .entry(layernorm_key(768, 3072))
            .or_default()
            .insert(rows, name.to_string());
        table.write(path)?;
        println!(
            "tuned: {rows} rows of 768 -> 3072 use the {name} backward; wrote {}",
            path.display()
        );
    }
    Ok(())
}

/// `--linear`: the copy kernel, then the projections at each row count.
fn linear(gpu: &Gpu, args: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.linear.iter().all(|&r| r > 0),
        "--linear needs row counts of at least 1"
    );
    let [copy, _] = bench::copy_bandwidth(gpu, args.warmup, args.runs)?;
    println!(
        "adapter: {}; copy kernel {:.1} GB/s",
        gpu.describe(),
        copy.gbps()
    );
    println!(
        "{:<40} {:<40} {:>10} {:>10} {:>9} {:>9} {:>8}",
        "shape", "kernel", "median ms", "min ms", "TFLOP/s", "GB/s", "of copy"
    );
    for &rows in &args.linear {
        projections(gpu, rows, args.runs, Some(copy.gbps()))?;
    }
    Ok(())
}

/// The projections alone (an engine's Q, K, V and O have no LayerNorm in front), W held
/// in each dtype: GB/s of weights read (and its fraction of `copy`, the copy kernel's).
fn projections(gpu: &Gpu, rows: u32, runs: usize, copy: Option<f64>) -> anyhow::Result<()> {
    // 4096 -> 14336: an MLP's up projection, where W's bytes outweigh a dispatch's start.
    for (hidden, out) in [(768, 3072), (4096, 4096), (4096, 14336)] {
        let weights = [attn_dsl::Dtype::F32].into_iter().chain(gpu.half_dtypes());
        for dtype in weights {
            let bytes = f64::from(hidden) * f64::from(out) * f64::from(dtype.bytes());
            let limit = gpu.device.limits().max_storage_buffer_binding_size;
            if bytes > limit as f64 {
                println!(
                    "[{rows}, {hidden}] -> {out}: {} weights skipped, W is over this adapter's \
                     binding limit ({limit} bytes)",
                    dtype.name()
                );
                continue;
            }
            let t =
                runtime::harness::layernorm::bench::linear(gpu, [rows, hidden, out], dtype, runs)?;
            let gbps = bytes / (t.median_ms * 1e-3) / 1e9;
            let of_copy = copy.map_or(String::new(), |c| format!(" {:>7.0}%", 100.0 * gbps / c));
            println!(
                "{:<40} {:<40} {:>10.3} {:>10.3} {:>9.2} {:>9.1}{of_copy}",
                format!("[{rows}, {hidden}] -> {out}"),
                format!("linear, {} weights", dtype.name()),
                t.median_ms,
                t.min_ms,
                2.0 * f64::from(rows) * bytes
                    / f64::from(dtype.bytes())
                    / (t.median_ms * 1e-3)
                    / 1e12,
                gbps
            );
        }
    }
    Ok(())
}

/// The decode rows: the copy probe, then the plain and split-K decodes on one cache.
fn decode(gpu: &Gpu, args: &Args, cache_len: u32) -> anyhow::Result<()> {
    anyhow::ensure!(cache_len > 0, "--decode needs a cache of at least 1 row");
    anyhow::ensure!(args.head_dim.len() <= 1, "--decode takes one --head-dim");
    for name in &args.cache_dtypes {
        anyhow::ensure!(
            bench::DECODE_CACHES.contains(&name.as_str()),
            "unknown cache dtype `{name}` in --cache-dtypes: use {}",
            bench::DECODE_CACHES.join(", ")
        );
    }
    let shape = bench::DecodeShape {
        cache_len,
        batch: args.batch.unwrap_or(1),
        heads: Heads {
            n_heads: args.heads.unwrap_or(32),
            n_kv_heads: args.kv_heads.unwrap_or(8),
            head_dim: args.head_dim.first().copied().unwrap_or(128),
            head_dim_v: args
                .head_dim_v
                .or(args.head_dim.first().copied())
                .unwrap_or(128),
        },
    };
    let [copy, buffer_copy] = bench::copy_bandwidth(gpu, args.warmup, args.runs)?;
    if args.continued || args.cascade {
        println!(
            "adapter: {}; copy kernel {:.1} GB/s",
            gpu.describe(),
            copy.gbps()
        );
        return match args.cascade {
            true => cascade_rows(gpu, args, shape, copy.gbps()),
            false => continued_rows(gpu, args, shape, copy.gbps()),
        };
    }
    let describe = gpu.describe();
    let print = |r: &bench::DecodeRow| match args.json {
        true => println!(
            "{}",
            serde_json::json!({
                "adapter": describe,
                "shape": shape.label(),
                "kernel": r.kernel,
                "median_ms": r.timing.median_ms,
                "min_ms": r.timing.min_ms,
                "runs": r.timing.runs,
                "bytes": r.bytes,
                "gbps": r.gbps(),
                "of_copy": r.gbps() / copy.gbps(),
            })
        ),
        false => println!(
            "{:<32} {:<52} {:>10.3} {:>10.3} {:>9.1} {:>7.0}%",
            shape.label(),
            r.kernel,
            r.timing.median_ms,
            r.timing.min_ms,
            r.gbps(),
            100.0 * r.gbps() / copy.gbps()
        ),
    };
    if !args.json {
        println!("adapter: {describe}");
        println!(
            "GB/s: bytes moved (decode: K and V read, Q read, O written; copy: read + written) \
             per second of GPU time; of copy: that over the copy kernel's GB/s"
        );
        println!(
            "{:<32} {:<52} {:>10} {:>10} {:>9} {:>8}",
            "shape", "kernel", "median ms", "min ms", "GB/s", "of copy"
        );
    }
    print(&copy);
    print(&buffer_copy);
    // Each row as it is measured: the caches' uploads and the pipelines take a while.
    let which = bench::DecodeRows {
        caches: &args.cache_dtypes,
        phases: args.phases,
    };
    let rows = bench::decode(
        gpu,
        (shape, which),
        args.slice_len,
        (args.warmup, args.runs),
        print,
    )
    .context(shape.label())?;
    if args.json {
        return Ok(());
    }
    for line in fp8_speedups(&rows) {
        println!("{line}");
    }
    continued_rows(gpu, args, shape, copy.gbps())
}

/// n new rows attended over the cache (continuing it: a prompt's next chunk, a chat's next
/// turn, speculative drafts), n = 1 to 512 (from 4 rows both as the decode plans it and
/// on the split-K passes; 16 and 512 also as a ragged batch), in each half dtype, then
/// over each fp8 cache with rows in the first; `--cache-dtypes` picks among these caches
/// (all where it names none): GPU time, the cache's bytes per second and TFLOP/s
/// (4·n·cache·heads·head_dim).
fn continued_rows(
    gpu: &Gpu,
    args: &Args,
    shape: bench::DecodeShape,
    copy: f64,
) -> anyhow::Result<()> {
    let h = shape.heads;
    let Some(&dtype) = gpu.half_dtypes().first() else {
        return Ok(());
    };
    let len = shape.cache_len;
    println!(
        "{:<32} {:<40} {:>10} {:>9} {:>8} {:>9}",
        "continued cache", "rows", "GPU ms", "GB/s", "of copy", "TFLOP/s"
    );
    use bench::e2e::Continue;
    let mut runs: Vec<(u32, Continue)> = Vec::new();
    for n in [1, 4, 8, 16, 32, 64, 128, 512]
        .into_iter()
        .filter(|&n| n <= len)
    {
        runs.push((n, Continue::Planned));
        if n > 1 {
            runs.push((n, Continue::SplitK));
        }
        // The same rows as a ragged batch (an engine's layout of mixed lengths).
        if [16, 512].contains(&n) {
            runs.push((n, Continue::Ragged));
        }
    }
    // A chunk's time against its slices (one: the kernel that writes O).
    for n in [64, 512]
        .into_iter()
        .filter(|&n| n <= len && !args.continued)
    {
        for slice in [u32::MAX, 8192, 4096, 2048, 1024, 512] {
            runs.push((n, Continue::Slices(slice)));
        }
    }
    // `--cache-dtypes` picks these rows' caches too: the half dtype's where it is named.
    let named =
        |name: &str| args.cache_dtypes.is_empty() || args.cache_dtypes.iter().any(|d| d == name);
    let fp8s = [attn_dsl::Fp8::E4m3, attn_dsl::Fp8::E5m2]
        .into_iter()
        .filter(|f| named(f.name()));
    let halves = gpu.half_dtypes().into_iter().filter(|d| named(d.name()));
    let mut runs: Vec<_> = halves
        .flat_map(|half| runs.iter().map(move |&(n, how)| (half, n, None, how)))
        .collect();
    for fp8 in fp8s {
        for n in [4, 16, 64, 512].into_iter().filter(|&n| n <= len) {
            runs.push((dtype, n, Some(fp8), Continue::Planned));
            if n <= 16 {
                runs.push((dtype, n, Some(fp8), Continue::SplitK));
            }
        }
    }
    for (dtype, n, fp8, how) in runs {
        let cache = (dtype, fp8);
        let (ms, slicing) = bench::e2e::continued(gpu, h, (len, n), cache, (args.runs as u32, how))
            .context("continue")?;
        let kernel = match how {
            Continue::Slices(_) => format!("chunk, forward's tiles, {slicing} asked"),
            Continue::Planned => format!("as planned, {slicing}"),
            Continue::SplitK => format!("split-K {slicing}"),
            Continue::Ragged => format!("ragged, as planned, {slicing}"),
        };
        let elem_bytes = fp8.map_or(dtype.bytes(), |_| 1);
        let bytes = f64::from(len)
            * f64::from(h.n_kv_heads)
            * f64::from(h.head_dim + h.head_dim_v)
            * f64::from(elem_bytes);
        let gbps = bytes / (ms * 1e-3) / 1e9;
        let cache = match fp8 {
            Some(f) => format!("{} cache", f.name()),
            None => dtype.name().to_string(),
        };
        let flops = 2.0
            * f64::from(n)
            * f64::from(len)
            * f64::from(h.n_heads)
            * f64::from(h.head_dim + h.head_dim_v);
        println!(
            "{:<32} {:<40} {:>10.3} {:>9.1} {:>7.0}% {:>9.2}",
            shape.label(),
            format!("n={n}, {cache} ({kernel})"),
            ms,
            gbps,
            100.0 * gbps / copy,
            flops / (ms * 1e-3) / 1e12
        );
    }
    if !named(dtype.name()) {
        return Ok(());
    }
    // A fresh prompt's forward (and its append) on the same heads, for the chunk's TFLOP/s.
    let seq = 4096;
    let row = bench::e2e::prefill(gpu, h, seq, dtype, args.runs as u32).context("prefill")?;
    let flops = f64::from(seq)
        * f64::from(seq + 1)
        * f64::from(h.n_heads)
        * f64::from(h.head_dim + h.head_dim_v);
    println!(
        "{:<32} {:<40} {:>10.3} {:>9} {:>8} {:>9.2}",
        shape.label(),
        format!("fresh forward, causal, {seq} rows (prefill)"),
        row.gpu_ms,
        "",
        "",
        flops / (row.gpu_ms * 1e-3) / 1e12
    );
    Ok(())
}

/// Sequences sharing a prefix of the shape's cache length, 512 rows each after it, in the
/// first half dtype (else f32), then in f16 over an e4m3 cache where the device runs it:
/// the cascade against the paged decode of the same work, GPU ms and the bytes of K and V
/// each must read per second.
fn cascade_rows(
    gpu: &Gpu,
    args: &Args,
    shape: bench::DecodeShape,
    copy: f64,
) -> anyhow::Result<()> {
    let h = shape.heads;
    let dtype = gpu.half_dtypes().first().copied().unwrap_or(Dtype::F32);
    let (prefix, suffix) = (shape.cache_len, 512);
    println!(
        "{:<32} {:<34} {:>10} {:>10} {:>10} {:>10} {:>9} {:>8} {:>8}",
        "cascade",
        "sequences",
        "GPU ms",
        "prefix ms",
        "suffix ms",
        "paged ms",
        "GB/s",
        "of copy",
        "speedup"
    );
    let e4m3 = (dtype == Dtype::F16).then_some(attn_dsl::Fp8::E4m3);
    let rows = [4, 16, 64].into_iter().filter(|&n| n <= prefix);
    let fp8_rows = rows.clone().filter(|_| e4m3.is_some()).map(|n| (n, e4m3));
    for (n, kv_fp8) in rows.map(|n| (n, None)).chain(fp8_rows) {
        let cache = (dtype, kv_fp8);
        let r = match bench::cascade::row(gpu, h, (prefix, suffix, n), cache, args.runs as u32) {
            Err(runtime::Error::Input(runtime::InputError::Unsupported { what, .. }))
                if kv_fp8.is_some() =>
            {
                println!(
                    "{:<32} e4m3 cache: not on this device ({what})",
                    shape.label()
                );
                break;
            }
            r => r.context("cascade")?,
        };
        let gbps = r.cascade_bytes / (r.cascade_ms * 1e-3) / 1e9;
        let cache = kv_fp8.map_or(dtype.name().to_string(), |f| format!("{} cache", f.name()));
        println!(
            "{:<32} {:<34} {:>10.3} {:>10.3} {:>10.3} {:>10.3} {:>9.1} {:>7.0}% {:>7.2}x",
            shape.label(),
            format!("{n} x ({prefix} + {suffix}) rows, {cache}"),
            r.cascade_ms,
            r.prefix_ms,
            r.suffix_ms,
            r.paged_ms,
            gbps,
            100.0 * gbps / copy,
            r.paged_ms / r.cascade_ms
        );
    }
    println!(
        "prefix / suffix ms: the cascade's two parts each alone (the merge and the gaps are \
         the rest); GB/s: the K and V bytes the cascade must read (the prefix once, each \
         suffix once) per second; the paged decode reads the prefix once per sequence"
    );
    Ok(())
}

/// Each fp8 cache's decode over the same decode (same split-pass layout) with the cache in
/// the dtype of its Q and O.
fn fp8_speedups(rows: &[bench::DecodeRow]) -> Vec<String> {
    // A row's steady time: its `again` timing (its first one may fall in the slow window
    // right after its cache's upload), else its own.
    let steady = |at: usize| {
        rows[at + 1..]
            .iter()
            .take_while(|r| r.kernel.starts_with("  "))
            .find(|r| r.kernel.trim_start().starts_with("again"))
            .unwrap_or(&rows[at])
            .timing
            .median_ms
    };
    let mut lines = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let Some((head, dtype)) = r.kernel.split_once(bench::FP8_ROW) else {
            continue;
        };
        let fp8 = head.rsplit(", ").next().unwrap_or(head);
        let layout = fp8.rsplit(' ').next().unwrap_or("");
        let suffix = format!(", {dtype} {layout}");
        let same = rows
            .iter()
            .position(|b| b.kernel.ends_with(&suffix) && b.kernel.starts_with("decode split-K"));
        if let Some(b) = same {
            let (ours, base) = (steady(i), steady(b));
            lines.push(format!(
                "{fp8} over a {dtype} cache: {:.2}x ({ours:.3} vs {base:.3} ms, the `again` rows)",
                base / ours,
            ));
        }
    }
    lines
}

/// The end-to-end rows (see `--e2e`).
fn e2e(gpu: &Gpu, args: &Args) -> anyhow::Result<()> {
    use attn_dsl::Dtype;
    use runtime::harness::bench::e2e;
    let decode_heads = Heads {
        n_heads: args.heads.unwrap_or(32),
        n_kv_heads: args.kv_heads.unwrap_or(8),
        head_dim: args.head_dim.first().copied().unwrap_or(128),
        head_dim_v: args.head_dim.first().copied().unwrap_or(128),
    };
    let caches = match args.decode {
        Some(len) => vec![len],
        None => vec![4096, 32768],
    };
    let steps = (args.runs as u32).max(50);
    let dtypes: Vec<Dtype> = [Dtype::F16, Dtype::F32]
        .into_iter()
        .filter(|d| gpu.supports_dtype(*d))
        .collect();
    println!("adapter: {}", gpu.describe());
    println!(
        "wall: per step, steps submitted back to back; waited: each submission awaited \
         before the next is recorded; GPU: the step's commands between two timestamps; CPU: \
         recording, finishing and submitting a step; gap: the GPU's time between two steps \
         submitted back to back"
    );
    println!(
        "{:<56} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11}",
        "step", "wall ms", "waited ms", "GPU ms", "CPU ms", "gap ms", "wall / GPU"
    );
    let or_dash = |v: Option<f64>| v.map_or("-".into(), |w| format!("{w:.3}"));
    let print = |r: &e2e::Row| {
        println!(
            "{:<56} {:>10.3} {:>10} {:>10.3} {:>10.3} {:>10} {:>11.2}",
            r.what,
            r.wall_ms,
            or_dash(r.waited_ms),
            r.gpu_ms,
            r.cpu_ms,
            or_dash(r.gap_ms),
            r.wall_ms / r.gpu_ms
        );
    };
    for &cache in &caches {
        for &dtype in &dtypes {
            print(&e2e::decode(gpu, decode_heads, cache, dtype, steps, 1).context("decode")?);
        }
        // An engine that samples on the device can record several steps per submission.
        let four = e2e::decode(gpu, decode_heads, cache, dtypes[0], steps, 4);
        print(&four.context("decode")?);
    }
    let long = Heads {
        n_heads: 16,
        n_kv_heads: 16,
        head_dim: 128,
        head_dim_v: 128,
    };
    let seq = args.seq.unwrap_or(4096);
    let runs = args.runs as u32;
    let dtype = dtypes[0];
    // The projections of a step of the decode rows' heads, W in the first half dtype.
    let hidden = decode_heads.n_heads * decode_heads.head_dim;
    let kv = decode_heads.n_kv_heads * decode_heads.head_dim;
    for rows in [1, 2, 8, 16] {
        for fused in [false, true] {
            let row = e2e::projections(gpu, rows, [hidden, kv], (dtype, fused), steps);
            print(&row.context("projections")?);
        }
    }
    print(&e2e::prefill(gpu, long, seq, dtype, runs).context("prefill")?);
    print(&e2e::train_step(gpu, long, seq, dtype, runs).context("training step")?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(kernel: &str, ms: f64) -> bench::DecodeRow {
        bench::DecodeRow {
            kernel: kernel.into(),
            timing: runtime::timing::Timing {
                median_ms: ms,
                min_ms: ms,
                runs: 1,
            },
            bytes: 0.0,
        }
    }

    /// The fp8 line compares the steady timings: a slow first timing of either row (the
    /// window after its cache's upload) does not show in it.
    #[test]
    fn fp8_speedups_compare_the_again_rows() {
        let fp8 = format!(
            "decode split-K 32x1024 + reduce, e4m3 cache staged{}f16",
            bench::FP8_ROW
        );
        let rows = [
            row("decode split-K 32x1024 + reduce, f16 staged", 0.300),
            row("  part: split pass alone", 0.050),
            row("  again: the whole decode", 0.070),
            row(&fp8, 1.800),
            row("  part: split pass alone", 0.130),
            row("  again: the whole decode", 0.056),
        ];
        let lines = fp8_speedups(&rows);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with("e4m3 cache staged over a f16 cache: 1.25x"),
            "{lines:?}"
        );
        assert!(lines[0].contains("0.056 vs 0.070 ms"), "{lines:?}");
    }
}
