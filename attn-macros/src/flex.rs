//! Rust closures as FlexAttention-style modifiers: `|score, b, h, q, k| expr`
//! and `|b, h, q, k| cond` into [`attn_dsl::flex::Expr`], every node carrying its token's
//! span, then type-checked (and a score modifier differentiated) so that each error is a
//! `syn::Error` at the token to change. Parameters may be renamed (`_`, or a name with a
//! leading `_`, for one the expression does not read); they keep their places, and the
//! body reads them by the names written: a renamed parameter's default name is not bound.

use attn_dsl::flex::typing::{FlexError, Scope, type_of};
use attn_dsl::flex::{BinOp, Expr, Func, Kind, Lit, TensorDecl, Ty, derive};
use proc_macro2::Span;
use syn::spanned::Spanned;

type Node = Expr<Span>;

const LANGUAGE: &str = "a modifier is written in literals, arithmetic (+ - * /), comparisons, \
                        && || !, min max abs clamp exp log tanh sqrt select, `as` casts, \
                        tensor[index] reads, `let` and `if .. else ..`";

/// A closure's body as a modifier: a score modifier (`score`) or a mask, type-checked
/// against `tensors`, a score modifier's derivative taken.
pub fn modifier(
    closure: &syn::ExprClosure,
    score: bool,
    tensors: &[TensorDecl],
) -> syn::Result<Node> {
    let renames = params(closure, score)?;
    let parser = Parser {
        renames,
        lets: Default::default(),
    };
    let body = parser.expr(&closure.body)?;
    let want = if score { Ty::F32 } else { Ty::Bool };
    let got = type_of(&body, &mut Scope::modifier(score, tensors)).map_err(at)?;
    if got != want {
        return Err(syn::Error::new(
            closure.body.span(),
            format!("this modifier returns {}, not {}", got.name(), want.name()),
        ));
    }
    if score {
        derive::d_score(&body).map_err(at)?;
        for t in tensors.iter().filter(|t| t.grad) {
            derive::d_tensor(&body, &t.name).map_err(at)?;
        }
    }
    Ok(body)
}

fn at(e: FlexError<Span>) -> syn::Error {
    syn::Error::new(e.at, e.message)
}

/// The closure's parameter names in place of the canonical ones.
fn params(closure: &syn::ExprClosure, score: bool) -> syn::Result<Vec<(String, &'static str)>> {
    let canonical: Vec<&'static str> = attn_dsl::flex::variables(score)
        .iter()
        .map(|(n, _)| *n)
        .collect();
    if closure.inputs.len() != canonical.len() {
        return Err(syn::Error::new(
            closure.inputs.span(),
            format!("this modifier takes |{}|", canonical.join(", ")),
        ));
    }
    closure
        .inputs
        .iter()
        .zip(canonical)
        .map(|(pat, name)| match pat {
            syn::Pat::Ident(p) => Ok((p.ident.to_string(), name)),
            syn::Pat::Wild(_) => Ok(("_".into(), name)),
            other => Err(syn::Error::new(
                other.span(),
                "a modifier's parameters are plain names",
            )),
        })
        .collect()
}

struct Parser {
    /// Each parameter's written name and its place's canonical name.
    renames: Vec<(String, &'static str)>,
    /// The `let` names of the blocks being parsed, which shadow the parameters.
    lets: std::cell::RefCell<Vec<String>>,
}

impl Parser {
    fn node(&self, kind: Kind<Span>, at: &impl Spanned) -> Node {
        Expr::new(kind, at.span())
    }

