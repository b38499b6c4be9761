//! Proves every kernel of the default family right on this machine's adapter: one row per
//! kernel (or backward schedule) and case, judged against an f64 CPU reference by the rule
//! of DESIGN.md §7.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use runtime::cases::{self, Case, Row, Runner};
use runtime::{Gpu, kernels};

/// Runs the default kernel family over the case matrix on the best adapter available
/// (discrete GPU, any GPU, then a CPU Vulkan adapter such as lavapipe) and compares each
/// output with an f64 CPU reference. A row passes when its max abs error is at most twice
/// that of a plain f32 CPU implementation, plus 1e-6. Backward shapes run every schedule
/// the device supports and add a row asserting the schedules agree. Exits non-zero if any
/// row fails.
#[derive(Parser)]
#[command(name = "check")]
struct Args {
    /// Run only cases whose kind, shape or masks contain this text (e.g. `decode`,
    /// `backward`, `seq=300`).
    #[arg(long)]
    filter: Option<String>,
    /// Seed for the random inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Scratch budget (bytes) the backward planner may give the split schedule. Smaller
    /// than the library's 256 MiB so that the larger shapes cross the streaming threshold
    /// while staying quick on a CPU adapter.
    #[arg(long, default_value_t = 4 << 20)]
    scratch_budget: u64,
    /// List the cases without running them.
    #[arg(long)]
    list: bool,
    /// Skip wgpu's shader runtime checks in every kernel, as `bench --unchecked` does.
    #[arg(long)]
    unchecked: bool,
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
            println!("{:<9} {:<28} {}", c.kind(), c.shape_label(), c.mask_label());
        }
        return Ok(true);
    }
    let started = Instant::now();
    let mut gpu = Gpu::new(kernels::FAMILY.iter().copied()).context("no adapter to check on")?;
    if args.unchecked {
        gpu = gpu.unchecked();
    }
    println!(
        "adapter: {}; features: {}",
        gpu.describe(),
        gpu.feature_names().join(", ")
    );
    let mut runner = Runner::new(&gpu, kernels::FAMILY.iter().copied(), &kernels::BACKWARD)?;
    runner.backward.scratch_budget = args.scratch_budget;
    println!(
        "{:<52} {:<28} {:<13} {:<60} result",
        "kernel", "shape", "masks", "max abs error <= bound, per output"
    );
    let (mut passed, mut failed, mut worst) = (0, 0, (0.0f64, String::new()));
    for (i, case) in cases.iter().enumerate() {
        let rows = cases::run_case(&gpu, &mut runner, case, args.seed + 1000 * i as u64)
            .with_context(|| {
                format!(
                    "{} {} {}",
                    case.kind(),
                    case.shape_label(),
                    case.mask_label()
                )
            })?;
        for row in rows {
            print_row(&row);
            for (name, v) in &row.verdicts {
                if v.ratio() > worst.0 {
                    worst = (
                        v.ratio(),
                        format!("{} {} {name}", row.label, case.shape_label()),
                    );
                }
            }
            if row.pass() { passed += 1 } else { failed += 1 }
        }
    }
    println!("worst error/bound: {:.3} ({})", worst.0, worst.1);
    println!(
        "{passed} passed, {failed} failed; {:.1} s on {}",
        started.elapsed().as_secs_f64(),
        gpu.describe()
    );
    Ok(failed == 0)
}

fn matches(c: &Case, filter: &str) -> bool {
    [c.kind().to_string(), c.shape_label(), c.mask_label()]
        .iter()
        .any(|s| s.contains(filter))
}

fn print_row(r: &Row) {
    let cells: Vec<String> = r
        .verdicts
        .iter()
        .map(|(n, v)| format!("{n} {:.2e}<={:.2e}", v.error, v.bound))
        .collect();
    println!(
        "{:<52} {:<28} {:<13} {:<60} {}",
        r.label,
        r.case.shape_label(),
        r.case.mask_label(),
        cells.join("  "),
        if r.pass() { "pass" } else { "FAIL" }
    );
}
