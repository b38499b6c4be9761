//! `op: block_mask`: the block mask of a description's `mask_mod`. A workgroup takes one
//! block of `MASK_BLOCK` query by `MASK_BLOCK` key positions of one of the mask's
//! (sequence, head) pairs, evaluates the mask at every pair inside the sequence, and writes
//! whether it hid them all (a block no tile loop visits), showed them all (a block whose
//! pairs need no test) or some of each, and widens its row's range of shown keys and its
//! column's range of shown queries, which narrow the kernels' tile ranges before their
//! loops. The mask is the kernels' own `mask_mod` function, tensors and `b` included, so
//! the blocks agree with the per-pair test by construction.

use super::writer::{Fragment, Template, Wgsl, uint};
use crate::spec::KernelSpec;

pub(super) fn constants(out: &mut Wgsl, spec: &KernelSpec) {
    out.put(CONSTANTS.fill([
        ("wg", uint(spec.workgroup_size)),
        ("block", uint(crate::flex::MASK_BLOCK)),
        ("empty", uint(crate::flex::BLOCK_EMPTY)),
        ("partial", uint(crate::flex::BLOCK_PARTIAL)),
        ("full", uint(crate::flex::BLOCK_FULL)),
    ]));
}

/// The workgroup, the block's side in positions, and the states a block may have.
const CONSTANTS: Template = Template {
    name: "block_mask_constants",
    needs: &[],
    text: r#"const WG: u32 = $wg;
const MASK_BLOCK: u32 = $block;
const BLOCK_EMPTY: u32 = $empty;
const BLOCK_PARTIAL: u32 = $partial;
const BLOCK_FULL: u32 = $full;

"#,
};

pub(super) fn body(out: &mut Wgsl, spec: &KernelSpec) {
    if let Some(flex) = spec.flex() {
        super::flex::functions(out, &flex, spec);
    }
    out.put(BLOCKS.fill([("name", Fragment::from(spec.name.as_str()))]));
}

const BLOCKS: Template = Template {
    name: "block_mask",
    needs: &[],
    text: r#"// Bit 0: some pair of the block is shown; bit 1: some pair is hidden.
var<workgroup> sh_seen: atomic<u32>;

@compute @workgroup_size(WG)
fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    // Workgroup (key block, query block, the mask's sequence · heads + head).
    let kb = wg.x;
    let qb = wg.y;
    let h = wg.z % dims.mask_heads;
    batch = wg.z / dims.mask_heads;
    if (tid == 0u) {
        atomicStore(&sh_seen, 0u);
    }
    workgroupBarrier();
    var seen = 0u;
    for (var i = tid; i < MASK_BLOCK * MASK_BLOCK; i = i + WG) {
        let q = qb * MASK_BLOCK + i / MASK_BLOCK;
        let k = kb * MASK_BLOCK + i % MASK_BLOCK;
        if (q < dims.seq_len && k < dims.seq_len) {
            seen = seen | select(2u, 1u, mask_mod(q, h, k));
        }
    }
    if (seen != 0u) {
        atomicOr(&sh_seen, seen);
    }
    workgroupBarrier();
    if (tid == 0u) {
        let s = atomicLoad(&sh_seen);
        var state = BLOCK_EMPTY;
        if (s == 1u) {
            state = BLOCK_FULL;
        } else if (s == 3u) {
            state = BLOCK_PARTIAL;
        }
        // A row of the mask: the blocks' states, then the keys its queries see (n - first
        // block, last block + 1) and the queries that see its keys, each by atomicMax over
        // a cleared buffer (0, 0: none).
        let n = dims.blocks;
        let row = (wg.z * n + qb) * (n + 4u);
        let col = (wg.z * n + kb) * (n + 4u);
        atomicStore(&block_mask[row + kb], state);
        if (state != BLOCK_EMPTY) {
            atomicMax(&block_mask[row + n], n - kb);
            atomicMax(&block_mask[row + n + 1u], kb + 1u);
            atomicMax(&block_mask[col + n + 2u], n - qb);
            atomicMax(&block_mask[col + n + 3u], qb + 1u);
        }
    }
}
"#,
};
