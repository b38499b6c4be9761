//! `bench`'s measurements: GPU-timed, every schedule present, FLOPs by FlashAttention's
//! convention.

use runtime::bench::{self, BenchShape};
use runtime::{Gpu, Heads, kernels};

#[test]
fn flops_follow_flash_attention_convention() {
    let seeds = BenchShape {
        seq: 512,
        heads: Heads {
            n_heads: 12,
            n_kv_heads: 4,
            head_dim: 64,
        },
        causal: true,
    };
    assert_eq!(
        seeds.forward_flops(),
        4.0 * 512.0 * 512.0 * 12.0 * 64.0 / 2.0
    );
    assert_eq!(
        BenchShape {
            causal: false,
            ..seeds
        }
        .forward_flops(),
        2.0 * seeds.forward_flops()
    );
}

#[test]
fn every_kernel_and_schedule_is_gpu_timed() {
    let gpu = Gpu::new(kernels::FAMILY.iter().copied()).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        gpu.has_timestamps(),
        "{} has no TIMESTAMP_QUERY",
        gpu.describe()
    );
    let shape = BenchShape {
        seq: 40,
        heads: Heads {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 64,
        },
        causal: true,
    };
    let rows = bench::run(&gpu, shape, 1, 3).unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r.kernel.as_str()).collect();
    for wanted in [
        "forward",
        "backward split",
        "backward streaming-cas",
        "backward recompute",
    ] {
        assert!(names.contains(&wanted), "{names:?}");
    }
    for row in &rows {
        let t = row
            .timing
            .unwrap_or_else(|| panic!("{} did not run: {}", row.kernel, row.note));
        assert!(
            t.median_ms > 0.0 && t.min_ms <= t.median_ms && t.runs == 3,
            "{}: {t:?}",
            row.kernel
        );
        assert_eq!(
            row.flops,
            if row.kernel == "forward" { 1.0 } else { 2.5 } * shape.forward_flops()
        );
    }
}
