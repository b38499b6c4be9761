//! The fused LayerNorm + Linear of seed 003 on the GPU: `y = W·LN(x; γ, β) + b` over
//! `[rows, hidden] -> [rows, out]` (rows = batch · seq), and its backward with dγ, dβ, dW
//! and db summed over rows by atomics or by the two-pass schedule.

#[cfg(not(target_arch = "wasm32"))]
pub mod baseline;
#[cfg(not(target_arch = "wasm32"))]
pub mod bench;
#[cfg(not(target_arch = "wasm32"))]
pub mod check;
pub mod reference;

use attn_dsl::row_layer::{self, RowSums};
use attn_dsl::{KernelAbi, Op};

use attn_dsl::Scalar;

use crate::attention::{binding_size, length, nonzero};
use crate::device::Gpu;
use crate::error::{Error, InputError};
use crate::kernel::Kernel;
use crate::tensor::Tensor;

/// The most bytes the two-pass schedule's partials may take (one dW per row tile).
pub const SCRATCH_BUDGET: u64 = 64 << 20;

/// Rows a backward tile takes at least: fewer rows per atomic add or partial only adds
/// adds (and rounding) without adding parallelism worth having.
/// One dx block (64 rows): a smaller tile leaves the products' workgroups part empty.
const MIN_BACKWARD_TILE: u32 = row_layer::DX_ROWS;

/// The backward's row-sum schedule for `rows` rows of `hidden -> out` on an adapter
/// whose tuning table is `table`: the table's measured choice (`bench --layernorm ROWS
/// --tune`, nearest measured row count), else [`sums_by_size`].
pub fn plan_sums(table: &crate::tuning::Table, rows: u32, hidden: u32, out: u32) -> RowSums {
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

/// The forward, backward and (two-pass) reduce kernels of one `hidden -> out` layer,
/// compiled for this device and a number of rows.
pub struct LayerNormLinear {
    forward: Kernel,
    backward: Kernel,
    reduce: Option<Kernel>,
    hidden: u32,
    out: u32,
    /// Pipelines and scratch of the recording API ([`crate::ops::layernorm`]).
    pub(crate) recording: crate::ops::layernorm::Recording,
}

/// The forward's inputs; `eps` is LayerNorm's epsilon (1e-5 in most models).
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    pub rows: u32,
    pub hidden: u32,
    pub out: u32,
    pub x: &'a [f32],
    pub gamma: &'a [f32],
    pub beta: &'a [f32],
    pub w: &'a [f32],
    pub b: &'a [f32],
    pub eps: f32,
}

#[derive(Clone, Debug)]
pub struct Output {
    pub y: Vec<f32>,
    pub mean: Vec<f32>,
    pub rstd: Vec<f32>,
}

#[derive(Clone, Debug)]
pub struct Grads {
    pub dx: Vec<f32>,
    pub dgamma: Vec<f32>,
    pub dbeta: Vec<f32>,
    pub dw: Vec<f32>,
    pub db: Vec<f32>,
}

