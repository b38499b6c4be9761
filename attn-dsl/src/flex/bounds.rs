//! The key range a `mask_mod` implies, as the built-in words give one: each conjunct of
//! the form `k OP q + c` (after moving terms: `q - k < w`, `k <= q`, `k == q`) bounds the
//! keys a query sees to an interval that moves with the query, as causal and window ranges
//! do. Kernels intersect their row ranges with it, so their loops visit only its tiles;
//! where the whole mask is such conjuncts (`exact`), the range is the mask and no pair
//! needs the per-pair test, the built-in words' code and speed.
//!
//! Only bounds that move with the query (`q + c`, not a constant) are taken: every loop
//! that walks keys or queries by tiles relies on both ends of a range being nondecreasing
//! in the row, and a constant bound seen from a key (`k < 4`: only the first keys are
//! seen) is a query range that shrinks to nothing as the key grows.

use super::{BinOp, Expr, Kind, Lit, Ty};

/// `k >= q + start` for every `start`, `k < q + end` for every `end`; `exact` when the
/// mask holds exactly where they all do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyBounds {
    /// Lower bounds: query q sees only keys k >= q + start.
    pub starts: Vec<i64>,
    /// Upper bounds: query q sees only keys k < q + end.
    pub ends: Vec<i64>,
    /// Whether the bounds are the whole mask, so that no pair needs the per-pair test.
    pub exact: bool,
}

impl KeyBounds {
    /// Whether the mask bounds the keys nowhere: every loop walks the whole range.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty() && self.ends.is_empty()
    }
}

/// The bounds of `mask`'s conjuncts (lets inlined).
pub fn key_bounds<S: Clone>(mask: &Expr<S>) -> KeyBounds {
    let mut b = KeyBounds {
        exact: true,
        ..KeyBounds::default()
    };
    conjuncts(&mask.inlined(), &mut b);
    b
}

fn conjuncts<S>(e: &Expr<S>, b: &mut KeyBounds) {
    match &e.kind {
        Kind::Bin(BinOp::And, l, r) => {
            conjuncts(l, b);
            conjuncts(r, b);
        }
        Kind::Lit(Lit::Bool(true)) => {}
        Kind::Bin(op, l, r) if op.compares() => match bound(*op, l, r) {
            Some((starts, ends)) => {
                b.starts.extend(starts);
                b.ends.extend(ends);
            }
            None => b.exact = false,
        },
        _ => b.exact = false,
    }
}

/// `l OP r` as bounds on k: `(starts, ends)`, or `None` where it is not `k OP q + c`.
fn bound<S>(op: BinOp, l: &Expr<S>, r: &Expr<S>) -> Option<(Vec<i64>, Vec<i64>)> {
    let (lk, lq, lc) = linear(l)?;
    let (rk, rq, rc) = linear(r)?;
    // (a·k + b·q + c) OP 0, then with k's coefficient +1: k OP' -b·q - c.
    let (a, b, c) = (lk - rk, lq - rq, lc - rc);
    let (op, b, c) = match a {
        1 => (op, b, c),
        -1 => (flip(op)?, -b, -c),
        _ => return None,
    };
    // Only bounds that move with the query: k OP q + offset.
    if b != -1 {
        return None;
    }
    // An offset a WGSL i32 cannot hold beside a position stays a per-pair test.
    let offset = -c;
    if offset.unsigned_abs() >= 1 << 30 {
        return None;
    }
    match op {
        BinOp::Lt => Some((vec![], vec![offset])),
        BinOp::Le => Some((vec![], vec![offset + 1])),
        BinOp::Gt => Some((vec![offset + 1], vec![])),
        BinOp::Ge => Some((vec![offset], vec![])),
        BinOp::Eq => Some((vec![offset], vec![offset + 1])),
        _ => None,
    }
}

/// The comparison with its sides negated: `-x OP 0` as `x OP' 0`.
fn flip(op: BinOp) -> Option<BinOp> {
    Some(match op {
        BinOp::Lt => BinOp::Gt,
        BinOp::Le => BinOp::Ge,
        BinOp::Gt => BinOp::Lt,
        BinOp::Ge => BinOp::Le,
        BinOp::Eq => BinOp::Eq,
        _ => return None,
    })
}

