attn_macros::attention_kernel! {
    pub fwd {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: 64,
        workgroup_size: 512,
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
