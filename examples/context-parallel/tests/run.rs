//! The split on this machine's adapter, two and three devices of it: every output equal to
//! the f64 reference by check's rule, as the same work on one device is.

use attn_dsl::Dtype;
use context_parallel::plan::Plan;
use context_parallel::{Check, Config, run};
use runtime::Heads;

fn config(devices: usize, dtype: Dtype, causal: bool) -> Config {
    Config {
        seq: 512,
        heads: Heads::new(4, 2, 32),
        dtype,
        causal,
        devices,
        backward: true,
        runs: 1,
        check: Check::Full,
        seed: 3,
    }
}

#[test]
fn the_split_over_devices_meets_the_reference() {
    for c in [
        config(2, Dtype::F32, true),
        config(2, Dtype::Bf16, false),
        Config {
            seq: 768,
            check: Check::Rows(3),
            ..config(3, Dtype::F32, true)
        },
    ] {
        let r = run(&c).unwrap();
        assert_eq!(r.adapters.len(), c.devices);
        let names: Vec<&str> = r.verdicts.iter().map(|(n, _)| n.as_str()).collect();
        for want in ["split o", "split lse", "split dq", "one o"] {
            assert!(names.contains(&want), "{names:?}");
        }
        if c.check == Check::Full {
            assert!(names.contains(&"split dk") && names.contains(&"split dv"));
        } else {
            assert!(r.dkv_difference.is_some());
        }
        for (name, v) in &r.verdicts {
            assert!(v.pass(), "{c:?}: {name} {} over {}", v.error, v.bound);
        }
        assert!(r.passed());
        // Device 1 sent its parts (and its dQ) to device 0; device 0 sent O and LSE back.
        assert!(r.forward.bytes > 0 && r.backward.unwrap().bytes > 0);
    }
}

#[test]
fn causal_pairs_are_balanced_and_every_key_chunk_has_one_owner() {
    for devices in 1..6 {
        let plan = Plan {
            devices,
            chunk: 64,
            causal: true,
        };
        let mut held: Vec<usize> = (0..devices).flat_map(|d| plan.owned(d)).collect();
        held.sort();
        assert_eq!(held, (0..plan.chunks()).collect::<Vec<_>>());
        for key in 0..plan.chunks() {
            assert!(plan.owned(plan.owner(key)).contains(&key));
        }
        let pairs: Vec<u64> = (0..devices).map(|d| plan.pairs(d)).collect();
        assert!(pairs.iter().all(|p| *p == pairs[0]), "{pairs:?}");
        let n = u64::from(plan.chunk) * plan.chunks() as u64;
        assert_eq!(pairs.iter().sum::<u64>(), n * (n + 1) / 2);
    }
}

#[test]
fn a_sequence_that_does_not_cut_into_aligned_chunks_is_refused_naming_the_flag() {
    let c = Config {
        seq: 500,
        ..config(2, Dtype::F32, true)
    };
    let e = run(&c).unwrap_err().to_string();
    assert!(
        e.contains("--seq 500") && e.contains("multiple of 256"),
        "{e}"
    );
    let c = Config {
        devices: 0,
        ..config(2, Dtype::F32, true)
    };
    assert!(run(&c).unwrap_err().to_string().contains("--devices"));
}
