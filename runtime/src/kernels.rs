//! The default kernel family, described once with `attention_kernel!`. The WGSL of each is
//! written to `generated/` and its expansion is snapshot-tested in `snapshots/`.

use attn_macros::attention_kernel;

attention_kernel! {
    /// Causal forward with document masking, head_dim 64: the seeds' production layer.
    pub attention_forward {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: 64,
        gqa: any,
        masks: [causal, document],
        target: webgpu,
        workgroup_size: 256,
        writes: { o: owned, lse: owned },
    }
}

attention_kernel! {
    /// The same forward specialized for head_dim 128.
    pub attention_forward_d128 {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: 128,
        gqa: any,
        masks: [causal, document],
        target: webgpu,
        workgroup_size: 256,
        writes: { o: owned, lse: owned },
    }
}

attention_kernel! {
    /// One query row per head against a KV cache, head_dim 64.
    pub attention_decode {
        op: decode,
        grid: head_major,
        head_dim: 64,
        gqa: any,
        target: webgpu,
        workgroup_size: 256,
        writes: { o: owned },
    }
}

attention_kernel! {
    /// Decode specialized for head_dim 128.
    pub attention_decode_d128 {
        op: decode,
        grid: head_major,
        head_dim: 128,
        gqa: any,
        target: webgpu,
        workgroup_size: 256,
        writes: { o: owned },
    }
}

/// Every kernel of the default family, in the order `generated/manifest.json` lists them.
pub static FAMILY: [&attn_dsl::KernelAbi; 4] = [
    &attention_forward::ABI,
    &attention_forward_d128::ABI,
    &attention_decode::ABI,
    &attention_decode_d128::ABI,
];
