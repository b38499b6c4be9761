// dK is indexed [j, kv_h, d]; an s-major backward has one workgroup per (query row, head),
// so every query row's workgroup would write the same dK rows.
attn_macros::attention_kernel! {
    pub racy_backward {
        op: backward_q,
        grid: s_major(tile = 1),
        head_dim: 64,
        target: native(storage_buffers = 10),
        writes: { dq: owned, dk: owned, dv: owned },
    }
}

fn main() {}
