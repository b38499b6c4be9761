//! How the kernels round: the dot products, the exponential and the long sums, written so
//! that every schedule stays within twice the error of a framework's f32 (docs/accuracy.md),
//! whatever the driver does with `fma` (lavapipe does not fuse it) and `exp` (several ulp
//! on lavapipe and on NVIDIA's Vulkan driver).
//!
//! - Dot products over head_dim run as four interleaved chains, one per vec4 component,
//!   then pairwise: the error of a blocked sum, not of one chain of head_dim terms. Every
//!   kernel that computes a dot product of the same two rows sums it in this order, so
//!   `dP − D` cancels exactly where a row attends to one key.
//! - `exp_f32` takes exp(x) as 2^(x·log2 e) with the product split exactly, so that only
//!   the hardware's exp2 rounds. (A range reduction and a polynomial was within 1 ulp on
//!   every adapter, but cost a fifth of the flash forward's time on an H100.)
//! - `two_sum_err4` is the rounding error of a sum (Knuth's TwoSum, exact in round-to-
//!   nearest): the compensated flushes of register partial sums carry it instead of
//!   losing it.
//!   Its steps pass through `opaque`, which the compiler cannot see through: without it,
//!   Mesa's algebraic simplifier folds the error term to 0.

use super::writer::{Fragment, Needs, Template, lines, uint};
use crate::spec::Op;

/// A WGSL helper function of the numerics, emitted once per kernel whose fragments declare
/// they call it (or call a helper that does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Helper {
    Hsum,
    Exp,
    Lse,
    Tanh,
    Opaque4,
    TwoSumErr4,
}

impl Helper {
    /// In the order they are emitted: each after the helpers it calls.
    pub const ALL: [Helper; 6] = [
        Helper::Hsum,
        Helper::Exp,
        Helper::Lse,
        Helper::Tanh,
        Helper::Opaque4,
        Helper::TwoSumErr4,
    ];

    /// The WGSL function's name.
    pub fn name(self) -> &'static str {
        self.template().name
    }

    fn calls(self) -> &'static [Helper] {
        self.template().needs
    }

    fn template(self) -> &'static Template {
        match self {
            Helper::Hsum => &HSUM,
            Helper::Exp => &EXP,
            Helper::Lse => &LSE,
            Helper::Tanh => &TANH,
            Helper::Opaque4 => &OPAQUE4,
            Helper::TwoSumErr4 => &TWO_SUM_ERR4,
        }
    }
}

/// The helpers in `needs`, with the ones they call, for a kernel of `op`.
pub(super) fn helpers(needs: Needs, op: Op) -> String {
    let needed = |h: Helper| {
        needs.has(h)
            || Helper::ALL
                .iter()
                .any(|user| user.calls().contains(&h) && needs.has(*user))
    };
    // The dims field the grid walks: nonzero in every dispatch that runs an invocation.
    let walked = Fragment::from(crate::signature::dims(op).fields[0]);
    let mut out = String::new();
    for h in Helper::ALL.into_iter().filter(|h| needed(*h)) {
        let t = h.template();
        let text = match h {
            Helper::Opaque4 => t.fill([("walked", walked.clone())]).text,
            _ => t.plain().text,
        };
        out.push_str(&text);
        out.push('\n');
    }
    out
}

const HSUM: Template = Template {
    name: "hsum",
    needs: &[],
    text: r#"// The four chains of a vec4 dot product, summed pairwise.
fn hsum(v: vec4<f32>) -> f32 {
    return (v.x + v.y) + (v.z + v.w);
}
"#,
};

const EXP: Template = Template {
    name: "exp_f32",
    needs: &[],
    text: r#"// exp(x) = 2^(x·log2 e) with the product split exactly: t = x·L rounded, and its
// rounding error (and that of L itself) e, by fma; 2^t by the hardware and the factor
// 2^e = 1 + e·ln 2 by one more fma. The hardware's exp(x) rounds x·L first, which costs
// |x|·2^-24 of relative error (several ulp) before its own error.
fn exp_f32(x: f32) -> f32 {
    let xc = clamp(x, -104.0, 88.0);
    let t = xc * 1.442695041;
    let e = fma(xc, 1.442695041, -t) + xc * 1.925963e-8;
    let p = exp2(t);
    return fma(p, e * 0.6931471806, p);
}
"#,
};

