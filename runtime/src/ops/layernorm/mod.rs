//! The fused LayerNorm + Linear on the GPU: `y = W·LN(x; γ, β) + b` over
//! `[rows, hidden] -> [rows, out]` (rows = batch · seq), and its backward (two kernels: dx,
//! dγ and dβ, then dW and db) with the row sums added by atomics or by the two-pass
//! schedule.

// The host-slice convenience: host data checked, uploaded, run, read back.
mod host;
pub use host::*;

use attn_dsl::row_layer::{self, RowSums};
use attn_dsl::spec::{Along, MatmulForm};
use attn_dsl::{Matrix, Op};

mod norm;
mod record;

pub use norm::{LayerNorm, NormArgs};
pub use record::*;

use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::error::Error;
use crate::shape::nonzero;

/// The most bytes the two-pass schedule's partials of dW may take (one dW per row tile, or
/// per part of the tensor-core backward's dW matmul).
pub const SCRATCH_BUDGET: u64 = 64 << 20;

/// Rows a backward tile takes at least: fewer rows per atomic add or partial only adds
/// adds (and rounding) without adding parallelism worth having.
/// One dx block (64 rows): a smaller tile leaves the products' workgroups part empty.
const MIN_BACKWARD_TILE: u32 = row_layer::DX_ROWS;

/// The backward's row-sum schedule for `rows` rows of `hidden -> out` on an adapter
/// whose tuning table is `table`: the table's measured choice (`bench --layernorm ROWS
/// --tune`, nearest measured row count), else [`sums_by_size`].
pub fn plan_sums(table: &crate::plan::tuning::Table, rows: u32, hidden: u32, out: u32) -> RowSums {
    table
        .layernorm(rows, hidden, out)
        .unwrap_or_else(|| sums_by_size(rows, hidden, out))
}

/// The size rule when nothing was measured: atomic adds when every row is in one row tile
/// (each dW element gets one add, so there is nothing to reorder and a second pass would
/// only copy), the deterministic two-pass schedule otherwise.
pub fn sums_by_size(rows: u32, hidden: u32, out: u32) -> RowSums {
    if rows <= backward_tile(rows, hidden, out) {
        RowSums::Atomic
    } else {
        RowSums::TwoPass
    }
}

/// The forward, backward (two kernels) and (two-pass) reduce kernels of one `hidden ->
/// out` layer, compiled for this device and a number of rows.
pub struct LayerNormLinear {
    forward: Forward,
    backward: Backward,
    reduce: Option<Kernel>,
    hidden: u32,
    out: u32,
    /// The dtype W is held in: f32, or f16 / bf16 for inference ([`LayerNormSpec::weights`]).
    weights: attn_dsl::Dtype,
    /// Pipelines and scratch of the recording API ([`crate::ops::layernorm`]).
    pub(crate) recording: crate::ops::layernorm::Recording,
}

/// What a [`LayerNormLinear`] computes and how: `hidden -> out` for calls of about `rows`
/// rows (any number runs; the backward tile is sized so that `rows` rows' two-pass partials
/// fit [`SCRATCH_BUDGET`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerNormSpec {
    /// The rows a call takes, about: what the backward tile and the planner size for.
    pub rows: u32,
    /// The width of x's rows (and of γ, β and W's rows).
    pub hidden: u32,
    /// The width of y's rows (W's and b's rows).
    pub out: u32,
    /// How the backward sums dγ, dβ, dW and db over rows; `None`: the planner's choice
    /// ([`plan_sums`] over the adapter's tuning table).
    pub sums: Option<RowSums>,
    /// How the products are computed. On [`Matrix::Coop16`] (tensor cores: adapters with
    /// cooperative matrices, see [`Gpu::has_coop16`]) the three GEMMs multiply f16
    /// operands (x̂·γ + β, W, dy, each rounded once by a row or conversion pass) and sum
    /// in f32, as a framework's f16 autocast does; tensors stay f32 in the caller's
    /// memory, the statistics, the LayerNorm chain rule and the row sums stay f32, and the
    /// row sums are always two-pass (`sums` does not apply: the row passes and the dW
    /// matmul leave partials).
    pub matrix: Matrix,
    /// The dtype W is held in: f32, or f16 / bf16 (the adapter's) for inference: the
    /// forward, at any rows, is then the LayerNorm pass and a Linear that reads W as held
    /// (half the bytes of f32); the backward takes f32 weights only.
    pub weights: attn_dsl::Dtype,
}

