//! The kernels on this machine's adapter (lavapipe in CI). A missing adapter fails with
//! the install command, never a silent skip.

use attn_dsl::{Gqa, KernelSpec, Masks, Op};
use runtime::BlockOn;
use runtime::harness::cases::{self, Case, ModCase, Runner, documents};
use runtime::plan::kernels::AttentionSpec;
use runtime::verify::compare::judge_attention;
use runtime::verify::random;
use runtime::verify::reference::Problem;
use runtime::{ForwardInput, Gpu, Heads, Kernel, kernels};

fn gpu() -> Gpu {
    Gpu::new(kernels::FAMILY.iter().copied())
        .block_on()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Runs the cases of the quick matrix (`check`'s: every op, backward schedule, dtype,
/// modifier and cache layout at least once) that `select` picks, seeded by their place in
/// it, on a device of their own, and asserts every row passes and at least `min_rows` ran.
/// The quick matrix runs in parts so that their kernels compile on every core; the default
/// matrix's other rows (more head_dims, widths and lengths) are `check --full`'s.
fn quick_matrix_passes(select: impl Fn(&Case) -> bool, min_rows: usize) {
    let gpu = gpu();
    let mut runner =
        Runner::new(&gpu, kernels::FAMILY.iter().copied(), &kernels::BACKWARD).unwrap();
    runner.backward.scratch_budget = 4 << 20;
    let mut rows = 0;
    let mut failures = Vec::new();
    for (i, case) in cases::quick_matrix().iter().enumerate() {
        if !select(case) {
            continue;
        }
        for r in cases::run_case(&gpu, &mut runner, case, 7 + i as u64).unwrap() {
            rows += 1;
            if !r.pass() {
                failures.push(format!(
                    "{} {} {}: {:?}",
                    r.label,
                    case.shape_label(),
                    case.mask_label(),
                    r.verdicts
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "failing rows:\n{}",
        failures.join("\n")
    );
    assert!(rows >= min_rows, "the matrix shrank to {rows} rows");
}

#[test]
fn forward_and_rope_rows_of_the_quick_matrix_pass() {
    quick_matrix_passes(|c| matches!(c.kind(), "forward" | "rope"), MIN_ROWS[0]);
}

#[test]
fn decode_rows_of_the_quick_matrix_pass() {
    quick_matrix_passes(|c| c.kind() == "decode", MIN_ROWS[1]);
}

#[test]
fn backward_rows_of_the_quick_matrix_without_modifiers_pass() {
    quick_matrix_passes(
        |c| c.kind() == "backward" && c.mods == ModCase::default(),
        MIN_ROWS[2],
    );
}

#[test]
fn backward_rows_of_the_quick_matrix_with_modifiers_pass() {
    quick_matrix_passes(
        |c| c.kind() == "backward" && c.mods != ModCase::default(),
        MIN_ROWS[3],
    );
}

/// Rows each part ran when last counted on lavapipe (adapters with fewer features run
/// fewer schedules): a part that runs fewer lost cases or schedules.
const MIN_ROWS: [usize; 4] = [100, 114, 50, 137];

/// A row whose document starts after it has no visible key. The runtime refuses such a
/// `seg`, so this dispatches through the generated bindings directly: the kernel must
/// store O = 0 and LSE = +inf for that row (no NaN) and leave the other rows right.
#[test]
fn empty_row_stores_zero_and_infinite_lse_through_generated_bindings() {
    use kernels::attention_forward as fwd;
    use runtime::tensor::buffers;
    let gpu = gpu();
    let (seq, heads, d) = (5u32, 2u32, fwd::HEAD_DIM);
    let n = (seq * heads * d) as usize;
    let (q, k, v) = (random(n, 1), random(n, 2), random(n, 3));
    // Each row's document start, then its end: row 2's document "starts" at 3, so it sees
    // nothing.
    let seg = [0u32, 0, 3, 3, 3, 2, 2, 5, 5, 5];
    let dims = fwd::Dims {
        seq_len: seq,
        n_heads: heads,
        n_kv_heads: heads,
        head_dim: d,
        batch: 1,
        ..Default::default()
    };
    let params = fwd::Params {
        scale: 0.125,
        ..Default::default()
    };
    let (layout, pipeline) = fwd::create_pipeline(&gpu.device);
    let o = buffers::output::<f32>(&gpu, "o", n);
    let lse = buffers::output::<f32>(&gpu, "lse", (seq * heads) as usize);
    let bind = fwd::Bindings {
        q: &buffers::storage(&gpu, "q", &q),
        k: &buffers::storage(&gpu, "k", &k),
        v: &buffers::storage(&gpu, "v", &v),
        o: &o,
        lse: &lse,
        dims: &buffers::uniform(&gpu, "dims", bytemuck::bytes_of(&dims)),
        params: &buffers::uniform(&gpu, "params", bytemuck::bytes_of(&params)),
        seg: &buffers::storage(&gpu, "seg", &seg),
    }
    .bind_group(&gpu.device, &layout);
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        let [x, y, z] = fwd::dispatch_grid(&dims);
        assert_eq!([x, y, z], [seq, heads, 1]);
        pass.dispatch_workgroups(x, y, z);
    }
    gpu.queue.submit([encoder.finish()]);
    let out = buffers::read_many::<f32>(&gpu, &[(&o, n), (&lse, (seq * heads) as usize)])
        .block_on()
        .unwrap();
    let (o, lse) = (&out[0], &out[1]);
    let row = |s: u32, h: u32| ((s * heads + h) * d) as usize..((s * heads + h + 1) * d) as usize;
    for h in 0..heads {
        assert!(
            o[row(2, h)].iter().all(|x| *x == 0.0),
            "empty row's O must be 0"
        );
        assert_eq!(lse[(2 * heads + h) as usize], f32::INFINITY);
    }
    assert!(o.iter().chain(lse.iter()).all(|x| !x.is_nan()));
    let p = Problem {
        batch: 1,
        n_q: seq as usize,
        n_k: seq as usize,
        n_heads: heads as usize,
        n_kv_heads: heads as usize,
        head_dim: d as usize,
        scale: 0.125,
        causal: true,
        seg: Some(&seg),
        ..Default::default()
    };
    let verdicts = judge_attention(&p, [&q, &k, &v], o, None);
    assert!(verdicts.iter().all(|(_, v)| v.pass()), "{verdicts:?}");
}

/// attn-dsl is usable at run time: a non-causal document-masked forward with a fixed GQA
/// ratio of 3 and 4 query rows per workgroup, compiled, dispatched and checked.
#[test]
fn spec_compiled_at_run_time_runs_and_matches_the_reference() {
    let gpu = gpu();
    let mut spec = KernelSpec::standard("fwd_doc_only", Op::Forward, 32, Masks::new(false, true));
    spec.gqa = Gqa::Ratio(3);
    spec.grid.tile = 4;
    let abi = attn_dsl::compile(&spec).unwrap();
    let kernel = Kernel::new(&gpu, &abi).block_on().unwrap();
    let heads = Heads {
        n_heads: 6,
        n_kv_heads: 2,
        head_dim: 32,
        head_dim_v: 32,
    };
    let seq = 45u32; // not a multiple of the tile
    let (q, k, v) = (
        random(45 * 6 * 32, 4),
        random(45 * 2 * 32, 5),
        random(45 * 2 * 32, 6),
    );
    let seg = documents(seq, 3);
    let input = ForwardInput {
        batch: 1,
        seq_len: seq,
        heads,
        q: &q,
        k: &k,
        v: &v,
        seg: Some(&seg),
        scale: Some(0.2),
        mods: Default::default(),
    };
    let out = runtime::forward(&gpu, &kernel, &input).block_on().unwrap();
    let p = Problem {
        batch: 1,
        n_q: 45,
        n_k: 45,
        n_heads: 6,
        n_kv_heads: 2,
        head_dim: 32,
        scale: f64::from(0.2f32),
        causal: false,
        seg: Some(&seg),
        ..Default::default()
    };
    let verdicts = judge_attention(&p, [&q, &k, &v], &out.o, Some(&out.lse));
    assert!(verdicts.iter().all(|(_, v)| v.pass()), "{verdicts:?}");
}

/// The subgroup forward is right on either path, and takes the shuffle path exactly when
/// the adapter's subgroups hold a row group. A copy with the fallback's `row_max` broken on
/// purpose tells which path ran: right means the shuffles did.
#[test]
fn subgroup_forward_shuffles_only_where_subgroups_hold_a_row_group() {
    let gpu = gpu();
    assert!(
        gpu.has_subgroups(),
        "{} lacks SUBGROUP; lavapipe (mesa-vulkan-drivers) has it",
        gpu.describe()
    );
    let (sg_min, sg_max) = (gpu.info().subgroup_min_size, gpu.info().subgroup_max_size);
    let masks = Masks::new(true, false);
    let mut decided = 0;
    // 8 and 16 invocations per row group.
    for (tile, inner, rows, wg) in [(64, 16, 4, 128), (32, 32, 2, 256)] {
        let config = attn_dsl::FlashConfig {
            tile,
            inner,
            rows_per_thread: rows,
            workgroup_size: wg,
            subgroups: true,
            matrix: attn_dsl::Matrix::Scalar,
        };
        let label = config.label();
        let tx = wg / (tile / rows);
        let abi = runtime::plan::kernels::flash_forward(
            AttentionSpec::new(64, masks, runtime::Dtype::F32),
            config,
        )
        .unwrap();
        assert!(forward_is_right(&gpu, &abi), "{label} is wrong");
        let mut broken = abi.clone();
        broken.wgsl = abi
            .wgsl
            .replace(
                "fn row_max(r: u32) -> f32 {",
                "fn row_max(r: u32) -> f32 {\n    return 1.0e30;\n}\n\nfn row_max_unused(r: u32) -> f32 {",
            )
            .into();
        assert_ne!(broken.wgsl, abi.wgsl, "the fallback's row_max moved");
        let shuffled = forward_is_right(&gpu, &broken);
        if sg_min >= tx {
            assert!(
                shuffled,
                "{label}: subgroups of {sg_min}+ hold {tx} lanes, yet the fallback ran"
            );
            decided += 1;
        } else if sg_max < tx {
            assert!(
                !shuffled,
                "{label}: subgroups of {sg_max} cannot hold {tx} lanes, yet shuffles ran"
            );
            decided += 1;
        }
    }
    assert!(
        decided > 0,
        "subgroup sizes {sg_min}..{sg_max} decided no case"
    );
}

/// Runs a causal d64 forward of `abi` on a 70-row problem; whether it matches the reference.
fn forward_is_right(gpu: &Gpu, abi: &attn_dsl::KernelAbi) -> bool {
    let heads = Heads {
        n_heads: 2,
        n_kv_heads: 2,
        head_dim: 64,
        head_dim_v: 64,
    };
    let seq = 70usize;
    let n = seq * 2 * 64;
    let (q, k, v) = (random(n, 11), random(n, 12), random(n, 13));
    let kernel = Kernel::new(gpu, abi).block_on().unwrap();
    let input = ForwardInput {
        batch: 1,
        seq_len: seq as u32,
        heads,
        q: &q,
        k: &k,
        v: &v,
        seg: None,
        scale: None,
        mods: Default::default(),
    };
    let out = runtime::forward(gpu, &kernel, &input).block_on().unwrap();
    let p = Problem {
        batch: 1,
        n_q: seq,
        n_k: seq,
        n_heads: 2,
        n_kv_heads: 2,
        head_dim: 64,
        scale: f64::from(heads.default_scale()),
        causal: true,
        seg: None,
        ..Default::default()
    };
    judge_attention(&p, [&q, &k, &v], &out.o, Some(&out.lse))
        .iter()
        .all(|(_, v)| v.pass())
}

/// The tensor-core forward needs cooperative matrices (lavapipe has none): elsewhere its
/// creation is refused with the feature to look for; where they exist `check` proves it.
#[test]
fn tensor_core_forward_is_refused_without_cooperative_matrices() {
    let gpu = gpu();
    let abi = &kernels::attention_forward_flash_tc_d128::ABI;
    let made = Kernel::new(&gpu, abi).block_on();
    match gpu.has_coop16() {
        true => assert!(made.is_ok(), "{:?}", made.err()),
        false => {
            let err = made.err().expect("refused").to_string();
            assert!(err.contains("matrix = coop16"), "{err}");
            assert!(err.contains("EXPERIMENTAL_COOPERATIVE_MATRIX"), "{err}");
        }
    }
}
