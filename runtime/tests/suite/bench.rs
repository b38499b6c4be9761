//! `bench`'s measurements: GPU-timed, every schedule present, FLOPs by FlashAttention's
//! convention.

use runtime::BlockOn;
use runtime::harness::bench::{self, BenchShape};
use runtime::{Gpu, Heads, kernels};

/// One causal sequence of `seq` rows, `n_heads` over `n_kv_heads`, head_dim 64.
fn causal(seq: u32, n_heads: u32, n_kv_heads: u32) -> BenchShape {
    BenchShape {
        batch: 1,
        packed: None,
        seq,
        heads: Heads {
            n_heads,
            n_kv_heads,
            head_dim: 64,
            head_dim_v: 64,
        },
        causal: true,
        window: None,
        sinks: false,
    }
}

#[test]
fn flops_follow_flash_attention_convention() {
    let seeds = causal(512, 12, 4);
    assert_eq!(
        seeds.forward_flops(),
        4.0 * 512.0 * 512.0 * 12.0 * 64.0 / 2.0
    );
    assert_eq!(
        BenchShape {
            batch: 1,
            packed: None,
            causal: false,
            ..seeds
        }
        .forward_flops(),
        2.0 * seeds.forward_flops()
    );
}

#[test]
fn every_kernel_and_schedule_is_gpu_timed() {
    let gpu = Gpu::new(kernels::FAMILY.iter().copied())
        .block_on()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        gpu.has_timestamps(),
        "{} has no TIMESTAMP_QUERY",
        gpu.describe()
    );
    let shape = BenchShape {
        // With sinks, so that every backward row times the dSinks kernel too.
        sinks: true,
        ..causal(40, 4, 2)
    };
    let rows = bench::run(&gpu, shape.clone(), 1, 3, bench::Parts::All).unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r.kernel.as_str()).collect();
    for wanted in [
        "forward tile-1",
        "forward flash 16x32/4@64",
        "backward split",
        "backward streaming-16x8/2@64",
        "backward recompute",
        "backward tiled-16x8/2@64",
        // The half-precision backward, and its kernels timed alone.
        "backward tiled-16x8/2@64 bf16",
        "part: attention_backward_dq_flash",
    ] {
        assert!(names.contains(&wanted), "{wanted} missing from {names:?}");
    }
    for row in &rows {
        let Some(t) = row.timing else {
            // Only a configuration over the device's workgroup memory may be left out.
            assert!(
                row.note.contains("workgroup memory"),
                "{}: {}",
                row.kernel,
                row.note
            );
            continue;
        };
        assert!(
            t.median_ms > 0.0 && t.min_ms <= t.median_ms && t.runs == 3,
            "{}: {t:?}",
            row.kernel
        );
        // A kernel of the planned half-precision backward, timed alone: no FLOP count.
        if row.kernel.starts_with("part: ") {
            assert!(row.tflops().is_none(), "{}", row.kernel);
            continue;
        }
        let forward = row.kernel.starts_with("forward");
        assert_eq!(
            row.flops,
            if forward { 1.0 } else { 2.5 } * shape.forward_flops()
        );
        assert!(
            row.speedup().is_some_and(|x| x > 0.0),
            "{} has no ratio",
            row.kernel
        );
    }
    // Tuning never picks a kernel named by a failing check row.
    let table = bench::tune(&gpu, &rows, &["forward flash 16x32/4@64 (planned)".into()]);
    let forward = table.forward[&64];
    assert_ne!(forward.label(), "16x32/4@64");
    assert!(runtime::plan::tuning::forward_candidates(64).contains(&forward));
    let schedule: runtime::Schedule = table.backward[&64].parse().unwrap();
    assert!(
        rows.iter()
            .any(|r| r.kernel.starts_with(&format!("backward {schedule}")))
    );
}

