//! [`Op::Matmul`](crate::spec::Op::Matmul): `c = a·b (+ bias)` on cooperative matrices,
//! f16 operands read from memory as they are (no conversion while staging: what made the
//! LayerNorm + Linear kernels that round f32 operands as they stage them slow), f32 sums.
//!
//! A workgroup owns a BM×BN block of `c` (one of `split` parts of the reduction): it
//! fetches the next slice of both operands into registers while the subgroups multiply the
//! staged one, each subgroup a 64×32 block of 4×2 fragments. Sums are blocked as a
//! framework's are: each `FOLD` slices into a fresh branch, the branches into the total.
//! Rows and columns past `m` and `n` read clamped indices (their outputs are not stored)
//! and the reduction past `k` reads zeros, so any shape runs whose contiguous index is a
//! multiple of 4 (one vec4 of halves per load).

use super::coop::{A, B, C};
use super::writer::{Fragment, Template, Wgsl, concat, lines, uint};

use crate::layout::matmul::{BK, BM, BN, PAD, WM, WN, WORKGROUP, slice_halves};
use crate::spec::{Along, KernelSpec};

/// Fragments per subgroup along the block's rows and columns.
const FM: u32 = BM / WM / 16;
const FN: u32 = BN / WN / 16;

fn form(spec: &KernelSpec) -> crate::spec::MatmulForm {
    spec.matmul_form()
}

pub(super) fn constants(out: &mut Wgsl, spec: &KernelSpec) {
    let f = form(spec);
    let stride = |along: Along, outputs: u32| match along {
        Along::Reduction => BK + PAD,
        Along::Output => outputs + PAD,
    };
    out.put(CONSTANTS.fill([
        ("wg", uint(WORKGROUP)),
        ("bm", uint(BM)),
        ("bn", uint(BN)),
        ("bk", uint(BK)),
        ("wm", uint(WM)),
        ("sa", uint(stride(f.a, BM))),
        ("sb", uint(stride(f.b, BN))),
        (
            "fold",
            uint((super::numerics::DOT_BLOCK * super::numerics::DOT_BLOCK / BK).max(1)),
        ),
    ]));
}

/// The matmul's shape: the workgroup, the block and slice, the subgroups along the rows,
/// the staged rows' strides and the slices per branch (each a u32 literal).
const CONSTANTS: Template = Template {
    name: "matmul_constants",
    needs: &[],
    text: r#"const WG: u32 = $wg;
const BM: u32 = $bm;
const BN: u32 = $bn;
const BK: u32 = $bk;
const WM: u32 = $wm;
// Staged rows' strides, in halves.
const SA: u32 = $sa;
const SB: u32 = $sb;
// Staged slices per branch of the blocked sum (BLOCK·BLOCK terms).
const FOLD: u32 = $fold;

"#,
};

pub(super) fn body(out: &mut Wgsl, spec: &KernelSpec) {
    let f = form(spec);
    out.put(SLICES.fill([
        ("a_len", uint(slice_halves(f.a, BM) / 4)),
        ("b_len", uint(slice_halves(f.b, BN) / 4)),
        ("c_len", uint(256 * WM * WN)),
    ]));
    operand(out, "a", f.a, ("BM", "m"));
    operand(out, "b", f.b, ("BN", "n"));
    entry(out, spec);
}

/// The workgroup memory: the staged slices (`$a_len` and `$b_len` vec4s) and the
/// subgroups' finished fragments (`$c_len` floats).
const SLICES: Template = Template {
    name: "matmul_slices",
    needs: &[],
    text: r#"// The staged slices, four halves to an element: one store (and one index clamp) per
// fetched vec4 instead of four.
var<workgroup> sh_a: array<vec4<f16>, $a_len>;
var<workgroup> sh_b: array<vec4<f16>, $b_len>;
// Each subgroup's finished fragment, on its way to the masked store.
var<workgroup> sh_c: array<f32, $c_len>;

"#,
};

/// `fetch_{name}(e, k0, kend, o0)`: vec4 `e` of the operand's slice from reduction index
/// k0 (zeros from `kend`) for the block's outputs from o0; `put_{name}(e, v)`: it, staged.
fn operand(out: &mut Wgsl, name: &str, along: Along, (block, len): (&str, &str)) {
    // The operand's row stride in workgroup memory.
    let stride = if name == "a" { "SA" } else { "SB" };
    let operand = [
        ("name", Fragment::from(name)),
        ("outputs", Fragment::from(len)),
    ];
    let (fetch, at) = match along {
        Along::Reduction => (
            FETCH_ALONG_REDUCTION.fill(operand),
            format!("(e / (BK / 4u)) * {stride} + (e % (BK / 4u)) * 4u"),
        ),
        Along::Output => (
            FETCH_ALONG_OUTPUT.fill(
                operand
                    .into_iter()
                    .chain([("block", Fragment::from(block))]),
            ),
            format!("(e / ({block} / 4u)) * {stride} + (e % ({block} / 4u)) * 4u"),
        ),
    };
    out.put(OPERAND.fill([
        ("name", Fragment::from(name)),
        ("fetch", fetch),
        ("at", Fragment::from(at)),
    ]));
}

