//! The layout of the row-wise layers (LayerNorm + Linear): the products' tiles, the
//! backward's dx blocks and row tiles, the widest rows, the grids.

use crate::spec::{KernelSpec, Op};

/// Outputs per side of the products' workgroup tile: 16×16 invocations, 4×4 each.
pub const GEMM_TILE: u32 = 64;

/// Reduction indices per staged slice of the products (two leaves of the blocked sum).
pub const BK: u32 = 16;

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
        _ => &[],
    }
}

/// The second grid dimension of a row op: the forward's 64-wide blocks of outputs; the
/// backward's dx blocks of a row tile, then (`atomic`) one workgroup per 64 columns of dγ
/// and dβ; the weight gradient's 64×64 tiles of dW.
pub fn grid_y(op: Op, hidden: u32, out: u32, tile: u32, atomic: bool) -> u32 {
    let k_tiles = hidden.div_ceil(GEMM_TILE);
    match op {
        Op::LayernormLinear => out.div_ceil(GEMM_TILE),
        Op::LayernormLinearBackward => blocks_per_tile(tile) + if atomic { k_tiles } else { 0 },
        Op::LayernormLinearWeightGrad => out.div_ceil(GEMM_TILE) * k_tiles,
        _ => 1,
    }
}

/// Floats of one staged operand slice: BK reduction indices × 64 outputs.
pub const SLICE: u32 = BK * GEMM_TILE;

/// The staged operand slices, and the per-row statistics of the kernels that compute them.
pub fn workgroup_bytes(spec: &KernelSpec) -> u32 {
    let slices = 2 * 4 * SLICE;
    match spec.op {
        // + one partial per invocation and (mean, rstd) of each of the 64 rows.
        Op::LayernormLinear | Op::LayernormLinearBackward => {
            slices + 4 * spec.workgroup_size + 8 * GEMM_TILE
        }
        Op::LayernormLinearWeightGrad => slices,
        _ => 0,
    }
}