const LSE: Template = Template {
    name: "lse_f32",
    needs: &[],
    text: r#"// m + ln(l), an LSE from a row's max and sum, for l > 0: l = f·2^e with f in [√½, √2),
// ln f = 2·atanh(s) for s = (f − 1)/(f + 1) (|s| < 0.172) by its odd series to s⁹, and
// e·ln 2 in two parts whose first product is exact; the small terms are added first, so
// that only the last addition rounds at the result's scale: within 0.77 ulp for l from
// 2^12 to 2^17 (host emulation, 2026-11-30), where m + log(l) was within 1.6 with a
// correctly rounded log and the hardware's may be 3 ulp off (Vulkan's bound). An LSE
// near 12 (a 128k-row causal row) has 1 ulp = 1e-6, the pass rule's floor. NaN and inf
// pass through (tested on the bits, which no float simplification folds; frexp leaves
// them undefined).
fn lse_f32(m: f32, l: f32) -> f32 {
    if ((bitcast<u32>(l) & 0x7f800000u) == 0x7f800000u) {
        return m + l;
    }
    let fe = frexp(l);
    var f = fe.fract;
    var e = f32(fe.exp);
    if (f < 0.70710678) {
        f = f * 2.0;
        e = e - 1.0;
    }
    let s = (f - 1.0) / (f + 1.0);
    let s2 = s * s;
    let p = s2 * (0.6666667 + s2 * (0.4 + s2 * (0.2857143 + s2 * 0.22222222)));
    let lf = fma(s, p, 2.0 * s);
    return (m + fma(e, 9.0580006e-6, lf)) + e * 0.69313812;
}
"#,
};

const TANH: Template = Template {
    name: "tanh_f32",
    needs: &[Helper::Exp],
    text: r#"// (tanh x, 1 - tanh² x), each within a few ulp, where the hardware's tanh loses the
// digits of small arguments and 1 - t² from a rounded t loses those of large ones (at
// x = 2, an ulp of t is 40 ulp of 1 - t²: soft-capped gradients went over twice a
// framework's error). Below 0.75, an odd polynomial (least squares for relative error,
// 0.8 ulp); above, from e = e^-2|x|: (1 - e) / (1 + e) and 4e / (1 + e)², which there
// divide e's error by 4 or more.
fn tanh_f32(x: f32) -> vec2<f32> {
    let a = abs(x);
    if (a < 0.75) {
        let x2 = x * x;
        let p = -0.33333334 + x2 * (0.1333333 + x2 * (-0.053967472 + x2 * (0.021861635
            + x2 * (-0.008819074 + x2 * (0.0034445783 + x2 * (-0.0011584267
            + x2 * 0.0002357024))))));
        let t = fma(x * x2, p, x);
        return vec2<f32>(t, (1.0 - t) * (1.0 + t));
    }
    let e = exp_f32(-2.0 * a);
    let d = 1.0 + e;
    return vec2<f32>(sign(x) * ((1.0 - e) / d), 4.0 * e / (d * d));
}
"#,
};

const OPAQUE4: Template = Template {
    name: "opaque4",
    needs: &[],
    text: r#"// x, through a select the compiler cannot decide (the walked length is nonzero in every
// dispatch that runs, but unknown at compile time), so that it cannot simplify an
// error-free transformation away: Mesa rewrites (a + b) - a as b, which zeroes TwoSum.
fn opaque4(x: vec4<f32>) -> vec4<f32> {
    return select(vec4<f32>(0.0), x, dims.$walked != 0u);
}
"#,
};

const TWO_SUM_ERR4: Template = Template {
    name: "two_sum_err4",
    needs: &[Helper::Opaque4],
    text: r#"// The rounding error of t = a + b (Knuth's TwoSum): a + b == t + two_sum_err4(a, b, t).
fn two_sum_err4(a: vec4<f32>, b: vec4<f32>, t: vec4<f32>) -> vec4<f32> {
    let to = opaque4(t);
    let bp = opaque4(to - a);
    let ap = opaque4(to - bp);
    return (a - ap) + (b - bp);
}
"#,
};

/// vec4 columns summed one after another before a block's partial joins the total: chains
/// of at most 8 terms, as a framework's pairwise sum has leaves of 8. (Chains over all of
/// head_dim 128, 32 terms, took soft-capped dBias to 1.4x the bound: flat P exposes the
/// error of dP − D.)
pub const DOT_BLOCK: u32 = 8;

