//! Ready-made modifiers: the built-in masks and score modifiers written in the modifier
//! language, and the examples `check` and `attn` run. Each returns the
//! expression a description would write, so a kernel built from one is the kernel the
//! macro makes from the same closure.

use super::{BinOp, Dim, Expr, Flex, Func, Kind, Lit, TensorDecl, Ty};

/// Constructors of expression nodes without spans.
pub mod build {
    use super::*;

    /// The variable `name`.
    pub fn v(name: &str) -> Expr {
        Expr::new(Kind::Var(name.into()), ())
    }
    /// The float literal `x`.
    pub fn f(x: f64) -> Expr {
        Expr::new(Kind::Lit(Lit::Float(x)), ())
    }
    /// The integer literal `x`.
    pub fn i(x: i64) -> Expr {
        Expr::new(Kind::Lit(Lit::Int(x)), ())
    }
    /// `l op r`.
    pub fn bin(op: BinOp, l: Expr, r: Expr) -> Expr {
        Expr::new(Kind::Bin(op, Box::new(l), Box::new(r)), ())
    }
    /// `func(args..)`.
    pub fn call(func: Func, args: Vec<Expr>) -> Expr {
        Expr::new(Kind::Call(func, args), ())
    }
    /// `a as ty`.
    pub fn cast(a: Expr, ty: Ty) -> Expr {
        Expr::new(Kind::Cast(Box::new(a), ty), ())
    }
    /// `name[at[0]][at[1]]..`: a read of a declared tensor.
    pub fn idx(name: &str, at: Vec<Expr>) -> Expr {
        Expr::new(Kind::Index(name.into(), at), ())
    }
    /// `let name = value; body`.
    pub fn let_(name: &str, value: Expr, body: Expr) -> Expr {
        Expr::new(Kind::Let(name.into(), Box::new(value), Box::new(body)), ())
    }
}

use BinOp::*;
use build::*;

/// A declared tensor.
pub fn tensor(name: &str, dims: &[Dim], ty: Ty) -> TensorDecl {
    TensorDecl {
        name: name.into(),
        dims: dims.to_vec(),
        ty,
        grad: false,
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

/// Documents given as each position's id: causal within a document, `k <= q &&
/// doc[b, q] == doc[b, k]` (`doc` a `[batch, seq] u32` tensor).
pub fn documents(doc: &str) -> Expr {
    let id = |at: &str| idx(doc, vec![v("b"), v(at)]);
    bin(And, causal(), bin(Eq, id("q"), id("k")))
}

/// Blocks of `n` positions see only themselves: `q / n == k / n`.
pub fn block_diagonal(n: i64) -> Expr {
    bin(Eq, bin(Div, v("q"), i(n)), bin(Div, v("k"), i(n)))
}

/// A named example: its modifiers.
pub struct Example {
    /// The preset it is built from, by its name in [`PRESETS`].
    pub name: &'static str,
    /// Its score and mask modifiers and their tensors.
    pub flex: Flex,
}

/// The presets by name, each with its parameters' meaning and defaults.
pub const PRESETS: &[(&str, &str)] = &[
    (
        "t5-bias",
        "t5-bias[:R]: causal, T5 bias rel_bias [heads, 2R+1] f32 over distances clamped at R (31), learnable (drel_bias)",
    ),
    (
        "prefix-lm",
        "prefix-lm: causal, and each sequence's first prefix[b] keys (prefix [batch] u32)",
    ),
    (
        "window-sinks",
        "window-sinks[:W,S]: causal window of W keys and the first S keys (24, 4)",
    ),
    (
        "sliding-window",
        "sliding-window[:W]: causal window of W keys (24), a key range the kernels derive",
    ),
    (
        "softcap-alibi",
        "softcap-alibi[:C]: ALiBi (slopes [heads] f32), then C·tanh(score / C) (5)",
    ),
    (
        "block-diagonal",
        "block-diagonal[:N]: blocks of N positions see only themselves (16)",
    ),
    (
        "documents",
        "documents: causal within each position's document id (doc [batch, seq] u32), tiles skipped by a block mask made on the device",
    ),
];

/// The preset `spec` (`name` or `name:p1,p2`), its parameters defaulted.
pub fn preset(spec: &str) -> Result<Flex, String> {
    let (name, params) = spec.split_once(':').unwrap_or((spec, ""));
    let params: Vec<i64> = params
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.trim()
                .parse()
                .map_err(|_| format!("preset `{name}`: `{p}` is not a whole number"))
        })
        .collect::<Result<_, _>>()?;
    let at = |i: usize, default: i64| params.get(i).copied().unwrap_or(default);
    let positive = |x: i64, what: &str| match x > 0 && x < 1 << 24 {
        true => Ok(x),
        false => Err(format!(
            "preset `{name}`: {what} {x} must be from 1 to 2^24"
        )),
    };
    let heads = |name: &str| tensor(name, &[Dim::Heads], Ty::F32);
    let usage = PRESETS.iter().find(|(n, _)| *n == name).map(|(_, u)| *u);
    let most = match name {
        "t5-bias" | "sliding-window" | "softcap-alibi" | "block-diagonal" => 1,
        "window-sinks" => 2,
        _ => 0,
    };
    let Some(usage) = usage else {
        let names: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
        return Err(format!(
            "unknown preset `{name}`; expected one of {}",
            names.join(", ")
        ));
    };
    if params.len() > most {
        return Err(format!(
            "preset {usage}: {} parameter(s) given",
            params.len()
        ));
    }
    Ok(match name {
        "t5-bias" => {
            let r = positive(at(0, 31), "R")?;
            Flex {
                score_mod: Some(relative_bias("rel_bias", r)),
                mask_mod: Some(causal()),
                tensors: vec![
                    tensor(
                        "rel_bias",
                        &[Dim::Heads, Dim::Const(2 * r as u32 + 1)],
                        Ty::F32,
                    )
                    .learnable(),
                ],
                ..Flex::default()
            }
        }
        "prefix-lm" => Flex {
            score_mod: None,
            mask_mod: Some(prefix_lm("prefix")),
            tensors: vec![tensor("prefix", &[Dim::Batch], Ty::U32)],
            ..Flex::default()
        },
        "window-sinks" => Flex {
            score_mod: None,
            mask_mod: Some(window_with_sinks(
                positive(at(0, 24), "W")?,
                at(1, 4).max(0),
            )),
            tensors: vec![],
            ..Flex::default()
        },
        "sliding-window" => Flex {
            score_mod: None,
            mask_mod: Some(sliding_window(positive(at(0, 24), "W")?)),
            tensors: vec![],
            ..Flex::default()
        },
        "softcap-alibi" => Flex {
            score_mod: Some(let_(
                "s",
                alibi("slopes"),
                softcap_of(v("s"), positive(at(0, 5), "C")? as f64),
            )),
            mask_mod: None,
            tensors: vec![heads("slopes")],
            ..Flex::default()
        },
        "documents" => Flex {
            mask_mod: Some(documents("doc")),
            tensors: vec![tensor("doc", &[Dim::Batch, Dim::Seq], Ty::U32)],
            block_mask: true,
            ..Flex::default()
        },
        _ => Flex {
            score_mod: None,
            mask_mod: Some(block_diagonal(positive(at(0, 16), "N")?)),
            tensors: vec![],
            ..Flex::default()
        },
    })
}

/// The presets with their default parameters: what `check` runs.
pub fn examples() -> Vec<Example> {
    PRESETS
        .iter()
        .map(|(name, _)| Example {
            name,
            flex: preset(name).expect("every preset builds with its defaults"),
        })
        .collect()
}
