//! The fused LayerNorm + Linear described with attention's words: a row grid, dx owned,
//! the row sums atomic or two-pass, and the ownership rule catching an owned row sum.

use attn_dsl::row_layer::{self, RowSums};
use attn_dsl::signature::{self, Role};
use attn_dsl::spec::Axis;
use attn_dsl::{DslError, Field, KernelSpec, Op, WriteMode, compile};

fn backward(sums: RowSums) -> KernelSpec {
    row_layer::spec("ln_bwd", Op::LayernormLinearBackward, 8, 16, 16, sums)
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

#[test]
fn dw_owned_under_a_row_grid_is_a_race_at_dw() {
    let mut spec = backward(RowSums::Atomic);
    spec.writes[3].1 = WriteMode::Owned;
    assert_eq!(spec.writes[3].0, "dw");
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
            let atomic = abi.binding("dw").unwrap().wgsl_type.contains("atomic");
            assert_eq!(atomic, sums == RowSums::Atomic);
            assert!(abi.binding("dx").is_some());
        }
        for op in [Op::LayernormLinear, Op::LayernormLinearReduce] {
            let spec = row_layer::spec("ln", op, hidden, out, 4, RowSums::Atomic);
            let abi = compile(&spec).unwrap_or_else(|e| panic!("{op:?} {hidden}->{out}: {e}"));
            assert!(abi.wgsl.contains("@compute"));
            assert_eq!(abi.out_dim, out);
        }
    }
}

fn backward_of(hidden: u32, out: u32, sums: RowSums) -> KernelSpec {
    row_layer::spec("ln_bwd", Op::LayernormLinearBackward, hidden, out, 16, sums)
}

#[test]
fn row_sums_bind_the_whole_gradient_when_atomic_and_a_partial_per_tile_when_two_pass() {
    let atomic = backward(RowSums::Atomic);
    let two_pass = backward(RowSums::TwoPass);
    assert_eq!(layout(&atomic, "dw"), [Axis::N, Axis::K]);
    assert_eq!(layout(&two_pass, "dw"), [Axis::RowTile, Axis::N, Axis::K]);
    assert_eq!(layout(&two_pass, "db"), [Axis::RowTile, Axis::N]);
    let storage = |s: &KernelSpec| {
        signature::tensors(s)
            .iter()
            .filter(|t| t.role != Role::Uniform)
            .count()
    };
    assert_eq!(storage(&atomic), 12);
    assert!(
        matches!(atomic.target, attn_dsl::Target::Native(l) if l.storage_buffers_per_stage == 12)
    );
    assert_eq!(row_layer::forward_tile(768, 16384), row_layer::GEMM_TILE);
    assert_eq!(storage(&two_pass), 12);
    let forward = row_layer::spec("ln", Op::LayernormLinear, 8, 16, 4, RowSums::Atomic);
    assert_eq!(storage(&forward), 8);
    let reduce = row_layer::spec(
        "ln_red",
        Op::LayernormLinearReduce,
        8,
        16,
        4,
        RowSums::Atomic,
    );
    assert_eq!(storage(&reduce), 8);
    assert_eq!(reduce.grid.tile, 1);
}

#[test]
fn mixed_row_sum_schedules_are_rejected_at_the_odd_one() {
    let mut spec = backward(RowSums::Atomic);
    spec.writes[4].1 = WriteMode::ScratchFlush;
    let (field, message) = problem(&spec);
    assert_eq!(field, Field::Write("db".into()));
    assert!(
        message.contains("all `atomic` or all `scratch`"),
        "{message}"
    );
}

#[test]
fn a_missing_row_sum_and_zero_sizes_are_named() {
    let mut spec = backward(RowSums::Atomic);
    spec.writes.retain(|(n, _)| n != "dgamma");
    let (_, message) = problem(&spec);
    assert!(message.contains("`dgamma: atomic`"), "{message}");
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
}
