attn_macros::attention_kernel! {
    pub fwd {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: 64,
        writes: { o: owned },
    }
}

fn main() {}
