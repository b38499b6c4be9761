//! The backward pass, as three bodies from which every schedule is assembled:
//!
//! - `backward_prep` (s-major): packs LSE and D = rowsum(dO ∘ O) per query row into
//!   `stats` [2, s, h], D summed in the order dP is below, so that dP − D cancels exactly
//!   when a row attends to one key (O = V_j).
//! - `backward_q` (s-major, one query row at a time): recomputes P = exp(S − LSE), dP and
//!   dS = scale·P·(dP − D), accumulates dQ += dS·K (owned), and, per the description,
//!   flushes P and dS to scratch `p_ds` [2, s, h, j] (split schedule) or adds dK += dSᵀ·Q and
//!   dV += Pᵀ·dO into `dkv` [2, j, kv_h, d] by atomic scatter (streaming schedule).
//! - `backward_kv` (j-major, one key row at a time): walks the query rows that see it and
//!   the query heads of its KV head, takes P and dS from scratch or recomputes them, and
//!   accumulates dK and dV (owned, no atomics).
//!
//! Packing keeps every backward kernel within WebGPU's default of 8 storage buffers.

use super::flash::guarded;
use super::index;
use super::numerics::Helper;
use super::writer::{Fragment, Template, Wgsl, lines};
use crate::spec::{KernelSpec, Source, WriteMode};

/// Offsets of the packed parts: part 1 of `stats` and `p_ds` starts after part 0.
const PACKING: Template = Template {
    name: "packing",
    needs: &[],
    text: r#"fn stats_part(part: u32, row: u32, h: u32) -> u32 {
    return ((part * dims.batch + batch) * dims.seq_len + row) * dims.n_heads + h;
}

fn p_ds_part(part: u32, row: u32, h: u32, j: u32) -> u32 {
    return (((part * dims.batch + batch) * dims.seq_len + row) * dims.n_heads + h) * dims.seq_len + j;
}

"#,
};

/// Where part 1 (dV) of a lane of `dkv` starts, one width: lanes of dK then dV rows.
const DKV_ONE_WIDTH: Template = Template {
    name: "dkv_one_width",
    needs: &[],
    text: r#"// Where part 1 (dV) of `dkv` starts.
fn dkv_part1() -> u32 {
    return dims.batch * dims.seq_len * dims.n_kv_heads * HEAD_DIM;
}

"#,
};

/// Rows of two widths: a lane of `dkv` holds dK's rows (QK_DIM wide), then dV's (V_DIM).
const DKV_TWO_WIDTHS: Template = Template {
    name: "dkv_two_widths",
    needs: &[],
    text: r#"// Where part 1 (dV, rows V_DIM wide) of a lane of `dkv` starts: after dK's rows.
fn dkv_part1() -> u32 {
    return dims.batch * dims.seq_len * dims.n_kv_heads * QK_DIM;
}

// Elements of one lane of `dkv`: dK's rows and dV's.
fn dkv_lane() -> u32 {
    return dims.batch * dims.seq_len * dims.n_kv_heads * (QK_DIM + V_DIM);
}

"#,
};

/// The packed parts' offsets: `stats`, `p_ds` and the lanes of `dkv`.
pub(super) fn packing(out: &mut Wgsl, spec: &KernelSpec) {
    out.put(PACKING.plain());
    out.put(match spec.split_dims() {
        false => DKV_ONE_WIDTH.plain(),
        true => DKV_TWO_WIDTHS.plain(),
    });
}

/// The offset of a row of O, dO or V: `same`, that of Q's or K's row, where the rows are
/// of one width, else `own` (rows of two widths have strides of their own).
fn o_rows(spec: &KernelSpec, same: &str, own: &str) -> String {
    match spec.split_dims() {
        true => format!("({own})"),
        false => same.to_string(),
    }
}

