attn_macros::attention_kernel! {
    pub implied_backward_over_webgpu {
        op: forward,
        grid: s_major(flash),
        head_dim: 64,
        target: webgpu,
        tensors: { rel_bias: [heads, 65] f32 grad, prefix: [batch] u32 },
        score_mod: |score, _b, h, q, k| score + rel_bias[h][clamp(q - k, -32, 32) + 32],
        mask_mod: |b, _h, q, k| k <= q || k < prefix[b] as i32,
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
