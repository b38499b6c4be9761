attn_macros::attention_kernel! {
    pub flex_index_out_of_range {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: 64,
        tensors: { tbl: [heads, 8] f32 },
        score_mod: |score, b, h, q, k| score + tbl[h][8],
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
