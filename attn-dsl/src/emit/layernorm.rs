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

use super::numerics::{DOT_BLOCK, Helper};
use super::row_gemm::{self, Contiguous, Staging};
use super::scatter;
use super::writer::{Fragment, Template, Wgsl, concat, lines, uint};
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
    out.put(CONSTANTS.fill([
        ("wg", uint(spec.workgroup_size)),
        ("hidden", uint(spec.head_dim)),
        ("out", uint(spec.out_dim)),
        ("tile", uint(spec.grid.tile)),
        ("block", uint(DOT_BLOCK)),
        ("tn", uint(GEMM_TILE)),
        ("bk", uint(crate::layout::rows::bk(spec))),
        ("dxr", uint(DX_ROWS)),
    ]));
}

/// The row kernels' shape: the workgroup, the rows' widths and tile, the leaves of the
/// blocked sums, the products' tiling and the backward's dx blocks (each a u32 literal).
const CONSTANTS: Template = Template {
    name: "layernorm_constants",
    needs: &[],
    text: r#"const WG: u32 = $wg;
const HIDDEN: u32 = $hidden;
const OUT: u32 = $out;
const TILE: u32 = $tile;
const BLOCK: u32 = $block;
// The products' tiling: 64×64 outputs per workgroup, BK-deep staged slices.
const TN: u32 = $tn;
const BK: u32 = $bk;
// Staged slices per branch of the blocked sum (BLOCK·BLOCK terms).
const FOLD: u32 = BLOCK * BLOCK / BK;
// Rows of one dx block of the backward, and the blocks of a row tile.
const DXR: u32 = $dxr;
const SUBS: u32 = (TILE + DXR - 1u) / DXR;
const KT: u32 = (HIDDEN + TN - 1u) / TN;

"#,
};

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

/// `sum_{i in start..count} TERM(i)` as WGSL statements leaving the sum in `sum`: each
/// term added with its rounding error kept (TwoSum) and the errors added last, so the sum
/// is within about an ulp of the exact one at any count, where a framework's pairwise f32
/// sum drifts by a rounding per level (a blocked sum of plain adds went over twice the
/// pairwise error on some inputs). Leaves of BLOCK terms are written out, so that a leaf
/// is one loop trip (llvmpipe stops any invocation after 65535 loop trips).
fn compensated_sum(sum: &str, start: &str, count: &str, term: &str) -> Fragment {
    let err = format!("{sum}_err");
    let names = || {
        [
            ("sum", Fragment::from(sum)),
            ("err", Fragment::from(err.as_str())),
        ]
    };
    let term_at = |i: Fragment| {
        let fills = [("term", Fragment::from(term)), ("i", i)];
        COMPENSATED_TERM.fill(names().into_iter().chain(fills))
    };
    let leaf = concat((0..DOT_BLOCK).map(|j| term_at(Fragment::from(format!("i2 + {j}u")))));
    let last = term_at(Fragment::from("i3"));
    COMPENSATED_SUM.fill(names().into_iter().chain([
        ("start", Fragment::from(start)),
        ("count", Fragment::from(count)),
        ("leaf", leaf),
        ("last", last),
    ]))
}

/// [`compensated_sum`]'s loop: `$leaf` the BLOCK terms of a whole leaf, `$last` the last
/// partial leaf's terms one per trip (each a [`COMPENSATED_TERM`]).
const COMPENSATED_SUM: Template = Template {
    name: "compensated_sum",
    needs: &[Helper::TwoSumErr4],
    text: r#"var $sum = 0.0;
var $err = 0.0;
for (var i2 = $start; i2 < $count; i2 = i2 + BLOCK) {
    if (i2 + BLOCK <= $count) {
        $leaf
    } else {
        for (var i3 = i2; i3 < $count; i3 = i3 + 1u) {
            $last
        }
    }
}
$sum = $sum + $err;
"#,
};

/// Term `$term` at `i = $i` added to `$sum`, its rounding error to `$err` (TwoSum).
const COMPENSATED_TERM: Template = Template {
    name: "compensated_term",
    needs: &[Helper::TwoSumErr4],
    text: r#"{ let i = $i; let x = $term; let t = $sum + x;
$err = $err + two_sum_err4(vec4<f32>($sum), vec4<f32>(x), vec4<f32>(t)).x;
$sum = t; }
"#,
};

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
    let loads = |fill: &str| {
        lines((0..DOT_BLOCK).map(|j| format!("let v{j} = x_or(row, k0 + {j}u * LANES, {fill});")))
    };
    let sum = lines((0..DOT_BLOCK).map(|j| format!("leaf = leaf + v{j};")));
    let squares = lines((0..DOT_BLOCK).map(|j| format!("leaf = fma(v{j} - mu, v{j} - mu, leaf);")));
    out.put(ROW_STATS.fill([
        ("rows", Fragment::from(rows)),
        ("mean_loads", loads("0.0")),
        ("sum", sum),
        ("deviation_loads", loads("mu")),
        ("squares", squares),
    ]));
}

