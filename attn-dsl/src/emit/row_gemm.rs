//! The row layers' tiled products (y = x̂ₙ·Wᵀ, dx̂ₙ = dy·W, dW = dyᵀ·x̂ₙ), one step shared by
//! every LayerNorm + Linear kernel: a workgroup owns a 64×64 block of outputs and walks the
//! reduction in `BK`-deep staged slices, either as 16×16 invocations with 4×4 f32 register
//! blocks (`matrix = scalar`) or as 8 subgroups of 16×16×16 cooperative-matrix products on
//! f16 operands with f32 accumulators (`coop16`). Either way the product ends in `acc`,
//! rows 4·ty.. and columns 4·tx.. of the block in each invocation, so the kernels'
//! epilogues (bias, the LayerNorm chain rule, the row sums) are one code for both.
//!
//! A kernel's staging code fills the slices through `put_a(kk, m, v)` and `put_b(kk, n, v)`
//! (reduction index kk, output row m or column n); [`Contiguous`] says which index its
//! consecutive invocations walk, so that the f16 slices are laid out for conflict-free
//! stores.

use super::coop::{A, B, C};
use super::writer::Wgsl;
use std::fmt::Write;

use crate::layout::rows::{COOP_SUBGROUPS, GEMM_TILE};
use crate::spec::{KernelSpec, Matrix};

/// Which index of a staged operand consecutive invocations write: the reduction index
/// (rows of x, dy or W read along their length) or the output index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Contiguous {
    Reduction,
    Output,
}

/// The staging layouts of a kernel's two operands.
#[derive(Clone, Copy, Debug)]
pub(super) struct Staging {
    pub a: Contiguous,
    pub b: Contiguous,
}

fn coop(spec: &KernelSpec) -> bool {
    spec.grid.matrix == Matrix::Coop16
}

/// The entry point's builtins: the workgroup, the invocation and, on cooperative matrices,
/// the subgroup (whose fragments a subgroup owns must be uniform over its invocations, which
/// `subgroup_id` is by definition and `tid / 32` is not).
pub(super) fn entry_args(spec: &KernelSpec) -> &'static str {
    match coop(spec) {
        true => {
            "@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32,\n    \
             @builtin(subgroup_id) sg: u32"
        }
        false => "@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32",
    }
}

/// The entry point's first statement: the subgroup into `sg_id` for the products.
pub(super) fn entry_prologue(spec: &KernelSpec) -> &'static str {
    match coop(spec) {
        true => "    sg_id = sg;\n",
        false => "",
    }
}

/// The slices, `put_a`/`put_b` and the product of one staged pair.
pub(super) fn core(out: &mut Wgsl, spec: &KernelSpec, staging: Staging) {
    match coop(spec) {
        true => coop_core(out, staging),
        false => scalar_core(out),
    }
}

/// The loop over staged slices `step` = 0, BK, .. < `count` of one product, `stage` filling
/// the slices, leaving the product in `acc`. Every product is summed as a framework sums
/// it: leaves of BLOCK·BLOCK terms (`FOLD` slices) into a fresh branch, the branches into
/// the total (on scalar products with their rounding errors kept, so the long top level of
/// a wide reduction adds none).
pub(super) fn product_loop(
    spec: &KernelSpec,
    staging: Staging,
    (step, count): (&str, &str),
    stage: &str,
) -> String {
    match coop(spec) {
        true => coop_loop(staging, step, count, stage),
        false => scalar_loop(step, count, stage),
    }
}

