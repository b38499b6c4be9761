//! The row-wise layers (LayerNorm + Linear): their usual descriptions, and the checks of
//! their sizes and of the gradients that are sums over every row. The ownership rule itself
//! is the attention one ([`crate::check`]), under the row grid.

use crate::error::{DslError, Field};
use crate::plan::KernelAbi;
use crate::spec::{Grid, KernelSpec, Major, Masks, Op, WriteMode};

/// How the backward sums dγ, dβ, dW and db over rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowSums {
    /// Each row tile adds its sums into the gradients (the seed's way).
    Atomic,
    /// Each row tile writes its sums to scratch; a reduce kernel owns the final sum.
    TwoPass,
}

impl RowSums {
    pub fn write_mode(self) -> WriteMode {
        match self {
            RowSums::Atomic => WriteMode::AtomicScatter,
            RowSums::TwoPass => WriteMode::ScratchFlush,
        }
    }
}

/// The usual description of a row-wise op: a row grid of `tile` rows (elementwise for the
/// reduce), 256 invocations, dx and the forward's outputs owned, the row sums as `sums`
/// says, the least target that holds its bindings.
pub fn spec(name: &str, op: Op, hidden: u32, out: u32, tile: u32, sums: RowSums) -> KernelSpec {
    let writes: Vec<(String, WriteMode)> = match op {
        Op::LayernormLinear => vec![
            ("y".into(), WriteMode::Owned),
            ("mean".into(), WriteMode::Owned),
            ("rstd".into(), WriteMode::Owned),
        ],
        Op::LayernormLinearBackward => std::iter::once(("dx".to_string(), WriteMode::Owned))
            .chain(ROW_SUMS.iter().map(|n| (n.to_string(), sums.write_mode())))
            .collect(),
        _ => ROW_SUMS
            .iter()
            .map(|n| (n.to_string(), WriteMode::Owned))
            .collect(),
    };
    let tile = if op.major() == Major::Elem { 1 } else { tile };
    let mut spec = KernelSpec {
        grid: Grid::rows(op.major(), tile),
        out_dim: out,
        writes,
        ..KernelSpec::standard(name, op, hidden, Masks::default())
    };
    spec.fit_target();
    spec
}

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

/// The out width a row layer's kernel is specialized for, read off its WGSL: the ABI
/// carries the row width (`head_dim`) for every op, and leaves attention's ABI as it was.
pub fn out_dim(abi: &KernelAbi) -> Option<u32> {
    let rest = abi.wgsl.split("const OUT: u32 = ").nth(1)?;
    rest.split('u').next()?.parse().ok()
}

/// The widest hidden or out size a row kernel is specialized for.
pub const MAX_ROW_WIDTH: u32 = 16384;

/// The gradients of the backward that sum over rows, in binding order.
pub const ROW_SUMS: [&str; 4] = ["dgamma", "dbeta", "dw", "db"];

pub(crate) fn check_sizes(spec: &KernelSpec) -> Result<(), DslError> {
    for (size, field, key) in [
        (spec.head_dim, Field::HeadDim, "hidden"),
        (spec.out_dim, Field::OutDim, "out"),
    ] {
        if size == 0 || size > MAX_ROW_WIDTH {
            return Err(DslError::spec(
                field,
                format!("{key} {size} is outside 1..={MAX_ROW_WIDTH}"),
            ));
        }
    }
    if spec.op != Op::LayernormLinearReduce && spec.workgroup_size != WORKGROUP {
        return Err(DslError::spec(
            Field::WorkgroupSize,
            format!(
                "op {} tiles its products over 16×16 invocations: workgroup_size must be \
                 {WORKGROUP}, not {}",
                spec.op.name(),
                spec.workgroup_size
            ),
        ));
    }
    if spec.op == Op::LayernormLinear && spec.grid.tile > GEMM_TILE {
        return Err(DslError::spec(
            Field::Grid,
            format!(
                "a layernorm_linear workgroup owns at most {GEMM_TILE} rows (one products' \
                 tile); tile {} is more",
                spec.grid.tile
            ),
        ));
    }
    Ok(())
}

/// dγ, dβ, dW and db are one schedule: all scattered, or all flushed as row-tile partials
/// for one reduce kernel. An `owned` one is left to the ownership rule, which names the race.
pub(crate) fn check_row_sums(spec: &KernelSpec) -> Result<(), DslError> {
    if spec.op != Op::LayernormLinearBackward {
        return Ok(());
    }
    let mut first: Option<(&str, WriteMode)> = None;
    for name in ROW_SUMS {
        let mode = match spec.write_mode(name) {
            None => {
                return Err(DslError::spec(
                    Field::Write(String::new()),
                    format!(
                        "op {} writes `{name}`, a sum over every row: declare it `{name}: atomic` \
                         or `{name}: scratch` (the two-pass schedule)",
                        spec.op.name()
                    ),
                ));
            }
            Some(WriteMode::Owned) => continue,
            Some(mode) => mode,
        };
        match first {
            None => first = Some((name, mode)),
            Some((other, m)) if m != mode => {
                return Err(DslError::spec(
                    Field::Write(name.to_string()),
                    format!(
                        "`{name}` is `{}` but `{other}` is `{}`: the row sums are one schedule, \
                         all `atomic` or all `scratch`",
                        mode.name(),
                        m.name()
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// The second grid dimension of a row op: the forward's 64-wide blocks of outputs; the
/// backward's dx blocks of a row tile, (`atomic`: one workgroup per 64 columns of dγ and
/// dβ,) then one workgroup per 64×64 tile of dW.
pub fn grid_y(op: Op, hidden: u32, out: u32, tile: u32, atomic: bool) -> u32 {
    let k_tiles = hidden.div_ceil(GEMM_TILE);
    match op {
        Op::LayernormLinear => out.div_ceil(GEMM_TILE),
        Op::LayernormLinearBackward => {
            blocks_per_tile(tile)
                + if atomic { k_tiles } else { 0 }
                + out.div_ceil(GEMM_TILE) * k_tiles
        }
        _ => 1,
    }
}
