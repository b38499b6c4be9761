//! A user's crate: kernels specialized for a model with head_dim 128 and 8 query heads
//! sharing 2 KV heads, compiled (and naga-validated) by `attention_kernel!` at build time
//! and dispatched through the runtime.

use attn_macros::attention_kernel;
use runtime::BlockOn;
use runtime::{DecodeInput, ForwardInput, ForwardOutput, Gpu, Heads, Kernel};

attention_kernel! {
    /// Causal forward for 8 heads over 2 KV heads (GQA ratio fixed at 4), head_dim 128,
    /// two query rows per workgroup.
    pub forward_h8_kv2_d128 {
        op: forward,
        grid: s_major(tile = 2),
        head_dim: 128,
        gqa: 4,
        masks: [causal],
        target: webgpu,
        writes: { o: owned, lse: owned },
    }
}

attention_kernel! {
    /// Decode for the same model.
    pub decode_h8_kv2_d128 {
        op: decode,
        grid: head_major,
        head_dim: 128,
        gqa: 4,
        writes: { o: owned },
    }
}

pub const HEADS: Heads = Heads {
    n_heads: 8,
    n_kv_heads: 2,
    head_dim: 128,
    head_dim_v: 128,
};

/// The model's two kernels on one device.
pub struct Model {
    pub gpu: Gpu,
    forward: Kernel,
    decode: Kernel,
}

impl Model {
    pub fn new() -> Result<Model, runtime::Error> {
        let abis = [&forward_h8_kv2_d128::ABI, &decode_h8_kv2_d128::ABI];
        let gpu = Gpu::new(abis).block_on()?;
        let forward = Kernel::new(&gpu, &forward_h8_kv2_d128::ABI).block_on()?;
        let decode = Kernel::new(&gpu, &decode_h8_kv2_d128::ABI).block_on()?;
        Ok(Model {
            gpu,
            forward,
            decode,
        })
    }

    /// Causal attention over `seq` rows laid out `[seq, heads, 128]`.
    pub fn forward(
        &self,
        seq: u32,
        q: &[f32],
        k: &[f32],
        v: &[f32],
    ) -> Result<ForwardOutput, runtime::Error> {
        let input = ForwardInput {
            batch: 1,
            seq_len: seq,
            heads: HEADS,
            q,
            k,
            v,
            seg: None,
            scale: None,
            mods: Default::default(),
        };
        runtime::forward(&self.gpu, &self.forward, &input).block_on()
    }

    /// One new query row against the first `cache_len` rows of the cache.
    pub fn decode(
        &self,
        cache_len: u32,
        q: &[f32],
        k_cache: &[f32],
        v_cache: &[f32],
    ) -> Result<Vec<f32>, runtime::Error> {
        let input = DecodeInput {
            batch: 1,
            cache_len,
            heads: HEADS,
            q,
            k_cache,
            v_cache,
            scale: None,
            mods: Default::default(),
        };
        runtime::decode(&self.gpu, &self.decode, &input).block_on()
    }
}
