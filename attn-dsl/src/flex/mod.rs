//! FlexAttention-style modifier expressions: the small, closed language of a
//! user's `score_mod: |score, b, h, q, k| ..` and `mask_mod: |b, h, q, k| ..`. This module
//! holds the expression tree, its types ([`typing`]), its derivative with respect to the
//! score ([`derive`](mod@derive)) and an f64 evaluator ([`eval`]) for the CPU reference; the WGSL
//! lowering is the emitter's (`emit::flex`). The macro parses Rust syntax into [`Expr`],
//! carrying each token's span as `S`, so that every error points at its token.
//!
//! The variables: `score` (f32, score modifiers only), and `b`, `h`, `q`, `k` (i32: the
//! sequence of the batch, the query head, the query's and the key's positions; signed, so
//! that `q - k` is a distance). Tensors declared beside the modifiers are read by indexing
//! (`rel_bias[h, q - k + 127]`).

pub mod bounds;
pub mod derive;
pub mod eval;
pub mod library;
mod modifiers;
pub mod typing;

pub use modifiers::{BLOCK_EMPTY, BLOCK_FULL, BLOCK_PARTIAL, Flex, FlexRef, MASK_BLOCK, same_str};
use serde::{Deserialize, Serialize};

/// A value's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ty {
    /// A float: the score, float literals, f32 tensors.
    F32,
    /// A signed integer: b, h, q, k and integer literals, so that `q - k` is a distance.
    I32,
    /// An unsigned integer: u32 tensors.
    U32,
    /// A mask's value and a comparison's.
    Bool,
}

impl Ty {
    /// The type's name in WGSL and in error messages.
    pub fn name(self) -> &'static str {
        match self {
            Ty::F32 => "f32",
            Ty::I32 => "i32",
            Ty::U32 => "u32",
            Ty::Bool => "bool",
        }
    }

    /// Whether arithmetic takes it: every type but `bool`.
    pub fn is_number(self) -> bool {
        self != Ty::Bool
    }
}

/// A literal as written.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Lit {
    /// A float literal, typed f32.
    Float(f64),
    /// An integer literal, typed i32.
    Int(i64),
    /// `true` or `false`.
    Bool(bool),
}

/// The binary operators: arithmetic on numbers of one type, comparisons, and `&&`, `||`
/// on bools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BinOp {
    /// `+`.
    Add,
    /// `-`.
    Sub,
    /// `*`.
    Mul,
    /// `/`: an integer division by 0 gives its dividend, as in WGSL.
    Div,
    /// `<`.
    Lt,
    /// `<=`.
    Le,
    /// `>`.
    Gt,
    /// `>=`.
    Ge,
    /// `==`.
    Eq,
    /// `!=`.
    Ne,
    /// `&&`.
    And,
    /// `||`.
    Or,
}

impl BinOp {
    /// The operator as Rust and WGSL write it.
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::And => "&&",
            BinOp::Or => "||",
        }
    }

    /// Whether it compares two numbers into a bool.
    pub fn compares(self) -> bool {
        matches!(
            self,
            BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::Eq | BinOp::Ne
        )
    }

    /// Whether it joins two bools (`&&`, `||`).
    pub fn logical(self) -> bool {
        matches!(self, BinOp::And | BinOp::Or)
    }
}

/// The functions an expression may call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Func {
    /// `min(a, b)`.
    Min,
    /// `max(a, b)`.
    Max,
    /// `abs(x)`.
    Abs,
    /// `clamp(x, lo, hi)`.
    Clamp,
    /// `exp(x)`, on floats.
    Exp,
    /// `log(x)`, the natural logarithm, on floats.
    Log,
    /// `tanh(x)`, on floats.
    Tanh,
    /// `sqrt(x)`, on floats.
    Sqrt,
    /// `select(cond, a, b)`: `a` where `cond` holds, else `b` (what `if .. else ..` becomes).
    Select,
}

impl Func {
    /// Every function, for lookups by name.
    pub const ALL: [Func; 9] = [
        Func::Min,
        Func::Max,
        Func::Abs,
        Func::Clamp,
        Func::Exp,
        Func::Log,
        Func::Tanh,
        Func::Sqrt,
        Func::Select,
    ];

