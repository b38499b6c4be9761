//! Ready-made modifiers: the built-in masks and score modifiers written in the modifier
//! language (issue 28, item 5), and the examples `check` and `attn` run. Each returns the
//! expression a description would write, so a kernel built from one is the kernel the
//! macro makes from the same closure.

use super::{BinOp, Dim, Expr, Flex, Func, Kind, Lit, TensorDecl, Ty};

/// Constructors of expression nodes without spans.
pub mod build {
    use super::*;

    pub fn v(name: &str) -> Expr {
        Expr::new(Kind::Var(name.into()), ())
    }
    pub fn f(x: f64) -> Expr {
        Expr::new(Kind::Lit(Lit::Float(x)), ())
    }
    pub fn i(x: i64) -> Expr {
        Expr::new(Kind::Lit(Lit::Int(x)), ())
    }
    pub fn bin(op: BinOp, l: Expr, r: Expr) -> Expr {
        Expr::new(Kind::Bin(op, Box::new(l), Box::new(r)), ())
    }
    pub fn call(func: Func, args: Vec<Expr>) -> Expr {
        Expr::new(Kind::Call(func, args), ())
    }
    pub fn cast(a: Expr, ty: Ty) -> Expr {
        Expr::new(Kind::Cast(Box::new(a), ty), ())
    }
    pub fn idx(name: &str, at: Vec<Expr>) -> Expr {
        Expr::new(Kind::Index(name.into(), at), ())
    }
    pub fn let_(name: &str, value: Expr, body: Expr) -> Expr {
        Expr::new(Kind::Let(name.into(), Box::new(value), Box::new(body)), ())
    }
}

use build::*;
use BinOp::*;

/// A declared tensor.
pub fn tensor(name: &str, dims: &[Dim], ty: Ty) -> TensorDecl {
    TensorDecl {
        name: name.into(),
        dims: dims.to_vec(),
        ty,
    }
}

/// `cap · tanh(s / cap)` of the score `s` (Gemma 2's soft cap).
pub fn softcap_of(s: Expr, cap: f64) -> Expr {
    bin(Mul, f(cap), call(Func::Tanh, vec![bin(Div, s, f(cap))]))
}

/// `|score, b, h, q, k| cap * tanh(score / cap)`.
pub fn softcap(cap: f64) -> Expr {
    softcap_of(v("score"), cap)
}

/// ALiBi: `score + slopes[h] * (k - q) as f32`, the slopes a `[heads] f32` tensor.
pub fn alibi(slopes: &str) -> Expr {
    bin(
        Add,
        v("score"),
        bin(
            Mul,
            idx(slopes, vec![v("h")]),
            cast(bin(Sub, v("k"), v("q")), Ty::F32),
        ),
    )
}

/// T5's relative-position bias: `score + table[h][clamp(q - k, -r, r) + r]`, the table
/// `[heads, 2r + 1] f32`.
pub fn relative_bias(table: &str, r: i64) -> Expr {
    let_(
        "d",
        call(Func::Clamp, vec![bin(Sub, v("q"), v("k")), i(-r), i(r)]),
        bin(
            Add,
            v("score"),
            idx(table, vec![v("h"), bin(Add, v("d"), i(r))]),
        ),
    )
}

/// `k <= q`.
pub fn causal() -> Expr {
    bin(Le, v("k"), v("q"))
}

/// Causal within a window of `w` keys: `k <= q && q - k < w`.
pub fn sliding_window(w: i64) -> Expr {
    bin(And, causal(), bin(Lt, bin(Sub, v("q"), v("k")), i(w)))
}

/// StreamingLLM: a causal window of `w` keys plus the first `sinks` keys.
pub fn window_with_sinks(w: i64, sinks: i64) -> Expr {
    bin(
        And,
        causal(),
        bin(
            Or,
            bin(Lt, bin(Sub, v("q"), v("k")), i(w)),
            bin(Lt, v("k"), i(sinks)),
        ),
    )
}

/// Prefix-LM: causal, except that every query sees its sequence's first `prefix[b]` keys
/// (`prefix` a `[batch] u32` tensor).
pub fn prefix_lm(prefix: &str) -> Expr {
    bin(
        Or,
        causal(),
        bin(Lt, v("k"), cast(idx(prefix, vec![v("b")]), Ty::I32)),
    )
}

/// Blocks of `n` positions see only themselves: `q / n == k / n`.
pub fn block_diagonal(n: i64) -> Expr {
    bin(Eq, bin(Div, v("q"), i(n)), bin(Div, v("k"), i(n)))
}

/// A named example: its modifiers and a description of each tensor's values.
pub struct Example {
    pub name: &'static str,
    pub flex: Flex,
}

/// The examples of issue 28 that `check` runs and `attn` offers as presets.
pub fn examples() -> Vec<Example> {
    let heads = |name: &str| tensor(name, &[Dim::Heads], Ty::F32);
    vec![
        Example {
            name: "t5-bias",
            flex: Flex {
                score_mod: Some(relative_bias("rel_bias", 31)),
                mask_mod: Some(causal()),
                tensors: vec![tensor("rel_bias", &[Dim::Heads, Dim::Const(63)], Ty::F32)],
            },
        },
        Example {
            name: "prefix-lm",
            flex: Flex {
                score_mod: None,
                mask_mod: Some(prefix_lm("prefix")),
                tensors: vec![tensor("prefix", &[Dim::Batch], Ty::U32)],
            },
        },
        Example {
            name: "window-sinks",
            flex: Flex {
                score_mod: None,
                mask_mod: Some(window_with_sinks(24, 4)),
                tensors: vec![],
            },
        },
        Example {
            name: "softcap-alibi",
            flex: Flex {
                score_mod: Some(let_("s", alibi("slopes"), softcap_of(v("s"), 5.0))),
                mask_mod: None,
                tensors: vec![heads("slopes")],
            },
        },
        Example {
            name: "block-diagonal",
            flex: Flex {
                score_mod: None,
                mask_mod: Some(block_diagonal(16)),
                tensors: vec![],
            },
        },
    ]
}
