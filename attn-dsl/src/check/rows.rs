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
        // The LayerNorm pass has no Linear, so no out size.
        if key == "out" && spec.op == Op::LayernormRows {
            continue;
        }
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
    if spec.op == Op::LinearRows {
        use crate::layout::rows::LINEAR_MAX_ROWS;
        if !spec.head_dim.is_multiple_of(4) {
            return Err(DslError::spec(
                Field::HeadDim,
                format!(
                    "linear_rows reads x and W four at a time: hidden ({}) must be a multiple \
                     of 4",
                    spec.head_dim
                ),
            ));
        }
        let form = spec.matmul_form();
        if form.y != crate::spec::Dtype::F32 && !spec.out_dim.is_multiple_of(2) {
            return Err(DslError::spec(
                Field::OutDim,
                format!(
                    "linear_rows writes {} two columns a word: out ({}) must be even (or y \
                     in f32)",
                    form.y.name(),
                    spec.out_dim
                ),
            ));
        }
        if !(1..=LINEAR_MAX_ROWS).contains(&spec.grid.tile) {
            return Err(DslError::spec(
                Field::Grid,
                format!(
                    "a linear_rows workgroup holds 1 to {LINEAR_MAX_ROWS} rows (its sums in \
                     registers); tile {} is not",
                    spec.grid.tile
                ),
            ));
        }
    }
    if spec.op == Op::LayernormRows && !spec.head_dim.is_multiple_of(4) {
        return Err(DslError::spec(
            Field::HeadDim,
            format!(
                "layernorm_rows writes its normalized rows four at a time: hidden ({}) must \
                 be a multiple of 4 (for other widths, products with `matrix = scalar`)",
                spec.head_dim
            ),
        ));
    }
    if matches!(spec.op, Op::LayernormGradRows | Op::LayernormRowsBackward)
        && !(spec.head_dim.is_multiple_of(4) && spec.out_dim.is_multiple_of(4))
    {
        return Err(DslError::spec(
            Field::HeadDim,
            format!(
                "{} reads and writes its rows four at a time: hidden ({}) and out ({}) must be \
                 multiples of 4 (for other widths, products with `matrix = scalar`)",
                spec.op.name(),
                spec.head_dim,
                spec.out_dim
            ),
        ));
    }
    let row_pass = matches!(
        spec.op,
        Op::LayernormRows | Op::LayernormGradRows | Op::LayernormRowsBackward
    );
    if (spec.op == Op::LayernormLinear || row_pass) && spec.grid.tile > GEMM_TILE {
        return Err(DslError::spec(
            Field::Grid,
            format!(
                "a layernorm_linear workgroup owns at most {GEMM_TILE} rows (one products' \
                 tile); tile {} is more",
                spec.grid.tile
            ),
        ));
    }
    if row_pass && !WORKGROUP.is_multiple_of(spec.grid.tile.max(1)) {
        return Err(DslError::spec(
            Field::Grid,
            format!(
                "op {} gives each row {WORKGROUP} / tile lanes: tile {} must divide {WORKGROUP}",
                spec.op.name(),
                spec.grid.tile
            ),
        ));
    }
    Ok(())
}

/// Cooperative-matrix GEMMs off the flash grid: the row layers' three products (f32 in
/// memory, each operand rounded to f16 as it is staged, f32 accumulators), native only.
pub(crate) fn check_coop(spec: &KernelSpec) -> Result<(), DslError> {
    let refuse = |problem: String| Err(DslError::spec(Field::Matrix, problem));
    let gemms = [
        Op::LayernormLinear,
        Op::LayernormLinearBackward,
        Op::LayernormLinearWeightGrad,
        Op::Matmul,
    ];
    if !gemms.contains(&spec.op) {
        let names: Vec<&str> = gemms.iter().map(|o| o.name()).collect();
        return refuse(format!(
            "`matrix = coop16` off the flash schedule is emitted for ops {}; op {} takes it \
             on a flash grid (`tile`, `key_tile` and `rows_per_thread`) or not at all",
            names.join(", "),
            spec.op.name()
        ));
    }
    if spec.target == crate::spec::Target::Webgpu {
        return refuse(
            "cooperative matrices are not in WebGPU; use `target: native(..)` (the runtime \
             runs the kernel only on adapters with EXPERIMENTAL_COOPERATIVE_MATRIX)"
                .into(),
        );
    }
    if spec.op != Op::Matmul
        && (!spec.head_dim.is_multiple_of(4) || !spec.out_dim.is_multiple_of(4))
    {
        return refuse(format!(
            "the tensor-core products read x, γ, β, W and dy as vec4: hidden ({}) and out \
             ({}) must be multiples of 4; use `matrix = scalar` for these widths",
            spec.head_dim, spec.out_dim
        ));
    }
    let form = spec.matmul_form();
    if [form.x, form.y] != [crate::spec::Dtype::F32; 2] {
        return refuse(format!(
            "the tensor-core products read and write f32 rows; x in {} and y in {} are a \
             Linear's at a few rows (`linear_rows`)",
            form.x.name(),
            form.y.name()
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
