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
use super::writer::Wgsl;
use std::fmt::Write;

use crate::layout::MATMUL_DEFAULT;
use crate::layout::matmul::{BK, BM, BN, PAD, WM, WN, WORKGROUP, slice_halves};
use crate::spec::{Along, KernelSpec};

/// Fragments per subgroup along the block's rows and columns.
const FM: u32 = BM / WM / 16;
const FN: u32 = BN / WN / 16;

fn form(spec: &KernelSpec) -> crate::spec::MatmulForm {
    spec.matmul.unwrap_or(MATMUL_DEFAULT)
}

pub(super) fn constants(out: &mut Wgsl, spec: &KernelSpec) {
    let f = form(spec);
    let stride = |along: Along, outputs: u32| match along {
        Along::Reduction => BK + PAD,
        Along::Output => outputs + PAD,
    };
    let _ = write!(
        out,
        "const WG: u32 = {WORKGROUP}u;\nconst BM: u32 = {BM}u;\nconst BN: u32 = {BN}u;\n\
         const BK: u32 = {BK}u;\nconst WM: u32 = {WM}u;\n\
         // Staged rows' strides, in halves.\nconst SA: u32 = {}u;\nconst SB: u32 = {}u;\n\
         // Staged slices per branch of the blocked sum (BLOCK·BLOCK terms).\n\
         const FOLD: u32 = {}u;\n\n",
        stride(f.a, BM),
        stride(f.b, BN),
        (super::numerics::DOT_BLOCK * super::numerics::DOT_BLOCK / BK).max(1),
    );
}

pub(super) fn body(out: &mut Wgsl, spec: &KernelSpec) {
    let f = form(spec);
    let _ = write!(
        out,
        "// The staged slices, four halves to an element: one store (and one index clamp) per\n\
         // fetched vec4 instead of four.\n\
         var<workgroup> sh_a: array<vec4<f16>, {}u>;\nvar<workgroup> sh_b: array<vec4<f16>, {}u>;\n\
         // Each subgroup's finished fragment, on its way to the masked store.\n\
         var<workgroup> sh_c: array<f32, {}u>;\n\n",
        slice_halves(f.a, BM) / 4,
        slice_halves(f.b, BN) / 4,
        256 * WM * WN
    );
    operand(out, "a", f.a, ("BM", "m"));
    operand(out, "b", f.b, ("BN", "n"));
    entry(out, spec);
}

