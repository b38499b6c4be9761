attn_macros::attention_kernel! {
    /// A split pass that combines its slices reads the other workgroups' partials: WGSL's
    /// storageBarrier orders storage only within a workgroup.
    pub split_combined {
        op: decode_split,
        grid: slice_major(tile = 4),
        head_dim: 128,
        gqa: any,
        target: webgpu,
        workgroup_size: 256,
        writes: { partials: scratch, o: owned },
    }
}

fn main() {}
