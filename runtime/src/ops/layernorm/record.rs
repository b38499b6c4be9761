//! LayerNorm + Linear on device tensors: `y = W·LN(x; γ, β) + b` and its backward,
//! recorded into the caller's encoder by a [`LayerNormLinear`]. The two-pass backward's
//! partial sums are the op's own scratch.

use attn_dsl::Scalar;

use super::{Backward, Forward, LayerNormLinear};
use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::dispatch::record::{Dispatch, Pipeline};
use crate::dispatch::recorder::{Record, Recorder};
use crate::error::{Error, InputError};
use crate::modifiers::expect;
use crate::ops::grid;
use crate::tensor::{Tensor, elements};

/// The layer's parameters and input: x `[rows, hidden]`, γ and β `[hidden]`, W `[out,
/// hidden]`, b `[out]`, all f32; `eps` is LayerNorm's epsilon.
#[derive(Clone, Copy, Debug)]
pub struct LayerNormArgs<'a> {
    /// The input.
    pub x: &'a Tensor,
    /// LayerNorm's scale γ.
    pub gamma: &'a Tensor,
    /// LayerNorm's shift β.
    pub beta: &'a Tensor,
    /// The Linear's weight W.
    pub w: &'a Tensor,
    /// The Linear's bias b.
    pub b: &'a Tensor,
    /// LayerNorm's epsilon, added to each row's variance.
    pub eps: f32,
}

/// The forward's saved statistics, `[rows]` each.
#[derive(Clone, Copy, Debug)]
pub struct Saved<'a> {
    /// Each row's mean.
    pub mean: &'a Tensor,
    /// Each row's 1/std.
    pub rstd: &'a Tensor,
}

/// The backward's outputs, overwritten: dx `[rows, hidden]`, dγ and dβ `[hidden]`, dW
/// `[out, hidden]`, db `[out]` (their buffers need COPY_DST: the sums start from zero).
#[derive(Clone, Copy, Debug)]
pub struct LayerNormGrads<'a> {
    /// dx.
    pub dx: &'a Tensor,
    /// dγ.
    pub dgamma: &'a Tensor,
    /// dβ.
    pub dbeta: &'a Tensor,
    /// dW.
    pub dw: &'a Tensor,
    /// db.
    pub db: &'a Tensor,
}

/// One recorded pass of a [`LayerNormLinear`] over the layer's inputs `args`.
#[derive(Clone, Copy, Debug)]
pub enum LayerNormCall<'a> {
    /// The forward: y `[rows, out]`, with each row's mean and 1/std saved.
    Forward {
        /// The layer's parameters and input.
        args: LayerNormArgs<'a>,
        /// The output, written.
        y: &'a Tensor,
        /// The statistics, written.
        saved: Saved<'a>,
    },
    /// The backward for `dy = ∂L/∂y` `[rows, out]` from the forward's saved statistics:
    /// dx, dγ and dβ, then dW and db (then, under two-pass, the reduce).
    Backward {
        /// The layer's parameters and input, as the forward read them.
        args: LayerNormArgs<'a>,
        /// The forward's statistics.
        saved: Saved<'a>,
        /// The gradient of the loss with respect to y.
        dy: &'a Tensor,
        /// The gradients, overwritten.
        grads: LayerNormGrads<'a>,
    },
}

/// The recording state of a [`LayerNormLinear`]: its pipelines and scratch.
#[derive(Default)]
pub(crate) struct Recording {
    forward: Option<Pipeline>,
    /// The split forward's matmul and W's conversion to f16.
    matmul: Option<Pipeline>,
    /// The forward at a few rows: the LayerNorm pass in f32 and a Linear that reads each
    /// weight once for every row, compiled on the first such call.
    few: Option<FewRows>,
    convert: Option<crate::ops::convert::Convert>,
    /// The products' f16 operands on tensor cores: x̂·γ + β, W and dy.
    halves: [Option<Tensor>; 3],
    /// The split backward's dx̂ₙ = dy·W (f32).
    dxn: Option<Tensor>,
    /// The backward's kernels in dispatch order.
    backward: [Option<Pipeline>; 4],
    reduce: Option<Pipeline>,
    /// The two-pass schedule's partials of dγ, dβ, dW and db.
    partials: [Option<Tensor>; 4],
    /// For the bench's breakdown: record only this stage of the tensor-core backward (by
    /// its index in the bench's `SPLIT_STAGES`), every stage when `None`.
    pub(crate) only: Option<usize>,
}

