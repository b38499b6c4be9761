//! The LayerNorm + Linear of host data: checked, uploaded, recorded through
//! [`LayerNormLinear::record`], read back.

use attn_dsl::Scalar;

use crate::device::Gpu;
use crate::error::{Error, InputError};
use crate::ops::layernorm::LayerNormLinear;
use crate::shape::{binding_size, length, nonzero};
use crate::tensor::Tensor;

/// The gradients [`layernorm_linear_backward`] reads back, each in its input's layout.
#[derive(Clone, Debug)]
pub struct Grads {
    /// dx, `[rows, hidden]`.
    pub dx: Vec<f32>,
    /// dγ, `[hidden]`.
    pub dgamma: Vec<f32>,
    /// dβ, `[hidden]`.
    pub dbeta: Vec<f32>,
    /// dW, `[out, hidden]`.
    pub dw: Vec<f32>,
    /// db, `[out]`.
    pub db: Vec<f32>,
}

/// What [`layernorm_linear`] reads back: the output, and the row statistics the backward
/// takes.
#[derive(Clone, Debug)]
pub struct Output {
    /// `y = W·LN(x) + b`, `[rows, out]`.
    pub y: Vec<f32>,
    /// Each row's mean, `[rows]`.
    pub mean: Vec<f32>,
    /// Each row's 1/std, `[rows]`.
    pub rstd: Vec<f32>,
}

/// The forward's inputs; `eps` is LayerNorm's epsilon (1e-5 in most models).
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    /// Rows of x (batch · seq).
    pub rows: u32,
    /// Width of x's rows: LayerNorm's width and the Linear's input.
    pub hidden: u32,
    /// The Linear's output width.
    pub out: u32,
    /// The input, `[rows, hidden]`.
    pub x: &'a [f32],
    /// LayerNorm's scale γ, `[hidden]`.
    pub gamma: &'a [f32],
    /// LayerNorm's shift β, `[hidden]`.
    pub beta: &'a [f32],
    /// The Linear's weight W, `[out, hidden]`.
    pub w: &'a [f32],
    /// The Linear's bias b, `[out]`.
    pub b: &'a [f32],
    /// LayerNorm's epsilon.
    pub eps: f32,
}

/// `y = W·LN(x) + b`, with each row's mean and 1/std for the backward: the host data
/// checked, uploaded, run through [`LayerNormLinear::record`], read back.
pub async fn layernorm_linear(
    gpu: &Gpu,
    layer: &LayerNormLinear,
    input: &Input<'_>,
) -> Result<Output, Error> {
    validate(gpu, layer, input)?;
    let up = Uploaded::new(gpu, input)?;
    let (rows, out) = (input.rows, input.out);
    let y = Tensor::zeros(gpu, &[rows, out], Scalar::F32)?;
    let mean = Tensor::zeros(gpu, &[rows], Scalar::F32)?;
    let rstd = Tensor::zeros(gpu, &[rows], Scalar::F32)?;
    let saved = crate::ops::layernorm::Saved {
        mean: &mean,
        rstd: &rstd,
    };
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    let call = crate::ops::layernorm::LayerNormCall::Forward {
        args: up.args(input.eps),
        y: &y,
        saved,
    };
    layer.fresh().record(gpu, &mut encoder, &call)?;
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
    let dx = Tensor::zeros(gpu, &[rows, hidden], f)?;
    let dgamma = Tensor::zeros(gpu, &[hidden], f)?;
    let dbeta = Tensor::zeros(gpu, &[hidden], f)?;
    let dw = Tensor::zeros(gpu, &[out, hidden], f)?;
    let db = Tensor::zeros(gpu, &[out], f)?;
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
    let call = crate::ops::layernorm::LayerNormCall::Backward {
        args: up.args(input.eps),
        saved,
        dy: &dy,
        grads,
    };
    layer.fresh().record(gpu, &mut encoder, &call)?;
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

fn validate(gpu: &Gpu, layer: &LayerNormLinear, input: &Input<'_>) -> Result<(), InputError> {
    let name = layer.forward_kernel().abi().name.to_string();
    nonzero("rows", input.rows)?;
    let (hidden, out) = layer.widths();
    for (what, given, built) in [("hidden", input.hidden, hidden), ("out", input.out, out)] {
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
