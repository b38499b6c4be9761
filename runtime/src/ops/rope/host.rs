//! RoPE of host slices: in place on a `[batch, seq, heads, head_dim]` tensor (Q with
//! `n_heads`, K with `n_kv_heads`), forward or backward as the kernel was built, uploaded,
//! run and read back ([`super::Rope`] records it on device tensors).

use attn_dsl::Op;

use attn_dsl::Scalar;

use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::error::{Error, InputError};
use crate::shape::{length, nonzero};
use crate::tensor::Tensor;

/// A tensor for [`rope`] to rotate, and the positions and frequencies it rotates by.
#[derive(Clone, Copy, Debug)]
pub struct RopeInput<'a> {
    /// Sequences of `seq_len` rows; row `s` of each is at position `s + pos_offset`.
    pub batch: u32,
    /// Rows of each sequence.
    pub seq_len: u32,
    /// Heads of `x`: `n_heads` for Q, `n_kv_heads` for K.
    pub heads: u32,
    /// Elements of each head's row, rotated in pairs.
    pub head_dim: u32,
    /// The tensor, `[batch, seq, heads, head_dim]`.
    pub x: &'a [f32],
    /// Position of row 0 (e.g. the KV cache length when rotating a new decode row).
    pub pos_offset: u32,
    /// The frequency base, 10000 in most models.
    pub base: f32,
}

/// `x` rotated (forward kernel) or rotated back (backward kernel): uploaded, rotated
/// through [`crate::ops::rope::Rope`] at positions `pos_offset + s`, read back.
pub async fn rope(gpu: &Gpu, kernel: &Kernel, input: &RopeInput<'_>) -> Result<Vec<f32>, Error> {
    validate(kernel, input)?;
    let shape = [input.batch, input.seq_len, input.heads, input.head_dim];
    let x = Tensor::from_f32(gpu, &shape, Scalar::F32, input.x)?;
    let positions = Tensor::from_u32(
        gpu,
        &[input.batch],
        &vec![input.pos_offset; input.batch as usize],
    )?;
    let args = crate::ops::rope::RopeArgs {
        x: &x,
        positions: &positions,
        base: input.base,
    };
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    crate::ops::rope::Rope::from_kernel(kernel)?.record(gpu, &mut encoder, &args)?;
    gpu.queue.submit([encoder.finish()]);
    x.to_f32(gpu).await
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
    let expected =
        crate::tensor::elements(&[input.batch, input.seq_len, input.heads, input.head_dim]);
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
