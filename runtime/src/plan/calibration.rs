//! The planner's counts of workgroups, measured on an H100 and scaled to the adapter by
//! how many workgroups it runs at once (`bench --tune` measures that with a probe of
//! latency-bound workgroups; see `harness::bench::probe`).
//!
//! Two rules count workgroups: split-K decode aims for enough of them to hide every SM's
//! load latency ([`Calibration::decode_workgroups`]), and the tensor-core forward trades
//! rows per workgroup for workgroups only while the grid keeps enough of them
//! ([`Calibration::full_grid`]). Both were found on an H100; on another adapter they scale
//! with what the probe counts there over what it counts on an H100.

/// What the probe counts on an H100 (132 SMs): 267, 267 and 268 workgroups in three runs
/// of `bench --probe` (2026-11-26), about 2 per SM: the probe's chains overlap fully up to
/// there, though an SM could hold 8 such workgroups.
pub const H100_RESIDENT: u32 = 267;

/// Split-K decode's workgroups on an H100 (132 SMs, as the H200's): 2 per SM. With f16 and
/// 32 / 8 / 128 heads on an H200 the decode took 0.070 ms in 256 workgroups (slices of 1024
/// keys) against 0.082 in 512 and 0.090 in 128 at a 32k cache, 0.206 in 1024 against 0.233
/// in 2048 at 128k, and 0.372 against 0.414 at 32k with 8 sequences (`bench --decode
/// --slice-len 1024 | 512 | 2048`, 2026-11-30). (When a slice held at most 512 keys, 512
/// workgroups were the fewest a 32k cache could take: 0.096 ms on an H100 against 0.098 in
/// 1024 and 0.110 in 2048, 2026-11-26.)
const H100_DECODE_WORKGROUPS: u32 = 2 * H100_SMS;

/// The SMs of an H100 (and of an H200).
const H100_SMS: u32 = 132;

/// A continued cache's chunk's workgroups per SM where its configuration was not picked by
/// how many an SM holds: 4, the target its slicing was measured with
/// ([`crate::ops::extend`]'s `MAX_SLICE` has the sweep).
pub const CHUNK_PER_SM: u32 = 4;

/// The forward grid's least workgroups on an H100: the 128-row tensor-core forward took
/// 0.864 ms against 0.930 for 64 rows at seq 4096 with 16 heads, d 128 (512 workgroups
/// against 1024), and 0.041 against 0.028 ms at seq 512 with 12 heads, d 64 (48 against
/// 96).
const H100_FULL_GRID: u32 = 256;

/// How many workgroups this adapter runs at once, if measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Calibration {
    /// What the probe counts (`None`: an H100's count).
    pub resident: Option<u32>,
}

impl Calibration {
    /// Split-K decode's target number of workgroups (the slices of every KV head and
    /// sequence together).
    pub fn decode_workgroups(&self) -> u32 {
        self.scale(H100_DECODE_WORKGROUPS)
    }

    /// A continued cache's chunk's target number of workgroups (query tiles times slices):
    /// `per_sm` on each of an H100's SMs, scaled to the adapter.
    pub fn chunk_workgroups(&self, per_sm: u32) -> u32 {
        self.scale(per_sm.saturating_mul(H100_SMS))
    }

    /// The least workgroups a tensor-core forward grid keeps when it widens its tiles.
    pub fn full_grid(&self) -> u32 {
        self.scale(H100_FULL_GRID)
    }

    /// `h100` in proportion to the adapter's resident workgroups, at least 1.
    fn scale(&self, h100: u32) -> u32 {
        let Some(resident) = self.resident else {
            return h100;
        };
        let scaled = u64::from(h100) * u64::from(resident) / u64::from(H100_RESIDENT);
        scaled.clamp(1, u64::from(u32::MAX)) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unmeasured_adapter_gets_the_h100s_counts_and_others_scale() {
        let h100 = Calibration::default();
        assert_eq!((h100.decode_workgroups(), h100.full_grid()), (264, 256));
        assert_eq!(h100.chunk_workgroups(CHUNK_PER_SM), 528);
        let same = Calibration {
            resident: Some(H100_RESIDENT),
        };
        assert_eq!((same.decode_workgroups(), same.full_grid()), (264, 256));
        // A GPU with a quarter of the H100's SMs gets a quarter of the workgroups.
        let small = Calibration {
            resident: Some(H100_RESIDENT / 4),
        };
        assert_eq!((small.decode_workgroups(), small.full_grid()), (65, 63));
        // lavapipe on two cores counts 2: a few decode workgroups, one for a full grid.
        let cpu = Calibration { resident: Some(2) };
        assert_eq!((cpu.decode_workgroups(), cpu.full_grid()), (1, 1));
        assert_eq!(Calibration { resident: Some(0) }.full_grid(), 1);
    }
}
