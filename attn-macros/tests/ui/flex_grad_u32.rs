attn_macros::attention_kernel! {
    pub flex_grad_u32 {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: 64,
        tensors: { prefix: [batch] u32 grad },
        mask_mod: |b, _h, q, k| k <= q || k < prefix[b] as i32,
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
