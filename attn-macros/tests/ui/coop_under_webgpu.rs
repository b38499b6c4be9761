attn_macros::attention_kernel! {
    /// Cooperative matrices (tensor cores) are a native-only extension: no browser has them.
    pub fwd_tc {
        op: forward,
        grid: s_major(tile = 64, key_tile = 32, rows_per_thread = 16, matrix = coop16),
        head_dim: 128,
        target: webgpu,
        workgroup_size: 128,
        dtype: f16,
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