/// `tile_stats` and the lane sums under it, for tiles of `$rows` rows: `$mean_loads` and
/// `$sum` a leaf of the mean's terms, `$deviation_loads` and `$squares` a leaf of the
/// variance's.
const ROW_STATS: Template = Template {
    name: "row_stats",
    needs: &[],
    text: r#"// The lanes of each row of the tile: their partial sums, and each row's (mean, 1/std).
const LANES: u32 = WG / $rows;
var<workgroup> sh_part: array<f32, WG>;
var<workgroup> sh_stat: array<vec2<f32>, $rows>;

// The sum of `v` over the LANES lanes (a power of two) of this invocation's row, as a
// tree: a row of one workgroup's 256 lanes would wait on 256 dependent loads one by one.
fn lane_sum(tid: u32, v: f32) -> f32 {
    sh_part[tid] = v;
    workgroupBarrier();
    let lane = tid % LANES;
    for (var stride = LANES / 2u; stride > 0u; stride = stride / 2u) {
        if (lane < stride) {
            sh_part[tid] = sh_part[tid] + sh_part[tid + stride];
        }
        workgroupBarrier();
    }
    let s = sh_part[tid - lane];
    // sh_part is reused by the next sum.
    workgroupBarrier();
    return s;
}

// x[row, k], or `fill` past the row's end (a term that adds nothing to its sum).
fn x_or(row: u32, k: u32, fill: f32) -> f32 {
    return select(fill, ld_x(row * HIDDEN + min(k, HIDDEN - 1u)), k < HIDDEN);
}

// (mean, 1/std) of the tile's rows into sh_stat: the two-pass variance, never
// E[x²] − E[x]², each lane's terms summed in leaves of BLOCK.
fn tile_stats(first: u32, tid: u32) {
    let m = tid / LANES;
    let lane = tid % LANES;
    let row = first + m;
    let live = m < TILE && row < dims.rows;
    var s = 0.0;
    if (live) {
        for (var k0 = lane; k0 < HIDDEN; k0 = k0 + LANES * BLOCK) {
            $mean_loads
            var leaf = 0.0;
            $sum
            s = s + leaf;
        }
    }
    let mu = lane_sum(tid, s) / f32(HIDDEN);
    var q = 0.0;
    if (live) {
        for (var k0 = lane; k0 < HIDDEN; k0 = k0 + LANES * BLOCK) {
            $deviation_loads
            var leaf = 0.0;
            $squares
            q = q + leaf;
        }
    }
    let variance = lane_sum(tid, q) / f32(HIDDEN);
    if (lane == 0u) {
        sh_stat[m] = vec2<f32>(mu, inverseSqrt(variance + params.eps));
    }
}

"#,
};

/// `ld_<t>(i)`: element i of each f32 input the kernel binds (x, γ, β, W, dy, dx̂ₙ),
/// through the vec4 view where the kernel binds one (tensor cores, the split backward's
/// row passes); there also `ld4_<t>(i)`, the four elements from i (a multiple of 4).
fn readers(out: &mut Wgsl, spec: &KernelSpec) {
    for t in crate::signature::tensors(spec) {
        if !["x", "gamma", "beta", "w", "dy", "dxn"].contains(&t.name) {
            continue;
        }
        let reader = match t.elem == crate::signature::Elem::F32x4 {
            true => &READ_VEC4,
            false => &READ_F32,
        };
        out.put(reader.fill([("t", Fragment::from(t.name))]));
    }
}

/// The readers of input `$t` bound as vec4s.
const READ_VEC4: Template = Template {
    name: "read_vec4",
    needs: &[],
    text: r#"fn ld_$t(i: u32) -> f32 {
    return $t[i / 4u][i % 4u];
}

fn ld4_$t(i: u32) -> vec4<f32> {
    return $t[i / 4u];
}

"#,
};

/// The reader of input `$t` bound as f32s.
const READ_F32: Template = Template {
    name: "read_f32",
    needs: &[],
    text: r#"fn ld_$t(i: u32) -> f32 {
    return $t[i];
}

"#,
};

