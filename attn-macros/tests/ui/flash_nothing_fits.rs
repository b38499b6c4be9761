attn_macros::attention_kernel! {
    /// head_dim 200: no layout of the key-major backward holds its K, V, Q and dO rows in
    /// WebGPU's 16 KiB and its dK and dV columns in the register budget.
    pub dkdv {
        op: backward_kv,
        grid: j_major(flash),
        head_dim: 200,
        source: recompute,
        writes: { dk: owned, dv: owned },
    }
}

fn main() {}
