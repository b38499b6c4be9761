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

/// The most rows of a forward tile: their normalized rows fill at most `budget` bytes of
/// workgroup memory (beside the reductions' 1 KiB), and no more than 8 share a W row read.
pub fn forward_tile(hidden: u32, budget: u32) -> u32 {
    (budget.saturating_sub(1024) / (4 * hidden.max(1))).clamp(1, 8)
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

/// dW elements one backward workgroup sums over its row tile: 8 per invocation.
pub fn dw_chunk(workgroup_size: u32) -> u32 {
    8 * workgroup_size
}

/// The second grid dimension of a row op: the forward's blocks of `workgroup_size`
/// outputs; the backward's one workgroup for dx, dγ, dβ and db, then one per dW chunk.
pub fn grid_y(op: Op, hidden: u32, out: u32, workgroup_size: u32) -> u32 {
    match op {
        Op::LayernormLinear => out.div_ceil(workgroup_size.max(1)),
        Op::LayernormLinearBackward => 1 + (hidden * out).div_ceil(dw_chunk(workgroup_size.max(1))),
        _ => 1,
    }
}
