attn_macros::attention_kernel! {
    pub fwd {
        op: forward,
        grid: s_major(tile = 16, key_tile = 16),
        head_dim: 64,
        workgroup_size: 64,
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
