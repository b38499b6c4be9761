attn_macros::attention_kernel! {
    pub fwd {
        op: forward,
        grid: s_major(tile = 16, key_tile = 16, rows_per_thread = 2, subgroups = true),
        head_dim: 64,
        target: webgpu,
        workgroup_size: 64,
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
