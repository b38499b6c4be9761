//! A modifier expression ([`crate::flex`]) as WGSL: one fully parenthesized expression,
//! lets inlined (WGSL has no let-expressions), `select(cond, a, b)` as WGSL's
//! `select(b, a, cond)`, a tensor read at its row-major offset. A read whose index lies
//! outside its dimension in any place (a negative one included) gives 0 and loads nothing,
//! so `tbl[h][q - k]` past a row's end never reads the next row. Modifiers built to report
//! ([`Flex::report_reads`]) also record the first such read of a dispatch (kernel, tensor,
//! indices) in `flex_reads`, for the runtime's debug switch.

use super::numerics::Helper;
use super::writer::{Fragment, Template, Wgsl, lines, uint};
use crate::flex::{Dim, Expr, Flex, Func, Kind, Lit, TensorDecl, derive};

/// How a kernel spells what a modifier names: each variable (`score`, b, h, q, k), e.g.
/// `i32(row)` for q, and the length of a `seq` dimension.
pub struct Spelling<'a> {
    /// The WGSL of a variable, by its canonical name.
    pub var: &'a dyn Fn(&str) -> String,
    /// The WGSL of the sequence length, for a `seq` dimension.
    pub seq: &'a str,
    /// Whether a read outside a tensor's shape is reported (`flex_read_ok`).
    pub report: bool,
}

/// `e` (typed) as a WGSL expression.
pub fn wgsl<S: Clone>(e: &Expr<S>, tensors: &[TensorDecl], sp: &Spelling) -> String {
    lower(&e.inlined(), tensors, sp)
}

fn lower<S>(e: &Expr<S>, tensors: &[TensorDecl], sp: &Spelling) -> String {
    let go = |e: &Expr<S>| lower(e, tensors, sp);
    match &e.kind {
        Kind::Lit(Lit::Float(x)) => format!("f32({x:?})"),
        Kind::Lit(Lit::Int(x)) => format!("i32({x})"),
        Kind::Lit(Lit::Bool(x)) => x.to_string(),
        Kind::Var(name) => (sp.var)(name),
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
            let (at, mut within) = place(name, idx, tensors, sp);
            if sp.report {
                let t = tensors.iter().position(|t| t.name == *name).unwrap_or(0);
                let mut i: Vec<String> = idx.iter().map(|i| format!("i32({})", go(i))).collect();
                i.resize(4, "0i".into());
                within = format!(
                    "flex_read_ok({within}, {t}u, {}u, vec4<i32>({}))",
                    idx.len(),
                    i.join(", ")
                );
            }
            let zero = match tensors.iter().find(|t| t.name == *name).map(|t| t.ty) {
                Some(crate::flex::Ty::F32) => "0.0",
                Some(crate::flex::Ty::I32) => "0i",
                _ => "0u",
            };
            format!("select({zero}, {name}[select(0u, {at}, {within})], {within})")
        }
        Kind::Let(..) => unreachable!("lets are inlined before lowering"),
    }
}

/// The row-major offset of `name[idx]` (index expressions lowered with lets inlined), and
/// the test that every index lies within its dimension.
fn place<S>(
    name: &str,
    idx: &[Expr<S>],
    tensors: &[TensorDecl],
    sp: &Spelling,
) -> (String, String) {
    let decl = tensors.iter().find(|t| t.name == name);
    let dims = decl.map_or(&[][..], |d| &d.dims[..]);
    let (mut at, mut within) = (String::new(), Vec::new());
    for (i, dim) in idx.iter().zip(dims) {
        let i = format!("u32({})", lower(i, tensors, sp));
        let len = dim_expr(*dim, sp.seq);
        within.push(format!("{i} < {len}"));
        at = match at.is_empty() {
            true => i,
            false => format!("({at} * {len} + {i})"),
        };
    }
    (at, format!("({})", within.join(" && ")))
}

/// How a modifier's variables read in the functions this module writes: the score is
/// `flex_s`, the position `pos` the query's.
fn variable(name: &str, pos: &str) -> String {
    match name {
        "score" => "flex_s".to_string(),
        "b" => "i32(batch)".to_string(),
        "h" => "i32(flex_h)".to_string(),
        "q" => format!("i32({pos})"),
        "k" => "i32(flex_j)".to_string(),
        other => other.to_string(),
    }
}