    fn expr(&self, e: &syn::Expr) -> syn::Result<Node> {
        match e {
            syn::Expr::Lit(l) => self.lit(&l.lit),
            syn::Expr::Path(p) => self.var(p),
            syn::Expr::Paren(p) => self.expr(&p.expr),
            syn::Expr::Group(g) => self.expr(&g.expr),
            syn::Expr::Unary(u) => self.unary(u),
            syn::Expr::Binary(b) => self.binary(b),
            syn::Expr::Call(c) => self.call(c),
            syn::Expr::Cast(c) => {
                let ty = ty(&c.ty)?;
                Ok(self.node(Kind::Cast(Box::new(self.expr(&c.expr)?), ty), c))
            }
            syn::Expr::Index(i) => self.index(i),
            syn::Expr::Block(b) => self.block(&b.block),
            syn::Expr::If(i) => self.if_else(i),
            other => Err(syn::Error::new(
                other.span(),
                format!("not in the language: {LANGUAGE}"),
            )),
        }
    }

    fn lit(&self, l: &syn::Lit) -> syn::Result<Node> {
        let lit = match l {
            syn::Lit::Float(f) => Lit::Float(f.base10_parse()?),
            syn::Lit::Int(i) => Lit::Int(i.base10_parse()?),
            syn::Lit::Bool(b) => Lit::Bool(b.value),
            other => {
                return Err(syn::Error::new(
                    other.span(),
                    "a modifier's literals are numbers or bools",
                ));
            }
        };
        Ok(self.node(Kind::Lit(lit), l))
    }

    fn var(&self, p: &syn::ExprPath) -> syn::Result<Node> {
        let Some(ident) = p.path.get_ident() else {
            return Err(syn::Error::new(p.span(), "a name here is one word"));
        };
        let name = ident.to_string();
        if self.lets.borrow().contains(&name) {
            return Ok(self.node(Kind::Var(name), p));
        }
        let written: Vec<&str> = self
            .renames
            .iter()
            .map(|(given, _)| given.as_str())
            .collect();
        if let Some((_, canonical)) = self.renames.iter().find(|(given, _)| *given == name) {
            if let Some(bare) = name.strip_prefix('_') {
                return Err(syn::Error::new(
                    ident.span(),
                    format!(
                        "`{name}` starts with `_`, which marks a parameter the modifier does not \
                         read; name it `{bare}` to read it"
                    ),
                ));
            }
            return Ok(self.node(Kind::Var(canonical.to_string()), p));
        }
        if self.renames.iter().any(|(_, canonical)| *canonical == name) {
            return Err(syn::Error::new(
                ident.span(),
                format!(
                    "`{name}` is not a parameter of this closure, which names them |{}|: read \
                     the parameter by the name written there",
                    written.join(", ")
                ),
            ));
        }
        Ok(self.node(Kind::Var(name), p))
    }

    fn unary(&self, u: &syn::ExprUnary) -> syn::Result<Node> {
        let a = Box::new(self.expr(&u.expr)?);
        match u.op {
            syn::UnOp::Neg(_) => Ok(self.node(Kind::Neg(a), u)),
            syn::UnOp::Not(_) => Ok(self.node(Kind::Not(a), u)),
            _ => Err(syn::Error::new(
                u.op.span(),
                format!("not in the language: {LANGUAGE}"),
            )),
        }
    }

    fn binary(&self, b: &syn::ExprBinary) -> syn::Result<Node> {
        use syn::BinOp as B;
        let op = match b.op {
            B::Add(_) => BinOp::Add,
            B::Sub(_) => BinOp::Sub,
            B::Mul(_) => BinOp::Mul,
            B::Div(_) => BinOp::Div,
            B::Lt(_) => BinOp::Lt,
            B::Le(_) => BinOp::Le,
            B::Gt(_) => BinOp::Gt,
            B::Ge(_) => BinOp::Ge,
            B::Eq(_) => BinOp::Eq,
            B::Ne(_) => BinOp::Ne,
            B::And(_) => BinOp::And,
            B::Or(_) => BinOp::Or,
            _ => {
                return Err(syn::Error::new(
                    b.op.span(),
                    format!("not in the language: {LANGUAGE}"),
                ));
            }
        };
        let (l, r) = (self.expr(&b.left)?, self.expr(&b.right)?);
        // The node's span is the operator's, where a type mismatch is reported.
        Ok(self.node(Kind::Bin(op, Box::new(l), Box::new(r)), &b.op))
    }

