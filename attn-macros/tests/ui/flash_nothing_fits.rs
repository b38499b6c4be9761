attn_macros::attention_kernel! {
    /// head_dim 136: each invocation would hold 17 vec4 columns of both dK and dV, over
    /// the register budget in every layout.
    pub dkdv {
        op: backward_kv,
        grid: j_major(flash),
        head_dim: 136,
        source: recompute,
        writes: { dk: owned, dv: owned },
    }
}

fn main() {}
