attn_macros::attention_kernel! {
    pub fwd {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: 64,
        head_dim: 128,
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
