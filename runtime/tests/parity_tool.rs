//! The `attn` parity tool, run as a user runs it: `.npy` in, `.npy` out, compared with the
//! reference; and bad files give one error line and a non-zero exit, never a panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use npyz::WriterBuilder;
use runtime::cases::{documents, random};
use runtime::compare::{judge_attention, judge_backward};
use runtime::npy;
use runtime::reference::Problem;

fn scratch_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn attn(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attn"))
        .args(args)
        .output()
        .unwrap()
}

fn write_i64(path: &Path, data: &[i64]) {
    let file = std::fs::File::create(path).unwrap();
    let mut w = npyz::WriteOptions::new()
        .default_dtype()
        .shape(&[data.len() as u64])
        .writer(file)
        .begin_nd()
        .unwrap();
    w.extend(data.iter().copied()).unwrap();
    w.finish().unwrap();
}

fn read(dir: &Path, name: &str) -> Vec<f32> {
    npy::read_f32(
        &dir.join(format!("{name}.npy")),
        if name == "lse" { 2 } else { 3 },
    )
    .unwrap()
    .1
}

/// head_dim 32 is in no family kernel: the tool specializes kernels for it at start-up.
#[test]
fn round_trip_matches_the_reference_for_every_schedule() {
    let dir = scratch_dir("parity_round_trip");
    let (seq, h, kv, d) = (9usize, 4usize, 2usize, 32usize);
    let (q, k, v, d_o) = (
        random(seq * h * d, 1),
        random(seq * kv * d, 2),
        random(seq * kv * d, 3),
        random(seq * h * d, 4),
    );
    for (name, data, heads) in [("q", &q, h), ("k", &k, kv), ("v", &v, kv), ("do", &d_o, h)] {
        npy::write_f32(
            &dir.join(format!("{name}.npy")),
            &[seq as u64, heads as u64, d as u64],
            data,
        )
        .unwrap();
    }
    let seg = documents(seq as u32, 2);
    write_i64(
        &dir.join("seg.npy"),
        &seg.iter().map(|x| i64::from(*x)).collect::<Vec<_>>(),
    );
    let p = Problem {
        n_q: seq,
        n_k: seq,
        n_heads: h,
        n_kv_heads: kv,
        head_dim: d,
        scale: f64::from(1.0 / (d as f32).sqrt()),
        causal: true,
        seg: Some(&seg),
    };
    for schedule in ["auto", "split", "recompute"] {
        let out = dir.join(schedule);
        let f = |n: &str| dir.join(n).to_string_lossy().into_owned();
        let result = attn(&[
            "--q",
            &f("q.npy"),
            "--k",
            &f("k.npy"),
            "--v",
            &f("v.npy"),
            "--do",
            &f("do.npy"),
            "--seg",
            &f("seg.npy"),
            "--causal",
            "--schedule",
            schedule,
            "--out",
            out.to_str().unwrap(),
        ]);
        let stdout = String::from_utf8_lossy(&result.stdout);
        assert!(
            result.status.success(),
            "{schedule}: {}{stdout}",
            String::from_utf8_lossy(&result.stderr)
        );
        assert!(
            stdout.contains("wrote") && stdout.contains("backward ("),
            "{stdout}"
        );
        let (o, lse) = (read(&out, "o"), read(&out, "lse"));
        let fwd = judge_attention(&p, [&q, &k, &v], &o, Some(&lse));
        assert!(
            fwd.iter().all(|(_, v)| v.pass()),
            "{schedule} forward: {fwd:?}"
        );
        let grads = [read(&out, "dq"), read(&out, "dk"), read(&out, "dv")];
        let bwd = judge_backward(
            &p,
            [&q, &k, &v, &d_o],
            (&o, &lse),
            [&grads[0], &grads[1], &grads[2]],
        );
        assert!(
            bwd.iter().all(|(_, v)| v.pass()),
            "{schedule} backward: {bwd:?}"
        );
    }
}

fn assert_one_line_error(result: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&result.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(result.status.code(), Some(1), "{stderr}");
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains(needle), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bad_files_give_one_error_line() {
    let dir = scratch_dir("parity_errors");
    let f = |n: &str| dir.join(n).to_string_lossy().into_owned();
    npy::write_f32(&dir.join("q.npy"), &[4, 2, 8], &[0.5; 64]).unwrap();
    npy::write_f32(&dir.join("k.npy"), &[4, 1, 8], &[0.5; 32]).unwrap();
    npy::write_f32(&dir.join("k_wide.npy"), &[4, 1, 16], &[0.5; 64]).unwrap();
    npy::write_f32(&dir.join("flat.npy"), &[64], &[0.5; 64]).unwrap();
    write_i64(&dir.join("ints.npy"), &[1, 2, 3]);
    write_i64(&dir.join("bad_seg.npy"), &[0, 3, 3, 3]);
    std::fs::write(dir.join("junk.npy"), b"not a numpy file").unwrap();
    let out = f("out");
    let run = |q: &str, k: &str, extra: &[&str]| {
        let mut args = vec!["--q", q, "--k", k, "--v", k, "--out", &out];
        args.extend_from_slice(extra);
        attn(&args.iter().map(|s| s.as_ref()).collect::<Vec<&str>>())
    };
    let (q, k) = (f("q.npy"), f("k.npy"));
    assert_one_line_error(&run(&f("missing.npy"), &k, &[]), "missing.npy");
    assert_one_line_error(&run(&f("junk.npy"), &k, &[]), "junk.npy");
    assert_one_line_error(&run(&f("ints.npy"), &k, &[]), "dtype <i8, expected float32");
    assert_one_line_error(&run(&f("flat.npy"), &k, &[]), "expected 3 dimensions");
    assert_one_line_error(&run(&q, &f("k_wide.npy"), &[]), "does not fit q's");
    assert_one_line_error(
        &run(&q, &k, &["--seg", &f("bad_seg.npy")]),
        "bad_seg.npy: seg[1] = 3 is invalid",
    );
    assert_one_line_error(
        &run(&q, &k, &["--schedule", "fastest"]),
        "unknown schedule `fastest`",
    );
    let ok = run(&q, &k, &["--causal"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}
