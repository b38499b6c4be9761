attn_macros::attention_kernel! {
    pub fwd {
        op: forward,
        grid: s_major(tile = 4, subgroups = true),
        head_dim: 64,
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
