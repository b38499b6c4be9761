attn_macros::attention_kernel! {
    pub fwd {
        op: forward,
        grid: s_major(tile = 64, key_tile = 32, rows_per_thread = 4),
        head_dim: 128,
        workgroup_size: 128,
        target: webgpu,
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