/// A staging function: `function`'s `$fetches`, every element's loads (`fetch`, declaring
/// its values with suffix q), before its `$puts`, every element's stores (`put`), so that
/// the loads of a slice are in flight together; [`per_invocation`] elements, `readers` the
/// `$ld_<t>` holes of `fetch`.
fn staging(
    out: &mut Wgsl,
    spec: &KernelSpec,
    function: &Template,
    (fetch, put): (&Template, &Template),
    readers: &[&'static str],
) {
    let slot = Slot::of(spec);
    let elements = 0..per_invocation(spec);
    let fetches = concat(
        elements
            .clone()
            .map(|q| fetch.fill(slot.fetch_fills(q, readers))),
    );
    let puts = concat(elements.map(|q| put.fill(slot.put_fills(q))));
    out.put(function.fill([("fetches", fetches), ("puts", puts)]));
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

    /// The fills of element q's loads: `$q` the suffix of its values (q),
    /// the slot's `$width` (a u32) and `$zero`, and each of `readers` (`$ld_<t>`, the
    /// slot's reader of t).
    fn fetch_fills(&self, q: u32, readers: &[&'static str]) -> Vec<(&'static str, Fragment)> {
        let mut fills = vec![
            ("q", Fragment::from(q.to_string())),
            ("width", uint(self.width)),
            ("zero", Fragment::from(self.zero)),
        ];
        for &hole in readers {
            fills.push((hole, Fragment::from(hole.replacen("ld", self.ld, 1))));
        }
        fills
    }

    /// The fills of element q's stores: `$q`, and the slot's writers `$put_a` and `$put_b`.
    fn put_fills(&self, q: u32) -> [(&'static str, Fragment); 3] {
        [
            ("q", Fragment::from(q.to_string())),
            ("put_a", Fragment::from(format!("{}_a", self.put))),
            ("put_b", Fragment::from(format!("{}_b", self.put))),
        ]
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
    let readers = ["ld_x", "ld_gamma", "ld_beta", "ld_w"];
    staging(
        out,
        spec,
        &STAGE_FORWARD,
        (&FORWARD_FETCH, &FORWARD_PUT),
        &readers,
    );
    let stage = "stage_forward(first, n0, k0, tid)";
    out.put(FORWARD_ENTRY.fill([
        ("cb", uint(crate::layout::rows::column_blocks(spec.out_dim))),
        ("entry", row_gemm::entry(spec, &spec.name)),
        (
            "product",
            row_gemm::product_loop(spec, FORWARD, ("k0", "HIDDEN"), stage),
        ),
    ]));
}

const STAGE_FORWARD: Template = Template {
    name: "stage_forward",
    needs: &[],
    text: r#"// Slice k0.. of the normalized rows (x̂·γ + β) and of W's rows n0..; zero past the
// rows, HIDDEN or OUT.
fn stage_forward(first: u32, n0: u32, k0: u32, tid: u32) {
    $fetches
    $puts
}

"#,
};

/// One element of `stage_forward`: row m of the normalized rows and of W's, at k.
const FORWARD_FETCH: Template = Template {
    name: "forward_fetch",
    needs: &[],
    text: r#"let e_$q = tid + ${q}u * WG;
let m_$q = e_$q / (BK / $width);
let kk_$q = (e_$q % (BK / $width)) * $width;
let k_$q = k0 + kk_$q;
let row_$q = first + m_$q;
var v_$q = $zero;
if (m_$q < TILE && row_$q < dims.rows && k_$q < HIDDEN) {
    let st = sh_stat[m_$q];
    v_$q = fma(($ld_x(row_$q * HIDDEN + k_$q) - st.x) * st.y, $ld_gamma(k_$q), $ld_beta(k_$q));
}
let n_$q = n0 + m_$q;
var wv_$q = $zero;
if (n_$q < OUT && k_$q < HIDDEN) {
    wv_$q = $ld_w(n_$q * HIDDEN + k_$q);
}
"#,
};

const FORWARD_PUT: Template = Template {
    name: "forward_put",
    needs: &[],
    text: r#"$put_a(kk_$q, m_$q, v_$q);
$put_b(kk_$q, m_$q, wv_$q);
"#,
};

/// The forward's entry point: `$cb` column blocks per workgroup, each `$product` and its bias
/// into y.
const FORWARD_ENTRY: Template = Template {
    name: "layernorm_linear",
    needs: &[],
    text: r#"// Workgroup (x, y) owns rows x·TILE.. (TILE ≤ 64) and outputs y·CB·64..: it computes
// its rows' statistics (grid column 0 saves them), then its CB blocks of x̂ₙ·Wᵀ + b in turn.
const CB: u32 = $cb;
@compute @workgroup_size(WG)
$entry
    let first = wg.x * TILE;
    let tx = tid % 16u;
    let ty = tid / 16u;
    tile_stats(first, tid);
    workgroupBarrier();
    if (wg.y == 0u && tid < TILE && first + tid < dims.rows) {
        mean[first + tid] = sh_stat[tid].x;
        rstd[first + tid] = sh_stat[tid].y;
    }
    // Blocks past OUT stage zeros and store nothing (an `if` around them would make the
    // cooperative products' control flow non-uniform to naga).
    for (var cb = 0u; cb < CB; cb = cb + 1u) {
        let n0 = (wg.y * CB + cb) * TN;
        {
            $product
            for (var i = 0u; i < 4u; i = i + 1u) {
                let m = ty * 4u + i;
                let row = first + m;
                if (m < TILE && row < dims.rows) {
                    for (var j = 0u; j < 4u; j = j + 1u) {
                        let n = n0 + tx * 4u + j;
                        if (n < OUT) {
                            y[row * OUT + n] = acc[i][j] + b[n];
                        }
                    }
                }
            }
        }
    }
}
"#,
};

/// The statistics of a row pass's TILE rows (`tile_stats`, as the fused kernels compute
/// them) and `write_normalized`: each row's x̂·γ + β rounded once into the dtype, four
/// elements per vec4 load (HIDDEN is a multiple of 4), into `xn`.
fn normalized_rows(out: &mut Wgsl, spec: &KernelSpec) {
    readers(out, spec);
    row_stats_of(out, "TILE");
    super::dtype::vec4_codec(out, spec.dtype);
    out.put(WRITE_NORMALIZED.plain());
}

const WRITE_NORMALIZED: Template = Template {
    name: "write_normalized",
    needs: &[],
    text: r#"// The tile's rows from `first` as x̂·γ + β into xn, once tile_stats has run.
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
};

/// The LayerNorm of a forward whose product is a separate matmul: the statistics saved,
/// and the normalized rows ([`normalized_rows`]).
fn rows(out: &mut Wgsl, spec: &KernelSpec) {
    normalized_rows(out, spec);
    out.put(ROWS.fill([("name", Fragment::from(spec.name.as_str()))]));
}

const ROWS: Template = Template {
    name: "layernorm_rows",
    needs: &[],
    text: r#"@compute @workgroup_size(WG)
fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let first = wg.x * TILE;
    tile_stats(first, tid);
    workgroupBarrier();
    if (tid < TILE && first + tid < dims.rows) {
        mean[first + tid] = sh_stat[tid].x;
        rstd[first + tid] = sh_stat[tid].y;
    }
    write_normalized(first, tid);
}

"#,
};

/// The first pass of the backward whose products are matmuls: the products' operands
/// rounded once into the dtype (x̂·γ + β, the statistics recomputed by `tile_stats` so that
/// they are the forward's, and dy) and db's partial over the workgroup's rows.
fn grad_rows(out: &mut Wgsl, spec: &KernelSpec) {
    normalized_rows(out, spec);
    out.put(GRAD_ROWS.fill([
        ("name", Fragment::from(spec.name.as_str())),
        ("column_sum", column_sums(&[("s", "v")], DY_ROW.plain())),
    ]));
}

/// `$column_sum`: db's partial of four columns, `s`, as dy's rows are rounded into dyh.
const GRAD_ROWS: Template = Template {
    name: "layernorm_grad_rows",
    needs: &[],
    text: r#"@compute @workgroup_size(WG)
fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let first = wg.x * TILE;
    tile_stats(first, tid);
    workgroupBarrier();
    write_normalized(first, tid);
    // dy's rows in the dtype, and db's partial of this workgroup: each column's sum over
    // its rows, four columns an invocation.
    for (var c = tid * 4u; c < OUT; c = c + WG * 4u) {
        $column_sum
        for (var j = 0u; j < 4u; j = j + 1u) {
            db[wg.x * OUT + c + j] = s[j];
        }
    }
}

"#,
};

/// dy's four columns from c at `row`, `v`, stored into dyh in the dtype.
const DY_ROW: Template = Template {
    name: "dy_row",
    needs: &[],
    text: r#"let v = ld4_dy(row * OUT + c);
dyh[(row * OUT + c) / 4u] = narrow4(v);
"#,
};

/// Vec4 sums of each `(result, term)` (after `load`, at `row`) over the workgroup's rows:
/// leaves of BLOCK rows, each joining the sum with its rounding error kept (TwoSum), the
/// errors added last.
fn column_sums(sums: &[(&str, &str)], load: Fragment) -> Fragment {
    let join = |r: &str| {
        format!(
            "{{ let t = {r} + leaf_{r}; {r}_err = {r}_err + two_sum_err4({r}, leaf_{r}, t); {r} = t; }}"
        )
    };
    let declarations = lines(sums.iter().flat_map(|(r, _)| {
        [
            format!("var {r} = vec4<f32>(0.0);"),
            format!("var {r}_err = vec4<f32>(0.0);"),
            format!("var leaf_{r} = vec4<f32>(0.0);"),
        ]
    }));
    let leaves = lines(
        sums.iter()
            .map(|(r, t)| format!("leaf_{r} = leaf_{r} + {t};")),
    );
    let folds = lines(
        sums.iter()
            .flat_map(|(r, _)| [join(r), format!("leaf_{r} = vec4<f32>(0.0);")]),
    );
    let totals = lines(
        sums.iter()
            .flat_map(|(r, _)| [join(r), format!("{r} = {r} + {r}_err;")]),
    );
    COLUMN_SUMS.fill([
        ("declarations", declarations),
        ("load", load),
        ("leaves", leaves),
        ("folds", folds),
        ("totals", totals),
    ])
}

/// [`column_sums`]' loop over the rows: `$load` a row's terms, `$leaves` each term into
/// its leaf, `$folds` each leaf into its sum every BLOCK rows, `$totals` the last leaves
/// and the errors.
const COLUMN_SUMS: Template = Template {
    name: "column_sums",
    needs: &[Helper::TwoSumErr4],
    text: r#"$declarations
for (var m = 0u; m < TILE; m = m + 1u) {
    let row = first + m;
    if (row < dims.rows) {
        $load
        $leaves
    }
    if (m % BLOCK == BLOCK - 1u) {
        $folds
    }
}
$totals
"#,
};

/// The split backward's chain rule: dx̂ = dx̂ₙ·γ, dx = rstd·(dx̂ − mean(dx̂) − x̂·mean(dx̂·x̂))
/// with the saved statistics, LANES invocations a row (each row's means summed in leaves
/// of BLOCK vec4s per invocation, then over the lanes); dγ's and dβ's partials over the
/// workgroup's rows.
fn rows_backward(out: &mut Wgsl, spec: &KernelSpec) {
    readers(out, spec);
    let sums = column_sums(&[("ga", "g * xhat"), ("gb", "g")], ROW_GRADS.plain());
    out.put(ROWS_BACKWARD.fill([("name", Fragment::from(spec.name.as_str())), ("sums", sums)]));
}

/// dx̂ₙ's and x̂'s four columns from k at `row`, `g` and `xhat`.
const ROW_GRADS: Template = Template {
    name: "row_grads",
    needs: &[],
    text: r#"let g = ld4_dxn(row * HIDDEN + k);
let xhat = (ld4_x(row * HIDDEN + k) - mean[row]) * rstd[row];
"#,
};

/// `$sums`: dγ's and dβ's partials of four columns, `ga` and `gb`.
const ROWS_BACKWARD: Template = Template {
    name: "layernorm_rows_backward",
    needs: &[],
    text: r#"const LANES: u32 = WG / TILE;
var<workgroup> sh_part: array<vec2<f32>, WG>;

// The sums of (a, b) over the LANES lanes of this invocation's row.
fn lane_sums(tid: u32, v: vec2<f32>) -> vec2<f32> {
    sh_part[tid] = v;
    workgroupBarrier();
    let base = (tid / LANES) * LANES;
    var s = vec2<f32>(0.0);
    for (var l = 0u; l < LANES; l = l + 1u) {
        s = s + sh_part[base + l];
    }
    return s;
}

@compute @workgroup_size(WG)
fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let first = wg.x * TILE;
    let row = first + tid / LANES;
    let lane = tid % LANES;
    let live = row < dims.rows;
    var mu = 0.0;
    var rs = 0.0;
    if (live) {
        mu = mean[row];
        rs = rstd[row];
    }
    // (Σ dx̂, Σ dx̂·x̂) of this lane's columns.
    var s = vec2<f32>(0.0);
    if (live) {
        for (var k1 = lane * 4u; k1 < HIDDEN; k1 = k1 + LANES * 4u * BLOCK) {
            var leaf = vec2<f32>(0.0);
            for (var k = k1; k < min(k1 + LANES * 4u * BLOCK, HIDDEN); k = k + LANES * 4u) {
                let d = ld4_dxn(row * HIDDEN + k) * ld4_gamma(k);
                let xhat = (ld4_x(row * HIDDEN + k) - mu) * rs;
                leaf = leaf + vec2<f32>((d.x + d.y) + (d.z + d.w), dot(d, xhat));
            }
            s = s + leaf;
        }
    }
    let c = lane_sums(tid, s) / f32(HIDDEN);
    if (live) {
        for (var k = lane * 4u; k < HIDDEN; k = k + LANES * 4u) {
            let d = ld4_dxn(row * HIDDEN + k) * ld4_gamma(k);
            let xhat = (ld4_x(row * HIDDEN + k) - mu) * rs;
            dx[(row * HIDDEN + k) / 4u] = rs * (d - c.x - xhat * c.y);
        }
    }
    for (var k = tid * 4u; k < HIDDEN; k = k + WG * 4u) {
        $sums
        for (var j = 0u; j < 4u; j = j + 1u) {
            dgamma[wg.x * HIDDEN + k + j] = ga[j];
            dbeta[wg.x * HIDDEN + k + j] = gb[j];
        }
    }
}

"#,
};

