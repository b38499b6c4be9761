//! Ops that record into the caller's command encoder, reading and writing device
//! [`Tensor`]s: the forward, the backward in every schedule, decode against a device KV
//! cache, RoPE, LayerNorm + Linear, attention states merged and partial gradients summed.
//! Each op owns its pipelines (compiled on the first call that needs them), its bind
//! groups and its scratch, so a steady-state call creates nothing, submits nothing and
//! reads nothing back.

pub mod backward;
pub mod block_mask;
pub mod cache;
pub mod cascade;
pub mod convert;
pub mod decode;
pub mod extend;
pub mod forward;
pub mod layernorm;
pub mod linear;
pub mod merge;
pub mod rope;
pub(crate) mod row_max;
pub mod sum;

use attn_dsl::{KernelAbi, KernelSpec, Scalar};

use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::dispatch::record::Pipeline;
use crate::error::{Error, InputError};
use crate::modifiers::expect;
use crate::shape::Heads;
use crate::tensor::{Tensor, TensorError, elements};

/// Batch, sequence length and heads of an attention problem, read off Q `[batch, seq,
/// n_heads, head_dim]` and K `[batch, seq, n_kv_heads, head_dim]`.
/// `head_dim_v` is V's last dim: checking V against it is the kernel's check.
pub(crate) fn attention_shape(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
) -> Result<(u32, u32, Heads), InputError> {
    let [batch, seq, n_heads, head_dim] = rank4(q, "q", "[batch, seq, n_heads, head_dim]")?;
    let [_, _, n_kv_heads, _] = rank4(k, "k", "[batch, seq, n_kv_heads, head_dim]")?;
    let [.., head_dim_v] = rank4(v, "v", "[batch, seq, n_kv_heads, head_dim_v]")?;
    for (name, value) in [
        ("batch", batch),
        ("seq_len", seq),
        ("n_heads", n_heads),
        ("n_kv_heads", n_kv_heads),
        ("head_dim", head_dim),
        ("head_dim_v", head_dim_v),
    ] {
        crate::shape::nonzero(name, value)?;
    }
    let heads = Heads {
        n_heads,
        n_kv_heads,
        head_dim,
        head_dim_v,
    };
    Ok((batch, seq, heads))
}

/// The four dims of a rank-4 tensor.
pub(crate) fn rank4(t: &Tensor, name: &str, layout: &'static str) -> Result<[u32; 4], TensorError> {
    rank(t, name, layout)
}

/// The `N` dims of a rank-`N` tensor, refused naming it and its layout otherwise.
pub(crate) fn rank<const N: usize>(
    t: &Tensor,
    name: &str,
    layout: &'static str,
) -> Result<[u32; N], TensorError> {
    <[u32; N]>::try_from(t.shape()).map_err(|_| TensorError::Rank {
        name: name.into(),
        got: t.shape().to_vec(),
        rank: N,
        layout,
    })
}

/// Each of `tensors` with its shape, in the element type its binding in `abi` has (f32
/// where the kernel has no such binding).
pub(crate) fn expect_all(
    abi: &KernelAbi,
    tensors: &[(&str, &Tensor, Vec<u32>, &'static str)],
) -> Result<(), TensorError> {
    for (name, t, shape, layout) in tensors {
        let scalar = abi.binding(name).map_or(Scalar::F32, |b| b.scalar);
        expect(t, name, shape, scalar, layout)?;
    }
    Ok(())
}

/// The workgroups of `abi` for dims given by field name.
pub(crate) fn grid(abi: &KernelAbi, dims: &[(&str, u32)]) -> [u32; 3] {
    let ordered: Vec<u32> = abi
        .binding("dims")
        .map(|b| {
            b.fields
                .iter()
                .map(|f| {
                    dims.iter()
                        .find(|(n, _)| *n == f.as_ref())
                        .map_or(0, |(_, v)| *v)
                })
                .collect()
        })
        .unwrap_or_default();
    abi.dispatch_grid(&ordered)
}

/// A scratch tensor of `shape` in `held`, reallocated only when it must grow.
pub(crate) fn scratch(
    held: &mut Option<Tensor>,
    gpu: &Gpu,
    shape: &[u32],
    scalar: Scalar,
) -> Result<Tensor, Error> {
    let n = elements(shape);
    if held.as_ref().is_none_or(|t| t.len() < n) {
        *held = None; // free the old buffer before allocating the new one
        let len = u32::try_from(n).map_err(|_| TensorError::TooLarge {
            name: "scratch".into(),
            bytes: 4 * n,
            limit: gpu.limits().max_storage_buffer_binding_size,
        })?;
        *held = Some(Tensor::zeros(gpu, &[len], scalar)?);
    }
    held.as_ref().expect("made above").view(shape)
}

/// The `seg` of `batch` whole sequences of `seq` rows (one document each) in `held`,
/// uploaded again only when the shape changes: an upload per call would cost a buffer and a
/// bind group per step.
pub(crate) fn whole_sequences(
    held: &mut Option<Tensor>,
    gpu: &Gpu,
    batch: u32,
    seq: u32,
) -> Result<Tensor, Error> {
    let shape = [2, batch, seq];
    if held.as_ref().is_none_or(|w| w.shape() != shape) {
        let ends = crate::shape::seg_with_ends(None, batch, seq).ok_or(InputError::OverLimit {
            what: "rows of a seg (batch × seq)",
            value: u64::from(batch) * u64::from(seq),
            limit: usize::MAX as u64,
        })?;
        *held = Some(Tensor::from_u32(gpu, &shape, &ends)?);
    }
    Ok(held.clone().expect("made above"))
}

/// The pipeline `held`, compiled from `spec` on first use.
pub(crate) fn helper<'p>(
    gpu: &Gpu,
    held: &'p mut Option<Pipeline>,
    spec: KernelSpec,
) -> Result<&'p mut Pipeline, Error> {
    if held.is_none() {
        let abi = attn_dsl::compile(&spec).map_err(|e| Error::Pipeline {
            kernel: spec.name.clone(),
            message: e.to_string(),
        })?;
        *held = Some(Pipeline::new(Kernel::now(gpu, &abi)?));
    }
    Ok(held.as_mut().expect("made above"))
}

/// `held`, replaced by a zeroed tensor of at least `shape`'s elements where it is shorter,
/// viewed as `shape`.
pub(crate) fn grow(
    gpu: &Gpu,
    held: &mut Option<Tensor>,
    shape: &[u32],
    scalar: Scalar,
) -> Result<Tensor, Error> {
    if held.as_ref().is_none_or(|t| t.len() < elements(shape)) {
        *held = Some(Tensor::zeros(gpu, &[elements(shape) as u32], scalar)?);
    }
    held.as_ref().expect("grown above").view(shape)
}

/// A cache's geometry as its kernels' dims name it, from its K tensor and block table:
/// (capacity, 0, 0) for a contiguous cache `[slots, capacity, ..]`, (page_size ·
/// pages_per_seq, page_size, pages_per_seq) for a paged one `[n_pages, page_size, ..]`: a
/// slot's positions either way, over which a modifier's `seq` tensors and a block mask
/// are read.
pub(crate) fn cache_geometry(k: &Tensor, block_table: Option<&Tensor>) -> (u32, u32, u32) {
    match block_table {
        None => (k.shape()[1], 0, 0),
        Some(t) => {
            let (page_size, pages_per_seq) = (k.shape()[1], t.shape()[1]);
            (
                page_size.saturating_mul(pages_per_seq),
                page_size,
                pages_per_seq,
            )
        }
    }
}
