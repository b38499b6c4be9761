//! The description's syntax. Parsing only checks shape (keys, value kinds); meaning is
//! checked by attn-dsl once the description is lowered to the IR.
//!
//! ```text
//! #[attrs] vis NAME {
//!     op: forward | decode | backward_q | backward_kv | rope | rope_backward,
//!     grid: s_major(tile = N) | j_major(tile = N) | head_major,
//!           flash: s_major(tile = N, key_tile = N, rows_per_thread = N, subgroups = BOOL,
//!                          matrix = scalar | coop16)
//!     head_dim: N,
//!     gqa: any | N,                        (default any)
//!     masks: [causal, document] | none,    (default none)
//!     target: webgpu | native(key = N, ..),(default webgpu)
//!     workgroup_size: N,                   (default 256)
//!     dtype: f32 | f16 | bf16,             (default f32: the data tensors' element type)
//!     source: recompute | scratch(PRODUCER), (backward_kv; default recompute)
//!     writes: { NAME: owned | atomic | scratch, .. },
//! }
//! ```

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Attribute, Ident, LitBool, LitInt, Token, Visibility, braced, bracketed, parenthesized};

pub const KEYS: &[&str] = &[
    "op",
    "grid",
    "head_dim",
    "hidden",
    "out",
    "gqa",
    "masks",
    "target",
    "workgroup_size",
    "dtype",
    "source",
    "cache",
    "writes",
];

pub struct Description {
    pub attrs: Vec<Attribute>,
    pub vis: Visibility,
    pub name: Ident,
    pub entries: Vec<Entry>,
}

pub struct Entry {
    pub key: Ident,
    pub value: Value,
}

/// A number with where it was written.
pub struct Number {
    pub value: u32,
    pub span: Span,
}

/// The value of a `key = value` argument.
pub enum ArgValue {
    Number(Number),
    Flag(LitBool),
    /// `matrix = coop16`.
    Word(Ident),
}

/// `name`, `name(key = N, ..)` or `name(path)`.
pub struct Call {
    pub name: Ident,
    pub args: Vec<(Ident, ArgValue)>,
    /// `scratch(producer)`: the kernel module a consumer reads from.
    pub path: Option<syn::Path>,
}

pub enum Value {
    Word(Ident),
    Number(Number),
    Call(Call),
    /// `[a, b]`, with the span of the brackets.
    List(Vec<Ident>, Span),
    /// `{ name: mode, .. }`, with the span of the braces.
    Map(Vec<(Ident, Ident)>, Span),
}

impl Value {
    pub fn span(&self) -> Span {
        match self {
            Value::Word(w) => w.span(),
            Value::Number(n) => n.span,
            Value::Call(c) => c.name.span(),
            Value::List(_, s) | Value::Map(_, s) => *s,
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
            let value = body.parse()?;
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