/// How a row-sum gradient leaves the workgroup: `add_<t>` for atomics, a store into
/// partial `part` otherwise.
fn flush(spec: &KernelSpec, t: &str, part: &str, size: &str, index: &str, value: &str) -> Fragment {
    Fragment::from(match spec.write_mode(t) {
        Some(WriteMode::AtomicScatter) => format!("add_{t}({index}, {value});"),
        _ => format!("{t}[{part} * {size} + {index}] = {value};"),
    })
}

/// Whether the backward adds dγ and dβ by atomics (else it flushes partials).
fn atomic(spec: &KernelSpec) -> bool {
    spec.write_mode("dgamma") == Some(WriteMode::AtomicScatter)
}

/// The backward's first kernel: dx, dγ and dβ. It binds neither the saved statistics nor
/// β (the budget of 8 storage buffers): each dx block recomputes its rows' statistics.
fn backward(out: &mut Wgsl, spec: &KernelSpec) {
    atomic_adds(out, spec);
    readers(out, spec);
    row_gemm::core(out, spec, DX);
    row_stats(out);
    out.put(BLOCK_STATS.plain());
    out.put(GROUP_SUMS.plain());
    stage_dx(out, spec);
    dx_block(out, spec);
    let entry = row_gemm::entry(spec, &spec.name);
    if atomic(spec) {
        gb_tile(out, spec);
        out.put(BACKWARD_ATOMIC.fill([("entry", entry)]));
    } else {
        out.put(BACKWARD.fill([("entry", entry)]));
    }
}

