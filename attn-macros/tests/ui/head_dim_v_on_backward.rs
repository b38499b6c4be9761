// Rows of two widths (head_dim_v) reach every backward schedule but the streaming one, whose
// `dkv` lanes hold dK and dV in one buffer at one width.
attn_macros::attention_kernel! {
    pub streaming_mla {
        op: backward_q,
        grid: s_major(flash),
        head_dim: 128,
        head_dim_v: 64,
        masks: [causal],
        target: webgpu,
        writes: { dq: owned, dkv: atomic },
    }
}

fn main() {}
