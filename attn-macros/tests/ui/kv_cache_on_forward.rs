// Only split-K decode reads an fp8 cache (and cache_append writes one).
attn_macros::attention_kernel! {
    pub forward_fp8 {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: 64,
        kv_cache: e4m3,
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
