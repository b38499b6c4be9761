attn_macros::attention_kernel! {
    pub consumer {
        op: backward_kv,
        grid: j_major(tile = 1),
        head_dim: 64,
        masks: [causal],
        source: scratch,
        writes: { dk: owned, dv: owned },
    }
}

fn main() {}
