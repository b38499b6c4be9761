attn_macros::attention_kernel! {
    pub flex_tensor_type {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: 64,
        tensors: { offsets: [batch] i32 },
        mask_mod: |b, h, q, k| k < offsets[b],
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
