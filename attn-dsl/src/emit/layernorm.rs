//! The fused LayerNorm + Linear of seed 003: the forward, its backward in two kernels (dx
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

use super::scatter;
use crate::layout::rows::{BK, DX_ROWS, GEMM_TILE};
use crate::spec::{KernelSpec, Op, WriteMode};

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
        BK,
        DX_ROWS,
    );
}

pub(super) fn body(out: &mut Wgsl, spec: &KernelSpec) {
    match spec.op {
        Op::LayernormLinear => forward(out, spec),
        Op::LayernormLinearBackward => backward(out, spec),
        Op::LayernormLinearWeightGrad => weight_grad(out, spec),
        _ => reduce_partials(out, spec),
    }
}

/// `sum_{i in 0..count} TERM(i)` as a WGSL statement block leaving the sum in `result`:
/// leaves of BLOCK terms (written out, so that a leaf is one loop trip: llvmpipe stops any
/// invocation after 65535 loop trips), BLOCK leaves per branch, then the branches in turn,
/// from index `start` (a WGSL u32 expression).
fn blocked_sum(result: &str, start: &str, count: &str, term: &str) -> String {
    let leaf: String = (0..super::numerics::DOT_BLOCK)
        .map(|j| format!("{{ let i = i2 + {j}u; leaf = leaf + {term}; }}\n                    "))
        .collect();
    format!(
        r#"var {result} = 0.0;
        for (var i1 = {start}; i1 < {count}; i1 = i1 + BLOCK * BLOCK) {{
            var mid = 0.0;
            for (var i2 = i1; i2 < min(i1 + BLOCK * BLOCK, {count}); i2 = i2 + BLOCK) {{
                var leaf = 0.0;
                if (i2 + BLOCK <= {count}) {{
                    {leaf}
                }} else {{
                    for (var i = i2; i < {count}; i = i + 1u) {{
                        leaf = leaf + {term};
                    }}
                }}
                mid = mid + leaf;
            }}
            {result} = {result} + mid;
        }}"#
    )
}

/// [`blocked_sum`] with one more level: BLOCK branches into a trunk (BLOCK³ terms), the
/// trunks in turn: for db, summed over a whole row tile.
fn tree_sum(result: &str, count: &str, term: &str) -> String {
    let inner = blocked_sum(
        "trunk",
        "i0",
        &format!("min(i0 + BLOCK * BLOCK * BLOCK, {count})"),
        term,
    );
    format!(
        r#"var {result} = 0.0;
        for (var i0 = 0u; i0 < {count}; i0 = i0 + BLOCK * BLOCK * BLOCK) {{
            {inner}
            {result} = {result} + trunk;
        }}"#
    )
}

/// The staged slices (k-major: `sh_*[kk * 16 + c]` holds outputs 4c..4c+3 at reduction
/// index kk, so an invocation reads its four rows or columns as one vec4) and the product
/// of one staged pair into the invocation's 4×4 block.
fn gemm_core(out: &mut Wgsl) {
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

// Adds a branch of the blocked sum into the total and starts the next one.
// (Written out: constant indices keep both blocks in registers.)
fn fold(acc: ptr<function, array<vec4<f32>, 4>>, mid: ptr<function, array<vec4<f32>, 4>>) {{
    (*acc)[0] = (*acc)[0] + (*mid)[0];
    (*acc)[1] = (*acc)[1] + (*mid)[1];
    (*acc)[2] = (*acc)[2] + (*mid)[2];
    (*acc)[3] = (*acc)[3] + (*mid)[3];
    *mid = array<vec4<f32>, 4>();
}}

"#
    );
}

/// The loop over staged slices `step` = 0, BK, .. < `count` of one product, `stage` filling
/// sh_a and sh_b, leaving the product in `acc`.
fn product_loop(step: &str, count: &str, stage: &str) -> String {
    format!(
        r#"var acc: array<vec4<f32>, 4>;
    var mid: array<vec4<f32>, 4>;
    for (var {step} = 0u; {step} < {count}; {step} = {step} + BK) {{
        {stage};
        workgroupBarrier();
        block_product(tx, ty, &mid);
        // The next slice overwrites sh_a and sh_b.
        workgroupBarrier();
        if (({step} / BK) % FOLD == FOLD - 1u) {{
            fold(&acc, &mid);
        }}
    }}
    fold(&acc, &mid);"#
    )
}

