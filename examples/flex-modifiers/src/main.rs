//! Runs both kernels forward and backward on random data and prints each output's largest
//! difference from this crate's CPU code; exits non-zero past 1e-4.

use flex_modifiers::{Problem, capped_window_sinks, max_errors, t5_prefix_lm};
use runtime::{BlockOn, Gpu};

fn main() -> anyhow::Result<()> {
    let seq = std::env::args().nth(1).map_or(Ok(40), |s| s.parse())?;
    let gpu = Gpu::new([&t5_prefix_lm::ABI, &capped_window_sinks::ABI]).block_on()?;
    let p = Problem::new(2, seq, 4, 2);
    let rel_bias: Vec<f32> = runtime::cases::random(4 * 65, 5)
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
        let errors = max_errors(gpu_out, cpu_out);
        println!("{name} (batch 2, seq {seq}, 4 heads over 2, d 64): {errors:?}");
        ok &= errors.iter().all(|(_, e)| *e <= 1e-4);
    }
    anyhow::ensure!(ok, "the GPU and the CPU disagree past 1e-4");
    Ok(())
}
