//! The tiling of [`Op::Matmul`](crate::spec::Op::Matmul): a workgroup of 8 subgroups owns a
//! 128×128 block of `c`, stages 64-deep slices of both operands in workgroup memory (f16,
//! rows padded by 16 bytes), and each subgroup keeps a 64×32 block (4×2 fragments of
//! 16×16) in f32 accumulators.
//!
//! Measured on an H100 (`[8192, 768] × [768, 3072]`, 2026-11-27, a probe build): 128×128
//! blocks with 64-deep slices ran at 149-153 TFLOP/s whatever the operands' layouts;
//! 128×64-row blocks at 76; 32-deep slices double-buffered at 127; 128×256 blocks with
//! 32-deep slices at 159-190 (the layouts differ there), kept for later.

use crate::spec::{Along, MatmulForm};

/// Rows of `c` per workgroup.
pub const BM: u32 = 128;
/// Columns of `c` per workgroup.
pub const BN: u32 = 128;
/// Reduction indices per staged slice.
pub const BK: u32 = 64;
/// Subgroups along the block's rows (WM · WN = 8 subgroups of 32).
pub const WM: u32 = 2;
/// Subgroups along the block's columns.
pub const WN: u32 = 4;
/// Invocations per workgroup.
pub const WORKGROUP: u32 = 32 * WM * WN;
/// Halves of padding after each staged row: keeps a fragment's rows 16-byte aligned and
/// starting in different banks.
pub const PAD: u32 = 8;

/// Halves of one operand's staged slice: `outputs` rows of the reduction (contiguous
/// along it) or BK rows of the outputs.
pub fn slice_halves(along: Along, outputs: u32) -> u32 {
    match along {
        Along::Reduction => outputs * (BK + PAD),
        Along::Output => BK * (outputs + PAD),
    }
}

/// Bytes of workgroup memory: both slices, and a 16×16 f32 fragment per subgroup for the
/// masked store of the finished block.
pub fn workgroup_bytes(form: MatmulForm) -> u32 {
    2 * (slice_halves(form.a, BM) + slice_halves(form.b, BN)) + 4 * 256 * WM * WN
}

/// The reduction indices of one of `split` parts: whole slices.
pub fn part_len(k: u32, split: u32) -> u32 {
    k.div_ceil(split.max(1) * BK) * BK
}
