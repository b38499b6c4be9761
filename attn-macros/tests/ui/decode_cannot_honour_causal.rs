attn_macros::attention_kernel! {
    pub decode_causal {
        op: decode,
        grid: head_major,
        head_dim: 64,
        masks: [causal],
        writes: { o: owned },
    }
}

fn main() {}