/// The forward of a call of a few rows (a decode step's projection): the LayerNorm pass
/// writes x̂·γ + β in f32, then [`Linear`](crate::ops::linear::Linear) reads each weight once
/// for every row, at the rate W streams from memory, where the products' 64-row tiles
/// would be mostly empty rows.
pub(crate) struct FewRows {
    norm: super::norm::LayerNorm,
    linear: crate::ops::linear::Linear,
    xn: Option<Tensor>,
}

/// The tensor-core backward's stages in recording order, named for the bench's breakdown
/// (their one reader).
#[cfg(all(feature = "harness", not(target_arch = "wasm32")))]
pub(crate) const SPLIT_STAGES: [&str; 6] = [
    "W to f16",
    "grad rows",
    "dxn matmul",
    "dW matmul",
    "chain rule",
    "reduce",
];

impl Recording {
    fn runs(&self, stage: usize) -> bool {
        self.only.is_none_or(|s| s == stage)
    }
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
        let w = Scalar::from(self.weights());
        expect(args.w, "w", &[out, hidden], w, "[out, hidden]")?;
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

    /// Records `call` into `encoder`, after checking every tensor (nothing is recorded
    /// when one is refused).
    pub fn record(
        &mut self,
        gpu: &Gpu,
        encoder: &mut impl Record,
        call: &LayerNormCall,
    ) -> Result<(), Error> {
        encoder.recorder(|rec| match *call {
            LayerNormCall::Forward { args, y, saved } => {
                self.record_forward(gpu, rec, &args, y, saved)
            }
            LayerNormCall::Backward {
                args,
                saved,
                dy,
                grads,
            } => self.record_backward(gpu, rec, &args, saved, dy, &grads),
        })
    }

    /// Records the forward: y `[rows, out]`, with each row's mean and 1/std saved.
    fn record_forward(
        &mut self,
        gpu: &Gpu,
        rec: &mut Recorder,
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
        let (hidden, _) = self.widths();
        // At a few rows (any rows where W is held in half precision, which only this path
        // reads).
        let few = (rows <= crate::ops::linear::LINEAR_MAX_ROWS
            && self.matrix() == attn_dsl::Matrix::Scalar
            && hidden.is_multiple_of(4))
            || self.weights() != attn_dsl::Dtype::F32;
        if few {
            return self.record_forward_rows(gpu, rec, (args, rows), y, saved);
        }
        let split = match self.forward_kernels() {
            Forward::Fused(_) => None,
            Forward::Split { matmul, .. } => Some(matmul.clone()),
        };
        let halves = match split {
            Some(_) => Some(self.half_operands(gpu, rows)?),
            None => None,
        };
        let mut tensors = Self::base(args);
        tensors.extend([("y", y), ("mean", saved.mean), ("rstd", saved.rstd)]);
        if let Some([xn, _, _]) = &halves {
            tensors.push(("xn", xn));
        }
        let mut d = Dispatch::new(tensors);
        d.dims = self.dims(rows).to_vec();
        d.params = vec![("eps", args.eps)];
        let kernel = self.forward_kernel().clone();
        let pipeline = self
            .recording
            .forward
            .get_or_insert_with(|| Pipeline::new(kernel));
        let g = grid(pipeline.abi(), &d.dims);
        pipeline.record(gpu, rec, &d, g)?;
        let (Some(matmul), Some([xn, w16, _])) = (split, halves) else {
            return Ok(());
        };
        to_f16(&mut self.recording.convert, gpu, rec, [args.w, &w16])?;
        let (hidden, out) = self.widths();
        let mut m = Dispatch::new(vec![("a", &xn), ("b", &w16), ("bias", args.b), ("c", y)]);
        m.dims = vec![("m", rows), ("n", out), ("k", hidden), ("split", 1)];
        let pipeline = self
            .recording
            .matmul
            .get_or_insert_with(|| Pipeline::new(matmul));
        let g = grid(pipeline.abi(), &m.dims);
        pipeline.record(gpu, rec, &m, g)
    }

