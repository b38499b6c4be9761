//! The description's syntax. Parsing only checks shape (keys, value kinds); meaning is
//! checked by attn-dsl once the description is lowered to the IR.
//!
//! ```text
//! #[attrs] vis NAME {
//!     op: forward | decode | backward_q | backward_kv | rope | rope_backward,
//!     grid: s_major(tile = N) | j_major(tile = N) | head_major
//!           | slice_major(tile = N, subgroups = BOOL) | slice_major(flash),
//!           flash: s_major(tile = N, key_tile = N, rows_per_thread = N, subgroups = BOOL,
//!                          matrix = scalar | coop16)
//!     head_dim: N | [N, N, ..],          (a list: one kernel per head_dim, see below)
//!     gqa: any | N,                        (default any)
//!     masks: [causal, document] | none,    (default none)
//!     target: webgpu | native(key = N, ..),(default webgpu)
//!     workgroup_size: N | head_dim,        (default 256)
//!     dtype: f32 | f16 | bf16,             (default f32: the data tensors' element type)
//!     source: recompute | scratch(PRODUCER), (backward_kv; default recompute)
//!     writes: { NAME: owned | atomic | scratch, .. },
//! }
//! ```
//!
//! `head_dim: [64, 128]` declares the kernel once per head_dim: the first keeps NAME, each
//! other is NAME_d{head_dim}, and a `scratch(PRODUCER)` source names PRODUCER's kernel of
//! the same head_dim (PRODUCER_d{head_dim}).

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Attribute, Ident, LitBool, LitInt, Token, Visibility, braced, bracketed, parenthesized};

pub const KEYS: &[&str] = &[
    "op",
    "grid",
    "head_dim",
    "head_dim_v",
    "hidden",
    "out",
    "gqa",
    "masks",
    "target",
    "workgroup_size",
    "dtype",
    "source",
    "cache",
    "kv_cache",
    "tensors",
    "score_mod",
    "mask_mod",
    "block_mask",
    "writes",
];

#[derive(Clone)]
pub struct Description {
    pub attrs: Vec<Attribute>,
    pub vis: Visibility,
    pub name: Ident,
    pub entries: Vec<Entry>,
}

#[derive(Clone)]
pub struct Entry {
    pub key: Ident,
    pub value: Value,
}

/// A number with where it was written.
#[derive(Clone)]
pub struct Number {
    pub value: u32,
    pub span: Span,
}

/// The value of a `key = value` argument.
#[derive(Clone)]
pub enum ArgValue {
    Number(Number),
    Flag(LitBool),
    /// `matrix = coop16`.
    Word(Ident),
}

/// `name`, `name(key = N, ..)` or `name(path)`.
#[derive(Clone)]
pub struct Call {
    pub name: Ident,
    pub args: Vec<(Ident, ArgValue)>,
    /// `scratch(producer)`: the kernel module a consumer reads from.
    pub path: Option<syn::Path>,
}

#[derive(Clone)]
pub enum Value {
    Word(Ident),
    Number(Number),
    Call(Call),
    /// `[a, b]`, with the span of the brackets.
    List(Vec<Ident>, Span),
    /// `[64, 128]`, with the span of the brackets.
    Numbers(Vec<Number>, Span),
    /// `{ name: mode, .. }`, with the span of the braces.
    Map(Vec<(Ident, Ident)>, Span),
    /// `|score, b, h, q, k| expr` (`score_mod`) or `|b, h, q, k| cond` (`mask_mod`).
    Closure(Box<syn::ExprClosure>),
    /// `{ name: [dims] type, .. }` (`tensors`), with the span of the braces.
    Tensors(Vec<TensorItem>, Span),
}

/// One declared tensor: `rel_bias: [heads, 2 * 128 - 1] f32`, `grad` after the type where
/// the backward writes its gradient.
#[derive(Clone)]
pub struct TensorItem {
    pub name: Ident,
    /// Each dimension as written: a size word (`heads`, `batch`, `seq`) or a constant
    /// expression of integer literals.
    pub dims: Vec<syn::Expr>,
    pub ty: syn::Type,
    pub grad: Option<Ident>,
}

