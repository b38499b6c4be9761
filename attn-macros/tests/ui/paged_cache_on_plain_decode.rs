// Only split-K decode walks a block table.
attn_macros::attention_kernel! {
    pub decode_paged {
        op: decode,
        grid: head_major,
        head_dim: 64,
        cache: paged,
        writes: { o: owned },
    }
}

fn main() {}
