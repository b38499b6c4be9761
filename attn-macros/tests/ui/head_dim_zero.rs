attn_macros::attention_kernel! {
    pub fwd {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: 0,
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