    /// The function's name, as a modifier calls it.
    pub fn name(self) -> &'static str {
        match self {
            Func::Min => "min",
            Func::Max => "max",
            Func::Abs => "abs",
            Func::Clamp => "clamp",
            Func::Exp => "exp",
            Func::Log => "log",
            Func::Tanh => "tanh",
            Func::Sqrt => "sqrt",
            Func::Select => "select",
        }
    }

    /// The function a modifier calls by `name`, `None` for one outside the language.
    pub fn named(name: &str) -> Option<Func> {
        Func::ALL.into_iter().find(|f| f.name() == name)
    }

    /// How many arguments it takes.
    pub fn arity(self) -> usize {
        match self {
            Func::Abs | Func::Exp | Func::Log | Func::Tanh | Func::Sqrt => 1,
            Func::Min | Func::Max => 2,
            Func::Clamp | Func::Select => 3,
        }
    }
}

/// An expression node and where it came from (a span in the macro, `()` elsewhere).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound(serialize = "", deserialize = "S: Default"))]
pub struct Expr<S = ()> {
    /// What the node computes, its children inside.
    pub kind: Kind<S>,
    /// Where it came from, for errors (not serialized).
    #[serde(skip)]
    pub at: S,
}

/// The node kinds of a modifier expression.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound(serialize = "", deserialize = "S: Default"))]
pub enum Kind<S> {
    /// A literal.
    Lit(Lit),
    /// A variable (`score`, b, h, q, k) or a `let` name, by its canonical name.
    Var(String),
    /// `-x`.
    Neg(Box<Expr<S>>),
    /// `!x`.
    Not(Box<Expr<S>>),
    /// `l op r`.
    Bin(BinOp, Box<Expr<S>>, Box<Expr<S>>),
    /// A function applied to its arguments.
    Call(Func, Vec<Expr<S>>),
    /// `x as ty`.
    Cast(Box<Expr<S>>, Ty),
    /// A declared tensor read at one index per dimension.
    Index(String, Vec<Expr<S>>),
    /// `let name = value; body`.
    Let(String, Box<Expr<S>>, Box<Expr<S>>),
}

/// A tensor a modifier may read: its dimensions (row-major) and element type.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorDecl {
    /// The name the modifiers index it by, and its binding's.
    pub name: String,
    /// Its dimensions, outermost first.
    pub dims: Vec<Dim>,
    /// Its element type (a declaration takes f32 or u32).
    pub ty: Ty,
    /// Declared `grad`: the backward writes its gradient, `d<name>` of the same shape
    /// (learnable, like a T5 relative bias). Left out of the JSON when off, so that a
    /// description without it keeps its canonical text.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub grad: bool,
}

/// A dimension of a declared tensor: a constant or one of the problem's sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Dim {
    /// A fixed size, given in the description.
    Const(u32),
    /// The problem's query heads.
    Heads,
    /// The problem's sequences.
    Batch,
    /// The problem's sequence length.
    Seq,
}

/// The variables of a modifier, and their types.
pub fn variables(score: bool) -> Vec<(&'static str, Ty)> {
    let mut vars = vec![
        ("b", Ty::I32),
        ("h", Ty::I32),
        ("q", Ty::I32),
        ("k", Ty::I32),
    ];
    if score {
        vars.insert(0, ("score", Ty::F32));
    }
    vars
}

impl<S: Clone> Expr<S> {
    /// A node of `kind` from `at`.
    pub fn new(kind: Kind<S>, at: S) -> Expr<S> {
        Expr { kind, at }
    }

    /// The same tree with every `let` substituted into its body.
    pub fn inlined(&self) -> Expr<S> {
        match &self.kind {
            Kind::Let(name, value, body) => body.inlined().substituted(name, &value.inlined()),
            _ => self.map_children(|e| e.inlined()),
        }
    }

    /// Every free occurrence of `name` replaced by `value` (lets already inlined).
    pub(crate) fn substituted(&self, name: &str, value: &Expr<S>) -> Expr<S> {
        match &self.kind {
            Kind::Var(v) if v == name => value.clone(),
            _ => self.map_children(|e| e.substituted(name, value)),
        }
    }

    /// This node with `f` applied to each direct child.
    fn map_children(&self, f: impl Fn(&Expr<S>) -> Expr<S>) -> Expr<S> {
        let b = |e: &Expr<S>| Box::new(f(e));
        let kind = match &self.kind {
            Kind::Lit(_) | Kind::Var(_) => self.kind.clone(),
            Kind::Neg(a) => Kind::Neg(b(a)),
            Kind::Not(a) => Kind::Not(b(a)),
            Kind::Bin(op, l, r) => Kind::Bin(*op, b(l), b(r)),
            Kind::Call(func, args) => Kind::Call(*func, args.iter().map(&f).collect()),
            Kind::Cast(a, ty) => Kind::Cast(b(a), *ty),
            Kind::Index(t, idx) => Kind::Index(t.clone(), idx.iter().map(&f).collect()),
            Kind::Let(n, v, body) => Kind::Let(n.clone(), b(v), b(body)),
        };
        Expr::new(kind, self.at.clone())
    }

