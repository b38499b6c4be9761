//! A modifier expression evaluated on the CPU, for the f64 reference: floats in f64,
//! integers with WGSL's 32-bit wrapping (and its `x / 0 = x`), so that the reference
//! and the kernels agree on every index a modifier computes.

use super::{BinOp, Expr, Func, Kind, Lit, Ty};

/// A node's value, by its type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    /// An f32 value, held in f64 (or rounded to f32 by [`Env::rounding`]).
    F(f64),
    /// An i32, wrapping as WGSL's does.
    I(i32),
    /// A u32, wrapping as WGSL's does.
    U(u32),
    /// A bool.
    B(bool),
}

/// Where the evaluator reads the declared tensors (values of their declared types): `None`
/// for a tensor it does not hold. An index outside a dimension reads 0, as the kernels do.
pub trait Tensors {
    /// The element of tensor `name` at `index` (one per dimension), `None` where the
    /// tensor is not held here.
    fn read(&self, name: &str, index: &[i64]) -> Option<Value>;
}

/// The variables' values: `score` (where it is one) and b, h, q, k.
pub struct Env<'a> {
    vars: Vec<(String, Value)>,
    tensors: &'a dyn Tensors,
    /// Applied to every float a node computes: the identity for f64, or a rounding to f32
    /// for the f32 baseline that computes the modifier as a kernel does.
    round: fn(f64) -> f64,
}

impl<'a> Env<'a> {
    /// The variables of one (query, key) pair: `score` for a score modifier (`None` for a
    /// mask), then b, h, q, k; tensors read from `tensors`; floats kept in f64.
    pub fn new(score: Option<f64>, [b, h, q, k]: [i32; 4], tensors: &'a dyn Tensors) -> Env<'a> {
        let mut vars: Vec<(String, Value)> = [("b", b), ("h", h), ("q", q), ("k", k)]
            .into_iter()
            .map(|(n, v)| (n.to_string(), Value::I(v)))
            .collect();
        vars.extend(score.map(|s| ("score".to_string(), Value::F(s))));
        Env {
            vars,
            tensors,
            round: |x| x,
        }
    }

    /// Every float node's value passed through `round`.
    pub fn rounding(mut self, round: fn(f64) -> f64) -> Env<'a> {
        self.round = round;
        self
    }
}

/// `e`'s value (an expression that passed [`super::typing::type_of`]); an error names an
/// out-of-range tensor read.
pub fn eval<S>(e: &Expr<S>, env: &mut Env) -> Result<Value, String> {
    Ok(match node(e, env)? {
        Value::F(x) => Value::F((env.round)(x)),
        v => v,
    })
}

fn node<S>(e: &Expr<S>, env: &mut Env) -> Result<Value, String> {
    use Value::*;
    Ok(match &e.kind {
        Kind::Lit(Lit::Float(x)) => F(*x),
        Kind::Lit(Lit::Int(x)) => I(*x as i32),
        Kind::Lit(Lit::Bool(x)) => B(*x),
        Kind::Var(name) => env
            .vars
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .ok_or_else(|| format!("unknown name `{name}`"))?,
        Kind::Neg(a) => match eval(a, env)? {
            F(x) => F(-x),
            I(x) => I(x.wrapping_neg()),
            v => return Err(format!("cannot negate {v:?}")),
        },
        Kind::Not(a) => B(!bool_of(eval(a, env)?)?),
        Kind::Bin(op, l, r) => binary(*op, eval(l, env)?, eval(r, env)?)?,
        Kind::Call(func, args) => {
            let vals = args
                .iter()
                .map(|a| eval(a, env))
                .collect::<Result<Vec<_>, _>>()?;
            call(*func, &vals)?
        }
        Kind::Cast(a, ty) => cast(eval(a, env)?, *ty),
        Kind::Index(name, idx) => {
            let at = idx
                .iter()
                .map(|i| eval(i, env).and_then(int_of))
                .collect::<Result<Vec<_>, _>>()?;
            env.tensors
                .read(name, &at)
                .ok_or_else(|| format!("`{name}` read outside its bounds at {at:?}"))?
        }
        Kind::Let(name, value, body) => {
            let v = eval(value, env)?;
            env.vars.push((name.clone(), v));
            let out = eval(body, env);
            env.vars.pop();
            out?
        }
    })
}