/// `bench --decode`'s rows: the bytes a decode moves, every decode and the copy timed and
/// reported in order, the caches narrowed to those named and the staged pass's phase rows.
#[test]
fn decode_rows_count_the_cache_and_time_every_decode_and_the_copy() {
    let shape = bench::DecodeShape {
        cache_len: 300,
        batch: 1,
        heads: Heads {
            n_heads: 8,
            n_kv_heads: 2,
            head_dim: 64,
            head_dim_v: 64,
        },
    };
    // K and V: 300 rows of 2 KV heads; Q and O: 8 heads; 64 floats of 4 bytes each.
    assert_eq!(shape.bytes(), 4.0 * 64.0 * (2.0 * 300.0 * 2.0 + 2.0 * 8.0));
    let gpu = Gpu::new(kernels::FAMILY.iter().copied())
        .block_on()
        .unwrap_or_else(|e| panic!("{e}"));
    let copies = bench::copy_bandwidth(&gpu, 0, 1).unwrap();
    assert!(copies[0].kernel.starts_with("copy kernel"));
    assert!(copies[1].kernel.starts_with("copy_buffer_to_buffer"));
    for copy in &copies {
        assert!(copy.timing.median_ms > 0.0 && copy.gbps() > 0.0);
        assert_eq!(
            copy.bytes % (2.0 * 4.0 * 16384.0),
            0.0,
            "whole workgroups, read + written"
        );
    }
    let mut seen = Vec::new();
    // The f32 cache's rows alone, its staged pass also cut to its phases.
    let which = bench::DecodeRows {
        caches: &["f32".to_string()],
        phases: true,
    };
    let rows = bench::decode(&gpu, (shape, which), None, (0, 1), |r| {
        seen.push(r.kernel.clone())
    })
    .unwrap();
    let kernels: Vec<&str> = rows.iter().map(|r| r.kernel.as_str()).collect();
    assert_eq!(
        seen, kernels,
        "every row reported as it is measured, in order"
    );
    assert!(kernels[0].starts_with("decode plain"), "{kernels:?}");
    assert!(
        kernels[1].starts_with("decode split-K 10x32"),
        "{kernels:?}"
    );
    assert!(kernels[2].contains("paged"), "{kernels:?}");
    let caches = kernels.iter().filter(|k| k.contains(" + reduce, "));
    assert!(caches.clone().all(|k| k.contains(", f32 ")), "{kernels:?}");
    assert!(caches.count() >= 1, "{kernels:?}");
    let phases = kernels.iter().filter(|k| k.contains("phases: ")).count();
    assert_eq!(
        phases,
        2 + 2 * 3 + 1,
        "all, none, three phases alone and without, and without loads: {kernels:?}"
    );
    assert!(rows.iter().all(|r| r.timing.median_ms > 0.0));
}

/// A cascade row times the cascade and the paged decode of the same work, and counts the
/// prefix once for the cascade and once per sequence for the paged decode.
#[test]
fn cascade_rows_time_both_decodes_and_count_the_prefix_as_each_reads_it() {
    let h = Heads {
        n_heads: 8,
        n_kv_heads: 2,
        head_dim: 64,
        head_dim_v: 64,
    };
    let gpu = Gpu::new(kernels::FAMILY.iter().copied())
        .block_on()
        .unwrap_or_else(|e| panic!("{e}"));
    let r = bench::cascade::row(&gpu, h, (64, 16, 4), (runtime::Dtype::F32, None), 1).unwrap();
    assert!(r.cascade_ms > 0.0 && r.paged_ms > 0.0);
    // K and V rows: 2 KV heads of 64 + 64 floats.
    let row = 2.0 * 128.0 * 4.0;
    assert_eq!(r.cascade_bytes, row * (64.0 + 4.0 * 16.0));
    assert_eq!(r.paged_bytes, row * 4.0 * (64.0 + 16.0));
}

