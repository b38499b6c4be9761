attn_macros::attention_kernel! {
    pub flex_tensor_rank {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: 64,
        tensors: { rel_bias: [heads, 63] f32 },
        score_mod: |score, b, h, q, k| score + rel_bias[h],
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
