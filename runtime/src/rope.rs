//! RoPE on the GPU: in place on a `[batch, seq, heads, head_dim]` tensor (Q with `n_heads`,
//! K with `n_kv_heads`), forward or backward as the kernel was built.

use attn_dsl::Op;

use crate::attention::{checked_grid, length, nonzero, submit, uniform_dims};
use crate::buffers;
use crate::error::{Error, InputError};
use crate::gpu::Gpu;
use crate::kernel::Kernel;

#[derive(Clone, Copy, Debug)]
pub struct RopeInput<'a> {
    /// Sequences of `seq_len` rows; row `s` of each is at position `s + pos_offset`.
    pub batch: u32,
    pub seq_len: u32,
    /// Heads of `x`: `n_heads` for Q, `n_kv_heads` for K.
    pub heads: u32,
    pub head_dim: u32,
    pub x: &'a [f32],
    /// Position of row 0 (e.g. the KV cache length when rotating a new decode row).
    pub pos_offset: u32,
    /// The frequency base, 10000 in most models.
    pub base: f32,
}

/// `x` rotated (forward kernel) or rotated back (backward kernel).
#[cfg(not(target_arch = "wasm32"))]
pub fn rope(gpu: &Gpu, kernel: &Kernel, input: &RopeInput) -> Result<Vec<f32>, Error> {
    pollster::block_on(rope_async(gpu, kernel, input))
}

/// [`rope`] for an async caller (the browser).
pub async fn rope_async(
    gpu: &Gpu,
    kernel: &Kernel,
    input: &RopeInput<'_>,
) -> Result<Vec<f32>, Error> {
    let abi = kernel.abi();
    validate(kernel, input)?;
    let dims = [
        ("seq_len", input.seq_len),
        ("n_heads", input.heads),
        ("pos_offset", input.pos_offset),
        ("head_dim", input.head_dim),
        ("batch", input.batch),
    ];
    let grid = checked_grid(abi, gpu.limits(), &dims)?;
    let x = buffers::storage(gpu, "x", input.x);
    let inv_freq = buffers::storage(gpu, "inv_freq", &inv_freq(input.base, input.head_dim));
    let dims_buf = uniform_dims(gpu, abi, &dims)?;
    submit(
        gpu,
        kernel,
        &[("x", &x), ("inv_freq", &inv_freq), ("dims", &dims_buf)],
        grid,
    )?;
    buffers::read_async(gpu, &x, input.x.len()).await
}

/// `base^(-2i/head_dim)` for each pair, in f64.
pub fn inv_freq_exact(base: f32, head_dim: u32) -> Vec<f64> {
    (0..head_dim / 2)
        .map(|i| f64::from(base).powf(-2.0 * f64::from(i) / f64::from(head_dim)))
        .collect()
}

/// [`inv_freq_exact`] rounded once to f32: the table the kernel reads.
pub fn inv_freq(base: f32, head_dim: u32) -> Vec<f32> {
    inv_freq_exact(base, head_dim)
        .iter()
        .map(|x| *x as f32)
        .collect()
}

fn validate(kernel: &Kernel, input: &RopeInput) -> Result<(), InputError> {
    let abi = kernel.abi();
    if !matches!(abi.op, Op::Rope | Op::RopeBackward) {
        return Err(InputError::WrongOp {
            kernel: abi.name.to_string(),
            actual: abi.op.name(),
            wanted: "rope",
        });
    }
    nonzero("batch", input.batch)?;
    nonzero("seq_len", input.seq_len)?;
    nonzero("heads", input.heads)?;
    if input.head_dim != abi.head_dim {
        return Err(InputError::HeadDim {
            kernel: abi.name.to_string(),
            kernel_head_dim: abi.head_dim,
            given: input.head_dim,
        });
    }
    let expected = u64::from(input.batch)
        * u64::from(input.seq_len)
        * u64::from(input.heads)
        * u64::from(input.head_dim);
    length(
        "x",
        input.x.len(),
        expected,
        "batch × seq_len × heads × head_dim",
    )?;
    if !(input.base.is_finite() && input.base > 0.0) {
        return Err(InputError::Scale(input.base));
    }
    Ok(())
}
