attn_macros::attention_kernel! {
    pub flex_renamed_parameter {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: 64,
        tensors: { prefix: [batch] u32 },
        mask_mod: |_b, _h, q, k| k <= q || k < prefix[b],
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
