//! LayerNorm + Linear on device tensors: `y = W·LN(x; γ, β) + b` and its backward,
//! recorded into the caller's encoder by a [`LayerNormLinear`]. The two-pass backward's
//! partial sums are the op's own scratch.

use attn_dsl::Scalar;

use super::grid;
use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::dispatch::record::{Dispatch, Pipeline};
use crate::error::{Error, InputError};
use crate::layernorm::LayerNormLinear;
use crate::modifiers::expect;
use crate::tensor::{Tensor, elements};

/// The layer's parameters and input: x `[rows, hidden]`, γ and β `[hidden]`, W `[out,
/// hidden]`, b `[out]`, all f32; `eps` is LayerNorm's epsilon.
#[derive(Clone, Copy, Debug)]
pub struct LayerNormArgs<'a> {
    pub x: &'a Tensor,
    pub gamma: &'a Tensor,
    pub beta: &'a Tensor,
    pub w: &'a Tensor,
    pub b: &'a Tensor,
    pub eps: f32,
}

/// The forward's saved statistics, `[rows]` each.
#[derive(Clone, Copy, Debug)]
pub struct Saved<'a> {
    pub mean: &'a Tensor,
    pub rstd: &'a Tensor,
}

/// The backward's outputs, overwritten: dx `[rows, hidden]`, dγ and dβ `[hidden]`, dW
/// `[out, hidden]`, db `[out]` (their buffers need COPY_DST: the sums start from zero).
#[derive(Clone, Copy, Debug)]
pub struct LayerNormGrads<'a> {
    pub dx: &'a Tensor,
    pub dgamma: &'a Tensor,
    pub dbeta: &'a Tensor,
    pub dw: &'a Tensor,
    pub db: &'a Tensor,
}

/// The recording state of a [`LayerNormLinear`]: its pipelines and scratch.
#[derive(Default)]
pub(crate) struct Recording {
    forward: Option<Pipeline>,
    /// The backward's two kernels (dx, dγ, dβ; dW, db).
    backward: [Option<Pipeline>; 2],
    reduce: Option<Pipeline>,
    /// The two-pass schedule's partials of dγ, dβ, dW and db.
    partials: [Option<Tensor>; 4],
}

impl LayerNormLinear {
    /// The rows of `args`, checked against the layer's widths.
    fn rows_of(&self, args: &LayerNormArgs) -> Result<u32, Error> {
        let rows = args.x.shape().first().copied().unwrap_or(0);
        crate::shape::nonzero("rows", rows)?;
        let (hidden, out) = self.widths();
        let f = Scalar::F32;
        expect(args.x, "x", &[rows, hidden], f, "[rows, hidden]")?;
        expect(args.gamma, "gamma", &[hidden], f, "[hidden]")?;
        expect(args.beta, "beta", &[hidden], f, "[hidden]")?;
        expect(args.w, "w", &[out, hidden], f, "[out, hidden]")?;
        expect(args.b, "b", &[out], f, "[out]")?;
        if !(args.eps.is_finite() && args.eps > 0.0) {
            return Err(InputError::BadValue {
                what: "eps",
                value: args.eps.into(),
                needs: "finite and > 0",
            }
            .into());
        }
        Ok(rows)
    }