    fn call(&self, c: &syn::ExprCall) -> syn::Result<Node> {
        let func = match &*c.func {
            syn::Expr::Path(p) => p.path.get_ident().and_then(|i| Func::named(&i.to_string())),
            _ => None,
        };
        let Some(func) = func else {
            let what = match &*c.func {
                syn::Expr::Path(p) => p
                    .path
                    .get_ident()
                    .map_or("this".to_string(), |i| format!("`{i}`")),
                _ => "this".to_string(),
            };
            return Err(syn::Error::new(
                c.func.span(),
                format!(
                    "{what} is not a function of the modifier language: a modifier calls min, \
                     max, abs, clamp, exp, log, tanh, sqrt or select"
                ),
            ));
        };
        let args = c
            .args
            .iter()
            .map(|a| self.expr(a))
            .collect::<syn::Result<_>>()?;
        Ok(self.node(Kind::Call(func, args), &c.func))
    }

    /// `t[i][j]`: one index per dimension, outermost first.
    fn index(&self, i: &syn::ExprIndex) -> syn::Result<Node> {
        let mut at = vec![self.expr(&i.index)?];
        let mut base = &*i.expr;
        while let syn::Expr::Index(inner) = base {
            at.insert(0, self.expr(&inner.index)?);
            base = &inner.expr;
        }
        let name = match base {
            syn::Expr::Path(p) => p.path.get_ident().map(|i| i.to_string()),
            _ => None,
        };
        let Some(name) = name else {
            return Err(syn::Error::new(
                base.span(),
                "only a declared tensor is indexed",
            ));
        };
        Ok(self.node(Kind::Index(name, at), i))
    }

    /// `{ let a = ..; let b = ..; value }`.
    fn block(&self, block: &syn::Block) -> syn::Result<Node> {
        let Some((last, lets)) = block.stmts.split_last() else {
            return Err(syn::Error::new(block.span(), "an empty block has no value"));
        };
        let syn::Stmt::Expr(value, None) = last else {
            return Err(syn::Error::new(
                last.span(),
                "a block ends with its value (no `;`)",
            ));
        };
        // A let's name shadows a parameter's in the block (checked for its place by the
        // typing, which scopes each binding).
        let names: Vec<String> = lets
            .iter()
            .filter_map(|s| match s {
                syn::Stmt::Local(syn::Local {
                    pat: syn::Pat::Ident(p),
                    ..
                }) => Some(p.ident.to_string()),
                _ => None,
            })
            .collect();
        let depth = self.lets.borrow().len();
        self.lets.borrow_mut().extend(names);
        let parsed = self.block_value(value, lets);
        self.lets.borrow_mut().truncate(depth);
        parsed
    }

    fn block_value(&self, value: &syn::Expr, lets: &[syn::Stmt]) -> syn::Result<Node> {
        let mut out = self.expr(value)?;
        for stmt in lets.iter().rev() {
            out = self.binding(stmt, out)?;
        }
        Ok(out)
    }

    fn binding(&self, stmt: &syn::Stmt, body: Node) -> syn::Result<Node> {
        let syn::Stmt::Local(local) = stmt else {
            return Err(syn::Error::new(
                stmt.span(),
                "a block holds `let` bindings, then its value",
            ));
        };
        let (syn::Pat::Ident(name), Some(init)) = (&local.pat, &local.init) else {
            return Err(syn::Error::new(local.span(), "write `let name = value;`"));
        };
        let value = self.expr(&init.expr)?;
        let kind = Kind::Let(name.ident.to_string(), Box::new(value), Box::new(body));
        Ok(self.node(kind, local))
    }

