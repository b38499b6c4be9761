//! Proves every kernel of the default family right on this machine's adapter: one row per
//! kernel (or backward schedule) and case, judged against an f64 CPU reference by the rule
//! of docs/accuracy.md.

// The command-line tools are native; in a browser the page in examples/web runs the kernels.
#![cfg_attr(target_arch = "wasm32", no_main)]
#![cfg(not(target_arch = "wasm32"))]

use runtime::BlockOn;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use runtime::harness::cases::{self, Case, Row, Runner};
use runtime::harness::layernorm;
use runtime::verify::compare::Verdict;
use runtime::{Gpu, kernels};

/// Runs the default kernel family over the case matrix on the best adapter available
/// (discrete GPU, any GPU, then a CPU Vulkan adapter such as lavapipe) and compares each
/// output with an f64 CPU reference. By default a quick matrix (every op, schedule, dtype
/// and modifier at least once, small shapes: about a minute on a CPU adapter whose shader
/// cache holds the kernels, about 10 the first time); `--full` runs the whole matrix, and
/// `--filter` picks from the whole matrix. A row passes when its max abs error is at most
/// twice that of a plain f32 CPU implementation, plus 1e-6. Backward shapes run every
/// schedule the device supports and add a row asserting the schedules agree. Exits
/// non-zero if any row fails.
#[derive(Parser)]
#[command(name = "check", allow_negative_numbers = true)]
struct Args {
    /// Run the whole case matrix (211 cases; on a 2-core CPU adapter about 5 minutes with
    /// the driver's shader cache filled, over 35 the first time) instead of the quick one.
    #[arg(long)]
    full: bool,
    /// Run only cases of the whole matrix whose kind, shape or masks contain this text
    /// (e.g. `decode`, `backward`, `seq=300`); several words must each appear
    /// (`"forward seq=300"`).
    #[arg(long)]
    filter: Option<String>,
    /// Skip the first N cases of the matrix (after `--filter`): resumes a run cut short,
    /// e.g. by a machine's time limit, from the case `--list` shows on line N + 1.
    #[arg(long, default_value_t = 0)]
    skip: usize,
    /// Seed for the random inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run the case matrix and the LayerNorm and Linear rows over this many seeds (from
    /// `--seed` on). With more than one, only failing rows are printed, then the worst
    /// error/bound of each kernel and schedule over every seed, and where it was seen.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    seeds: u64,
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
    /// Add the LayerNorm + Linear at the real shape [8, 1024, 768] -> 3072 (minutes on a
    /// CPU adapter, mostly the f64 reference).
    #[arg(long)]
    layernorm_big: bool,
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
    let Some(end) = args.seed.checked_add(args.seeds) else {
        anyhow::bail!(
            "--seed {} with --seeds {} runs past seed 2^64 - 1; lower them",
            args.seed,
            args.seeds
        );
    };
    let matrix = match args.full || args.filter.is_some() {
        true => cases::full_matrix(),
        false => cases::quick_matrix(),
    };
    let cases: Vec<Case> = matrix
        .into_iter()
        .filter(|c| args.filter.as_deref().is_none_or(|f| matches(c, f)))
        .skip(args.skip)
        .collect();
    // A filter that matches nothing proves nothing: say so rather than pass.
    let layernorm_only = args.filter.as_deref().is_some_and(|f| {
        "layernorm_linear".contains(f)
            || ["linear", "weights"].iter().any(|w| f.contains(w))
            || layernorm::check::cases(args.layernorm_big)
                .iter()
                .any(|c| c.label().contains(f))
    });
    anyhow::ensure!(
        !cases.is_empty() || layernorm_only || args.list,
        "--filter {:?} (after --skip {}) matches no case: `check --list` lists the cases, and \
         every word of the filter must appear in a case's kind, shape or masks",
        args.filter.as_deref().unwrap_or(""),
        args.skip
    );
    if args.list {
        for c in &cases {
            println!("{:<9} {:<32} {}", c.kind(), c.shape_label(), c.mask_label());
        }
        return Ok(true);
    }
    let started = Instant::now();
    let mut gpu = Gpu::new(kernels::FAMILY.iter().copied())
        .block_on()
        .context("no adapter to check on")?;
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
        "{:<52} {:<32} {:<22} {:<60} result",
        "kernel", "shape", "masks", "max abs error <= bound, per output"
    );
    let (mut passed, mut failed) = (0, 0);
    let mut worst = Worst::default();
    for seed in args.seed..end {
        let (mut seed_passed, mut seed_failed) = (0, 0);
        for (i, case) in cases.iter().enumerate() {
            progress(i, cases.len(), case);
            let rows = cases::run_case(&gpu, &mut runner, case, seed + 1000 * i as u64)
                .with_context(|| {
                    format!(
                        "{} {} {} (seed {seed})",
                        case.kind(),
                        case.shape_label(),
                        case.mask_label()
                    )
                })?;
            for row in rows {
                if args.seeds <= 1 || !row.pass() {
                    print_row(&row);
                }
                worst.add(&row, seed);
                if row.pass() {
                    seed_passed += 1
                } else {
                    seed_failed += 1
                }
            }
        }
        if args.seeds > 1 {
            println!("seed {seed}: {seed_passed} passed, {seed_failed} failed");
        }
        passed += seed_passed;
        failed += seed_failed;
    }
    let (ln_passed, ln_failed) = layernorm_rows(&gpu, &args, args.seed..end)?;
    passed += ln_passed;
    failed += ln_failed;
    worst.print(args.seeds > 1);
    // The pipelines compiled tell a first run on a CPU adapter (most of it the driver's
    // compile) from a later one, which finds them in the driver's shader cache.
    println!(
        "{passed} passed, {failed} failed; {:.1} s on {}; {} pipelines compiled",
        started.elapsed().as_secs_f64(),
        gpu.describe(),
        gpu.pipelines_created()
    );
    Ok(failed == 0)
}

