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