    /// `f` on every node, parents before children, left to right.
    pub fn visit(&self, f: &mut impl FnMut(&Expr<S>)) {
        f(self);
        match &self.kind {
            Kind::Lit(_) | Kind::Var(_) => {}
            Kind::Neg(a) | Kind::Not(a) | Kind::Cast(a, _) => a.visit(f),
            Kind::Bin(_, l, r) => {
                l.visit(f);
                r.visit(f);
            }
            Kind::Call(_, args) | Kind::Index(_, args) => args.iter().for_each(|a| a.visit(f)),
            Kind::Let(_, v, body) => {
                v.visit(f);
                body.visit(f);
            }
        }
    }

    /// The tree with the `n`-th read of tensor `name` (in [`Expr::visit`]'s order) replaced
    /// by the variable `var`.
    pub(crate) fn marking(&self, name: &str, n: usize, var: &str) -> Expr<S> {
        let mut seen = 0;
        self.marking_from(name, n, var, &mut seen)
    }

    fn marking_from(&self, name: &str, n: usize, var: &str, seen: &mut usize) -> Expr<S> {
        if let Kind::Index(t, _) = &self.kind
            && t == name
        {
            *seen += 1;
            if *seen == n + 1 {
                return Expr::new(Kind::Var(var.into()), self.at.clone());
            }
        }
        // Children in visit order: a node's own read counts before those in its indices.
        let seen = std::cell::RefCell::new(seen);
        self.map_children(|c| c.marking_from(name, n, var, &mut seen.borrow_mut()))
    }

    /// Whether the tree reads tensor `name`.
    pub fn mentions_tensor(&self, name: &str) -> bool {
        let mut found = false;
        self.visit(&mut |e| found |= matches!(&e.kind, Kind::Index(t, _) if t == name));
        found
    }