/// The backward's entry point under atomic row sums.
const BACKWARD_ATOMIC: Template = Template {
    name: "layernorm_linear_backward_atomic",
    needs: &[],
    text: r#"// Grid row y < SUBS of row tile x: dx of rows x·TILE + y·DXR.. (one block); the
// rest: dγ and dβ of 64 columns summed over the row tile.
@compute @workgroup_size(WG)
$entry
    if (wg.y < SUBS) {
        dx_block(wg.x, wg.y, tid);
    } else {
        gb_tile(wg.x, wg.y - SUBS, tid);
    }
}
"#,
};

/// The backward's entry point under two-pass row sums.
const BACKWARD: Template = Template {
    name: "layernorm_linear_backward",
    needs: &[],
    text: r#"// Grid row y of row tile x: dx, and the dγ and dβ partials, of rows x·TILE + y·DXR..
// (one block).
@compute @workgroup_size(WG)
$entry
    dx_block(wg.x, wg.y, tid);
}
"#,
};

/// The backward's second kernel: dW, and db in the tiles of k column 0.
fn weight_grad(out: &mut Wgsl, spec: &KernelSpec) {
    atomic_adds(out, spec);
    readers(out, spec);
    row_gemm::core(out, spec, DW);
    stage_dw(out, spec);
    dw_tile(out, spec);
    out.put(WEIGHT_GRAD.fill([("entry", row_gemm::entry(spec, &spec.name))]));
}

const WEIGHT_GRAD: Template = Template {
    name: "layernorm_linear_weight_grad",
    needs: &[],
    text: r#"// Grid row y of row tile x: one 64×64 tile of dW (and, in the tiles of column 0, 64
// columns of db) summed over the row tile.
@compute @workgroup_size(WG)
$entry
    dw_tile(wg.x, wg.y, tid);
}
"#,
};

/// A dx block's statistics in the invocation's registers, by [`row_stats`].
const BLOCK_STATS: Template = Template {
    name: "block_stats",
    needs: &[],
    text: r#"// (mean, 1/std) of this invocation's rows first + 4·ty.. (of `count`) into mu and rs,
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
};

/// The sums of a dx block's dγ and dβ terms over its 16 row groups.
const GROUP_SUMS: Template = Template {
    name: "group_sums",
    needs: &[Helper::TwoSumErr4],
    text: r#"// (Σ sh_a, Σ sh_b) of column tid of the k tile over the 16 row groups' sums, each added
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
};

/// The atomic schedule's dγ and dβ: one workgroup per (row tile, 64 columns) recomputes
/// dx̂ₙ = dy·W block by block over the tile's rows and sums them, so that each element gets
/// one atomic add per row tile (as dW does), not one per dx block.
fn gb_tile(out: &mut Wgsl, spec: &KernelSpec) {
    let stage = "stage_dx(first, count, n0, k0, tid)";
    out.put(GB_TILE.fill([
        (
            "product",
            row_gemm::product_loop(spec, DX, ("n0", "OUT"), stage),
        ),
        ("dgamma", flush(spec, "dgamma", "tile", "HIDDEN", "k", "ga")),
        ("dbeta", flush(spec, "dbeta", "tile", "HIDDEN", "k", "gb")),
    ]));
}