/// k-major f32 slices (`sh_a[kk * 16 + c]` holds outputs 4c..4c+3 at reduction index kk,
/// so an invocation reads its four rows or columns as one vec4) and the product of one
/// staged pair into the invocation's 4×4 block.
fn scalar_core(out: &mut Wgsl) {
    out.need(&[super::numerics::Helper::TwoSumErr4]);
    let folds: String = (0..4)
        .map(|i| {
            format!(
                "    {{ let t = (*acc)[{i}] + (*mid)[{i}];\n      \
                 (*err)[{i}] = (*err)[{i}] + two_sum_err4((*acc)[{i}], (*mid)[{i}], t);\n      \
                 (*acc)[{i}] = t; }}\n"
            )
        })
        .collect();
    let leaf: String = (0..super::numerics::DOT_BLOCK)
        .map(|c| {
            format!(
                "        {{ let a = sh_a[(h + {c}u) * 16u + ty]; let bv = sh_b[(h + {c}u) * 16u + tx];\n          \
                 p0 = fma(vec4<f32>(a.x), bv, p0); p1 = fma(vec4<f32>(a.y), bv, p1);\n          \
                 p2 = fma(vec4<f32>(a.z), bv, p2); p3 = fma(vec4<f32>(a.w), bv, p3); }}\n"
            )
        })
        .collect();
    let _ = write!(
        out,
        r#"// The staged operand slices: sh_a holds the block's 64 rows of the left operand,
// sh_b its 64 columns of the right one, BK reduction indices each.
var<workgroup> sh_a: array<vec4<f32>, BK * 16u>;
var<workgroup> sh_b: array<vec4<f32>, BK * 16u>;

fn put_a(kk: u32, m: u32, v: f32) {{
    sh_a[kk * 16u + m / 4u][m % 4u] = v;
}}

fn put_b(kk: u32, n: u32, v: f32) {{
    sh_b[kk * 16u + n / 4u][n % 4u] = v;
}}

// The staged slices' products for rows 4·ty.. and columns 4·tx..: each leaf of BLOCK
// terms sums into a fresh partial (as a framework's pairwise leaves), then into `mid`.
fn block_product(tx: u32, ty: u32, mid: ptr<function, array<vec4<f32>, 4>>) {{
    for (var h = 0u; h < BK; h = h + BLOCK) {{
        var p0 = vec4<f32>(0.0);
        var p1 = vec4<f32>(0.0);
        var p2 = vec4<f32>(0.0);
        var p3 = vec4<f32>(0.0);
{leaf}        (*mid)[0] = (*mid)[0] + p0;
        (*mid)[1] = (*mid)[1] + p1;
        (*mid)[2] = (*mid)[2] + p2;
        (*mid)[3] = (*mid)[3] + p3;
    }}
}}

// Adds a branch of the blocked sum into the total, its rounding error into `err`
// (TwoSum), and starts the next branch. (Written out: constant indices keep the blocks
// in registers.)
fn fold(acc: ptr<function, array<vec4<f32>, 4>>, err: ptr<function, array<vec4<f32>, 4>>,
        mid: ptr<function, array<vec4<f32>, 4>>) {{
{folds}    *mid = array<vec4<f32>, 4>();
}}

"#
    );
}

fn scalar_loop(step: &str, count: &str, stage: &str) -> String {
    format!(
        r#"// Initialized explicitly: the loop runs inside others (column blocks, k tiles), and
    // in Chrome (Tint, SwiftShader) a declaration without one was zeroed once, not per trip.
    var acc = array<vec4<f32>, 4>();
    var err = array<vec4<f32>, 4>();
    var mid = array<vec4<f32>, 4>();
    for (var {step} = 0u; {step} < {count}; {step} = {step} + BK) {{
        {stage};
        workgroupBarrier();
        block_product(tx, ty, &mid);
        // The next slice overwrites sh_a and sh_b.
        workgroupBarrier();
        if (({step} / BK) % FOLD == FOLD - 1u) {{
            fold(&acc, &err, &mid);
        }}
    }}
    fold(&acc, &err, &mid);
    acc[0] = acc[0] + err[0];
    acc[1] = acc[1] + err[1];
    acc[2] = acc[2] + err[2];
    acc[3] = acc[3] + err[3];"#
    )
}

/// Fragments of the 64×64 block per subgroup: one 16-row fragment row, `FRAGS` columns.
const FRAGS: u32 = (GEMM_TILE / 16) * (GEMM_TILE / 16) / COOP_SUBGROUPS;

/// Declares one operand's f16 slice and its `put`. Rows are padded by 8 halves (16 bytes:
/// a cooperative load's stride stays 16-byte aligned, and consecutive rows start in
/// different banks).
fn declare(out: &mut Wgsl, name: &str, layout: Contiguous) {
    let (len, at) = match layout {
        Contiguous::Reduction => ("TN * (BK + 8u)", "o * (BK + 8u) + kk"),
        Contiguous::Output => ("BK * (TN + 8u)", "kk * (TN + 8u) + o"),
    };
    let _ = write!(
        out,
        "var<workgroup> sh_{name}h: array<f16, {len}>;\n\n\
         fn put_{name}(kk: u32, o: u32, v: f32) {{\n    sh_{name}h[{at}] = f16(v);\n}}\n\n\
         // Four elements along the slice's contiguous index from (kk, o).\n\
         fn put4_{name}(kk: u32, o: u32, v: vec4<f32>) {{\n    let at = {at};\n    \
         sh_{name}h[at] = f16(v.x);\n    sh_{name}h[at + 1u] = f16(v.y);\n    \
         sh_{name}h[at + 2u] = f16(v.z);\n    sh_{name}h[at + 3u] = f16(v.w);\n}}\n\n"
    );
}

