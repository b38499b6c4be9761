//! `cargo run --release -p train-step -- --help`

use std::process::ExitCode;

use attn_dsl::Dtype;
use clap::Parser;
use runtime::{Heads, Schedule};
use train_step::{Config, run};

/// Training steps of an attention layer on device tensors: RoPE, forward, backward and
/// RoPE's backward in one encoder per step, one scalar read back at the end. Exits
/// non-zero when the gradients disagree with the f64 host reference.
#[derive(Parser, Debug)]
#[command(name = "train-step")]
struct Args {
    #[arg(long, default_value_t = 1)]
    batch: u32,
    #[arg(long, default_value_t = 128)]
    seq: u32,
    #[arg(long, default_value_t = 8)]
    heads: u32,
    #[arg(long, default_value_t = 2)]
    kv_heads: u32,
    #[arg(long, default_value_t = 64)]
    head_dim: u32,
    /// f32, f16 or bf16 (Q, K, V, O and dO; the gradients are f32).
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    dtype: Dtype,
    /// Attend to every key, not only earlier ones.
    #[arg(long)]
    bidirectional: bool,
    /// Steps run back to back.
    #[arg(long, default_value_t = 4)]
    steps: u32,
    /// A backward schedule (e.g. `recompute`, `tiled-16x8/2@64`); the planner's otherwise.
    #[arg(long)]
    schedule: Option<Schedule>,
    /// Skip the f64 host reference (slow for long sequences).
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
    let a = Args::parse();
    let c = Config {
        batch: a.batch,
        seq: a.seq,
        heads: Heads {
            n_heads: a.heads,
            n_kv_heads: a.kv_heads,
            head_dim: a.head_dim,
            head_dim_v: a.head_dim,
        },
        dtype: a.dtype,
        causal: !a.bidirectional,
        steps: a.steps,
        schedule: a.schedule,
        check: !a.no_check,
        seed: a.seed,
    };
    let r = match run(&c) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let later = (c.steps - 1).max(1);
    let wall = r.wall.as_secs_f64() * 1e3 / f64::from(later);
    println!("adapter: {}", r.adapter);
    println!(
        "step: batch {}, seq {}, {} heads over {}, head_dim {}, {}, backward {}",
        c.batch,
        c.seq,
        c.heads.n_heads,
        c.heads.n_kv_heads,
        c.heads.head_dim,
        c.dtype.name(),
        r.schedule
    );
    let gpu = r.step_gpu_ms.as_ref().map(|t| {
        let mut t = t.clone();
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    });
    println!(
        "setup (device, ops; nothing compiled): {:.1} ms; first step (its kernels compiled \
         or loaded from the pipeline caches): {:.1} ms",
        r.setup.as_secs_f64() * 1e3,
        r.first_step.as_secs_f64() * 1e3
    );
    println!(
        "{} later steps: {wall:.3} ms wall per step{}; dq[last] = {}, read back in {:.3} ms",
        c.steps - 1,
        gpu.map_or(String::new(), |g| format!(", {g:.3} ms GPU (median)")),
        r.scalar,
        r.readback.as_secs_f64() * 1e3
    );
    println!(
        "CPU per later step (median): {:.3} ms recording, {:.3} ms in Queue::submit",
        r.record_ms, r.submit_ms
    );
    match r.check {
        Some((err, tol)) => println!(
            "host reference (f64): max difference {err:.2e} of each gradient's largest value, tolerance {tol:.0e}: {}",
            if err <= tol { "agrees" } else { "DISAGREES" }
        ),
        None => println!("host reference: skipped"),
    }
    match r.passed() {
        true => ExitCode::SUCCESS,
        false => ExitCode::FAILURE,
    }
}
