// dK and dV (packed as `dkv`, indexed [part, j, kv_h, d]); an s-major backward has one
// workgroup per (query row, head), so every query row's workgroup would write the same rows.
attn_macros::attention_kernel! {
    pub racy_backward {
        op: backward_q,
        grid: s_major(tile = 1),
        head_dim: 64,
        writes: { dq: owned, dkv: owned },
    }
}

fn main() {}