    /// The few-rows forward ([`FewRows`]), the statistics saved by its LayerNorm pass. The
    /// tensor-core layer keeps its products (it rounds their operands to f16, as a
    /// framework's autocast does; this path reads them as they are).
    fn record_forward_rows(
        &mut self,
        gpu: &Gpu,
        rec: &mut Recorder,
        (args, rows): (&LayerNormArgs, u32),
        y: &Tensor,
        saved: Saved,
    ) -> Result<(), Error> {
        let (hidden, out) = self.widths();
        if self.recording.few.is_none() {
            let spec = crate::ops::linear::LinearSpec {
                bias: true,
                ..crate::ops::linear::LinearSpec::new(hidden, out, self.weights())
            };
            self.recording.few = Some(FewRows {
                norm: super::norm::LayerNorm::new(gpu, hidden)?,
                linear: crate::ops::linear::Linear::new(gpu, spec)?,
                xn: None,
            });
        }
        let few = self.recording.few.as_mut().expect("built above");
        if few
            .xn
            .as_ref()
            .is_none_or(|t| t.len() < elements(&[rows, hidden]))
        {
            few.xn = Some(Tensor::zeros(gpu, &[rows, hidden], Scalar::F32)?);
        }
        let xn = few
            .xn
            .as_ref()
            .expect("grown above")
            .view(&[rows, hidden])?;
        let norm = super::norm::NormArgs {
            x: args.x,
            gamma: args.gamma,
            beta: args.beta,
            y: &xn,
            eps: args.eps,
        };
        few.norm.record(gpu, rec, &norm, Some(saved))?;
        let linear = crate::ops::linear::LinearArgs {
            x: &xn,
            w: args.w,
            b: Some(args.b),
            y,
        };
        few.linear.record(gpu, rec, &linear)
    }

    /// The products' f16 operands, grown to `rows`: x̂·γ + β `[rows, hidden]`, W `[out,
    /// hidden]` and dy `[rows, out]`.
    fn half_operands(&mut self, gpu: &Gpu, rows: u32) -> Result<[Tensor; 3], Error> {
        let (hidden, out) = self.widths();
        let shapes = [[rows, hidden], [out, hidden], [rows, out]];
        let mut made = Vec::with_capacity(3);
        for (held, shape) in self.recording.halves.iter_mut().zip(shapes) {
            made.push(grown(gpu, held, &shape, Scalar::F16)?);
        }
        let [xn, w, dy] = <[Tensor; 3]>::try_from(made).expect("three shapes");
        Ok([xn, w, dy])
    }

