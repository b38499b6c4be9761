//! The fused LayerNorm + Linear: the forward, its backward in two kernels (dx
//! owned per row, with dγ and dβ; then dW and db), the four row sums added by atomics or
//! flushed as partials for the reduce kernel, and that reduce.
//!
//! The Linear's three products (y = x̂ₙ·Wᵀ, dx̂ₙ = dy·W, dW = dyᵀ·x̂ₙ) are tiled as a GEMM:
//! a workgroup of 16×16 invocations owns a 64×64 block of outputs, stages `BK` slices of
//! both operands in workgroup memory, and each invocation keeps a 4×4 register block.
//! Every product is summed as a framework sums it: leaves of
//! [`super::numerics::DOT_BLOCK`] terms, each into a fresh partial, the leaves of `FOLD`
//! staged slices into a branch, the branches into the total (see `block_product`).
//!
//! Statistics are f32 with the two-pass variance (mean first, then the mean of squared
//! deviations).

use super::writer::Wgsl;
use std::fmt::Write;

use super::row_gemm::{self, Contiguous, Staging};
use super::scatter;
use crate::layout::rows::{DX_ROWS, GEMM_TILE};
use crate::spec::{KernelSpec, Op, WriteMode};

/// How each kernel's staging walks its operands (see `stage_forward`, `stage_dx`,
/// `stage_dw`): consecutive invocations read along x's and W's rows in the forward, along
/// dy's rows and W's columns for dx̂ₙ, and along the outputs for dW.
const FORWARD: Staging = Staging {
    a: Contiguous::Reduction,
    b: Contiguous::Reduction,
};
const DX: Staging = Staging {
    a: Contiguous::Reduction,
    b: Contiguous::Output,
};
const DW: Staging = Staging {
    a: Contiguous::Output,
    b: Contiguous::Output,
};

pub(super) fn constants(out: &mut Wgsl, spec: &KernelSpec) {
    let _ = write!(
        out,
        "const WG: u32 = {}u;\nconst HIDDEN: u32 = {}u;\nconst OUT: u32 = {}u;\n\
         const TILE: u32 = {}u;\nconst BLOCK: u32 = {}u;\n\
         // The products' tiling: 64×64 outputs per workgroup, BK-deep staged slices.\n\
         const TN: u32 = {}u;\nconst BK: u32 = {}u;\n\
         // Staged slices per branch of the blocked sum (BLOCK·BLOCK terms).\n\
         const FOLD: u32 = BLOCK * BLOCK / BK;\n\
         // Rows of one dx block of the backward, and the blocks of a row tile.\n\
         const DXR: u32 = {}u;\nconst SUBS: u32 = (TILE + DXR - 1u) / DXR;\n\
         const KT: u32 = (HIDDEN + TN - 1u) / TN;\n\n",
        spec.workgroup_size,
        spec.head_dim,
        spec.out_dim,
        spec.grid.tile,
        super::numerics::DOT_BLOCK,
        GEMM_TILE,
        crate::layout::rows::bk(spec),
        DX_ROWS,
    );
}

pub(super) fn body(out: &mut Wgsl, spec: &KernelSpec) {
    match spec.op {
        Op::LayernormLinear => forward(out, spec),
        Op::LayernormLinearBackward => backward(out, spec),
        Op::LayernormLinearWeightGrad => weight_grad(out, spec),
        Op::LayernormRows => rows(out, spec),
        Op::LayernormGradRows => grad_rows(out, spec),
        Op::LayernormRowsBackward => rows_backward(out, spec),
        _ => reduce_partials(out, spec),
    }
}

/// `sum_{i in start..count} TERM(i)` as a WGSL statement block leaving the sum in `result`:
/// each term added with its rounding error kept (TwoSum) and the errors added last, so the
/// sum is within about an ulp of the exact one at any count, where a framework's pairwise
/// f32 sum drifts by a rounding per level (a blocked sum of plain adds went over twice the
/// pairwise error on some inputs). Leaves of BLOCK terms are written out, so that a leaf
/// is one loop trip (llvmpipe stops any invocation after 65535 loop trips). The kernel
/// must [`need_compensation`].
fn compensated_sum(result: &str, start: &str, count: &str, term: &str) -> String {
    let add = |i: &str| {
        format!(
            "{{ let i = {i}; let x = {term}; let t = {result} + x;\n                \
             {result}_err = {result}_err + two_sum_err4(vec4<f32>({result}), vec4<f32>(x), vec4<f32>(t)).x;\n                \
             {result} = t; }}"
        )
    };
    let leaf: String = (0..super::numerics::DOT_BLOCK)
        .map(|j| format!("{}\n                ", add(&format!("i2 + {j}u"))))
        .collect();
    format!(
        r#"var {result} = 0.0;
        var {result}_err = 0.0;
        for (var i2 = {start}; i2 < {count}; i2 = i2 + BLOCK) {{
            if (i2 + BLOCK <= {count}) {{
                {leaf}
            }} else {{
                for (var i3 = i2; i3 < {count}; i3 = i3 + 1u) {{
                    {last}
                }}
            }}
        }}
        {result} = {result} + {result}_err;"#,
        last = add("i3"),
    )
}

/// Records that the kernel's sums call the TwoSum helper.
fn need_compensation(out: &mut Wgsl) {
    out.need(&[super::numerics::Helper::TwoSumErr4]);
}

/// Each row's (mean, 1/std) of a tile of up to 64 rows, in workgroup memory: the forward
/// computes them, and the backward recomputes them with the same code, so its numbers are
/// the forward's.
fn row_stats(out: &mut Wgsl) {
    row_stats_of(out, "TN");
}

