//! d(score_mod)/d(score), symbolically: the chain rule over the expression, piecewise
//! through `select`, `min`, `max`, `abs` and `clamp` (the branch the value takes), zero
//! for whatever does not mention the score. The backward multiplies dS by it. The same
//! rule, with respect to each read of a tensor declared `grad`, gives that tensor's
//! gradient ([`d_tensor`]).

use super::typing::FlexError;
use super::{BinOp, Expr, Func, Kind, Lit};

/// The derivative of `e` (lets inlined first) with respect to `score`; an error at a
/// node the derivative cannot pass (a cast of something that depends on the score).
pub fn d_score<S: Clone>(e: &Expr<S>) -> Result<Expr<S>, FlexError<S>> {
    d(&e.inlined(), "score")
}

/// One read of a tensor in a score modifier: where it reads (one index per dimension) and
/// d score_mod / d (the value read), lets inlined.
#[derive(Clone, Debug)]
pub struct Read<S> {
    /// The read's index, one expression per dimension.
    pub index: Vec<Expr<S>>,
    /// d score_mod / d (the value read), which the backward scales dS by.
    pub slope: Expr<S>,
}

/// The gradient of `e` with respect to tensor `name`, one [`Read`] per place the
/// expression reads it: a backward adds `dS · slope` into `d<name>[index]` for each. An
/// error where a read of it sits where the chain rule cannot pass (inside an index or a
/// cast).
pub fn d_tensor<S: Clone>(e: &Expr<S>, name: &str) -> Result<Vec<Read<S>>, FlexError<S>> {
    let e = e.inlined();
    let mut reads = Vec::new();
    e.visit(&mut |node| {
        if let Kind::Index(t, index) = &node.kind
            && t == name
        {
            reads.push(index.clone());
        }
    });
    reads
        .into_iter()
        .enumerate()
        .map(|(n, index)| {
            // The n-th read as a variable of its own, differentiated, then read again.
            let var = format!("{name}#{n}");
            let marked = e.marking(name, n, &var);
            let read = Expr::new(Kind::Index(name.into(), index.clone()), marked.at.clone());
            let slope = d(&marked, &var)?.substituted(&var, &read);
            Ok(Read { index, slope })
        })
        .collect()
}

fn d<S: Clone>(e: &Expr<S>, wrt: &str) -> Result<Expr<S>, FlexError<S>> {
    let at = e.at.clone();
    let b = Build { at: at.clone() };
    if !e.mentions(wrt) {
        return Ok(b.float(0.0));
    }
    let d = |e: &Expr<S>| d(e, wrt);
    Ok(match &e.kind {
        Kind::Var(_) => b.float(1.0),
        Kind::Neg(a) => b.neg(d(a)?),
        Kind::Bin(BinOp::Add, l, r) => b.bin(BinOp::Add, d(l)?, d(r)?),
        Kind::Bin(BinOp::Sub, l, r) => b.bin(BinOp::Sub, d(l)?, d(r)?),
        Kind::Bin(BinOp::Mul, l, r) => b.bin(
            BinOp::Add,
            b.bin(BinOp::Mul, d(l)?, (**r).clone()),
            b.bin(BinOp::Mul, (**l).clone(), d(r)?),
        ),
        // (l / r)' = l' / r − l·r' / r²
        Kind::Bin(BinOp::Div, l, r) => b.bin(
            BinOp::Sub,
            b.bin(BinOp::Div, d(l)?, (**r).clone()),
            b.bin(
                BinOp::Div,
                b.bin(BinOp::Mul, (**l).clone(), d(r)?),
                b.bin(BinOp::Mul, (**r).clone(), (**r).clone()),
            ),
        ),
        Kind::Call(func, args) => call(&b, *func, args, wrt)?,
        Kind::Cast(..) | Kind::Index(..) | Kind::Bin(..) | Kind::Not(_) => {
            let what = match wrt.split_once('#') {
                Some((tensor, _)) => format!("a read of `{tensor}`, declared `grad`"),
                None => format!("`{wrt}`"),
            };
            return Err(FlexError {
                at,
                message: format!(
                    "the backward cannot differentiate this with respect to {what}: keep it \
                     out of casts, indices and conditions other than select's"
                ),
            });
        }
        Kind::Lit(_) | Kind::Let(..) => {
            unreachable!("literals do not mention the score; lets are inlined")
        }
    })
}