/// Each row's (mean, 1/std) of a tile of up to 64 rows, in workgroup memory: the forward
/// computes them, and the backward recomputes them with the same code, so its numbers are
/// the forward's.
fn row_stats(out: &mut Wgsl) {
    out.push_str(
        r#"// Four lanes per row of the tile: their partial sums, and each row's (mean, 1/std).
const LANES: u32 = WG / TN;
var<workgroup> sh_part: array<f32, WG>;
var<workgroup> sh_stat: array<vec2<f32>, TN>;

// The sum of `v` over the LANES lanes of this invocation's row.
fn lane_sum(tid: u32, v: f32) -> f32 {
    sh_part[tid] = v;
    workgroupBarrier();
    let base = (tid / LANES) * LANES;
    var s = 0.0;
    for (var l = 0u; l < LANES; l = l + 1u) {
        s = s + sh_part[base + l];
    }
    // sh_part is reused by the next sum.
    workgroupBarrier();
    return s;
}

// (mean, 1/std) of the tile's rows into sh_stat: the two-pass variance, never
// E[x²] − E[x]², each lane's terms summed in leaves of BLOCK.
fn tile_stats(first: u32, tid: u32) {
    let m = tid / LANES;
    let lane = tid % LANES;
    let row = first + m;
    let live = m < TILE && row < dims.rows;
    var s = 0.0;
    var leaf = 0.0;
    if (live) {
        for (var k = lane; k < HIDDEN; k = k + LANES) {
            leaf = leaf + x[row * HIDDEN + k];
            if ((k / LANES) % BLOCK == BLOCK - 1u) {
                s = s + leaf;
                leaf = 0.0;
            }
        }
    }
    let mu = lane_sum(tid, s + leaf) / f32(HIDDEN);
    var q = 0.0;
    leaf = 0.0;
    if (live) {
        for (var k = lane; k < HIDDEN; k = k + LANES) {
            let dev = x[row * HIDDEN + k] - mu;
            leaf = fma(dev, dev, leaf);
            if ((k / LANES) % BLOCK == BLOCK - 1u) {
                q = q + leaf;
                leaf = 0.0;
            }
        }
    }
    let variance = lane_sum(tid, q + leaf) / f32(HIDDEN);
    if (lane == 0u) {
        sh_stat[m] = vec2<f32>(mu, inverseSqrt(variance + params.eps));
    }
}

"#,
    );
}