/// [`row_stats`] for tiles of `rows` rows (a WGSL constant dividing WG), WG / rows lanes
/// per row.
fn row_stats_of(out: &mut Wgsl, rows: &str) {
    // One leaf of BLOCK terms per loop trip, its loads written out before its sum so that
    // they are in flight together (one at a time, a tile's statistics took the latency of
    // 2·HIDDEN/LANES dependent loads).
    let loads = |fill: &str| -> String {
        (0..super::numerics::DOT_BLOCK)
            .map(|j| format!("let v{j} = x_or(row, k0 + {j}u * LANES, {fill});\n            "))
            .collect()
    };
    let sum: String = (0..super::numerics::DOT_BLOCK)
        .map(|j| format!("leaf = leaf + v{j};\n            "))
        .collect();
    let squares: String = (0..super::numerics::DOT_BLOCK)
        .map(|j| format!("leaf = fma(v{j} - mu, v{j} - mu, leaf);\n            "))
        .collect();
    let (mean_loads, dev_loads) = (loads("0.0"), loads("mu"));
    let _ = write!(
        out,
        r#"// The lanes of each row of the tile: their partial sums, and each row's (mean, 1/std).
const LANES: u32 = WG / {rows};
var<workgroup> sh_part: array<f32, WG>;
var<workgroup> sh_stat: array<vec2<f32>, {rows}>;

// The sum of `v` over the LANES lanes of this invocation's row.
fn lane_sum(tid: u32, v: f32) -> f32 {{
    sh_part[tid] = v;
    workgroupBarrier();
    let base = (tid / LANES) * LANES;
    var s = 0.0;
    for (var l = 0u; l < LANES; l = l + 1u) {{
        s = s + sh_part[base + l];
    }}
    // sh_part is reused by the next sum.
    workgroupBarrier();
    return s;
}}

// x[row, k], or `fill` past the row's end (a term that adds nothing to its sum).
fn x_or(row: u32, k: u32, fill: f32) -> f32 {{
    return select(fill, ld_x(row * HIDDEN + min(k, HIDDEN - 1u)), k < HIDDEN);
}}

// (mean, 1/std) of the tile's rows into sh_stat: the two-pass variance, never
// E[x²] − E[x]², each lane's terms summed in leaves of BLOCK.
fn tile_stats(first: u32, tid: u32) {{
    let m = tid / LANES;
    let lane = tid % LANES;
    let row = first + m;
    let live = m < TILE && row < dims.rows;
    var s = 0.0;
    if (live) {{
        for (var k0 = lane; k0 < HIDDEN; k0 = k0 + LANES * BLOCK) {{
            {mean_loads}var leaf = 0.0;
            {sum}s = s + leaf;
        }}
    }}
    let mu = lane_sum(tid, s) / f32(HIDDEN);
    var q = 0.0;
    if (live) {{
        for (var k0 = lane; k0 < HIDDEN; k0 = k0 + LANES * BLOCK) {{
            {dev_loads}var leaf = 0.0;
            {squares}q = q + leaf;
        }}
    }}
    let variance = lane_sum(tid, q) / f32(HIDDEN);
    if (lane == 0u) {{
        sh_stat[m] = vec2<f32>(mu, inverseSqrt(variance + params.eps));
    }}
}}

"#,
    );
}

/// `ld_<t>(i)`: element i of each f32 input the kernel binds (x, γ, β, W, dy, dx̂ₙ),
/// through the vec4 view where the kernel binds one (tensor cores, the split backward's
/// row passes); there also `ld4_<t>(i)`, the four elements from i (a multiple of 4).
fn readers(out: &mut Wgsl, spec: &KernelSpec) {
    for t in crate::signature::tensors(spec) {
        if !["x", "gamma", "beta", "w", "dy", "dxn"].contains(&t.name) {
            continue;
        }
        let name = t.name;
        let _ = match t.elem == crate::signature::Elem::F32x4 {
            true => write!(
                out,
                "fn ld_{name}(i: u32) -> f32 {{\n    return {name}[i / 4u][i % 4u];\n}}\n\n\
                 fn ld4_{name}(i: u32) -> vec4<f32> {{\n    return {name}[i / 4u];\n}}\n\n"
            ),
            false => write!(
                out,
                "fn ld_{name}(i: u32) -> f32 {{\n    return {name}[i];\n}}\n\n"
            ),
        };
    }
}

/// A staging function: every element's loads (`fetch(q)`, declaring its values with
/// suffix q) before any store (`put(q)`), so that the loads of a slice are in flight
/// together; `elements` per invocation.
fn staging(
    out: &mut Wgsl,
    (comment, signature): (&str, &str),
    elements: u32,
    (fetch, put): (&dyn Fn(u32) -> String, &dyn Fn(u32) -> String),
) {
    let fetches: String = (0..elements).map(fetch).collect();
    let puts: String = (0..elements).map(put).collect();
    let _ = write!(
        out,
        "// {comment}\nfn {signature} {{\n{fetches}{puts}}}\n\n"
    );
}

/// What one staging slot reads and stores: one element with scalar products, four
/// consecutive ones along the operand's contiguous index on tensor cores (the vec4 views).
struct Slot {
    width: u32,
    zero: &'static str,
    /// The reader prefix: `ld` or `ld4`.
    ld: &'static str,
    /// The slice writer prefix: `put` or `put4`.
    put: &'static str,
}