    /// Records the backward for `dy = ∂L/∂y` `[rows, out]` from the forward's saved
    /// statistics: dx, dγ and dβ, then dW and db (then, under two-pass, the reduce).
    fn record_backward(
        &mut self,
        gpu: &Gpu,
        rec: &mut Recorder,
        args: &LayerNormArgs,
        saved: Saved,
        dy: &Tensor,
        grads: &LayerNormGrads,
    ) -> Result<(), Error> {
        if self.weights() != attn_dsl::Dtype::F32 {
            return Err(InputError::Unsupported {
                what: "the backward of a layer with half-precision weights",
                needs: "f32 weights (`with_weights` is for inference)",
            }
            .into());
        }
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
                    let n = u32::try_from(n).unwrap_or(u32::MAX);
                    let held = &mut self.recording.partials[i];
                    partials.push((*name, grown(gpu, held, &[n], f)?));
                }
                false => {
                    t.check_copy_dst(gpu, name)?;
                    partials.push((*name, (*t).clone()));
                }
            }
        }
        let dims = self.dims(rows).to_vec();
        let io = BackwardIo {
            args,
            saved,
            dy,
            dx: grads.dx,
            partials: &partials,
            dims: &dims,
        };
        match self.backward_kernels().clone() {
            Backward::Fused {
                backward,
                weight_grad,
            } => {
                let mut tensors = Self::base(args);
                tensors.extend([
                    ("dy", dy),
                    ("mean", saved.mean),
                    ("rstd", saved.rstd),
                    ("dx", grads.dx),
                ]);
                tensors.extend(partials.iter().map(|(n, t)| (*n, t)));
                if !two_pass {
                    // Checked before the clears, which would otherwise record first.
                    let abis = [backward.abi(), weight_grad.abi()];
                    let written = ["dx", "dgamma", "dbeta", "dw", "db"];
                    crate::dispatch::record::check_given(gpu, &abis, &tensors, &written)?;
                    // The atomic schedule adds every row tile's sum into the final tensors.
                    for (_, t) in &partials {
                        t.record_clear(rec.encoder());
                    }
                }
                // Each kernel binds its own part of these by name.
                self.record_rows(gpu, rec, [backward, weight_grad], [0, 1], &tensors, &io)?;
            }
            Backward::Split {
                grad_rows,
                dxn,
                dw,
                rows: chain,
            } => self.record_split_backward(gpu, rec, [grad_rows, dxn, dw, chain], &io)?,
        }
        let Some(reduce) = self.backward_reduce().cloned() else {
            return Ok(());
        };
        if self.matrix() == attn_dsl::Matrix::Coop16 && !self.recording.runs(5) {
            return Ok(());
        }
        let part_names = ["dgamma_part", "dbeta_part", "dw_part", "db_part"];
        let mut tensors: Vec<(&str, &Tensor)> = part_names
            .iter()
            .zip(&partials)
            .map(|(n, (_, t))| (*n, t))
            .collect();
        tensors.extend(finals.iter().map(|(n, t, _)| (*n, *t)));
        let mut r = Dispatch::new(tensors);
        r.dims = dims;
        let pipeline = self
            .recording
            .reduce
            .get_or_insert_with(|| Pipeline::new(reduce));
        let g = grid(pipeline.abi(), &r.dims);
        pipeline.record(gpu, rec, &r, g)
    }

    /// Records row kernels (pipelines `slots` of the backward's) over `tensors` with the
    /// layer's dims and epsilon.
    fn record_rows<const N: usize>(
        &mut self,
        gpu: &Gpu,
        rec: &mut Recorder,
        kernels: [Kernel; N],
        slots: [usize; N],
        tensors: &[(&str, &Tensor)],
        io: &BackwardIo,
    ) -> Result<(), Error> {
        let mut d = Dispatch::new(tensors.to_vec());
        d.dims = io.dims.to_vec();
        d.params = vec![("eps", io.args.eps)];
        for (kernel, slot) in kernels.into_iter().zip(slots) {
            let pipeline =
                self.recording.backward[slot].get_or_insert_with(|| Pipeline::new(kernel));
            let g = grid(pipeline.abi(), &d.dims);
            pipeline.record(gpu, rec, &d, g)?;
        }
        Ok(())
    }

    /// The backward on tensor cores: W to f16; x̂·γ + β and dy to f16 with db's partials;
    /// dx̂ₙ = dy·W and dW's parts = dyᵀ·(x̂·γ + β) on the f16 operands; the chain rule's row
    /// pass (dx, dγ's and dβ's partials). The reduce follows.
    fn record_split_backward(
        &mut self,
        gpu: &Gpu,
        rec: &mut Recorder,
        [grad_rows, dxn_product, dw_product, chain]: [Kernel; 4],
        io: &BackwardIo,
    ) -> Result<(), Error> {
        let rows = io.dims[0].1;
        let (hidden, out) = self.widths();
        let [xn, w16, dy16] = self.half_operands(gpu, rows)?;
        let dxn = grown(gpu, &mut self.recording.dxn, &[rows, hidden], Scalar::F32)?;
        if self.recording.runs(0) {
            to_f16(&mut self.recording.convert, gpu, rec, [io.args.w, &w16])?;
        }
        let part = |name: &str| {
            io.partials
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, t)| t)
                .expect("the four row sums")
        };
        let a = io.args;
        let tensors = [
            ("x", a.x),
            ("gamma", a.gamma),
            ("beta", a.beta),
            ("dy", io.dy),
            ("xn", &xn),
            ("dyh", &dy16),
            ("db", part("db")),
        ];
        if self.recording.runs(1) {
            self.record_rows(gpu, rec, [grad_rows], [0], &tensors, io)?;
        }
        let dw_parts = super::dw_parts(rows, hidden, out);
        let products = [
            (dxn_product, 1, [&dy16, &w16, &dxn], [rows, hidden, out, 1]),
            (
                dw_product,
                2,
                [&dy16, &xn, part("dw")],
                [out, hidden, rows, dw_parts],
            ),
        ];
        for (kernel, slot, [a, b, c], [m, n, k, split]) in products {
            if !self.recording.runs(slot + 1) {
                continue;
            }
            let mut d = Dispatch::new(vec![("a", a), ("b", b), ("c", c)]);
            d.dims = vec![("m", m), ("n", n), ("k", k), ("split", split)];
            let pipeline =
                self.recording.backward[slot].get_or_insert_with(|| Pipeline::new(kernel));
            let g = grid(pipeline.abi(), &d.dims);
            pipeline.record(gpu, rec, &d, g)?;
        }
        let tensors = [
            ("x", a.x),
            ("gamma", a.gamma),
            ("mean", io.saved.mean),
            ("rstd", io.saved.rstd),
            ("dxn", &dxn),
            ("dx", io.dx),
            ("dgamma", part("dgamma")),
            ("dbeta", part("dbeta")),
        ];
        if self.recording.runs(4) {
            self.record_rows(gpu, rec, [chain], [3], &tensors, io)?;
        }
        Ok(())
    }
}