const ARGS: &str = "flex_row: u32, flex_h: u32, flex_j: u32";

/// `flex_grads(row, h, j, dot, gf)`: for every tensor declared `grad` that `spec` writes,
/// `d<name>[index] += gf · d score_mod / d name[index]` at each read of it, by
/// compensated atomics in lanes (`d<name>` binds them, and the runtime folds them);
/// `gf` is dS with respect to the modified score, the read's slope evaluated at the score
/// before `score_mod` (`pre_score`). Returns whether it wrote any.
pub(super) fn grad_functions(out: &mut Wgsl, spec: &crate::spec::KernelSpec, flex: &Flex) -> bool {
    let Some(e) = &flex.score_mod else {
        return false;
    };
    let written: Vec<(&TensorDecl, String)> = flex
        .tensors
        .iter()
        .filter_map(|t| {
            t.grad_name()
                .filter(|g| spec.write_mode(g).is_some())
                .map(|g| (t, g))
        })
        .collect();
    if written.is_empty() {
        return false;
    }
    let var = |name: &str| variable(name, "flex_row");
    // The score_mod's own reads report; its derivative reads the same places.
    let sp = Spelling {
        var: &var,
        seq: "dims.seq_len",
        report: false,
    };
    let (mut adds, mut flushes) = (Vec::new(), Vec::new());
    for (t, grad) in &written {
        let len: Vec<String> = t.dims.iter().map(|d| dim_expr(*d, sp.seq)).collect();
        super::scatter::compensated_add(out, spec, grad, &len.join(" * "));
        let reads = derive::d_tensor(e, &t.name).expect("checked: the tensor differentiates");
        for (r, read) in reads.iter().enumerate() {
            let p = format!("flex_{grad}_{r}");
            out.put(HELD.fill([
                ("p", Fragment::from(p.as_str())),
                ("grad", Fragment::from(grad.clone())),
            ]));
            // Lanes by query row: the pairs of one element in a tile sit on different rows.
            // A read outside the tensor gave 0 whatever it holds: no gradient (an add at
            // the held-nothing mark is dropped at the flush).
            let (at, within) = place(&t.name, &read.index, &flex.tensors, &sp);
            let slope = wgsl(&read.slope, &flex.tensors, &sp);
            adds.push(format!(
                "{p}_add(select(0xffffffffu, {at}, {within}), gf * {slope}, flex_row);"
            ));
            flushes.push(format!("{p}_flush();"));
        }
    }
    out.put(GRADS.fill([
        ("args", Fragment::from(ARGS)),
        ("adds", lines(adds)),
        ("flushes", lines(flushes)),
    ]));
    true
}

/// `flex_grads` adding each read's share of dS, and `flex_flush` adding what each
/// invocation still holds.
const GRADS: Template = Template {
    name: "flex_grads",
    needs: &[],
    text: r#"// dS into the gradients of the tensors declared `grad`, at each read of them.
fn flex_grads($args, dot: f32, gf: f32) {
    let flex_s = pre_score(flex_row, flex_h, flex_j, dot).x;
    $adds
}

// What each invocation still holds, added; at the end of the kernel.
fn flex_flush() {
    $flushes
}

"#,
};

/// One read's gradient as an invocation gathers it: the element it last added to, that
/// add's lane, and the sum not yet added (a value and its rounding errors), kept while the
/// invocation's pairs land on one element (most of a T5 table's pairs land on its last
/// distance) and added by atomics when they move on. The atomics on one element fall from
/// one per pair to about one per invocation.
const HELD: Template = Template {
    name: "flex_grad_held",
    needs: &[Helper::TwoSumErr4],
    text: "var<private> ${p}_at: u32 = 0xffffffffu;
var<private> ${p}_lane: u32;
var<private> ${p}_sum: vec2<f32>;

fn ${p}_add(i: u32, x: f32, lane: u32) {
    if (i != ${p}_at) {
        ${p}_flush();
        ${p}_at = i;
        ${p}_lane = lane;
    }
    let s = ${p}_sum.x + x;
    ${p}_sum = vec2<f32>(s, ${p}_sum.y + two_sum_err4(vec4<f32>(${p}_sum.x), vec4<f32>(x), vec4<f32>(s)).x);
}

fn ${p}_flush() {
    if (${p}_at != 0xffffffffu) {
        add_$grad(${p}_at, ${p}_sum, ${p}_lane);
    }
    ${p}_at = 0xffffffffu;
    ${p}_sum = vec2<f32>(0.0);
}

",
};

