attn_macros::attention_kernel! {
    /// A kernel and its bindings share WGSL's one namespace.
    pub dq {
        op: backward_q,
        grid: s_major(flash),
        head_dim: 64,
        dtype: f16,
        writes: { dq: owned },
    }
}

fn main() {}
