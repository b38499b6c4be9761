attn_macros::attention_kernel! {
    pub fwd {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: 64,
        heads: 12,
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
