//! The layout of the row-wise layers (LayerNorm + Linear): the products' tiles, the
//! backward's dx blocks and row tiles, the widest rows, the grids.

use crate::spec::{KernelSpec, Matrix, Op};

/// Outputs per side of the products' workgroup tile: 16×16 invocations, 4×4 each.
pub const GEMM_TILE: u32 = 64;

/// Reduction indices per staged slice of the products (two leaves of the blocked sum).
pub const BK: u32 = 16;

/// Reduction indices per staged slice on cooperative matrices: four 16-deep fragments, so
/// that each barrier pair has eight products per subgroup (on an H100 at [8192, 768] ->
/// 3072, 64 against 32 took the backward from 2.90 to 2.45 ms and the forward from 1.92
/// to 1.87; the slices then fill the workgroup memory to 45 KiB of 48).
pub const COOP_BK: u32 = 64;

/// Subgroups of 32 in a workgroup of [`WORKGROUP`]: each owns 2 of the block's 16 fragments.
pub const COOP_SUBGROUPS: u32 = WORKGROUP / 32;

/// Reduction indices per staged slice of `spec`'s products.
pub fn bk(spec: &KernelSpec) -> u32 {
    match spec.grid.matrix {
        Matrix::Scalar => BK,
        Matrix::Coop16 => COOP_BK,
    }
}

/// 64-wide output blocks one forward workgroup computes in turn, its rows' statistics
/// computed once for them all: up to 4 (on an H100 at [8192, 768] -> 3072, 4 took the
/// tensor-core forward from 1.87 to 1.46 ms and the scalar one from 3.23 to 3.09; 12, a
/// quarter of the workgroups, was slower than 1).
pub fn column_blocks(out: u32) -> u32 {
    out.div_ceil(GEMM_TILE).min(4)
}

/// Rows of one dx block of the backward: a row tile's rows are taken DX_ROWS at a time,
/// each block by its own workgroup, so that the dx product has parallelism whatever the
/// row tile (sized for the dW partials) is.
pub const DX_ROWS: u32 = 64;

/// The invocations the tiled products are written for.
pub const WORKGROUP: u32 = 256;

/// Rows of a forward tile: one products' tile. `_budget` (the adapter's workgroup memory)
/// is kept for callers: the tiled forward needs under 10 KiB whatever the widths.
pub fn forward_tile(_hidden: u32, _budget: u32) -> u32 {
    GEMM_TILE
}

/// dx blocks per backward row tile of `tile` rows.
pub fn blocks_per_tile(tile: u32) -> u32 {
    tile.div_ceil(DX_ROWS)
}

/// The most rows one backward tile (one workgroup) may sum.
pub const MAX_ROW_TILE: u32 = 1 << 16;

/// The widest hidden or out size a row kernel is specialized for.
pub const MAX_ROW_WIDTH: u32 = 16384;

/// The gradients of the backward that sum over rows, in binding order.
pub const ROW_SUMS: [&str; 4] = ["dgamma", "dbeta", "dw", "db"];

/// The row sums `op` writes: the backward's two kernels split them (dγ and dβ beside dx,
/// dW and db in the weight gradient), the reduce finishes all four.
pub fn row_sums(op: Op) -> &'static [&'static str] {
    match op {
        Op::LayernormLinearBackward => &ROW_SUMS[..2],
        Op::LayernormLinearWeightGrad => &ROW_SUMS[2..],
        Op::LayernormLinearReduce => &ROW_SUMS,
        // The split backward's row passes: db beside dy's conversion, dγ and dβ beside dx.
        Op::LayernormGradRows => &ROW_SUMS[3..],
        Op::LayernormRowsBackward => &ROW_SUMS[..2],
        _ => &[],
    }
}

/// The second grid dimension of a row op: the forward's 64-wide blocks of outputs; the
/// backward's dx blocks of a row tile, then (`atomic`) one workgroup per 64 columns of dγ
/// and dβ; the weight gradient's 64×64 tiles of dW.
pub fn grid_y(op: Op, hidden: u32, out: u32, tile: u32, atomic: bool) -> u32 {
    let k_tiles = hidden.div_ceil(GEMM_TILE);
    match op {
        Op::LayernormLinear => out.div_ceil(GEMM_TILE * column_blocks(out)),
        Op::LayernormLinearBackward => blocks_per_tile(tile) + if atomic { k_tiles } else { 0 },
        Op::LayernormLinearWeightGrad => out.div_ceil(GEMM_TILE) * k_tiles,
        _ => 1,
    }
}

/// The most rows one [`Op::LinearRows`] workgroup holds.
pub const LINEAR_MAX_ROWS: u32 = 16;

/// Invocations of a [`Op::LinearRows`] group: the lanes that load together.
pub const LINEAR_GROUP: u32 = 32;

