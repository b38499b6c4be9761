// A forward with the document mask binds 6 storage buffers (q, k, v, o, lse, seg).
attn_macros::attention_kernel! {
    pub fwd {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: 64,
        masks: [causal, document],
        target: native(storage_buffers = 4),
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
