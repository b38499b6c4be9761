// Rows of two widths (head_dim_v) reach the backward's scalar grids, not yet the tensor
// cores' (nor the streaming schedule's `dkv` lanes).
attn_macros::attention_kernel! {
    pub dkdv_mla {
        op: backward_kv,
        grid: j_major(tile = 64, query_tile = 32, rows_per_thread = 16, matrix = coop16),
        head_dim: 128,
        head_dim_v: 64,
        masks: [causal],
        target: native(workgroup_storage = 38160),
        workgroup_size: 256,
        dtype: f16,
        source: recompute,
        writes: { dk: owned, dv: owned },
    }
}

fn main() {}
