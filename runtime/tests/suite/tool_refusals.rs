//! The `attn` tool on input a user gets wrong: each refusal is one error line that names
//! the flag or file at fault, exits 1, and leaves no output file behind.

use std::path::{Path, PathBuf};

use runtime::harness::npy;
use runtime::{BlockOn, Gpu, kernels};

use crate::parity_tool::{assert_one_line_error, attn, scratch_dir, write_i64};

/// A .npy file whose header claims `shape` over `data` bytes of `descr` elements.
fn write_header(path: &Path, descr: &str, shape: &[u64], data: &[u8]) {
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    let mut header = format!(
        "{{'descr': '{descr}', 'fortran_order': False, 'shape': ({},), }}",
        dims.join(", ")
    );
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend((header.len() as u16).to_le_bytes());
    bytes.extend(header.as_bytes());
    bytes.extend(data);
    std::fs::write(path, bytes).unwrap();
}

/// A folder with q [4, 2, 32] and k = v [4, 1, 32], and the path of a file in it.
fn inputs(name: &str) -> (PathBuf, impl Fn(&str) -> String) {
    let dir = scratch_dir(name);
    let values: Vec<f32> = (0..256).map(|i| (i % 7) as f32 / 7.0).collect();
    npy::write_f32(&dir.join("q.npy"), &[4, 2, 32], &values).unwrap();
    npy::write_f32(&dir.join("k.npy"), &[4, 1, 32], &values[..128]).unwrap();
    let at = dir.clone();
    (dir, move |n: &str| {
        at.join(n).to_string_lossy().into_owned()
    })
}

/// `attn` on q, k, v (k again) and `extra`, which must be refused naming `needle`, with
/// nothing written to --out.
fn refused(f: &impl Fn(&str) -> String, q: &str, extra: &[&str], needle: &str) {
    let (q, k, out) = (f(q), f("k.npy"), f("out"));
    let mut args = vec!["--q", &q, "--k", &k, "--v", &k, "--out", &out];
    args.extend_from_slice(extra);
    assert_one_line_error(&attn(&args), needle);
    assert!(!Path::new(&out).exists(), "{args:?} wrote {out}");
}

#[test]
fn shapes_that_overflow_or_exceed_the_device_are_refused_naming_the_file() {
    let (dir, f) = inputs("tool_huge_shapes");
    let four = [0u8; 16];
    write_header(&dir.join("overflow.npy"), "<f4", &[1 << 32, 1 << 32], &four);
    refused(
        &f,
        "overflow.npy",
        &[],
        "overflow.npy: shape [4294967296, 4294967296]",
    );
    refused(&f, "overflow.npy", &[], "more elements than 2^64");
    write_header(&dir.join("claims.npy"), "<f4", &[100_000, 1000, 8], &four);
    refused(
        &f,
        "claims.npy",
        &[],
        "claims.npy: shape [100000, 1000, 8] needs",
    );
    // A q of no elements whose rows and heads would need a 2^59-byte LSE.
    write_header(&dir.join("flat.npy"), "<f4", &[1 << 31, 1 << 26, 0], &[]);
    refused(
        &f,
        "flat.npy",
        &[],
        "flat.npy: shape [2147483648, 67108864, 0] has head_dim 0",
    );
    // A batch of 2^32 is q's fault, not k's.
    write_header(&dir.join("batch.npy"), "<f4", &[1 << 32, 1, 2, 0], &[]);
    refused(
        &f,
        "batch.npy",
        &[],
        "batch.npy: shape [4294967296, 1, 2, 0] has batch",
    );
    // Small files whose O (q's 64 heads of v's 256-wide rows) is over the device's limit.
    let rows = device_limit() / (64 * 256 * 4) + 1;
    npy::write_f32(
        &dir.join("wq.npy"),
        &[rows, 64, 4],
        &vec![0.0; rows as usize * 256],
    )
    .unwrap();
    npy::write_f32(
        &dir.join("wk.npy"),
        &[rows, 1, 4],
        &vec![0.0; rows as usize * 4],
    )
    .unwrap();
    npy::write_f32(
        &dir.join("wv.npy"),
        &[rows, 1, 256],
        &vec![0.0; rows as usize * 256],
    )
    .unwrap();
    let (q, k, v, out) = (f("wq.npy"), f("wk.npy"), f("wv.npy"), f("out"));
    let args = ["--q", &q, "--k", &k, "--v", &v, "--out", &out];
    assert_one_line_error(&attn(&args), "o (q's rows, v's width): ");
    assert!(!Path::new(&out).exists());
}

/// The most bytes one tensor may have on this machine's adapter.
fn device_limit() -> u64 {
    let gpu = Gpu::new(kernels::FAMILY.iter().copied())
        .block_on()
        .unwrap_or_else(|e| panic!("{e}"));
    let limits = gpu.limits();
    limits
        .max_storage_buffer_binding_size
        .min(limits.max_buffer_size)
}

