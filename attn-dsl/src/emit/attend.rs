//! The per-row online-softmax schedule (the seeds' design, tile rows walked in turn):
//! one workgroup holds one query row in workgroup memory, walks the visible keys in blocks
//! of WG, keeps the running max `m`, sum `l` and accumulator, and writes `O = acc / l` and
//! `LSE = m + log(l)`. Forward and decode share it; they differ only in the index helpers.

use super::index;
use super::numerics::Helper;
use super::writer::{Fragment, Template, Wgsl};
use crate::spec::KernelSpec;

/// The row's staged query, its accumulator, the block's P and partial sums, and the
/// row's state and key range.
const WORKGROUP_MEMORY: Template = Template {
    name: "attend_workgroup_memory",
    needs: &[],
    text: r#"var<workgroup> sh_q: array<f32, HEAD_DIM>;
var<workgroup> sh_acc: array<f32, HEAD_DIM>;
var<workgroup> sh_p: array<f32, WG>;
var<workgroup> sh_partial: array<f32, WG>;
// Running max m and running sum l of the online softmax.
var<workgroup> sh_state: vec2<f32>;
// Visible keys [start, end) of the current row, loaded uniformly so loops may hold barriers.
var<workgroup> sh_range: vec2<u32>;

"#,
};

pub(super) fn workgroup_memory(out: &mut Wgsl) {
    out.put(WORKGROUP_MEMORY.plain());
}

pub(super) fn forward_helpers(out: &mut Wgsl, spec: &KernelSpec) {
    index::kv_head(out, spec);
    index::row_indexing(out, spec);
    index::masks(out, spec);
    let all = [("query_at", "q"), ("key_at", "k"), ("value_at", "v")];
    // An fp8 cache's words are widened where the tiles fetch them (`coop::fp8_fetch`).
    let names = match spec.kv_fp8 {
        Some(_) => &all[..1],
        None => &all[..],
    };
    match super::extend::sliced(spec) {
        true => {
            super::dtype::loads(out, spec, names);
            super::extend::stores(out);
        }
        false => {
            super::dtype::accessors(out, spec, names);
            out.put(FORWARD_STATS.plain());
        }
    }
    super::sinks::helpers(out, spec);
}

/// `store_lse`: the row's LSE, +inf for an empty row.
const FORWARD_STATS: Template = Template {
    name: "forward_stats",
    needs: &[Helper::Lse],
    text: r#"fn positive_inf() -> f32 {
    // Not a constant expression: WGSL rejects non-finite constants.
    var bits = 0x7f800000u;
    return bitcast<f32>(bits);
}

// An empty row (no visible key) stores LSE = +inf, so a backward pass that recomputes
// P = exp(score - LSE) gets 0 there, never NaN.
fn store_lse(row: u32, h: u32, m: f32, l: f32) {
    var x = positive_inf();
    // l == 0 only for an empty row; a NaN sum (a NaN input) falls through and shows.
    if (l != 0.0) {
        x = lse_f32(m, l);
    }
    lse[row_index(row, h)] = x;
}

"#,
};

/// The decode's keys: the whole cache (or its window).
const DECODE_RANGE: Template = Template {
    name: "decode_range",
    needs: &[],
    text: r#"// Keys in the cache: one length for every sequence.
fn cache_len() -> u32 {
    return dims.cache_len;
}

// The query follows the cache's last row.
fn key_range(row: u32) -> vec2<u32> {
    return vec2<u32>($start, $end);
}

"#,
};

/// The decode's loads and stores: f32 tensors, and no LSE.
const DECODE_ACCESSORS: Template = Template {
    name: "decode_accessors",
    needs: &[],
    text: r#"fn query_at(i: u32) -> f32 {
    return q[i];
}

fn key_at(i: u32) -> f32 {
    return k_cache[i];
}

fn value_at(i: u32) -> f32 {
    return v_cache[i];
}

fn store_out(i: u32, x: f32) {
    o[i] = x;
}

// Decode saves no LSE.
fn store_lse(row: u32, h: u32, m: f32, l: f32) {
}

"#,
};

pub(super) fn decode_helpers(out: &mut Wgsl, spec: &KernelSpec) {
    index::kv_head(out, spec);
    index::row_indexing(out, spec);
    let start = if spec.masks.window {
        "select(0u, cache_len() - dims.window, cache_len() > dims.window)"
    } else {
        "0u"
    };
    let (start, end) = index::decode_bounds(spec, start, "cache_len()", "cache_len() - 1u");
    out.put(DECODE_RANGE.fill([("start", start.into()), ("end", end.into())]));
    index::key_visible(out, spec);
    super::scores::helpers(out, spec, false);
    super::sinks::helpers(out, spec);
    out.put(DECODE_ACCESSORS.plain());
}