impl LayerNormLinear {
    /// Compiles the kernels of `hidden -> out`, the row sums by `sums`, for problems of
    /// about `rows` rows (any number runs; the backward tile is sized so that `rows` rows'
    /// two-pass partials fit [`SCRATCH_BUDGET`]).
    pub fn new(gpu: &Gpu, rows: u32, hidden: u32, out: u32, sums: RowSums) -> Result<Self, Error> {
        nonzero("rows", rows)?;
        nonzero("hidden", hidden)?;
        nonzero("out", out)?;
        let fwd_tile =
            row_layer::forward_tile(hidden, gpu.limits().max_compute_workgroup_storage_size);
        let bwd_tile = backward_tile(rows, hidden, out);
        let kernel = |name: &str, op, tile| {
            let spec = row_layer::spec(name, op, hidden, out, tile, sums);
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
        Ok(LayerNormLinear {
            forward: kernel("layernorm_linear", Op::LayernormLinear, fwd_tile)?,
            backward: kernel(
                "layernorm_linear_backward",
                Op::LayernormLinearBackward,
                bwd_tile,
            )?,
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

    pub(crate) fn forward_kernel(&self) -> &Kernel {
        &self.forward
    }

    pub(crate) fn backward_kernel(&self) -> &Kernel {
        &self.backward
    }

    pub(crate) fn backward_reduce(&self) -> Option<&Kernel> {
        self.reduce.as_ref()
    }

    /// [`LayerNormLinear::new`] with the row-sum schedule the planner picks for this
    /// adapter ([`plan_sums`] over its tuning table).
    pub fn planned(gpu: &Gpu, rows: u32, hidden: u32, out: u32) -> Result<Self, Error> {
        let table = crate::tuning::Table::for_gpu(gpu)?;
        LayerNormLinear::new(gpu, rows, hidden, out, plan_sums(&table, rows, hidden, out))
    }

    /// How this layer's backward sums dγ, dβ, dW and db over rows.
    pub fn sums(&self) -> RowSums {
        if self.reduce.is_some() {
            RowSums::TwoPass
        } else {
            RowSums::Atomic
        }
    }

    /// The kernels, forward first: for the bench and for reports.
    pub fn kernels(&self) -> impl Iterator<Item = &Kernel> {
        [&self.forward, &self.backward]
            .into_iter()
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
    /// atomics; under two-pass one per dx block, and one per row tile for dW.
    pub(crate) fn partials(&self, rows: u32) -> [usize; 4] {
        if self.reduce.is_none() {
            return [1; 4];
        }
        let dims = self.dims(self.backward.abi(), rows);
        let (tiles, blocks) = (dims[3].1 as usize, dims[4].1 as usize);
        [blocks, blocks, tiles, blocks]
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

/// `y = W·LN(x) + b`, with each row's mean and 1/std for the backward: the host data
/// checked, uploaded, run through [`LayerNormLinear::record_forward`], read back.
pub async fn layernorm_linear(
    gpu: &Gpu,
    layer: &LayerNormLinear,
    input: &Input<'_>,
) -> Result<Output, Error> {
    validate(gpu, layer, input)?;
    let up = Uploaded::new(gpu, input)?;
    let (rows, out) = (input.rows, input.out);
    let y = Tensor::zeros(gpu, &[rows, out], Scalar::F32);
    let mean = Tensor::zeros(gpu, &[rows], Scalar::F32);
    let rstd = Tensor::zeros(gpu, &[rows], Scalar::F32);
    let saved = crate::ops::layernorm::Saved {
        mean: &mean,
        rstd: &rstd,
    };
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    layer
        .fresh()
        .record_forward(gpu, &mut encoder, &up.args(input.eps), &y, saved)?;
    gpu.queue.submit([encoder.finish()]);
    Ok(Output {
        y: y.to_f32(gpu).await?,
        mean: mean.to_f32(gpu).await?,
        rstd: rstd.to_f32(gpu).await?,
    })
}

/// The gradients of `L` for `dy = ∂L/∂y`, from the forward's saved `mean` and `rstd`.
pub async fn layernorm_linear_backward(
    gpu: &Gpu,
    layer: &LayerNormLinear,
    input: &Input<'_>,
    saved: &Output,
    dy: &[f32],
) -> Result<Grads, Error> {
    validate(gpu, layer, input)?;
    let (rows, hidden, out) = (input.rows, input.hidden, input.out);
    length(
        "dy",
        dy.len(),
        u64::from(rows) * u64::from(out),
        "rows × out",
    )?;
    length("mean", saved.mean.len(), rows.into(), "rows")?;
    length("rstd", saved.rstd.len(), rows.into(), "rows")?;
    let up = Uploaded::new(gpu, input)?;
    let f = Scalar::F32;
    let dy = Tensor::from_f32(gpu, &[rows, out], f, dy)?;
    let mean = Tensor::from_f32(gpu, &[rows], f, &saved.mean)?;
    let rstd = Tensor::from_f32(gpu, &[rows], f, &saved.rstd)?;
    let dx = Tensor::zeros(gpu, &[rows, hidden], f);
    let dgamma = Tensor::zeros(gpu, &[hidden], f);
    let dbeta = Tensor::zeros(gpu, &[hidden], f);
    let dw = Tensor::zeros(gpu, &[out, hidden], f);
    let db = Tensor::zeros(gpu, &[out], f);
    let grads = crate::ops::layernorm::LayerNormGrads {
        dx: &dx,
        dgamma: &dgamma,
        dbeta: &dbeta,
        dw: &dw,
        db: &db,
    };
    let saved = crate::ops::layernorm::Saved {
        mean: &mean,
        rstd: &rstd,
    };
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    layer
        .fresh()
        .record_backward(gpu, &mut encoder, &up.args(input.eps), saved, &dy, &grads)?;
    gpu.queue.submit([encoder.finish()]);
    Ok(Grads {
        dx: dx.to_f32(gpu).await?,
        dgamma: dgamma.to_f32(gpu).await?,
        dbeta: dbeta.to_f32(gpu).await?,
        dw: dw.to_f32(gpu).await?,
        db: db.to_f32(gpu).await?,
    })
}

/// The layer's input and parameters on the device.
struct Uploaded {
    x: Tensor,
    gamma: Tensor,
    beta: Tensor,
    w: Tensor,
    b: Tensor,
}

impl Uploaded {
    fn new(gpu: &Gpu, input: &Input) -> Result<Uploaded, Error> {
        let f = Scalar::F32;
        let (rows, hidden, out) = (input.rows, input.hidden, input.out);
        Ok(Uploaded {
            x: Tensor::from_f32(gpu, &[rows, hidden], f, input.x)?,
            gamma: Tensor::from_f32(gpu, &[hidden], f, input.gamma)?,
            beta: Tensor::from_f32(gpu, &[hidden], f, input.beta)?,
            w: Tensor::from_f32(gpu, &[out, hidden], f, input.w)?,
            b: Tensor::from_f32(gpu, &[out], f, input.b)?,
        })
    }

    fn args(&self, eps: f32) -> crate::ops::layernorm::LayerNormArgs<'_> {
        crate::ops::layernorm::LayerNormArgs {
            x: &self.x,
            gamma: &self.gamma,
            beta: &self.beta,
            w: &self.w,
            b: &self.b,
            eps,
        }
    }
}

fn validate(gpu: &Gpu, layer: &LayerNormLinear, input: &Input) -> Result<(), InputError> {
    let name = layer.forward.abi().name.to_string();
    nonzero("rows", input.rows)?;
    for (what, given, built) in [
        ("hidden", input.hidden, layer.hidden),
        ("out", input.out, layer.out),
    ] {
        if given != built {
            return Err(InputError::RowLayer {
                kernel: name,
                what,
                built,
                given,
            });
        }
    }
    let (rows, hidden, out) = (
        u64::from(input.rows),
        u64::from(input.hidden),
        u64::from(input.out),
    );
    length("x", input.x.len(), rows * hidden, "rows × hidden")?;
    length("gamma", input.gamma.len(), hidden, "hidden")?;
    length("beta", input.beta.len(), hidden, "hidden")?;
    length("w", input.w.len(), out * hidden, "out × hidden")?;
    length("b", input.b.len(), out, "out")?;
    if !(input.eps.is_finite() && input.eps > 0.0) {
        return Err(InputError::BadValue {
            what: "eps",
            value: input.eps.into(),
            needs: "finite and > 0",
        });
    }
    binding_size(gpu.limits(), 4 * rows * hidden.max(out))
}
