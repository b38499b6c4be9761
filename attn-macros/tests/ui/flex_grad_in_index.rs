attn_macros::attention_kernel! {
    pub flex_grad_in_index {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: 64,
        tensors: { table: [heads, 8] f32 grad },
        score_mod: |score, _b, h, _q, _k| score + table[h][table[h][0] as i32],
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
