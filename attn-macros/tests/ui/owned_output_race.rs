// O is indexed [s, h, d]; a j-major grid fixes only (j, kv_h), so many workgroups would
// write each O element.
attn_macros::attention_kernel! {
    pub racy_forward {
        op: forward,
        grid: j_major(tile = 16),
        head_dim: 64,
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
