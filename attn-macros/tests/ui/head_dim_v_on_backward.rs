// Rows of two widths (head_dim_v) reach every backward schedule; a per-row dQ kernel that
// scatters dK and dV into `dkv` does not take them (the streaming schedule runs on the flash
// grid).
attn_macros::attention_kernel! {
    pub streaming_mla {
        op: backward_q,
        grid: s_major(tile = 1),
        head_dim: 128,
        head_dim_v: 64,
        masks: [causal],
        target: webgpu,
        writes: { dq: owned, dkv: atomic },
    }
}

fn main() {}
