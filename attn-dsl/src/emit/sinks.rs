//! Attention sinks (`masks: [.., sinks]`, gpt-oss): a per-head logit `sinks[h]` that joins
//! every row's softmax denominator as a key with no value. Each schedule finishes a row
//! from its running max m and sum l; with sinks it first calls `join_sink`, which moves m
//! to the sink where the sink is larger, adds e^(sink − m) to l and returns the factor
//! e^(m_old − m) by which O's accumulators (taken against the old max) shrink. The LSE
//! then includes the sink, so the backward's P = e^(S − LSE) needs nothing more; the
//! sinks' own gradient is `sink_grad`'s (below). Split-K decode joins the sink in its
//! reduce, once per head, where the slices' maxima meet.

use super::numerics::Helper;
use super::writer::{Fragment, Template, Wgsl};
use crate::spec::KernelSpec;

/// `join_sink(h, &m, &l)`: the sink of head h joined to a row's max and sum.
const JOIN_SINK: Template = Template {
    name: "join_sink",
    needs: &[Helper::Exp],
    text: r#"// The row's max *m and sum *l with head h's sink joined to the denominator; returns
// e^(m_old − m), the factor from accumulators taken against the old max. An empty row
// (m = NEG_BIG, l = 0) ends with m = the sink and l = 1: O = 0, LSE = the sink.
fn join_sink(h: u32, m: ptr<function, f32>, l: ptr<function, f32>) -> f32 {
    let s = sinks[h];
    let m_new = max(*m, s);
    let corr = exp_f32(*m - m_new);
    *l = fma(*l, corr, exp_f32(s - m_new));
    *m = m_new;
    return corr;
}

"#,
};

/// `join_sink`, where the kernel has sinks.
pub(super) fn helpers(out: &mut Wgsl, spec: &KernelSpec) {
    if spec.masks.sinks {
        out.put(JOIN_SINK.plain());
    }
}

/// The call that joins the sink of head `h` to the row state `m`, `l`.
const JOIN: Template = Template {
    name: "join",
    needs: &[],
    text: "let $corr = join_sink($h, &$m, &$l);\n",
};

/// The statement that joins the sink into the row state `m`, `l` of head `h`, binding the
/// accumulators' factor to `corr`; `None` without sinks (the factor is 1).
pub(super) fn join(sinks: bool, h: &str, m: &str, l: &str, corr: &str) -> Option<Fragment> {
    sinks.then(|| {
        let fills = [("corr", corr), ("h", h), ("m", m), ("l", l)];
        JOIN.fill(fills.map(|(hole, fill)| (hole, fill.into())))
    })
}

