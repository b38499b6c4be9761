//! CPU references: plain softmax attention, its backward and RoPE, generic over the float
//! type so that one formula gives both the f64 reference and the f32 baseline of the pass
//! rule, and f64 inputs for finite differences.

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
    pub fn visible(&self, s: usize, j: usize) -> bool {
        if self.causal && j > s {
            return false;
        }
        match self.seg {
            Some(seg) => j >= seg[s] as usize && (self.causal || seg[j] == seg[s]),
            None => true,
        }
    }

    fn q_row<'x, T>(&self, x: &'x [T], s: usize, h: usize) -> &'x [T] {
        &x[(s * self.n_heads + h) * self.head_dim..][..self.head_dim]
    }

    fn kv_row<'x, T>(&self, x: &'x [T], j: usize, h: usize) -> &'x [T] {
        let kv_h = h / (self.n_heads / self.n_kv_heads);
        &x[(j * self.n_kv_heads + kv_h) * self.head_dim..][..self.head_dim]
    }
}

/// `x` converted to `T`.
pub fn cast<T: Float>(x: &[f32]) -> Vec<T> {
    x.iter()
        .map(|v| T::from(*v).expect("f32 fits every float type"))
        .collect()
}

fn dot<T: Float>(a: &[T], b: &[T]) -> T {
    a.iter().zip(b).fold(T::zero(), |acc, (x, y)| acc + *x * *y)
}

pub struct Attention<T> {
    /// `[n_q, n_heads, head_dim]`
    pub o: Vec<T>,
    /// `[n_q, n_heads]`
    pub lse: Vec<T>,
}

/// The softmax row P[s, h, ·] (0 where masked) and its log-sum-exp; an empty row is all
/// zeros with LSE = +inf, as the GPU kernels store it.
fn probabilities<T: Float>(p: &Problem, q: &[T], k: &[T], s: usize, h: usize) -> (Vec<T>, T) {
    let scale = T::from(p.scale).expect("scale fits");
    let scores: Vec<Option<T>> = (0..p.n_k)
        .map(|j| {
            p.visible(s, j)
                .then(|| dot(p.q_row(q, s, h), p.kv_row(k, j, h)) * scale)
        })
        .collect();
    let max = scores
        .iter()
        .flatten()
        .fold(T::neg_infinity(), |m, x| m.max(*x));
    if max == T::neg_infinity() {
        return (vec![T::zero(); p.n_k], T::infinity());
    }
    let w: Vec<T> = scores
        .iter()
        .map(|x| x.map_or(T::zero(), |x| (x - max).exp()))
        .collect();
    let sum = w.iter().fold(T::zero(), |a, x| a + *x);
    (w.iter().map(|x| *x / sum).collect(), max + sum.ln())
}

/// P[s, h, ·] recomputed from a saved LSE.
fn recomputed_probabilities<T: Float>(
    p: &Problem,
    q: &[T],
    k: &[T],
    s: usize,
    h: usize,
    lse: T,
) -> Vec<T> {
    let scale = T::from(p.scale).expect("scale fits");
    (0..p.n_k)
        .map(|j| match p.visible(s, j) {
            true => (dot(p.q_row(q, s, h), p.kv_row(k, j, h)) * scale - lse).exp(),
            false => T::zero(),
        })
        .collect()
}

/// `softmax(scale · q kᵀ) v` row by row, in `T`.
pub fn attention<T: Float>(p: &Problem, q: &[T], k: &[T], v: &[T]) -> Attention<T> {
    let d = p.head_dim;
    let mut o = vec![T::zero(); p.n_q * p.n_heads * d];
    let mut lse = vec![T::zero(); p.n_q * p.n_heads];
    for s in 0..p.n_q {
        for h in 0..p.n_heads {
            let (probs, row_lse) = probabilities(p, q, k, s, h);
            lse[s * p.n_heads + h] = row_lse;
            let out = &mut o[(s * p.n_heads + h) * d..][..d];
            for (j, w) in probs.iter().enumerate().filter(|(_, w)| **w != T::zero()) {
                for (acc, x) in out.iter_mut().zip(p.kv_row(v, j, h)) {
                    *acc = *acc + *w * *x;
                }
            }
        }
    }
    Attention { o, lse }
}

