attn_macros::attention_kernel! {
    pub dkdv {
        op: backward_kv,
        grid: j_major(tile = 1),
        head_dim: 64,
        target: native(storage_buffers = 9),
        source: recompute,
        writes: { dk: owned, dv: owned, dq: atomic },
    }
}

fn main() {}