/// The cooperative load of operand `name`'s fragment at reduction fragment `ks` and
/// output fragment `frag`. Element (kk, o) lies at o·stride + kk (reduction-contiguous)
/// or kk·stride + o; coopLoadT reads row-major (element (i, j) at i·stride + j), coopLoad
/// column-major, and A's (i, j) is (o, kk), B's (kk, o).
fn load(name: &str, layout: Contiguous, frag: &str) -> String {
    let is_a = name == "a";
    let (stride, origin, row_major) = match layout {
        Contiguous::Reduction => (
            "BK + 8u",
            format!("({frag}) * 16u * (BK + 8u) + ks * 16u"),
            is_a,
        ),
        Contiguous::Output => (
            "TN + 8u",
            format!("ks * 16u * (TN + 8u) + ({frag}) * 16u"),
            !is_a,
        ),
    };
    format!(
        "{}<{}>(&sh_{name}h[{origin}], {stride})",
        if row_major { "coopLoadT" } else { "coopLoad" },
        if is_a { A } else { B }
    )
}

fn coop_core(out: &mut Wgsl, staging: Staging) {
    out.push_str(
        "// f32 scratch of the kernels' row reductions after a product (one vec4 per invocation).\n\
         var<workgroup> sh_a: array<vec4<f32>, WG>;\nvar<workgroup> sh_b: array<vec4<f32>, WG>;\n\
         // The finished 64×64 block, from the subgroups' fragments to the invocations' 4×4.\n\
         const CS: u32 = TN + 4u;\nvar<workgroup> sh_c: array<f32, TN * CS>;\n\
         // The invocation's subgroup (set by the entry point): it owns fragment row sg % 4,\n\
         // fragment columns (sg / 4)·FRAGS...\nvar<private> sg_id: u32;\n\n",
    );
    let _ = write!(out, "const FRAGS: u32 = {FRAGS}u;\n\n");
    declare(out, "a", staging.a);
    declare(out, "b", staging.b);
    let _ = write!(
        out,
        r#"// The block's rows 4·ty.. and columns 4·tx.. of a finished product out of sh_c.
fn block_of_c(tx: u32, ty: u32) -> array<vec4<f32>, 4> {{
    var acc: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i = i + 1u) {{
        let at = (ty * 4u + i) * CS + tx * 4u;
        acc[i] = vec4<f32>(sh_c[at], sh_c[at + 1u], sh_c[at + 2u], sh_c[at + 3u]);
    }}
    return acc;
}}

"#
    );
}

/// The subgroup's product loop, written out (cooperative matrices live in named variables:
/// `tot_f` the total, `mid_f` the branch of fragment column f).
fn coop_loop(staging: Staging, step: &str, count: &str, stage: &str) -> String {
    let mut b = String::new();
    let decls: Vec<String> = (0..FRAGS)
        .map(|f| format!("var tot_{f} = {C}();\n    var mid_{f} = {C}();"))
        .collect();
    let _ = write!(
        b,
        "{}\n    for (var {step} = 0u; {step} < {count}; {step} = {step} + BK) {{\n        \
         {stage};\n        workgroupBarrier();\n        \
         for (var ks = 0u; ks < BK / 16u; ks = ks + 1u) {{\n            let a = {};\n",
        decls.join("\n    "),
        load("a", staging.a, "sg_id % 4u")
    );
    for f in 0..FRAGS {
        let frag = format!("(sg_id / 4u) * FRAGS + {f}u");
        let _ = writeln!(
            b,
            "            mid_{f} = coopMultiplyAdd(a, {}, mid_{f});",
            load("b", staging.b, &frag)
        );
    }
    b.push_str(
        "        }\n        // The next slice overwrites the staged halves.\n        workgroupBarrier();\n",
    );
    let _ = writeln!(b, "        if (({step} / BK) % FOLD == FOLD - 1u) {{");
    for f in 0..FRAGS {
        let _ = writeln!(
            b,
            "            tot_{f} = tot_{f} + mid_{f};\n            mid_{f} = {C}();"
        );
    }
    b.push_str("        }\n    }\n");
    for f in 0..FRAGS {
        let _ = writeln!(
            b,
            "    coopStoreT(tot_{f} + mid_{f}, &sh_c[(sg_id % 4u) * 16u * CS + ((sg_id / 4u) * FRAGS + {f}u) * 16u], CS);"
        );
    }
    b.push_str(
        "    workgroupBarrier();\n    var acc = block_of_c(tx, ty);\n    \
         // The next product stores into sh_c.\n    workgroupBarrier();",
    );
    b
}
