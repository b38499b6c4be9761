// On tensor cores the narrower row must end at a whole 16-column fragment.
attn_macros::attention_kernel! {
    pub forward_mla {
        op: forward,
        grid: s_major(tile = 64, key_tile = 32, rows_per_thread = 16, matrix = coop16),
        head_dim: 192,
        head_dim_v: 120,
        masks: [causal],
        dtype: f16,
        workgroup_size: 128,
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
