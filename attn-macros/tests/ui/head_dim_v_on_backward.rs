// Rows of two widths (head_dim_v) reach the per-row backward grids, not yet the flash ones.
attn_macros::attention_kernel! {
    pub backward_mla {
        op: backward_q,
        grid: s_major(flash),
        head_dim: 192,
        head_dim_v: 128,
        masks: [causal],
        writes: { dq: owned },
    }
}

fn main() {}