pub struct Gradients<T> {
    pub dq: Vec<T>,
    pub dk: Vec<T>,
    pub dv: Vec<T>,
}

/// The backward of [`attention`] for upstream gradient `d_o`:
/// dP = dO·Vᵀ, D = rowsum(P ∘ dP), dS = scale·P·(dP − D), dQ = dS·K, dK = dSᵀ·Q, dV = Pᵀ·dO.
/// Given the forward's saved `(o, lse)`, P = exp(scale·QKᵀ − LSE) and D = rowsum(dO ∘ O),
/// as the kernels compute them: equal in exact arithmetic, but carrying the rounding of the
/// saved tensors.
pub fn attention_backward<T: Float>(
    p: &Problem,
    [q, k, v, d_o]: [&[T]; 4],
    saved: Option<(&[T], &[T])>,
) -> Gradients<T> {
    let (d, scale) = (p.head_dim, T::from(p.scale).expect("scale fits"));
    let mut g = Gradients {
        dq: vec![T::zero(); q.len()],
        dk: vec![T::zero(); k.len()],
        dv: vec![T::zero(); v.len()],
    };
    for s in 0..p.n_q {
        for h in 0..p.n_heads {
            let probs = match saved {
                Some((_, lse)) => recomputed_probabilities(p, q, k, s, h, lse[s * p.n_heads + h]),
                None => probabilities(p, q, k, s, h).0,
            };
            let g_o = p.q_row(d_o, s, h);
            let dp: Vec<T> = (0..p.n_k).map(|j| dot(g_o, p.kv_row(v, j, h))).collect();
            let big_d = match saved {
                Some((o, _)) => dot(g_o, p.q_row(o, s, h)),
                None => probs
                    .iter()
                    .zip(&dp)
                    .fold(T::zero(), |a, (w, x)| a + *w * *x),
            };
            let kv_h = h / (p.n_heads / p.n_kv_heads);
            for (j, w) in probs.iter().enumerate().filter(|(_, w)| **w != T::zero()) {
                let ds = scale * *w * (dp[j] - big_d);
                let kv = (j * p.n_kv_heads + kv_h) * d;
                for i in 0..d {
                    g.dq[(s * p.n_heads + h) * d + i] =
                        g.dq[(s * p.n_heads + h) * d + i] + ds * k[kv + i];
                    g.dk[kv + i] = g.dk[kv + i] + ds * q[(s * p.n_heads + h) * d + i];
                    g.dv[kv + i] = g.dv[kv + i] + *w * g_o[i];
                }
            }
        }
    }
    g
}

/// RoPE on `x: [seq, heads, head_dim]`: pairs (i, i + d/2) of row `s` rotate by
/// `sign · (s + pos_offset) · inv_freq[i]`; `sign = -1` is the backward.
pub fn rope<T: Float>(
    x: &[T],
    heads: usize,
    head_dim: usize,
    pos_offset: u32,
    inv_freq: &[T],
    sign: f64,
) -> Vec<T> {
    let half = head_dim / 2;
    let mut out = x.to_vec();
    let c = |v: f64| T::from(v).expect("fits");
    for (r, row) in out.chunks_mut(head_dim).enumerate() {
        let pos = c((r / heads) as f64 + f64::from(pos_offset));
        for i in 0..half {
            let angle = c(sign) * pos * inv_freq[i];
            let (sn, cs) = angle.sin_cos();
            let (x0, x1) = (row[i], row[i + half]);
            row[i] = x0 * cs - x1 * sn;
            row[i + half] = x0 * sn + x1 * cs;
        }
    }
    out
}