/// The call that adds what an invocation still holds of the modifier tensors' gradients,
/// for the end of a backward kernel's entry point; empty where `spec` writes none.
pub(super) fn flush_call(spec: &crate::spec::KernelSpec) -> Fragment {
    let writes = spec.flex().is_some_and(|f| {
        f.score_mod.is_some()
            && f.tensors
                .iter()
                .filter_map(|t| t.grad_name())
                .any(|g| spec.write_mode(&g).is_some())
    });
    match writes {
        true => Fragment::from("flex_flush();\n"),
        false => Fragment::default(),
    }
}

/// The WGSL functions of `flex`'s modifiers: `score_mod(score, row, h, j)` and its
/// derivative `d_score_mod`, `mask_mod(row, h, j)`; the query's position is `row`, but in
/// the per-row decode, whose one query follows its cache.
pub(super) fn functions(out: &mut Wgsl, flex: &Flex, spec: &crate::spec::KernelSpec) {
    let (pos, seq) = match spec.op {
        crate::spec::Op::Decode => ("cache_len() - 1u", "dims.capacity"),
        crate::spec::Op::DecodeSplit | crate::spec::Op::Extend => ("flex_row", "dims.capacity"),
        _ => ("flex_row", "dims.seq_len"),
    };
    let var = |name: &str| variable(name, pos);
    let sp = Spelling {
        var: &var,
        seq,
        report: flex.report_reads,
    };
    if flex.report_reads {
        out.put(REPORT.fill([("kernel", uint(kernel_code(&spec.name)))]));
    }
    if let Some(e) = &flex.score_mod {
        let d = derive::d_score(e).expect("checked: the score modifier differentiates");
        out.put(SCORE_MOD.fill([
            ("args", Fragment::from(ARGS)),
            ("score", Fragment::from(wgsl(e, &flex.tensors, &sp))),
            ("d_score", Fragment::from(wgsl(&d, &flex.tensors, &sp))),
        ]));
    }
    if let Some(e) = &flex.mask_mod {
        out.put(MASK_MOD.fill([
            ("args", Fragment::from(ARGS)),
            ("mask", Fragment::from(wgsl(e, &flex.tensors, &sp))),
        ]));
        reach_functions(out, e, &flex.tensors, &sp);
        super::tiles::functions(out, e, spec, seq);
    }
}

/// `mask_reach_{i}()`: each reach's end fixed per sequence ([`crate::flex::bounds::Reach`]),
/// the largest of its values, which the key and query ranges read.
fn reach_functions(out: &mut Wgsl, mask: &Expr, tensors: &[TensorDecl], sp: &Spelling) {
    let bounds = crate::flex::bounds::key_bounds(mask);
    for (i, r) in bounds.reaches.iter().enumerate() {
        let value = r
            .values
            .iter()
            .map(|v| wgsl(v, tensors, sp))
            .reduce(|a, b| format!("max({a}, {b})"))
            .expect("a reach has a value");
        out.put(MASK_REACH.fill([
            ("i", Fragment::from(i.to_string())),
            ("value", Fragment::from(value)),
        ]));
    }
}

const MASK_REACH: Template = Template {
    name: "mask_reach",
    needs: &[],
    text: r#"// Where mask_mod shows every key below a bound fixed per sequence, that bound.
fn mask_reach_${i}() -> i32 {
    return $value;
}

"#,
};

const SCORE_MOD: Template = Template {
    name: "score_mod",
    needs: &[],
    text: r#"// The description's score_mod, and its derivative with respect to the score.
fn score_mod(flex_s: f32, $args) -> f32 {
    return $score;
}

fn d_score_mod(flex_s: f32, $args) -> f32 {
    return $d_score;
}

"#,
};