fn call<S: Clone>(
    b: &Build<S>,
    func: Func,
    args: &[Expr<S>],
    wrt: &str,
) -> Result<Expr<S>, FlexError<S>> {
    let arg = |i: usize| args[i].clone();
    let da = |i: usize| d(&args[i], wrt);
    Ok(match func {
        Func::Exp => b.bin(BinOp::Mul, b.call(Func::Exp, vec![arg(0)]), da(0)?),
        Func::Log => b.bin(BinOp::Div, da(0)?, arg(0)),
        Func::Tanh => {
            let t = b.call(Func::Tanh, vec![arg(0)]);
            let slope = b.bin(BinOp::Sub, b.float(1.0), b.bin(BinOp::Mul, t.clone(), t));
            b.bin(BinOp::Mul, slope, da(0)?)
        }
        Func::Sqrt => b.bin(
            BinOp::Div,
            da(0)?,
            b.bin(BinOp::Mul, b.float(2.0), b.call(Func::Sqrt, vec![arg(0)])),
        ),
        Func::Abs => b.select(
            b.bin(BinOp::Lt, arg(0), b.float(0.0)),
            b.neg(da(0)?),
            da(0)?,
        ),
        Func::Min => b.select(b.bin(BinOp::Le, arg(0), arg(1)), da(0)?, da(1)?),
        Func::Max => b.select(b.bin(BinOp::Ge, arg(0), arg(1)), da(0)?, da(1)?),
        Func::Clamp => b.select(
            b.bin(BinOp::Lt, arg(0), arg(1)),
            da(1)?,
            b.select(b.bin(BinOp::Gt, arg(0), arg(2)), da(2)?, da(0)?),
        ),
        // A condition on the score is piecewise constant: only the branches' slopes count.
        Func::Select => b.select(arg(0), da(1)?, da(2)?),
    })
}

/// Node constructors at one span that fold the zeros and ones the chain rule makes.
struct Build<S> {
    at: S,
}

impl<S: Clone> Build<S> {
    fn node(&self, kind: Kind<S>) -> Expr<S> {
        Expr::new(kind, self.at.clone())
    }

    fn float(&self, x: f64) -> Expr<S> {
        self.node(Kind::Lit(Lit::Float(x)))
    }

    fn neg(&self, a: Expr<S>) -> Expr<S> {
        match is(&a, 0.0) {
            true => a,
            false => self.node(Kind::Neg(Box::new(a))),
        }
    }

    fn call(&self, func: Func, args: Vec<Expr<S>>) -> Expr<S> {
        self.node(Kind::Call(func, args))
    }

    fn select(&self, cond: Expr<S>, a: Expr<S>, b: Expr<S>) -> Expr<S> {
        match is(&a, 0.0) && is(&b, 0.0) {
            true => a,
            false => self.call(Func::Select, vec![cond, a, b]),
        }
    }

    fn bin(&self, op: BinOp, l: Expr<S>, r: Expr<S>) -> Expr<S> {
        let (l0, r0, r1, l1) = (is(&l, 0.0), is(&r, 0.0), is(&r, 1.0), is(&l, 1.0));
        match op {
            BinOp::Add if l0 => r,
            BinOp::Add | BinOp::Sub if r0 => l,
            BinOp::Sub if l0 => self.neg(r),
            BinOp::Mul if l0 || r0 => self.float(0.0),
            BinOp::Mul if l1 => r,
            BinOp::Mul | BinOp::Div if r1 => l,
            BinOp::Div if l0 => l,
            _ => self.node(Kind::Bin(op, Box::new(l), Box::new(r))),
        }
    }
}

fn is<S>(e: &Expr<S>, x: f64) -> bool {
    matches!(e.kind, Kind::Lit(Lit::Float(v)) if v == x)
}
