//! Dropout's values and the host Philox-4x32-10 that decides, as every kernel does, which
//! elements it drops.

/// Dropout on P with probability `p`, its mask drawn by Philox-4x32-10 under key `seed`
/// at counter word `offset` (advance it between calls that need fresh masks).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    /// The probability of dropping an element, in [0, 1).
    pub p: f32,
    /// The Philox key: the same seed draws the same mask.
    pub seed: u64,
    /// The Philox counter word, which picks another mask under the same seed.
    pub offset: u32,
}

impl Dropout {
    /// A Philox word under this drops its element: p·2^32, rounded.
    pub fn threshold(&self) -> u32 {
        (f64::from(self.p) * 4294967296.0)
            .round()
            .min(f64::from(u32::MAX)) as u32
    }

    /// What a kept element is multiplied by, 1 / (1 - p), in f32 as the kernels hold it.
    pub fn keep_scale(&self) -> f32 {
        (1.0 / (1.0 - f64::from(self.p))) as f32
    }

    /// Whether query `s` keeps key `j` in head `h` of sequence `b` (of `n_heads` heads):
    /// the first word of Philox at counter (j, s, b·n_heads + h, offset) at or over the
    /// threshold, as every kernel decides it.
    pub fn keeps(&self, b: usize, n_heads: usize, h: usize, s: usize, j: usize) -> bool {
        let counter = [j as u32, s as u32, (b * n_heads + h) as u32, self.offset];
        let key = [self.seed as u32, (self.seed >> 32) as u32];
        philox4x32_10(counter, key)[0] >= self.threshold()
    }
}

/// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", 2011),
/// the generator of `attn_dsl::PHILOX_WGSL`.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mul = |a: u32, b: u32| {
        let p = u64::from(a) * u64::from(b);
        ((p >> 32) as u32, p as u32)
    };
    let (mut c, mut k) = (counter, key);
    for _ in 0..10 {
        let (hi0, lo0) = mul(0xD251_1F53, c[0]);
        let (hi1, lo1) = mul(0xCD9E_8D57, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
        k = [
            k[0].wrapping_add(0x9E37_79B9),
            k[1].wrapping_add(0xBB67_AE85),
        ];
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123's known-answer vectors for Philox-4x32-10.
    #[test]
    fn philox_matches_the_known_answers() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    /// The kept fraction of a large mask is 1 - p within 5 standard deviations.
    #[test]
    fn dropout_keeps_one_minus_p() {
        for p in [0.1f32, 0.5, 0.9] {
            let d = Dropout {
                p,
                seed: 0x1234_5678_9abc,
                offset: 7,
            };
            let n = 200_000usize;
            let kept = (0..n)
                .filter(|i| d.keeps(1, 4, i % 4, i / 400, i % 400))
                .count();
            let (mean, sd) = (
                n as f64 * (1.0 - f64::from(p)),
                (n as f64 * f64::from(p * (1.0 - p))).sqrt(),
            );
            assert!(
                (kept as f64 - mean).abs() < 5.0 * sd,
                "p {p}: kept {kept} of {n}"
            );
        }
    }
}
