//! The types of a modifier expression: every operator takes operands of one type (casts
//! are written out, as in WGSL), conditions are bools, tensors are read at one integer
//! index per dimension.

use super::{BinOp, Dim, Expr, Func, Kind, Lit, TensorDecl, Ty};

/// What is wrong with an expression, at the node that is wrong.
#[derive(Clone, Debug, PartialEq)]
pub struct FlexError<S> {
    /// Where the node came from: the token a macro error points at.
    pub at: S,
    /// What is wrong and what to write instead.
    pub message: String,
}

impl<S: std::fmt::Debug> std::fmt::Display for FlexError<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl<S: std::fmt::Debug> std::error::Error for FlexError<S> {}

/// The names in scope and the declared tensors.
pub struct Scope<'a> {
    vars: Vec<(String, Ty)>,
    tensors: &'a [TensorDecl],
}

impl<'a> Scope<'a> {
    /// A score modifier's scope (`score`, b, h, q, k) or a mask's (b, h, q, k).
    pub fn modifier(score: bool, tensors: &'a [TensorDecl]) -> Scope<'a> {
        let vars = super::variables(score)
            .into_iter()
            .map(|(n, t)| (n.to_string(), t))
            .collect();
        Scope { vars, tensors }
    }

    fn lookup(&self, name: &str) -> Option<Ty> {
        self.vars
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, t)| *t)
    }

    fn names(&self) -> String {
        let vars = self.vars.iter().map(|(n, _)| n.as_str());
        let tensors = self.tensors.iter().map(|t| t.name.as_str());
        vars.chain(tensors).collect::<Vec<_>>().join(", ")
    }
}

/// The type of `e` in `scope`.
pub fn type_of<S: Clone>(e: &Expr<S>, scope: &mut Scope) -> Result<Ty, FlexError<S>> {
    let fail = |message: String| FlexError {
        at: e.at.clone(),
        message,
    };
    match &e.kind {
        Kind::Lit(Lit::Float(x)) if !(*x as f32).is_finite() => {
            Err(fail(format!("{x} is past f32's range")))
        }
        Kind::Lit(Lit::Int(x)) if i32::try_from(*x).is_err() => {
            Err(fail(format!("{x} is past i32's range")))
        }
        Kind::Lit(Lit::Float(_)) => Ok(Ty::F32),
        Kind::Lit(Lit::Int(_)) => Ok(Ty::I32),
        Kind::Lit(Lit::Bool(_)) => Ok(Ty::Bool),
        Kind::Var(name) => scope.lookup(name).ok_or_else(|| {
            fail(format!(
                "unknown name `{name}`: a modifier reads {}",
                scope.names()
            ))
        }),
        Kind::Neg(a) => match type_of(a, scope)? {
            t @ (Ty::F32 | Ty::I32) => Ok(t),
            t => Err(fail(format!("`-` negates f32 or i32, not {}", t.name()))),
        },
        Kind::Not(a) => match type_of(a, scope)? {
            Ty::Bool => Ok(Ty::Bool),
            t => Err(fail(format!("`!` takes a bool, not {}", t.name()))),
        },
        Kind::Bin(op, l, r) => binary(*op, type_of(l, scope)?, type_of(r, scope)?).map_err(fail),
        Kind::Call(func, args) => {
            if args.len() != func.arity() {
                return Err(fail(format!(
                    "`{}` takes {} argument(s), not {}",
                    func.name(),
                    func.arity(),
                    args.len()
                )));
            }
            let tys = args
                .iter()
                .map(|a| type_of(a, scope))
                .collect::<Result<Vec<_>, _>>()?;
            call(*func, &tys).map_err(fail)
        }
        Kind::Cast(a, to) => match (type_of(a, scope)?, to) {
            (from, to) if from.is_number() && to.is_number() => Ok(*to),
            (from, to) => Err(fail(format!(
                "no cast from {} to {}: casts go between f32, i32 and u32",
                from.name(),
                to.name()
            ))),
        },
        Kind::Index(name, idx) => {
            for i in idx {
                match type_of(i, scope)? {
                    Ty::I32 | Ty::U32 => {}
                    t => {
                        return Err(FlexError {
                            at: i.at.clone(),
                            message: format!("`{name}` is indexed by i32 or u32, not {}", t.name()),
                        });
                    }
                }
            }
            let ty = tensor(name, idx.len(), scope.tensors).map_err(fail)?;
            constant_in_range(name, idx, scope.tensors)?;
            Ok(ty)
        }
        Kind::Let(name, value, body) => {
            let ty = type_of(value, scope)?;
            scope.vars.push((name.clone(), ty));
            let out = type_of(body, scope);
            scope.vars.pop();
            out
        }
    }
}

