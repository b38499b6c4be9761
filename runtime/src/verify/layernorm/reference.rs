//! The CPU reference of the fused LayerNorm + Linear and its backward, generic over the
//! float type: in f64 it is the reference, in f32 the framework-grade baseline of the pass
//! rule (every dot product and reduction a pairwise sum, as in [`crate::verify::reference`]).

use rayon::prelude::*;

use crate::verify::reference::{Real, pairwise};

/// A `[rows, hidden] -> [rows, out]` problem (rows = batch · seq).
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Rows of x and y.
    pub rows: usize,
    /// The width of x, γ and β: what the LayerNorm normalizes over.
    pub hidden: usize,
    /// The width of y (W is `[out, hidden]`).
    pub out: usize,
    /// Added to the variance.
    pub eps: f64,
}

/// The forward's output and the statistics it saves for the backward.
pub struct Forward<T> {
    /// `[rows, out]`
    pub y: Vec<T>,
    /// Each row's mean, `[rows]`.
    pub mean: Vec<T>,
    /// Each row's `1 / sqrt(variance + eps)`, `[rows]`.
    pub rstd: Vec<T>,
}

/// The backward's gradients, each in its input's layout.
pub struct Grads<T> {
    /// `[rows, hidden]`
    pub dx: Vec<T>,
    /// `[hidden]`
    pub dgamma: Vec<T>,
    /// `[hidden]`
    pub dbeta: Vec<T>,
    /// `[out, hidden]`
    pub dw: Vec<T>,
    /// `[out]`
    pub db: Vec<T>,
}

/// `(mean, 1/std)` of each row, the variance by two passes.
pub fn stats<T: Real>(s: Shape, x: &[T]) -> (Vec<T>, Vec<T>) {
    let h = T::from(s.hidden).unwrap_or_else(T::one);
    let eps = T::from(s.eps).unwrap_or_else(T::zero);
    (0..s.rows)
        .map(|r| {
            let row = &x[r * s.hidden..][..s.hidden];
            let mean = pairwise(s.hidden, &|k| row[k]) / h;
            let var = pairwise(s.hidden, &|k| (row[k] - mean) * (row[k] - mean)) / h;
            (mean, (var + eps).sqrt().recip())
        })
        .unzip()
}

/// What a product does to its operands before multiplying them: nothing ([`exact`]), or
/// a rounding to f16 (the tensor-core kernels' and a framework's f16 autocast).
pub type Operand<T> = fn(T) -> T;

/// The identity [`Operand`].
pub fn exact<T>(v: T) -> T {
    v
}

/// `y = W·LN(x; γ, β) + b`, with the statistics the kernels save; the Linear's operands
/// through `op`.
pub fn forward<T: Real>(s: Shape, [x, gamma, beta, w, b]: [&[T]; 5], op: Operand<T>) -> Forward<T> {
    let (mean, rstd) = stats(s, x);
    let xn = normalized(s, x, &mean, &rstd, |k, v| op(v * gamma[k] + beta[k]));
    let y = (0..s.rows * s.out)
        .into_par_iter()
        .map(|i| {
            let (r, n) = (i / s.out, i % s.out);
            pairwise(s.hidden, &|k| {
                op(w[n * s.hidden + k]) * xn[r * s.hidden + k]
            }) + b[n]
        })
        .collect();
    Forward { y, mean, rstd }
}

/// x̂ (then `f(k, x̂)`) of every row from its statistics.
fn normalized<T: Real>(
    s: Shape,
    x: &[T],
    mean: &[T],
    rstd: &[T],
    f: impl Fn(usize, T) -> T,
) -> Vec<T> {
    (0..s.rows * s.hidden)
        .map(|i| {
            let r = i / s.hidden;
            f(i % s.hidden, (x[i] - mean[r]) * rstd[r])
        })
        .collect()
}