/// `dst[tid] = src[at + tid]`, zero past the end of a `row` narrower than the kernel's width.
fn stage_row(spec: &KernelSpec, row: index::Row, dst: &str, src: &str, at: &str) -> Fragment {
    let load = lines([format!("{dst}[tid] = {src}[{at} + tid];")]);
    match index::within(spec, row, "tid") {
        Some(c) => lines([format!("{dst}[tid] = 0.0;")]).then(guarded(Some(c), load)),
        None => load,
    }
}

pub(super) fn backward_prep(out: &mut Wgsl, spec: &KernelSpec) {
    index::row_indexing(out, spec);
    packing(out, spec);
    super::dtype::loads(out, spec, &[("out_at", "o"), ("grad_out_at", "d_o")]);
    // D = dO·O in the order the backward kernels sum dP = dO·V, over V's width.
    let oi = o_rows(spec, "qi", "o_index(row, h)");
    let delta = super::numerics::dot(
        "delta",
        spec.v_dim(),
        |i| format!("grad_out_at({oi} + {i})"),
        |i| format!("out_at({oi} + {i})"),
    );
    out.put(PREP_ROW.fill([("delta", delta)]));
}

/// A query row's LSE and D packed into `stats`, by one invocation.
const PREP_ROW: Template = Template {
    name: "prep_row",
    needs: &[],
    text: r#"fn prep_row(row: u32, h: u32, tid: u32) {
    if (tid == 0u) {
        let qi = q_index(row, h);
        $delta
        stats[stats_part(0u, row, h)] = lse[row_index(row, h)];
        stats[stats_part(1u, row, h)] = delta;
    }
}

"#,
};

/// The query row's staged Q, dO and dQ, the block's dS and partial sums, its key range.
const BACKWARD_Q_MEMORY: Template = Template {
    name: "backward_q_memory",
    needs: &[],
    text: r#"var<workgroup> sh_q: array<f32, HEAD_DIM>;
var<workgroup> sh_do: array<f32, HEAD_DIM>;
var<workgroup> sh_acc: array<f32, HEAD_DIM>;
var<workgroup> sh_ds: array<f32, WG>;
var<workgroup> sh_partial: array<f32, WG>;
var<workgroup> sh_range: vec2<u32>;

"#,
};

/// P and dS of the pair into the split schedule's scratch.
const FLUSH_P_DS: Template = Template {
    name: "flush_p_ds",
    needs: &[],
    text: r#"p_ds[p_ds_part(0u, row, h, j)] = dropped(row, h, j, pj);
p_ds[p_ds_part(1u, row, h, j)] = dsj;
"#,
};

/// The streaming schedule's dK += dS·Q and dV += P·dO of the pair, by atomics.
const SCATTER_DKV: Template = Template {
    name: "scatter_dkv",
    needs: &[],
    text: r#"// dK is part 0 of dkv, dV part 1.
let dv_at = dkv_part1() + ki;
for (var dd = 0u; dd < HEAD_DIM; dd = dd + 1u) {
    add_dkv(ki + dd, dsj * sh_q[dd]);
    add_dkv(dv_at + dd, dropped(row, h, j, pj) * sh_do[dd]);
}
"#,
};

