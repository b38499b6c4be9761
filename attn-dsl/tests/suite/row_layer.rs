//! The fused LayerNorm + Linear described with attention's words: a row grid, dx owned,
//! the row sums atomic or two-pass, and the ownership rule catching an owned row sum.

use attn_dsl::row_layer::{self, RowSums};
use attn_dsl::signature::{self, Role};
use attn_dsl::spec::Axis;
use attn_dsl::{DslError, Field, KernelSpec, Limits, Op, Target, WriteMode, compile};

/// The backward's first kernel: dx, dγ, dβ.
fn backward(sums: RowSums) -> KernelSpec {
    backward_of(8, 16, sums)
}

/// The backward's second kernel: dW, db.
fn weight_grad(sums: RowSums) -> KernelSpec {
    weight_grad_of(8, 16, sums)
}

fn backward_of(hidden: u32, out: u32, sums: RowSums) -> KernelSpec {
    row_layer::spec("ln_bwd", Op::LayernormLinearBackward, hidden, out, 16, sums)
}

fn weight_grad_of(hidden: u32, out: u32, sums: RowSums) -> KernelSpec {
    row_layer::spec(
        "ln_wgrad",
        Op::LayernormLinearWeightGrad,
        hidden,
        out,
        16,
        sums,
    )
}

fn problem(spec: &KernelSpec) -> (Field, String) {
    match compile(spec) {
        Err(DslError::Spec { field, problem }) => (field, problem),
        other => panic!("expected a spec error, got {:?}", other.map(|a| a.name)),
    }
}

fn layout(spec: &KernelSpec, name: &str) -> Vec<Axis> {
    signature::tensors(spec)
        .into_iter()
        .find(|t| t.name == name)
        .map(|t| t.layout.to_vec())
        .unwrap_or_default()
}

fn bound(spec: &KernelSpec) -> Vec<&'static str> {
    signature::tensors(spec)
        .iter()
        .filter(|t| t.role != Role::Uniform)
        .map(|t| t.name)
        .collect()
}

#[test]
fn dw_owned_under_a_row_grid_is_a_race_at_dw() {
    let mut spec = weight_grad(RowSums::Atomic);
    spec.writes[0].1 = WriteMode::Owned;
    assert_eq!(spec.writes[0].0, "dw");
    let (field, message) = problem(&spec);
    assert_eq!(field, Field::Write("dw".into()));
    assert!(message.contains("lacks axis `row_tile`"), "{message}");
    assert!(
        message.contains("`scratch` (the two-pass schedule"),
        "{message}"
    );
}

#[test]
fn every_row_kernel_compiles_through_naga_at_the_seed_and_the_real_shape() {
    for (hidden, out) in [(8, 16), (768, 3072), (5, 3)] {
        for sums in [RowSums::Atomic, RowSums::TwoPass] {
            let abi = compile(&backward_of(hidden, out, sums))
                .unwrap_or_else(|e| panic!("{hidden}->{out} {sums:?}: {e}"));
            let atomic = abi.binding("dgamma").unwrap().wgsl_type.contains("atomic");
            assert_eq!(atomic, sums == RowSums::Atomic);
            assert!(abi.binding("dx").is_some());
            // The statistics are recomputed with the forward's own function.
            assert!(abi.wgsl.contains("fn tile_stats"));
            let abi = compile(&weight_grad_of(hidden, out, sums))
                .unwrap_or_else(|e| panic!("weight grad {hidden}->{out} {sums:?}: {e}"));
            let atomic = abi.binding("dw").unwrap().wgsl_type.contains("atomic");
            assert_eq!(atomic, sums == RowSums::Atomic);
            assert!(abi.binding("db").is_some());
        }
        for op in [Op::LayernormLinear, Op::LayernormLinearReduce] {
            let spec = row_layer::spec("ln", op, hidden, out, 4, RowSums::Atomic);
            let abi = compile(&spec).unwrap_or_else(|e| panic!("{op:?} {hidden}->{out}: {e}"));
            assert!(abi.wgsl.contains("@compute"));
            assert_eq!(abi.out_dim, out);
        }
    }
}

