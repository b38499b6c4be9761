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
use super::numerics::{DOT_BLOCK, Helper};
use super::writer::{Fragment, Template, Wgsl, concat, lines, uint};

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

/// The entry point `name`'s signature, up to its opening brace, and on cooperative
/// matrices its first statement, the subgroup into `sg_id` for the products; the kernel's
/// template continues the body and closes it.
pub(super) fn entry(spec: &KernelSpec, name: &str) -> Fragment {
    let template = match coop(spec) {
        true => &ENTRY_COOP,
        false => &ENTRY_SCALAR,
    };
    template.fill([("name", Fragment::from(name))])
}

/// The entry point's builtins: the workgroup and the invocation.
const ENTRY_SCALAR: Template = Template {
    name: "row_gemm_entry",
    needs: &[],
    text: r#"fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
"#,
};

/// On cooperative matrices the entry point also takes the subgroup: the fragments a
/// subgroup owns must be uniform over its invocations, which `subgroup_id` is by definition
/// and `tid / 32` is not.
const ENTRY_COOP: Template = Template {
    name: "row_gemm_entry_coop",
    needs: &[],
    text: r#"fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32,
    @builtin(subgroup_id) sg: u32) {
    sg_id = sg;
"#,
};

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
) -> Fragment {
    let loop_fills = [
        ("step", Fragment::from(step)),
        ("count", Fragment::from(count)),
        ("stage", Fragment::from(stage)),
    ];
    match coop(spec) {
        true => coop_loop(staging, loop_fills),
        false => SCALAR_LOOP.fill(loop_fills),
    }
}

/// k-major f32 slices (`sh_a[kk * 16 + c]` holds outputs 4c..4c+3 at reduction index kk,
/// so an invocation reads its four rows or columns as one vec4) and the product of one
/// staged pair into the invocation's 4×4 block.
fn scalar_core(out: &mut Wgsl) {
    let folds = (0..4).map(|i| FOLD_ROW.fill([("i", Fragment::from(i.to_string()))]));
    let leaf = (0..DOT_BLOCK).map(|c| LEAF_TERM.fill([("c", uint(c))]));
    out.put(SCALAR_CORE.fill([("leaf", concat(leaf)), ("folds", concat(folds))]));
}

/// The scalar slices and products: `$leaf` the terms of one leaf ([`LEAF_TERM`]), `$folds`
/// the four rows' folds ([`FOLD_ROW`]).
const SCALAR_CORE: Template = Template {
    name: "scalar_core",
    needs: &[],
    text: r#"// The staged operand slices: sh_a holds the block's 64 rows of the left operand,
// sh_b its 64 columns of the right one, BK reduction indices each.
var<workgroup> sh_a: array<vec4<f32>, BK * 16u>;
var<workgroup> sh_b: array<vec4<f32>, BK * 16u>;

fn put_a(kk: u32, m: u32, v: f32) {
    sh_a[kk * 16u + m / 4u][m % 4u] = v;
}

fn put_b(kk: u32, n: u32, v: f32) {
    sh_b[kk * 16u + n / 4u][n % 4u] = v;
}

// The staged slices' products for rows 4·ty.. and columns 4·tx..: each leaf of BLOCK
// terms sums into a fresh partial (as a framework's pairwise leaves), then into `mid`.
fn block_product(tx: u32, ty: u32, mid: ptr<function, array<vec4<f32>, 4>>) {
    for (var h = 0u; h < BK; h = h + BLOCK) {
        var p0 = vec4<f32>(0.0);
        var p1 = vec4<f32>(0.0);
        var p2 = vec4<f32>(0.0);
        var p3 = vec4<f32>(0.0);
        $leaf
        (*mid)[0] = (*mid)[0] + p0;
        (*mid)[1] = (*mid)[1] + p1;
        (*mid)[2] = (*mid)[2] + p2;
        (*mid)[3] = (*mid)[3] + p3;
    }
}

// Adds a branch of the blocked sum into the total, its rounding error into `err`
// (TwoSum), and starts the next branch. (Written out: constant indices keep the blocks
// in registers.)
fn fold(acc: ptr<function, array<vec4<f32>, 4>>, err: ptr<function, array<vec4<f32>, 4>>,
        mid: ptr<function, array<vec4<f32>, 4>>) {
    $folds
    *mid = array<vec4<f32>, 4>();
}

"#,
};

