//! LayerNorm + Linear on device tensors: `y = W·LN(x; γ, β) + b` and its backward,
//! recorded into the caller's encoder by a [`LayerNormLinear`]. The two-pass backward's
//! partial sums are the op's own scratch.

use attn_dsl::Scalar;

use super::grid;
use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::dispatch::record::{Dispatch, Pipeline};
use crate::error::{Error, InputError};
use crate::layernorm::{Forward, LayerNormLinear};
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
    /// The split forward's matmul, W's conversion to f16, and their scratch: the
    /// normalized rows and W in f16.
    matmul: Option<Pipeline>,
    convert: Option<super::convert::Convert>,
    halves: [Option<Tensor>; 2],
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
        if let Some([xn, _]) = &halves {
            tensors.push(("xn", xn));
        }
        let mut d = Dispatch::new(tensors);
        d.dims = self.dims(self.forward_kernel().abi(), rows).to_vec();
        d.params = vec![("eps", args.eps)];
        let kernel = self.forward_kernel().clone();
        let pipeline = self
            .recording
            .forward
            .get_or_insert_with(|| Pipeline::new(kernel));
        let g = grid(pipeline.abi(), &d.dims);
        pipeline.record(gpu, encoder, &d, g)?;
        let (Some(matmul), Some([xn, w16])) = (split, halves) else {
            return Ok(());
        };
        self.recording
            .convert
            .get_or_insert_with(|| super::convert::Convert::new(attn_dsl::Dtype::F16))
            .record_to(gpu, encoder, args.w, &w16)?;
        let (hidden, out) = self.widths();
        let mut m = Dispatch::new(vec![("a", &xn), ("b", &w16), ("bias", args.b), ("c", y)]);
        m.dims = vec![("m", rows), ("n", out), ("k", hidden), ("split", 1)];
        let pipeline = self
            .recording
            .matmul
            .get_or_insert_with(|| Pipeline::new(matmul));
        let g = grid(pipeline.abi(), &m.dims);
        pipeline.record(gpu, encoder, &m, g)
    }

    /// The split forward's f16 scratch, grown to `rows`: the normalized rows `[rows,
    /// hidden]` and W `[out, hidden]`.
    fn half_operands(&mut self, gpu: &Gpu, rows: u32) -> Result<[Tensor; 2], Error> {
        let (hidden, out) = self.widths();
        let shapes = [[rows, hidden], [out, hidden]];
        let mut made = Vec::with_capacity(2);
        for (held, shape) in self.recording.halves.iter_mut().zip(shapes) {
            let n = u64::from(shape[0]) * u64::from(shape[1]);
            crate::shape::binding_size(gpu.limits(), 2 * n)?;
            if held.as_ref().is_none_or(|h| h.len() < n) {
                *held = Some(Tensor::zeros(gpu, &shape, Scalar::F16));
            }
            made.push(held.as_ref().expect("made above").view(&shape)?);
        }
        Ok([made.remove(0), made.remove(0)])
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

#[cfg(test)]
mod tests {
    use crate::BlockOn;
    use crate::device::Gpu;
    use crate::dispatch::kernel::Kernel;
    use crate::dispatch::record::{Dispatch, Pipeline};
    use crate::tensor::Tensor;
    use attn_dsl::{Dtype, Scalar};

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
        let xn = Tensor::zeros(&gpu, &[rows, hidden], Scalar::F16);
        let (mean, rstd) = (
            Tensor::zeros(&gpu, &[rows], Scalar::F32),
            Tensor::zeros(&gpu, &[rows], Scalar::F32),
        );
        let spec = attn_dsl::row_layer::rows_spec("layernorm_rows", hidden, Dtype::F16);
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
        let g = super::grid(pipeline.abi(), &d.dims);
        assert_eq!(g, [3, 1, 1]);
        pipeline
            .record(&gpu, &mut encoder, &d, g)
            .unwrap_or_else(|e| panic!("{e}"));
        gpu.queue.submit([encoder.finish()]);
        let read = |t: &Tensor| crate::block_on(t.to_f32(&gpu)).unwrap_or_else(|e| panic!("{e}"));
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
}