impl LayerNormSpec {
    /// `hidden -> out` for about `rows` rows: the planner's row sums, scalar products, f32
    /// weights.
    pub fn new(rows: u32, hidden: u32, out: u32) -> LayerNormSpec {
        LayerNormSpec {
            rows,
            hidden,
            out,
            sums: None,
            matrix: Matrix::Scalar,
            weights: attn_dsl::Dtype::F32,
        }
    }
}

impl LayerNormLinear {
    /// Compiles the kernels of `spec` for `gpu`.
    pub fn new(gpu: &Gpu, spec: LayerNormSpec) -> Result<Self, Error> {
        let LayerNormSpec {
            rows, hidden, out, ..
        } = spec;
        nonzero("rows", rows)?;
        nonzero("hidden", hidden)?;
        nonzero("out", out)?;
        if !gpu.supports_dtype(spec.weights) {
            return Err(crate::error::InputError::Unsupported {
                what: "weights in this dtype",
                needs: "an adapter with the dtype (f16: SHADER_F16), or f32 weights",
            }
            .into());
        }
        let sums = match spec.sums {
            Some(sums) => sums,
            None => plan_sums(
                &crate::plan::tuning::Table::for_gpu(gpu)?,
                rows,
                hidden,
                out,
            ),
        };
        let layer = match spec.matrix {
            Matrix::Coop16 => LayerNormLinear::split(gpu, hidden, out)?,
            matrix => LayerNormLinear::fused(gpu, [rows, hidden, out], sums, matrix)?,
        };
        Ok(LayerNormLinear {
            weights: spec.weights,
            ..layer
        })
    }

    /// The fused kernels: the forward in one kernel, the backward in two, the reduce
    /// under two-pass.
    fn fused(
        gpu: &Gpu,
        [rows, hidden, out]: [u32; 3],
        sums: RowSums,
        matrix: Matrix,
    ) -> Result<Self, Error> {
        let fwd_tile =
            row_layer::forward_tile(hidden, gpu.limits().max_compute_workgroup_storage_size);
        let bwd_tile = backward_tile(rows, hidden, out);
        let kernel = |name: &str, op, tile| {
            compiled(
                gpu,
                row_layer::with_matrix(row_layer::spec(name, op, hidden, out, tile, sums), matrix),
            )
        };
        let reduce = match sums {
            RowSums::Atomic => None,
            RowSums::TwoPass => Some(kernel(
                "layernorm_linear_reduce",
                Op::LayernormLinearReduce,
                1,
            )?),
        };
        // The backward first: its rules name both widths when one is not a multiple of 4.
        let backward = kernel(
            "layernorm_linear_backward",
            Op::LayernormLinearBackward,
            bwd_tile,
        )?;
        let weight_grad = kernel(
            "layernorm_linear_weight_grad",
            Op::LayernormLinearWeightGrad,
            bwd_tile,
        )?;
        Ok(LayerNormLinear {
            forward: Forward::Fused(kernel("layernorm_linear", Op::LayernormLinear, fwd_tile)?),
            backward: Backward::Fused {
                backward,
                weight_grad,
            },
            reduce,
            hidden,
            out,
            weights: attn_dsl::Dtype::F32,
            recording: Default::default(),
        })
    }

    /// The layer on tensor cores: row passes and f16 matmuls, the row sums by the reduce.
    fn split(gpu: &Gpu, hidden: u32, out: u32) -> Result<Self, Error> {
        let compile = |spec| compiled(gpu, spec);
        let f16 = attn_dsl::Dtype::F16;
        // The row passes first: their rules name both widths when one is not a multiple
        // of 4, before the matmuls ask for cooperative matrices.
        let backward = Backward::Split {
            grad_rows: compile(row_layer::grad_rows_spec(
                "layernorm_grad_rows",
                hidden,
                out,
                f16,
            ))?,
            rows: compile(row_layer::rows_backward_spec(
                "layernorm_rows_backward",
                hidden,
                out,
            ))?,
            dxn: compile(row_layer::matmul("layernorm_linear_dxn", DXN_PRODUCT))?,
            dw: compile(row_layer::matmul("layernorm_linear_dw", DW_PRODUCT))?,
        };
        let reduce = row_layer::spec(
            "layernorm_linear_reduce",
            Op::LayernormLinearReduce,
            hidden,
            out,
            1,
            RowSums::TwoPass,
        );
        Ok(LayerNormLinear {
            forward: Forward::split(gpu, hidden)?,
            backward,
            reduce: Some(compile(reduce)?),
            hidden,
            out,
            weights: attn_dsl::Dtype::F32,
            recording: Default::default(),
        })
    }