/// What every kernel of one backward binds or reads: the layer's inputs, the saved
/// statistics, dy and dx, the row sums' partials (or final tensors) by name, the dims.
struct BackwardIo<'a> {
    args: &'a LayerNormArgs<'a>,
    saved: Saved<'a>,
    dy: &'a Tensor,
    dx: &'a Tensor,
    partials: &'a [(&'static str, Tensor)],
    dims: &'a [(&'static str, u32)],
}

/// A scratch tensor of `shape` in `held` (grown when it must be), after checking that it
/// fits one binding.
fn grown(
    gpu: &Gpu,
    held: &mut Option<Tensor>,
    shape: &[u32],
    scalar: Scalar,
) -> Result<Tensor, Error> {
    let bytes = crate::tensor::element_bytes(scalar) * elements(shape);
    crate::shape::binding_size(gpu.limits(), bytes)?;
    crate::ops::scratch(held, gpu, shape, scalar)
}

/// Records `dst = src` rounded to f16 through the conversion op in `slot`, made on first use.
fn to_f16(
    slot: &mut Option<crate::ops::convert::Convert>,
    gpu: &Gpu,
    rec: &mut Recorder,
    [src, dst]: [&Tensor; 2],
) -> Result<(), Error> {
    use crate::ops::convert::{Convert, ConvertArgs};
    if slot.is_none() {
        *slot = Some(Convert::new(gpu, attn_dsl::Dtype::F16)?);
    }
    let convert = slot.as_mut().expect("made above");
    convert.record(gpu, rec, &ConvertArgs { src, dst })
}

#[cfg(test)]
mod tests {
    use crate::device::Gpu;
    use crate::dispatch::kernel::Kernel;
    use crate::dispatch::record::{Dispatch, Pipeline};
    use crate::tensor::Tensor;
    use attn_dsl::{Dtype, Scalar};
    use pollster::FutureExt as BlockOn;