    /// Whether `name` occurs in the tree.
    pub fn mentions(&self, name: &str) -> bool {
        match &self.kind {
            Kind::Lit(_) => false,
            Kind::Var(v) => v == name,
            Kind::Neg(a) | Kind::Not(a) | Kind::Cast(a, _) => a.mentions(name),
            Kind::Bin(_, l, r) => l.mentions(name) || r.mentions(name),
            Kind::Call(_, args) | Kind::Index(_, args) => args.iter().any(|a| a.mentions(name)),
            Kind::Let(_, v, body) => v.mentions(name) || body.mentions(name),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::eval::{Env, Tensors, Value, eval};
    use super::typing::{Scope, type_of};
    use super::*;

    pub use super::library::build::*;

    /// The declared tensors of the examples: ALiBi slopes, a T5 relative bias and
    /// per-sequence prefix lengths.
    pub fn decls() -> Vec<TensorDecl> {
        vec![
            TensorDecl {
                name: "slopes".into(),
                dims: vec![Dim::Heads],
                ty: Ty::F32,
                grad: false,
            },
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

    /// Example score modifiers, for the tests of the language and its WGSL.
    pub fn score_mods() -> Vec<(&'static str, Expr)> {
        use BinOp::*;
        let distance = call(Func::Abs, vec![bin(Sub, v("q"), v("k"))]);
        vec![
            (
                "softcap",
                bin(
                    Mul,
                    f(30.0),
                    call(Func::Tanh, vec![bin(Div, v("score"), f(30.0))]),
                ),
            ),
            (
                "alibi",
                bin(
                    Sub,
                    v("score"),
                    bin(Mul, idx("slopes", vec![v("h")]), cast(distance, Ty::F32)),
                ),
            ),
            (
                "t5",
                let_(
                    "d",
                    call(Func::Clamp, vec![bin(Sub, v("q"), v("k")), i(-127), i(127)]),
                    bin(
                        Add,
                        v("score"),
                        idx("rel_bias", vec![v("h"), bin(Add, v("d"), i(127))]),
                    ),
                ),
            ),
            (
                "softcap over alibi",
                let_(
                    "s",
                    bin(
                        Sub,
                        v("score"),
                        bin(Mul, idx("slopes", vec![v("h")]), f(0.5)),
                    ),
                    bin(
                        Mul,
                        f(20.0),
                        call(Func::Tanh, vec![bin(Div, v("s"), f(20.0))]),
                    ),
                ),
            ),
            (
                "piecewise",
                call(
                    Func::Select,
                    vec![
                        bin(Gt, v("score"), f(0.0)),
                        call(Func::Sqrt, vec![bin(Add, v("score"), f(1.0))]),
                        bin(
                            Add,
                            call(Func::Exp, vec![v("score")]),
                            call(Func::Max, vec![v("score"), f(-2.0)]),
                        ),
                    ],
                ),
            ),
        ]
    }

    /// Mask modifiers: prefix-LM, sliding window with sink tokens, block-diagonal.
    pub fn mask_mods() -> Vec<(&'static str, Expr)> {
        use BinOp::*;
        vec![
            (
                "prefix lm",
                bin(
                    Or,
                    bin(Le, v("k"), v("q")),
                    bin(Lt, v("k"), idx("prefix", vec![v("b")])),
                ),
            ),
            (
                "window + sinks",
                bin(
                    Or,
                    bin(
                        And,
                        bin(Le, v("k"), v("q")),
                        bin(Lt, bin(Sub, v("q"), v("k")), i(256)),
                    ),
                    bin(Lt, v("k"), i(4)),
                ),
            ),
            (
                "block diagonal",
                bin(Eq, bin(Div, v("q"), i(64)), bin(Div, v("k"), i(64))),
            ),
        ]
    }

    pub struct Data;
    impl Tensors for Data {
        fn read(&self, name: &str, at: &[i64]) -> Option<Value> {
            let flat = at.iter().fold(0i64, |acc, &i| acc * 255 + i);
            match name {
                "prefix" => Some(Value::I(7 + at[0] as i32)),
                _ => Some(Value::F(0.01 * flat as f64 - 0.3)),
            }
        }
    }

    fn ty(e: &Expr, score: bool) -> Result<Ty, String> {
        let decls = decls();
        type_of(e, &mut Scope::modifier(score, &decls)).map_err(|e| e.message)
    }

    #[test]
    fn the_examples_type_check() {
        for (name, e) in score_mods() {
            assert_eq!(ty(&e, true), Ok(Ty::F32), "{name}");
        }
        for (name, e) in mask_mods() {
            assert_eq!(ty(&e, false), Ok(Ty::Bool), "{name}");
        }
    }

    /// Each error names what to change.
    #[test]
    fn errors_say_what_is_wrong() {
        use BinOp::*;
        let cases = [
            (bin(Add, v("score"), v("scor")), "unknown name `scor`"),
            (bin(Add, v("score"), v("q")), "cast one with `as`"),
            (
                idx("rel_bias", vec![v("h")]),
                "has 2 dimension(s), read here at 1",
            ),
            (idx("bias", vec![v("h")]), "`bias` is not a declared tensor"),
            (
                idx("slopes", vec![v("score")]),
                "indexed by i32 or u32, not f32",
            ),
            (
                call(Func::Exp, vec![v("score"), f(1.0)]),
                "takes 1 argument(s), not 2",
            ),
            (call(Func::Exp, vec![v("q")]), "takes an f32, not i32"),
            (bin(And, v("q"), v("k")), "joins two bools"),
            (i(1 << 40), "past i32's range"),
        ];
        for (e, want) in cases {
            let got = ty(&e, true).unwrap_err();
            assert!(got.contains(want), "{got:?} lacks {want:?}");
        }
        // `score` is not a mask's variable.
        assert!(
            ty(&v("score"), false)
                .unwrap_err()
                .contains("unknown name `score`")
        );
    }

    /// The symbolic derivative agrees with central differences of the evaluated
    /// expression, at points away from each example's kinks.
    #[test]
    fn the_derivative_matches_finite_differences() {
        for (name, e) in score_mods() {
            let de = derive::d_score(&e).unwrap();
            for (s, q, k) in [(-3.7, 5, 2), (0.4, 9, 9), (2.9, 300, 12), (11.0, 3, 40)] {
                let at = |score: f64, e: &Expr| {
                    let mut env = Env::new(Some(score), [1, 2, q, k], &Data);
                    match eval(e, &mut env).unwrap() {
                        Value::F(x) => x,
                        v => panic!("{name}: {v:?}"),
                    }
                };
                let h = 1e-6;
                let fd = (at(s + h, &e) - at(s - h, &e)) / (2.0 * h);
                let got = at(s, &de);
                assert!(
                    (got - fd).abs() <= 1e-6 * (1.0 + fd.abs()),
                    "{name} at {s}: {got} vs {fd}"
                );
            }
        }
    }

    /// `Data` with one element of one tensor moved by `by`.
    struct Nudged<'a> {
        name: &'a str,
        at: Vec<i64>,
        by: f64,
    }
    impl Tensors for Nudged<'_> {
        fn read(&self, name: &str, at: &[i64]) -> Option<Value> {
            match Data.read(name, at)? {
                Value::F(x) if name == self.name && at == &self.at[..] => {
                    Some(Value::F(x + self.by))
                }
                v => Some(v),
            }
        }
    }

    /// d score_mod / d tensor[e], summed over the reads that land on element e, agrees
    /// with central differences in that element, for every example that reads a tensor,
    /// and for an expression that reads one table twice.
    #[test]
    fn the_tensor_gradient_matches_finite_differences() {
        use BinOp::*;
        let mut cases = score_mods();
        cases.push((
            "two reads",
            bin(
                Mul,
                idx("rel_bias", vec![v("h"), i(3)]),
                call(
                    Func::Tanh,
                    vec![bin(
                        Add,
                        v("score"),
                        idx("rel_bias", vec![v("h"), bin(Add, v("k"), i(1))]),
                    )],
                ),
            ),
        ));
        let mut checked = 0;
        for (name, e) in cases {
            for tensor in ["rel_bias", "slopes"] {
                let reads = derive::d_tensor(&e, tensor).unwrap();
                for (s, q, k) in [(-0.7, 5, 2), (1.3, 9, 2), (0.2, 30, 12)] {
                    let vars = [1, 2, q, k];
                    let ints =
                        |e: &Expr| match eval(e, &mut Env::new(Some(s), vars, &Data)).unwrap() {
                            Value::I(x) => i64::from(x),
                            Value::U(x) => i64::from(x),
                            v => panic!("{v:?}"),
                        };
                    let float =
                        |e: &Expr, t: &dyn Tensors| match eval(e, &mut Env::new(Some(s), vars, t))
                            .unwrap()
                        {
                            Value::F(x) => x,
                            v => panic!("{v:?}"),
                        };
                    let places: Vec<Vec<i64>> = reads
                        .iter()
                        .map(|r| r.index.iter().map(ints).collect())
                        .collect();
                    for at in &places {
                        let got: f64 = reads
                            .iter()
                            .zip(&places)
                            .filter(|(_, p)| *p == at)
                            .map(|(r, _)| float(&r.slope, &Data))
                            .sum();
                        let h = 1e-6;
                        let nudged = |by| Nudged {
                            name: tensor,
                            at: at.clone(),
                            by,
                        };
                        let fd = (float(&e, &nudged(h)) - float(&e, &nudged(-h))) / (2.0 * h);
                        assert!(
                            (got - fd).abs() <= 1e-6 * (1.0 + fd.abs()),
                            "{name} d{tensor}{at:?}: {got} vs {fd}"
                        );
                        checked += 1;
                    }
                }
            }
        }
        // t5, alibi, softcap over alibi, two reads (twice) at three points each.
        assert_eq!(checked, 3 * 5, "reads checked");
    }

    #[test]
    fn a_read_inside_an_index_does_not_differentiate() {
        let e = bin(
            BinOp::Add,
            v("score"),
            idx(
                "rel_bias",
                vec![v("h"), cast(idx("rel_bias", vec![v("h"), i(0)]), Ty::I32)],
            ),
        );
        let err = derive::d_tensor(&e, "rel_bias").unwrap_err();
        assert!(
            err.message.contains("a read of `rel_bias`"),
            "{}",
            err.message
        );
    }

    #[test]
    fn the_derivative_refuses_a_cast_of_the_score() {
        let e = bin(
            BinOp::Add,
            v("score"),
            cast(cast(v("score"), Ty::I32), Ty::F32),
        );
        assert!(ty(&e, true).is_ok());
        let err = derive::d_score(&e).unwrap_err();
        assert!(
            err.message.contains("cannot differentiate"),
            "{}",
            err.message
        );
    }

    #[test]
    fn masks_evaluate_as_written() {
        let at = |e: &Expr, q, k| {
            let mut env = Env::new(None, [0, 0, q, k], &Data);
            eval(e, &mut env).unwrap()
        };
        let masks = mask_mods();
        // prefix[0] = 7: key 6 is visible to query 2, key 8 is not.
        assert_eq!(at(&masks[0].1, 2, 6), Value::B(true));
        assert_eq!(at(&masks[0].1, 2, 8), Value::B(false));
        assert_eq!(at(&masks[1].1, 1000, 2), Value::B(true));
        assert_eq!(at(&masks[1].1, 1000, 600), Value::B(false));
        assert_eq!(at(&masks[1].1, 1000, 800), Value::B(true));
        assert_eq!(at(&masks[2].1, 70, 127), Value::B(true));
        assert_eq!(at(&masks[2].1, 70, 128), Value::B(false));
    }
}