    /// `if c { a } else { b }` as `select(c, a, b)`.
    fn if_else(&self, i: &syn::ExprIf) -> syn::Result<Node> {
        let Some((_, otherwise)) = &i.else_branch else {
            return Err(syn::Error::new(
                i.span(),
                "an `if` in a modifier needs an `else`",
            ));
        };
        let args = vec![
            self.expr(&i.cond)?,
            self.block(&i.then_branch)?,
            self.expr(otherwise)?,
        ];
        Ok(self.node(Kind::Call(Func::Select, args), i))
    }
}

/// The `tensors` block: each name, dims and element type, errors at the token.
pub fn tensors(items: &[crate::parse::TensorItem]) -> syn::Result<Vec<TensorDecl>> {
    items
        .iter()
        .map(|item| {
            let ty = ty(&item.ty)?;
            if !TensorDecl::declarable(ty) {
                return Err(syn::Error::new(
                    item.ty.span(),
                    "a tensor holds f32 or u32 (read a u32 `as i32` where a signed value is \
                     needed)",
                ));
            }
            if let Some(grad) = &item.grad
                && ty != Ty::F32
            {
                return Err(syn::Error::new(
                    grad.span(),
                    "only an f32 tensor has a gradient: drop `grad` or declare it f32",
                ));
            }
            let dims = item.dims.iter().map(dim).collect::<syn::Result<Vec<_>>>()?;
            if dims.is_empty() {
                return Err(syn::Error::new(
                    item.name.span(),
                    "a tensor needs a dimension, e.g. `[heads]`",
                ));
            }
            Ok(TensorDecl {
                name: item.name.to_string(),
                dims,
                ty,
                grad: item.grad.is_some(),
            })
        })
        .collect()
}

/// A dimension: `heads`, `batch`, `seq`, or a positive constant of integer literals.
fn dim(e: &syn::Expr) -> syn::Result<attn_dsl::flex::Dim> {
    use attn_dsl::flex::Dim;
    if let syn::Expr::Path(p) = e
        && let Some(id) = p.path.get_ident()
    {
        return match id.to_string().as_str() {
            "heads" => Ok(Dim::Heads),
            "batch" => Ok(Dim::Batch),
            "seq" => Ok(Dim::Seq),
            other => Err(syn::Error::new(
                id.span(),
                format!(
                    "unknown size `{other}`; a dimension is `heads`, `batch`, `seq` or a number"
                ),
            )),
        };
    }
    let n = constant(e)?;
    u32::try_from(n)
        .ok()
        .filter(|&n| n > 0)
        .map(Dim::Const)
        .ok_or_else(|| {
            syn::Error::new(
                e.span(),
                format!("a dimension of {n} elements; give one of 1 to {}", u32::MAX),
            )
        })
}

/// The value of an integer-literal expression (`2 * 128 - 1`).
fn constant(e: &syn::Expr) -> syn::Result<i64> {
    let bad = || {
        syn::Error::new(
            e.span(),
            "a dimension is `heads`, `batch`, `seq` or whole numbers with + - * /",
        )
    };
    match e {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(i),
            ..
        }) => i.base10_parse().map_err(|_| bad()),
        syn::Expr::Paren(p) => constant(&p.expr),
        syn::Expr::Binary(b) => {
            let (l, r) = (constant(&b.left)?, constant(&b.right)?);
            let v = match b.op {
                syn::BinOp::Add(_) => l.checked_add(r),
                syn::BinOp::Sub(_) => l.checked_sub(r),
                syn::BinOp::Mul(_) => l.checked_mul(r),
                syn::BinOp::Div(_) => l.checked_div(r),
                _ => None,
            };
            v.ok_or_else(bad)
        }
        _ => Err(bad()),
    }
}