    /// The same kernels with recording state of its own.
    pub(crate) fn fresh(&self) -> LayerNormLinear {
        LayerNormLinear {
            forward: self.forward.clone(),
            backward: self.backward.clone(),
            reduce: self.reduce.clone(),
            hidden: self.hidden,
            out: self.out,
            weights: self.weights,
            recording: Default::default(),
        }
    }

    /// The dtype W is held in.
    pub fn weights(&self) -> attn_dsl::Dtype {
        self.weights
    }

    /// `(hidden, out)`.
    pub fn widths(&self) -> (u32, u32) {
        (self.hidden, self.out)
    }

    /// The forward's first kernel: the fused forward, or the LayerNorm pass of the split
    /// one (the same dims and params).
    pub(crate) fn forward_kernel(&self) -> &Kernel {
        match &self.forward {
            Forward::Fused(k) => k,
            Forward::Split { rows, .. } => rows,
        }
    }

    pub(crate) fn forward_kernels(&self) -> &Forward {
        &self.forward
    }

    pub(crate) fn backward_kernels(&self) -> &Backward {
        &self.backward
    }

    pub(crate) fn backward_reduce(&self) -> Option<&Kernel> {
        self.reduce.as_ref()
    }

    /// How this layer's products are computed.
    pub fn matrix(&self) -> Matrix {
        match &self.backward {
            Backward::Fused { backward, .. } => backward.abi().grid.matrix,
            Backward::Split { .. } => Matrix::Coop16,
        }
    }

    /// How this layer's backward sums dγ, dβ, dW and db over rows (on tensor cores always
    /// by the reduce: the row passes and the dW matmul leave partials).
    pub fn sums(&self) -> RowSums {
        if self.reduce.is_some() {
            RowSums::TwoPass
        } else {
            RowSums::Atomic
        }
    }

    /// The kernels in dispatch order, forward first: for the bench and for reports.
    pub fn kernels(&self) -> impl Iterator<Item = &Kernel> {
        let forward: Vec<&Kernel> = match &self.forward {
            Forward::Fused(k) => vec![k],
            Forward::Split { rows, matmul } => vec![rows, matmul],
        };
        let backward: Vec<&Kernel> = match &self.backward {
            Backward::Fused {
                backward,
                weight_grad,
            } => vec![backward, weight_grad],
            Backward::Split {
                grad_rows,
                dxn,
                dw,
                rows,
            } => vec![grad_rows, dxn, dw, rows],
        };
        forward
            .into_iter()
            .chain(backward)
            .chain(self.reduce.as_ref())
    }