    /// The split forward's LayerNorm pass (the half that runs without tensor cores): each
    /// row's mean and 1/std and its x̂·γ + β rounded to f16, against the host, at a row count
    /// that leaves the last workgroup part empty and a width of an odd number of vec4s.
    #[test]
    fn layernorm_pass_writes_statistics_and_f16_rows() {
        let gpu = Gpu::new(crate::kernels::FAMILY.iter().copied())
            .block_on()
            .unwrap_or_else(|e| panic!("{e}"));
        if !gpu.has_f16() {
            panic!("this test needs an adapter with SHADER_F16 (lavapipe has it)");
        }
        let (rows, hidden) = (37u32, 44u32);
        let x: Vec<f32> = (0..rows * hidden)
            .map(|i| ((i * 7919) % 997) as f32 / 97.0 - 5.0 + (i / hidden) as f32)
            .collect();
        let gamma: Vec<f32> = (0..hidden).map(|i| 0.5 + i as f32 / 50.0).collect();
        let beta: Vec<f32> = (0..hidden).map(|i| i as f32 / 10.0 - 2.0).collect();
        let f32s = |shape: &[u32], d: &[f32]| {
            Tensor::from_f32(&gpu, shape, Scalar::F32, d).unwrap_or_else(|e| panic!("{e}"))
        };
        let (xt, gt, bt) = (
            f32s(&[rows, hidden], &x),
            f32s(&[hidden], &gamma),
            f32s(&[hidden], &beta),
        );
        let xn = Tensor::zeros(&gpu, &[rows, hidden], Scalar::F16).unwrap();
        let (mean, rstd) = (
            Tensor::zeros(&gpu, &[rows], Scalar::F32).unwrap(),
            Tensor::zeros(&gpu, &[rows], Scalar::F32).unwrap(),
        );
        let spec = attn_dsl::row_layer::rows_spec(
            "layernorm_rows",
            hidden,
            Dtype::F16,
            attn_dsl::row_layer::NORM_ROWS,
        );
        let abi = attn_dsl::compile(&spec).unwrap_or_else(|e| panic!("{e}"));
        let kernel = Kernel::now(&gpu, &abi).unwrap_or_else(|e| panic!("{e}"));
        let mut pipeline = Pipeline::new(kernel);
        let mut d = Dispatch::new(vec![
            ("x", &xt),
            ("gamma", &gt),
            ("beta", &bt),
            ("xn", &xn),
            ("mean", &mean),
            ("rstd", &rstd),
        ]);
        d.dims = vec![("rows", rows), ("hidden", hidden), ("out", 4)];
        d.params = vec![("eps", 1e-5)];
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        let g = crate::ops::grid(pipeline.abi(), &d.dims);
        assert_eq!(g, [3, 1, 1]);
        pipeline
            .record(
                &gpu,
                &mut crate::dispatch::Recorder::new(&mut encoder),
                &d,
                g,
            )
            .unwrap_or_else(|e| panic!("{e}"));
        gpu.queue.submit([encoder.finish()]);
        let read =
            |t: &Tensor| crate::device::block_on(t.to_f32(&gpu)).unwrap_or_else(|e| panic!("{e}"));
        let (got_xn, got_mean, got_rstd) = (read(&xn), read(&mean), read(&rstd));
        for (r, row) in x.chunks(hidden as usize).enumerate() {
            let n = f64::from(hidden);
            let mu = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
            let var = row
                .iter()
                .map(|&v| (f64::from(v) - mu).powi(2))
                .sum::<f64>()
                / n;
            let sd = 1.0 / (var + 1e-5).sqrt();
            assert!(
                (f64::from(got_mean[r]) - mu).abs() <= 1e-5 * mu.abs().max(1.0),
                "row {r}"
            );
            assert!((f64::from(got_rstd[r]) - sd).abs() <= 1e-5 * sd, "row {r}");
            for (k, &v) in row.iter().enumerate() {
                let want = (f64::from(v) - mu) * sd * f64::from(gamma[k]) + f64::from(beta[k]);
                let got = f64::from(got_xn[r * hidden as usize + k]);
                // f16 keeps 11 significant bits.
                assert!(
                    (got - want).abs() <= 1e-3 * want.abs().max(1.0),
                    "({r}, {k})"
                );
            }
        }
    }