fn ty(t: &syn::Type) -> syn::Result<Ty> {
    let name = match t {
        syn::Type::Path(p) => p.path.get_ident().map(|i| i.to_string()),
        _ => None,
    };
    match name.as_deref() {
        Some("f32") => Ok(Ty::F32),
        Some("i32") => Ok(Ty::I32),
        Some("u32") => Ok(Ty::U32),
        _ => Err(syn::Error::new(t.span(), "a cast goes to f32, i32 or u32")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_dsl::flex::Dim;
    use syn::parse_quote;

    fn decls() -> Vec<TensorDecl> {
        vec![
            TensorDecl {
                name: "rel_bias".into(),
                dims: vec![Dim::Heads, Dim::Const(255)],
                ty: Ty::F32,
                grad: true,
            },
            TensorDecl {
                name: "prefix".into(),
                dims: vec![Dim::Batch],
                ty: Ty::I32,
                grad: false,
            },
        ]
    }

    fn score_mod(c: syn::ExprClosure) -> syn::Result<Node> {
        modifier(&c, true, &decls())
    }

    fn mask_mod(c: syn::ExprClosure) -> syn::Result<Node> {
        modifier(&c, false, &decls())
    }

    #[test]
    fn the_examples_parse_and_check() {
        let t5 = score_mod(parse_quote!(|s, _b, h, q, k| {
            let d = clamp(q - k, -127, 127);
            s + rel_bias[h][d + 127]
        }))
        .unwrap();
        // The renamed score reads as `score`; the let stays until lowering.
        assert!(t5.mentions("score"));
        assert!(matches!(t5.kind, Kind::Let(..)));
        score_mod(parse_quote!(|score, b, h, q, k| 30.0 * tanh(score / 30.0))).unwrap();
        score_mod(parse_quote!(|score, b, h, q, k| if score > 0.0 {
            score
        } else {
            0.5 * score
        }))
        .unwrap();
        mask_mod(parse_quote!(|b, h, q, k| k <= q || k < prefix[b])).unwrap();
        mask_mod(parse_quote!(|b, h, q, k| (k <= q && q - k < 256) || k < 4)).unwrap();
    }

    /// Each error is reported at the token to change, with what to write instead.
    #[test]
    fn errors_point_at_the_token() {
        let cases: Vec<(syn::Result<Node>, &str)> = vec![
            (
                score_mod(parse_quote!(|score, b, h, q, k| score + qq)),
                "unknown name `qq`",
            ),
            (
                score_mod(parse_quote!(|score, b, h, q, k| score + q)),
                "cast one with `as`",
            ),
            (
                score_mod(parse_quote!(|score, b, h, q, k| score + rel_bias[h])),
                "2 dimension(s)",
            ),
            (
                score_mod(parse_quote!(|score, b, h, q, k| score % 2.0)),
                "not in the language",
            ),
            (
                score_mod(parse_quote!(|score, b, h, q, k| score.abs())),
                "not in the language",
            ),
            (
                score_mod(parse_quote!(|score, b, h, q, k| powf(score, 2.0))),
                "a modifier calls",
            ),
            (
                score_mod(parse_quote!(|score, b, h| score)),
                "takes |score, b, h, q, k|",
            ),
            (
                score_mod(parse_quote!(|score, b, h, q, k| q < k)),
                "returns bool, not f32",
            ),
            (
                score_mod(parse_quote!(
                    |score, b, h, q, k| score + (score as i32) as f32
                )),
                "cannot differentiate",
            ),
            (
                mask_mod(parse_quote!(|b, h, q, k| score > 0.0)),
                "unknown name `score`",
            ),
            (
                mask_mod(parse_quote!(|b, h, q, k| if k < q {
                    true
                })),
                "needs an `else`",
            ),
        ];
        for (got, want) in cases {
            let err = got.expect_err(want).to_string();
            assert!(err.contains(want), "{err:?} lacks {want:?}");
        }
    }

    /// A mismatch is reported at its operator, not at the whole expression.
    #[test]
    fn a_mismatch_is_reported_at_the_operator() {
        let c: syn::ExprClosure = parse_quote!(|score, b, h, q, k| score * 2.0 + q);
        let err = score_mod(c.clone()).unwrap_err();
        let syn::Expr::Binary(sum) = &*c.body else {
            panic!()
        };
        assert_eq!(format!("{:?}", err.span()), format!("{:?}", sum.op.span()));
    }
}
