// An fp8 cache names its format: e4m3 or e5m2.
attn_macros::attention_kernel! {
    pub decode_fp8 {
        op: decode_split,
        grid: slice_major(tile = 4),
        head_dim: 64,
        kv_cache: e4m4,
        writes: { partials: scratch },
    }
}

fn main() {}
