// The producer flushes P and dS only where causal + document masks make them visible; a
// consumer with the causal mask alone would read entries nobody wrote.
attn_macros::attention_kernel! {
    pub producer {
        op: backward_q,
        grid: s_major(tile = 1),
        head_dim: 64,
        masks: [causal, document],
        writes: { dq: owned, p_ds: scratch },
    }
}

attn_macros::attention_kernel! {
    pub consumer {
        op: backward_kv,
        grid: j_major(tile = 1),
        head_dim: 64,
        masks: [causal],
        source: scratch(producer),
        writes: { dk: owned, dv: owned },
    }
}

fn main() {}