/// The `sink_grad` kernel's functions and entry point (see [`grad`]).
const SINK_GRAD: Template = Template {
    name: "sink_grad",
    needs: &[Helper::Exp, Helper::TwoSumErr4],
    text: r#"var<workgroup> sh_hi: array<f32, WG>;
var<workgroup> sh_lo: array<f32, WG>;

fn positive_inf() -> f32 {
    var bits = 0x7f800000u;
    return bitcast<f32>(bits);
}

// a + b = s.x + s.y exactly (through `two_sum_err4`, which Mesa cannot fold to 0).
fn two_sum(a: f32, b: f32) -> vec2<f32> {
    let s = a + b;
    return vec2<f32>(s, two_sum_err4(vec4<f32>(a), vec4<f32>(b), vec4<f32>(s)).x);
}

fn opaque(x: f32) -> f32 {
    return opaque4(vec4<f32>(x)).x;
}

// a = hi + lo with 12 significant bits each (Dekker), so that products of halves are exact;
// the steps pass through `opaque`, or c − (c − a) folds to a.
fn split(a: f32) -> vec2<f32> {
    let c = opaque(4097.0 * a);
    let hi = c - opaque(c - a);
    return vec2<f32>(hi, a - hi);
}

// a·b = p.x + p.y exactly, without fma (which lavapipe does not fuse).
fn two_prod(a: f32, b: f32) -> vec2<f32> {
    let p = opaque(a * b);
    let x = split(a);
    let y = split(b);
    return vec2<f32>(p, ((x.x * y.x - p) + x.x * y.y + x.y * y.x) + x.y * y.y);
}

// (s.x + s.y) + (t.x + t.y), renormalized.
fn dd_add(s: vec2<f32>, t: vec2<f32>) -> vec2<f32> {
    let u = two_sum(s.x, t.x);
    return two_sum(u.x, u.y + (s.y + t.y));
}

// Row r of every sequence, head h: its term of dsinks[h], as hi + lo.
fn sink_term(r: u32, h: u32) -> vec2<f32> {
    let at = r * dims.n_heads + h;
    let lse_r = lse[at];
    if (lse_r == positive_inf()) {
        return vec2<f32>(0.0);
    }
    let qi = at * HEAD_DIM;
    var delta = vec2<f32>(0.0);
    for (var d = 0u; d < HEAD_DIM; d = d + 4u) {
        let g = grad_out4_at(qi + d);
        let o4 = out4_at(qi + d);
        for (var c = 0u; c < 4u; c = c + 1u) {
            delta = dd_add(delta, two_prod(g[c], o4[c]));
        }
    }
    let p = -exp_f32(sinks[h] - lse_r);
    return dd_add(two_prod(p, delta.x), vec2<f32>(p * delta.y, 0.0));
}

// The workgroup's double-f32 values summed as a tree; the total in invocation 0.
fn tree_sum(tid: u32, x: vec2<f32>) -> vec2<f32> {
    sh_hi[tid] = x.x;
    sh_lo[tid] = x.y;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (tid < stride) {
            let t = dd_add(vec2<f32>(sh_hi[tid], sh_lo[tid]), vec2<f32>(sh_hi[tid + stride], sh_lo[tid + stride]));
            sh_hi[tid] = t.x;
            sh_lo[tid] = t.y;
        }
        workgroupBarrier();
    }
    return vec2<f32>(sh_hi[0], sh_lo[0]);
}

fn part_index(part: u32, h: u32, blk: u32) -> u32 {
    return (part * dims.n_heads + h) * dims.n_slices + blk;
}

@compute @workgroup_size(WG)
fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let h = wg.x;
    if (dims.sink_pass == 0u) {
        let r = wg.y * WG + tid;
        var term = vec2<f32>(0.0);
        if (r < dims.batch * dims.seq_len) {
            term = sink_term(r, h);
        }
        let total = tree_sum(tid, term);
        if (tid == 0u) {
            dsinks_part[part_index(0u, h, wg.y)] = total.x;
            dsinks_part[part_index(1u, h, wg.y)] = total.y;
        }
        return;
    }
    var total = vec2<f32>(0.0);
    for (var blk = tid; blk < dims.n_slices; blk = blk + WG) {
        total = dd_add(total, vec2<f32>(dsinks_part[part_index(0u, h, blk)], dsinks_part[part_index(1u, h, blk)]));
    }
    let sum = tree_sum(tid, total);
    if (tid == 0u) {
        let t = dd_add(vec2<f32>(dsinks[h], 0.0), sum);
        dsinks[h] = t.x + t.y;
    }
}
"#,
};

/// The `sink_grad` kernel: dsinks[h] += −Σ e^(sinks[h] − LSE)·D over every sequence and
/// row, D = dO·O (the gradient of the sink logit: it has no value, so dP_sink = 0 and
/// dS_sink = P_sink·(0 − D)). D and the sums are kept as double-f32 (hi + lo, Dekker's
/// exact products and Knuth's two-sum): a head's few values average no rounding out, so
/// the f32 sums a framework does (and the schedules' D in `stats`) would leave it no more
/// accurate than that framework, and the rule asks for half its error. Two dispatches, so
/// that every SM takes part and nothing is added by atomics: pass 0, a workgroup per (head,
/// block of WG rows) writes its block's sum to `dsinks_part`; pass 1, a workgroup per head
/// sums its blocks in a fixed order. A row whose LSE is +inf (none visible, no sink) adds
/// nothing.
pub(super) fn grad(out: &mut Wgsl, spec: &KernelSpec) {
    super::dtype::loads(out, spec, &[("out_at", "o"), ("grad_out_at", "d_o")]);
    out.put(SINK_GRAD.fill([("name", spec.name.as_str().into())]));
}