impl Parse for TensorItem {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name = input.parse()?;
        input.parse::<Token![:]>()?;
        let inner;
        bracketed!(inner in input);
        let dims = Punctuated::<syn::Expr, Token![,]>::parse_terminated(&inner)?;
        let ty = input.parse()?;
        let grad = match input.peek(Ident) {
            true => {
                let word: Ident = input.parse()?;
                if word != "grad" {
                    return Err(syn::Error::new(
                        word.span(),
                        "after a tensor's type, only `grad` (the backward writes its gradient)",
                    ));
                }
                Some(word)
            }
            false => None,
        };
        Ok(TensorItem {
            name,
            dims: dims.into_iter().collect(),
            ty,
            grad,
        })
    }
}

impl Value {
    pub fn span(&self) -> Span {
        match self {
            Value::Word(w) => w.span(),
            Value::Number(n) => n.span,
            Value::Call(c) => c.name.span(),
            Value::List(_, s) | Value::Numbers(_, s) | Value::Map(_, s) => *s,
            Value::Tensors(_, s) => *s,
            Value::Closure(c) => c.or1_token.span,
        }
    }
}

impl Parse for Description {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        let name: Ident = input.parse().map_err(|e| {
            syn::Error::new(
                e.span(),
                "expected the kernel's name, e.g. `pub attention_forward { .. }`",
            )
        })?;
        let body;
        braced!(body in input);
        let mut entries: Vec<Entry> = Vec::new();
        while !body.is_empty() {
            let key: Ident = body.parse()?;
            if !KEYS.contains(&key.to_string().as_str()) {
                return Err(syn::Error::new(
                    key.span(),
                    format!("unknown key `{key}`; expected one of: {}", KEYS.join(", ")),
                ));
            }
            if entries.iter().any(|e| e.key == key) {
                return Err(syn::Error::new(
                    key.span(),
                    format!("`{key}` is given twice"),
                ));
            }
            body.parse::<Token![:]>()?;
            let value = match key.to_string().as_str() {
                "score_mod" | "mask_mod" => {
                    Value::Closure(Box::new(body.parse().map_err(|e| {
                        syn::Error::new(
                            e.span(),
                            format!("`{key}` is a closure, e.g. `|score, b, h, q, k| score * 0.5`"),
                        )
                    })?))
                }
                "tensors" => {
                    let inner;
                    let brace = braced!(inner in body);
                    let items = Punctuated::<TensorItem, Token![,]>::parse_terminated(&inner)?;
                    Value::Tensors(items.into_iter().collect(), brace.span.join())
                }
                _ => body.parse()?,
            };
            entries.push(Entry { key, value });
            if body.is_empty() {
                break;
            }
            body.parse::<Token![,]>()?;
        }
        if !input.is_empty() {
            return Err(input.error("one kernel per `attention_kernel!`; nothing may follow it"));
        }
        Ok(Description {
            attrs,
            vis,
            name,
            entries,
        })
    }
}

impl Parse for Value {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        if input.peek(LitInt) {
            return Ok(Value::Number(input.parse()?));
        }
        if input.peek(syn::token::Bracket) {
            let inner;
            let bracket = bracketed!(inner in input);
            if inner.peek(LitInt) {
                let items = Punctuated::<Number, Token![,]>::parse_terminated(&inner)?;
                return Ok(Value::Numbers(
                    items.into_iter().collect(),
                    bracket.span.join(),
                ));
            }
            let items = Punctuated::<Ident, Token![,]>::parse_terminated(&inner)?;
            return Ok(Value::List(
                items.into_iter().collect(),
                bracket.span.join(),
            ));
        }
        if input.peek(syn::token::Brace) {
            let inner;
            let brace = braced!(inner in input);
            let items = Punctuated::<MapItem, Token![,]>::parse_terminated(&inner)?;
            return Ok(Value::Map(
                items.into_iter().map(|m| (m.0, m.1)).collect(),
                brace.span.join(),
            ));
        }
        let name: Ident = input.parse().map_err(|e| {
            syn::Error::new(
                e.span(),
                "expected a value: a word, a number, `[..]`, `{..}` or `name(..)`",
            )
        })?;
        if !input.peek(syn::token::Paren) {
            return Ok(Value::Word(name));
        }
        let inner;
        parenthesized!(inner in input);
        if !inner.is_empty() && !inner.peek2(Token![=]) {
            let path = inner.parse::<syn::Path>()?;
            if !inner.is_empty() {
                return Err(inner.error("expected `)` after the kernel's name"));
            }
            return Ok(Value::Call(Call {
                name,
                args: Vec::new(),
                path: Some(path),
            }));
        }
        let args = Punctuated::<Arg, Token![,]>::parse_terminated(&inner)?;
        Ok(Value::Call(Call {
            name,
            args: args.into_iter().map(|a| (a.0, a.1)).collect(),
            path: None,
        }))
    }
}

