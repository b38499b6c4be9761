//! Proves every kernel of the default family right on this machine's adapter: one row per
//! kernel and case, judged against an f64 CPU reference by the rule of DESIGN.md §7.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use runtime::cases::{self, Case, CaseResult, Family};
use runtime::{Gpu, kernels};

/// Runs the default kernel family over the case matrix on the best adapter available
/// (discrete GPU, any GPU, then a CPU Vulkan adapter such as lavapipe) and compares each
/// output with an f64 CPU reference. A case passes when its max abs error is at most twice
/// that of a plain f32 CPU implementation, plus 1e-6. Exits non-zero if any case fails.
#[derive(Parser)]
#[command(name = "check")]
struct Args {
    /// Run only cases whose kernel, shape or masks contain this text (e.g. `decode`, `seq=300`).
    #[arg(long)]
    filter: Option<String>,
    /// Seed for the random inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// List the cases without running them.
    #[arg(long)]
    list: bool,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> anyhow::Result<bool> {
    let cases: Vec<Case> = cases::default_matrix()
        .into_iter()
        .filter(|c| args.filter.as_deref().is_none_or(|f| matches(c, f)))
        .collect();
    if args.list {
        for c in &cases {
            println!(
                "{:<8} {:<28} {}",
                c.op().name(),
                c.shape_label(),
                c.mask_label()
            );
        }
        return Ok(true);
    }
    let started = Instant::now();
    let gpu = Gpu::new(kernels::FAMILY.iter().copied()).context("no adapter to check on")?;
    println!("adapter: {}", gpu.describe());
    let family = Family::new(&gpu, kernels::FAMILY.iter().copied())?;
    println!(
        "{:<22} {:<28} {:<14} {:>30} {:>30}  result",
        "kernel", "shape", "masks", "o: error / bound", "lse: error / bound"
    );
    let (mut passed, mut failed, mut worst) = (0, 0, 0.0f64);
    for (i, case) in cases.iter().enumerate() {
        let result = cases::run_case(&gpu, &family, case, args.seed + 1000 * i as u64)
            .with_context(|| format!("case {} {}", case.shape_label(), case.mask_label()))?;
        print_row(&result);
        worst = result
            .verdicts
            .iter()
            .map(|(_, v)| v.ratio())
            .fold(worst, f64::max);
        if result.pass() {
            passed += 1
        } else {
            failed += 1
        }
    }
    println!(
        "{passed} passed, {failed} failed; worst error/bound {worst:.3}; {:.1} s on {}",
        started.elapsed().as_secs_f64(),
        gpu.describe()
    );
    Ok(failed == 0)
}

fn matches(c: &Case, filter: &str) -> bool {
    let kernel = format!("attention_{}", c.op().name());
    [kernel, c.shape_label(), c.mask_label()]
        .iter()
        .any(|s| s.contains(filter))
}

fn print_row(r: &CaseResult) {
    let cell = |name: &str| {
        r.verdicts
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("-".to_string(), |(_, v)| {
                format!("{:.2e} <= {:.2e}", v.error, v.bound)
            })
    };
    println!(
        "{:<22} {:<28} {:<14} {:>30} {:>30}  {}",
        r.kernel,
        r.case.shape_label(),
        r.case.mask_label(),
        cell("o"),
        cell("lse"),
        if r.pass() { "pass" } else { "FAIL" }
    );
}
