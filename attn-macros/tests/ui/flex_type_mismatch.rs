attn_macros::attention_kernel! {
    pub flex_type_mismatch {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: 64,
        score_mod: |score, b, h, q, k| score - (q - k),
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
