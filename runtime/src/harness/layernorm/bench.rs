//! GPU time of the fused LayerNorm + Linear: the forward, and the backward under each
//! row-sum schedule (its two kernels, and the two-pass one's reduce), with effective
//! bandwidth and TFLOP/s; beside them the unfused baseline (separate LayerNorm and matmul
//! kernels, [`super::baseline`]) doing the same work, timed the same way.

use attn_dsl::Matrix;
use attn_dsl::row_layer::RowSums;

use super::baseline::{Baseline, Shape, matmul_grid};
use crate::device::Gpu;
use crate::error::Error;
use crate::ops::layernorm::{
    LayerNormArgs, LayerNormCall, LayerNormGrads, LayerNormLinear, LayerNormSpec, Saved,
};
use crate::tensor::Tensor;
use crate::tensor::buffers;
use crate::timing::{self, Step, Timing};
use crate::verify::random;

pub struct LnBenchRow {
    pub label: String,
    pub timing: Timing,
    /// FLOPs: 2·rows·hidden·out for the forward, twice that for the backward (dŷ and dW).
    pub flops: f64,
    /// Bytes every kernel of the row must read or write at least once.
    pub bytes: f64,
    /// The fused backward's row-sum schedule; None for the other rows.
    pub sums: Option<RowSums>,
}

/// The faster fused backward schedule among `rows` (for `bench --tune`).
pub fn fastest_sums(rows: &[LnBenchRow]) -> Option<RowSums> {
    rows.iter()
        .filter(|r| r.sums.is_some())
        .min_by(|a, b| a.timing.median_ms.total_cmp(&b.timing.median_ms))
        .and_then(|r| r.sums)
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
    // Tensor cores where the adapter has them: their rows are not tuning candidates (their
    // products round to f16, the planned layer's do not).
    let matrices = [Matrix::Scalar, Matrix::Coop16];
    let matrices = &matrices[..if gpu.has_coop16() { 2 } else { 1 }];
    // On tensor cores the row sums are always the reduce's (see `LayerNormSpec::matrix`).
    let schedules = matrices.iter().flat_map(|&m| match m {
        Matrix::Scalar => vec![(m, RowSums::Atomic), (m, RowSums::TwoPass)],
        Matrix::Coop16 => vec![(m, RowSums::TwoPass)],
    });
    let mut timed_forward = Vec::new();
    for (matrix, sums) in schedules {
        let spec = LayerNormSpec {
            sums: Some(sums),
            matrix,
            ..LayerNormSpec::new(rows, hidden, out)
        };
        let layer = LayerNormLinear::new(gpu, spec)?;
        let tc = match matrix {
            Matrix::Scalar => "",
            Matrix::Coop16 => "+tc",
        };
        let shape = [rows, hidden, out];
        if !timed_forward.contains(&matrix) {
            timed_forward.push(matrix);
            let t = time_forward(gpu, layer.fresh(), &ins, shape, runs)?;
            rows_out.push(LnBenchRow {
                label: format!("layernorm_linear forward{tc}"),
                timing: t,
                flops: matmul,
                bytes: io(r * h + o * h + r * o + 2 * r),
                sums: None,
            });
        }
        if matrix == Matrix::Coop16 {
            // Each stage of the backward alone: where its time goes.
            for (i, stage) in crate::ops::layernorm::SPLIT_STAGES.iter().enumerate() {
                let mut alone = layer.fresh();
                alone.recording.only = Some(i);
                rows_out.push(LnBenchRow {
                    label: format!("  backward+tc stage: {stage}"),
                    timing: time_backward(gpu, alone, &ins, shape, runs)?,
                    flops: if (2..4).contains(&i) { matmul } else { 0.0 },
                    bytes: 0.0,
                    sums: None,
                });
            }
        }
        let t = time_backward(gpu, layer, &ins, shape, runs)?;
        rows_out.push(LnBenchRow {
            label: format!(
                "layernorm_linear backward{tc} ({})",
                super::check::schedule_name(sums)
            ),
            timing: t,
            flops: 2.0 * matmul,
            bytes: io(2 * r * h + o * h + r * o + 2 * r + o * h + o),
            sums: matrix.is_scalar().then_some(sums),
        });
    }
    let like = LayerNormSpec {
        sums: Some(RowSums::Atomic),
        ..LayerNormSpec::new(rows, hidden, out)
    };
    let like = LayerNormLinear::new(gpu, like)?;
    rows_out.extend(baseline(
        gpu,
        like.forward_kernel().abi(),
        &ins,
        (r, h, o),
        runs,
    )?);
    Ok(rows_out)
}

/// The bench's f32 inputs and outputs as tensors of `[rows, hidden, out]`.
struct Io {
    x: Tensor,
    gamma: Tensor,
    beta: Tensor,
    w: Tensor,
    b: Tensor,
    y: Tensor,
    mean: Tensor,
    rstd: Tensor,
    dy: Tensor,
    dx: Tensor,
}