pub(super) fn backward_q(out: &mut Wgsl, spec: &KernelSpec) {
    index::kv_head(out, spec);
    index::row_indexing(out, spec);
    index::masks(out, spec);
    packing(out, spec);
    out.put(BACKWARD_Q_MEMORY.plain());
    let scatter = spec.write_mode("dkv") == Some(WriteMode::AtomicScatter);
    if scatter {
        super::scatter::atomic_add(out, spec, "dkv");
    }
    let flush = match spec.write_mode("p_ds") {
        Some(_) => FLUSH_P_DS.plain(),
        None => Fragment::default(),
    };
    let scatter_lines = match scatter {
        true => SCATTER_DKV.plain(),
        false => Fragment::default(),
    };
    // S = Q·K over Q and K's width, dP = dO·V over V's.
    let vi = o_rows(spec, "ki", "v_index(j, kv_h)");
    let dots = super::numerics::dot(
        "dot",
        spec.head_dim,
        |i| format!("sh_q[{i}]"),
        |i| format!("k[ki + {i}]"),
    )
    .then(super::numerics::dot(
        "dp",
        spec.v_dim(),
        |i| format!("sh_do[{i}]"),
        |i| format!("v[{vi} + {i}]"),
    ));
    let oi = o_rows(spec, "qi", "o_index(row, h)");
    let stage = stage_row(spec, index::Row::Qk, "sh_q", "q", "qi").then(stage_row(
        spec,
        index::Row::V,
        "sh_do",
        "d_o",
        &oi,
    ));
    let qk_in = |cond: &str, c: &str| index::and_within(spec, cond, index::Row::Qk, c);
    out.put(BACKWARD_ROW.fill([
        ("dots", dots),
        ("flush", flush),
        ("scatter", scatter_lines),
        ("stage", stage),
        ("dq_in", qk_in("tid < N_ACTIVE", "d_local").into()),
        ("dq_out", qk_in("tid < HEAD_DIM", "tid").into()),
    ]));
}

/// One query row against its visible keys, a block of WG keys at a time: P and dS
/// recomputed per key (flushed or scattered per the schedule), then dQ += dS·K split over
/// K_PAR invocations per element.
const BACKWARD_ROW: Template = Template {
    name: "backward_row",
    needs: &[Helper::Exp],
    text: r#"fn backward_row(row: u32, h: u32, tid: u32) {
    let kv_h = kv_head(h);
    let qi = q_index(row, h);
    if (tid == 0u) {
        sh_range = key_range(row);
    }
    if (tid < HEAD_DIM) {
        $stage
        sh_acc[tid] = 0.0;
    }
    workgroupBarrier();
    let range = workgroupUniformLoad(&sh_range);
    let row_lse = stats[stats_part(0u, row, h)];
    let delta = stats[stats_part(1u, row, h)];

    let d_local = tid / K_PAR;
    let kc = tid % K_PAR;
    let first_blk = range.x / WG;
    let n_blocks = (range.y + WG - 1u) / WG;
    for (var blk = first_blk; blk < n_blocks; blk = blk + 1u) {
        let k_start = blk * WG;
        let j = k_start + tid;
        var dsj = 0.0;
        if (j >= range.x && j < range.y && key_visible(row, h, j)) {
            let ki = kv_index(j, kv_h);
            $dots
            let xj = scored(row, h, j, dot);
            let pj = exp_f32(xj.x - row_lse);
            // dS with respect to the pre-cap score: dBias, and dS/scale for dQ and dK.
            let gj = score_grads(row, h, j, dot, xj, pj * (dropped(row, h, j, dp) - delta), true);
            dsj = params.scale * gj;
            $flush
            $scatter
        }
        sh_ds[tid] = dsj;
        workgroupBarrier();

        // dQ += dS·K: invocation (d_local, kc) sums chunk kc of the block for element d_local.
        if ($dq_in) {
            let lo = kc * CHUNK;
            let hi = min(lo + CHUNK, WG);
            var part = 0.0;
            for (var jl = lo; jl < hi; jl = jl + 1u) {
                let dj = sh_ds[jl];
                if (dj != 0.0) {
                    part = fma(dj, k[kv_index(k_start + jl, kv_h) + d_local], part);
                }
            }
            sh_partial[tid] = part;
        }
        workgroupBarrier();
        if (kc == 0u && tid < N_ACTIVE) {
            var sum = 0.0;
            for (var i = 0u; i < K_PAR; i = i + 1u) {
                sum = sum + sh_partial[tid + i];
            }
            sh_acc[d_local] = sh_acc[d_local] + sum;
        }
        workgroupBarrier();
    }
    // Gradients accumulate: the host zeroes dq for a fresh gradient.
    if ($dq_out) {
        dq[qi + tid] = dq[qi + tid] + sh_acc[tid];
    }
}