/// `bench --e2e`'s projection rows: a decode step's four Linears (or Q, K and V as one
/// Linear cut into parts, and O) recorded into one encoder and waited for, GPU-timed, the
/// wall time at least the GPU's.
#[test]
fn a_steps_projections_are_timed_on_the_gpu_and_the_wall() {
    let gpu = Gpu::new([]).block_on().unwrap();
    for rows in [1, 16] {
        for (fused, named) in [(false, "Q K V O"), (true, "QKV O")] {
            let how = (attn_dsl::Dtype::F32, fused);
            let row = bench::e2e::projections(&gpu, rows, [128, 64], how, 3).unwrap();
            assert!(row.gpu_ms > 0.0, "{row:?}");
            assert!(row.wall_ms >= row.gpu_ms, "{row:?}");
            let what = format!("projections {named}, {rows} row");
            assert!(row.what.starts_with(&what), "{row:?}");
        }
    }
}

/// `bench --only phases` ends with each configuration's residency: the planned forward
/// (and the other tensor-core candidates) and both halves of each backward configuration
/// in every half dtype,
/// each counting between one workgroup in flight and its whole grid (the planned scalar
/// configurations on an adapter without tensor cores), beside how many of its workgroups
/// the device's workgroup memory limit holds.
#[test]
fn phase_rows_end_with_every_configurations_residency() {
    let gpu = Gpu::new([]).block_on().unwrap();
    let shape = causal(128, 4, 4);
    let rows = bench::run(&gpu, shape, 1, 1, bench::Parts::Phases).unwrap();
    let resident: Vec<_> = rows
        .iter()
        .filter(|r| r.kernel.starts_with("residency: "))
        .collect();
    let names: Vec<&str> = resident.iter().map(|r| r.kernel.as_str()).collect();
    for dtype in gpu.half_dtypes() {
        let of = |part: &str| {
            names
                .iter()
                .filter(|n| n.contains(part) && n.contains(&format!(" {}", dtype.name())))
                .count()
        };
        assert_eq!(of(" (planned)"), 1, "{names:?}");
        // Every backward configuration's two halves (the first alone without tensor cores).
        let (dq, dkdv) = (of("dQ half"), of("dK/dV half"));
        assert!(dq >= 1 && dq == dkdv, "{names:?}");
    }
    for r in resident {
        let words: Vec<&str> = r.note.split_whitespace().collect();
        let (held, grid): (u32, u32) = (words[0].parse().unwrap(), words[7].parse().unwrap());
        assert!((1..=grid).contains(&held), "{}: {}", r.kernel, r.note);
        // The planner's estimate beside it: the device's limit over the kernel's bytes.
        let bytes: u32 = words[8].trim_start_matches('(').parse().unwrap();
        let limit = gpu.limits().max_compute_workgroup_storage_size;
        assert!(bytes > 0, "{}: {}", r.kernel, r.note);
        let estimate = format!("{} in the device's {limit})", limit / bytes);
        assert!(r.note.ends_with(&estimate), "{}: {}", r.kernel, r.note);
    }
}

/// The phase model's summary on the `all` row: none plus each phase alone (only − none),
/// and all as a share of it, beside what the row already noted.
#[test]
fn the_all_row_notes_the_sum_of_each_phase_alone() {
    use runtime::timing::Timing;
    let shape = causal(64, 1, 1);
    let row = |set: &str, ms: f64, note: &str| bench::BenchRow {
        shape: shape.clone(),
        kernel: format!("phases 64x32 f16: {set}"),
        timing: Some(Timing {
            median_ms: ms,
            min_ms: ms,
            runs: 1,
        }),
        flops: 0.0,
        note: note.into(),
        baseline_ms: None,
    };
    let mut rows = vec![
        row("all", 0.9, "deterministic"),
        row("none", 0.2, ""),
        row("only stage", 0.4, ""),
        row("without stage", 0.7, ""),
        row("only scores", 0.5, ""),
        row("only softmax", 0.3, ""),
        row("only accumulate", 0.4, ""),
    ];
    bench::note_phase_sums(&mut rows);
    // 0.2 + (0.2 + 0.3 + 0.1 + 0.2) = 1.0 ms, all 90% of it.
    assert_eq!(
        rows[0].note,
        "deterministic; none + each alone 1.000 ms; all is 90% of it"
    );
    assert!(rows[1..].iter().all(|r| r.note.is_empty()));
}