/// `gb_tile`: each dx block's `$product` (dx̂ₙ), its dγ and
/// dβ terms summed, and the sums added into the gradients by `$dgamma` and `$dbeta`.
const GB_TILE: Template = Template {
    name: "gb_tile",
    needs: &[Helper::TwoSumErr4],
    text: r#"// dγ = Σ dx̂ₙ·x̂ and dβ = Σ dx̂ₙ of columns kt·64.. over the row tile's rows: each dx
// block's sums (4 rows per invocation, then the 16 row groups) join the total with their
// rounding errors kept (TwoSum), added once into the gradients.
fn gb_tile(tile: u32, kt: u32, tid: u32) {
    let tx = tid % 16u;
    let ty = tid / 16u;
    let k0 = kt * TN;
    // (dγ, dβ) and the rounding errors of their sums.
    var g = vec4<f32>(0.0);
    for (var sub = 0u; sub < SUBS && tile * TILE + sub * DXR < dims.rows; sub = sub + 1u) {
        let first = tile * TILE + sub * DXR;
        let count = min(min(DXR, TILE - sub * DXR), dims.rows - first);
        var mu = vec4<f32>(0.0);
        var rs = vec4<f32>(0.0);
        block_stats(first, count, tid, &mu, &rs);
        $product
        var g1 = vec4<f32>(0.0);
        var g2 = vec4<f32>(0.0);
        for (var i = 0u; i < 4u; i = i + 1u) {
            let row = first + ty * 4u + i;
            if (ty * 4u + i < count) {
                for (var j = 0u; j < 4u; j = j + 1u) {
                    let k = k0 + tx * 4u + j;
                    if (k < HIDDEN) {
                        let xhat = (ld_x(row * HIDDEN + k) - mu[i]) * rs[i];
                        let g = acc[i][j];
                        g1[j] = fma(g, xhat, g1[j]);
                        g2[j] = g2[j] + g;
                    }
                }
            }
        }
        sh_a[ty * 16u + tx] = g1;
        sh_b[ty * 16u + tx] = g2;
        workgroupBarrier();
        if (tid < TN) {
            let p = group_sums(tid);
            let t = g.xy + p;
            g = vec4<f32>(t, g.zw + two_sum_err4(vec4<f32>(g.xy, 0.0, 0.0), vec4<f32>(p, 0.0, 0.0), vec4<f32>(t, 0.0, 0.0)).xy);
        }
        // The next block stages into sh_a and sh_b.
        workgroupBarrier();
    }
    let ga = g.x + g.z;
    let gb = g.y + g.w;
    let k = k0 + tid;
    if (tid < TN && k < HIDDEN) {
        $dgamma
        $dbeta
    }
}

"#,
};

fn stage_dx(out: &mut Wgsl, spec: &KernelSpec) {
    let readers = ["ld_dy", "ld_w"];
    staging(out, spec, &STAGE_DX, (&DX_FETCH, &DX_PUT), &readers);
}

const STAGE_DX: Template = Template {
    name: "stage_dx",
    needs: &[],
    text: r#"// dy[first + m, n0..n0 + BK] (rows m < count) and W[n0.., k0..k0 + 64]: a slice of
// dx̂ₙ = dy·W.
fn stage_dx(first: u32, count: u32, n0: u32, k0: u32, tid: u32) {
    $fetches
    $puts
}

"#,
};

/// One element of `stage_dx`: dy's row m at n, and W's row n0 + r at k.
const DX_FETCH: Template = Template {
    name: "dx_fetch",
    needs: &[],
    text: r#"let e_$q = tid + ${q}u * WG;
let m_$q = e_$q / (BK / $width);
let kk_$q = (e_$q % (BK / $width)) * $width;
let n_$q = n0 + kk_$q;
var v_$q = $zero;
if (m_$q < count && n_$q < OUT) {
    v_$q = $ld_dy((first + m_$q) * OUT + n_$q);
}
let r_$q = e_$q / (TN / $width);
let c_$q = (e_$q % (TN / $width)) * $width;
let k_$q = k0 + c_$q;
var wv_$q = $zero;
if (n0 + r_$q < OUT && k_$q < HIDDEN) {
    wv_$q = $ld_w((n0 + r_$q) * HIDDEN + k_$q);
}
"#,
};

const DX_PUT: Template = Template {
    name: "dx_put",
    needs: &[],
    text: r#"$put_a(kk_$q, m_$q, v_$q);
$put_b(r_$q, c_$q, wv_$q);
"#,
};

fn stage_dw(out: &mut Wgsl, spec: &KernelSpec) {
    let readers = ["ld_dy", "ld_x", "ld_gamma", "ld_beta"];
    staging(out, spec, &STAGE_DW, (&DW_FETCH, &DW_PUT), &readers);
}

const STAGE_DW: Template = Template {
    name: "stage_dw",
    needs: &[],
    text: r#"// dy[first + r0.., n0..n0 + 64] and x̂·γ + β at the same rows, k0..k0 + 64: a slice of
// dW = dyᵀ·(x̂·γ + β).
fn stage_dw(first: u32, count: u32, r0: u32, n0: u32, k0: u32, tid: u32) {
    $fetches
    $puts
}

"#,
};

