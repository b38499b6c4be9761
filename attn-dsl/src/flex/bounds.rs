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
//! seen) is a query range that shrinks to nothing as the key grows. A disjunction of such
//! an end with ends fixed per sequence (prefix-LM's `k <= q || k < prefix[b]`) is a
//! [`Reach`]: its end, the larger of the two, still grows with the query, and seen from a
//! key every query sees it below the fixed end.

use super::{BinOp, Expr, Func, Kind, Lit, Ty};

/// `k >= q + start` for every `start`, `k < q + end` for every `end`, `k < max(q + offset,
/// values..)` for every reach; `exact` when the mask holds exactly where they all do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeyBounds {
    /// Lower bounds: query q sees only keys k >= q + start.
    pub starts: Vec<i64>,
    /// Upper bounds: query q sees only keys k < q + end.
    pub ends: Vec<i64>,
    /// Upper bounds that reach past the query's own to ends fixed per sequence.
    pub reaches: Vec<Reach>,
    /// Whether the bounds are the whole mask, so that no pair needs the per-pair test.
    pub exact: bool,
}

/// Query q sees only keys `k < max(q + offset, v)` over `values` (i32 expressions of `b`,
/// literals and tensors read at them: fixed for a sequence's every query, key and head).
#[derive(Clone, Debug, PartialEq)]
pub struct Reach {
    /// The query's own end: `k < q + offset`.
    pub offset: i64,
    /// The sequence's ends, each an i32 expression.
    pub values: Vec<Expr>,
}

impl KeyBounds {
    /// Whether the mask bounds the keys nowhere: every loop walks the whole range.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty() && self.ends.is_empty() && self.reaches.is_empty()
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

fn conjuncts<S: Clone>(e: &Expr<S>, b: &mut KeyBounds) {
    match &e.kind {
        Kind::Bin(BinOp::And, l, r) => {
            conjuncts(l, b);
            conjuncts(r, b);
        }
        Kind::Lit(Lit::Bool(true)) => {}
        Kind::Bin(BinOp::Or, ..) => match reach(e) {
            Some(r) => b.reaches.push(r),
            None => b.exact = false,
        },
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

/// A disjunction of ends as a [`Reach`]: at least one `k < q + c` (the largest kept) and
/// at least one `k < v` with `v` fixed per sequence; `None` for any other disjunction.
fn reach<S: Clone>(e: &Expr<S>) -> Option<Reach> {
    let mut terms = Vec::new();
    disjuncts(e, &mut terms);
    let (mut offset, mut values) = (None::<i64>, Vec::new());
    for t in terms {
        let Kind::Bin(op, l, r) = &t.kind else {
            return None;
        };
        if let Some((starts, ends)) = bound(*op, l, r) {
            match (starts.as_slice(), ends.as_slice()) {
                ([], [o]) => offset = Some(offset.map_or(*o, |x| x.max(*o))),
                _ => return None,
            }
        } else {
            values.push(fixed_end(*op, l, r)?);
        }
    }
    match values.is_empty() {
        true => None,
        false => Some(Reach {
            offset: offset?,
            values,
        }),
    }
}

fn disjuncts<'a, S>(e: &'a Expr<S>, out: &mut Vec<&'a Expr<S>>) {
    match &e.kind {
        Kind::Bin(BinOp::Or, l, r) => {
            disjuncts(l, out);
            disjuncts(r, out);
        }
        _ => out.push(e),
    }
}

/// `l OP r` as `k < v` with `v` fixed per sequence, or `None`; `k <= v` as `k < min(v,
/// i32::MAX - 1) + 1`, which cannot overflow (no position reaches `i32::MAX`).
fn fixed_end<S: Clone>(op: BinOp, l: &Expr<S>, r: &Expr<S>) -> Option<Expr> {
    let key = |e: &Expr<S>| linear(e) == Some((1, 0, 0));
    let (v, inclusive) = match op {
        BinOp::Lt if key(l) => (r, false),
        BinOp::Le if key(l) => (r, true),
        BinOp::Gt if key(r) => (l, false),
        BinOp::Ge if key(r) => (l, true),
        _ => return None,
    };
    if ["q", "k", "h", "score"].iter().any(|x| v.mentions(x)) {
        return None;
    }
    let v = v.erased();
    let int = |x: i64| Expr::new(Kind::Lit(Lit::Int(x)), ());
    Some(match inclusive {
        false => v,
        true => {
            let held = Expr::new(
                Kind::Call(Func::Min, vec![v, int(i64::from(i32::MAX) - 1)]),
                (),
            );
            Expr::new(Kind::Bin(BinOp::Add, Box::new(held), Box::new(int(1))), ())
        }
    })
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
    fn an_end_fixed_per_sequence_is_reached_beside_the_query_s() {
        // k <= q || k < prefix[b]: keys below max(q + 1, prefix[b]), exactly.
        let b = key_bounds(&library::prefix_lm("prefix"));
        assert!(b.exact && b.starts.is_empty() && b.ends.is_empty());
        let want = cast(idx("prefix", vec![v("b")]), Ty::I32);
        assert_eq!(
            b.reaches,
            vec![Reach {
                offset: 1,
                values: vec![want]
            }]
        );
        // `k <= v` reaches v + 1; two query ends keep the larger.
        let e = bin(
            BinOp::Or,
            bin(BinOp::Lt, v("k"), v("q")),
            bin(
                BinOp::Or,
                bin(BinOp::Le, v("k"), i(7)),
                bin(BinOp::Lt, v("k"), bin(BinOp::Add, v("q"), i(3))),
            ),
        );
        let b = key_bounds(&e);
        assert_eq!(b.reaches.len(), 1, "{b:?}");
        assert_eq!(b.reaches[0].offset, 3);
        let held = Expr::new(
            Kind::Call(Func::Min, vec![i(7), i(i64::from(i32::MAX) - 1)]),
            (),
        );
        assert_eq!(b.reaches[0].values, vec![bin(BinOp::Add, held, i(1))]);
        // An inclusive end at i32's largest value ends there, not wrapped past it (WGSL's
        // i32 adds wrap, as the evaluator's do).
        use crate::flex::eval::{Env, Value, eval};
        for (x, end) in [
            (0, 1),
            (i64::from(i32::MAX) - 1, i32::MAX),
            (i64::from(i32::MAX), i32::MAX),
        ] {
            let e = bin(BinOp::Or, library::causal(), bin(BinOp::Le, v("k"), i(x)));
            let value = &key_bounds(&e).reaches[0].values[0];
            let got = eval(
                value,
                &mut Env::new(None, [0; 4], &crate::flex::tests::Data),
            );
            assert_eq!(got, Ok(Value::I(end)), "k <= {x}");
        }
        // Not a reach: a fixed end alone, one that moves with the query or the head, a
        // start, or a disjunct that is no bound; each stays a per-pair test.
        let not = [
            bin(
                BinOp::Or,
                bin(BinOp::Lt, v("k"), i(4)),
                bin(BinOp::Lt, v("k"), i(9)),
            ),
            bin(BinOp::Or, library::causal(), bin(BinOp::Lt, v("k"), v("h"))),
            bin(BinOp::Or, library::causal(), bin(BinOp::Gt, v("k"), i(9))),
            bin(BinOp::Or, library::causal(), bin(BinOp::Eq, v("b"), i(0))),
        ];
        for e in not {
            let b = key_bounds(&e);
            assert!(!b.exact && b.reaches.is_empty(), "{e:?}: {b:?}");
        }
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
