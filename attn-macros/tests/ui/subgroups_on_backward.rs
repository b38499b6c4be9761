attn_macros::attention_kernel! {
    pub dq {
        op: backward_q,
        grid: s_major(tile = 16, key_tile = 8, rows_per_thread = 2, subgroups = true),
        head_dim: 64,
        target: native(workgroup_storage = 32768),
        workgroup_size: 64,
        writes: { dq: owned },
    }
}

fn main() {}
