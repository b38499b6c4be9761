//! How split-K decode cuts a cache into slices: the one place the rule is decided.

/// How a cache is cut: `n_slices` slices of `slice_len` keys (the last may be shorter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slicing {
    /// Keys per slice, a whole number of the split kernel's key tile.
    pub slice_len: u32,
    /// Slices, each flushing its own partial softmax for the reduce.
    pub n_slices: u32,
}

/// The slicing rule, the one place it is decided: enough slices that
/// `slices × other_workgroups` reaches `target` workgroups (the adapter's
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
    let wanted = target.div_ceil(other_workgroups.max(1)).max(1);
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
