attn_macros::attention_kernel! {
    pub producer {
        op: backward_q,
        grid: s_major(tile = 1),
        head_dim: 64,
        workgroup_size: 64,
        writes: { dq: owned, p_ds: scratch },
    }
}

attn_macros::attention_kernel! {
    pub consumer {
        op: backward_kv,
        grid: j_major(tile = 16, query_tile = 8, rows_per_thread = 2),
        head_dim: 64,
        workgroup_size: 64,
        source: scratch(producer),
        writes: { dk: owned, dv: owned },
    }
}

fn main() {}
