// The named kernel is the recompute half: it flushes no scratch.
attn_macros::attention_kernel! {
    pub dq_only {
        op: backward_q,
        grid: s_major(tile = 1),
        head_dim: 64,
        masks: [causal],
        writes: { dq: owned },
    }
}

attn_macros::attention_kernel! {
    pub consumer {
        op: backward_kv,
        grid: j_major(tile = 1),
        head_dim: 64,
        masks: [causal],
        source: scratch(dq_only),
        writes: { dk: owned, dv: owned },
    }
}

fn main() {}
