// Rows of two widths (head_dim_v) reach the forward's schedules only, so far.
attn_macros::attention_kernel! {
    pub backward_mla {
        op: backward_q,
        grid: s_major(tile = 1),
        head_dim: 192,
        head_dim_v: 128,
        masks: [causal],
        writes: { dq: owned },
    }
}

fn main() {}