/// `fetch_$name` and `put_$name`: `$fetch` loads `v`, the vec4 at reduction index `kk`,
/// and `$at` is where it is staged, in halves.
const OPERAND: Template = Template {
    name: "matmul_operand",
    needs: &[],
    text: r#"fn fetch_$name(e: u32, k0: u32, kend: u32, o0: u32) -> vec4<f16> {
    $fetch
    return select(vec4<f16>(0.0), v, kk < kend);
}

fn put_$name(e: u32, v: vec4<f16>) {
    let at = $at;
    sh_$name[at / 4u] = v;
}

"#,
};

/// The load of operand `$name` laid out along the reduction: the output index clamped to
/// the `dims.$outputs` outputs, the reduction index to the last whole vec4.
const FETCH_ALONG_REDUCTION: Template = Template {
    name: "fetch_along_reduction",
    needs: &[],
    text: r#"let o = min(o0 + e / (BK / 4u), dims.$outputs - 1u);
let kk = k0 + (e % (BK / 4u)) * 4u;
let v = $name[(o * dims.k + min(kk, dims.k - 4u)) / 4u];
"#,
};

/// The load of operand `$name` laid out along its `dims.$outputs` outputs (`$block` of
/// them per block): the reduction index clamped to the last row, the output index to the
/// last whole vec4.
const FETCH_ALONG_OUTPUT: Template = Template {
    name: "fetch_along_output",
    needs: &[],
    text: r#"let kk = k0 + e / ($block / 4u);
let o = min(o0 + (e % ($block / 4u)) * 4u, dims.$outputs - 4u);
let v = $name[(min(kk, dims.k - 1u) * dims.$outputs + o) / 4u];
"#,
};

/// Fragment `i` of the subgroup's rows (a) or columns (b) at reduction fragment `ks`. The
/// slices hold vec4s of halves, and a cooperative load's stride counts the elements its
/// pointer points at, so origin and stride (in halves, multiples of 4) are divided by 4 (on
/// an H100 a stride in halves read the wrong rows; staged as single halves, four 2-byte
/// stores per vec4, the matmuls took 20% longer: dx̂ₙ of the LayerNorm + Linear 0.336 ms
/// against 0.278).
/// coopLoadT reads row-major (element (r, c) at r·stride + c), coopLoad column-major; a's
/// (r, c) is (output, reduction), b's (reduction, output).
fn fragment(name: &str, along: Along, i: u32) -> String {
    let (first, ty, row_major_if_reduction, stride) = match name {
        "a" => (format!("wm * {}u + {i}u * 16u", FM * 16), A, true, "SA"),
        _ => (format!("wn * {}u + {i}u * 16u", FN * 16), B, false, "SB"),
    };
    let (origin, row_major) = match along {
        Along::Reduction => (
            format!("({first}) * {stride} + ks * 16u"),
            row_major_if_reduction,
        ),
        Along::Output => (
            format!("ks * 16u * {stride} + {first}"),
            !row_major_if_reduction,
        ),
    };
    let load = if row_major { "coopLoadT" } else { "coopLoad" };
    format!("{load}<{ty}>(&sh_{name}[({origin}) / 4u], {stride} / 4u)")
}

fn entry(out: &mut Wgsl, spec: &KernelSpec) {
    let f = form(spec);
    let frags: Vec<(u32, u32)> = (0..FM).flat_map(|i| (0..FN).map(move |j| (i, j))).collect();
    let fragments = lines(
        (0..FM)
            .map(|i| format!("let fa_{i} = {};", fragment("a", f.a, i)))
            .chain((0..FN).map(|j| format!("let fb_{j} = {};", fragment("b", f.b, j)))),
    );
    let products = lines(
        frags
            .iter()
            .map(|&(i, j)| format!("mid_{i}_{j} = coopMultiplyAdd(fa_{i}, fb_{j}, mid_{i}_{j});")),
    );
    let bias = if f.bias { " + bias[col]" } else { "" };
    let fills = [
        ("name", Fragment::from(spec.name.as_str())),
        ("bias", Fragment::from(bias)),
        ("accumulators", accumulators(&frags)),
        ("fragments", fragments),
        ("products", products),
        ("folds", folds(&frags)),
        ("stores", concat(frags.iter().map(|&(i, j)| store(i, j)))),
    ];
    out.put(ENTRY.fill(fills.into_iter().chain(registers())));
}

