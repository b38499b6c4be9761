attn_macros::attention_kernel! {
    pub streaming {
        op: backward_q,
        grid: s_major(tile = 8, key_tile = 4, rows_per_thread = 1),
        head_dim: 128,
        workgroup_size: 32,
        writes: { dq: owned, dkv: atomic },
    }
}

fn main() {}
