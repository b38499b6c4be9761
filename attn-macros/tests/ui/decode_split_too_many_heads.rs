// A split workgroup carries its query heads in the four components of a vec4.
attn_macros::attention_kernel! {
    pub split_wide {
        op: decode_split,
        grid: slice_major(tile = 8),
        head_dim: 64,
        writes: { partials: scratch },
    }
}

fn main() {}