    fn base<'a>(args: &LayerNormArgs<'a>) -> Vec<(&'static str, &'a Tensor)> {
        vec![
            ("x", args.x),
            ("gamma", args.gamma),
            ("beta", args.beta),
            ("w", args.w),
            ("b", args.b),
        ]
    }

    /// Records the forward: y `[rows, out]`, with each row's mean and 1/std saved.
    pub fn record_forward(
        &mut self,
        gpu: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        args: &LayerNormArgs,
        y: &Tensor,
        saved: Saved,
    ) -> Result<(), Error> {
        let rows = self.rows_of(args)?;
        let (_, out) = self.widths();
        let f = Scalar::F32;
        expect(y, "y", &[rows, out], f, "[rows, out]")?;
        expect(saved.mean, "mean", &[rows], f, "[rows]")?;
        expect(saved.rstd, "rstd", &[rows], f, "[rows]")?;
        let mut tensors = Self::base(args);
        tensors.extend([("y", y), ("mean", saved.mean), ("rstd", saved.rstd)]);
        let mut d = Dispatch::new(tensors);
        d.dims = self.dims(self.forward_kernel().abi(), rows).to_vec();
        d.params = vec![("eps", args.eps)];
        let kernel = self.forward_kernel().clone();
        let pipeline = self
            .recording
            .forward
            .get_or_insert_with(|| Pipeline::new(kernel));
        let g = grid(pipeline.abi(), &d.dims);
        pipeline.record(gpu, encoder, &d, g)
    }

    /// Records the backward for `dy = ∂L/∂y` `[rows, out]` from the forward's saved
    /// statistics: dx, dγ and dβ, then dW and db (then, under two-pass, the reduce).
    pub fn record_backward(
        &mut self,
        gpu: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        args: &LayerNormArgs,
        saved: Saved,
        dy: &Tensor,
        grads: &LayerNormGrads,
    ) -> Result<(), Error> {
        let rows = self.rows_of(args)?;
        let (hidden, out) = self.widths();
        let f = Scalar::F32;
        expect(dy, "dy", &[rows, out], f, "[rows, out]")?;
        expect(saved.mean, "mean", &[rows], f, "[rows]")?;
        expect(saved.rstd, "rstd", &[rows], f, "[rows]")?;
        expect(grads.dx, "dx", &[rows, hidden], f, "[rows, hidden]")?;
        let finals = [
            ("dgamma", grads.dgamma, vec![hidden]),
            ("dbeta", grads.dbeta, vec![hidden]),
            ("dw", grads.dw, vec![out, hidden]),
            ("db", grads.db, vec![out]),
        ];
        for (name, t, shape) in &finals {
            expect(t, name, shape, f, "the parameter's shape")?;
        }
        let parts = self.partials(rows);
        let two_pass = self.backward_reduce().is_some();
        let mut partials = Vec::new();
        for (i, (name, t, shape)) in finals.iter().enumerate() {
            match two_pass {
                true => {
                    let n = parts[i] as u64 * elements(shape);
                    crate::shape::binding_size(gpu.limits(), 4 * n)?;
                    let held = &mut self.recording.partials[i];
                    if held.as_ref().is_none_or(|h| h.len() < n) {
                        *held = Some(Tensor::zeros(gpu, &[n as u32], f));
                    }
                    partials.push((*name, held.as_ref().expect("made above").view(&[n as u32])?));
                }
                false => {
                    t.check_copy_dst(name)?;
                    partials.push((*name, (*t).clone()));
                }
            }
        }
        let mut tensors = Self::base(args);
        tensors.extend([
            ("dy", dy),
            ("mean", saved.mean),
            ("rstd", saved.rstd),
            ("dx", grads.dx),
        ]);
        tensors.extend(partials.iter().map(|(n, t)| (*n, t)));
        // Each kernel binds its own part of these by name.
        let mut d = Dispatch::new(tensors);
        let [backward, weight_grad] = self.backward_kernels().map(Kernel::clone);
        d.dims = self.dims(backward.abi(), rows).to_vec();
        d.params = vec![("eps", args.eps)];
        if !two_pass {
            // The atomic schedule adds every row tile's sum into the final tensors.
            for (_, t) in &partials {
                t.record_clear(encoder);
            }
        }
        for (kernel, held) in [backward, weight_grad]
            .into_iter()
            .zip(&mut self.recording.backward)
        {
            let pipeline = held.get_or_insert_with(|| Pipeline::new(kernel));
            let g = grid(pipeline.abi(), &d.dims);
            pipeline.record(gpu, encoder, &d, g)?;
        }
        let Some(reduce) = self.backward_reduce().cloned() else {
            return Ok(());
        };
        let part_names = ["dgamma_part", "dbeta_part", "dw_part", "db_part"];
        let mut tensors: Vec<(&str, &Tensor)> = part_names
            .iter()
            .zip(&partials)
            .map(|(n, (_, t))| (*n, t))
            .collect();
        tensors.extend(finals.iter().map(|(n, t, _)| (*n, *t)));
        let mut r = Dispatch::new(tensors);
        r.dims = d.dims.clone();
        let pipeline = self
            .recording
            .reduce
            .get_or_insert_with(|| Pipeline::new(reduce));
        let g = grid(pipeline.abi(), &r.dims);
        pipeline.record(gpu, encoder, &r, g)
    }
}