    /// Records one row pass of `spec` over `rows` rows on `tensors`.
    fn run_pass(
        gpu: &Gpu,
        spec: &attn_dsl::KernelSpec,
        tensors: Vec<(&str, &Tensor)>,
        dims: [u32; 3],
    ) {
        let abi = attn_dsl::compile(spec).unwrap_or_else(|e| panic!("{e}"));
        let kernel = Kernel::now(gpu, &abi).unwrap_or_else(|e| panic!("{e}"));
        let mut pipeline = Pipeline::new(kernel);
        let mut d = Dispatch::new(tensors);
        let [rows, hidden, out] = dims;
        let blocks = rows.div_ceil(attn_dsl::row_layer::NORM_ROWS);
        d.dims = vec![
            ("rows", rows),
            ("hidden", hidden),
            ("out", out),
            ("n_tiles", 1),
            ("n_blocks", blocks),
            ("db_parts", blocks),
        ];
        d.params = vec![("eps", 1e-5)];
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        let g = crate::ops::grid(pipeline.abi(), &d.dims);
        assert_eq!(g, [blocks, 1, 1]);
        pipeline
            .record(
                gpu,
                &mut crate::dispatch::Recorder::new(&mut encoder),
                &d,
                g,
            )
            .unwrap_or_else(|e| panic!("{e}"));
        gpu.queue.submit([encoder.finish()]);
    }

