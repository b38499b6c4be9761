//! The fused LayerNorm + Linear of seed 003 on the GPU: `y = W·LN(x; γ, β) + b` over
//! `[rows, hidden] -> [rows, out]` (rows = batch · seq), and its backward (two kernels: dx,
//! dγ and dβ, then dW and db) with the row sums added by atomics or by the two-pass
//! schedule.

#[cfg(not(target_arch = "wasm32"))]
#[doc(hidden)]
pub use crate::harness::layernorm::{baseline, bench, check};
#[doc(hidden)]
pub use crate::harness::layernorm::{judge, reference};

use attn_dsl::row_layer::{self, RowSums};
use attn_dsl::{KernelAbi, Matrix, Op};

use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::error::Error;
pub use crate::host::layernorm::{
    Grads, Input, Output, layernorm_linear, layernorm_linear_backward,
};
use crate::shape::nonzero;

/// The most bytes the two-pass schedule's partials may take (one dW per row tile).
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
    /// dx, dγ and dβ.
    backward: Kernel,
    /// dW and db.
    weight_grad: Kernel,
    reduce: Option<Kernel>,
    hidden: u32,
    out: u32,
    /// Pipelines and scratch of the recording API ([`crate::ops::layernorm`]).
    pub(crate) recording: crate::ops::layernorm::Recording,
}

impl LayerNormLinear {
    /// Compiles the kernels of `hidden -> out`, the row sums by `sums`, for problems of
    /// about `rows` rows (any number runs; the backward tile is sized so that `rows` rows'
    /// two-pass partials fit [`SCRATCH_BUDGET`]).
    pub fn new(gpu: &Gpu, rows: u32, hidden: u32, out: u32, sums: RowSums) -> Result<Self, Error> {
        LayerNormLinear::with_matrix(gpu, [rows, hidden, out], sums, Matrix::Scalar)
    }

    /// [`LayerNormLinear::new`] with the products computed as `matrix` says. On
    /// [`Matrix::Coop16`] (tensor cores: adapters with cooperative matrices, see
    /// [`Gpu::has_coop16`]) the three GEMMs round their operands (x̂ₙ, W, dy) to f16 as they
    /// stage them and sum in f32, as a framework's f16 autocast does; tensors stay f32 in
    /// memory, and the statistics, the LayerNorm chain rule and the row sums stay f32.
    pub fn with_matrix(
        gpu: &Gpu,
        [rows, hidden, out]: [u32; 3],
        sums: RowSums,
        matrix: Matrix,
    ) -> Result<Self, Error> {
        nonzero("rows", rows)?;
        nonzero("hidden", hidden)?;
        nonzero("out", out)?;
        let fwd_tile =
            row_layer::forward_tile(hidden, gpu.limits().max_compute_workgroup_storage_size);
        let bwd_tile = backward_tile(rows, hidden, out);
        let kernel = |name: &str, op, tile| {
            let spec =
                row_layer::with_matrix(row_layer::spec(name, op, hidden, out, tile, sums), matrix);
            let abi = attn_dsl::compile(&spec).map_err(|e| Error::Pipeline {
                kernel: spec.name.clone(),
                message: e.to_string(),
            })?;
            Kernel::now(gpu, &abi)
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
            forward: match matrix {
                Matrix::Scalar => {
                    Forward::Fused(kernel("layernorm_linear", Op::LayernormLinear, fwd_tile)?)
                }
                Matrix::Coop16 => Forward::split(gpu, hidden)?,
            },
            backward,
            weight_grad,
            reduce,
            hidden,
            out,
            recording: Default::default(),
        })
    }

    /// The same kernels with recording state of its own.
    pub(crate) fn fresh(&self) -> LayerNormLinear {
        LayerNormLinear {
            forward: self.forward.clone(),
            backward: self.backward.clone(),
            weight_grad: self.weight_grad.clone(),
            reduce: self.reduce.clone(),
            hidden: self.hidden,
            out: self.out,
            recording: Default::default(),
        }
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

    /// The backward's kernels in dispatch order: dx, dγ and dβ; then dW and db.
    pub(crate) fn backward_kernels(&self) -> [&Kernel; 2] {
        [&self.backward, &self.weight_grad]
    }

    pub(crate) fn backward_reduce(&self) -> Option<&Kernel> {
        self.reduce.as_ref()
    }

    /// [`LayerNormLinear::new`] with the row-sum schedule the planner picks for this
    /// adapter ([`plan_sums`] over its tuning table).
    pub fn planned(gpu: &Gpu, rows: u32, hidden: u32, out: u32) -> Result<Self, Error> {
        let table = crate::plan::tuning::Table::for_gpu(gpu)?;
        LayerNormLinear::new(gpu, rows, hidden, out, plan_sums(&table, rows, hidden, out))
    }

    /// How this layer's products are computed.
    pub fn matrix(&self) -> Matrix {
        self.backward.abi().grid.matrix
    }

    /// How this layer's backward sums dγ, dβ, dW and db over rows.
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
        forward
            .into_iter()
            .chain([&self.backward, &self.weight_grad])
            .chain(self.reduce.as_ref())
    }

    pub(crate) fn dims(&self, abi: &KernelAbi, rows: u32) -> [(&'static str, u32); 5] {
        let tile = abi.grid.tile.max(1);
        let n_tiles = rows.div_ceil(tile);
        [
            ("rows", rows),
            ("hidden", self.hidden),
            ("out", self.out),
            ("n_tiles", n_tiles),
            ("n_blocks", n_tiles * row_layer::blocks_per_tile(tile)),
        ]
    }

    /// How many partials of each row sum (dγ, dβ, dW, db) the backward writes: one under
    /// atomics; under two-pass one per dx block for dγ and dβ, one per row tile for dW and
    /// db (the weight gradient's grid).
    pub(crate) fn partials(&self, rows: u32) -> [usize; 4] {
        if self.reduce.is_none() {
            return [1; 4];
        }
        let dims = self.dims(self.backward.abi(), rows);
        let (tiles, blocks) = (dims[3].1 as usize, dims[4].1 as usize);
        [blocks, blocks, tiles, tiles]
    }
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
pub(crate) const FORWARD_PRODUCT: attn_dsl::spec::MatmulForm = attn_dsl::spec::MatmulForm {
    a: attn_dsl::spec::Along::Reduction,
    b: attn_dsl::spec::Along::Reduction,
    bias: true,
};

impl Forward {
    fn split(gpu: &Gpu, hidden: u32) -> Result<Forward, Error> {
        let compile = |spec: attn_dsl::KernelSpec| {
            let abi = attn_dsl::compile(&spec).map_err(|e| Error::Pipeline {
                kernel: spec.name.clone(),
                message: e.to_string(),
            })?;
            Kernel::now(gpu, &abi)
        };
        Ok(Forward::Split {
            rows: compile(row_layer::rows_spec(
                "layernorm_rows",
                hidden,
                attn_dsl::Dtype::F16,
            ))?,
            matmul: compile(row_layer::matmul(
                "layernorm_linear_matmul",
                FORWARD_PRODUCT,
            ))?,
        })
    }
}

/// Rows per backward tile: at least [`MIN_BACKWARD_TILE`], enough that the tiles'
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
