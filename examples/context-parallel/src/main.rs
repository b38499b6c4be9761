//! `cargo run --release -p context-parallel -- --help`

use std::process::ExitCode;

use anyhow::{Result, bail};
use attn_dsl::Dtype;
use clap::Parser;
use context_parallel::{Check, Config, Phases, Report, run};
use runtime::Heads;

/// One sequence's keys over several GPUs: each device attends every query to its share of
/// the keys, the partial states are merged on device 0; the backward sums the partial dQs
/// there. Prints each phase's wall time beside the same work on one GPU, and the verdicts
/// against the f64 reference; exits non-zero when a verdict fails. With fewer GPUs than
/// --devices, devices share an adapter (a test of the split, not of its speed).
#[derive(Parser, Debug)]
#[command(name = "context-parallel")]
struct Args {
    /// Devices the keys are spread over.
    #[arg(long, default_value_t = 2)]
    devices: usize,
    /// Rows of the sequence (a multiple of 128 per device).
    #[arg(long, default_value_t = 1024)]
    seq: u32,
    #[arg(long, default_value_t = 4)]
    heads: u32,
    /// KV heads (a divisor of --heads).
    #[arg(long, default_value_t = 2)]
    kv_heads: u32,
    #[arg(long, default_value_t = 64)]
    head_dim: u32,
    /// f32, f16 or bf16.
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    dtype: Dtype,
    /// Every key visible to every query (the default is causal).
    #[arg(long)]
    no_causal: bool,
    /// The forward only.
    #[arg(long)]
    forward_only: bool,
    /// Timed runs after an untimed first one.
    #[arg(long, default_value_t = 3)]
    runs: u32,
    /// What is judged against the f64 reference: `full` (every output; small sequences),
    /// `rows:K` (K query rows; dK and dV against one GPU's), or `off`.
    #[arg(long, default_value = "rows:8", value_parser = parse_check)]
    check: Check,
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

fn parse_dtype(s: &str) -> Result<Dtype, String> {
    match s {
        "f32" => Ok(Dtype::F32),
        "f16" => Ok(Dtype::F16),
        "bf16" => Ok(Dtype::Bf16),
        _ => Err(format!("unknown dtype `{s}`; expected f32, f16 or bf16")),
    }
}

fn parse_check(s: &str) -> Result<Check, String> {
    match s {
        "off" => Ok(Check::Off),
        "full" => Ok(Check::Full),
        _ => match s.strip_prefix("rows:").map(str::parse::<usize>) {
            Some(Ok(k)) if k >= 1 => Ok(Check::Rows(k)),
            _ => Err(format!(
                "`{s}`: expected full, off or rows:K with K at least 1"
            )),
        },
    }
}

fn main() -> ExitCode {
    let a = Args::parse();
    let config = Config {
        seq: a.seq,
        heads: Heads::new(a.heads, a.kv_heads, a.head_dim),
        dtype: a.dtype,
        causal: !a.no_causal,
        devices: a.devices,
        backward: !a.forward_only,
        runs: a.runs,
        check: a.check,
        seed: a.seed,
    };
    match run(&config).and_then(|r| print(&config, &r)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn row(what: &str, one: f64, p: &Phases) {
    println!(
        "{what:<9} {one:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.1} {:>7.2}x",
        p.whole,
        p.compute,
        p.transfer,
        p.combine,
        p.bytes as f64 / 1e6,
        one / p.whole
    );
}

fn print(c: &Config, r: &Report) -> Result<()> {
    let h = c.heads;
    println!(
        "context-parallel: {} rows over {} devices ({} chunks of {}), {}/{} heads, d{}, {}, {}",
        c.seq,
        c.devices,
        r.plan.chunks(),
        r.plan.chunk,
        h.n_heads,
        h.n_kv_heads,
        h.head_dim,
        c.dtype.name(),
        if c.causal { "causal" } else { "no mask" }
    );
    for (d, a) in r.adapters.iter().enumerate() {
        println!("  device {d}: {a}, {} pairs per head", r.pairs[d]);
    }
    println!(
        "wall ms   {:>9} {:>9} {:>29} {:>9} {:>8}",
        "one GPU", "split", "alone: compute transfer combine", "MB moved", "speedup"
    );
    row("forward", r.one.0, &r.forward);
    if let (Some(one), Some(b)) = (r.one.1, &r.backward) {
        row("backward", one, b);
    }
    for (name, v) in &r.verdicts {
        println!(
            "  {name:<10} error {:.3e}  bound {:.3e}  ({:.2} of it) {}",
            v.error,
            v.bound,
            v.ratio(),
            if v.pass() { "ok" } else { "FAILED" }
        );
    }
    if let Some(d) = r.dkv_difference {
        println!(
            "  dk, dv: {d:.2e} of their scale from one GPU's (tolerance {:.0e})",
            context_parallel::DKV_TOLERANCE
        );
    }
    if !r.passed() {
        bail!("the split disagrees with the reference");
    }
    Ok(())
}
