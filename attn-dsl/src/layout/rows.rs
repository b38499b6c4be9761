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

/// A Linear at a few rows ([`Op::LinearRows`]): lanes along the reduction per pair of
/// output columns (each lane one 16-byte word of W in f32 at a time, 32 lanes a 512-byte
/// run of a row), columns per lane group, and the most rows one workgroup holds.
pub const LINEAR_LANES: u32 = 32;
/// Output columns per lane group of a [`Op::LinearRows`] workgroup (four were slower from 4
/// to 16 rows on an H200: more sums held per lane).
pub const LINEAR_COLUMNS: u32 = 2;
/// The most rows one [`Op::LinearRows`] workgroup holds.
pub const LINEAR_MAX_ROWS: u32 = 16;

/// Output columns one [`Op::LinearRows`] workgroup owns.
pub fn linear_block(spec: &KernelSpec) -> u32 {
    spec.workgroup_size / LINEAR_LANES * LINEAR_COLUMNS
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
