attn_macros::attention_kernel! {
    /// Subgroup operations are a native-only extension: core WebGPU has none.
    pub split_sg {
        op: decode_split,
        grid: slice_major(tile = 4, subgroups = true),
        head_dim: 128,
        gqa: any,
        target: webgpu,
        workgroup_size: 256,
        writes: { partials: scratch },
    }
}

fn main() {}
