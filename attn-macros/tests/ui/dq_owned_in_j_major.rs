attn_macros::attention_kernel! {
    pub dkdv {
        op: backward_kv,
        grid: j_major(tile = 16, query_tile = 8, rows_per_thread = 2),
        head_dim: 64,
        workgroup_size: 64,
        target: native(storage_buffers = 9),
        source: recompute,
        writes: { dk: owned, dv: owned, dq: owned },
    }
}

fn main() {}