impl Io {
    fn wrap(
        gpu: &Gpu,
        ins: &[(&str, wgpu::Buffer)],
        [rows, hidden, out]: [u32; 3],
    ) -> Result<Io, Error> {
        let wrap = |name: &str, shape: &[u32]| -> Result<Tensor, Error> {
            let (_, b) = ins
                .iter()
                .find(|(n, _)| *n == name)
                .ok_or_else(|| Error::Readback(format!("bench input {name}")))?;
            Tensor::wrap(gpu, b, 0, shape, attn_dsl::Scalar::F32)
        };
        Ok(Io {
            x: wrap("x", &[rows, hidden])?,
            gamma: wrap("gamma", &[hidden])?,
            beta: wrap("beta", &[hidden])?,
            w: wrap("w", &[out, hidden])?,
            b: wrap("b", &[out])?,
            y: wrap("y", &[rows, out])?,
            mean: wrap("mean", &[rows])?,
            rstd: wrap("rstd", &[rows])?,
            dy: wrap("dy", &[rows, out])?,
            dx: wrap("dx", &[rows, hidden])?,
        })
    }

    fn args(&self) -> LayerNormArgs<'_> {
        LayerNormArgs {
            x: &self.x,
            gamma: &self.gamma,
            beta: &self.beta,
            w: &self.w,
            b: &self.b,
            eps: 1e-5,
        }
    }

    fn saved(&self) -> Saved<'_> {
        Saved {
            mean: &self.mean,
            rstd: &self.rstd,
        }
    }

    fn forward(&self) -> LayerNormCall<'_> {
        LayerNormCall::Forward {
            args: self.args(),
            y: &self.y,
            saved: self.saved(),
        }
    }
}

/// The forward as a user records it ([`LayerNormLinear::record`]: the fused kernel,
/// or the split one's LayerNorm pass, W's conversion and the matmul), on the bench's inputs.
fn time_forward(
    gpu: &Gpu,
    mut layer: LayerNormLinear,
    ins: &[(&str, wgpu::Buffer)],
    shape: [u32; 3],
    runs: usize,
) -> Result<Timing, Error> {
    let io = Io::wrap(gpu, ins, shape)?;
    let (t, ()) = timing::time_recorded(gpu, 2, runs, |enc| layer.record(gpu, enc, &io.forward()))?;
    Ok(t)
}

/// The backward as a user records it ([`LayerNormLinear::record`]: every kernel,
/// the reduce included) from the forward's statistics.
fn time_backward(
    gpu: &Gpu,
    mut layer: LayerNormLinear,
    ins: &[(&str, wgpu::Buffer)],
    [rows, hidden, out]: [u32; 3],
    runs: usize,
) -> Result<Timing, Error> {
    let io = Io::wrap(gpu, ins, [rows, hidden, out])?;
    let mut forward = layer.fresh();
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    forward.record(gpu, &mut encoder, &io.forward())?;
    gpu.queue.submit([encoder.finish()]);
    let f32 = attn_dsl::Scalar::F32;
    let grad = |shape: &[u32]| Tensor::zeros(gpu, shape, f32);
    let (dgamma, dbeta, dw, db) = (
        grad(&[hidden])?,
        grad(&[hidden])?,
        grad(&[out, hidden])?,
        grad(&[out])?,
    );
    let grads = LayerNormGrads {
        dx: &io.dx,
        dgamma: &dgamma,
        dbeta: &dbeta,
        dw: &dw,
        db: &db,
    };
    let (t, ()) = timing::time_recorded(gpu, 2, runs, |enc| {
        let call = LayerNormCall::Backward {
            args: io.args(),
            saved: io.saved(),
            dy: &io.dy,
            grads,
        };
        layer.record(gpu, enc, &call)
    })?;
    Ok(t)
}

