attn_macros::attention_kernel! {
    /// Half precision reaches the backward on flash grids only.
    pub bq {
        op: backward_q,
        grid: s_major(tile = 16),
        head_dim: 64,
        dtype: f16,
        writes: { dq: owned },
    }
}

fn main() {}
