//! A modifier expression ([`crate::flex`]) as WGSL: one fully parenthesized expression,
//! lets inlined (WGSL has no let-expressions), `select(cond, a, b)` as WGSL's
//! `select(b, a, cond)`, a tensor read at its row-major offset.

use crate::flex::{Dim, Expr, Func, Kind, Lit, TensorDecl};

/// `e` (typed) as a WGSL expression; `var(name)` spells each variable (`score`, b, h, q,
/// k) in the kernel, e.g. `i32(row)` for q.
pub fn wgsl<S: Clone>(e: &Expr<S>, tensors: &[TensorDecl], var: &dyn Fn(&str) -> String) -> String {
    lower(&e.inlined(), tensors, var)
}

fn lower<S>(e: &Expr<S>, tensors: &[TensorDecl], var: &dyn Fn(&str) -> String) -> String {
    let go = |e: &Expr<S>| lower(e, tensors, var);
    match &e.kind {
        Kind::Lit(Lit::Float(x)) => format!("f32({x:?})"),
        Kind::Lit(Lit::Int(x)) => format!("i32({x})"),
        Kind::Lit(Lit::Bool(x)) => x.to_string(),
        Kind::Var(name) => var(name),
        Kind::Neg(a) => format!("(-{})", go(a)),
        Kind::Not(a) => format!("(!{})", go(a)),
        Kind::Bin(op, l, r) => format!("({} {} {})", go(l), op.symbol(), go(r)),
        Kind::Call(Func::Select, args) => {
            format!(
                "select({}, {}, {})",
                go(&args[2]),
                go(&args[1]),
                go(&args[0])
            )
        }
        Kind::Call(func, args) => {
            let args: Vec<String> = args.iter().map(go).collect();
            format!("{}({})", func.name(), args.join(", "))
        }
        Kind::Cast(a, ty) => format!("{}({})", ty.name(), go(a)),
        Kind::Index(name, idx) => {
            let decl = tensors.iter().find(|t| &t.name == name);
            let dims = decl.map_or(&[][..], |d| &d.dims[..]);
            let offset = idx.iter().zip(dims).fold(String::new(), |acc, (i, dim)| {
                let i = format!("u32({})", go(i));
                match acc.is_empty() {
                    true => i,
                    false => format!("({acc} * {} + {i})", dim_expr(*dim)),
                }
            });
            format!("{name}[{offset}]")
        }
        Kind::Let(..) => unreachable!("lets are inlined before lowering"),
    }
}

/// A dimension's size in the kernel.
fn dim_expr(dim: Dim) -> String {
    match dim {
        Dim::Const(n) => format!("{n}u"),
        Dim::Heads => "dims.n_heads".into(),
        Dim::Batch => "dims.batch".into(),
        Dim::Seq => "dims.seq_len".into(),
    }
}

#[cfg(test)]
mod tests {
    use crate::flex::derive::d_score;
    use crate::flex::tests::{decls, mask_mods, score_mods};

    /// How a kernel spells the variables: the score, and the positions and heads it
    /// holds as u32.
    fn var(name: &str) -> String {
        match name {
            "score" => "s".into(),
            "b" => "i32(batch)".into(),
            "h" => "i32(head)".into(),
            "q" => "i32(row)".into(),
            "k" => "i32(j)".into(),
            other => panic!("{other}"),
        }
    }

    /// Every example, its derivative and every mask lower to WGSL that naga validates.
    #[test]
    fn the_examples_lower_to_valid_wgsl() {
        let decls = decls();
        let mut wgsl = String::from(
            "struct Dims { seq_len: u32, n_heads: u32, batch: u32 }\n\
             @group(0) @binding(0) var<uniform> dims: Dims;\n\
             @group(0) @binding(1) var<storage, read> slopes: array<f32>;\n\
             @group(0) @binding(2) var<storage, read> rel_bias: array<f32>;\n\
             @group(0) @binding(3) var<storage, read> prefix: array<i32>;\n\
             var<private> batch: u32;\n\n",
        );
        let args = "s: f32, head: u32, row: u32, j: u32";
        for (n, (_, e)) in score_mods().iter().enumerate() {
            let d = d_score(e).unwrap();
            wgsl += &format!(
                "fn score_mod_{n}({args}) -> f32 {{\n    return {};\n}}\n\n\
                 fn d_score_mod_{n}({args}) -> f32 {{\n    return {};\n}}\n\n",
                super::wgsl(e, &decls, &var),
                super::wgsl(&d, &decls, &var)
            );
        }
        for (n, (_, e)) in mask_mods().iter().enumerate() {
            wgsl += &format!(
                "fn mask_mod_{n}(head: u32, row: u32, j: u32) -> bool {{\n    return {};\n}}\n\n",
                super::wgsl(e, &decls, &var)
            );
        }
        let module = naga::front::wgsl::parse_str(&wgsl)
            .unwrap_or_else(|e| panic!("{}\n{wgsl}", e.emit_to_string(&wgsl)));
        naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::empty(),
        )
        .validate(&module)
        .unwrap_or_else(|e| panic!("{e:?}\n{wgsl}"));
        // select(cond, a, b) is WGSL's select(b, a, cond).
        assert!(wgsl.contains("select("), "{wgsl}");
        assert!(
            wgsl.contains("rel_bias[(u32(i32(head)) * 255u + u32("),
            "{wgsl}"
        );
    }
}