pub(super) fn attend_row(out: &mut Wgsl, spec: &KernelSpec) {
    // Over Q and K's head_dim: past it both read as zeros.
    let dot = super::numerics::dot(
        "dot",
        spec.head_dim,
        |i| format!("sh_q[{i}]"),
        |i| format!("key_at(ki + {i})"),
    );
    let stage_q = match index::within(spec, index::Row::Qk, "tid") {
        Some(c) => STAGE_Q_WITHIN.fill([("within", c.into())]),
        None => Fragment::from("sh_q[tid] = query_at(qi + tid);\n"),
    };
    // The row's state, with the sink joined where the kernel has one.
    let (state, result, m) = match super::sinks::join(spec.masks.sinks, "h", "m", "l", "corr") {
        Some(join) => (
            JOINED_STATE.fill([("join", join)]),
            "sh_acc[tid] * (corr / l)",
            "m",
        ),
        None => (
            Fragment::from("let l = sh_state.y;\n"),
            "sh_acc[tid] / l",
            "sh_state.x",
        ),
    };
    out.put(ATTEND_ROW.fill([
        ("dot", dot),
        ("state", state),
        ("result", Fragment::from(result)),
        ("m", Fragment::from(m)),
        ("stage_q", stage_q),
        (
            "v_in",
            Fragment::from(index::and_within(
                spec,
                "tid < N_ACTIVE",
                index::Row::V,
                "d_local",
            )),
        ),
        (
            "o_in",
            Fragment::from(index::and_within(
                spec,
                "tid < HEAD_DIM",
                index::Row::V,
                "tid",
            )),
        ),
    ]));
}

/// The query row into `sh_q`, zeros past a Q row narrower than the kernel's width.
const STAGE_Q_WITHIN: Template = Template {
    name: "stage_q_within",
    needs: &[],
    text: r#"sh_q[tid] = 0.0;
if ($within) {
    sh_q[tid] = query_at(qi + tid);
}
"#,
};

/// The row's state read for its output, as variables `join_sink` may move.
const JOINED_STATE: Template = Template {
    name: "joined_state",
    needs: &[],
    text: r#"var m = sh_state.x;
var l = sh_state.y;
$join
"#,
};

/// One query row against its visible keys, a block of WG keys at a time: the scores, the
/// online softmax's max and sum, P·V split over K_PAR invocations per element; then O and
/// the LSE.
const ATTEND_ROW: Template = Template {
    name: "attend_row",
    needs: &[Helper::Exp],
    text: r#"fn attend_row(row: u32, h: u32, tid: u32) {
    let kv_h = kv_head(h);
    if (tid == 0u) {
        sh_range = key_range(row);
        sh_state = vec2<f32>(NEG_BIG, 0.0);
    }
    let qi = q_index(row, h);
    if (tid < HEAD_DIM) {
        $stage_q
        sh_acc[tid] = 0.0;
    }
    workgroupBarrier();
    let range = workgroupUniformLoad(&sh_range);

    let d_local = tid / K_PAR;
    let kc = tid % K_PAR;
    // Blocks wholly before the document start are skipped, so the first block walked
    // holds a visible key whenever the row has one.
    let first_blk = range.x / WG;
    let n_blocks = (range.y + WG - 1u) / WG;
    for (var blk = first_blk; blk < n_blocks; blk = blk + 1u) {
        let k_start = blk * WG;
        let j = k_start + tid;
        let visible = j >= range.x && j < range.y && key_visible(row, h, j);

        var x = NEG_BIG;
        if (visible) {
            let ki = kv_index(j, kv_h);
            $dot
            x = score(row, h, j, dot);
        }

        let m_old = sh_state.x;
        let m_new = max(m_old, wg_reduce_max(tid, x));
        var p = 0.0;
        if (visible) {
            p = exp_f32(x - m_new);
        }
        // l sums P before dropout; P·V takes it after.
        sh_p[tid] = dropped(row, h, j, p);
        let block_sum = wg_reduce_sum(tid, p);
        let corr = exp_f32(m_old - m_new);

        // P·V: invocation (d_local, kc) sums chunk kc of the block for element d_local.
        // Keys with p == 0 (masked, or underflowed) add nothing and are not read.
        if ($v_in) {
            let lo = kc * CHUNK;
            let hi = min(lo + CHUNK, WG);
            var part = 0.0;
            for (var jl = lo; jl < hi; jl = jl + 1u) {
                let pj = sh_p[jl];
                if (pj != 0.0) {
                    part = fma(pj, value_at(v_index(k_start + jl, kv_h) + d_local), part);
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
            sh_acc[d_local] = sh_acc[d_local] * corr + sum;
        }
        if (tid == 0u) {
            sh_state = vec2<f32>(m_new, sh_state.y * corr + block_sum);
        }
        workgroupBarrier();
    }

    $state
    if ($o_in) {
        var result = 0.0;
        if (l != 0.0) {
            result = $result;
        }
        store_out(o_index(row, h) + tid, result);
    }
    if (tid == 0u) {
        store_lse(row, h, $m, l);
    }
}

"#,
};

/// The decode's entry point: one workgroup per head, of the batch's sequence `wg.y`.
const DECODE_ENTRY: Template = Template {
    name: "decode_entry",
    needs: &[],
    text: r#"@compute @workgroup_size(WG)
fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    batch = wg.y;
    attend_row(0u, wg.x, tid);
}
"#,
};

pub(super) fn decode_entry(out: &mut Wgsl, name: &str) {
    out.put(DECODE_ENTRY.fill([("name", name.into())]));
}
