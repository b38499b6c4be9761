//! CPU references: the plain three-pass softmax attention, generic over the float type so
//! that one formula gives both the f64 reference and the f32 baseline of the pass rule.

use num_traits::Float;

/// An attention problem with `n_q` query rows against `n_k` key rows.
#[derive(Clone, Copy, Debug)]
pub struct Problem<'a> {
    pub n_q: usize,
    pub n_k: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f64,
    /// Query `s` sees keys `j <= s`.
    pub causal: bool,
    /// Document start of each query (and key: queries and keys share positions).
    pub seg: Option<&'a [u32]>,
}

impl Problem<'_> {
    /// Query `s` sees key `j` when `j <= s` (causal) and `j >= seg[s]` (document); without
    /// the causal mask, keys past the document end are cut by `seg[j] == seg[s]`.
    fn visible(&self, s: usize, j: usize) -> bool {
        if self.causal && j > s {
            return false;
        }
        match self.seg {
            Some(seg) => j >= seg[s] as usize && (self.causal || seg[j] == seg[s]),
            None => true,
        }
    }
}

pub struct Attention<T> {
    /// `[n_q, n_heads, head_dim]`
    pub o: Vec<T>,
    /// `[n_q, n_heads]`
    pub lse: Vec<T>,
}

/// `softmax(scale · q kᵀ) v` row by row, in `T`. A row with no visible key gets O = 0 and
/// LSE = +inf, as the GPU kernels do.
pub fn attention<T: Float>(p: &Problem, q: &[f32], k: &[f32], v: &[f32]) -> Attention<T> {
    let cast = |x: f32| T::from(x).expect("f32 fits every float type");
    let (d, group) = (p.head_dim, p.n_heads / p.n_kv_heads);
    let scale = T::from(p.scale).expect("scale fits");
    let mut o = vec![T::zero(); p.n_q * p.n_heads * d];
    let mut lse = vec![T::zero(); p.n_q * p.n_heads];
    let mut scores = vec![T::zero(); p.n_k];
    for s in 0..p.n_q {
        for h in 0..p.n_heads {
            let kv_h = h / group;
            let q_row = &q[(s * p.n_heads + h) * d..][..d];
            let mut max = T::neg_infinity();
            for (j, score) in scores.iter_mut().enumerate() {
                *score = T::neg_infinity();
                if p.visible(s, j) {
                    let k_row = &k[(j * p.n_kv_heads + kv_h) * d..][..d];
                    let dot = q_row
                        .iter()
                        .zip(k_row)
                        .fold(T::zero(), |acc, (a, b)| acc + cast(*a) * cast(*b));
                    *score = dot * scale;
                    max = max.max(*score);
                }
            }
            let out = &mut o[(s * p.n_heads + h) * d..][..d];
            if max == T::neg_infinity() {
                lse[s * p.n_heads + h] = T::infinity();
                continue;
            }
            let mut sum = T::zero();
            for (j, score) in scores.iter().enumerate() {
                if *score == T::neg_infinity() {
                    continue;
                }
                let w = (*score - max).exp();
                sum = sum + w;
                let v_row = &v[(j * p.n_kv_heads + kv_h) * d..][..d];
                for (acc, x) in out.iter_mut().zip(v_row) {
                    *acc = *acc + w * cast(*x);
                }
            }
            for acc in out.iter_mut() {
                *acc = *acc / sum;
            }
            lse[s * p.n_heads + h] = max + sum.ln();
        }
    }
    Attention { o, lse }
}
