//! The decode loop on this machine's adapter, at small shapes: it agrees with the f64 host
//! reference in every cache layout and dtype the adapter runs.

use attn_dsl::Dtype;
use decode_loop::{Config, run};
use runtime::Heads;

fn config(dtype: Dtype, page_size: Option<u32>) -> Config {
    Config {
        slots: 2,
        prompt: 9,
        tokens: 12,
        capacity: 40,
        heads: Heads {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 32,
            head_dim_v: 32,
        },
        dtype,
        weights: Dtype::F32,
        page_size,
        sync: false,
        steps_per_submit: 1,
        profile: false,
        check: true,
        seed: 3,
    }
}

#[test]
fn decode_loop_agrees_with_the_host_reference() {
    for (dtype, pages) in [
        (Dtype::F32, None),
        (Dtype::F32, Some(8)),
        (Dtype::Bf16, Some(8)),
    ] {
        let report = run(&config(dtype, pages)).unwrap();
        let (err, tol) = report.check.unwrap();
        assert!(err <= tol, "{dtype:?} pages {pages:?}: {err} over {tol}");
        assert_eq!(report.step_wall.len(), 12);
    }
    // Projections with weights held in bf16: the LayerNorm pass and a Linear reading them.
    let report = run(&Config {
        weights: Dtype::Bf16,
        ..config(Dtype::F32, None)
    })
    .unwrap();
    let (err, tol) = report.check.unwrap();
    assert!(err <= tol, "bf16 weights: {err} over {tol}");
}

/// Heads narrow enough that two rows of K (16 wide) end off the device's storage offset
/// alignment: Q, K and V's projection pads its rows so that each part binds, in f32 and in
/// bf16, at the prompt's rows and at a step's.
#[test]
fn narrow_heads_whose_parts_need_padding_agree_with_the_host_reference() {
    for dtype in [Dtype::F32, Dtype::Bf16] {
        let report = run(&Config {
            heads: Heads {
                n_heads: 2,
                n_kv_heads: 1,
                head_dim: 16,
                head_dim_v: 16,
            },
            ..config(dtype, None)
        })
        .unwrap();
        let (err, tol) = report.check.unwrap();
        assert!(err <= tol, "{dtype:?}: {err} over {tol}");
    }
}

/// Steps recorded five to an encoder (the last submission holds two): each step reads what
/// the one before it wrote within the same submission, and the result still agrees.
#[test]
fn several_steps_per_submission_agree_with_the_host_reference() {
    let report = run(&Config {
        steps_per_submit: 5,
        ..config(Dtype::F32, Some(8))
    })
    .unwrap();
    let (err, tol) = report.check.unwrap();
    assert!(err <= tol, "five steps per submission: {err} over {tol}");
    let submitted: Vec<usize> = (0..report.step_cpu.len())
        .filter(|&t| !report.step_cpu[t].finish.is_zero())
        .collect();
    assert_eq!(submitted, [4, 9, 11]);
    // Where the adapter has timestamps: a gap between each two steps.
    assert_eq!(report.step_gap_ms.is_some(), report.step_gpu_ms.is_some());
    if let Some(gaps) = &report.step_gap_ms {
        assert_eq!(gaps.len(), 11);
        assert!(gaps.iter().all(|g| g.is_finite() && *g >= 0.0), "{gaps:?}");
    }
}

#[test]
fn a_cache_too_short_for_the_run_is_refused() {
    let c = Config {
        capacity: 20,
        ..config(Dtype::F32, None)
    };
    let err = run(&c).unwrap_err().to_string();
    assert!(err.contains("raise --capacity"), "{err}");
    let err = run(&config(Dtype::F32, Some(0))).unwrap_err().to_string();
    assert!(err.contains("--page-size must be at least 1"), "{err}");
}

#[test]
fn a_profiled_run_times_each_op_of_a_step() {
    let report = run(&Config {
        profile: true,
        ..config(Dtype::F16, None)
    })
    .unwrap();
    let (err, tol) = report.check.unwrap();
    assert!(err <= tol, "profiled: {err} over {tol}");
    // Timestamps between the ops where the adapter has them for the steps too.
    assert_eq!(report.op_gpu_ms.is_some(), report.step_gpu_ms.is_some());
    if let Some(ops) = &report.op_gpu_ms {
        assert_eq!(ops.len(), decode_loop::STEP_OPS.len());
        assert!(ops.iter().all(|ms| ms.is_finite() && *ms >= 0.0), "{ops:?}");
    }
}

/// Zero and absurd flag values are refused by `check`, naming the flag, where they panicked
/// on an overflow or reached the device.
#[test]
fn absurd_flag_values_are_refused_naming_the_flag() {
    let base = config(Dtype::F32, None);
    let heads = |n_heads, n_kv_heads, head_dim| Config {
        heads: Heads {
            n_heads,
            n_kv_heads,
            head_dim,
            head_dim_v: head_dim,
        },
        ..config(Dtype::F32, None)
    };
    let cases = [
        (heads(0, 2, 32), "--heads 0 over --kv-heads 2"),
        (heads(4, 0, 32), "--kv-heads 0"),
        (heads(4, 3, 32), "a divisor of --heads"),
        (heads(4, 2, 0), "--head-dim 0"),
        (heads(4, 2, 2), "--head-dim 2: give a multiple of 4"),
        (heads(4, 2, 100_000), "--head-dim 100000"),
        (heads(u32::MAX, 1, 64), "--heads × --head-dim"),
        (
            Config {
                slots: u32::MAX,
                ..base.clone()
            },
            "the cache (--slots × --capacity",
        ),
        (
            Config {
                capacity: u32::MAX,
                ..base.clone()
            },
            "the cache (--slots × --capacity",
        ),
        (
            Config {
                prompt: u32::MAX,
                capacity: u32::MAX,
                ..base.clone()
            },
            "need 4294967307 rows; raise --capacity",
        ),
        (
            Config {
                page_size: Some(u32::MAX),
                ..base.clone()
            },
            "--page-size 4294967295 is over --capacity",
        ),
    ];
    for (c, needle) in cases {
        let err = decode_loop::check(&c).unwrap_err().to_string();
        assert!(err.contains(needle), "{needle}: {err}");
    }
}