impl Slot {
    fn of(spec: &KernelSpec) -> Slot {
        match spec.grid.matrix {
            crate::spec::Matrix::Scalar => Slot {
                width: 1,
                zero: "0.0",
                ld: "ld",
                put: "put",
            },
            crate::spec::Matrix::Coop16 => Slot {
                width: 4,
                zero: "vec4<f32>(0.0)",
                ld: "ld4",
                put: "put4",
            },
        }
    }
}

/// Slots of a slice each invocation stages per operand.
fn per_invocation(spec: &KernelSpec) -> u32 {
    crate::layout::rows::bk(spec) * GEMM_TILE / (spec.workgroup_size * Slot::of(spec).width)
}

fn forward(out: &mut Wgsl, spec: &KernelSpec) {
    readers(out, spec);
    row_gemm::core(out, spec, FORWARD);
    row_stats(out);
    let Slot {
        width,
        zero,
        ld,
        put,
    } = Slot::of(spec);
    let fetch = |q: u32| {
        format!(
            "    let e_{q} = tid + {q}u * WG;\n    let m_{q} = e_{q} / (BK / {width}u);\n    \
             let kk_{q} = (e_{q} % (BK / {width}u)) * {width}u;\n    \
             let k_{q} = k0 + kk_{q};\n    let row_{q} = first + m_{q};\n    var v_{q} = {zero};\n    \
             if (m_{q} < TILE && row_{q} < dims.rows && k_{q} < HIDDEN) {{\n        \
             let st = sh_stat[m_{q}];\n        \
             v_{q} = fma(({ld}_x(row_{q} * HIDDEN + k_{q}) - st.x) * st.y, {ld}_gamma(k_{q}), {ld}_beta(k_{q}));\n    }}\n    \
             let n_{q} = n0 + m_{q};\n    var wv_{q} = {zero};\n    if (n_{q} < OUT && k_{q} < HIDDEN) {{\n        \
             wv_{q} = {ld}_w(n_{q} * HIDDEN + k_{q});\n    }}\n"
        )
    };
    let put = |q: u32| {
        format!("    {put}_a(kk_{q}, m_{q}, v_{q});\n    {put}_b(kk_{q}, m_{q}, wv_{q});\n")
    };
    staging(
        out,
        (
            "Slice k0.. of the normalized rows (x̂·γ + β) and of W's rows n0..; zero past the\n// rows, HIDDEN or OUT.",
            "stage_forward(first: u32, n0: u32, k0: u32, tid: u32)",
        ),
        per_invocation(spec),
        (&fetch, &put),
    );
    let product = row_gemm::product_loop(
        spec,
        FORWARD,
        ("k0", "HIDDEN"),
        "stage_forward(first, n0, k0, tid)",
    );
    let _ = write!(
        out,
        r#"// Workgroup (x, y) owns rows x·TILE.. (TILE ≤ 64) and outputs y·CB·64..: it computes
// its rows' statistics (grid column 0 saves them), then its CB blocks of x̂ₙ·Wᵀ + b in turn.
const CB: u32 = {cb}u;
@compute @workgroup_size(WG)
fn {name}({args}) {{
{prologue}    let first = wg.x * TILE;
    let tx = tid % 16u;
    let ty = tid / 16u;
    tile_stats(first, tid);
    workgroupBarrier();
    if (wg.y == 0u && tid < TILE && first + tid < dims.rows) {{
        mean[first + tid] = sh_stat[tid].x;
        rstd[first + tid] = sh_stat[tid].y;
    }}
    // Blocks past OUT stage zeros and store nothing (an `if` around them would make the
    // cooperative products' control flow non-uniform to naga).
    for (var cb = 0u; cb < CB; cb = cb + 1u) {{
        let n0 = (wg.y * CB + cb) * TN;
        {{
            {product}
            for (var i = 0u; i < 4u; i = i + 1u) {{
                let m = ty * 4u + i;
                let row = first + m;
                if (m < TILE && row < dims.rows) {{
                    for (var j = 0u; j < 4u; j = j + 1u) {{
                        let n = n0 + tx * 4u + j;
                        if (n < OUT) {{
                            y[row * OUT + n] = acc[i][j] + b[n];
                        }}
                    }}
                }}
            }}
        }}
    }}
}}
"#,
        name = spec.name,
        args = row_gemm::entry_args(spec),
        prologue = row_gemm::entry_prologue(spec),
        cb = crate::layout::rows::column_blocks(spec.out_dim),
    );
}

/// The statistics of a row pass's TILE rows (`tile_stats`, as the fused kernels compute
/// them) and `write_normalized`: each row's x̂·γ + β rounded once into the dtype, four
/// elements per vec4 load (HIDDEN is a multiple of 4), into `xn`.
fn normalized_rows(out: &mut Wgsl, spec: &KernelSpec) {
    readers(out, spec);
    row_stats_of(out, "TILE");
    super::dtype::vec4_codec(out, spec.dtype);
    out.push_str(
        r#"// The tile's rows from `first` as x̂·γ + β into xn, once tile_stats has run.
fn write_normalized(first: u32, tid: u32) {
    for (var e = tid; e < TILE * (HIDDEN / 4u); e = e + WG) {
        let m = e / (HIDDEN / 4u);
        let k = (e % (HIDDEN / 4u)) * 4u;
        let row = first + m;
        if (row < dims.rows) {
            let st = sh_stat[m];
            let v = fma((ld4_x(row * HIDDEN + k) - st.x) * st.y, ld4_gamma(k), ld4_beta(k));
            xn[(row * HIDDEN + k) / 4u] = narrow4(v);
        }
    }
}

"#,
    );
}

