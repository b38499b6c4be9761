attn_macros::attention_kernel! {
    pub block_mask_not_device {
        op: forward,
        grid: s_major(flash),
        head_dim: 64,
        tensors: { prefix: [batch] u32 },
        mask_mod: |b, _h, q, k| k <= q || k < prefix[b] as i32,
        block_mask: host,
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
