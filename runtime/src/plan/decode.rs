//! How split-K decode cuts a cache into slices: the one place the rule is decided.

/// How a cache is cut: `n_slices` slices of `slice_len` keys (the last may be shorter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slicing {
    /// Keys per slice, a whole number of the split kernel's key tile.
    pub slice_len: u32,
    /// Slices, each flushing its own partial softmax for the reduce.
    pub n_slices: u32,
}

/// The slicing rule, the one place it is decided: the slices that bring
/// `slices × other_workgroups` nearest `target` workgroups (the adapter's
/// [`super::calibration::Calibration::decode_workgroups`]), each a whole number of the
/// split kernel's key tiles, at least one tile and at most `max_slice` keys (what its
/// workgroup memory holds).
pub fn plan_slices(
    cache_len: u32,
    other_workgroups: u32,
    key_tile: u32,
    max_slice: u32,
    target: u32,
) -> Slicing {
    let key_tile = key_tile.max(1);
    // Nearest, not at least: one short of the target needs no second slice (a 512-row
    // cache at batch 64, 32 heads over 8, f16, H200 2026-11-29: one slice 0.083 ms, two
    // 0.097; docs/decode.md).
    let others = other_workgroups.max(1);
    let wanted = (target.saturating_add(others / 2) / others).max(1);
    // Saturating: the rule is public, and a cache_len near u32::MAX must not overflow.
    let len = cache_len
        .div_ceil(wanted)
        .div_ceil(key_tile)
        .saturating_mul(key_tile);
    let slice_len = len.clamp(key_tile, max_slice.max(key_tile));
    Slicing {
        slice_len,
        n_slices: cache_len.div_ceil(slice_len).max(1),
    }
}

/// Whether a split pass that combines its slices itself takes a grid of `n_slices` ×
/// `other_workgroups` workgroups: at most `target` (the slicing rule's, about one wave), where
/// the reduce's dispatch saved pays and no later wave pays for the combine's barriers
/// (`crate::ops::decode::Combine::planned` has the measurements).
pub fn combines_in_place(slicing: Slicing, other_workgroups: u32, target: u32) -> bool {
    slicing.n_slices.saturating_mul(other_workgroups) <= target
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One wave combines in place; a grid past the target, or one that would overflow,
    /// keeps the reduce pass.
    #[test]
    fn grids_of_one_wave_combine_in_place() {
        let s = |n_slices| Slicing {
            slice_len: 1024,
            n_slices,
        };
        assert!(combines_in_place(s(32), 8, 264));
        assert!(!combines_in_place(s(32), 16, 264));
        assert!(!combines_in_place(s(128), 8, 264));
        assert!(!combines_in_place(s(u32::MAX), 2, u32::MAX - 1));
    }

    /// The slices nearest the target: a batch one short of it keeps one slice, a long cache
    /// is cut into the longest slices, the cut between them rounds to whole key tiles.
    #[test]
    fn slices_bring_the_workgroups_nearest_the_target() {
        let plan = |len, others| plan_slices(len, others, 32, 512, 528);
        let s = plan(512, 512);
        assert_eq!((s.n_slices, s.slice_len), (1, 512));
        let s = plan(4096, 64);
        assert_eq!((s.n_slices, s.slice_len), (8, 512));
        let s = plan(32768, 8);
        assert_eq!((s.n_slices, s.slice_len), (64, 512));
        let s = plan(512, 128);
        assert_eq!((s.n_slices, s.slice_len), (4, 128));
        let s = plan(u32::MAX, 1);
        assert_eq!(s.slice_len, 512);
    }
}
