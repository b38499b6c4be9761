// The reduce combines partials some decode_split flushed: it must name that kernel.
attn_macros::attention_kernel! {
    pub reduce {
        op: decode_reduce,
        grid: head_major,
        head_dim: 64,
        writes: { o: owned },
    }
}

fn main() {}