const MASK_MOD: Template = Template {
    name: "mask_mod",
    needs: &[],
    text: r#"// The description's mask_mod.
fn mask_mod($args) -> bool {
    return $mask;
}

"#,
};

/// The code a reporting kernel writes for itself in `flex_reads`: FNV-1a of its name, never
/// 0 (the report's "nothing yet").
pub fn kernel_code(name: &str) -> u32 {
    let hash = name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    hash.max(1)
}

/// `flex_read_ok`: a read's bounds test, which records the dispatch's first read outside
/// the bounds as (kernel, tensor, rank, the indices) in `flex_reads`, once.
const REPORT: Template = Template {
    name: "flex_report",
    needs: &[],
    text: r#"// This kernel's code in flex_reads (its name's FNV-1a).
const FLEX_KERNEL: u32 = $kernel;

// Whether the pair being scored is one the kernel shows (a tile's hidden pairs are scored
// too, and their reads are not reported).
var<private> flex_seen: bool = true;

// `ok`, after recording the first read with !ok: flex_reads[0] is the kernel's code, then
// the tensor, the rank and four indices.
fn flex_read_ok(ok: bool, tensor: u32, rank: u32, at: vec4<i32>) -> bool {
    if (!ok && flex_seen && atomicLoad(&flex_reads[0]) == 0u) {
        if (atomicCompareExchangeWeak(&flex_reads[0], 0u, FLEX_KERNEL).exchanged) {
            atomicStore(&flex_reads[1], tensor);
            atomicStore(&flex_reads[2], rank);
            for (var i = 0u; i < 4u; i = i + 1u) {
                atomicStore(&flex_reads[3u + i], bitcast<u32>(at[i]));
            }
        }
    }
    return ok;
}

"#,
};

