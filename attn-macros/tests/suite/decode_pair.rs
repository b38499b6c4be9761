//! A split-K decode described with user-written modifiers: the split pass applies them and
//! binds their tensors; the reduce takes the same description, reads none of it, and its
//! scratch contract accepts the split's.

use attn_macros::attention_kernel;

attention_kernel! {
    pub biased_decode_split {
        op: decode_split,
        grid: slice_major(tile = 4),
        head_dim: 64,
        gqa: any,
        target: webgpu,
        workgroup_size: 256,
        tensors: { head_bias: [heads] f32, window: [batch] u32 },
        score_mod: |score, _b, h, _q, _k| score + head_bias[h],
        mask_mod: |b, _h, q, k| q - k < window[b] as i32,
        writes: { partials: scratch },
    }
}

attention_kernel! {
    pub biased_decode_reduce {
        op: decode_reduce,
        grid: head_major,
        head_dim: 64,
        gqa: any,
        target: webgpu,
        workgroup_size: 256,
        tensors: { head_bias: [heads] f32, window: [batch] u32 },
        score_mod: |score, _b, h, _q, _k| score + head_bias[h],
        mask_mod: |b, _h, q, k| q - k < window[b] as i32,
        source: scratch(biased_decode_split),
        writes: { o: owned },
    }
}

#[test]
fn the_reduce_takes_the_splits_modifiers_and_binds_none_of_them() {
    use biased_decode_reduce as reduce;
    use biased_decode_split as split;
    for name in ["head_bias", "window"] {
        assert!(split::ABI.binding(name).is_some(), "split binds {name}");
        assert!(reduce::ABI.binding(name).is_none(), "reduce binds {name}");
    }
    assert!(split::WGSL.contains("head_bias["));
    assert!(!reduce::WGSL.contains("head_bias"));
    assert!(attn_dsl::contract::compatible(
        &split::SCRATCH,
        &reduce::READS_SCRATCH
    ));
}