/// The unfused baseline's forward and backward rows, on the fused rows' inputs (`ins`),
/// with the same FLOP and byte counts so that the columns compare time.
fn baseline(
    gpu: &Gpu,
    like: &attn_dsl::KernelAbi,
    ins: &[(&str, wgpu::Buffer)],
    (r, h, o): (usize, usize, usize),
    runs: usize,
) -> Result<Vec<LnBenchRow>, Error> {
    let base = Baseline::new(gpu, like)?;
    let input = |name: &str| {
        ins.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, b)| b)
            .ok_or_else(|| Error::Readback(format!("bench input {name}")))
    };
    let [x, gamma, beta, w, b, dy, y, mean, rstd, dx] = [
        "x", "gamma", "beta", "w", "b", "dy", "y", "mean", "rstd", "dx",
    ]
    .map(input);
    let (x, gamma, beta, w, b, dy, y) = (x?, gamma?, beta?, w?, b?, dy?, y?);
    let (mean, rstd, dx) = (mean?, rstd?, dx?);
    let scratch = |name: &str, len: usize| buffers::output::<f32>(gpu, name, len);
    let (xn, dxn, t) = (
        scratch("xn", r * h),
        scratch("dxn", r * h),
        scratch("t", r * h),
    );
    let (dw, db) = (scratch("dw", o * h), scratch("db", o));
    let (dgamma, dbeta) = (scratch("dgamma", h), scratch("dbeta", h));
    // A of the column sums: one 1.0 read at every (m, k) through zero strides.
    let ones = buffers::storage(gpu, "ones", &[1.0f32]);
    let (ru, hu, ou) = (r as u32, h as u32, o as u32);
    let shape = |s: Shape| buffers::uniform(gpu, "shape", bytemuck::bytes_of(&s));
    let rows_shape = Shape {
        m: ru,
        k: hu,
        ..Shape::default()
    };
    let mm = |m, n, k, (sam, sak), (sbk, sbn), bias| Shape {
        m,
        n,
        k,
        sam,
        sak,
        sbk,
        sbn,
        bias,
    };
    // y = x̂ₙ·Wᵀ + b; dx̂ₙ = dy·W; dW = dyᵀ·x̂ₙ; db, dβ, dγ = 1ᵀ·(dy, dx̂ₙ, t).
    let s_fwd = mm(ru, ou, hu, (hu, 1), (1, hu), 1);
    let s_dxn = mm(ru, hu, ou, (ou, 1), (hu, 1), 0);
    let s_dw = mm(ou, hu, ru, (1, ou), (hu, 1), 0);
    let s_db = mm(1, ou, ru, (0, 0), (ou, 1), 0);
    let s_dh = mm(1, hu, ru, (0, 0), (hu, 1), 0);
    let u = [rows_shape, s_fwd, s_dxn, s_dw, s_db, s_dh].map(shape);
    let matmul = |a, bm, bias, c, sh: &Shape, u| Step {
        kernel: &base.matmul,
        bound: vec![("a", a), ("b", bm), ("bias", bias), ("c", c), ("shape", u)],
        grid: matmul_grid(sh),
    };
    let ln_fwd = Step {
        kernel: &base.ln_forward,
        bound: vec![
            ("x", x),
            ("gamma", gamma),
            ("beta", beta),
            ("xn", &xn),
            ("mean", mean),
            ("rstd", rstd),
            ("shape", &u[0]),
        ],
        grid: [ru, 1, 1],
    };
    let ln_bwd = Step {
        kernel: &base.ln_backward,
        bound: vec![
            ("x", x),
            ("gamma", gamma),
            ("dxn", &dxn),
            ("mean", mean),
            ("rstd", rstd),
            ("dx", dx),
            ("t", &t),
            ("shape", &u[0]),
        ],
        grid: [ru, 1, 1],
    };
    let forward = [ln_fwd, matmul(&xn, w, b, y, &s_fwd, &u[1])];
    let backward = [
        matmul(dy, w, b, &dxn, &s_dxn, &u[2]),
        matmul(dy, &xn, b, &dw, &s_dw, &u[3]),
        ln_bwd,
        matmul(&ones, dy, b, &db, &s_db, &u[4]),
        matmul(&ones, &dxn, b, &dbeta, &s_dh, &u[5]),
        matmul(&ones, &t, b, &dgamma, &s_dh, &u[5]),
    ];
    let matmul_flops = 2.0 * (r * h * o) as f64;
    let io = |elements: usize| 4.0 * elements as f64;
    Ok(vec![
        LnBenchRow {
            label: "baseline: layernorm, matmul forward".into(),
            timing: timing::time(gpu, &forward, 2, runs)?,
            flops: matmul_flops,
            bytes: io(r * h + o * h + r * o + 2 * r),
            sums: None,
        },
        LnBenchRow {
            label: "baseline: matmuls, layernorm backward".into(),
            timing: timing::time(gpu, &backward, 2, runs)?,
            flops: 2.0 * matmul_flops,
            bytes: io(2 * r * h + o * h + r * o + 2 * r + o * h + o),
            sums: None,
        },
    ])
}

/// A Linear at `rows` rows as an engine's projection records it
/// ([`crate::ops::linear::Linear`]), W `[out, hidden]` held in `weights`, with a bias.
pub fn linear(
    gpu: &Gpu,
    [rows, hidden, out]: [u32; 3],
    weights: attn_dsl::Dtype,
    runs: usize,
) -> Result<Timing, Error> {
    use crate::ops::linear::{Linear, LinearArgs, LinearSpec};
    use crate::tensor::Tensor;
    use attn_dsl::Scalar;
    let spec = LinearSpec {
        bias: true,
        ..LinearSpec::new(hidden, out, weights)
    };
    let mut op = Linear::new(gpu, spec)?;
    let make = |shape: &[u32], scalar, seed| {
        let n = shape.iter().map(|d| *d as usize).product();
        Tensor::from_f32(gpu, shape, scalar, &random(n, seed))
    };
    let x = make(&[rows, hidden], Scalar::F32, 1)?;
    let w = make(&[out, hidden], Scalar::from(weights), 2)?;
    let b = make(&[out], Scalar::F32, 3)?;
    let y = Tensor::zeros(gpu, &[rows, out], Scalar::F32)?;
    let args = LinearArgs {
        x: &x,
        w: &w,
        b: Some(&b),
        y: &y,
    };
    let (t, ()) = timing::time_recorded(gpu, 2, runs, |enc| op.record(gpu, enc, &args))?;
    Ok(t)
}