/// The worst error/bound of each kernel or schedule (a row's label, less the planner's
/// mark), with where it was seen.
#[derive(Default)]
struct Worst {
    by_label: Vec<(String, f64, String)>,
}

impl Worst {
    fn add(&mut self, row: &Row, seed: u64) {
        let label = row.label.replace(" (planned)", "");
        for (name, v) in &row.verdicts {
            let at = format!(
                "{} {} {name}, seed {seed}",
                row.case.shape_label(),
                row.case.mask_label()
            );
            match self.by_label.iter_mut().find(|(l, _, _)| *l == label) {
                Some(entry) if v.ratio() > entry.1 => (entry.1, entry.2) = (v.ratio(), at),
                Some(_) => {}
                None => self.by_label.push((label.clone(), v.ratio(), at)),
            }
        }
    }

    /// The overall worst, and with `each` the worst of every label.
    fn print(&self, each: bool) {
        if each {
            println!(
                "\n{:<52} {:>11}  where",
                "kernel or schedule", "error/bound"
            );
            for (label, ratio, at) in &self.by_label {
                println!("{label:<52} {ratio:>11.3}  {at}");
            }
        }
        let top = self.by_label.iter().max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((label, ratio, at)) = top {
            println!("worst error/bound: {ratio:.3} ({label}, {at})");
        }
    }
}

/// The fused LayerNorm + Linear rows and the few-rows Linear's (not attention cases, so
/// not in the case matrix) at each seed, with the worst error/bound of each output over
/// its rows; over several seeds only the failing rows are printed, as the matrix's are.
fn layernorm_rows(
    gpu: &Gpu,
    args: &Args,
    seeds: std::ops::Range<u64>,
) -> anyhow::Result<(u32, u32)> {
    let wanted = |label: &str, shape: &str| {
        args.filter
            .as_deref()
            .is_none_or(|f| label.contains(f) || shape.contains(f))
    };
    let (mut passed, mut failed) = (0, 0);
    // Each output's worst error/bound, and where (shape and seed) it was seen.
    let mut worst: Vec<(String, f64, String)> = Vec::new();
    // Each row printed as it is judged (the real layer's shape takes minutes).
    let mut report = |row: layernorm::check::LnRow, seed: u64| {
        if args.seeds <= 1 || !row.pass() {
            print_cells(&row.label, &row.case.label(), "-", &row.verdicts);
        }
        for (n, v) in &row.verdicts {
            let key = format!("{} {n}", row.label);
            let at = format!("{}, seed {seed}", row.case.label());
            match worst.iter_mut().find(|(k, _, _)| *k == key) {
                Some(w) if v.ratio() > w.1 => (w.1, w.2) = (v.ratio(), at),
                Some(_) => {}
                None => worst.push((key, v.ratio(), at)),
            }
        }
        if row.pass() {
            passed += 1;
        } else {
            failed += 1;
        }
    };
    // A filter may name the Linear's rows (`linear`, `f16 weights`) or a shape.
    let any_linear = args
        .filter
        .as_deref()
        .is_none_or(|f| ["linear", "weights", "["].iter().any(|w| f.contains(w)));
    for seed in seeds {
        for (i, case) in layernorm::check::cases(args.layernorm_big)
            .into_iter()
            .enumerate()
        {
            if !wanted("layernorm_linear", &case.label()) {
                continue;
            }
            let rows = layernorm::check::run(gpu, case, seed + 7000 + i as u64)
                .with_context(|| format!("layernorm_linear {} (seed {seed})", case.label()))?;
            rows.into_iter().for_each(|r| report(r, seed));
        }
        if any_linear {
            let rows = layernorm::check::linear_rows(gpu, seed + 7100)
                .with_context(|| format!("the few-rows Linear (seed {seed})"))?;
            rows.into_iter()
                .filter(|r| wanted(&r.label, &r.case.label()))
                .for_each(|r| report(r, seed));
        }
    }
    for (key, ratio, at) in &worst {
        println!("worst error/bound {key}: {ratio:.3} ({at})");
    }
    Ok((passed, failed))
}

/// A running count on a terminal's stderr (the rows on stdout stay a clean table).
fn progress(i: usize, n: usize, case: &Case) {
    use std::io::{IsTerminal, Write};
    let mut err = std::io::stderr();
    if err.is_terminal() {
        let _ = write!(
            err,
            "\r[{}/{n}] {} {} {}\x1b[K\r",
            i + 1,
            case.kind(),
            case.shape_label(),
            case.mask_label()
        );
        let _ = err.flush();
    }
}

/// Every word of `filter` is in the case's kind, shape or masks.
fn matches(c: &Case, filter: &str) -> bool {
    let fields = [c.kind().to_string(), c.shape_label(), c.mask_label()];
    filter
        .split_whitespace()
        .all(|word| fields.iter().any(|s| s.contains(word)))
}

fn print_row(r: &Row) {
    print_cells(
        &r.label,
        &r.case.shape_label(),
        &r.case.mask_label(),
        &r.verdicts,
    );
}

/// One report line: what ran, on what, each output's error against its bound, the verdict.
fn print_cells(label: &str, shape: &str, masks: &str, verdicts: &[(&str, Verdict)]) {
    let cells: Vec<String> = verdicts
        .iter()
        .map(|(n, v)| format!("{n} {:.2e}<={:.2e}", v.error, v.bound))
        .collect();
    let pass = verdicts.iter().all(|(_, v)| v.pass());
    println!(
        "{label:<52} {shape:<32} {masks:<22} {:<60} {}",
        cells.join("  "),
        if pass { "pass" } else { "FAIL" }
    );
}