/// The gradients for the upstream gradient `dy`, from the statistics `saved` (the
/// forward's, as the kernels get them) or recomputed when `None`; the operands of the two
/// products (dŷ = Wᵀ·dy, dW = dyᵀ·(x̂·γ + β)) through `op`.
pub fn backward<T: Real>(
    s: Shape,
    [x, gamma, beta, w, dy]: [&[T]; 5],
    saved: Option<(&[T], &[T])>,
    op: Operand<T>,
) -> Grads<T> {
    let computed;
    let (mean, rstd) = match saved {
        Some(m) => m,
        None => {
            computed = stats(s, x);
            (&computed.0[..], &computed.1[..])
        }
    };
    let xhat = normalized(s, x, mean, rstd, |_, v| v);
    // dŷ = Wᵀ·dy: the gradient at the LayerNorm's output.
    let g: Vec<T> = (0..s.rows * s.hidden)
        .into_par_iter()
        .map(|i| {
            let (r, k) = (i / s.hidden, i % s.hidden);
            pairwise(s.out, &|n| op(w[n * s.hidden + k]) * op(dy[r * s.out + n]))
        })
        .collect();
    let h = T::from(s.hidden).unwrap_or_else(T::one);
    let mut dx = vec![T::zero(); s.rows * s.hidden];
    for (r, &rs) in rstd.iter().enumerate().take(s.rows) {
        let at = |k: usize| r * s.hidden + k;
        let dxhat = |k: usize| g[at(k)] * gamma[k];
        let c2 = pairwise(s.hidden, &dxhat) / h;
        let c1 = pairwise(s.hidden, &|k| dxhat(k) * xhat[at(k)]) / h;
        for k in 0..s.hidden {
            dx[at(k)] = rs * (dxhat(k) - c2 - xhat[at(k)] * c1);
        }
    }
    let over_rows = |len: usize, term: &(dyn Fn(usize, usize) -> T + Sync)| -> Vec<T> {
        (0..len)
            .into_par_iter()
            .map(|e| pairwise(s.rows, &|r| term(e, r)))
            .collect()
    };
    Grads {
        dx,
        dgamma: over_rows(s.hidden, &|k, r| {
            g[r * s.hidden + k] * xhat[r * s.hidden + k]
        }),
        dbeta: over_rows(s.hidden, &|k, r| g[r * s.hidden + k]),
        // The Linear's input is x̂·γ + β.
        dw: over_rows(s.out * s.hidden, &|e, r| {
            let k = e % s.hidden;
            op(dy[r * s.out + e / s.hidden]) * op(xhat[r * s.hidden + k] * gamma[k] + beta[k])
        }),
        db: over_rows(s.out, &|n, r| dy[r * s.out + n]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::random;
    use crate::verify::reference::cast;

    const S: Shape = Shape {
        rows: 3,
        hidden: 5,
        out: 4,
        eps: 1e-5,
    };

    /// L = Σ y ∘ dy, whose gradient the backward computes.
    fn loss(p: [&[f64]; 5], dy: &[f64]) -> f64 {
        let [x, gamma, beta, w, b] = p;
        let f = forward(S, [x, gamma, beta, w, b], exact);
        f.y.iter().zip(dy).map(|(y, d)| y * d).sum()
    }

    #[test]
    fn backward_matches_finite_differences() {
        let lens = [
            S.rows * S.hidden,
            S.hidden,
            S.hidden,
            S.out * S.hidden,
            S.out,
        ];
        let params: Vec<Vec<f64>> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| cast(&random(n, 7 + i as u64)))
            .collect();
        let dy = cast::<f64>(&random(S.rows * S.out, 99));
        let p = |v: &Vec<Vec<f64>>| -> [Vec<f64>; 5] { std::array::from_fn(|i| v[i].clone()) };
        let g = backward(
            S,
            [&params[0], &params[1], &params[2], &params[3], &dy],
            None,
            exact,
        );
        let analytic = [&g.dx, &g.dgamma, &g.dbeta, &g.dw, &g.db];
        let h = 1e-6;
        for (which, grad) in analytic.iter().enumerate() {
            for i in 0..lens[which] {
                let (mut plus, mut minus) = (p(&params), p(&params));
                plus[which][i] += h;
                minus[which][i] -= h;
                let at = |v: &[Vec<f64>; 5]| loss(std::array::from_fn(|j| &v[j][..]), &dy);
                let fd = (at(&plus) - at(&minus)) / (2.0 * h);
                assert!(
                    (fd - grad[i]).abs() < 1e-6 * (1.0 + fd.abs()),
                    "param {which}[{i}]: fd {fd} vs {}",
                    grad[i]
                );
            }
        }
    }

    #[test]
    fn saved_statistics_are_the_recomputed_ones() {
        let x = cast::<f64>(&random(S.rows * S.hidden, 3));
        let (mean, rstd) = stats(S, &x);
        let row: Vec<f64> = x[..S.hidden].to_vec();
        let m = row.iter().sum::<f64>() / 5.0;
        let v = row.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / 5.0;
        assert!((mean[0] - m).abs() < 1e-12);
        assert!((rstd[0] - 1.0 / (v + 1e-5).sqrt()).abs() < 1e-9);
    }
}