#[test]
fn row_sums_bind_the_whole_gradient_when_atomic_and_partials_when_two_pass() {
    let two_pass = weight_grad(RowSums::TwoPass);
    assert_eq!(
        layout(&weight_grad(RowSums::Atomic), "dw"),
        [Axis::N, Axis::K]
    );
    assert_eq!(layout(&two_pass, "dw"), [Axis::RowTile, Axis::N, Axis::K]);
    assert_eq!(layout(&two_pass, "db"), [Axis::RowTile, Axis::N]);
    assert_eq!(
        layout(&backward(RowSums::TwoPass), "dgamma"),
        [Axis::RowTile, Axis::K]
    );
    assert_eq!(layout(&backward(RowSums::Atomic), "dbeta"), [Axis::K]);
    assert_eq!(row_layer::forward_tile(768, 16384), row_layer::GEMM_TILE);
    let forward = row_layer::spec("ln", Op::LayernormLinear, 8, 16, 4, RowSums::Atomic);
    assert_eq!(bound(&forward).len(), 8);
    let reduce = row_layer::spec(
        "ln_red",
        Op::LayernormLinearReduce,
        8,
        16,
        4,
        RowSums::Atomic,
    );
    assert_eq!(bound(&reduce).len(), 8);
    assert_eq!(reduce.grid.tile, 1);
}

/// The backward is two kernels so that each fits WebGPU's default 8 storage buffers: dx,
/// dγ and dβ recompute the statistics (no mean, rstd or β bound); dW and db read them.
#[test]
fn both_backward_kernels_fit_webgpus_default_8_storage_buffers() {
    let limits = Limits::WEBGPU;
    assert_eq!(limits.storage_buffers_per_stage, 8);
    for (hidden, out) in [(8, 16), (768, 3072)] {
        for sums in [RowSums::Atomic, RowSums::TwoPass] {
            let a = backward_of(hidden, out, sums);
            assert_eq!(
                bound(&a),
                ["x", "gamma", "w", "dy", "dx", "dgamma", "dbeta"]
            );
            let b = weight_grad_of(hidden, out, sums);
            assert_eq!(
                bound(&b),
                ["x", "gamma", "beta", "dy", "mean", "rstd", "dw", "db"]
            );
            for spec in [a, b] {
                assert_eq!(spec.target, Target::Webgpu, "{} {sums:?}", spec.name);
                let abi = compile(&spec).unwrap();
                assert!(abi.storage_buffers() as u32 <= limits.storage_buffers_per_stage);
                assert!(abi.workgroup_storage_bytes <= limits.workgroup_storage_bytes);
            }
        }
    }
}

#[test]
fn the_backward_grids_split_the_roles() {
    let dims = |spec: &KernelSpec| {
        let abi = compile(spec).unwrap();
        // 74 rows in tiles of 16, hidden 8 and out 16: one dx block per tile, one k tile.
        abi.dispatch_grid(&[74, 8, 16, 5, 5, 0, 0, 0])
    };
    // dx blocks, then (atomic) one dγβ tile per 64 columns.
    assert_eq!(dims(&backward(RowSums::TwoPass)), [5, 1, 1]);
    assert_eq!(dims(&backward(RowSums::Atomic)), [5, 2, 1]);
    // One 64×64 tile of dW per grid row, whatever the schedule.
    assert_eq!(dims(&weight_grad(RowSums::Atomic)), [5, 1, 1]);
    let wide = weight_grad_of(768, 3072, RowSums::TwoPass);
    let abi = compile(&wide).unwrap();
    assert_eq!(
        abi.dispatch_grid(&[74, 768, 3072, 5, 5, 0, 0, 0]),
        [5, 48 * 12, 1]
    );
}