/// Term `$c` (a u32 literal) of a leaf: reduction index h + c of the staged slices
/// multiplied into the invocation's four partial rows.
const LEAF_TERM: Template = Template {
    name: "leaf_term",
    needs: &[],
    text: r#"{ let a = sh_a[(h + $c) * 16u + ty]; let bv = sh_b[(h + $c) * 16u + tx];
  p0 = fma(vec4<f32>(a.x), bv, p0); p1 = fma(vec4<f32>(a.y), bv, p1);
  p2 = fma(vec4<f32>(a.z), bv, p2); p3 = fma(vec4<f32>(a.w), bv, p3); }
"#,
};

/// Row `$i` of a branch added into the total, its rounding error kept (TwoSum).
const FOLD_ROW: Template = Template {
    name: "fold_row",
    needs: &[Helper::TwoSumErr4],
    text: r#"{ let t = (*acc)[$i] + (*mid)[$i];
  (*err)[$i] = (*err)[$i] + two_sum_err4((*acc)[$i], (*mid)[$i], t);
  (*acc)[$i] = t; }
"#,
};

/// The scalar [`product_loop`]: slices `$step` = 0, BK, .. < `$count` staged by `$stage`,
/// their products folded into the total every FOLD slices (by `fold` of [`SCALAR_CORE`]).
const SCALAR_LOOP: Template = Template {
    name: "scalar_loop",
    needs: &[],
    text: r#"// Initialized explicitly: the loop runs inside others (column blocks, k tiles), and
// in Chrome (Tint, SwiftShader) a declaration without one was zeroed once, not per trip.
var acc = array<vec4<f32>, 4>();
var err = array<vec4<f32>, 4>();
var mid = array<vec4<f32>, 4>();
for (var $step = 0u; $step < $count; $step = $step + BK) {
    $stage;
    workgroupBarrier();
    block_product(tx, ty, &mid);
    // The next slice overwrites sh_a and sh_b.
    workgroupBarrier();
    if (($step / BK) % FOLD == FOLD - 1u) {
        fold(&acc, &err, &mid);
    }
}
fold(&acc, &err, &mid);
acc[0] = acc[0] + err[0];
acc[1] = acc[1] + err[1];
acc[2] = acc[2] + err[2];
acc[3] = acc[3] + err[3];
"#,
};

/// Fragments of the 64×64 block per subgroup: one 16-row fragment row, `FRAGS` columns.
const FRAGS: u32 = (GEMM_TILE / 16) * (GEMM_TILE / 16) / COOP_SUBGROUPS;

/// Declares one operand's f16 slice and its `put`. Rows are padded by 8 halves (16 bytes:
/// a cooperative load's stride stays 16-byte aligned, and consecutive rows start in
/// different banks).
fn declare(name: &str, layout: Contiguous) -> Fragment {
    let (len, at) = match layout {
        Contiguous::Reduction => ("TN * (BK + 8u)", "o * (BK + 8u) + kk"),
        Contiguous::Output => ("BK * (TN + 8u)", "kk * (TN + 8u) + o"),
    };
    SLICE.fill([
        ("slice", Fragment::from(format!("sh_{name}h"))),
        ("put", Fragment::from(format!("put_{name}"))),
        ("put4", Fragment::from(format!("put4_{name}"))),
        ("len", Fragment::from(len)),
        ("at", Fragment::from(at)),
    ])
}

/// An operand's f16 slice `$slice` of `$len` halves, element (kk, o) at `$at`, and its
/// writers `$put` (one element) and `$put4` (four).
const SLICE: Template = Template {
    name: "coop_slice",
    needs: &[],
    text: r#"var<workgroup> $slice: array<f16, $len>;

fn $put(kk: u32, o: u32, v: f32) {
    $slice[$at] = f16(v);
}

// Four elements along the slice's contiguous index from (kk, o).
fn $put4(kk: u32, o: u32, v: vec4<f32>) {
    let at = $at;
    $slice[at] = f16(v.x);
    $slice[at + 1u] = f16(v.y);
    $slice[at + 2u] = f16(v.z);
    $slice[at + 3u] = f16(v.w);
}

"#,
};

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
    out.put(COOP_CORE.fill([
        ("frags", uint(FRAGS)),
        ("slice_a", declare("a", staging.a)),
        ("slice_b", declare("b", staging.b)),
    ]));
}