/// `e` as `(k, q, c)` with `e = k·K + q·Q + c`, or `None`: sums, differences, negation,
/// products with a constant and casts to i32 of k, q and integer literals. (A cast to u32
/// is not followed: it wraps a negative difference.)
fn linear<S>(e: &Expr<S>) -> Option<(i64, i64, i64)> {
    let add = |(a, b, c): (i64, i64, i64), (d, f, g): (i64, i64, i64)| {
        Some((a.checked_add(d)?, b.checked_add(f)?, c.checked_add(g)?))
    };
    let scale = |x: i64, (a, b, c): (i64, i64, i64)| {
        Some((a.checked_mul(x)?, b.checked_mul(x)?, c.checked_mul(x)?))
    };
    match &e.kind {
        Kind::Var(v) if v == "k" => Some((1, 0, 0)),
        Kind::Var(v) if v == "q" => Some((0, 1, 0)),
        Kind::Lit(Lit::Int(c)) => Some((0, 0, *c)),
        Kind::Neg(a) => scale(-1, linear(a)?),
        Kind::Cast(a, Ty::I32) => linear(a),
        Kind::Bin(BinOp::Add, l, r) => add(linear(l)?, linear(r)?),
        Kind::Bin(BinOp::Sub, l, r) => add(linear(l)?, scale(-1, linear(r)?)?),
        Kind::Bin(BinOp::Mul, l, r) => match (linear(l)?, linear(r)?) {
            ((0, 0, x), y) | (y, (0, 0, x)) => scale(x, y),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flex::library::{self, build::*};

    fn bounds(e: &Expr) -> (Vec<i64>, Vec<i64>, bool) {
        let b = key_bounds(e);
        (b.starts, b.ends, b.exact)
    }

    #[test]
    fn the_library_masks_bound_their_keys() {
        assert_eq!(bounds(&library::causal()), (vec![], vec![1], true));
        // k <= q && q - k < 256: k in [q - 255, q + 1).
        assert_eq!(
            bounds(&library::sliding_window(256)),
            (vec![-255], vec![1], true)
        );
        // The sinks are a disjunction: the causal end still holds, the rest is tested.
        assert_eq!(
            bounds(&library::window_with_sinks(256, 4)),
            (vec![], vec![1], false)
        );
        assert_eq!(
            bounds(&library::block_diagonal(16)),
            (vec![], vec![], false)
        );
    }

    #[test]
    fn comparisons_are_moved_to_bounds_on_k() {
        let cases = [
            (bin(BinOp::Eq, v("k"), v("q")), (vec![0], vec![1], true)),
            // 2·k > 2·q: k's coefficient is not ±1.
            (
                bin(
                    BinOp::Gt,
                    bin(BinOp::Mul, i(2), v("k")),
                    bin(BinOp::Mul, v("q"), i(2)),
                ),
                (vec![], vec![], false),
            ),
            // q + 3 >= k  <=>  k < q + 4.
            (
                bin(BinOp::Ge, bin(BinOp::Add, v("q"), i(3)), v("k")),
                (vec![], vec![4], true),
            ),
            // -k < -q  <=>  k > q.
            (
                bin(BinOp::Lt, neg(v("k")), neg(v("q"))),
                (vec![1], vec![], true),
            ),
            // An offset past what an i32 holds beside a position is tested.
            (
                bin(BinOp::Lt, v("k"), bin(BinOp::Add, v("q"), i(1 << 40))),
                (vec![], vec![], false),
            ),
            // A constant bound, and a bound that moves against the query, are tested.
            (bin(BinOp::Lt, v("k"), i(4)), (vec![], vec![], false)),
            (
                bin(BinOp::Lt, v("k"), bin(BinOp::Sub, i(100), v("q"))),
                (vec![], vec![], false),
            ),
            // A cast to u32 wraps a negative distance.
            (
                bin(
                    BinOp::Lt,
                    cast(bin(BinOp::Sub, v("q"), v("k")), Ty::U32),
                    i(8),
                ),
                (vec![], vec![], false),
            ),
            (
                bin(
                    BinOp::Lt,
                    cast(bin(BinOp::Sub, v("q"), v("k")), Ty::I32),
                    i(8),
                ),
                (vec![-7], vec![], true),
            ),
        ];
        for (e, want) in cases {
            assert_eq!(bounds(&e), want);
        }
    }

    fn neg(a: Expr) -> Expr {
        Expr::new(Kind::Neg(Box::new(a)), ())
    }
}
