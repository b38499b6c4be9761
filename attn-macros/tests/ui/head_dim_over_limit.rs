attn_macros::attention_kernel! {
    pub too_wide {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: 512,
        masks: [causal],
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