"#,
};

/// The key row's staged K, V, dK and dV, the block's P, dS and partial sums, its query
/// range.
const BACKWARD_KV_MEMORY: Template = Template {
    name: "backward_kv_memory",
    needs: &[],
    text: r#"var<workgroup> sh_k: array<f32, HEAD_DIM>;
var<workgroup> sh_v: array<f32, HEAD_DIM>;
var<workgroup> sh_dk: array<f32, HEAD_DIM>;
var<workgroup> sh_dv: array<f32, HEAD_DIM>;
var<workgroup> sh_p: array<f32, WG>;
var<workgroup> sh_ds: array<f32, WG>;
var<workgroup> sh_pk: array<f32, WG>;
var<workgroup> sh_pv: array<f32, WG>;
var<workgroup> sh_range: vec2<u32>;

"#,
};

pub(super) fn backward_kv(out: &mut Wgsl, spec: &KernelSpec) {
    index::kv_head(out, spec);
    index::row_indexing(out, spec);
    index::masks(out, spec);
    packing(out, spec);
    out.put(BACKWARD_KV_MEMORY.plain());
    let vi = o_rows(spec, "ki", "v_index(col, kv_h)");
    let (load_kv, p_ds) = match spec.source {
        Source::Recompute => (
            stage_row(spec, index::Row::Qk, "sh_k", "k", "ki").then(stage_row(
                spec,
                index::Row::V,
                "sh_v",
                "v",
                &vi,
            )),
            recompute_p_ds(spec),
        ),
        Source::Scratch => (Fragment::default(), SCRATCH_P_DS.into()),
    };
    // dK += dSᵀ·Q and dV += Pᵀ·dO for element d_local of each row; past the end of the
    // narrower row nothing is read.
    let oi = o_rows(spec, "qi", "o_index(s_start + sl, h) + d_local");
    let pk = "pk = fma(dsj, q[qi], pk);".to_string();
    let pv = format!("pv = fma(pj, d_o[{oi}], pv);");
    // `line`, within the narrower row where `c` indexes it.
    let within = |row, c: &str, line: String| guarded(index::within(spec, row, c), lines([line]));
    let products = within(index::Row::Qk, "d_local", pk).then(within(index::Row::V, "d_local", pv));
    let dk = "dk[ki + tid] = dk[ki + tid] + sh_dk[tid];".to_string();
    let dv = format!("dv[{vi} + tid] = dv[{vi} + tid] + sh_dv[tid];");
    let stores = within(index::Row::Qk, "tid", dk).then(within(index::Row::V, "tid", dv));
    out.put(BACKWARD_COL.fill([
        ("load_kv", load_kv),
        ("p_ds", p_ds),
        ("products", products),
        ("stores", stores),
    ]));
}

/// P and dS of query `s` against the staged key row, recomputed: S over Q and K's width, dP
/// over V's.
fn recompute_p_ds(spec: &KernelSpec) -> Fragment {
    let oi = o_rows(spec, "qi", "o_index(s, h)");
    let dot = |acc: &str, width: u32, row: &str, at: &str, staged: &str| {
        super::numerics::dot(
            acc,
            width,
            |i| format!("{row}[{at} + {i}]"),
            |i| format!("{staged}[{i}]"),
        )
    };
    RECOMPUTE_P_DS.fill([
        ("dot", dot("dot", spec.head_dim, "q", "qi", "sh_k")),
        ("dp", dot("dp", spec.v_dim(), "d_o", &oi, "sh_v")),
    ])
}