impl Parse for Number {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let lit: LitInt = input.parse()?;
        let value = lit.base10_parse::<u32>().map_err(|_| {
            syn::Error::new(
                lit.span(),
                format!("`{lit}` is not a whole number that fits in u32"),
            )
        })?;
        Ok(Number {
            value,
            span: lit.span(),
        })
    }
}

struct MapItem(Ident, Ident);

impl Parse for MapItem {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name = input.parse()?;
        input.parse::<Token![:]>()?;
        Ok(MapItem(name, input.parse()?))
    }
}

struct Arg(Ident, ArgValue);

impl Parse for Arg {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name = input.parse()?;
        input.parse::<Token![=]>()?;
        let value = if input.peek(LitBool) {
            ArgValue::Flag(input.parse()?)
        } else if input.peek(Ident) {
            ArgValue::Word(input.parse()?)
        } else {
            ArgValue::Number(input.parse()?)
        };
        Ok(Arg(name, value))
    }
}

impl Description {
    /// One description per head_dim of a `head_dim: [..]` list (the description itself
    /// where head_dim is one number).
    pub fn per_head_dim(&self) -> syn::Result<Vec<Description>> {
        let Some(at) = self.entries.iter().position(|e| e.key == "head_dim") else {
            return Ok(vec![self.clone()]);
        };
        let Value::Numbers(dims, span) = &self.entries[at].value else {
            return Ok(vec![self.clone()]);
        };
        if dims.is_empty() {
            return Err(syn::Error::new(*span, "`head_dim: []` names no head_dim"));
        }
        let mut out: Vec<Description> = Vec::with_capacity(dims.len());
        for (i, dim) in dims.iter().enumerate() {
            if dims[..i].iter().any(|d| d.value == dim.value) {
                return Err(syn::Error::new(
                    dim.span,
                    format!("head_dim {} is listed twice", dim.value),
                ));
            }
            let suffix = match i {
                0 => String::new(),
                _ => format!("_d{}", dim.value),
            };
            let mut d = self.clone();
            d.name = Ident::new(&format!("{}{suffix}", self.name), self.name.span());
            d.entries[at].value = Value::Number(dim.clone());
            for entry in d.entries.iter_mut().filter(|e| e.key == "source") {
                if let Value::Call(Call {
                    path: Some(path), ..
                }) = &mut entry.value
                    && let Some(last) = path.segments.last_mut()
                {
                    last.ident = Ident::new(&format!("{}{suffix}", last.ident), last.ident.span());
                }
            }
            out.push(d);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn names(d: &[Description]) -> Vec<String> {
        d.iter().map(|d| d.name.to_string()).collect()
    }

    #[test]
    fn a_head_dim_list_declares_one_kernel_per_head_dim() {
        let d: Description = syn::parse2(quote! {
            pub consumer {
                op: backward_kv,
                grid: j_major(tile = 1),
                head_dim: [64, 128, 96],
                source: scratch(super::producer),
                writes: { dk: owned, dv: owned },
            }
        })
        .unwrap();
        let each = d.per_head_dim().unwrap();
        assert_eq!(names(&each), ["consumer", "consumer_d128", "consumer_d96"]);
        let producer = |d: &Description| match &d.entries[3].value {
            Value::Call(Call { path: Some(p), .. }) => quote!(#p).to_string(),
            _ => panic!("source is a call"),
        };
        assert_eq!(producer(&each[0]), "super :: producer");
        assert_eq!(producer(&each[1]), "super :: producer_d128");
        let head_dim = |d: &Description| match &d.entries[2].value {
            Value::Number(n) => n.value,
            _ => panic!("head_dim is one number"),
        };
        assert_eq!(each.iter().map(head_dim).collect::<Vec<_>>(), [64, 128, 96]);
        // The grid's `flash`-style words are not renamed: only the producer is.
        assert!(matches!(&each[1].entries[1].value, Value::Call(c) if c.name == "j_major"));
    }

    #[test]
    fn a_head_dim_listed_twice_is_an_error_at_the_second() {
        let d: Description = syn::parse2(quote! {
            k { op: forward, grid: s_major(tile = 1), head_dim: [64, 64], writes: {} }
        })
        .unwrap();
        let err = d.per_head_dim().err().expect("a duplicate is refused");
        assert_eq!(err.to_string(), "head_dim 64 is listed twice");
    }
}
