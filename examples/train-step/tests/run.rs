//! Training steps on this machine's adapter, at small shapes: the gradients agree with the
//! f64 host reference, by the planner's schedule and by a named one.

use attn_dsl::Dtype;
use runtime::{Heads, Schedule};
use train_step::{Config, run};

fn config(dtype: Dtype, schedule: Option<Schedule>) -> Config {
    Config {
        batch: 2,
        seq: 33,
        heads: Heads {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 32,
            head_dim_v: 32,
        },
        dtype,
        causal: true,
        steps: 2,
        schedule,
        check: true,
        seed: 5,
    }
}

#[test]
fn training_steps_agree_with_the_host_reference() {
    for (dtype, schedule) in [
        (Dtype::F32, None),
        (Dtype::F32, Some(Schedule::Split)),
        (Dtype::Bf16, None),
    ] {
        let r = run(&config(dtype, schedule)).unwrap();
        let (err, tol) = r.check.unwrap();
        assert!(err <= tol, "{dtype:?} {}: {err} over {tol}", r.schedule);
        assert!(r.scalar.is_finite());
    }
}

/// Zero and absurd flag values are refused naming the flag, where they reached the kernels'
/// compiler or aborted on a host allocation.
#[test]
fn absurd_flag_values_are_refused_naming_the_flag() {
    let heads = |n_heads, n_kv_heads, head_dim| Config {
        heads: Heads {
            n_heads,
            n_kv_heads,
            head_dim,
            head_dim_v: head_dim,
        },
        ..config(Dtype::F32, None)
    };
    let base = config(Dtype::F32, None);
    for (c, needle) in [
        (
            Config {
                seq: 0,
                ..base.clone()
            },
            "--batch and --seq must be at least 1",
        ),
        (heads(4, 0, 32), "--kv-heads 0"),
        (heads(0, 2, 32), "--heads 0"),
        (heads(4, 2, 0), "--head-dim 0: give a multiple of 4"),
        (heads(4, 2, 100_000), "--head-dim 100000"),
    ] {
        let err = train_step::check(&c).unwrap_err().to_string();
        assert!(err.contains(needle), "{needle}: {err}");
    }
    for c in [
        Config {
            batch: u32::MAX,
            ..base.clone()
        },
        Config {
            seq: u32::MAX,
            ..base.clone()
        },
        heads(u32::MAX, 1, 32),
    ] {
        let err = run(&c).unwrap_err().to_string();
        assert!(
            err.contains("Q (--batch × --seq × --heads × --head-dim)"),
            "{err}"
        );
    }
}
