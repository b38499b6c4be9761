//! The `attn` parity tool, run as a user runs it: `.npy` in, `.npy` out, compared with the
//! reference; and bad files give one error line and a non-zero exit, never a panic.

use runtime::BlockOn;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use attn_dsl::BiasHeads;
use npyz::WriterBuilder;
use runtime::harness::cases::documents;
use runtime::harness::npy;
use runtime::verify::compare::{judge_attention, judge_backward};
use runtime::verify::random;
use runtime::verify::reference::Problem;
use runtime::{Bias, Dropout, Heads, Modifiers};

pub(crate) fn scratch_dir(name: &str) -> PathBuf {
    let dir = scratch_dir_path(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub(crate) fn attn(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attn"))
        .args(args)
        .output()
        .unwrap()
}

/// `attn` with `args`, which must succeed.
fn attn_ok(args: &[&str]) -> Output {
    let run = attn(args);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    run
}

pub(crate) fn write_i64(path: &Path, data: &[i64]) {
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
    npy::read_f32(&dir.join(format!("{name}.npy")), &[2, 3, 4])
        .unwrap()
        .1
}

/// What one run of the tool is given.
struct Inputs {
    /// `None`: 3-D tensors; `Some(b)`: 4-D with batch `b`.
    batch: Option<usize>,
    seq: usize,
    heads: (usize, usize),
    head_dim: usize,
    causal: bool,
    /// Document starts given as `--seg` ([seq], the same for every sequence), or the
    /// lengths of packed sequences given as `--cu-seqlens`.
    docs: Docs,
}

enum Docs {
    Seg(u32),
    CuSeqlens(&'static [u32]),
}

/// Runs `attn` on random inputs with `--schedule schedule` and judges the forward and
/// every backward it wrote against the reference; returns the schedules judged.
fn round_trip(name: &str, t: &Inputs, schedule: &str) -> Vec<String> {
    let dir = scratch_dir(name);
    let (b, seq, (h, kv), d) = (t.batch.unwrap_or(1), t.seq, t.heads, t.head_dim);
    let (q, k, v, d_o) = (
        random(b * seq * h * d, 1),
        random(b * seq * kv * d, 2),
        random(b * seq * kv * d, 3),
        random(b * seq * h * d, 4),
    );
    let f = |n: &str| dir.join(n).to_string_lossy().into_owned();
    for (name, data, heads) in [("q", &q, h), ("k", &k, kv), ("v", &v, kv), ("do", &d_o, h)] {
        let shape: Vec<u64> = t
            .batch
            .into_iter()
            .chain([seq, heads, d])
            .map(|x| x as u64)
            .collect();
        npy::write_f32(&dir.join(format!("{name}.npy")), &shape, data).unwrap();
    }
    let out = dir.join("out");
    let mut args = vec![
        "--q".into(),
        f("q.npy"),
        "--k".into(),
        f("k.npy"),
        "--v".into(),
        f("v.npy"),
    ];
    args.extend([
        "--do".into(),
        f("do.npy"),
        "--schedule".into(),
        schedule.into(),
    ]);
    args.extend(["--out".into(), out.to_string_lossy().into_owned()]);
    if t.causal {
        args.push("--causal".into());
    }
    let one_seg = match t.docs {
        Docs::Seg(n) => {
            let seg = documents(seq as u32, n);
            write_i64(
                &dir.join("seg.npy"),
                &seg.iter().map(|x| i64::from(*x)).collect::<Vec<_>>(),
            );
            args.extend(["--seg".into(), f("seg.npy")]);
            seg
        }
        Docs::CuSeqlens(lengths) => {
            let cu: Vec<i64> = std::iter::once(0)
                .chain(lengths.iter().scan(0, |at, l| {
                    *at += i64::from(*l);
                    Some(*at)
                }))
                .collect();
            write_i64(&dir.join("cu.npy"), &cu);
            args.extend(["--cu-seqlens".into(), f("cu.npy")]);
            runtime::shape::seg_from_lengths(lengths).expect("lengths that fit a u32")
        }
    };
    let seg = one_seg.repeat(b);
    let result = attn(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(
        result.status.success(),
        "{name}: {}{stdout}",
        String::from_utf8_lossy(&result.stderr)
    );
    let p = Problem {
        batch: b,
        n_q: seq,
        n_k: seq,
        n_heads: h,
        n_kv_heads: kv,
        head_dim: d,
        scale: f64::from(1.0 / (d as f32).sqrt()),
        causal: t.causal,
        seg: Some(&seg),
        ..Default::default()
    };
    let (o, lse) = (read(&out, "o"), read(&out, "lse"));
    let fwd = judge_attention(&p, [&q, &k, &v], &o, Some(&lse));
    assert!(fwd.iter().all(|(_, v)| v.pass()), "{name} forward: {fwd:?}");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    if schedule != "all" {
        dirs = vec![out.clone()];
    }
    let mut judged = Vec::new();
    for dir in dirs {
        let grads = [read(&dir, "dq"), read(&dir, "dk"), read(&dir, "dv")];
        let bwd = judge_backward(
            &p,
            [&q, &k, &v, &d_o],
            (&o, &lse),
            [&grads[0], &grads[1], &grads[2]],
            [&[], &[]],
            &[],
        );
        let label = dir.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            bwd.iter().all(|(_, v)| v.pass()),
            "{name} {label} backward: {bwd:?}"
        );
        judged.push(label);
    }
    judged
}

/// head_dims 32, 80 and 96 are in no family kernel: the tool specializes every schedule
/// for them at start-up, from the configurations by rule.
#[test]
fn every_schedule_matches_the_reference_at_head_dims_without_family_kernels() {
    for head_dim in [32, 80, 96] {
        let inputs = Inputs {
            batch: None,
            seq: 9,
            heads: (4, 2),
            head_dim,
            causal: true,
            docs: Docs::Seg(2),
        };
        let mut judged = round_trip(&format!("parity_d{head_dim}"), &inputs, "all");
        // Every schedule this adapter runs at this head_dim, as the tool names its folders.
        let masks = attn_dsl::Masks::new(true, true);
        let set =
            runtime::kernels::BackwardKernels::compile((head_dim as u32, head_dim as u32), masks)
                .unwrap();
        let gpu = runtime::Gpu::new(set.all()).block_on().unwrap();
        let backward = runtime::Backward::from_kernels(&gpu, &[set]).unwrap();
        let mut runs: Vec<String> = backward
            .schedules((head_dim as u32, head_dim as u32), runtime::Dtype::F32)
            .iter()
            .map(|s| s.to_string().replace('/', "_"))
            .collect();
        judged.sort();
        runs.sort();
        assert_eq!(judged, runs, "d{head_dim}");
        for kind in ["split", "recompute", "tiled-", "flash-"] {
            assert!(
                judged.iter().any(|s| s.starts_with(kind)),
                "d{head_dim}: no {kind} schedule among {judged:?}"
            );
        }
    }
}

/// 4-D inputs are a batch: packed sequences per batch element from `--cu-seqlens`, with
/// and without the causal mask, outputs 4-D.
#[test]
fn four_dimensional_inputs_with_packed_sequences_match_the_reference() {
    for causal in [true, false] {
        let inputs = Inputs {
            batch: Some(2),
            seq: 12,
            heads: (4, 1),
            head_dim: 64,
            causal,
            docs: Docs::CuSeqlens(&[1, 7, 4]),
        };
        let name = format!("parity_batch_causal_{causal}");
        assert_eq!(round_trip(&name, &inputs, "auto"), ["out"]);
        let o = npy::read_f32(&scratch_dir_path(&name).join("out/o.npy"), &[4])
            .unwrap()
            .0;
        assert_eq!(o, [2, 12, 4, 64]);
    }
}

/// Random Q, K, V and dO `[seq, heads, d]` (seeds 1 to 4), written to q.npy, k.npy, v.npy
/// and do.npy in `dir`.
fn random_qkv_do(dir: &Path, seq: usize, (nh, nkv): (usize, usize), d: usize) -> [Vec<f32>; 4] {
    let data = [(nh, 1), (nkv, 2), (nkv, 3), (nh, 4)].map(|(h, s)| random(seq * h * d, s));
    for (name, x) in ["q", "k", "v", "do"].into_iter().zip(&data) {
        let h = x.len() / (seq * d);
        let shape = [seq as u64, h as u64, d as u64];
        npy::write_f32(&dir.join(format!("{name}.npy")), &shape, x).unwrap();
    }
    data
}

fn scratch_dir_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(name)
}

pub(crate) fn assert_one_line_error(result: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&result.stderr);
    // Mesa's window-system probe prints its own `error:` line when the machine has no
    // XDG_RUNTIME_DIR (CI); it is not the tool's.
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error:") && !l.contains("XDG_RUNTIME_DIR"))
        .collect();
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
    // Each cause once: the OS's reason follows the file's name, and is not repeated.
    let missing = run(&f("missing.npy"), &k, &[]);
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert_eq!(stderr.matches("No such file").count(), 1, "{stderr}");
    assert_one_line_error(&run(&f("junk.npy"), &k, &[]), "junk.npy is not a .npy file");
    assert_one_line_error(&run(&f("junk.npy"), &k, &[]), "magic");
    let mut truncated = b"\x93NUMPY\x01\x00\x76\x00{'descr': '<f4'".to_vec();
    truncated.resize(40, b' ');
    std::fs::write(dir.join("truncated.npy"), truncated).unwrap();
    assert_one_line_error(&run(&f("truncated.npy"), &k, &[]), "truncated");
    assert_one_line_error(&run(&f("ints.npy"), &k, &[]), "dtype <i8, expected float32");
    assert_one_line_error(&run(&f("flat.npy"), &k, &[]), "expected 3 or 4 dimensions");
    assert_one_line_error(&run(&q, &f("k_wide.npy"), &[]), "does not fit q's");
    assert_one_line_error(
        &run(&q, &k, &["--seg", &f("bad_seg.npy")]),
        "bad_seg.npy: seg[1] = 3 is invalid",
    );
    assert_one_line_error(
        &run(&q, &k, &["--schedule", "fastest"]),
        "unknown schedule `fastest`",
    );
    // A q of no rows with documents: refused, not a panic.
    npy::write_f32(&dir.join("q0.npy"), &[0, 2, 8], &[]).unwrap();
    npy::write_f32(&dir.join("k0.npy"), &[0, 1, 8], &[]).unwrap();
    write_i64(&dir.join("cu0.npy"), &[0]);
    assert_one_line_error(
        &run(&f("q0.npy"), &f("k0.npy"), &["--cu-seqlens", &f("cu0.npy")]),
        "",
    );
    // A negative number is a flag's value (here a scale the runtime then refuses or runs).
    let negative = run(&q, &k, &["--scale", "-1"]);
    let stderr = String::from_utf8_lossy(&negative.stderr);
    assert!(!stderr.contains("unexpected argument"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let ok = run(&q, &k, &["--causal"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}

/// The modifier flags reach the kernels: O matches the reference with the same window,
/// ALiBi slopes, shared bias, soft cap and dropout mask, and every schedule writes dbias.npy
/// in the bias's shape, all agreeing; a bias of the wrong shape is one error line.
#[test]
fn modifier_flags_match_the_reference_and_write_dbias() {
    let dir = scratch_dir("parity_modifiers");
    let f = |n: &str| dir.join(n).to_string_lossy().into_owned();
    let (seq, nh, nkv, d) = (24usize, 4usize, 2usize, 32usize);
    let [q, k, v, _] = random_qkv_do(&dir, seq, (nh, nkv), d);
    let slopes: Vec<f32> = (0..nh).map(|h| (-2.0 * (h + 1) as f32).exp2()).collect();
    npy::write_f32(&dir.join("slopes.npy"), &[nh as u64], &slopes).unwrap();
    let bias = random(seq * seq, 5);
    npy::write_f32(&dir.join("bias.npy"), &[1, seq as u64, seq as u64], &bias).unwrap();
    npy::write_f32(
        &dir.join("bad_bias.npy"),
        &[2, seq as u64, seq as u64],
        &random(2 * seq * seq, 6),
    )
    .unwrap();
    let out = f("out");
    let common = [
        "--q",
        &f("q.npy"),
        "--k",
        &f("k.npy"),
        "--v",
        &f("v.npy"),
        "--causal",
        "--window",
        "9",
        "--alibi",
        &f("slopes.npy"),
        "--softcap",
        "3",
        "--dropout",
        "0.2",
        "--seed",
        "11",
    ];
    let mut args: Vec<&str> = common.to_vec();
    let (do_path, bias_path) = (f("do.npy"), f("bias.npy"));
    args.extend([
        "--do",
        &do_path,
        "--bias",
        &bias_path,
        "--schedule",
        "all",
        "--out",
        &out,
    ]);
    attn_ok(&args);

    let mods = Modifiers {
        window: Some(9),
        alibi: Some(&slopes),
        bias: Some(Bias {
            values: &bias,
            heads: BiasHeads::Shared,
        }),
        softcap: Some(3.0),
        dropout: Some(Dropout {
            p: 0.2,
            seed: 11,
            offset: 0,
        }),
        sinks: None,
        flex: None,
    };
    let problem = Problem {
        batch: 1,
        n_q: seq,
        n_k: seq,
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: d,
        scale: f64::from(
            Heads {
                n_heads: nh as u32,
                n_kv_heads: nkv as u32,
                head_dim: d as u32,
                head_dim_v: d as u32,
            }
            .default_scale(),
        ),
        causal: true,
        seg: None,
        mods,
        ..Problem::default()
    };
    let out_dir = Path::new(&out);
    let verdicts = judge_attention(
        &problem,
        [&q, &k, &v],
        &read(out_dir, "o"),
        Some(&read(out_dir, "lse")),
    );
    for (name, v) in verdicts {
        assert!(v.pass(), "{name}: {v:?}");
    }
    let dbias: Vec<Vec<f32>> = std::fs::read_dir(out_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .map(|p| npy::read_f32(&p.join("dbias.npy"), &[3]).unwrap())
        .map(|(shape, x)| {
            assert_eq!(shape, [1, seq as u64, seq as u64]);
            x
        })
        .collect();
    assert!(dbias.len() >= 3, "{} schedules", dbias.len());
    assert!(dbias[0].iter().any(|x| *x != 0.0));
    for other in &dbias[1..] {
        let diff = dbias[0]
            .iter()
            .zip(other)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(diff < 1e-4, "schedules disagree on dbias by {diff}");
    }
    let mut bad: Vec<&str> = common.to_vec();
    let bad_bias = f("bad_bias.npy");
    bad.extend(["--bias", &bad_bias, "--out", &out]);
    assert_one_line_error(
        &attn(&bad),
        "bad_bias.npy: shape [2, 24, 24], expected [4 or 1, 24, 24]",
    );
    // A shared bias's gradient sums the heads by atomics in every schedule.
    let mut deterministic: Vec<&str> = common.to_vec();
    deterministic.extend([
        "--do",
        &do_path,
        "--bias",
        &bias_path,
        "--deterministic",
        "--out",
        &out,
    ]);
    assert_one_line_error(
        &attn(&deterministic),
        "adds `dbias` by atomics; with a bias shared by the heads every schedule does: pass a \
         bias per head",
    );
}

/// float16 inputs (and bf16 as uint16 bits) give O and the gradients in the same type,
/// judged by the rule for half precision on the rounded inputs; LSE stays float32; mixing
/// types is refused.
#[test]
fn half_precision_inputs_give_outputs_in_their_type() {
    let (seq, h, kv, d) = (40usize, 4usize, 2usize, 32usize);
    for dtype in [attn_dsl::Dtype::F16, attn_dsl::Dtype::Bf16] {
        let dir = scratch_dir(&format!("half_{}", dtype.name()));
        let scalar = match dtype {
            attn_dsl::Dtype::F16 => attn_dsl::Scalar::F16,
            _ => attn_dsl::Scalar::Bf16,
        };
        let rounded = |n, seed| runtime::tensor::buffers::rounded(&random(n, seed), scalar);
        let (q, k, v, d_o) = (
            rounded(seq * h * d, 1),
            rounded(seq * kv * d, 2),
            rounded(seq * kv * d, 3),
            rounded(seq * h * d, 4),
        );
        let tensors = [("q", &q, h), ("k", &k, kv), ("v", &v, kv), ("do", &d_o, h)];
        for (name, data, heads) in tensors {
            let shape = [seq as u64, heads as u64, d as u64];
            npy::write_as(&dir.join(format!("{name}.npy")), &shape, data, dtype).unwrap();
        }
        let f = |n: &str| dir.join(n).to_string_lossy().into_owned();
        let out = f("out");
        let result = attn(&[
            "--q",
            &f("q.npy"),
            "--k",
            &f("k.npy"),
            "--v",
            &f("v.npy"),
            "--do",
            &f("do.npy"),
            "--causal",
            "--out",
            &out,
        ]);
        assert!(
            result.status.success(),
            "{}",
            String::from_utf8_lossy(&result.stderr)
        );
        let grad = |name: &str| {
            let (_, g, g_type) =
                npy::read_float(&dir.join(format!("out/{name}.npy")), &[3]).unwrap();
            assert_eq!(g_type, dtype, "{name}");
            g
        };
        let grads = [grad("dq"), grad("dk"), grad("dv")];
        let (_, o, o_type) = npy::read_float(&dir.join("out/o.npy"), &[3]).unwrap();
        assert_eq!(o_type, dtype);
        let (_, lse, lse_type) = npy::read_float(&dir.join("out/lse.npy"), &[2]).unwrap();
        assert_eq!(lse_type, attn_dsl::Dtype::F32);
        let p = Problem {
            batch: 1,
            n_q: seq,
            n_k: seq,
            n_heads: h,
            n_kv_heads: kv,
            head_dim: d,
            scale: f64::from(1.0 / (d as f32).sqrt()),
            causal: true,
            ..Default::default()
        };
        let verdicts = runtime::verify::compare::judge_half_attention(
            &p,
            [&q, &k, &v],
            &o,
            Some(&lse),
            scalar,
        );
        assert!(
            verdicts.iter().all(|(_, v)| v.pass()),
            "{dtype:?}: {verdicts:?}"
        );
        let verdicts = runtime::verify::compare::judge_half_backward(
            &p,
            [&q, &k, &v, &d_o],
            (&o, &lse),
            [&grads[0], &grads[1], &grads[2]],
            [&[], &[]],
            &[],
            scalar,
        );
        assert!(
            verdicts.iter().all(|(_, v)| v.pass()),
            "backward {dtype:?}: {verdicts:?}"
        );
        // k in float32 beside a half q: one error line naming the file and both types.
        npy::write_f32(&dir.join("k.npy"), &[seq as u64, kv as u64, d as u64], &k).unwrap();
        let mixed = attn(&[
            "--q",
            &f("q.npy"),
            "--k",
            &f("k.npy"),
            "--v",
            &f("v.npy"),
            "--out",
            &out,
        ]);
        assert_one_line_error(&mixed, "share one element type");
    }
}

/// `--sinks` reaches the forward and the backward: O, LSE and every gradient match the
/// reference with the same logits, dsinks.npy is written in [heads] (here under
/// `--deterministic`, whose schedule owns it), and logits of the wrong shape are one error
/// line.
#[test]
fn sinks_flag_matches_the_reference_and_writes_dsinks() {
    let dir = scratch_dir("parity_sinks");
    let f = |n: &str| dir.join(n).to_string_lossy().into_owned();
    let (seq, nh, nkv, d) = (20usize, 4usize, 2usize, 32usize);
    let [q, k, v, d_o] = random_qkv_do(&dir, seq, (nh, nkv), d);
    let sinks = [1.5f32, -0.5, 3.0, 0.25];
    npy::write_f32(&dir.join("sinks.npy"), &[nh as u64], &sinks).unwrap();
    npy::write_f32(&dir.join("bad_sinks.npy"), &[2], &[0.0, 1.0]).unwrap();
    let out = f("out");
    let common = [
        "--q",
        &f("q.npy"),
        "--k",
        &f("k.npy"),
        "--v",
        &f("v.npy"),
        "--causal",
    ];
    let mut args = common.to_vec();
    let (do_path, sinks_path) = (f("do.npy"), f("sinks.npy"));
    args.extend([
        "--do",
        &do_path,
        "--sinks",
        &sinks_path,
        "--deterministic",
        "--out",
        &out,
    ]);
    attn_ok(&args);

    let p = Problem {
        batch: 1,
        n_q: seq,
        n_k: seq,
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: d,
        scale: f64::from(1.0 / (d as f32).sqrt()),
        causal: true,
        mods: Modifiers {
            sinks: Some(&sinks),
            ..Modifiers::default()
        },
        ..Problem::default()
    };
    let out_dir = Path::new(&out);
    let (o, lse) = (read(out_dir, "o"), read(out_dir, "lse"));
    let fwd = judge_attention(&p, [&q, &k, &v], &o, Some(&lse));
    assert!(fwd.iter().all(|(_, v)| v.pass()), "forward: {fwd:?}");
    let (shape, dsinks) = npy::read_f32(&out_dir.join("dsinks.npy"), &[1]).unwrap();
    assert_eq!(shape, [nh as u64]);
    assert!(dsinks.iter().all(|x| *x != 0.0), "{dsinks:?}");
    let grads = [
        read(out_dir, "dq"),
        read(out_dir, "dk"),
        read(out_dir, "dv"),
    ];
    let bwd = judge_backward(
        &p,
        [&q, &k, &v, &d_o],
        (&o, &lse),
        [&grads[0], &grads[1], &grads[2]],
        [&[], &dsinks],
        &[],
    );
    assert_eq!(bwd.len(), 4, "{bwd:?}");
    assert!(bwd.iter().all(|(_, v)| v.pass()), "backward: {bwd:?}");

    let mut bad = common.to_vec();
    let bad_sinks = f("bad_sinks.npy");
    bad.extend(["--sinks", &bad_sinks, "--out", &out]);
    assert_one_line_error(&attn(&bad), "bad_sinks.npy: shape [2], expected [4]");
}

/// `--flex` runs a library preset with its parameters and its `--tensor` files, forward
/// and backward, matching the reference that evaluates the same modifier; a missing
/// tensor and an unknown preset are one error line each.
#[test]
fn flex_presets_match_the_reference() {
    let dir = scratch_dir("parity_flex");
    let f = |n: &str| dir.join(n).to_string_lossy().into_owned();
    let (seq, nh, nkv, d) = (40usize, 4usize, 2usize, 32usize);
    let [q, k, v, d_o] = random_qkv_do(&dir, seq, (nh, nkv), d);
    let rel_bias: Vec<f32> = (0..nh * 9).map(|i| 0.05 * (i % 7) as f32 - 0.1).collect();
    npy::write_f32(&dir.join("rel_bias.npy"), &[nh as u64, 9], &rel_bias).unwrap();
    let common = ["--q", &f("q.npy"), "--k", &f("k.npy"), "--v", &f("v.npy")];
    let (do_path, out, tensor) = (
        f("do.npy"),
        f("out"),
        format!("rel_bias={}", f("rel_bias.npy")),
    );
    for (preset, tensors) in [
        ("t5-bias:4", vec![tensor.as_str()]),
        ("window-sinks:8,2", vec![]),
    ] {
        let mut args = common.to_vec();
        args.extend(["--do", &do_path, "--flex", preset, "--out", &out]);
        for t in &tensors {
            args.extend(["--tensor", t]);
        }
        attn_ok(&args);
        let flex = attn_dsl::flex::library::preset(preset).unwrap();
        let pairs: Vec<(&str, &[f32])> = match tensors.is_empty() {
            true => vec![],
            false => vec![("rel_bias", &rel_bias[..])],
        };
        let p = Problem {
            batch: 1,
            n_q: seq,
            n_k: seq,
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: d,
            scale: f64::from(1.0 / (d as f32).sqrt()),
            causal: false,
            mods: Modifiers {
                flex: Some(runtime::FlexOf {
                    modifiers: flex.intern(),
                    tensors: &pairs,
                    block_mask: None,
                }),
                ..Modifiers::default()
            },
            ..Problem::default()
        };
        let out_dir = Path::new(&out);
        let (o, lse) = (read(out_dir, "o"), read(out_dir, "lse"));
        let fwd = judge_attention(&p, [&q, &k, &v], &o, Some(&lse));
        assert!(
            fwd.iter().all(|(_, v)| v.pass()),
            "{preset} forward: {fwd:?}"
        );
        let grads = [
            read(out_dir, "dq"),
            read(out_dir, "dk"),
            read(out_dir, "dv"),
        ];
        // t5-bias's table is learnable: its gradient comes back as drel_bias.npy.
        let dflex: Vec<(String, Vec<f32>)> = match tensors.is_empty() {
            true => vec![],
            false => vec![("drel_bias".into(), read(out_dir, "drel_bias"))],
        };
        let bwd = judge_backward(
            &p,
            [&q, &k, &v, &d_o],
            (&o, &lse),
            [&grads[0], &grads[1], &grads[2]],
            [&[], &[]],
            &dflex,
        );
        assert!(
            bwd.iter().all(|(_, v)| v.pass()),
            "{preset} backward: {bwd:?}"
        );
        let judged = bwd.iter().any(|(n, _)| *n == "drel_bias");
        assert_eq!(judged, !tensors.is_empty(), "{preset}: {bwd:?}");
    }
    let mut missing = common.to_vec();
    missing.extend(["--flex", "t5-bias:4", "--out", &out]);
    assert_one_line_error(&attn(&missing), "give --tensor rel_bias=FILE.npy");
    let mut unknown = common.to_vec();
    unknown.extend(["--flex", "sliding", "--out", &out]);
    assert_one_line_error(&attn(&unknown), "unknown preset `sliding`");
}

/// V narrower than Q and K (MLA's shape, small): O and LSE match the reference and O has
/// V's width, and with --do every schedule's dQ, dK and dV (dV of V's width) do too; a V of
/// other rows is one error line.
#[test]
fn v_of_another_width_gives_o_of_its_width() {
    let dir = scratch_dir("parity_head_dim_v");
    let (seq, nh, nkv, d, dv) = (40, 4, 2, 48, 32);
    let (q, k, v) = (
        random(seq * nh * d, 1),
        random(seq * nkv * d, 2),
        random(seq * nkv * dv, 3),
    );
    let f = |n: &str| dir.join(n).to_string_lossy().into_owned();
    let write = |name: &str, heads: usize, width: usize, data: &[f32]| {
        let shape = [seq as u64, heads as u64, width as u64];
        npy::write_f32(&dir.join(format!("{name}.npy")), &shape, data).unwrap();
    };
    write("q", nh, d, &q);
    write("k", nkv, d, &k);
    write("v", nkv, dv, &v);
    write("do", nh, dv, &random(seq * nh * dv, 4));
    npy::write_f32(
        &dir.join("v_short.npy"),
        &[seq as u64 - 1, nkv as u64, dv as u64],
        &v[..(seq - 1) * nkv * dv],
    )
    .unwrap();
    let out = f("out");
    let base = [
        "--q",
        &f("q.npy"),
        "--k",
        &f("k.npy"),
        "--out",
        &out,
        "--causal",
    ]
    .map(String::from);
    let run = |v: &str, extra: &[&str]| {
        let mut args: Vec<&str> = base.iter().map(String::as_str).collect();
        args.extend(["--v", v]);
        args.extend_from_slice(extra);
        attn(&args)
    };
    let ok = run(&f("v.npy"), &[]);
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(stdout.contains("head_dim=48 head_dim_v=32"), "{stdout}");
    let p = Problem {
        batch: 1,
        n_q: seq,
        n_k: seq,
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: d,
        head_dim_v: dv,
        scale: f64::from(1.0 / (d as f32).sqrt()),
        causal: true,
        ..Default::default()
    };
    let (o, lse) = (read(Path::new(&out), "o"), read(Path::new(&out), "lse"));
    assert_eq!(o.len(), seq * nh * dv);
    let verdicts = judge_attention(&p, [&q, &k, &v], &o, Some(&lse));
    assert!(verdicts.iter().all(|(_, v)| v.pass()), "{verdicts:?}");
    assert_one_line_error(&run(&f("v_short.npy"), &[]), "does not fit k's");
    let d_o = random(seq * nh * dv, 4);
    let both = run(&f("v.npy"), &["--do", &f("do.npy"), "--schedule", "all"]);
    assert!(
        both.status.success(),
        "{}",
        String::from_utf8_lossy(&both.stderr)
    );
    let (o, lse) = (read(Path::new(&out), "o"), read(Path::new(&out), "lse"));
    let mut schedules = 0;
    for entry in std::fs::read_dir(&out).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        let grads = [read(&dir, "dq"), read(&dir, "dk"), read(&dir, "dv")];
        assert_eq!(grads[2].len(), seq * nkv * dv, "{}", dir.display());
        let bwd = judge_backward(
            &p,
            [&q, &k, &v, &d_o],
            (&o, &lse),
            [&grads[0], &grads[1], &grads[2]],
            [&[], &[]],
            &[],
        );
        assert!(
            bwd.iter().all(|(_, v)| v.pass()),
            "{}: {bwd:?}",
            dir.display()
        );
        schedules += 1;
    }
    assert!(schedules >= 2, "every schedule's gradients: {schedules}");
}