/// The next slice's vec4s held in registers while the staged one is multiplied:
/// `$registers` their declarations, `$fetch_first` and `$fetch_next` their loads, `$puts`
/// their stores into the slices.
fn registers() -> [(&'static str, Fragment); 4] {
    let per = |outputs: u32| outputs * BK / 4 / WORKGROUP;
    let (ca, cb) = (per(BM), per(BN));
    let operands = |a: &dyn Fn(u32) -> String, b: &dyn Fn(u32) -> String| {
        lines((0..ca).map(a).chain((0..cb).map(b)))
    };
    let fetches = |k0: &str| {
        operands(
            &|c| format!("pa_{c} = fetch_a(tid + {c}u * WG, {k0}, kend, m0);"),
            &|c| format!("pb_{c} = fetch_b(tid + {c}u * WG, {k0}, kend, n0);"),
        )
    };
    let declarations = operands(&|c| format!("var pa_{c}: vec4<f16>;"), &|c| {
        format!("var pb_{c}: vec4<f16>;")
    });
    let puts = operands(&|c| format!("put_a(tid + {c}u * WG, pa_{c});"), &|c| {
        format!("put_b(tid + {c}u * WG, pb_{c});")
    });
    [
        ("registers", declarations),
        ("fetch_first", fetches("kb")),
        ("puts", puts),
        ("fetch_next", fetches("k0 + BK")),
    ]
}

/// Every fragment's total and branch.
fn accumulators(frags: &[(u32, u32)]) -> Fragment {
    lines(frags.iter().flat_map(|&(i, j)| {
        [
            format!("var tot_{i}_{j} = {C}();"),
            format!("var mid_{i}_{j} = {C}();"),
        ]
    }))
}

/// Every fragment's branch into its total, and a fresh branch.
fn folds(frags: &[(u32, u32)]) -> Fragment {
    lines(frags.iter().flat_map(|&(i, j)| {
        [
            format!("tot_{i}_{j} = tot_{i}_{j} + mid_{i}_{j};"),
            format!("mid_{i}_{j} = {C}();"),
        ]
    }))
}

/// Fragment (i, j)'s total into c, through sh_c.
fn store(i: u32, j: u32) -> Fragment {
    STORE.fill([
        ("f", Fragment::from(format!("{i}_{j}"))),
        (
            "r0",
            Fragment::from(format!("m0 + wm * {}u + {i}u * 16u", FM * 16)),
        ),
        (
            "c0",
            Fragment::from(format!("n0 + wn * {}u + {j}u * 16u", FN * 16)),
        ),
    ])
}

/// Fragment `$f`'s total (its branch added) through the subgroup's part of sh_c into c at
/// (`$r0`, `$c0`); the barriers keep sh_c's reads and writes apart.
const STORE: Template = Template {
    name: "matmul_store",
    needs: &[],
    text: r#"coopStoreT(tot_$f + mid_$f, &sh_c[sg * 256u], 16u);
workgroupBarrier();
store_fragment(sg, lane, part, $r0, $c0);
workgroupBarrier();
"#,
};

/// The store and the entry point: `$accumulators` each fragment's total and branch,
/// `$registers` the next slice's vec4s held while the staged one is multiplied (fetched by
/// `$fetch_first` and `$fetch_next`, staged by `$puts`), `$fragments` the subgroup's A and
/// B fragments of a reduction fragment, `$products` their products into the branches,
/// `$folds` the branches into the totals every FOLD slices, and `$stores` the totals into
/// c (`$bias` added).
const ENTRY: Template = Template {
    name: "matmul",
    needs: &[],
    text: r#"// The subgroup's finished fragment from sh_c into c at (r0, c0) of part `part`,
// each of its 32 invocations 8 of the 256 values, rows and columns past m and n skipped.
fn store_fragment(sg: u32, lane: u32, part: u32, r0: u32, c0: u32) {
    for (var e = 0u; e < 8u; e = e + 1u) {
        let at = lane + e * 32u;
        let row = r0 + at / 16u;
        let col = c0 + at % 16u;
        if (row < dims.m && col < dims.n) {
            c[(part * dims.m + row) * dims.n + col] = sh_c[sg * 256u + at]$bias;
        }
    }
}

@compute @workgroup_size(WG)
fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32,
    @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let m0 = wg.y * BM;
    let n0 = wg.x * BN;
    let part = wg.z;
    // Whole slices per part of the reduction.
    let per_part = ((dims.k + dims.split * BK - 1u) / (dims.split * BK)) * BK;
    let kb = part * per_part;
    let kend = min(kb + per_part, dims.k);
    let wm = sg % WM;
    let wn = sg / WM;
    $accumulators
    $registers
    $fetch_first
    for (var k0 = kb; k0 < kend; k0 = k0 + BK) {
        // The previous slice's products are done before its staging is overwritten.
        workgroupBarrier();
        $puts
        workgroupBarrier();
        if (k0 + BK < kend) {
            $fetch_next
        }
        for (var ks = 0u; ks < BK / 16u; ks = ks + 1u) {
            $fragments
            $products
        }
        if (((k0 - kb) / BK) % FOLD == FOLD - 1u) {
            $folds
        }
    }
    $stores
}
"#,
};