/// How a [`Op::LinearRows`] workgroup's lanes share W: each group of [`LINEAR_GROUP`]
/// lanes takes `32 / lanes_per_column` columns side by side, `lanes_per_column` lanes on
/// each (parts of the reduction, interleaved by `step` vec4s); `groups_along_reduction`
/// groups take more parts of the same columns, the workgroup's other groups other columns;
/// each lane `columns` columns, their words multiplied by each load of x. `unroll` steps'
/// loads are issued together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearLayout {
    /// Lanes of a group on each column (1 to 32, a power of two).
    pub lanes_per_column: u32,
    /// Groups of the workgroup on the same columns.
    pub groups_along_reduction: u32,
    /// Columns per lane.
    pub columns: u32,
    /// vec4s of W a lane reads per column and step.
    pub step: u32,
    /// Steps whose loads are issued together.
    pub unroll: u32,
    /// Whether each lane's sums carry their rounding errors (TwoSum) from one iteration of
    /// the unrolled loop to the next: where a part's chain is long (8 iterations at 4096
    /// wide) and a lane has the registers (16 sums at most); the 16-row layout's chains are
    /// 4-8 steps of 8-16 products each.
    pub compensated: bool,
    /// Whether loads skip their bounds tests where every lane's steps end at the
    /// reduction's end. On an H200 (2026-11-30, `bench --linear 4,8,16`, 4096 -> 14336)
    /// that took 8 rows from 0.095 to 0.086 ms in f16 and 0.130 to 0.117 in f32, and 16
    /// rows in f16 from 0.164 to 0.198: there the tested loads stay.
    pub unmasked_when_even: bool,
}

/// The layout of a workgroup of `workgroup` lanes holding `tile` rows, W's elements of
/// `bytes` bytes. Up to 8 rows a group's 32 lanes walk two columns' rows together, 16 bytes
/// a lane (each load of W a 512-byte run). At 16 rows that layout meets each load of x
/// with two columns, and x's loads bound it; there a group takes four columns side by
/// side, 8 lanes on each (32 contiguous bytes a lane), every group of the workgroup on the
/// same columns, and each lane 8 bytes of W per reduction index (f16: four columns, f32:
/// two). On an H200 (2026-11-30, `bench --linear 16`; the A/B in docs/performance.md)
/// that took 4096 -> 14336 at 16 rows from 0.345 to 0.162 ms with f32 weights and from
/// 0.227 to 0.158 in f16; at 8 rows and fewer it was up to 1.5x slower than the first.
pub fn linear_layout(tile: u32, bytes: u32, workgroup: u32) -> LinearLayout {
    match tile < LINEAR_MAX_ROWS {
        true => LinearLayout {
            lanes_per_column: LINEAR_GROUP,
            groups_along_reduction: 1,
            columns: 2,
            step: 1,
            unroll: 4,
            compensated: true,
            unmasked_when_even: true,
        },
        false => LinearLayout {
            lanes_per_column: 8,
            groups_along_reduction: (workgroup / LINEAR_GROUP).max(1),
            columns: 8 / bytes,
            step: 32 / (4 * bytes),
            unroll: 2,
            compensated: false,
            unmasked_when_even: false,
        },
    }
}

impl LinearLayout {
    /// Columns side by side in one group.
    pub fn span(&self) -> u32 {
        LINEAR_GROUP / self.lanes_per_column
    }

    /// Output columns a workgroup of `workgroup` lanes owns.
    pub fn block(&self, workgroup: u32) -> u32 {
        let sets = (workgroup / LINEAR_GROUP / self.groups_along_reduction).max(1);
        sets * self.span() * self.columns
    }
}

/// Floats of one staged operand slice: BK reduction indices × 64 outputs.
pub const SLICE: u32 = BK * GEMM_TILE;

/// The staged operand slices, and the per-row statistics of the kernels that compute them.
/// On cooperative matrices: two f16 slices (padded rows), the f32 block they sum into, and
/// the f32 scratch of the row reductions.
pub fn workgroup_bytes(spec: &KernelSpec) -> u32 {
    if spec.op == Op::LinearRows {
        // Four vec4s of partial sums per invocation, a batch of the lanes' reductions.
        return 64 * spec.workgroup_size;
    }
    if matches!(
        spec.op,
        Op::LayernormRows | Op::LayernormGradRows | Op::LayernormRowsBackward
    ) {
        // One partial per invocation and (mean, rstd) of each of its rows: no products.
        return 4 * spec.workgroup_size + 8 * spec.grid.tile;
    }
    let slices = match spec.grid.matrix {
        Matrix::Scalar => 2 * 4 * SLICE,
        Matrix::Coop16 => {
            let bk = bk(spec);
            let half_slice = (GEMM_TILE * (bk + 8)).max(bk * (GEMM_TILE + 8));
            2 * 2 * half_slice + 4 * GEMM_TILE * (GEMM_TILE + 4) + 2 * 16 * spec.workgroup_size
        }
    };
    match spec.op {
        // + one partial per invocation and (mean, rstd) of each of the 64 rows.
        Op::LayernormLinear | Op::LayernormLinearBackward => {
            slices + 4 * spec.workgroup_size + 8 * GEMM_TILE
        }
        Op::LayernormLinearWeightGrad => slices,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_rows_share_x_among_more_columns_and_fewer_keep_whole_runs() {
        for tile in [1, 2, 4, 8] {
            let l = linear_layout(tile, 2, 256);
            assert_eq!((l.lanes_per_column, l.columns, l.step), (32, 2, 1));
            assert_eq!(l.block(256), 16, "eight groups of two columns");
        }
        let half = linear_layout(16, 2, 256);
        let full = linear_layout(16, 4, 256);
        assert_eq!((half.lanes_per_column, half.groups_along_reduction), (8, 8));
        // Each lane's step is 32 bytes of a column; 8 bytes of W per reduction index.
        assert_eq!(
            (half.columns, half.step, full.columns, full.step),
            (4, 4, 2, 2)
        );
        assert_eq!((half.block(256), full.block(256)), (16, 8));
        // Every group's lanes are whole columns' parts.
        for l in [half, full, linear_layout(1, 4, 256)] {
            assert_eq!(l.span() * l.lanes_per_column, LINEAR_GROUP);
        }
    }
}
