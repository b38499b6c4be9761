//! The forward and the backward with V and O rows of another width than Q and K:
//! MLA's 192/128 beside the same problem at one width (Q, K and V all at head_dim,
//! and all at head_dim_v), through the recording API with the planner's kernels in each
//! dtype.

use attn_dsl::{Dtype, Masks, Scalar};

use crate::device::Gpu;
use crate::error::Error;
use crate::ops::backward::Backward;
use crate::ops::backward::BackwardArgs;
use crate::ops::backward::BackwardSpec;
use crate::ops::forward::{Forward, ForwardArgs, ForwardSpec};
use crate::shape::Heads;
use crate::tensor::Tensor;
use crate::timing;

/// One forward or backward timed: its widths, dtype, median GPU time and FLOP rate.
pub struct WidthRow {
    pub heads: Heads,
    pub dtype: Dtype,
    /// The planner's configuration (forward) or schedule (backward).
    pub config: String,
    pub ms: f64,
    pub tflops: f64,
}

/// FlashAttention's count for rows of two widths: `2·S²·H·(head_dim + head_dim_v)`,
/// halved when causal.
pub fn flops(h: Heads, seq: u32, causal: bool) -> f64 {
    let pairs = f64::from(seq).powi(2) * if causal { 0.5 } else { 1.0 };
    2.0 * pairs * f64::from(h.n_heads) * f64::from(h.head_dim + h.head_dim_v)
}

/// A forward or backward timer: `(gpu, heads, seq, (causal, dtype), (warmup, runs))`.
pub type Timer = fn(&Gpu, Heads, u32, (bool, Dtype), (usize, usize)) -> Result<WidthRow, Error>;

/// Random rows `[1, seq, heads, width]` in `dtype`, from `seed`.
fn rows(
    gpu: &Gpu,
    seq: u32,
    (heads, width): (u32, u32),
    dtype: Dtype,
    seed: u64,
) -> Result<Tensor, Error> {
    let shape = [1, seq, heads, width];
    let n = shape.iter().map(|&d| d as usize).product();
    let data = crate::verify::random(n, seed);
    Tensor::from_f32(gpu, &shape, Scalar::from(dtype), &data)
}

/// The forward of `h` at `seq` (batch 1) in `dtype`, causal or not.
pub fn forward(
    gpu: &Gpu,
    h: Heads,
    seq: u32,
    (causal, dtype): (bool, Dtype),
    (warmup, runs): (usize, usize),
) -> Result<WidthRow, Error> {
    let scalar = Scalar::from(dtype);
    let q = rows(gpu, seq, (h.n_heads, h.head_dim), dtype, 1)?;
    let k = rows(gpu, seq, (h.n_kv_heads, h.head_dim), dtype, 2)?;
    let v = rows(gpu, seq, (h.n_kv_heads, h.head_dim_v), dtype, 3)?;
    let o = Tensor::zeros(gpu, &[1, seq, h.n_heads, h.head_dim_v], scalar)?;
    let lse = Tensor::zeros(gpu, &[1, seq, h.n_heads], Scalar::F32)?;
    let spec = ForwardSpec {
        head_dim: h.head_dim,
        head_dim_v: h.head_dim_v,
        masks: Masks::new(causal, false),
        dtype,
    };
    let config = crate::plan::tuning::Table::for_gpu(gpu)?
        .forward_for(gpu, h, (1, seq), dtype)
        .map_or("per row".into(), |c| c.label());
    let mut forward = Forward::new(gpu, spec)?;
    let args = ForwardArgs::new(&q, &k, &v, &o, &lse);
    let (t, ()) = timing::time_recorded(gpu, warmup, runs, |enc| forward.record(gpu, enc, &args))?;
    Ok(WidthRow {
        heads: h,
        dtype,
        config,
        ms: t.median_ms,
        tflops: flops(h, seq, causal) / (t.median_ms * 1e-3) / 1e12,
    })
}

/// FlashAttention's count for the backward's five products: S = Q·Kᵀ, dQ = dS·K and
/// dK = dSᵀ·Q over head_dim, dP = dO·Vᵀ and dV = Pᵀ·dO over head_dim_v; halved when causal.
pub fn backward_flops(h: Heads, seq: u32, causal: bool) -> f64 {
    let pairs = f64::from(seq).powi(2) * if causal { 0.5 } else { 1.0 };
    2.0 * pairs * f64::from(h.n_heads) * f64::from(3 * h.head_dim + 2 * h.head_dim_v)
}

/// The backward of `h` at `seq` (batch 1) in `dtype`, causal or not, in the planner's
/// schedule, gradients overwritten each run.
pub fn backward(
    gpu: &Gpu,
    h: Heads,
    seq: u32,
    (causal, dtype): (bool, Dtype),
    (warmup, runs): (usize, usize),
) -> Result<WidthRow, Error> {
    let q = rows(gpu, seq, (h.n_heads, h.head_dim), dtype, 1)?;
    let k = rows(gpu, seq, (h.n_kv_heads, h.head_dim), dtype, 2)?;
    let v = rows(gpu, seq, (h.n_kv_heads, h.head_dim_v), dtype, 3)?;
    let o = rows(gpu, seq, (h.n_heads, h.head_dim_v), dtype, 4)?;
    let d_o = rows(gpu, seq, (h.n_heads, h.head_dim_v), dtype, 5)?;
    let lse = Tensor::from_f32(
        gpu,
        &[1, seq, h.n_heads],
        Scalar::F32,
        &vec![8.0; (seq * h.n_heads) as usize],
    )?;
    let f32 = Scalar::F32;
    let dq = Tensor::zeros(gpu, &[1, seq, h.n_heads, h.head_dim], f32)?;
    let dk = Tensor::zeros(gpu, &[1, seq, h.n_kv_heads, h.head_dim], f32)?;
    let dv = Tensor::zeros(gpu, &[1, seq, h.n_kv_heads, h.head_dim_v], f32)?;
    let masks = Masks::new(causal, false);
    let spec = BackwardSpec::new(h.head_dim, masks, dtype).with_head_dim_v(h.head_dim_v);
    let mut backward = Backward::new(gpu, spec)?;
    let args = BackwardArgs {
        q: &q,
        k: &k,
        v: &v,
        o: &o,
        lse: &lse,
        d_o: &d_o,
        dq: &dq,
        dk: &dk,
        dv: &dv,
        dbias: None,
        dsinks: None,
        flex_grads: &[],
        seg: None,
        scale: None,
        mods: Default::default(),
        accumulate: false,
    };
    let (t, schedule) = timing::time_recorded(gpu, warmup, runs, |enc| {
        backward.record(gpu, enc, &args, None)
    })?;
    Ok(WidthRow {
        heads: h,
        dtype,
        config: schedule.to_string(),
        ms: t.median_ms,
        tflops: backward_flops(h, seq, causal) / (t.median_ms * 1e-3) / 1e12,
    })
}