/// One element of `stage_dw`: dy's and the normalized rows' row r0 + rr, at column c.
const DW_FETCH: Template = Template {
    name: "dw_fetch",
    needs: &[],
    text: r#"let e_$q = tid + ${q}u * WG;
let rr_$q = e_$q / (TN / $width);
let c_$q = (e_$q % (TN / $width)) * $width;
let row_$q = first + r0 + rr_$q;
let live_$q = r0 + rr_$q < count;
var v_$q = $zero;
if (live_$q && n0 + c_$q < OUT) {
    v_$q = $ld_dy(row_$q * OUT + n0 + c_$q);
}
let k_$q = k0 + c_$q;
var xv_$q = $zero;
if (live_$q && k_$q < HIDDEN) {
    xv_$q = fma(($ld_x(row_$q * HIDDEN + k_$q) - mean[row_$q]) * rstd[row_$q], $ld_gamma(k_$q), $ld_beta(k_$q));
}
"#,
};

const DW_PUT: Template = Template {
    name: "dw_put",
    needs: &[],
    text: r#"$put_a(rr_$q, c_$q, v_$q);
$put_b(rr_$q, c_$q, xv_$q);
"#,
};

fn dx_block(out: &mut Wgsl, spec: &KernelSpec) {
    let stage = "stage_dx(first, count, n0, k0, tid)";
    let dgamma = flush(spec, "dgamma", "blk", "HIDDEN", "k", "ga");
    let dbeta = flush(spec, "dbeta", "blk", "HIDDEN", "k", "gb");
    // A block past the rows has no rows to add: its partials stay zero, written here
    // because the reduce sums every block's.
    let empty = match spec.write_mode("dgamma") == Some(WriteMode::ScratchFlush) {
        true => ZERO_PARTIALS.plain(),
        false => Fragment::default(),
    };
    let group_sums = match atomic(spec) {
        true => Fragment::default(),
        false => DX_GROUP_SUMS.fill([("dgamma", dgamma), ("dbeta", dbeta)]),
    };
    out.put(DX_BLOCK.fill([
        ("empty", empty),
        (
            "product",
            row_gemm::product_loop(spec, DX, ("n0", "OUT"), stage),
        ),
        ("group_sums", group_sums),
    ]));
}

/// The partials of block `blk` with no rows: zeros.
const ZERO_PARTIALS: Template = Template {
    name: "zero_partials",
    needs: &[],
    text: r#"for (var k = tid; k < HIDDEN; k = k + WG) {
    dgamma[blk * HIDDEN + k] = 0.0;
    dbeta[blk * HIDDEN + k] = 0.0;
}
"#,
};

/// A k tile's dγ and dβ partials under two-pass row sums, flushed by `$dgamma` and
/// `$dbeta`.
const DX_GROUP_SUMS: Template = Template {
    name: "dx_group_sums",
    needs: &[],
    text: r#"// dγ and dβ of this k tile: the 16 row groups' sums, through the slices' memory.
sh_a[ty * 16u + tx] = g1;
sh_b[ty * 16u + tx] = g2;
workgroupBarrier();
if (tid < TN && k0 + tid < HIDDEN) {
    let k = k0 + tid;
    let gab = group_sums(tid);
    let ga = gab.x;
    let gb = gab.y;
    $dgamma
    $dbeta
}
// The next k tile stages into sh_a and sh_b.
workgroupBarrier();
"#,
};

/// `dx_block` and `dx_rows`: `$empty` what a block with no rows writes, `$product` dx̂ₙ of a
/// k tile, `$group_sums` its dγ and dβ partials (nothing
/// under atomic row sums).
const DX_BLOCK: Template = Template {
    name: "dx_block",
    needs: &[],
    text: r#"// dx of one block of DXR rows, over every k tile in turn: dx̂ₙ = dy·W (tiled), then the
// LayerNorm chain rule dx = rstd·(dx̂ − mean(dx̂) − x̂·mean(dx̂·x̂)), dx̂ = dx̂ₙ·γ. dx̂ is
// kept in dx until the row means are known; each invocation rereads only what it wrote.
// Under two-pass, dγ and dβ of the block's rows leave as partial `blk` (the atomic
// schedule sums them over the whole row tile in gb_tile instead).
// (No early return: cooperative products must be reached by uniform control flow, and
// naga's analysis counts any return before them as divergence.)
fn dx_block(tile: u32, sub: u32, tid: u32) {
    let first = tile * TILE + sub * DXR;
    let blk = tile * SUBS + sub;
    var count = 0u;
    if (first < dims.rows) {
        count = min(min(DXR, TILE - sub * DXR), dims.rows - first);
    }
    if (count == 0u) {
        $empty
    } else {
        dx_rows(first, count, blk, tid);
    }
}

// dx_block's block of `count` > 0 rows from `first`.
fn dx_rows(first: u32, count: u32, blk: u32, tid: u32) {
    let tx = tid % 16u;
    let ty = tid / 16u;
    var mu = vec4<f32>(0.0);
    var rs = vec4<f32>(0.0);
    block_stats(first, count, tid, &mu, &rs);
    // Σ dx̂ and Σ dx̂·x̂ of this invocation's rows: a fresh partial per k tile.
    var s1 = vec4<f32>(0.0);
    var s2 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < HIDDEN; k0 = k0 + TN) {
        $product
        var p1 = vec4<f32>(0.0);
        var p2 = vec4<f32>(0.0);
        var g1 = vec4<f32>(0.0);
        var g2 = vec4<f32>(0.0);
        for (var i = 0u; i < 4u; i = i + 1u) {
            let row = first + ty * 4u + i;
            if (ty * 4u + i < count) {
                for (var j = 0u; j < 4u; j = j + 1u) {
                    let k = k0 + tx * 4u + j;
                    if (k < HIDDEN) {
                        let xhat = (ld_x(row * HIDDEN + k) - mu[i]) * rs[i];
                        let g = acc[i][j];
                        let dxhat = g * ld_gamma(k);
                        p1[i] = p1[i] + dxhat;
                        p2[i] = fma(dxhat, xhat, p2[i]);
                        g1[j] = fma(g, xhat, g1[j]);
                        g2[j] = g2[j] + g;
                        dx[row * HIDDEN + k] = dxhat;
                    }
                }
            }
        }
        s1 = s1 + p1;
        s2 = s2 + p2;
        $group_sums
    }
    // The row means: this row group's 16 column groups' sums.
    sh_a[ty * 16u + tx] = s1;
    sh_b[ty * 16u + tx] = s2;
    workgroupBarrier();
    var c2 = vec4<f32>(0.0);
    var c1 = vec4<f32>(0.0);
    for (var t = 0u; t < 16u; t = t + 1u) {
        c2 = c2 + sh_a[ty * 16u + t];
        c1 = c1 + sh_b[ty * 16u + t];
    }
    c2 = c2 / f32(HIDDEN);
    c1 = c1 / f32(HIDDEN);
    for (var k0 = 0u; k0 < HIDDEN; k0 = k0 + TN) {
        for (var i = 0u; i < 4u; i = i + 1u) {
            let row = first + ty * 4u + i;
            if (ty * 4u + i < count) {
                for (var j = 0u; j < 4u; j = j + 1u) {
                    let k = k0 + tx * 4u + j;
                    if (k < HIDDEN) {
                        let xhat = (ld_x(row * HIDDEN + k) - mu[i]) * rs[i];
                        let d = dx[row * HIDDEN + k];
                        dx[row * HIDDEN + k] = rs[i] * (d - c2[i] - xhat * c1[i]);
                    }
                }
            }
        }
    }
}

