//! The checks of the row-wise layers: their sizes, and the gradients that are sums over
//! every row (one schedule for all four).

use crate::error::{DslError, Field};
use crate::layout::rows::{GEMM_TILE, MAX_ROW_WIDTH, WORKGROUP, row_sums};
use crate::spec::{KernelSpec, Op, WriteMode};

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

/// The row sums a backward kernel writes are one schedule: all scattered, or all flushed
/// as partials for one reduce kernel. An `owned` one is left to the ownership rule, which
/// names the race.
pub(crate) fn check_row_sums(spec: &KernelSpec) -> Result<(), DslError> {
    if spec.op == Op::LayernormLinearReduce {
        return Ok(());
    }
    let mut first: Option<(&str, WriteMode)> = None;
    for &name in row_sums(spec.op) {
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