fn forward(out: &mut Wgsl, spec: &KernelSpec) {
    gemm_core(out);
    row_stats(out);
    out.push_str(
        r#"// Slice k0.. of the normalized rows (x̂·γ + β) into sh_a and of W's rows n0.. into sh_b;
// zero past the rows, HIDDEN or OUT.
fn stage_forward(first: u32, n0: u32, k0: u32, tid: u32) {
    for (var q = 0u; q < 4u; q = q + 1u) {
        let e = tid + q * WG;
        let m = e / BK;
        let kk = e % BK;
        let k = k0 + kk;
        let row = first + m;
        var v = 0.0;
        if (m < TILE && row < dims.rows && k < HIDDEN) {
            let st = sh_stat[m];
            v = fma((x[row * HIDDEN + k] - st.x) * st.y, gamma[k], beta[k]);
        }
        sh_a[kk * 16u + m / 4u][m % 4u] = v;
        let n = n0 + m;
        var wv = 0.0;
        if (n < OUT && k < HIDDEN) {
            wv = w[n * HIDDEN + k];
        }
        sh_b[kk * 16u + m / 4u][m % 4u] = wv;
    }
}

"#,
    );
    let product = product_loop("k0", "HIDDEN", "stage_forward(first, n0, k0, tid)");
    let _ = write!(
        out,
        r#"// Workgroup (x, y) owns rows x·TILE.. (TILE ≤ 64) and outputs y·64..: it computes its
// rows' statistics (grid column 0 saves them), then its block of x̂ₙ·Wᵀ + b.
@compute @workgroup_size(WG)
fn {name}(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {{
    let first = wg.x * TILE;
    let n0 = wg.y * TN;
    let tx = tid % 16u;
    let ty = tid / 16u;
    tile_stats(first, tid);
    workgroupBarrier();
    if (wg.y == 0u && tid < TILE && first + tid < dims.rows) {{
        mean[first + tid] = sh_stat[tid].x;
        rstd[first + tid] = sh_stat[tid].y;
    }}
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
"#,
        name = spec.name
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
    atomic_adds(out, spec);
    gemm_core(out);
    row_stats(out);
    block_stats(out);
    stage_dx(out);
    dx_block(out, spec);
    if atomic(spec) {
        gb_tile(out, spec);
        let _ = write!(
            out,
            r#"// Grid row y < SUBS of row tile x: dx of rows x·TILE + y·DXR.. (one block); the
// rest: dγ and dβ of 64 columns summed over the row tile.
@compute @workgroup_size(WG)
fn {name}(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {{
    if (wg.y < SUBS) {{
        dx_block(wg.x, wg.y, tid);
    }} else {{
        gb_tile(wg.x, wg.y - SUBS, tid);
    }}
}}
"#,
            name = spec.name
        );
        return;
    }
    let _ = write!(
        out,
        r#"// Grid row y of row tile x: dx, and the dγ and dβ partials, of rows x·TILE + y·DXR..
// (one block).
@compute @workgroup_size(WG)
fn {name}(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {{
    dx_block(wg.x, wg.y, tid);
}}
"#,
        name = spec.name
    );
}

/// The backward's second kernel: dW, and db in the tiles of k column 0.
fn weight_grad(out: &mut Wgsl, spec: &KernelSpec) {
    atomic_adds(out, spec);
    gemm_core(out);
    stage_dw(out);
    dw_tile(out, spec);
    let _ = write!(
        out,
        r#"// Grid row y of row tile x: one 64×64 tile of dW (and, in the tiles of column 0, 64
// columns of db) summed over the row tile.
@compute @workgroup_size(WG)
fn {name}(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {{
    dw_tile(wg.x, wg.y, tid);
}}
"#,
        name = spec.name
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

/// The atomic schedule's dγ and dβ: one workgroup per (row tile, 64 columns) recomputes
/// dx̂ₙ = dy·W block by block over the tile's rows and sums them, so that each element gets
/// one atomic add per row tile (as dW does), not one per dx block.
fn gb_tile(out: &mut Wgsl, spec: &KernelSpec) {
    let product = product_loop("n0", "OUT", "stage_dx(first, count, n0, k0, tid)");
    let dgamma = flush(spec, "dgamma", "tile", "HIDDEN", "k", "ga");
    let dbeta = flush(spec, "dbeta", "tile", "HIDDEN", "k", "gb");
    let _ = write!(
        out,
        r#"// dγ = Σ dx̂ₙ·x̂ and dβ = Σ dx̂ₙ of columns kt·64.. over the row tile's rows: each dx
// block's sums (4 rows per invocation, then the 16 row groups) are fresh partials, BLOCK
// of them into a branch, the branches into the total, added once into the gradients.
fn gb_tile(tile: u32, kt: u32, tid: u32) {{
    let tx = tid % 16u;
    let ty = tid / 16u;
    let k0 = kt * TN;
    var ga = 0.0;
    var gb = 0.0;
    // BLOCK blocks' sums into a branch, the branches into ga and gb.
    var ma = 0.0;
    var mb = 0.0;
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
                        let xhat = (x[row * HIDDEN + k] - mu[i]) * rs[i];
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
            var pa = 0.0;
            var pb = 0.0;
            for (var t = 0u; t < 16u; t = t + 1u) {{
                pa = pa + sh_a[t * 16u + tid / 4u][tid % 4u];
                pb = pb + sh_b[t * 16u + tid / 4u][tid % 4u];
            }}
            ma = ma + pa;
            mb = mb + pb;
            if (sub % BLOCK == BLOCK - 1u) {{
                ga = ga + ma;
                gb = gb + mb;
                ma = 0.0;
                mb = 0.0;
            }}
        }}
        // The next block stages into sh_a and sh_b.
        workgroupBarrier();
    }}
    ga = ga + ma;
    gb = gb + mb;
    let k = k0 + tid;
    if (tid < TN && k < HIDDEN) {{
        {dgamma}
        {dbeta}
    }}
}}

"#
    );
}

fn stage_dx(out: &mut Wgsl) {
    out.push_str(
        r#"// dy[first + m, n0..n0 + BK] into sh_a (rows m < count) and W[n0.., k0..k0 + 64]
// into sh_b: a slice of dx̂ₙ = dy·W.
fn stage_dx(first: u32, count: u32, n0: u32, k0: u32, tid: u32) {
    for (var q = 0u; q < 4u; q = q + 1u) {
        let e = tid + q * WG;
        let m = e / BK;
        let n = n0 + e % BK;
        var v = 0.0;
        if (m < count && n < OUT) {
            v = dy[(first + m) * OUT + n];
        }
        sh_a[(e % BK) * 16u + m / 4u][m % 4u] = v;
        let r = e / TN;
        let c = e % TN;
        let k = k0 + c;
        var wv = 0.0;
        if (n0 + r < OUT && k < HIDDEN) {
            wv = w[(n0 + r) * HIDDEN + k];
        }
        sh_b[r * 16u + c / 4u][c % 4u] = wv;
    }
}

"#,
    );
}

fn stage_dw(out: &mut Wgsl) {
    out.push_str(
        r#"// dy[first + r0.., n0..n0 + 64] into sh_a and the Linear's input x̂·γ + β at the same rows,
// k0..k0 + 64, into sh_b: a slice of dW = dyᵀ·(x̂·γ + β).
fn stage_dw(first: u32, count: u32, r0: u32, n0: u32, k0: u32, tid: u32) {
    for (var q = 0u; q < 4u; q = q + 1u) {
        let e = tid + q * WG;
        let rr = e / TN;
        let c = e % TN;
        let row = first + r0 + rr;
        let live = r0 + rr < count;
        var v = 0.0;
        if (live && n0 + c < OUT) {
            v = dy[row * OUT + n0 + c];
        }
        sh_a[rr * 16u + c / 4u][c % 4u] = v;
        let k = k0 + c;
        var xv = 0.0;
        if (live && k < HIDDEN) {
            xv = fma((x[row * HIDDEN + k] - mean[row]) * rstd[row], gamma[k], beta[k]);
        }
        sh_b[rr * 16u + c / 4u][c % 4u] = xv;
    }
}

"#,
    );
}

fn dx_block(out: &mut Wgsl, spec: &KernelSpec) {
    let product = product_loop("n0", "OUT", "stage_dx(first, count, n0, k0, tid)");
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
            var ga = 0.0;
            var gb = 0.0;
            for (var t = 0u; t < 16u; t = t + 1u) {{
                ga = ga + sh_a[t * 16u + tid / 4u][tid % 4u];
                gb = gb + sh_b[t * 16u + tid / 4u][tid % 4u];
            }}
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
fn dx_block(tile: u32, sub: u32, tid: u32) {{
    let tx = tid % 16u;
    let ty = tid / 16u;
    let first = tile * TILE + sub * DXR;
    let blk = tile * SUBS + sub;
    var count = 0u;
    if (first < dims.rows) {{
        count = min(min(DXR, TILE - sub * DXR), dims.rows - first);
    }}
    if (count == 0u) {{
        {empty}
        return;
    }}
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
                        let xhat = (x[row * HIDDEN + k] - mu[i]) * rs[i];
                        let g = acc[i][j];
                        let dxhat = g * gamma[k];
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
                        let xhat = (x[row * HIDDEN + k] - mu[i]) * rs[i];
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
    let product = product_loop("r0", "count", "stage_dw(first, count, r0, n0, k0, tid)");
    let dw = flush(
        spec,
        "dw",
        "tile",
        "(OUT * HIDDEN)",
        "n * HIDDEN + k",
        "acc[i][j]",
    );
    let db_sum = tree_sum("dbs", "count", "dy[(first + i) * OUT + n]");
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
    let sum = |part: &str, count: &str, size: &str| {
        blocked_sum("acc", "0u", count, &format!("{part}[i * {size} + e]"))
    };
    let dgamma = sum("dgamma_part", "dims.n_blocks", "HIDDEN");
    let dbeta = sum("dbeta_part", "dims.n_blocks", "HIDDEN");
    let dw = sum("dw_part", "dims.n_tiles", "(OUT * HIDDEN)");
    let db = sum("db_part", "dims.n_tiles", "OUT");
    let _ = write!(
        out,
        r#"// One invocation per element of dγ | dβ | dW | db, summing its partials: one per row
// tile for dW and db, one per dx block (DXR rows) for dγ and dβ.
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