"#,
};

fn dw_tile(out: &mut Wgsl, spec: &KernelSpec) {
    let stage = "stage_dw(first, count, r0, n0, k0, tid)";
    let dw_index = ("(OUT * HIDDEN)", "n * HIDDEN + k");
    out.put(DW_TILE.fill([
        (
            "product",
            row_gemm::product_loop(spec, DW, ("r0", "count"), stage),
        ),
        (
            "dw",
            flush(spec, "dw", "tile", dw_index.0, dw_index.1, "acc[i][j]"),
        ),
        (
            "db_sum",
            compensated_sum("dbs", "0u", "count", "ld_dy((first + i) * OUT + n)"),
        ),
        ("db", flush(spec, "db", "tile", "OUT", "n", "dbs")),
    ]));
}

/// `dw_tile`: `$product` a tile of dW, flushed by `$dw`; in k column 0 also `$db_sum`,
/// db's 64 columns summed over the row tile, flushed by `$db`.
const DW_TILE: Template = Template {
    name: "dw_tile",
    needs: &[],
    text: r#"// dW[n0.., k0..] (64×64, tile t of the KT-wide grid of them) summed over the row
// tile's rows, leaving as partial `tile` (or atomic adds); the tiles of k column 0 also
// sum their 64 columns of db = Σ dy over the tile (one add or partial per row tile, as dW).
fn dw_tile(tile: u32, t: u32, tid: u32) {
    let tx = tid % 16u;
    let ty = tid / 16u;
    let n0 = (t / KT) * TN;
    let k0 = (t % KT) * TN;
    let first = tile * TILE;
    let count = min(TILE, dims.rows - first);
    $product
    for (var i = 0u; i < 4u; i = i + 1u) {
        let n = n0 + ty * 4u + i;
        for (var j = 0u; j < 4u; j = j + 1u) {
            let k = k0 + tx * 4u + j;
            if (n < OUT && k < HIDDEN) {
                $dw
            }
        }
    }
    let n = n0 + tid;
    if (k0 == 0u && tid < TN && n < OUT) {
        $db_sum
        $db
    }
}

"#,
};

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
        compensated_sum("acc", "0u", count, &format!("{part}[i * {size} + e]"))
    };
    out.put(REDUCE_PARTIALS.fill([
        ("name", Fragment::from(spec.name.as_str())),
        ("dgamma", sum("dgamma_part", "dims.n_blocks", "HIDDEN")),
        ("dbeta", sum("dbeta_part", "dims.n_blocks", "HIDDEN")),
        ("dw", sum("dw_part", "dims.n_tiles", "(OUT * HIDDEN)")),
        ("db", sum("db_part", "dims.db_parts", "OUT")),
    ]));
}

/// The reduce's entry point: `$dgamma`, `$dbeta`, `$dw` and `$db` each sum an element's
/// partials into `acc`.
const REDUCE_PARTIALS: Template = Template {
    name: "layernorm_linear_reduce",
    needs: &[],
    text: r#"// One invocation per element of dγ | dβ | dW | db, summing its partials: n_tiles of
// dW, n_blocks of dγ and dβ, db_parts of db.
@compute @workgroup_size(WG)
fn $name(@builtin(global_invocation_id) gid: vec3<u32>) {
    var e = gid.x;
    if (e < HIDDEN) {
        $dgamma
        dgamma[e] = acc;
        return;
    }
    e = e - HIDDEN;
    if (e < HIDDEN) {
        $dbeta
        dbeta[e] = acc;
        return;
    }
    e = e - HIDDEN;
    if (e < OUT * HIDDEN) {
        $dw
        dw[e] = acc;
        return;
    }
    e = e - OUT * HIDDEN;
    if (e < OUT) {
        $db
        db[e] = acc;
    }
}
"#,
};