#[test]
fn mixed_row_sum_schedules_are_rejected_at_the_odd_one() {
    let mut spec = backward(RowSums::Atomic);
    spec.writes[2].1 = WriteMode::ScratchFlush;
    let (field, message) = problem(&spec);
    assert_eq!(field, Field::Write("dbeta".into()));
    assert!(
        message.contains("all `atomic` or all `scratch`"),
        "{message}"
    );
    let mut spec = weight_grad(RowSums::TwoPass);
    spec.writes[1].1 = WriteMode::AtomicScatter;
    assert_eq!(problem(&spec).0, Field::Write("db".into()));
}

#[test]
fn each_backward_kernel_writes_only_its_own_row_sums() {
    let mut spec = backward(RowSums::Atomic);
    spec.writes.push(("dw".into(), WriteMode::AtomicScatter));
    let (field, message) = problem(&spec);
    assert_eq!(field, Field::Write("dw".into()));
    assert!(message.contains("has no tensor `dw`"), "{message}");
    let mut spec = weight_grad(RowSums::Atomic);
    spec.writes.push(("dx".into(), WriteMode::Owned));
    assert_eq!(problem(&spec).0, Field::Write("dx".into()));
}

#[test]
fn a_missing_row_sum_and_zero_sizes_are_named() {
    let mut spec = backward(RowSums::Atomic);
    spec.writes.retain(|(n, _)| n != "dgamma");
    let (_, message) = problem(&spec);
    assert!(message.contains("`dgamma: atomic`"), "{message}");
    let mut spec = weight_grad(RowSums::TwoPass);
    spec.writes.retain(|(n, _)| n != "db");
    let (_, message) = problem(&spec);
    assert!(message.contains("`db: atomic`"), "{message}");
    let zero_out = row_layer::spec("ln", Op::LayernormLinear, 8, 0, 4, RowSums::Atomic);
    assert_eq!(problem(&zero_out).0, Field::OutDim);
    let zero_hidden = row_layer::spec("ln", Op::LayernormLinear, 0, 16, 4, RowSums::Atomic);
    assert_eq!(problem(&zero_hidden).0, Field::HeadDim);
}

#[test]
fn masks_do_not_apply_to_a_row_layer() {
    let mut spec = row_layer::spec("ln", Op::LayernormLinear, 8, 16, 4, RowSums::Atomic);
    spec.masks.causal = true;
    assert_eq!(problem(&spec).0, Field::Mask("causal".into()));
    let mut spec = weight_grad(RowSums::Atomic);
    spec.masks.causal = true;
    assert_eq!(problem(&spec).0, Field::Mask("causal".into()));
}

/// Every product kernel on cooperative matrices: naga validates it (the f16 slices, the
/// fragments' loads, the spill into the 4×4 blocks), it targets native, binds what the
/// scalar kernel binds, and multiplies on tensor cores; the reduce has no products.
#[test]
fn products_compile_on_cooperative_matrices() {
    use attn_dsl::Matrix;
    for (hidden, out) in [(8, 16), (768, 3072), (100, 36)] {
        for sums in [RowSums::Atomic, RowSums::TwoPass] {
            for op in [
                Op::LayernormLinear,
                Op::LayernormLinearBackward,
                Op::LayernormLinearWeightGrad,
            ] {
                let scalar = row_layer::spec("ln", op, hidden, out, 64, sums);
                let spec = row_layer::with_matrix(scalar.clone(), Matrix::Coop16);
                let abi = compile(&spec)
                    .unwrap_or_else(|e| panic!("{op:?} {hidden}->{out} {sums:?}: {e}"));
                assert!(matches!(abi.target, Target::Native(_)));
                assert!(abi.wgsl.contains("coopMultiplyAdd"), "{op:?}");
                assert!(!abi.wgsl.contains("fn block_product("), "{op:?}");
                let names = |a: &attn_dsl::KernelAbi| -> Vec<String> {
                    a.bindings.iter().map(|b| b.name.to_string()).collect()
                };
                assert_eq!(names(&abi), names(&compile(&scalar).unwrap()), "{op:?}");
            }
        }
    }
    let reduce = row_layer::spec("ln", Op::LayernormLinearReduce, 8, 16, 1, RowSums::TwoPass);
    assert_eq!(
        row_layer::with_matrix(reduce.clone(), Matrix::Coop16),
        reduce
    );
}