/// The loop over `d4` vec4 columns in which every kernel sums its dot products: for each
/// accumulator `acc` (a vec4 of four chains, one per component), `body` adds column `var`
/// into `{acc}_b`, which is added into `{acc}_4` every [`DOT_BLOCK`] columns (or fewer, the
/// largest divisor of `d4` from 5 up, so that every block has a fixed trip count).
pub(super) fn dot_loop(d4: u32, accs: &[String], var: &str, body: &str) -> Fragment {
    let each = |f: &dyn Fn(&str) -> String| lines(accs.iter().map(|acc| f(acc)));
    let decl_b = each(&|acc| format!("var {acc}_b = vec4<f32>(0.0);"));
    if d4 <= DOT_BLOCK {
        DOT_LOOP.fill([
            ("decl", decl_b),
            ("var", Fragment::from(var)),
            ("d4", uint(d4)),
            ("body", Fragment::from(body)),
            ("blocks", each(&|acc| format!("let {acc}_4 = {acc}_b;"))),
        ])
    } else {
        let block = (5..=DOT_BLOCK).rev().find(|b| d4.is_multiple_of(*b));
        let end = match block {
            Some(b) => format!("d0 + {b}u"),
            None => format!("min(d0 + {DOT_BLOCK}u, {d4}u)"),
        };
        DOT_BLOCKS.fill([
            (
                "decl4",
                each(&|acc| format!("var {acc}_4 = vec4<f32>(0.0);")),
            ),
            ("d4", uint(d4)),
            ("step", uint(block.unwrap_or(DOT_BLOCK))),
            ("decl", decl_b),
            ("var", Fragment::from(var)),
            ("end", Fragment::from(end)),
            ("body", Fragment::from(body)),
            ("add", each(&|acc| format!("{acc}_4 = {acc}_4 + {acc}_b;"))),
        ])
    }
}

/// [`dot_loop`] over at most [`DOT_BLOCK`] columns: one block, whose sums are the totals.
const DOT_LOOP: Template = Template {
    name: "dot_loop",
    needs: &[],
    text: r#"$decl
for (var $var = 0u; $var < $d4; $var = $var + 1u) {
    $body
}
$blocks
"#,
};

/// [`dot_loop`] over more columns: blocks of `$step` columns (the last fewer where no
/// divisor fits), each summed apart and then added into the totals.
const DOT_BLOCKS: Template = Template {
    name: "dot_blocks",
    needs: &[],
    text: r#"$decl4
for (var d0 = 0u; d0 < $d4; d0 = d0 + $step) {
    $decl
    for (var $var = d0; $var < $end; $var = $var + 1u) {
        $body
    }
    $add
}
"#,
};

/// Statements declaring `var {acc}: f32` as the dot product of `a(i)` and `b(i)` over
/// `0..head_dim`, in the order every kernel sums dot products: four chains over the vec4
/// columns in blocks ([`dot_loop`]), then pairwise, and the elements past the last whole
/// vec4 (head_dim not a multiple of 4) added last.
pub(super) fn dot(
    acc: &str,
    head_dim: u32,
    a: impl Fn(&str) -> String,
    b: impl Fn(&str) -> String,
) -> Fragment {
    let vec4 = |f: &dyn Fn(&str) -> String| {
        format!(
            "vec4<f32>({}, {}, {}, {})",
            f("4u * c4"),
            f("4u * c4 + 1u"),
            f("4u * c4 + 2u"),
            f("4u * c4 + 3u")
        )
    };
    let body = format!("{acc}_b = fma({}, {}, {acc}_b);", vec4(&a), vec4(&b));
    let tail = ((head_dim / 4) * 4..head_dim).map(|i| {
        let i = format!("{i}u");
        format!("{acc} = fma({}, {}, {acc});", a(&i), b(&i))
    });
    DOT.fill([
        (
            "looped",
            dot_loop(head_dim / 4, &[acc.to_string()], "c4", &body),
        ),
        ("acc", Fragment::from(acc)),
        ("blocks", Fragment::from(format!("{acc}_4"))),
        ("tail", lines(tail)),
    ])
}

/// [`dot`]: the blocked chains of [`dot_loop`], summed pairwise, then the elements past the
/// last whole vec4 (`$tail`).
const DOT: Template = Template {
    name: "dot",
    needs: &[Helper::Hsum],
    text: r#"$looped
var $acc = hsum($blocks);
$tail
"#,
};