/// A literal index outside a dimension of constant size is an error at the literal (one
/// known only at run time reads 0 there, as every kernel does).
fn constant_in_range<S: Clone>(
    name: &str,
    idx: &[Expr<S>],
    tensors: &[TensorDecl],
) -> Result<(), FlexError<S>> {
    let Some(decl) = tensors.iter().find(|t| t.name == name) else {
        return Ok(());
    };
    for (place, (i, dim)) in idx.iter().zip(&decl.dims).enumerate() {
        if let (Kind::Lit(Lit::Int(at)), Dim::Const(len)) = (&i.kind, dim)
            && (*at < 0 || *at >= i64::from(*len))
        {
            return Err(FlexError {
                at: i.at.clone(),
                message: format!(
                    "index {at} is outside `{name}`'s dimension {place}, which holds {len} \
                     (0..{len})"
                ),
            });
        }
    }
    Ok(())
}

fn binary(op: BinOp, l: Ty, r: Ty) -> Result<Ty, String> {
    let sym = op.symbol();
    if op.logical() {
        return match (l, r) {
            (Ty::Bool, Ty::Bool) => Ok(Ty::Bool),
            _ => Err(format!(
                "`{sym}` joins two bools, not {} and {}",
                l.name(),
                r.name()
            )),
        };
    }
    if l != r || !l.is_number() {
        return Err(format!(
            "`{sym}` needs two numbers of one type, not {} and {}: cast one with `as`",
            l.name(),
            r.name()
        ));
    }
    Ok(if op.compares() { Ty::Bool } else { l })
}

fn call(func: Func, tys: &[Ty]) -> Result<Ty, String> {
    let name = func.name();
    let all_same = |tys: &[Ty]| tys.iter().all(|t| *t == tys[0] && t.is_number());
    match func {
        Func::Exp | Func::Log | Func::Tanh | Func::Sqrt => match tys[0] {
            Ty::F32 => Ok(Ty::F32),
            t => Err(format!("`{name}` takes an f32, not {}", t.name())),
        },
        Func::Abs | Func::Min | Func::Max | Func::Clamp if all_same(tys) => Ok(tys[0]),
        Func::Abs | Func::Min | Func::Max | Func::Clamp => Err(format!(
            "`{name}` takes numbers of one type, not {}",
            names(tys)
        )),
        Func::Select if tys[0] == Ty::Bool && tys[1] == tys[2] => Ok(tys[1]),
        Func::Select => Err(format!(
            "`select(cond, a, b)` takes a bool and two values of one type, not {}",
            names(tys)
        )),
    }
}

fn names(tys: &[Ty]) -> String {
    tys.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
}

/// The element type of declared tensor `name` read at `rank` indices.
fn tensor(name: &str, rank: usize, tensors: &[TensorDecl]) -> Result<Ty, String> {
    let Some(decl) = tensors.iter().find(|t| t.name == name) else {
        return Err(format!(
            "`{name}` is not a declared tensor: declare it in `tensors: {{ .. }}` to read it"
        ));
    };
    match decl.dims.len() == rank {
        true => Ok(decl.ty),
        false => Err(format!(
            "`{name}` has {} dimension(s), read here at {rank}",
            decl.dims.len()
        )),
    }
}