/// The cooperative products' workgroup memory: the f16 slices (`$slice_a`, `$slice_b`,
/// [`SLICE`]), the finished block and the f32 scratch of the row reductions after it.
const COOP_CORE: Template = Template {
    name: "coop_core",
    needs: &[],
    text: r#"// f32 scratch of the kernels' row reductions after a product (one vec4 per invocation).
var<workgroup> sh_a: array<vec4<f32>, WG>;
var<workgroup> sh_b: array<vec4<f32>, WG>;
// The finished 64×64 block, from the subgroups' fragments to the invocations' 4×4.
const CS: u32 = TN + 4u;
var<workgroup> sh_c: array<f32, TN * CS>;
// The invocation's subgroup (set by the entry point): it owns fragment row sg % 4,
// fragment columns (sg / 4)·FRAGS...
var<private> sg_id: u32;

const FRAGS: u32 = $frags;

$slice_a
$slice_b
// The block's rows 4·ty.. and columns 4·tx.. of a finished product out of sh_c.
fn block_of_c(tx: u32, ty: u32) -> array<vec4<f32>, 4> {
    var acc: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i = i + 1u) {
        let at = (ty * 4u + i) * CS + tx * 4u;
        acc[i] = vec4<f32>(sh_c[at], sh_c[at + 1u], sh_c[at + 2u], sh_c[at + 3u]);
    }
    return acc;
}

"#,
};

/// The subgroup's product loop, written out (cooperative matrices live in named variables:
/// `tot_f` the total, `mid_f` the branch of fragment column f).
fn coop_loop(staging: Staging, loop_fills: [(&str, Fragment); 3]) -> Fragment {
    let each = |f: &dyn Fn(u32) -> String| lines((0..FRAGS).map(f));
    let accumulators = lines((0..FRAGS).flat_map(|f| {
        [
            format!("var tot_{f} = {C}();"),
            format!("var mid_{f} = {C}();"),
        ]
    }));
    let products = each(&|f| {
        let frag = format!("(sg_id / 4u) * FRAGS + {f}u");
        format!(
            "mid_{f} = coopMultiplyAdd(a, {}, mid_{f});",
            load("b", staging.b, &frag)
        )
    });
    let folds = lines((0..FRAGS).flat_map(|f| {
        [
            format!("tot_{f} = tot_{f} + mid_{f};"),
            format!("mid_{f} = {C}();"),
        ]
    }));
    let stores = each(&|f| {
        format!(
            "coopStoreT(tot_{f} + mid_{f}, &sh_c[(sg_id % 4u) * 16u * CS + ((sg_id / 4u) * FRAGS + {f}u) * 16u], CS);"
        )
    });
    COOP_LOOP.fill(loop_fills.into_iter().chain([
        ("accumulators", accumulators),
        ("load_a", Fragment::from(load("a", staging.a, "sg_id % 4u"))),
        ("products", products),
        ("folds", folds),
        ("stores", stores),
    ]))
}

/// The cooperative [`product_loop`]: `$accumulators` each fragment column's total and
/// branch, the staged A fragment (`$load_a`) multiplied into each column's branch
/// (`$products`), the branches folded into the totals (`$folds`) every FOLD slices, and
/// the totals through sh_c (`$stores`) into the invocation's 4×4 block `acc`.
const COOP_LOOP: Template = Template {
    name: "coop_loop",
    needs: &[],
    text: r#"$accumulators
for (var $step = 0u; $step < $count; $step = $step + BK) {
    $stage;
    workgroupBarrier();
    for (var ks = 0u; ks < BK / 16u; ks = ks + 1u) {
        let a = $load_a;
        $products
    }
    // The next slice overwrites the staged halves.
    workgroupBarrier();
    if (($step / BK) % FOLD == FOLD - 1u) {
        $folds
    }
}
$stores
workgroupBarrier();
var acc = block_of_c(tx, ty);
// The next product stores into sh_c.
workgroupBarrier();
"#,
};