/// `fetch_{name}(e, k0, kend, o0)`: vec4 `e` of the operand's slice from reduction index
/// k0 (zeros from `kend`) for the block's outputs from o0; `put_{name}(e, v)`: it, staged.
fn operand(out: &mut Wgsl, name: &str, along: Along, (block, len): (&str, &str)) {
    // The operand's row stride in workgroup memory.
    let stride = if name == "a" { "SA" } else { "SB" };
    let (fetch, at) = match along {
        Along::Reduction => (
            format!(
                "let o = min(o0 + e / (BK / 4u), dims.{len} - 1u);\n    \
                 let kk = k0 + (e % (BK / 4u)) * 4u;\n    \
                 let v = {name}[(o * dims.k + min(kk, dims.k - 4u)) / 4u];"
            ),
            format!("(e / (BK / 4u)) * {stride} + (e % (BK / 4u)) * 4u"),
        ),
        Along::Output => (
            format!(
                "let kk = k0 + e / ({block} / 4u);\n    \
                 let o = min(o0 + (e % ({block} / 4u)) * 4u, dims.{len} - 4u);\n    \
                 let v = {name}[(min(kk, dims.k - 1u) * dims.{len} + o) / 4u];"
            ),
            format!("(e / ({block} / 4u)) * {stride} + (e % ({block} / 4u)) * 4u"),
        ),
    };
    let _ = write!(
        out,
        "fn fetch_{name}(e: u32, k0: u32, kend: u32, o0: u32) -> vec4<f16> {{\n    \
         {fetch}\n    return select(vec4<f16>(0.0), v, kk < kend);\n}}\n\n\
         fn put_{name}(e: u32, v: vec4<f16>) {{\n    let at = {at};\n    \
         sh_{name}[at / 4u] = v;\n}}\n\n"
    );
}

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
    let per = |outputs: u32| outputs * BK / 4 / WORKGROUP;
    let (ca, cb) = (per(BM), per(BN));
    let frags: Vec<(u32, u32)> = (0..FM).flat_map(|i| (0..FN).map(move |j| (i, j))).collect();
    let mut b = String::new();
    for &(i, j) in &frags {
        let _ = writeln!(
            b,
            "    var tot_{i}_{j} = {C}();\n    var mid_{i}_{j} = {C}();"
        );
    }
    let fetches = |indent: &str, k0: &str| -> String {
        let mut s = String::new();
        for c in 0..ca {
            let _ = writeln!(
                s,
                "{indent}pa_{c} = fetch_a(tid + {c}u * WG, {k0}, kend, m0);"
            );
        }
        for c in 0..cb {
            let _ = writeln!(
                s,
                "{indent}pb_{c} = fetch_b(tid + {c}u * WG, {k0}, kend, n0);"
            );
        }
        s
    };
    for c in 0..ca {
        let _ = writeln!(b, "    var pa_{c}: vec4<f16>;");
    }
    for c in 0..cb {
        let _ = writeln!(b, "    var pb_{c}: vec4<f16>;");
    }
    b.push_str(&fetches("    ", "kb"));
    b.push_str(
        "    for (var k0 = kb; k0 < kend; k0 = k0 + BK) {\n        \
         // The previous slice's products are done before its staging is overwritten.\n        \
         workgroupBarrier();\n",
    );
    for c in 0..ca {
        let _ = writeln!(b, "        put_a(tid + {c}u * WG, pa_{c});");
    }
    for c in 0..cb {
        let _ = writeln!(b, "        put_b(tid + {c}u * WG, pb_{c});");
    }
    b.push_str("        workgroupBarrier();\n        if (k0 + BK < kend) {\n");
    b.push_str(&fetches("            ", "k0 + BK"));
    b.push_str("        }\n        for (var ks = 0u; ks < BK / 16u; ks = ks + 1u) {\n");
    for i in 0..FM {
        let _ = writeln!(b, "            let fa_{i} = {};", fragment("a", f.a, i));
    }
    for j in 0..FN {
        let _ = writeln!(b, "            let fb_{j} = {};", fragment("b", f.b, j));
    }
    for &(i, j) in &frags {
        let _ = writeln!(
            b,
            "            mid_{i}_{j} = coopMultiplyAdd(fa_{i}, fb_{j}, mid_{i}_{j});"
        );
    }
    b.push_str("        }\n        if (((k0 - kb) / BK) % FOLD == FOLD - 1u) {\n");
    for &(i, j) in &frags {
        let _ = writeln!(
            b,
            "            tot_{i}_{j} = tot_{i}_{j} + mid_{i}_{j};\n            mid_{i}_{j} = {C}();"
        );
    }
    b.push_str("        }\n    }\n");
    let bias = if f.bias { " + bias[col]" } else { "" };
    for &(i, j) in &frags {
        let _ = write!(
            b,
            "    coopStoreT(tot_{i}_{j} + mid_{i}_{j}, &sh_c[sg * 256u], 16u);\n    \
             workgroupBarrier();\n    \
             store_fragment(sg, lane, part, m0 + wm * {}u + {i}u * 16u, n0 + wn * {}u + {j}u * 16u);\n    \
             workgroupBarrier();\n",
            FM * 16,
            FN * 16,
        );
    }
    let _ = write!(
        out,
        r#"// The subgroup's finished fragment from sh_c into c at (r0, c0) of part `part`,
// each of its 32 invocations 8 of the 256 values, rows and columns past m and n skipped.
fn store_fragment(sg: u32, lane: u32, part: u32, r0: u32, c0: u32) {{
    for (var e = 0u; e < 8u; e = e + 1u) {{
        let at = lane + e * 32u;
        let row = r0 + at / 16u;
        let col = c0 + at % 16u;
        if (row < dims.m && col < dims.n) {{
            c[(part * dims.m + row) * dims.n + col] = sh_c[sg * 256u + at]{bias};
        }}
    }}
}}

@compute @workgroup_size(WG)
fn {name}(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32,
    @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {{
    let m0 = wg.y * BM;
    let n0 = wg.x * BN;
    let part = wg.z;
    // Whole slices per part of the reduction.
    let per_part = ((dims.k + dims.split * BK - 1u) / (dims.split * BK)) * BK;
    let kb = part * per_part;
    let kend = min(kb + per_part, dims.k);
    let wm = sg % WM;
    let wn = sg / WM;
{b}}}
"#,
        name = spec.name,
    );
}