/// The LayerNorm of a forward whose product is a separate matmul: the statistics saved,
/// and the normalized rows ([`normalized_rows`]).
fn rows(out: &mut Wgsl, spec: &KernelSpec) {
    normalized_rows(out, spec);
    let _ = write!(
        out,
        r#"@compute @workgroup_size(WG)
fn {name}(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {{
    let first = wg.x * TILE;
    tile_stats(first, tid);
    workgroupBarrier();
    if (tid < TILE && first + tid < dims.rows) {{
        mean[first + tid] = sh_stat[tid].x;
        rstd[first + tid] = sh_stat[tid].y;
    }}
    write_normalized(first, tid);
}}

"#,
        name = spec.name,
    );
}

/// The first pass of the backward whose products are matmuls: the products' operands
/// rounded once into the dtype (x̂·γ + β, the statistics recomputed by `tile_stats` so that
/// they are the forward's, and dy) and db's partial over the workgroup's rows.
fn grad_rows(out: &mut Wgsl, spec: &KernelSpec) {
    need_compensation(out);
    normalized_rows(out, spec);
    let column_sum = column_sums(
        &[("s", "v")],
        "let v = ld4_dy(row * OUT + c);\n                dyh[(row * OUT + c) / 4u] = narrow4(v);",
    );
    let _ = write!(
        out,
        r#"@compute @workgroup_size(WG)
fn {name}(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {{
    let first = wg.x * TILE;
    tile_stats(first, tid);
    workgroupBarrier();
    write_normalized(first, tid);
    // dy's rows in the dtype, and db's partial of this workgroup: each column's sum over
    // its rows, four columns an invocation.
    for (var c = tid * 4u; c < OUT; c = c + WG * 4u) {{
        {column_sum}
        for (var j = 0u; j < 4u; j = j + 1u) {{
            db[wg.x * OUT + c + j] = s[j];
        }}
    }}
}}

"#,
        name = spec.name,
    );
}

/// Vec4 sums of each `(result, term)` (after `load`, at `row`) over the workgroup's rows:
/// leaves of BLOCK rows, each joining the sum with its rounding error kept (TwoSum), the
/// errors added last. The kernel must [`need_compensation`].
fn column_sums(sums: &[(&str, &str)], load: &str) -> String {
    let each = |f: &dyn Fn(&str, &str) -> String| -> String {
        sums.iter()
            .map(|(r, t)| f(r, t))
            .collect::<Vec<_>>()
            .join("\n        ")
    };
    let decls = each(&|r, _| {
        format!(
            "var {r} = vec4<f32>(0.0);\n        var {r}_err = vec4<f32>(0.0);\n        \
             var leaf_{r} = vec4<f32>(0.0);"
        )
    });
    let adds = each(&|r, t| format!("    leaf_{r} = leaf_{r} + {t};"));
    let join = |r: &str| {
        format!(
            "{{ let t = {r} + leaf_{r}; {r}_err = {r}_err + two_sum_err4({r}, leaf_{r}, t); {r} = t; }}"
        )
    };
    let folds = each(&|r, _| format!("    {}\n            leaf_{r} = vec4<f32>(0.0);", join(r)));
    let last = each(&|r, _| format!("{}\n        {r} = {r} + {r}_err;", join(r)));
    format!(
        r#"{decls}
        for (var m = 0u; m < TILE; m = m + 1u) {{
            let row = first + m;
            if (row < dims.rows) {{
                {load}
            {adds}
            }}
            if (m % BLOCK == BLOCK - 1u) {{
            {folds}
            }}
        }}
        {last}"#
    )
}

/// The split backward's chain rule: dx̂ = dx̂ₙ·γ, dx = rstd·(dx̂ − mean(dx̂) − x̂·mean(dx̂·x̂))
/// with the saved statistics, LANES invocations a row (each row's means summed in leaves
/// of BLOCK vec4s per invocation, then over the lanes); dγ's and dβ's partials over the
/// workgroup's rows.
fn rows_backward(out: &mut Wgsl, spec: &KernelSpec) {
    need_compensation(out);
    readers(out, spec);
    let sums = column_sums(
        &[("ga", "g * xhat"), ("gb", "g")],
        "let g = ld4_dxn(row * HIDDEN + k);\n                \
         let xhat = (ld4_x(row * HIDDEN + k) - mean[row]) * rstd[row];",
    );
    let _ = write!(
        out,
        r#"const LANES: u32 = WG / TILE;
var<workgroup> sh_part: array<vec2<f32>, WG>;

// The sums of (a, b) over the LANES lanes of this invocation's row.
fn lane_sums(tid: u32, v: vec2<f32>) -> vec2<f32> {{
    sh_part[tid] = v;
    workgroupBarrier();
    let base = (tid / LANES) * LANES;
    var s = vec2<f32>(0.0);
    for (var l = 0u; l < LANES; l = l + 1u) {{
        s = s + sh_part[base + l];
    }}
    return s;
}}

@compute @workgroup_size(WG)
fn {name}(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {{
    let first = wg.x * TILE;
    let row = first + tid / LANES;
    let lane = tid % LANES;
    let live = row < dims.rows;
    var mu = 0.0;
    var rs = 0.0;
    if (live) {{
        mu = mean[row];
        rs = rstd[row];
    }}
    // (Σ dx̂, Σ dx̂·x̂) of this lane's columns.
    var s = vec2<f32>(0.0);
    if (live) {{
        for (var k1 = lane * 4u; k1 < HIDDEN; k1 = k1 + LANES * 4u * BLOCK) {{
            var leaf = vec2<f32>(0.0);
            for (var k = k1; k < min(k1 + LANES * 4u * BLOCK, HIDDEN); k = k + LANES * 4u) {{
                let d = ld4_dxn(row * HIDDEN + k) * ld4_gamma(k);
                let xhat = (ld4_x(row * HIDDEN + k) - mu) * rs;
                leaf = leaf + vec2<f32>((d.x + d.y) + (d.z + d.w), dot(d, xhat));
            }}
            s = s + leaf;
        }}
    }}
    let c = lane_sums(tid, s) / f32(HIDDEN);
    if (live) {{
        for (var k = lane * 4u; k < HIDDEN; k = k + LANES * 4u) {{
            let d = ld4_dxn(row * HIDDEN + k) * ld4_gamma(k);
            let xhat = (ld4_x(row * HIDDEN + k) - mu) * rs;
            dx[(row * HIDDEN + k) / 4u] = rs * (d - c.x - xhat * c.y);
        }}
    }}
    for (var k = tid * 4u; k < HIDDEN; k = k + WG * 4u) {{
        {sums}
        for (var j = 0u; j < 4u; j = j + 1u) {{
            dgamma[wg.x * HIDDEN + k + j] = ga[j];
            dbeta[wg.x * HIDDEN + k + j] = gb[j];
        }}
    }}
}}

"#,
        name = spec.name,
    );
}

/// How a row-sum gradient leaves the workgroup: `add_<t>` for atomics, a store into
/// partial `part` otherwise.
fn flush(spec: &KernelSpec, t: &str, part: &str, size: &str, index: &str, value: &str) -> String {
    match spec.write_mode(t) {
        Some(WriteMode::AtomicScatter) => format!("add_{t}({index}, {value});"),
        _ => format!("{t}[{part} * {size} + {index}] = {value};"),
    }
}

/// Whether the backward adds dγ and dβ by atomics (else it flushes partials).
fn atomic(spec: &KernelSpec) -> bool {
    spec.write_mode("dgamma") == Some(WriteMode::AtomicScatter)
}

/// The backward's first kernel: dx, dγ and dβ. It binds neither the saved statistics nor
/// β (the budget of 8 storage buffers): each dx block recomputes its rows' statistics.
fn backward(out: &mut Wgsl, spec: &KernelSpec) {
    need_compensation(out);
    atomic_adds(out, spec);
    readers(out, spec);
    row_gemm::core(out, spec, DX);
    row_stats(out);
    block_stats(out);
    group_sums(out);
    stage_dx(out, spec);
    dx_block(out, spec);
    if atomic(spec) {
        gb_tile(out, spec);
        let _ = write!(
            out,
            r#"// Grid row y < SUBS of row tile x: dx of rows x·TILE + y·DXR.. (one block); the
// rest: dγ and dβ of 64 columns summed over the row tile.
@compute @workgroup_size(WG)
fn {name}({args}) {{
{prologue}    if (wg.y < SUBS) {{
        dx_block(wg.x, wg.y, tid);
    }} else {{
        gb_tile(wg.x, wg.y - SUBS, tid);
    }}
}}
"#,
            name = spec.name,
            args = row_gemm::entry_args(spec),
            prologue = row_gemm::entry_prologue(spec),
        );
        return;
    }
    let _ = write!(
        out,
        r#"// Grid row y of row tile x: dx, and the dγ and dβ partials, of rows x·TILE + y·DXR..
// (one block).
@compute @workgroup_size(WG)
fn {name}({args}) {{
{prologue}    dx_block(wg.x, wg.y, tid);
}}
"#,
        name = spec.name,
        args = row_gemm::entry_args(spec),
        prologue = row_gemm::entry_prologue(spec),
    );
}

/// The backward's second kernel: dW, and db in the tiles of k column 0.
fn weight_grad(out: &mut Wgsl, spec: &KernelSpec) {
    need_compensation(out);
    atomic_adds(out, spec);
    readers(out, spec);
    row_gemm::core(out, spec, DW);
    stage_dw(out, spec);
    dw_tile(out, spec);
    let _ = write!(
        out,
        r#"// Grid row y of row tile x: one 64×64 tile of dW (and, in the tiles of column 0, 64
// columns of db) summed over the row tile.
@compute @workgroup_size(WG)
fn {name}({args}) {{
{prologue}    dw_tile(wg.x, wg.y, tid);
}}
"#,
        name = spec.name,
        args = row_gemm::entry_args(spec),
        prologue = row_gemm::entry_prologue(spec),
    );
}

/// A dx block's statistics in the invocation's registers, by [`row_stats`].
fn block_stats(out: &mut Wgsl) {
    out.push_str(
        r#"// (mean, 1/std) of this invocation's rows first + 4·ty.. (of `count`) into mu and rs,
// computed as the forward computes them. Rows of sh_stat past the block (a row tile that
// is not a whole number of blocks) are computed and never read.
fn block_stats(first: u32, count: u32, tid: u32, mu: ptr<function, vec4<f32>>,
               rs: ptr<function, vec4<f32>>) {
    tile_stats(first, tid);
    workgroupBarrier();
    let ty = tid / 16u;
    for (var i = 0u; i < 4u; i = i + 1u) {
        if (ty * 4u + i < count) {
            (*mu)[i] = sh_stat[ty * 4u + i].x;
            (*rs)[i] = sh_stat[ty * 4u + i].y;
        }
    }
}

"#,
    );
}

/// The sums of a dx block's dγ and dβ terms over its 16 row groups.
fn group_sums(out: &mut Wgsl) {
    out.push_str(
        r#"// (Σ sh_a, Σ sh_b) of column tid of the k tile over the 16 row groups' sums, each added
// with its rounding error kept (TwoSum).
fn group_sums(tid: u32) -> vec2<f32> {
    var s = vec2<f32>(0.0);
    var err = vec2<f32>(0.0);
    for (var t = 0u; t < 16u; t = t + 1u) {
        let x = vec2<f32>(sh_a[t * 16u + tid / 4u][tid % 4u], sh_b[t * 16u + tid / 4u][tid % 4u]);
        let u = s + x;
        err = err + two_sum_err4(vec4<f32>(s, 0.0, 0.0), vec4<f32>(x, 0.0, 0.0), vec4<f32>(u, 0.0, 0.0)).xy;
        s = u;
    }
    return s + err;
}

"#,
    );
}

/// The atomic schedule's dγ and dβ: one workgroup per (row tile, 64 columns) recomputes
/// dx̂ₙ = dy·W block by block over the tile's rows and sums them, so that each element gets
/// one atomic add per row tile (as dW does), not one per dx block.
fn gb_tile(out: &mut Wgsl, spec: &KernelSpec) {
    let product = row_gemm::product_loop(
        spec,
        DX,
        ("n0", "OUT"),
        "stage_dx(first, count, n0, k0, tid)",
    );
    let dgamma = flush(spec, "dgamma", "tile", "HIDDEN", "k", "ga");
    let dbeta = flush(spec, "dbeta", "tile", "HIDDEN", "k", "gb");
    let _ = write!(
        out,
        r#"// dγ = Σ dx̂ₙ·x̂ and dβ = Σ dx̂ₙ of columns kt·64.. over the row tile's rows: each dx
// block's sums (4 rows per invocation, then the 16 row groups) join the total with their
// rounding errors kept (TwoSum), added once into the gradients.
fn gb_tile(tile: u32, kt: u32, tid: u32) {{
    let tx = tid % 16u;
    let ty = tid / 16u;
    let k0 = kt * TN;
    // (dγ, dβ) and the rounding errors of their sums.
    var g = vec4<f32>(0.0);
    for (var sub = 0u; sub < SUBS && tile * TILE + sub * DXR < dims.rows; sub = sub + 1u) {{
        let first = tile * TILE + sub * DXR;
        let count = min(min(DXR, TILE - sub * DXR), dims.rows - first);
        var mu = vec4<f32>(0.0);
        var rs = vec4<f32>(0.0);
        block_stats(first, count, tid, &mu, &rs);
        {product}
        var g1 = vec4<f32>(0.0);
        var g2 = vec4<f32>(0.0);
        for (var i = 0u; i < 4u; i = i + 1u) {{
            let row = first + ty * 4u + i;
            if (ty * 4u + i < count) {{
                for (var j = 0u; j < 4u; j = j + 1u) {{
                    let k = k0 + tx * 4u + j;
                    if (k < HIDDEN) {{
                        let xhat = (ld_x(row * HIDDEN + k) - mu[i]) * rs[i];
                        let g = acc[i][j];
                        g1[j] = fma(g, xhat, g1[j]);
                        g2[j] = g2[j] + g;
                    }}
                }}
            }}
        }}
        sh_a[ty * 16u + tx] = g1;
        sh_b[ty * 16u + tx] = g2;
        workgroupBarrier();
        if (tid < TN) {{
            let p = group_sums(tid);
            let t = g.xy + p;
            g = vec4<f32>(t, g.zw + two_sum_err4(vec4<f32>(g.xy, 0.0, 0.0), vec4<f32>(p, 0.0, 0.0), vec4<f32>(t, 0.0, 0.0)).xy);
        }}
        // The next block stages into sh_a and sh_b.
        workgroupBarrier();
    }}
    let ga = g.x + g.z;
    let gb = g.y + g.w;
    let k = k0 + tid;
    if (tid < TN && k < HIDDEN) {{
        {dgamma}
        {dbeta}
    }}
}}

"#
    );
}

fn stage_dx(out: &mut Wgsl, spec: &KernelSpec) {
    let Slot {
        width,
        zero,
        ld,
        put,
    } = Slot::of(spec);
    let fetch = |q: u32| {
        format!(
            "    let e_{q} = tid + {q}u * WG;\n    let m_{q} = e_{q} / (BK / {width}u);\n    \
             let kk_{q} = (e_{q} % (BK / {width}u)) * {width}u;\n    let n_{q} = n0 + kk_{q};\n    \
             var v_{q} = {zero};\n    if (m_{q} < count && n_{q} < OUT) {{\n        \
             v_{q} = {ld}_dy((first + m_{q}) * OUT + n_{q});\n    }}\n    \
             let r_{q} = e_{q} / (TN / {width}u);\n    let c_{q} = (e_{q} % (TN / {width}u)) * {width}u;\n    \
             let k_{q} = k0 + c_{q};\n    \
             var wv_{q} = {zero};\n    if (n0 + r_{q} < OUT && k_{q} < HIDDEN) {{\n        \
             wv_{q} = {ld}_w((n0 + r_{q}) * HIDDEN + k_{q});\n    }}\n"
        )
    };
    let put = |q: u32| {
        format!("    {put}_a(kk_{q}, m_{q}, v_{q});\n    {put}_b(r_{q}, c_{q}, wv_{q});\n")
    };
    staging(
        out,
        (
            "dy[first + m, n0..n0 + BK] (rows m < count) and W[n0.., k0..k0 + 64]: a slice of\n// dx̂ₙ = dy·W.",
            "stage_dx(first: u32, count: u32, n0: u32, k0: u32, tid: u32)",
        ),
        per_invocation(spec),
        (&fetch, &put),
    );
}

fn stage_dw(out: &mut Wgsl, spec: &KernelSpec) {
    let Slot {
        width,
        zero,
        ld,
        put,
    } = Slot::of(spec);
    let fetch = |q: u32| {
        format!(
            "    let e_{q} = tid + {q}u * WG;\n    let rr_{q} = e_{q} / (TN / {width}u);\n    \
             let c_{q} = (e_{q} % (TN / {width}u)) * {width}u;\n    \
             let row_{q} = first + r0 + rr_{q};\n    let live_{q} = r0 + rr_{q} < count;\n    \
             var v_{q} = {zero};\n    if (live_{q} && n0 + c_{q} < OUT) {{\n        \
             v_{q} = {ld}_dy(row_{q} * OUT + n0 + c_{q});\n    }}\n    let k_{q} = k0 + c_{q};\n    \
             var xv_{q} = {zero};\n    if (live_{q} && k_{q} < HIDDEN) {{\n        \
             xv_{q} = fma(({ld}_x(row_{q} * HIDDEN + k_{q}) - mean[row_{q}]) * rstd[row_{q}], {ld}_gamma(k_{q}), {ld}_beta(k_{q}));\n    }}\n"
        )
    };
    let put = |q: u32| {
        format!("    {put}_a(rr_{q}, c_{q}, v_{q});\n    {put}_b(rr_{q}, c_{q}, xv_{q});\n")
    };
    staging(
        out,
        (
            "dy[first + r0.., n0..n0 + 64] and x̂·γ + β at the same rows, k0..k0 + 64: a slice of\n// dW = dyᵀ·(x̂·γ + β).",
            "stage_dw(first: u32, count: u32, r0: u32, n0: u32, k0: u32, tid: u32)",
        ),
        per_invocation(spec),
        (&fetch, &put),
    );
}

fn dx_block(out: &mut Wgsl, spec: &KernelSpec) {
    let product = row_gemm::product_loop(
        spec,
        DX,
        ("n0", "OUT"),
        "stage_dx(first, count, n0, k0, tid)",
    );
    let dgamma = flush(spec, "dgamma", "blk", "HIDDEN", "k", "ga");
    let dbeta = flush(spec, "dbeta", "blk", "HIDDEN", "k", "gb");
    // A block past the rows has no rows to add: its partials stay zero, written here
    // because the reduce sums every block's.
    let empty = if spec.write_mode("dgamma") == Some(WriteMode::ScratchFlush) {
        "for (var k = tid; k < HIDDEN; k = k + WG) {
            dgamma[blk * HIDDEN + k] = 0.0;
            dbeta[blk * HIDDEN + k] = 0.0;
        }"
    } else {
        ""
    };
    let gsum = if atomic(spec) {
        String::new()
    } else {
        format!(
            r#"// dγ and dβ of this k tile: the 16 row groups' sums, through the slices' memory.
        sh_a[ty * 16u + tx] = g1;
        sh_b[ty * 16u + tx] = g2;
        workgroupBarrier();
        if (tid < TN && k0 + tid < HIDDEN) {{
            let k = k0 + tid;
            let gab = group_sums(tid);
            let ga = gab.x;
            let gb = gab.y;
            {dgamma}
            {dbeta}
        }}
        // The next k tile stages into sh_a and sh_b.
        workgroupBarrier();"#
        )
    };
    let _ = write!(
        out,
        r#"// dx of one block of DXR rows, over every k tile in turn: dx̂ₙ = dy·W (tiled), then the
// LayerNorm chain rule dx = rstd·(dx̂ − mean(dx̂) − x̂·mean(dx̂·x̂)), dx̂ = dx̂ₙ·γ. dx̂ is
// kept in dx until the row means are known; each invocation rereads only what it wrote.
// Under two-pass, dγ and dβ of the block's rows leave as partial `blk` (the atomic
// schedule sums them over the whole row tile in gb_tile instead).
// (No early return: cooperative products must be reached by uniform control flow, and
// naga's analysis counts any return before them as divergence.)
fn dx_block(tile: u32, sub: u32, tid: u32) {{
    let first = tile * TILE + sub * DXR;
    let blk = tile * SUBS + sub;
    var count = 0u;
    if (first < dims.rows) {{
        count = min(min(DXR, TILE - sub * DXR), dims.rows - first);
    }}
    if (count == 0u) {{
        {empty}
    }} else {{
        dx_rows(first, count, blk, tid);
    }}
}}

// dx_block's block of `count` > 0 rows from `first`.
fn dx_rows(first: u32, count: u32, blk: u32, tid: u32) {{
    let tx = tid % 16u;
    let ty = tid / 16u;
    var mu = vec4<f32>(0.0);
    var rs = vec4<f32>(0.0);
    block_stats(first, count, tid, &mu, &rs);
    // Σ dx̂ and Σ dx̂·x̂ of this invocation's rows: a fresh partial per k tile.
    var s1 = vec4<f32>(0.0);
    var s2 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < HIDDEN; k0 = k0 + TN) {{
        {product}
        var p1 = vec4<f32>(0.0);
        var p2 = vec4<f32>(0.0);
        var g1 = vec4<f32>(0.0);
        var g2 = vec4<f32>(0.0);
        for (var i = 0u; i < 4u; i = i + 1u) {{
            let row = first + ty * 4u + i;
            if (ty * 4u + i < count) {{
                for (var j = 0u; j < 4u; j = j + 1u) {{
                    let k = k0 + tx * 4u + j;
                    if (k < HIDDEN) {{
                        let xhat = (ld_x(row * HIDDEN + k) - mu[i]) * rs[i];
                        let g = acc[i][j];
                        let dxhat = g * ld_gamma(k);
                        p1[i] = p1[i] + dxhat;
                        p2[i] = fma(dxhat, xhat, p2[i]);
                        g1[j] = fma(g, xhat, g1[j]);
                        g2[j] = g2[j] + g;
                        dx[row * HIDDEN + k] = dxhat;
                    }}
                }}
            }}
        }}
        s1 = s1 + p1;
        s2 = s2 + p2;
        {gsum}
    }}
    // The row means: this row group's 16 column groups' sums.
    sh_a[ty * 16u + tx] = s1;
    sh_b[ty * 16u + tx] = s2;
    workgroupBarrier();
    var c2 = vec4<f32>(0.0);
    var c1 = vec4<f32>(0.0);
    for (var t = 0u; t < 16u; t = t + 1u) {{
        c2 = c2 + sh_a[ty * 16u + t];
        c1 = c1 + sh_b[ty * 16u + t];
    }}
    c2 = c2 / f32(HIDDEN);
    c1 = c1 / f32(HIDDEN);
    for (var k0 = 0u; k0 < HIDDEN; k0 = k0 + TN) {{
        for (var i = 0u; i < 4u; i = i + 1u) {{
            let row = first + ty * 4u + i;
            if (ty * 4u + i < count) {{
                for (var j = 0u; j < 4u; j = j + 1u) {{
                    let k = k0 + tx * 4u + j;
                    if (k < HIDDEN) {{
                        let xhat = (ld_x(row * HIDDEN + k) - mu[i]) * rs[i];
                        let d = dx[row * HIDDEN + k];
                        dx[row * HIDDEN + k] = rs[i] * (d - c2[i] - xhat * c1[i]);
                    }}
                }}
            }}
        }}
    }}
}}

"#
    );
}

fn dw_tile(out: &mut Wgsl, spec: &KernelSpec) {
    let product = row_gemm::product_loop(
        spec,
        DW,
        ("r0", "count"),
        "stage_dw(first, count, r0, n0, k0, tid)",
    );
    let dw = flush(
        spec,
        "dw",
        "tile",
        "(OUT * HIDDEN)",
        "n * HIDDEN + k",
        "acc[i][j]",
    );
    let db_sum = compensated_sum("dbs", "0u", "count", "ld_dy((first + i) * OUT + n)");
    let db = flush(spec, "db", "tile", "OUT", "n", "dbs");
    let _ = write!(
        out,
        r#"// dW[n0.., k0..] (64×64, tile t of the KT-wide grid of them) summed over the row
// tile's rows, leaving as partial `tile` (or atomic adds); the tiles of k column 0 also
// sum their 64 columns of db = Σ dy over the tile (one add or partial per row tile, as dW).
fn dw_tile(tile: u32, t: u32, tid: u32) {{
    let tx = tid % 16u;
    let ty = tid / 16u;
    let n0 = (t / KT) * TN;
    let k0 = (t % KT) * TN;
    let first = tile * TILE;
    let count = min(TILE, dims.rows - first);
    {product}
    for (var i = 0u; i < 4u; i = i + 1u) {{
        let n = n0 + ty * 4u + i;
        for (var j = 0u; j < 4u; j = j + 1u) {{
            let k = k0 + tx * 4u + j;
            if (n < OUT && k < HIDDEN) {{
                {dw}
            }}
        }}
    }}
    let n = n0 + tid;
    if (k0 == 0u && tid < TN && n < OUT) {{
        {db_sum}
        {db}
    }}
}}

"#
    );
}

/// The atomic adds the backward's atomic row sums need.
fn atomic_adds(out: &mut Wgsl, spec: &KernelSpec) {
    for t in crate::layout::rows::ROW_SUMS {
        if spec.write_mode(t) == Some(WriteMode::AtomicScatter) {
            scatter::atomic_add(out, spec, t);
        }
    }
}

fn reduce_partials(out: &mut Wgsl, spec: &KernelSpec) {
    need_compensation(out);
    let sum = |part: &str, count: &str, size: &str| {
        compensated_sum("acc", "0u", count, &format!("{part}[i * {size} + e]"))
    };
    let dgamma = sum("dgamma_part", "dims.n_blocks", "HIDDEN");
    let dbeta = sum("dbeta_part", "dims.n_blocks", "HIDDEN");
    let dw = sum("dw_part", "dims.n_tiles", "(OUT * HIDDEN)");
    let db = sum("db_part", "dims.db_parts", "OUT");
    let _ = write!(
        out,
        r#"// One invocation per element of dγ | dβ | dW | db, summing its partials: n_tiles of
// dW, n_blocks of dγ and dβ, db_parts of db.
@compute @workgroup_size(WG)
fn {name}(@builtin(global_invocation_id) gid: vec3<u32>) {{
    var e = gid.x;
    if (e < HIDDEN) {{
        {dgamma}
        dgamma[e] = acc;
        return;
    }}
    e = e - HIDDEN;
    if (e < HIDDEN) {{
        {dbeta}
        dbeta[e] = acc;
        return;
    }}
    e = e - HIDDEN;
    if (e < OUT * HIDDEN) {{
        {dw}
        dw[e] = acc;
        return;
    }}
    e = e - OUT * HIDDEN;
    if (e < OUT) {{
        {db}
        db[e] = acc;
    }}
}}
"#,
        name = spec.name
    );
}