/// A dimension's size in the kernel.
fn dim_expr(dim: Dim, seq: &str) -> String {
    match dim {
        Dim::Const(n) => format!("{n}u"),
        Dim::Heads => "dims.n_heads".into(),
        Dim::Batch => "dims.batch".into(),
        Dim::Seq => seq.into(),
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
        let sp = super::Spelling {
            var: &var,
            seq: "dims.seq_len",
            report: false,
        };
        for (n, (_, e)) in score_mods().iter().enumerate() {
            let d = d_score(e).unwrap();
            wgsl += &format!(
                "fn score_mod_{n}({args}) -> f32 {{\n    return {};\n}}\n\n\
                 fn d_score_mod_{n}({args}) -> f32 {{\n    return {};\n}}\n\n",
                super::wgsl(e, &decls, &sp),
                super::wgsl(&d, &decls, &sp)
            );
        }
        for (n, (_, e)) in mask_mods().iter().enumerate() {
            wgsl += &format!(
                "fn mask_mod_{n}(head: u32, row: u32, j: u32) -> bool {{\n    return {};\n}}\n\n",
                super::wgsl(e, &decls, &sp)
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
            wgsl.contains("rel_bias[select(0u, (u32(i32(head)) * 255u + u32("),
            "{wgsl}"
        );
    }

    /// Each library example reaches every schedule: the per-row kernels of every op that
    /// takes modifiers, the flash forward and backward, and both on tensor cores; each
    /// validates in naga, binds its tensors after the signature's, and calls the modifier
    /// it declares.
    #[test]
    fn every_example_compiles_into_every_schedule() {
        use crate::configs;
        use crate::{Dtype, KernelSpec, Masks, Op, WriteMode};
        for ex in crate::flex::library::examples() {
            let masks = Masks {
                flex: Some(ex.flex.intern()),
                ..Masks::default()
            };
            let mut specs = Vec::new();
            for op in [
                Op::Forward,
                Op::Decode,
                Op::DecodeSplit,
                Op::BackwardQ,
                Op::BackwardKv,
            ] {
                let mut spec = KernelSpec::standard("flex", op, 64, masks);
                if op == Op::DecodeSplit {
                    for (_, mode) in &mut spec.writes {
                        *mode = WriteMode::ScratchFlush;
                    }
                }
                specs.push(spec);
            }
            let f = |op, c| KernelSpec::flash("flex", op, 64, masks, c);
            specs.push(f(Op::Forward, configs::forward(64)[0]));
            specs.push(f(Op::BackwardQ, configs::backward(64)[0]));
            specs.push(f(Op::BackwardKv, configs::backward(64)[0]));
            let bytes = configs::CANDIDATE_WORKGROUP_BYTES;
            specs.push(KernelSpec {
                dtype: Dtype::F16,
                ..f(Op::Forward, configs::coop_forward(64, bytes)[0])
            });
            for op in [Op::BackwardQ, Op::BackwardKv] {
                let mut spec = KernelSpec {
                    dtype: Dtype::F16,
                    ..f(op, configs::coop_backward(64, bytes)[0])
                };
                if op == Op::BackwardKv {
                    spec.writes = vec![
                        ("dk".into(), WriteMode::Owned),
                        ("dv".into(), WriteMode::Owned),
                    ];
                }
                spec.fit_target();
                specs.push(spec);
            }
            for mut spec in specs {
                // As the runtime builds them: a target that holds what the kernel binds.
                spec.fit_target();
                let what = format!("{} {:?} {:?}", ex.name, spec.op, spec.grid);
                let abi = crate::compile(&spec).unwrap_or_else(|e| panic!("{what}: {e}"));
                // The block mask follows the declared tensors where the kernel reads one.
                let names: Vec<&str> = abi
                    .bindings
                    .iter()
                    .map(|b| b.name.as_ref())
                    .filter(|n| *n != "block_mask")
                    .collect();
                let declared: Vec<&str> = ex.flex.tensors.iter().map(|t| t.name.as_str()).collect();
                assert_eq!(
                    &names[names.len() - declared.len()..],
                    &declared[..],
                    "{what}"
                );
                for (f, on) in [
                    ("score_mod(", ex.flex.score_mod.is_some()),
                    ("mask_mod(", ex.flex.mask_mod.is_some()),
                ] {
                    assert_eq!(abi.wgsl.contains(f), on, "{what}: {f}");
                }
            }
        }
    }

    /// A mask_mod that is a key range moving with the query (`sliding_window`) becomes the
    /// kernels' row ranges: no per-pair test, no tile stepping, the same loops as the
    /// built-in causal window; a mask with another term (the sinks) keeps both, its loops
    /// still ending at the diagonal its causal term gives.
    #[test]
    fn a_key_range_mask_is_the_row_range() {
        use crate::flex::{Flex, library};
        use crate::{KernelSpec, Masks, Op, configs};
        let flash = |mask| {
            let masks = Masks {
                flex: Some(
                    Flex {
                        score_mod: None,
                        mask_mod: Some(mask),
                        tensors: vec![],
                        ..Flex::default()
                    }
                    .intern(),
                ),
                ..Masks::default()
            };
            let spec = KernelSpec::flash("w", Op::Forward, 64, masks, configs::forward(64)[0]);
            crate::compile(&spec).expect("compiles").wgsl.to_string()
        };
        let exact = flash(library::sliding_window(24));
        for text in [
            "return true;",
            "let s = min(max(0u, u32(max(i32(row) - 23, 0))), dims.seq_len);",
            "return vec2<u32>(s, max(s, min(dims.seq_len, u32(max(i32(row) + 1, 0)))));",
            "return vec2<u32>(s, max(s, min(dims.seq_len, u32(max(i32(col) + 24, 0)))));",
            "for (var kt = range.x / BC; kt < kt_end; kt = kt + 1u) {",
        ] {
            assert!(exact.contains(text), "missing `{text}`");
        }
        assert!(!exact.contains("= next_key_tile("));
        let sinks = flash(library::window_with_sinks(24, 4));
        assert!(sinks.contains("return mask_mod(row, h, j);"));
        assert!(sinks.contains("tile_next = next_key_tile("));
        assert!(
            sinks.contains(
                "if (!tile_full) {\n            tile_hid_0 = select(0u, 1u, !key_visible("
            )
        );
        assert!(sinks.contains("min(dims.seq_len, u32(max(i32(row) + 1, 0)))"));
    }
}