fn bool_of(v: Value) -> Result<bool, String> {
    match v {
        Value::B(b) => Ok(b),
        v => Err(format!("{v:?} is not a bool")),
    }
}

fn int_of(v: Value) -> Result<i64, String> {
    match v {
        Value::I(x) => Ok(x.into()),
        Value::U(x) => Ok(x.into()),
        v => Err(format!("{v:?} is not an index")),
    }
}

fn cast(v: Value, ty: Ty) -> Value {
    use Value::*;
    let x = match v {
        F(x) => x,
        I(x) => x.into(),
        U(x) => x.into(),
        B(b) => f64::from(u8::from(b)),
    };
    match ty {
        Ty::F32 => F(x),
        // WGSL's float-to-integer conversion saturates; integer to integer keeps the bits.
        Ty::I32 => match v {
            U(u) => I(u as i32),
            _ => I(x as i32),
        },
        Ty::U32 => match v {
            I(i) => U(i as u32),
            _ => U(x as u32),
        },
        Ty::Bool => B(x != 0.0),
    }
}

fn binary(op: BinOp, l: Value, r: Value) -> Result<Value, String> {
    use Value::*;
    Ok(match (l, r) {
        (B(a), B(b)) if op.logical() => B(if op == BinOp::And { a && b } else { a || b }),
        (F(a), F(b)) => arith(op, a, b, F, |a, b| a / b),
        (I(a), I(b)) => arith_int(op, a.into(), b.into(), |x| I(x as i32)),
        (U(a), U(b)) => arith_int(op, a.into(), b.into(), |x| U(x as u32)),
        (l, r) => return Err(format!("`{}` on {l:?} and {r:?}", op.symbol())),
    })
}

fn arith(
    op: BinOp,
    a: f64,
    b: f64,
    wrap: impl Fn(f64) -> Value,
    div: impl Fn(f64, f64) -> f64,
) -> Value {
    match op {
        BinOp::Add => wrap(a + b),
        BinOp::Sub => wrap(a - b),
        BinOp::Mul => wrap(a * b),
        BinOp::Div => wrap(div(a, b)),
        BinOp::Lt => Value::B(a < b),
        BinOp::Le => Value::B(a <= b),
        BinOp::Gt => Value::B(a > b),
        BinOp::Ge => Value::B(a >= b),
        BinOp::Eq => Value::B(a == b),
        BinOp::Ne => Value::B(a != b),
        BinOp::And | BinOp::Or => unreachable!("typed: logical operators take bools"),
    }
}

/// Integer arithmetic in i64 (exact for 32-bit operands), wrapped back by `wrap`; WGSL
/// divides by zero to the dividend.
fn arith_int(op: BinOp, a: i64, b: i64, wrap: impl Fn(i64) -> Value) -> Value {
    match op {
        BinOp::Add => wrap(a + b),
        BinOp::Sub => wrap(a - b),
        BinOp::Mul => wrap(a.wrapping_mul(b)),
        BinOp::Div if b == 0 => wrap(a),
        BinOp::Div => wrap(a / b),
        _ => arith(
            op,
            a as f64,
            b as f64,
            |_| unreachable!("a comparison"),
            |a, _| a,
        ),
    }
}

fn call(func: Func, v: &[Value]) -> Result<Value, String> {
    use Value::*;
    let f = |i: usize| match v[i] {
        F(x) => Ok(x),
        I(x) => Ok(x.into()),
        U(x) => Ok(x.into()),
        B(_) => Err(format!("`{}` of a bool", func.name())),
    };
    let same = |x: f64| match v[0] {
        F(_) => F(x),
        I(_) => I(x as i32),
        _ => U(x as u32),
    };
    Ok(match func {
        Func::Exp => F(f(0)?.exp()),
        Func::Log => F(f(0)?.ln()),
        Func::Tanh => F(f(0)?.tanh()),
        Func::Sqrt => F(f(0)?.sqrt()),
        Func::Abs => same(f(0)?.abs()),
        Func::Min => same(f(0)?.min(f(1)?)),
        Func::Max => same(f(0)?.max(f(1)?)),
        Func::Clamp => same(f(0)?.max(f(1)?).min(f(2)?)),
        Func::Select => match bool_of(v[0])? {
            true => v[1],
            false => v[2],
        },
    })
}
