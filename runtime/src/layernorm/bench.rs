//! GPU time of the fused LayerNorm + Linear: the forward, and the backward under each
//! row-sum schedule (the two-pass one with its reduce), with effective bandwidth and
//! TFLOP/s. The unfused baseline (separate LayerNorm and matmul kernels) is not built yet.

use attn_dsl::row_layer::RowSums;

use super::LayerNormLinear;
use crate::attention::{checked_grid, uniforms};
use crate::buffers;
use crate::cases::random;
use crate::error::Error;
use crate::gpu::Gpu;
use crate::kernel::Kernel;
use crate::timing::{self, Step, Timing};

pub struct LnBenchRow {
    pub label: String,
    pub timing: Timing,
    /// FLOPs: 2·rows·hidden·out for the forward, twice that for the backward (dŷ and dW).
    pub flops: f64,
    /// Bytes every kernel of the row must read or write at least once.
    pub bytes: f64,
}

impl LnBenchRow {
    pub fn tflops(&self) -> f64 {
        self.flops / (self.timing.median_ms * 1e-3) / 1e12
    }

    pub fn gbps(&self) -> f64 {
        self.bytes / (self.timing.median_ms * 1e-3) / 1e9
    }
}

/// The forward (timed once) and the backward of each schedule on `rows` rows.
pub fn run(
    gpu: &Gpu,
    rows: u32,
    hidden: u32,
    out: u32,
    runs: usize,
) -> Result<Vec<LnBenchRow>, Error> {
    let (r, h, o) = (rows as usize, hidden as usize, out as usize);
    let buf = |name: &str, len: usize, seed: u64| buffers::storage(gpu, name, &random(len, seed));
    let ins = [
        ("x", buf("x", r * h, 1)),
        ("gamma", buf("gamma", h, 2)),
        ("beta", buf("beta", h, 3)),
        ("w", buf("w", o * h, 4)),
        ("b", buf("b", o, 5)),
        ("dy", buf("dy", r * o, 6)),
        ("y", buffers::output::<f32>(gpu, "y", r * o)),
        ("mean", buffers::output::<f32>(gpu, "mean", r)),
        ("rstd", buffers::output::<f32>(gpu, "rstd", r)),
        ("dx", buffers::output::<f32>(gpu, "dx", r * h)),
    ];
    let matmul = 2.0 * (r * h * o) as f64;
    let io = |elements: usize| 4.0 * elements as f64;
    let mut rows_out = Vec::new();
    for sums in [RowSums::Atomic, RowSums::TwoPass] {
        let layer = LayerNormLinear::new(gpu, rows, hidden, out, sums)?;
        let parts = layer.partials(rows);
        let grads = [("dgamma", h), ("dbeta", h), ("dw", o * h), ("db", o)]
            .into_iter()
            .zip(parts)
            .map(|((n, len), p)| (n, buffers::output::<f32>(gpu, n, len * p)))
            .collect::<Vec<_>>();
        let finals = [("dgamma", h), ("dbeta", h), ("dw", o * h), ("db", o)]
            .map(|(n, len)| (n, buffers::output::<f32>(gpu, n, len)));
        let dims = layer.dims(layer.backward.abi(), rows);
        let (dims_buf, params) = uniforms(gpu, layer.forward.abi(), &dims, &[("eps", 1e-5)])?;
        let mut all: Vec<(&str, &wgpu::Buffer)> =
            ins.iter().chain(&grads).map(|(n, b)| (*n, b)).collect();
        all.extend([("dims", &dims_buf), ("params", &params)]);
        if rows_out.is_empty() {
            let t = timing::time(gpu, &[step(gpu, &layer.forward, &dims, &all)?], 2, runs)?;
            rows_out.push(LnBenchRow {
                label: "layernorm_linear forward".into(),
                timing: t,
                flops: matmul,
                bytes: io(r * h + o * h + r * o + 2 * r),
            });
        }
        let mut steps = vec![step(gpu, &layer.backward, &dims, &all)?];
        if let Some(reduce) = &layer.reduce {
            let names = ["dgamma_part", "dbeta_part", "dw_part", "db_part"];
            let pool: Vec<(&str, &wgpu::Buffer)> = names
                .iter()
                .zip(&grads)
                .map(|(n, (_, b))| (*n, b))
                .chain(finals.iter().map(|(n, b)| (*n, b)))
                .chain(all.iter().copied())
                .collect();
            steps.push(step(gpu, reduce, &dims, &pool)?);
        }
        let t = timing::time(gpu, &steps, 2, runs)?;
        rows_out.push(LnBenchRow {
            label: format!(
                "layernorm_linear backward ({})",
                super::check::schedule_name(sums)
            ),
            timing: t,
            flops: 2.0 * matmul,
            bytes: io(2 * r * h + o * h + r * o + 2 * r + o * h + o),
        });
    }
    Ok(rows_out)
}

/// A dispatch of `kernel` binding each of its bindings from `pool` by name.
fn step<'a>(
    gpu: &Gpu,
    kernel: &'a Kernel,
    dims: &[(&str, u32)],
    pool: &[(&'a str, &'a wgpu::Buffer)],
) -> Result<Step<'a>, Error> {
    let abi = kernel.abi();
    let grid = checked_grid(abi, gpu.limits(), dims)?;
    let bound = abi
        .bindings
        .iter()
        .filter_map(|b| pool.iter().find(|(n, _)| *n == b.name).copied())
        .collect();
    Ok(Step {
        kernel,
        bound,
        grid,
    })
}
