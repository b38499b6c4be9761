//! Runs both kernels forward and backward on random data and prints, per case and output,
//! the largest difference from this crate's CPU code, the bound and a verdict; exits
//! non-zero when any output is past the bound.

use std::process::ExitCode;

use flex_modifiers::{BOUND, Problem, capped_window_sinks, max_errors, t5_prefix_lm, verdict};
use runtime::{BlockOn, Gpu};

/// The CPU code's cost is quadratic in the sequence length.
const MAX_SEQ: u32 = 4096;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("error: the GPU and the CPU disagree past {BOUND:.0e} (FAIL above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The sequence length given as the one argument (40 without it).
fn seq_arg() -> anyhow::Result<u32> {
    let Some(given) = std::env::args().nth(1) else {
        return Ok(40);
    };
    match given.parse::<u32>() {
        Ok(seq) if (1..=MAX_SEQ).contains(&seq) => Ok(seq),
        _ => anyhow::bail!("SEQ `{given}`: give a sequence length from 1 to {MAX_SEQ}"),
    }
}

fn run() -> anyhow::Result<bool> {
    let seq = seq_arg()?;
    let gpu = Gpu::new([&t5_prefix_lm::ABI, &capped_window_sinks::ABI]).block_on()?;
    let p = Problem::new(2, seq, 4, 2);
    let rel_bias: Vec<f32> = runtime::verify::random(4 * 65, 5)
        .iter()
        .map(|x| 0.5 * x)
        .collect();
    let prefix = [5.0, 12.0];
    let runs = [
        (
            "t5_prefix_lm",
            p.run_gpu(
                &gpu,
                &t5_prefix_lm::ABI,
                &[("rel_bias", &rel_bias), ("prefix", &prefix)],
            )?,
            p.run_cpu(&flex_modifiers::t5_prefix_lm_cpu(&rel_bias, &prefix)),
        ),
        (
            "capped_window_sinks",
            p.run_gpu(&gpu, &capped_window_sinks::ABI, &[])?,
            p.run_cpu(&flex_modifiers::capped_window_sinks_cpu()),
        ),
    ];
    let mut ok = true;
    for (name, gpu_out, cpu_out) in &runs {
        let (lines, pass) = verdict(&max_errors(gpu_out, cpu_out));
        println!("{name} (batch 2, seq {seq}, 4 heads over 2, d 64):");
        lines.iter().for_each(|l| println!("{l}"));
        println!("  {name}: {}", if pass { "pass" } else { "FAIL" });
        ok &= pass;
    }
    Ok(ok)
}