    /// The row layers' dims for `rows` rows: the reduce's counts of partials as the
    /// backward writes them.
    pub(crate) fn dims(&self, rows: u32) -> [(&'static str, u32); 6] {
        let [blocks, _, tiles, db_parts] = self.partials(rows).map(|p| p as u32);
        [
            ("rows", rows),
            ("hidden", self.hidden),
            ("out", self.out),
            ("n_tiles", tiles),
            ("n_blocks", blocks),
            ("db_parts", db_parts),
        ]
    }

    /// How many partials of each row sum (dγ, dβ, dW, db) the backward writes: one under
    /// atomics; under the fused two-pass one per dx block for dγ and dβ, one per row tile
    /// for dW and db (the weight gradient's grid); on tensor cores one per row workgroup
    /// for dγ, dβ and db and [`dw_parts`] for dW.
    pub(crate) fn partials(&self, rows: u32) -> [usize; 4] {
        if self.reduce.is_none() {
            return [1; 4];
        }
        let (tiles, blocks) = match &self.backward {
            Backward::Fused { backward, .. } => {
                let tile = backward.abi().grid.tile.max(1);
                let tiles = rows.div_ceil(tile);
                (tiles, tiles * row_layer::blocks_per_tile(tile))
            }
            Backward::Split { .. } => {
                let blocks = rows.div_ceil(row_layer::NORM_ROWS);
                let parts = dw_parts(rows, self.hidden, self.out);
                return [blocks, blocks, parts, blocks].map(|p| p as usize);
            }
        };
        [blocks, blocks, tiles, tiles].map(|p| p as usize)
    }
}

/// The backward's kernels: the fused scalar ones (dx, dγ and dβ; dW and db), or on tensor
/// cores a row pass rounding x̂·γ + β and dy to f16 (with db's partials), the matmuls dx̂ₙ
/// = dy·W and dW = dyᵀ·(x̂·γ + β) (in [`dw_parts`] parts of the rows), and a row pass for
/// the LayerNorm chain rule (dx, with dγ's and dβ's partials).
#[derive(Clone)]
pub(crate) enum Backward {
    Fused {
        backward: Kernel,
        weight_grad: Kernel,
    },
    Split {
        grad_rows: Kernel,
        dxn: Kernel,
        dw: Kernel,
        rows: Kernel,
    },
}

/// dx̂ₙ = dy `[rows, out]` (contiguous along out, the reduction) by W `[out, hidden]`
/// (contiguous along hidden, the output).
pub(crate) const DXN_PRODUCT: MatmulForm = MatmulForm::f32(Along::Reduction, Along::Output, false);

/// dW `[out, hidden]` = dyᵀ (dy `[rows, out]`: contiguous along out, dW's rows) by x̂·γ + β
/// `[rows, hidden]` (contiguous along hidden, dW's columns).
pub(crate) const DW_PRODUCT: MatmulForm = MatmulForm::f32(Along::Output, Along::Output, false);

/// Rows per part of the dW matmul's reduction: on an H100 at 8192 rows of `[768] -> 3072`,
/// dW in one part of 8192 took 0.450 ms, in 4 parts 0.287, in 8 (1024 rows each) 0.272:
/// the 24×6 blocks of dW alone leave most SMs idle.
pub const DW_PART_ROWS: u32 = 1024;

/// The dW matmul's parts for `rows` rows of `hidden -> out`: one per [`DW_PART_ROWS`], at
/// most 8 (more parts only add partials for the reduce to read), and no more than
/// [`SCRATCH_BUDGET`] of partial dW holds (at least one).
pub fn dw_parts(rows: u32, hidden: u32, out: u32) -> u32 {
    let per_part = 4 * u64::from(hidden) * u64::from(out);
    let fit = (SCRATCH_BUDGET / per_part.max(1)).clamp(1, 8) as u32;
    rows.div_ceil(DW_PART_ROWS).clamp(1, fit)
}

/// The forward's kernels. On tensor cores the forward is split: a LayerNorm pass writes
/// each row's statistics and its normalized row in f16 once, then a matmul multiplies the
/// f16 rows by W (rounded to f16 by a conversion pass) with the bias added at the store.
/// (The fused tensor-core forward rounded x̂·γ + β and W as it staged them, again for
/// every block of outputs: 1.457 ms at [8192, 768] -> 3072 on an H100.)
#[derive(Clone)]
pub(crate) enum Forward {
    Fused(Kernel),
    Split { rows: Kernel, matmul: Kernel },
}

/// The split forward's product: the normalized rows `[rows, hidden]` by W `[out, hidden]`
/// (both contiguous along hidden, the reduction), plus b.
pub(crate) const FORWARD_PRODUCT: MatmulForm =
    MatmulForm::f32(Along::Reduction, Along::Reduction, true);

impl Forward {
    fn split(gpu: &Gpu, hidden: u32) -> Result<Forward, Error> {
        let compile = |spec| compiled(gpu, spec);
        Ok(Forward::Split {
            rows: compile(row_layer::rows_spec(
                "layernorm_rows",
                hidden,
                attn_dsl::Dtype::F16,
                row_layer::NORM_ROWS,
            ))?,
            matmul: compile(row_layer::matmul(
                "layernorm_linear_matmul",
                FORWARD_PRODUCT,
            ))?,
        })
    }
}

/// `spec` compiled for this device; a description the rules refuse is a pipeline error
/// naming the kernel.
pub(crate) fn compiled(gpu: &Gpu, spec: attn_dsl::KernelSpec) -> Result<Kernel, Error> {
    let abi = attn_dsl::compile(&spec).map_err(|e| Error::Pipeline {
        kernel: spec.name.clone(),
        message: e.to_string(),
    })?;
    Kernel::now(gpu, &abi)
}

/// Rows per backward tile: at least `MIN_BACKWARD_TILE`, enough that the tiles'
/// partial dW fit the scratch budget, and a whole number of dx blocks (a tile of 74 rows
/// would give each tile a second dx block of 10 rows costing as much as a full one).
pub fn backward_tile(rows: u32, hidden: u32, out: u32) -> u32 {
    let per_tile = 4 * u64::from(hidden) * u64::from(out);
    let max_tiles = (SCRATCH_BUDGET / per_tile.max(1)).max(1);
    let block = u64::from(row_layer::DX_ROWS);
    let tile = u64::from(rows).div_ceil(max_tiles).div_ceil(block) * block;
    tile.clamp(
        u64::from(MIN_BACKWARD_TILE),
        u64::from(row_layer::MAX_ROW_TILE),
    ) as u32
}