/// P and dS of query `s` against the staged key row, from the forward's LSE and D.
const RECOMPUTE_P_DS: Template = Template {
    name: "recompute_p_ds",
    needs: &[Helper::Exp],
    text: r#"let qi = q_index(s, h);
$dot
$dp
let x_s = scored(s, h, col, dot);
p_s = exp_f32(x_s.x - stats[stats_part(0u, s, h)]);
ds_s = params.scale * score_grads(s, h, col, dot, x_s, p_s * (dropped(s, h, col, dp) - stats[stats_part(1u, s, h)]), true);
p_s = dropped(s, h, col, p_s);
"#,
};

/// P and dS of query `s` against the key row, read from the split schedule's scratch.
const SCRATCH_P_DS: &str = r#"p_s = p_ds[p_ds_part(0u, s, h, col)];
ds_s = p_ds[p_ds_part(1u, s, h, col)];
"#;

/// One key row against the query rows that see it, a block of WG rows of each query head
/// at a time: P and dS per query, then dK += dSᵀ·Q and dV += Pᵀ·dO split over K_PAR
/// invocations per element.
const BACKWARD_COL: Template = Template {
    name: "backward_col",
    needs: &[],
    text: r#"fn backward_col(col: u32, kv_h: u32, tid: u32) {
    let ki = kv_index(col, kv_h);
    if (tid == 0u) {
        sh_range = query_range(col);
    }
    if (tid < HEAD_DIM) {
        $load_kv
        sh_dk[tid] = 0.0;
        sh_dv[tid] = 0.0;
    }
    workgroupBarrier();
    let range = workgroupUniformLoad(&sh_range);

    let d_local = tid / K_PAR;
    let kc = tid % K_PAR;
    let first_blk = range.x / WG;
    let n_blocks = (range.y + WG - 1u) / WG;
    let group = q_per_kv();
    // Every block of query rows that sees this key, last first, and within a block every
    // query head of this KV head: under a causal or document mask a key's weights shrink
    // with the query's distance, so the small terms are added while the sums are small.
    let walk = (n_blocks - first_blk) * group;
    for (var it = 0u; it < walk; it = it + 1u) {
        let h = kv_h * group + it % group;
        {
            let s_start = (n_blocks - 1u - it / group) * WG;
            let s = s_start + tid;
            var p_s = 0.0;
            var ds_s = 0.0;
            if (s >= range.x && s < range.y && visible(s, h, col)) {
                $p_ds
            }
            sh_p[tid] = p_s;
            sh_ds[tid] = ds_s;
            workgroupBarrier();

            // dK += dSᵀ·Q and dV += Pᵀ·dO over chunk kc of the block, for element d_local.
            if (tid < N_ACTIVE) {
                let lo = kc * CHUNK;
                let hi = min(lo + CHUNK, WG);
                var pk = 0.0;
                var pv = 0.0;
                for (var i = lo; i < hi; i = i + 1u) {
                    let sl = lo + hi - 1u - i;
                    let pj = sh_p[sl];
                    let dsj = sh_ds[sl];
                    // A dropped P is 0 where dS is not.
                    if (pj != 0.0 || dsj != 0.0) {
                        let qi = q_index(s_start + sl, h) + d_local;
                        $products
                    }
                }
                sh_pk[tid] = pk;
                sh_pv[tid] = pv;
            }
            workgroupBarrier();
            if (kc == 0u && tid < N_ACTIVE) {
                var sk = 0.0;
                var sv = 0.0;
                for (var i = 0u; i < K_PAR; i = i + 1u) {
                    sk = sk + sh_pk[tid + K_PAR - 1u - i];
                    sv = sv + sh_pv[tid + K_PAR - 1u - i];
                }
                sh_dk[d_local] = sh_dk[d_local] + sk;
                sh_dv[d_local] = sh_dv[d_local] + sv;
            }
            workgroupBarrier();
        }
    }
    // Gradients accumulate: the host zeroes dk and dv for a fresh gradient.
    if (tid < HEAD_DIM) {
        $stores
    }
}

"#,
};
