//! Ops that record into the caller's command encoder, reading and writing device
//! [`Tensor`]s: the forward, the backward in every schedule, decode against a device KV
//! cache, RoPE, and LayerNorm + Linear. Each op owns its pipelines (compiled on the first
//! call that needs them), its bind groups and its scratch, so a steady-state call creates
//! nothing, submits nothing and reads nothing back.

pub mod backward;
pub mod cache;
pub mod convert;
pub mod decode;
pub mod forward;
pub mod layernorm;
pub mod rope;

use attn_dsl::{KernelAbi, Scalar};

use crate::error::InputError;
use crate::modifiers::expect;
use crate::shape::Heads;
use crate::tensor::{Tensor, TensorError};

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
    <[u32; 4]>::try_from(t.shape()).map_err(|_| TensorError::Rank {
        name: name.into(),
        got: t.shape().to_vec(),
        rank: 4,
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
