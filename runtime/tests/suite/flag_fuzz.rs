//! `attn`'s flags under values a user could type, with a fixed budget so CI runs it: each
//! run takes the required files and up to five optional flags, each with a value from a
//! vocabulary of numbers (zero, negative, huge, non-finite, past u32 and u64), words,
//! presets with odd parameters and files that are missing, garbage or of the wrong shape.
//! Any run may be refused; none may panic or die by a signal, a refusal exits 1 (or 2, a
//! usage error from the argument parser) with no output written, and a run that succeeds
//! writes its outputs.

use std::path::Path;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use runtime::harness::npy;

use crate::parity_tool::{attn, scratch_dir};

/// Runs at most this many cases, and no more once this much time has passed.
const CASES: usize = 64;
const BUDGET: Duration = Duration::from_secs(45);

const NUMBERS: &[&str] = &[
    "0",
    "1",
    "2",
    "-1",
    "-5",
    "0.5",
    "1.5",
    "1e30",
    "-1e30",
    "nan",
    "inf",
    "-inf",
    "4294967296",
    "18446744073709551616",
    "x",
    "",
];

const SCHEDULES: &[&str] = &["auto", "tiled", "atomic", "split", "streaming", "x", ""];

const PRESETS: &[&str] = &[
    "prefix-lm",
    "t5-bias",
    "t5-bias:0",
    "t5-bias:-3",
    "window-sinks:2,1",
    "window-sinks:0,0",
    "window-sinks:4294967296,1",
    "sliding-window:0",
    "sliding-window:x",
    "alibi",
    "unknown:1",
    ":",
    "",
];

/// The files a flag may name (`@`: the scratch folder): the inputs, a missing one, garbage,
/// one of the wrong shape, none.
const FILES: &[&str] = &[
    "@q.npy",
    "@k.npy",
    "@missing.npy",
    "@garbage.npy",
    "@small.npy",
    "",
];

/// The optional flags: each takes a value from its list (`None`: a switch).
fn flags() -> Vec<(&'static str, Option<&'static [&'static str]>)> {
    vec![
        ("--causal", None),
        ("--deterministic", None),
        ("--scale", Some(NUMBERS)),
        ("--schedule", Some(SCHEDULES)),
        ("--window", Some(NUMBERS)),
        ("--softcap", Some(NUMBERS)),
        ("--dropout", Some(NUMBERS)),
        ("--seed", Some(NUMBERS)),
        ("--flex", Some(PRESETS)),
        (
            "--tensor",
            Some(&["prefix=@small.npy", "prefix=", "=@q.npy", "x"]),
        ),
        ("--do", Some(FILES)),
        ("--seg", Some(FILES)),
        ("--cu-seqlens", Some(FILES)),
        ("--alibi", Some(FILES)),
        ("--sinks", Some(FILES)),
        ("--bias", Some(FILES)),
    ]
}

/// q [4, 2, 32], k = v [4, 1, 32], a [2] file, and a file that is not .npy.
fn inputs(dir: &Path) {
    let values: Vec<f32> = (0..256).map(|i| (i % 7) as f32 / 7.0).collect();
    npy::write_f32(&dir.join("q.npy"), &[4, 2, 32], &values).unwrap();
    npy::write_f32(&dir.join("k.npy"), &[4, 1, 32], &values[..128]).unwrap();
    npy::write_f32(&dir.join("small.npy"), &[2], &values[..2]).unwrap();
    std::fs::write(dir.join("garbage.npy"), b"\x93NUMPY not a header").unwrap();
}

/// What a flag needs beside it for the argument parser to take it (`--seed` means
/// nothing without `--dropout`): the flag and its value.
fn requires(flag: &str) -> Option<(&'static str, &'static str)> {
    match flag {
        "--seed" => Some(("--dropout", "0.5")),
        "--deterministic" => Some(("--do", "@q.npy")),
        "--tensor" => Some(("--flex", "prefix-lm")),
        _ => None,
    }
}

/// One case's arguments: the required files, then up to five distinct optional flags and
/// what they require (`@` in a value is the scratch folder `dir`).
fn case(rng: &mut StdRng, dir: &str, out: &str) -> Vec<String> {
    let mut args: Vec<String> = ["--q", "@q.npy", "--k", "@k.npy", "--v", "@k.npy"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(["--out".to_string(), out.to_string()]);
    let mut all = flags();
    let mut chosen: Vec<(&str, String)> = Vec::new();
    for _ in 0..rng.random_range(0..=5) {
        let (flag, values) = all.swap_remove(rng.random_range(0..all.len()));
        let value = values.map_or(String::new(), |v| v[rng.random_range(0..v.len())].into());
        chosen.push((flag, value));
    }
    let needed: Vec<(&str, String)> = chosen
        .iter()
        .filter_map(|(f, _)| requires(f))
        .filter(|(f, _)| !chosen.iter().any(|(c, _)| c == f))
        .map(|(f, v)| (f, v.to_string()))
        .collect();
    for (flag, value) in chosen.into_iter().chain(needed) {
        args.push(flag.to_string());
        if !value.is_empty() || flags().iter().any(|(f, v)| *f == flag && v.is_some()) {
            args.push(value);
        }
    }
    args.iter().map(|a| a.replace('@', dir)).collect()
}

#[test]
fn attn_flags_are_refused_or_run_never_panicked_on() {
    let dir = scratch_dir("flag_fuzz");
    inputs(&dir);
    let folder = format!("{}/", dir.to_string_lossy());
    let mut rng = StdRng::seed_from_u64(0x5eed_f1a9);
    let start = Instant::now();
    let mut runs = 0;
    while runs < CASES && start.elapsed() < BUDGET {
        let out = format!("{folder}out{runs}");
        let args = case(&mut rng, &folder, &out);
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = attn(&argv);
        let stderr = String::from_utf8_lossy(&run.stderr);
        let code = run.status.code();
        assert!(!stderr.contains("panicked"), "{args:?} panicked:\n{stderr}");
        assert!(code.is_some(), "{args:?} died by a signal:\n{stderr}");
        match code {
            Some(0) => assert!(
                Path::new(&out).join("o.npy").exists(),
                "{args:?} wrote no o.npy"
            ),
            Some(1 | 2) => assert!(
                !Path::new(&out).exists(),
                "{args:?} was refused but wrote {out}"
            ),
            _ => panic!("{args:?} exited with {code:?}:\n{stderr}"),
        }
        runs += 1;
    }
    assert!(runs >= 8, "only {runs} runs within {BUDGET:?}");
}
