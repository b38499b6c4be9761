//! The row-wise layers (LayerNorm + Linear): their usual descriptions and schedules, with
//! their layout rules ([`crate::layout::rows`]) re-exported. The checks are in
//! `check::rows`; the ownership rule itself is the attention one, under the row grid.

pub use crate::layout::rows::*;

use crate::spec::{
    Along, Dtype, Grid, KernelSpec, Major, Masks, MatmulForm, Matrix, Op, WriteMode,
};

/// How the backward sums dγ, dβ, dW and db over rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowSums {
    /// Each row tile adds its sums into the gradients (the seed's way).
    Atomic,
    /// Each row tile writes its sums to scratch; a reduce kernel owns the final sum.
    TwoPass,
}

impl RowSums {
    /// How the row tiles write the summed gradients under this schedule.
    pub fn write_mode(self) -> WriteMode {
        match self {
            RowSums::Atomic => WriteMode::AtomicScatter,
            RowSums::TwoPass => WriteMode::ScratchFlush,
        }
    }
}

/// The usual description of a row-wise op: a row grid of `tile` rows (elementwise for the
/// reduce), 256 invocations, dx and the forward's outputs owned, the backward's row sums
/// as `sums` says, the least target that holds its bindings.
pub fn spec(name: &str, op: Op, hidden: u32, out: u32, tile: u32, sums: RowSums) -> KernelSpec {
    let owned = |n: &str| (n.to_string(), WriteMode::Owned);
    let writes: Vec<(String, WriteMode)> = match op {
        Op::LayernormLinear => ["y", "mean", "rstd"].map(owned).to_vec(),
        Op::LayernormLinearBackward | Op::LayernormLinearWeightGrad => {
            let dx = (op == Op::LayernormLinearBackward).then(|| owned("dx"));
            dx.into_iter()
                .chain(
                    row_sums(op)
                        .iter()
                        .map(|n| (n.to_string(), sums.write_mode())),
                )
                .collect()
        }
        _ => ROW_SUMS.map(owned).to_vec(),
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

/// `spec` with its products computed as `matrix` says: on cooperative matrices each operand
/// is rounded to f16 as it is staged (what a framework's f16 autocast does to a Linear's
/// inputs) and summed in f32; the statistics, the LayerNorm chain rule and the row sums
/// stay f32. The reduce has no products and is returned as it is.
pub fn with_matrix(mut spec: KernelSpec, matrix: Matrix) -> KernelSpec {
    if spec.op != Op::LayernormLinearReduce {
        spec.grid.matrix = matrix;
        spec.fit_target();
    }
    spec
}

/// The LayerNorm pass of a forward whose product runs as a [`matmul`] (or a Linear):
/// statistics and the normalized rows `[rows, hidden]` in `dtype` (hidden a multiple of
/// 4), `tile` rows per workgroup (a power of two up to [`NORM_ROWS`]).
pub fn rows_spec(name: &str, hidden: u32, dtype: Dtype, tile: u32) -> KernelSpec {
    let mut spec = KernelSpec {
        grid: Grid::rows(Major::R, tile),
        dtype,
        ..KernelSpec::standard(name, Op::LayernormRows, hidden, Masks::default())
    };
    spec.fit_target();
    spec
}

/// The first pass of a backward whose products run as [`matmul`]s: x̂·γ + β and dy
/// `[rows, out]` rounded into `dtype`, and db's partial sums, one per [`NORM_ROWS`] rows.
pub fn grad_rows_spec(name: &str, hidden: u32, out: u32, dtype: Dtype) -> KernelSpec {
    row_pass(
        name,
        Op::LayernormGradRows,
        [hidden, out],
        dtype,
        &[("xn", WriteMode::Owned), ("dyh", WriteMode::Owned)],
    )
}

/// That backward's LayerNorm chain rule from dx̂ₙ (the dx matmul's f32 output): dx, and
/// dγ's and dβ's partial sums, one per [`NORM_ROWS`] rows.
pub fn rows_backward_spec(name: &str, hidden: u32, out: u32) -> KernelSpec {
    row_pass(
        name,
        Op::LayernormRowsBackward,
        [hidden, out],
        Dtype::F32,
        &[("dx", WriteMode::Owned)],
    )
}

/// A row pass of [`NORM_ROWS`] rows per workgroup writing `owned` and its row sums as
/// partials for the reduce.
fn row_pass(
    name: &str,
    op: Op,
    [hidden, out]: [u32; 2],
    dtype: Dtype,
    owned: &[(&str, WriteMode)],
) -> KernelSpec {
    let sums = row_sums(op)
        .iter()
        .map(|n| (n.to_string(), WriteMode::ScratchFlush));
    let mut spec = KernelSpec {
        grid: Grid::rows(Major::R, NORM_ROWS),
        out_dim: out,
        dtype,
        writes: owned
            .iter()
            .map(|(n, m)| (n.to_string(), *m))
            .chain(sums)
            .collect(),
        ..KernelSpec::standard(name, op, hidden, Masks::default())
    };
    spec.fit_target();
    spec
}

/// Rows per workgroup of the LayerNorm pass, WORKGROUP / NORM_ROWS lanes each: 512
/// workgroups at 8192 rows, where 64 rows (the products' tile) left 128 workgroups, one per
/// SM, each waiting on its rows' loads.
pub const NORM_ROWS: u32 = 16;

/// The workgroups below which a LayerNorm pass takes fewer rows per workgroup.
pub const NORM_WORKGROUPS: u32 = 512;

/// Rows per workgroup of a LayerNorm pass over `rows` rows: the most, a power of two up to
/// [`NORM_ROWS`], that leave at least [`NORM_WORKGROUPS`] workgroups, and one row (on all of
/// a workgroup's lanes) below 1024 rows. At decode's few rows, 16 lanes a row summed a
/// 4096-wide row in 32 dependent steps, twice: one row a workgroup took `decode-loop`'s step
/// (32 heads over 8, d128, f16 weights) from 0.121 to 0.092 ms on an H200 (2026-12-02),
/// 15 µs off each of its two LayerNorms.
pub fn norm_rows(rows: u32) -> u32 {
    let per = (rows / NORM_WORKGROUPS).max(1);
    (1u32 << per.ilog2()).min(NORM_ROWS)
}

/// A product on cooperative matrices of f16 operands laid out as `form` says.
pub fn matmul(name: &str, form: MatmulForm) -> KernelSpec {
    let mut spec = KernelSpec {
        dtype: Dtype::F16,
        matmul: Some(form),
        ..KernelSpec::standard(name, Op::Matmul, 16, Masks::default())
    };
    spec.grid.matrix = Matrix::Coop16;
    spec.fit_target();
    spec
}

/// A Linear at up to `rows` rows ([`Op::LinearRows`]): `y = x·Wᵀ (+ b)`, x `[rows,
/// hidden]` held in `io[0]`, W `[out, hidden]` in `dtype` (hidden a multiple of 4), y
/// written in `io[1]` (summed in f32, rounded once); more rows than `rows` take more
/// workgroups, each reading W again.
pub fn linear_rows(
    name: &str,
    [hidden, out]: [u32; 2],
    rows: u32,
    dtype: Dtype,
    bias: bool,
    [x, y]: [Dtype; 2],
) -> KernelSpec {
    let form = MatmulForm {
        x,
        y,
        ..MatmulForm::f32(Along::Reduction, Along::Reduction, bias)
    };
    let mut spec = KernelSpec {
        grid: Grid::rows(Major::R, rows),
        out_dim: out,
        dtype,
        writes: vec![("y".to_string(), WriteMode::Owned)],
        matmul: Some(form),
        ..KernelSpec::standard(name, Op::LinearRows, hidden, Masks::default())
    };
    spec.fit_target();
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decode's few rows take one row a workgroup, a long batch [`NORM_ROWS`], and every
    /// tile between compiles (its lanes a power of two, as `lane_sum`'s tree needs).
    #[test]
    fn a_layernorm_pass_takes_fewer_rows_a_workgroup_where_there_are_few() {
        let tiles: Vec<u32> = [1, 2, 16, 511, 1024, 1536, 4096, 8192, 1 << 20]
            .map(norm_rows)
            .to_vec();
        assert_eq!(tiles, [1, 1, 1, 1, 2, 2, 8, 16, 16]);
        for tile in [1, 2, 4, 8, 16] {
            for hidden in [12, 4096] {
                let spec = rows_spec("layernorm_rows_t", hidden, Dtype::F16, tile);
                crate::compile(&spec).unwrap_or_else(|e| panic!("{tile} {hidden}: {e}"));
            }
        }
    }

    /// Every row count the runtime compiles, in every weight dtype and every x and y dtype,
    /// at widths that leave a partial step and a partial block: the WGSL validates, and the
    /// grid covers `out`. A half-precision y, stored two columns a word, refuses an odd
    /// `out`.
    #[test]
    fn a_linear_at_every_row_count_compiles_and_covers_its_columns() {
        let halves = [Dtype::F16, Dtype::Bf16];
        let io = [Dtype::F32]
            .into_iter()
            .chain(halves)
            .flat_map(|x| [Dtype::F32].into_iter().chain(halves).map(move |y| [x, y]));
        for (dtype, io) in [Dtype::F32, Dtype::F16, Dtype::Bf16]
            .into_iter()
            .flat_map(|d| io.clone().map(move |io| (d, io)))
        {
            for tile in [1, 2, 4, 8, 16] {
                let spec = linear_rows("linear_rows_t", [200, 38], tile, dtype, true, io);
                let abi = crate::compile(&spec)
                    .unwrap_or_else(|e| panic!("{dtype:?} {io:?} {tile}: {e}"));
                let bytes = dtype.bytes();
                let block = crate::layout::rows::linear_layout(tile, bytes, spec.workgroup_size)
                    .block(spec.workgroup_size);
                let grid = abi.dispatch_grid(&[21, 200, 38]);
                assert_eq!(grid, [38u32.div_ceil(block), 21u32.div_ceil(tile), 1]);
                let odd = linear_rows("linear_rows_t", [200, 37], tile, dtype, true, io);
                match (io[1], crate::compile(&odd)) {
                    (Dtype::F32, r) => assert!(r.is_ok(), "{io:?}"),
                    (_, r) => assert!(r.is_err(), "{io:?}: an odd out compiled"),
                }
            }
        }
    }

    /// Only a plain Linear reads x or writes y in half precision: a matmul (f16 operands
    /// on cooperative matrices, y in f32) that names another is refused at its dtype, not
    /// compiled with the form ignored.
    #[test]
    fn only_a_linear_takes_half_precision_x_and_y() {
        for (x, y) in [(Dtype::F16, Dtype::F32), (Dtype::F32, Dtype::Bf16)] {
            let form = MatmulForm {
                x,
                y,
                ..MatmulForm::DEFAULT
            };
            let err = crate::compile(&matmul("m", form)).expect_err("a half-precision form");
            assert!(err.to_string().contains("linear_rows"), "{err}");
        }
        crate::compile(&matmul("m", MatmulForm::DEFAULT)).unwrap_or_else(|e| panic!("{e}"));
    }
}
