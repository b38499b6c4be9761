attn_macros::attention_kernel! {
    /// Half precision is emitted for the forward only so far.
    pub dq {
        op: backward_q,
        grid: s_major(flash),
        head_dim: 64,
        dtype: f16,
        writes: { dq: owned },
    }
}

fn main() {}
