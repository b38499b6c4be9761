//! `cargo run --release -p decode-loop -- --help`

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use attn_dsl::Dtype;
use clap::Parser;
use decode_loop::{Config, Report, run};
use runtime::Heads;

/// Prefill a prompt, then generate tokens one step at a time with the KV cache on the
/// device; print tokens/s and each step's wall time against its kernels' GPU time. Exits
/// non-zero when the result disagrees with the f64 host reference.
#[derive(Parser, Debug)]
#[command(name = "decode-loop")]
struct Args {
    /// Sequences decoded together.
    #[arg(long, default_value_t = 2)]
    slots: u32,
    /// Prompt rows per sequence.
    #[arg(long, default_value_t = 16)]
    prompt: u32,
    /// Tokens generated per sequence.
    #[arg(long, default_value_t = 32)]
    tokens: u32,
    /// Rows each sequence's cache holds (at least prompt + tokens).
    #[arg(long, default_value_t = 256)]
    capacity: u32,
    /// Query heads.
    #[arg(long, default_value_t = 8)]
    heads: u32,
    /// KV heads (a divisor of --heads).
    #[arg(long, default_value_t = 2)]
    kv_heads: u32,
    #[arg(long, default_value_t = 64)]
    head_dim: u32,
    /// The cache's (and the attention's) dtype: f32, f16 or bf16.
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    dtype: Dtype,
    /// The dtype the projections' weights are held in: f32, f16 or bf16.
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    weights: Dtype,
    /// A paged cache with pages of this many rows (contiguous without it).
    #[arg(long)]
    page_size: Option<u32>,
    /// Wait for each submission before recording the next (latency rather than
    /// throughput).
    #[arg(long)]
    sync: bool,
    /// Steps recorded into one encoder and submitted together (each step's input is the
    /// previous step's output, on the device): a submission costs the GPU a gap between
    /// steps, which this many steps share.
    #[arg(long, default_value_t = 1)]
    steps_per_submit: u32,
    /// Time each op of a step on its own (timestamps between them) and print the
    /// breakdown.
    #[arg(long)]
    profile: bool,
    /// Skip the f64 host reference (it is slow for long caches).
    #[arg(long)]
    no_check: bool,
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

fn main() -> ExitCode {
    let args = Args::parse();
    let config = Config {
        slots: args.slots,
        prompt: args.prompt,
        tokens: args.tokens,
        capacity: args.capacity,
        heads: Heads {
            n_heads: args.heads,
            n_kv_heads: args.kv_heads,
            head_dim: args.head_dim,
            head_dim_v: args.head_dim,
        },
        dtype: args.dtype,
        weights: args.weights,
        page_size: args.page_size,
        sync: args.sync,
        steps_per_submit: args.steps_per_submit,
        profile: args.profile,
        check: !args.no_check,
        seed: args.seed,
    };
    match run(&config) {
        Ok(report) => {
            print(&config, &report);
            match report.passed() {
                true => ExitCode::SUCCESS,
                false => ExitCode::FAILURE,
            }
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn print(c: &Config, r: &Report) {
    let h = c.heads;
    println!("adapter: {}", r.adapter);
    println!(
        "layer: {} slots, {} query heads over {} KV heads, head_dim {}, {} cache{}, {} rows each",
        c.slots,
        h.n_heads,
        h.n_kv_heads,
        h.head_dim,
        c.dtype.name(),
        c.page_size
            .map_or(String::new(), |p| format!(" in pages of {p}")),
        c.capacity
    );
    println!("prefill of {} rows: {:.3} ms", c.prompt, ms(r.prefill));
    let shown: Vec<usize> = (0..r.step_wall.len())
        .filter(|&t| t < 3 || t + 3 >= r.step_wall.len())
        .collect();
    for t in shown {
        let gpu = r
            .step_gpu_ms
            .as_ref()
            .map_or(String::from("n/a"), |g| format!("{:.3} ms", g[t]));
        println!(
            "step {t:>5}: cache {:>6} rows, wall {:.3} ms, GPU {gpu}",
            c.prompt + t as u32 + 1,
            ms(r.step_wall[t])
        );
    }
    let (steps, wall) = r.steady();
    let per_step = ms(wall) / steps as f64;
    println!(
        "decode: {} tokens in {:.1} ms after the first step: {:.1} tokens/s, {:.3} ms wall per step{}",
        c.slots * steps as u32,
        ms(wall),
        r.tokens_per_second(c),
        per_step,
        if c.sync {
            " (waiting each step)"
        } else {
            " (steps back to back)"
        }
    );
    if let Some(gpu) = &r.step_gpu_ms {
        let g = median(gpu.clone());
        println!(
            "GPU time per step (median): {g:.3} ms; wall / GPU: {:.2}",
            per_step / g
        );
    }
    if let (Some(gaps), false) = (&r.step_gap_ms, c.sync) {
        println!(
            "GPU time between two steps (median): {:.3} ms",
            median(gaps.clone())
        );
    }
    let later = r.step_cpu.len().saturating_sub(1).max(1) as f64;
    let cpu = |f: fn(&decode_loop::StepCpu) -> std::time::Duration| {
        r.step_cpu.iter().skip(1).map(|s| ms(f(s))).sum::<f64>() / later
    };
    println!(
        "CPU time per step (mean of the later steps): record {:.3} ms, finish {:.3}, submit {:.3}",
        cpu(|s| s.record),
        cpu(|s| s.finish),
        cpu(|s| s.submit)
    );
    if let Some(ops) = &r.op_gpu_ms {
        println!("GPU time per op (median of the later steps, timestamps between the ops):");
        for (name, ms) in decode_loop::STEP_OPS.iter().zip(ops) {
            println!("  {name:<36} {ms:.4} ms");
        }
        println!("  {:<36} {:.4} ms", "sum", ops.iter().sum::<f64>());
    }
    println!("pipelines compiled: {}", r.pipelines);
    match r.check {
        Some((err, tol)) => println!(
            "host reference (f64): max difference {err:.2e} of the largest value, tolerance {tol:.0e}: {}",
            if err <= tol { "agrees" } else { "DISAGREES" }
        ),
        None => println!("host reference: skipped"),
    }
}
