attn_macros::attention_kernel! {
    /// The tensor-core key-major half writes dk and dv the same way.
    pub dkdv {
        op: backward_kv,
        grid: j_major(tile = 64, query_tile = 32, rows_per_thread = 16, matrix = coop16),
        head_dim: 64,
        masks: [causal],
        target: native(workgroup_storage = 38160),
        workgroup_size: 256,
        dtype: f16,
        source: recompute,
        writes: { dk: atomic, dv: owned },
    }
}

fn main() {}
