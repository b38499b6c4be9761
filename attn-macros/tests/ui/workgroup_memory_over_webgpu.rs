// 2048 invocations with head_dim 256 need 26 KiB of workgroup memory; a native target that
// raises only the invocation limit keeps WebGPU's 16 KiB of workgroup memory.
attn_macros::attention_kernel! {
    pub fat {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: 256,
        workgroup_size: 2048,
        target: native(invocations = 2048),
        writes: { o: owned, lse: owned },
    }
}

fn main() {}
