//! What `bench` measures: the forward and every backward schedule on one shape, GPU-timed,
//! with FLOPs by FlashAttention's convention (forward 4·S²·H·D, halved when causal;
//! backward 2.5× forward).

use attn_dsl::{KernelSpec, Masks, Op, Scatter};

use crate::attention::{Heads, checked_grid, uniforms};
use crate::backward::Schedule;
use crate::buffers;
use crate::cases::random;
use crate::error::Error;
use crate::gpu::Gpu;
use crate::kernel::Kernel;
use crate::kernels::BackwardKernels;
use crate::timing::{self, Step, Timing};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BenchShape {
    pub seq: u32,
    pub heads: Heads,
    pub causal: bool,
}

impl BenchShape {
    pub fn forward_flops(&self) -> f64 {
        let h = self.heads;
        let full = 4.0 * f64::from(self.seq).powi(2) * f64::from(h.n_heads) * f64::from(h.head_dim);
        if self.causal { full / 2.0 } else { full }
    }

    pub fn label(&self) -> String {
        let h = self.heads;
        format!(
            "seq={} h={} kv={} d={}{}",
            self.seq,
            h.n_heads,
            h.n_kv_heads,
            h.head_dim,
            if self.causal { " causal" } else { "" }
        )
    }
}

pub struct BenchRow {
    pub shape: BenchShape,
    pub kernel: String,
    /// `None` when the configuration could not run here, with the reason in `note`.
    pub timing: Option<Timing>,
    pub flops: f64,
    pub note: String,
}

impl BenchRow {
    pub fn tflops(&self) -> Option<f64> {
        self.timing
            .map(|t| self.flops / (t.median_ms * 1e-3) / 1e12)
    }
}

/// Times the forward and each backward schedule the device runs on `shape`, with kernels
/// specialized for it now (so any head_dim works).
pub fn run(
    gpu: &Gpu,
    shape: BenchShape,
    warmup: usize,
    runs: usize,
) -> Result<Vec<BenchRow>, Error> {
    let h = shape.heads;
    let masks = Masks {
        causal: shape.causal,
        document: false,
    };
    let compile = |spec: &KernelSpec| {
        attn_dsl::compile(spec).map_err(|e| Error::Pipeline {
            kernel: spec.name.clone(),
            message: e.to_string(),
        })
    };
    let forward = Kernel::new(
        gpu,
        &compile(&KernelSpec::standard(
            "attention_forward",
            Op::Forward,
            h.head_dim,
            masks,
        ))?,
    )?;
    let set = BackwardKernels::compile(h.head_dim, masks).map_err(|e| Error::Pipeline {
        kernel: "backward".into(),
        message: e.to_string(),
    })?;
    let (s, nh, nkv, d) = (
        shape.seq as usize,
        h.n_heads as usize,
        h.n_kv_heads as usize,
        h.head_dim as usize,
    );
    let (q_len, kv_len) = (s * nh * d, s * nkv * d);
    let data = [
        ("q", q_len, 1),
        ("k", kv_len, 2),
        ("v", kv_len, 3),
        ("d_o", q_len, 4),
    ];
    let inputs: Vec<(&str, wgpu::Buffer)> = data
        .iter()
        .map(|(n, len, seed)| (*n, buffers::storage(gpu, n, &random(*len, *seed))))
        .collect();
    let outputs: Vec<(&str, wgpu::Buffer)> = [
        ("o", q_len),
        ("lse", s * nh),
        ("stats", 2 * s * nh),
        ("dq", q_len),
        ("dk", kv_len),
        ("dv", kv_len),
        ("dkv", 2 * kv_len),
    ]
    .into_iter()
    .map(|(n, len)| (n, buffers::output::<f32>(gpu, n, len)))
    .collect();
    let dims = [shape.seq, h.n_heads, h.n_kv_heads, h.head_dim];
    let (dims_buf, params_buf) =
        uniforms(gpu, forward.abi(), &dims, &[("scale", h.default_scale())])?;
    let scratch_bytes = Schedule::Split.scratch_bytes(shape.seq, h.n_heads);
    let scratch = (scratch_bytes <= gpu.limits().max_storage_buffer_binding_size)
        .then(|| buffers::output::<f32>(gpu, "p_ds", (scratch_bytes / 4) as usize));
    let mut bound: Vec<(&str, &wgpu::Buffer)> = inputs
        .iter()
        .chain(&outputs)
        .map(|(n, b)| (*n, b))
        .collect();
    bound.extend([("dims", &dims_buf), ("params", &params_buf)]);
    bound.extend(scratch.as_ref().map(|b| ("p_ds", b)));
    let step = |kernel| -> Result<Step, Error> {
        Ok(Step {
            kernel,
            bound: bound.clone(),
            grid: checked_grid(kernel.abi(), gpu.limits(), &dims)?,
        })
    };

    let mut rows = Vec::new();
    let timing = timing::time(gpu, &[step(&forward)?], warmup, runs)?;
    rows.push(BenchRow {
        shape,
        kernel: "forward".into(),
        timing: Some(timing),
        flops: shape.forward_flops(),
        note: String::new(),
    });
    let compiled: Vec<(Schedule, Vec<Kernel>)> = backward_kernels(gpu, &set)?;
    let prep = Kernel::new(gpu, &set.prep)?;
    for (schedule, kernels) in &compiled {
        let flops = 2.5 * shape.forward_flops();
        let kernel = format!("backward {schedule}");
        if *schedule == Schedule::Split && scratch.is_none() {
            let note = format!("scratch {scratch_bytes} B over the adapter's largest binding");
            rows.push(BenchRow {
                shape,
                kernel,
                timing: None,
                flops,
                note,
            });
            continue;
        }
        let steps = std::iter::once(&prep)
            .chain(kernels)
            .map(step)
            .collect::<Result<Vec<_>, _>>()?;
        let timing = timing::time(gpu, &steps, warmup, runs)?;
        rows.push(BenchRow {
            shape,
            kernel,
            timing: Some(timing),
            flops,
            note: String::new(),
        });
    }
    Ok(rows)
}

/// The schedules this device runs, each with its kernels in dispatch order (after prep).
fn backward_kernels(
    gpu: &Gpu,
    set: &BackwardKernels,
) -> Result<Vec<(Schedule, Vec<Kernel>)>, Error> {
    let mut out = vec![
        (
            Schedule::Split,
            vec![
                Kernel::new(gpu, &set.split_q)?,
                Kernel::new(gpu, &set.split_kv)?,
            ],
        ),
        (
            Schedule::Streaming(Scatter::Cas),
            vec![Kernel::new(gpu, &set.streaming)?],
        ),
    ];
    if gpu.has_f32_atomics() {
        out.push((
            Schedule::Streaming(Scatter::F32Atomic),
            vec![Kernel::new(gpu, &set.streaming_f32_atomic)?],
        ));
    }
    out.push((
        Schedule::RecomputeSplit,
        vec![
            Kernel::new(gpu, &set.recompute_q)?,
            Kernel::new(gpu, &set.recompute_kv)?,
        ],
    ));
    Ok(out)
}