    /// The tensor-core backward's two row passes (the part that runs without tensor cores)
    /// against the host: x̂·γ + β and dy in f16 with db's partials, then from a dx̂ₙ the
    /// LayerNorm chain rule's dx with dγ's and dβ's partials, at a row count that leaves
    /// the last workgroup part empty and widths of odd numbers of vec4s.
    #[test]
    fn split_backward_row_passes_match_the_host() {
        let gpu = Gpu::new(crate::kernels::FAMILY.iter().copied())
            .block_on()
            .unwrap_or_else(|e| panic!("{e}"));
        let (rows, hidden, out) = (37u32, 44u32, 20u32);
        let (r, h, o) = (rows as usize, hidden as usize, out as usize);
        let wave = |n: usize, k: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * k) % 997) as f32 / 97.0 - 5.0 + (i / 13) as f32 / 7.0)
                .collect()
        };
        let (x, dy, dxn) = (wave(r * h, 7919), wave(r * o, 104_729), wave(r * h, 1299));
        let gamma: Vec<f32> = (0..h).map(|i| 0.5 + i as f32 / 50.0).collect();
        let beta: Vec<f32> = (0..h).map(|i| i as f32 / 10.0 - 2.0).collect();
        let up = |shape: &[u32], d: &[f32]| {
            Tensor::from_f32(&gpu, shape, Scalar::F32, d).unwrap_or_else(|e| panic!("{e}"))
        };
        let (xt, gt, bt) = (
            up(&[rows, hidden], &x),
            up(&[hidden], &gamma),
            up(&[hidden], &beta),
        );
        let (dyt, dxnt) = (up(&[rows, out], &dy), up(&[rows, hidden], &dxn));
        // The host's statistics, as f32 (what the forward saved).
        let stats: Vec<(f64, f64)> = x
            .chunks(h)
            .map(|row| {
                let mu = row.iter().map(|&v| f64::from(v)).sum::<f64>() / h as f64;
                let var = row
                    .iter()
                    .map(|&v| (f64::from(v) - mu).powi(2))
                    .sum::<f64>()
                    / h as f64;
                (mu, 1.0 / (var + 1e-5).sqrt())
            })
            .collect();
        let mean = up(
            &[rows],
            &stats.iter().map(|s| s.0 as f32).collect::<Vec<_>>(),
        );
        let rstd = up(
            &[rows],
            &stats.iter().map(|s| s.1 as f32).collect::<Vec<_>>(),
        );
        let blocks = rows.div_ceil(attn_dsl::row_layer::NORM_ROWS);
        let zeros = |shape: &[u32], s| Tensor::zeros(&gpu, shape, s).unwrap();
        let (xn, dyh) = (
            zeros(&[rows, hidden], Scalar::F16),
            zeros(&[rows, out], Scalar::F16),
        );
        let db = zeros(&[blocks, out], Scalar::F32);
        let (dx, dgamma, dbeta) = (
            zeros(&[rows, hidden], Scalar::F32),
            zeros(&[blocks, hidden], Scalar::F32),
            zeros(&[blocks, hidden], Scalar::F32),
        );
        use attn_dsl::row_layer::{grad_rows_spec, rows_backward_spec};
        let grad_rows = grad_rows_spec("grad_rows", hidden, out, Dtype::F16);
        let io = vec![("x", &xt), ("gamma", &gt), ("beta", &bt), ("dy", &dyt)];
        let outs = [("xn", &xn), ("dyh", &dyh), ("db", &db)];
        run_pass(
            &gpu,
            &grad_rows,
            io.into_iter().chain(outs).collect(),
            [rows, hidden, out],
        );
        let chain = rows_backward_spec("rows_backward", hidden, out);
        let tensors = vec![
            ("x", &xt),
            ("gamma", &gt),
            ("mean", &mean),
            ("rstd", &rstd),
            ("dxn", &dxnt),
            ("dx", &dx),
            ("dgamma", &dgamma),
            ("dbeta", &dbeta),
        ];
        run_pass(&gpu, &chain, tensors, [rows, hidden, out]);
        let read =
            |t: &Tensor| crate::device::block_on(t.to_f32(&gpu)).unwrap_or_else(|e| panic!("{e}"));
        let close = |got: f32, want: f64, tol: f64, what: &str| {
            assert!(
                (f64::from(got) - want).abs() <= tol * want.abs().max(1.0),
                "{what}: {got} against {want}"
            );
        };
        let part_sum = |parts: &[f32], width: usize, e: usize| -> f32 {
            (0..blocks as usize).map(|p| parts[p * width + e]).sum()
        };
        let (got_xn, got_dyh, got_db) = (read(&xn), read(&dyh), read(&db));
        let (got_dx, got_dg, got_db2) = (read(&dx), read(&dgamma), read(&dbeta));
        let xhat = |i: usize| (f64::from(x[i]) - stats[i / h].0) * stats[i / h].1;
        for (i, &got) in got_xn.iter().enumerate() {
            let k = i % h;
            // f16 keeps 11 significant bits.
            close(
                got,
                xhat(i) * f64::from(gamma[k]) + f64::from(beta[k]),
                1e-3,
                "xn",
            );
        }
        for (i, &v) in dy.iter().enumerate() {
            close(got_dyh[i], f64::from(v), 1e-3, "dy in f16");
        }
        for n in 0..o {
            let want: f64 = (0..r).map(|row| f64::from(dy[row * o + n])).sum();
            close(part_sum(&got_db, o, n), want, 1e-5, "db");
        }
        for (row, &(_, rs)) in stats.iter().enumerate() {
            let at = |k: usize| row * h + k;
            let dxhat = |k: usize| f64::from(dxn[at(k)]) * f64::from(gamma[k]);
            let c2 = (0..h).map(dxhat).sum::<f64>() / h as f64;
            let c1 = (0..h).map(|k| dxhat(k) * xhat(at(k))).sum::<f64>() / h as f64;
            for k in 0..h {
                let want = rs * (dxhat(k) - c2 - xhat(at(k)) * c1);
                close(got_dx[at(k)], want, 1e-4, "dx");
            }
        }
        for k in 0..h {
            let dg: f64 = (0..r)
                .map(|row| f64::from(dxn[row * h + k]) * xhat(row * h + k))
                .sum();
            let db: f64 = (0..r).map(|row| f64::from(dxn[row * h + k])).sum();
            close(part_sum(&got_dg, h, k), dg, 1e-4, "dgamma");
            close(part_sum(&got_db2, h, k), db, 1e-4, "dbeta");
        }
    }
}
