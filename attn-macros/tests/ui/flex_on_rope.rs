attn_macros::attention_kernel! {
    pub flex_on_rope {
        op: rope,
        grid: s_major(tile = 1),
        head_dim: 64,
        mask_mod: |b, h, q, k| k <= q,
        writes: { x: owned },
    }
}

fn main() {}
