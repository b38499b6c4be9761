//! The row-wise layers (LayerNorm + Linear): their usual descriptions and schedules, with
//! their layout rules ([`crate::layout::rows`]) re-exported. The checks are in
//! `check::rows`; the ownership rule itself is the attention one, under the row grid.

pub use crate::layout::rows::*;

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
