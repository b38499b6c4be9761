attn_macros::attention_kernel! {
    pub flex_grad_unread {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: 64,
        tensors: { prefix: [batch] u32, scale_table: [heads] f32 grad },
        score_mod: |score, _b, _h, _q, _k| score * 0.5,
        mask_mod: |b, _h, q, k| k <= q || k < prefix[b] as i32,
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
