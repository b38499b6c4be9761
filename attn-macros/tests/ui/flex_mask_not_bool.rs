attn_macros::attention_kernel! {
    pub flex_mask_not_bool {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: 64,
        mask_mod: |b, h, q, k| q - k,
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
