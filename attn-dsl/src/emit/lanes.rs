//! Element-wise kernels over vec4s, in grid-stride loops. The streaming backward's lanes
//! of dK and dV summed into the gradients (`dkv_reduce`):
//! `dkv` holds, for each of `DKV_LANES` lanes, dK then dV (each at its own width), and each
//! invocation adds one vec4 of every lane, pairwise in a fixed order, to dK or dV. One
//! owner per element and one order: the sum is the same on every run. And conversions
//! between f32 and the kernel's dtype (`to_dtype`, `from_dtype`), and each row's largest
//! magnitude (`row_scale`).

use super::numerics::Helper;
use super::writer::{Fragment, Template, Wgsl, uint};

use crate::spec::KernelSpec;

pub(super) fn constants(out: &mut Wgsl, spec: &KernelSpec) {
    out.put(CONSTANTS.fill([
        ("wg", uint(spec.workgroup_size)),
        ("lanes", uint(crate::DKV_LANES)),
    ]));
}

/// The workgroup's size and the streaming backward's lanes of dK and dV.
const CONSTANTS: Template = Template {
    name: "lanes_constants",
    needs: &[],
    text: r#"const WG: u32 = $wg;
const LANES: u32 = $lanes;

"#,
};

/// `lane(l, part)` for lanes `lo..hi`, summed pairwise.
fn tree(lo: u32, hi: u32) -> String {
    match hi - lo {
        1 => format!("lane({lo}u, part, i)"),
        n => {
            let mid = lo + n / 2;
            format!("({} + {})", tree(lo, mid), tree(mid, hi))
        }
    }
}

pub(super) fn reduce(out: &mut Wgsl, spec: &KernelSpec) {
    out.put(DKV_REDUCE.fill([
        ("sum", Fragment::from(tree(0, crate::DKV_LANES))),
        ("name", Fragment::from(spec.name.as_str())),
    ]));
}

/// `dkv_reduce`: each invocation adds its vec4 of every lane, summed by `$sum` (pairwise,
/// in one order), to dK and to dV.
const DKV_REDUCE: Template = Template {
    name: "dkv_reduce",
    needs: &[],
    text: r#"// vec4 i of part `part` (0: dK, len4 vec4s; 1: dV, len4_v) of lane l.
fn lane(l: u32, part: u32, i: u32) -> vec4<f32> {
    return dkv[l * (dims.len4 + dims.len4_v) + part * dims.len4 + i];
}

fn lanes_of(part: u32, i: u32) -> vec4<f32> {
    return $sum;
}

@compute @workgroup_size(WG)
fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    // dK and dV differ in length where V's rows are narrower or wider than K's.
    let n = max(dims.len4, dims.len4_v);
    for (var i = wg.x * WG + tid; i < n; i = i + groups.x * WG) {
        if (i < dims.len4) {
            dk[i] = dk[i] + lanes_of(0u, i);
        }
        if (i < dims.len4_v) {
            dv[i] = dv[i] + lanes_of(1u, i);
        }
    }
}
"#,
};

/// `grad_fold`: `parts` stacked rows of `len` values (a backward's compensated sums in
/// lanes, `[lanes, 2, len]`: each lane's sum, then its errors; or partial sums made
/// elsewhere, one per device) added into the gradient, one element per step of a
/// grid-stride loop; the parts joined in order with TwoSum, so the total keeps double-f32
/// precision until the one rounding into the gradient.
pub(super) fn fold(out: &mut Wgsl, spec: &KernelSpec) {
    out.put(GRAD_FOLD.fill([("name", Fragment::from(spec.name.as_str()))]));
}

/// [`fold`]'s entry: each element's parts joined in order, their rounding errors summed
/// beside them and added once at the end.
const GRAD_FOLD: Template = Template {
    name: "grad_fold",
    needs: &[Helper::TwoSumErr4],
    text: r#"@compute @workgroup_size(WG)
fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    for (var i = wg.x * WG + tid; i < dims.len; i = i + groups.x * WG) {
        var s = grad[i];
        var c = 0.0;
        for (var at = i; at < dims.parts * dims.len; at = at + dims.len) {
            let t = s + pair[at];
            c = c + two_sum_err4(vec4<f32>(s), vec4<f32>(pair[at]), vec4<f32>(t)).x;
            s = t;
        }
        grad[i] = s + c;
    }
}
"#,
};

/// `to_dtype` and `from_dtype`: one vec4 per step of a grid-stride loop, through the
/// dtype's codec (rounding to nearest even on the way in).
pub(super) fn convert(out: &mut Wgsl, spec: &KernelSpec, to_dtype: bool) {
    super::dtype::vec4_codec(out, spec.dtype);
    let body = match to_dtype {
        true => "dst[i] = narrow4(src[i]);",
        false => "dst[i] = widen4(src[i]);",
    };
    out.put(CONVERT.fill([
        ("name", Fragment::from(spec.name.as_str())),
        ("body", Fragment::from(body)),
    ]));
}

/// [`convert`]'s entry: `$body` converts vec4 i.
const CONVERT: Template = Template {
    name: "convert",
    needs: &[],
    text: r#"@compute @workgroup_size(WG)
fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    for (var i = wg.x * WG + tid; i < dims.len4; i = i + groups.x * WG) {
        $body
    }
}
"#,
};

/// `row_scale`: each row's largest magnitude, as f32 bits (monotone for non-negative
/// floats), ROW_LANES invocations per row in a grid-stride loop over blocks of rows: what
/// the bf16 tensor-core kernels scale each row of their operands by (see `coop_scale`).
pub(super) fn row_scale(out: &mut Wgsl, spec: &KernelSpec) {
    super::dtype::vec4_codec(out, spec.dtype);
    // (Fewer where the workgroup is not a multiple of them: each row's lanes in one.)
    let lanes = crate::layout::ROW_SCALE_LANES.min(1 << spec.workgroup_size.trailing_zeros());
    out.put(ROW_SCALE.fill([
        ("lanes", uint(lanes)),
        ("name", Fragment::from(spec.name.as_str())),
    ]));
}

/// [`row_scale`]'s entry: each lane's largest magnitude over its strided columns, then
/// the row's first lane takes the largest of its lanes' through workgroup memory.
const ROW_SCALE: Template = Template {
    name: "row_scale",
    needs: &[],
    text: r#"const ROW_LANES: u32 = $lanes;

var<workgroup> sh_m: array<f32, WG>;

@compute @workgroup_size(WG)
fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let per = WG / ROW_LANES;
    let lane = tid % ROW_LANES;
    for (var r0 = wg.x * per; r0 < dims.rows; r0 = r0 + groups.x * per) {
        let row = r0 + tid / ROW_LANES;
        var m = vec4<f32>(0.0);
        if (row < dims.rows) {
            for (var c = lane; c < dims.width4; c = c + ROW_LANES) {
                m = max(m, abs(widen4(src[row * dims.width4 + c])));
            }
        }
        sh_m[tid] = max(max(m.x, m.y), max(m.z, m.w));
        workgroupBarrier();
        if (lane == 0u && row < dims.rows) {
            var x = sh_m[tid];
            for (var i = 1u; i < ROW_LANES; i = i + 1u) {
                x = max(x, sh_m[tid + i]);
            }
            dst[dims.at + row] = bitcast<u32>(x);
        }
        workgroupBarrier();
    }
}
"#,
};