#[test]
fn cooperative_products_are_refused_under_webgpu() {
    let mut spec = row_layer::with_matrix(
        row_layer::spec("ln", Op::LayernormLinear, 8, 16, 64, RowSums::Atomic),
        attn_dsl::Matrix::Coop16,
    );
    spec.target = Target::Webgpu;
    let (field, problem) = problem(&spec);
    assert_eq!(field, Field::Matrix);
    assert!(problem.contains("target: native"), "{problem}");
    let odd = row_layer::with_matrix(
        row_layer::spec("ln", Op::LayernormLinear, 10, 16, 64, RowSums::Atomic),
        attn_dsl::Matrix::Coop16,
    );
    let (field, why) = self::problem(&odd);
    assert_eq!(field, Field::Matrix);
    assert!(why.contains("multiples of 4"), "{why}");
}

/// Off the flash schedule only the row layers' GEMMs take cooperative matrices; the
/// refusal says where attention takes them.
#[test]
fn cooperative_products_off_the_flash_grid_are_the_row_layers_only() {
    let mut spec = KernelSpec::standard("fwd", Op::Forward, 64, attn_dsl::Masks::default());
    spec.grid.matrix = attn_dsl::Matrix::Coop16;
    let (field, why) = problem(&spec);
    assert_eq!(field, Field::Matrix);
    assert!(why.contains("on a flash grid"), "{why}");
    assert!(why.contains("layernorm_linear_weight_grad"), "{why}");
}

/// The split forward's two kernels compile (naga validates them) for every operand layout,
/// with and without the bias.
#[test]
fn matmul_and_rows_pass_compile() {
    use attn_dsl::spec::{Along, MatmulForm};
    let rows = attn_dsl::row_layer::rows_spec(
        "layernorm_rows",
        768,
        attn_dsl::Dtype::F16,
        attn_dsl::row_layer::NORM_ROWS,
    );
    let abi = attn_dsl::compile(&rows).unwrap_or_else(|e| panic!("{e}"));
    assert!(abi.wgsl.contains("narrow4"));
    for a in [Along::Reduction, Along::Output] {
        for b in [Along::Reduction, Along::Output] {
            for bias in [false, true] {
                let spec = attn_dsl::row_layer::matmul("matmul", MatmulForm::f32(a, b, bias));
                let abi = attn_dsl::compile(&spec).unwrap_or_else(|e| panic!("{a:?} {b:?}: {e}"));
                assert_eq!(abi.binding("bias").is_some(), bias);
                assert_eq!(abi.dispatch_grid(&[300, 200, 64, 3]), [2, 3, 3]);
            }
        }
    }
    // The split backward's row passes: one workgroup per 16 rows, their row sums partials.
    use attn_dsl::row_layer::{grad_rows_spec, rows_backward_spec};
    for spec in [
        grad_rows_spec("layernorm_grad_rows", 768, 3072, attn_dsl::Dtype::F16),
        rows_backward_spec("layernorm_rows_backward", 768, 3072),
    ] {
        let abi = attn_dsl::compile(&spec).unwrap_or_else(|e| panic!("{}: {e}", spec.name));
        assert_eq!(abi.dispatch_grid(&[37, 768, 3072]), [3, 1, 1]);
        let sums = attn_dsl::layout::rows::row_sums(spec.op);
        for s in sums {
            assert_eq!(
                abi.binding(s).and_then(|b| b.write),
                Some(attn_dsl::WriteMode::ScratchFlush),
                "{s}"
            );
        }
    }
    let odd = attn_dsl::compile(&rows_backward_spec("odd", 768, 30));
    assert!(
        odd.as_ref()
            .is_err_and(|e| e.to_string().contains("multiples of 4")),
        "{:?}",
        odd.map(|a| a.name)
    );
}
