//! The layout of split-K decode: query heads per workgroup, keys per scoring step, the
//! longest slice a workgroup's memory holds, and the bytes it takes.

use crate::spec::{KernelSpec, Op};

/// Query heads one split workgroup serves: the four components of a vec4.
pub const MAX_SPLIT_HEADS: u32 = 4;

/// The most keys one slice holds (its scores are staged in workgroup memory); fewer where
/// the workgroup memory of the target does not hold that many.
pub const SLICE_CAP: u32 = 512;

/// Invocations that share one key's dot products in the scores pass, each reading a
/// strided share of the key's vec4s: in f32 the largest of 8, 4, 2, 1 dividing
/// head_dim / 4 (Q and K's width); in half precision a vec4 is half the bytes, so half as many invocations
/// share a key and each keeps the same bytes in flight. A decode is bound by the loads in
/// flight: with f32's lanes, f16 moved half the bytes in the same time (H100, 32k cache).
pub fn lanes(spec: &KernelSpec) -> u32 {
    let f32_lanes = [8, 4, 2, 1]
        .into_iter()
        .find(|l| (spec.head_dim / 4).is_multiple_of(*l))
        .unwrap_or(1);
    (f32_lanes * vec4_bytes(spec) / 16).max(1)
}

/// Rows of V each invocation loads at once in P·V: 64 bytes in flight (four f32 vec4s,
/// sixteen words of fp8), 128 in half precision. Measured on the H100 (32k cache, 32/8
/// heads, d 128): doubling half precision's rows took f16 from 0.098 to 0.094 ms and bf16
/// from 0.094 to 0.088; doubling f32's or fp8's gained nothing (fp8: 0.081 to 0.090 ms).
pub fn pv_unroll(spec: &KernelSpec) -> u32 {
    let bytes = match (spec.kv_fp8, spec.dtype.bytes()) {
        (None, 2) => 128,
        _ => 64,
    };
    bytes / vec4_bytes(spec)
}

/// Bytes of four cached elements: the dtype's, or one word of four fp8 values.
fn vec4_bytes(spec: &KernelSpec) -> u32 {
    match spec.kv_fp8 {
        Some(_) => 4,
        None => 4 * spec.dtype.bytes(),
    }
}

/// Keys scored per step: the workgroup's invocations in groups of [`lanes`]. A slice's
/// length is a multiple of it.
pub fn key_tile(spec: &KernelSpec) -> u32 {
    spec.workgroup_size / lanes(spec)
}

/// Workgroup memory besides the staged scores: Q of the served heads (Q's width), one vec4 per
/// invocation for the reductions, and the sequence's length.
pub fn fixed_bytes(spec: &KernelSpec) -> u32 {
    4 * spec.grid.tile * spec.head_dim + 16 * spec.workgroup_size + 4
}

/// The longest slice (a multiple of [`key_tile`]) whose scores fit the target's workgroup
/// memory beside the rest, at most 512 keys.
pub fn max_slice(spec: &KernelSpec) -> u32 {
    let limit = spec.target.limits().workgroup_storage_bytes;
    let room = limit.saturating_sub(fixed_bytes(spec)) / 16;
    let tile = key_tile(spec).max(1);
    (room.min(SLICE_CAP) / tile * tile).max(tile)
}

pub fn workgroup_bytes(spec: &KernelSpec) -> u32 {
    match spec.op {
        Op::DecodeSplit => fixed_bytes(spec) + 16 * max_slice(spec),
        _ => 16 * spec.workgroup_size,
    }
}