#[test]
fn malformed_files_are_refused_naming_the_file() {
    let (dir, f) = inputs("tool_malformed");
    let q = std::fs::read(dir.join("q.npy")).unwrap();
    std::fs::write(dir.join("cut.npy"), &q[..q.len() - 100]).unwrap();
    refused(
        &f,
        "cut.npy",
        &[],
        "cut.npy: shape [4, 2, 32] needs 1024 bytes",
    );
    std::fs::write(dir.join("empty.npy"), b"").unwrap();
    refused(&f, "empty.npy", &[], "empty.npy is not a .npy file");
    write_header(&dir.join("f8.npy"), "<f8", &[4, 2, 32], &[0; 2048]);
    refused(&f, "f8.npy", &[], "f8.npy: dtype <f8, expected float32");
    let mut fortran = q.clone();
    let at = q.windows(5).position(|w| w == b"False").unwrap();
    fortran[at..at + 5].copy_from_slice(b"True ");
    std::fs::write(dir.join("fortran.npy"), fortran).unwrap();
    refused(&f, "fortran.npy", &[], "fortran.npy: Fortran-ordered");
    refused(&f, "", &[], "Is a directory");
    write_header(&dir.join("cu.npy"), "<i8", &[1 << 40], &[0; 8]);
    refused(
        &f,
        "q.npy",
        &["--cu-seqlens", &f("cu.npy")],
        "cu.npy: shape [1099511627776]",
    );
}

#[test]
fn bad_flag_values_are_refused_naming_the_flag() {
    let (_dir, f) = inputs("tool_flags");
    refused(
        &f,
        "q.npy",
        &["--softcap", "-5"],
        "--softcap -5: the cap C must be",
    );
    refused(&f, "q.npy", &["--softcap", "0"], "--softcap 0");
    refused(
        &f,
        "q.npy",
        &["--dropout", "1"],
        "--dropout 1: give a probability",
    );
    refused(&f, "q.npy", &["--window", "0"], "--window 0");
    refused(&f, "q.npy", &["--scale", "inf"], "--scale inf");
    let (q, k) = (f("q.npy"), f("k.npy"));
    let args = ["--q", &q, "--k", &k, "--v", &k, "--out", &q];
    assert_one_line_error(&attn(&args), "it is a file; give a folder");
}

#[test]
fn a_refused_schedule_leaves_no_outputs() {
    let (_dir, f) = inputs("tool_deterministic");
    let atomic = [
        "--do",
        &f("q.npy"),
        "--deterministic",
        "--schedule",
        "streaming-16x16/2@64",
    ];
    refused(&f, "q.npy", &atomic, "is not deterministic");
}

#[test]
fn too_many_modifier_tensors_name_the_flags_to_drop() {
    let (dir, f) = inputs("tool_bindings");
    npy::write_f32(&dir.join("heads.npy"), &[2], &[0.5, 0.25]).unwrap();
    npy::write_f32(&dir.join("bias.npy"), &[1, 4, 4], &[0.1; 16]).unwrap();
    write_i64(&dir.join("seg.npy"), &[0, 0, 2, 2]);
    let (heads, bias, seg) = (f("heads.npy"), f("bias.npy"), f("seg.npy"));
    let flags = [
        "--alibi", &heads, "--sinks", &heads, "--bias", &bias, "--seg", &seg,
    ];
    refused(
        &f,
        "q.npy",
        &flags,
        "--alibi, --sinks, --bias, --seg together need more",
    );
    let (q, k, out) = (f("q.npy"), f("k.npy"), f("out"));
    let mut args = vec!["--q", &q, "--k", &k, "--v", &k, "--out", &out];
    args.extend_from_slice(&flags);
    let stderr = String::from_utf8_lossy(&attn(&args).stderr).into_owned();
    assert!(stderr.contains("drop one of them"), "{stderr}");
    assert!(!stderr.contains("native(..)"), "{stderr}");
}

/// `bench`'s shape flags: zero, unaligned and huge values are refused naming the flag before
/// any device or host buffer exists, where they panicked or aborted on an allocation.
#[test]
fn bench_refuses_zero_and_absurd_shapes_naming_the_flag() {
    let cases: [(&[&str], &str); 6] = [
        (&["--seq", "0"], "--seq 0: give at least 1"),
        (&["--batch", "0"], "--batch 0: give at least 1"),
        (&["--heads", "0"], "--heads 0: give at least 1"),
        (&["--head-dim", "3"], "--head-dim 3: give multiples of 4"),
        (
            &["--seq", "4294967295"],
            "over the 4 GiB one binding can hold",
        ),
        (&["--packed", "4294967295,4294967295"], "over the 4 GiB"),
    ];
    for (args, needle) in cases {
        let run = std::process::Command::new(env!("CARGO_BIN_EXE_bench"))
            .args(args)
            .output()
            .unwrap();
        assert_one_line_error(&run, needle);
    }
}

/// `check --seeds`: none, or so many that the seeds run past 2^64, is refused naming the
/// flags, where the latter panicked on an overflow.
#[test]
fn check_refuses_seeds_past_the_end_naming_the_flags() {
    let check = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_check"))
            .args(args)
            .output()
            .unwrap()
    };
    // check exits 2 on an error (1 is a failing row).
    let run = check(&["--seeds", "18446744073709551615", "--filter", "none"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("error: --seed 1 with --seeds 18446744073709551615 runs past"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let run = check(&["--seeds", "0"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--seeds"), "{stderr}");
}

/// `check --filter` that matches no case is an error (before, zero rows ran and it exited
/// 0, as if everything had passed); the message points at `--list`.
#[test]
fn check_refuses_a_filter_that_matches_nothing() {
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_check"))
        .args(["--filter", "no-such-kernel"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("matches no case") && stderr.contains("--list"),
        "{stderr}"
    );
}
