attn_macros::attention_kernel! {
    pub flex_unknown_function {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: 64,
        score_mod: |score, b, h, q, k| score + sin(q as f32),
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
