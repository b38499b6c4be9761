//! The forward of host slices: checked, uploaded, run, read back (for tests, `check`,
//! `attn` and quick experiments; an engine records [`super::Forward`] on its own tensors).

use attn_dsl::{KernelAbi, Op, Scalar};

use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::error::{Error, InputError};
use crate::modifiers::Modifiers;
use crate::shape::{
    Heads, binding_size, element_bytes, expect_op, length, nonzero, validate_heads, validate_scale,
    validate_seg,
};
use crate::tensor::Tensor;

/// Inputs of the forward, laid out `[batch, seq, heads, head_dim]` (K and V with
/// `n_kv_heads`); a 3-D `[seq, heads, head_dim]` tensor is batch 1.
#[derive(Clone, Copy, Debug)]
pub struct ForwardInput<'a> {
    /// Sequences of `seq_len` rows each (the grid's third dimension).
    pub batch: u32,
    /// Rows of each sequence, queries and keys alike.
    pub seq_len: u32,
    /// Query and KV heads and their widths.
    pub heads: Heads,
    /// Queries, `[batch, seq, n_heads, head_dim]`.
    pub q: &'a [f32],
    /// Keys, `[batch, seq, n_kv_heads, head_dim]`.
    pub k: &'a [f32],
    /// Values, `[batch, seq, n_kv_heads, head_dim_v]`.
    pub v: &'a [f32],
    /// The start index of each row's document, `[batch, seq]`, counted within its sequence;
    /// `None` is one document per sequence. Only kernels built with the document mask take
    /// it. Packed variable-length sequences (FlashAttention's `cu_seqlens`) are documents:
    /// see [`crate::shape::seg_from_cu_seqlens`].
    pub seg: Option<&'a [u32]>,
    /// Defaults to `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// The values of the kernel's score modifiers (window, ALiBi, bias, soft cap, dropout).
    pub mods: Modifiers<'a>,
}

/// What the forward read back: the attention output and its log-sum-exp, which the
/// backward takes.
#[derive(Clone, Debug, PartialEq)]
pub struct ForwardOutput {
    /// `[batch, seq, n_heads, head_dim]`
    pub o: Vec<f32>,
    /// `[batch, seq, n_heads]`; `+inf` for a row with no visible key.
    pub lse: Vec<f32>,
}

/// O and LSE of host data: the input checked, uploaded, run through
/// [`crate::ops::forward::Forward`] and read back.
pub async fn forward(
    gpu: &Gpu,
    kernel: &Kernel,
    input: &ForwardInput<'_>,
) -> Result<ForwardOutput, Error> {
    let abi = kernel.abi();
    validate_forward(abi, gpu.limits(), input)?;
    let h = input.heads;
    let (b, s) = (input.batch, input.seq_len);
    // Half-precision kernels get the inputs rounded to their dtype; O comes back widened.
    let data = abi.scalar("o");
    let q_shape = [b, s, h.n_heads, h.head_dim];
    let kv_shape = [b, s, h.n_kv_heads, h.head_dim];
    let q = Tensor::from_f32(gpu, &q_shape, data, input.q)?;
    let k = Tensor::from_f32(gpu, &kv_shape, data, input.k)?;
    let v = Tensor::from_f32(gpu, &[b, s, h.n_kv_heads, h.head_dim_v], data, input.v)?;
    let o = Tensor::zeros(gpu, &[b, s, h.n_heads, h.head_dim_v], data)?;
    let lse = Tensor::zeros(gpu, &[b, s, h.n_heads], Scalar::F32)?;
    let seg = match input.seg {
        Some(seg) => Some(crate::ops::forward::documents(gpu, seg, b, s)?),
        None => None,
    };
    let mut uploaded = input.mods.upload(gpu, b, (s, s))?;
    crate::ops::block_mask::make_block_mask(gpu, &mut uploaded, h.n_heads, s)?;
    let flex = uploaded.flex_tensors();
    let args = crate::ops::forward::ForwardArgs {
        q: &q,
        k: &k,
        v: &v,
        o: &o,
        lse: &lse,
        seg: seg.as_ref(),
        scale: input.scale,
        mods: uploaded.view(&input.mods, &flex),
    };
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    crate::ops::forward::Forward::from_kernel(kernel)?.record(gpu, &mut encoder, &args)?;
    gpu.queue.submit([encoder.finish()]);
    Ok(ForwardOutput {
        o: o.to_f32(gpu).await?,
        lse: lse.to_f32(gpu).await?,
    })
}

/// The checks [`forward`] makes before it uploads anything: the kernel's op, the dims
/// against the kernel, the slices' lengths, the adapter's binding size, the scale, `seg`
/// and the modifiers.
pub fn validate_forward(
    abi: &KernelAbi,
    limits: &wgpu::Limits,
    input: &ForwardInput,
) -> Result<(), InputError> {
    expect_op(abi, Op::Forward)?;
    validate_sequence(abi, limits, input)
}

/// Dims, Q/K/V lengths, buffer sizes, scale and `seg` of a full-sequence op, against the
/// kernel that will run it.
pub(crate) fn validate_sequence(
    abi: &KernelAbi,
    limits: &wgpu::Limits,
    input: &ForwardInput,
) -> Result<(), InputError> {
    nonzero("batch", input.batch)?;
    nonzero("seq_len", input.seq_len)?;
    let h = input.heads;
    validate_heads(abi, h)?;
    let (s, nh, nkv, d) = (
        u64::from(input.batch) * u64::from(input.seq_len),
        h.n_heads as u64,
        h.n_kv_heads as u64,
        h.head_dim as u64,
    );
    length(
        "q",
        input.q.len(),
        s.saturating_mul(nh).saturating_mul(d),
        "batch × seq_len × n_heads × head_dim",
    )?;
    length(
        "k",
        input.k.len(),
        s.saturating_mul(nkv).saturating_mul(d),
        "batch × seq_len × n_kv_heads × head_dim",
    )?;
    let dv = u64::from(h.head_dim_v);
    length(
        "v",
        input.v.len(),
        s.saturating_mul(nkv).saturating_mul(dv),
        "batch × seq_len × n_kv_heads × head_dim_v",
    )?;
    binding_size(
        limits,
        s.saturating_mul(nh.max(nkv))
            .saturating_mul(d.max(dv))
            .saturating_mul(element_bytes(abi, "q")),
    )?;
    validate_scale(input.scale)?;
    input
        .mods
        .validate(abi, input.batch, (input.seq_len, input.seq_len), h.n_heads)?;
    if let Some(b) = input.mods.bias {
        binding_size(limits, b.values.len() as u64 * 4)?;
    }
    match input.seg {
        Some(_) if !abi.masks.document => Err(InputError::SegWithoutDocumentMask {
            kernel: abi.name.to_string(),
        }),
        Some(seg) => {
            length("seg", seg.len(), s, "batch × seq_len")?;
            seg.chunks(input.seq_len as usize)
                .enumerate()
                .try_for_each(|(b, rows)| {
                    validate_seg(rows).map_err(|e| match e {
                        InputError::Seg {
                            index,
                            value,
                            reason,
                        } => InputError::Seg {
                            index: b * input.seq_len as usize + index,
                            value,
                            reason,
                        },
                        other => other,
                    })
                })
        }
        None => Ok(()),
    }
}
