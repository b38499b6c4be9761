//! Element-wise kernels over vec4s, in grid-stride loops. The streaming backward's lanes
//! of dK and dV summed into the gradients (`dkv_reduce`):
//! `dkv` holds, for each of `DKV_LANES` lanes, dK then dV (each at its own width), and each
//! invocation adds one vec4 of every lane, pairwise in a fixed order, to dK or dV. One
//! owner per element and one order: the sum is the same on every run. And conversions
//! between f32 and the kernel's dtype (`to_dtype`, `from_dtype`), and each row's largest
//! magnitude (`row_scale`).

use super::writer::Wgsl;
use std::fmt::Write;

use crate::spec::KernelSpec;

pub(super) fn constants(out: &mut Wgsl, spec: &KernelSpec) {
    let _ = write!(
        out,
        "const WG: u32 = {}u;\nconst LANES: u32 = {}u;\n\n",
        spec.workgroup_size,
        crate::DKV_LANES
    );
}

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
    let _ = write!(
        out,
        r#"// vec4 i of part `part` (0: dK, len4 vec4s; 1: dV, len4_v) of lane l.
fn lane(l: u32, part: u32, i: u32) -> vec4<f32> {{
    return dkv[l * (dims.len4 + dims.len4_v) + part * dims.len4 + i];
}}

fn lanes_of(part: u32, i: u32) -> vec4<f32> {{
    return {sum};
}}

@compute @workgroup_size(WG)
fn {name}(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>, @builtin(local_invocation_index) tid: u32) {{
    // dK and dV differ in length where V's rows are narrower or wider than K's.
    let n = max(dims.len4, dims.len4_v);
    for (var i = wg.x * WG + tid; i < n; i = i + groups.x * WG) {{
        if (i < dims.len4) {{
            dk[i] = dk[i] + lanes_of(0u, i);
        }}
        if (i < dims.len4_v) {{
            dv[i] = dv[i] + lanes_of(1u, i);
        }}
    }}
}}
"#,
        sum = tree(0, crate::DKV_LANES),
        name = spec.name
    );
}

/// `grad_fold`: `parts` stacked rows of `len` values (a backward's compensated sums in
/// lanes, `[lanes, 2, len]`: each lane's sum, then its errors; or partial sums made
/// elsewhere, one per device) added into the gradient, one element per step of a
/// grid-stride loop; the parts joined in order with TwoSum, so the total keeps double-f32
/// precision until the one rounding into the gradient.
pub(super) fn fold(out: &mut Wgsl, spec: &KernelSpec) {
    out.need(&[super::numerics::Helper::TwoSumErr4]);
    let _ = write!(
        out,
        r#"@compute @workgroup_size(WG)
fn {name}(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>, @builtin(local_invocation_index) tid: u32) {{
    for (var i = wg.x * WG + tid; i < dims.len; i = i + groups.x * WG) {{
        var s = grad[i];
        var c = 0.0;
        for (var at = i; at < dims.parts * dims.len; at = at + dims.len) {{
            let t = s + pair[at];
            c = c + two_sum_err4(vec4<f32>(s), vec4<f32>(pair[at]), vec4<f32>(t)).x;
            s = t;
        }}
        grad[i] = s + c;
    }}
}}
"#,
        name = spec.name
    );
}

/// `to_dtype` and `from_dtype`: one vec4 per step of a grid-stride loop, through the
/// dtype's codec (rounding to nearest even on the way in).
pub(super) fn convert(out: &mut Wgsl, spec: &KernelSpec, to_dtype: bool) {
    super::dtype::vec4_codec(out, spec.dtype);
    let body = match to_dtype {
        true => "dst[i] = narrow4(src[i]);",
        false => "dst[i] = widen4(src[i]);",
    };
    let _ = write!(
        out,
        r#"@compute @workgroup_size(WG)
fn {name}(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>, @builtin(local_invocation_index) tid: u32) {{
    for (var i = wg.x * WG + tid; i < dims.len4; i = i + groups.x * WG) {{
        {body}
    }}
}}
"#,
        name = spec.name
    );
}

/// `row_scale`: each row's largest magnitude, as f32 bits (monotone for non-negative
/// floats), ROW_LANES invocations per row in a grid-stride loop over blocks of rows: what
/// the bf16 tensor-core kernels scale each row of their operands by (see `coop_scale`).
pub(super) fn row_scale(out: &mut Wgsl, spec: &KernelSpec) {
    super::dtype::vec4_codec(out, spec.dtype);
    let _ = write!(
        out,
        r#"const ROW_LANES: u32 = {lanes}u;

var<workgroup> sh_m: array<f32, WG>;

@compute @workgroup_size(WG)
fn {name}(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>, @builtin(local_invocation_index) tid: u32) {{
    let per = WG / ROW_LANES;
    let lane = tid % ROW_LANES;
    for (var r0 = wg.x * per; r0 < dims.rows; r0 = r0 + groups.x * per) {{
        let row = r0 + tid / ROW_LANES;
        var m = vec4<f32>(0.0);
        if (row < dims.rows) {{
            for (var c = lane; c < dims.width4; c = c + ROW_LANES) {{
                m = max(m, abs(widen4(src[row * dims.width4 + c])));
            }}
        }}
        sh_m[tid] = max(max(m.x, m.y), max(m.z, m.w));
        workgroupBarrier();
        if (lane == 0u && row < dims.rows) {{
            var x = sh_m[tid];
            for (var i = 1u; i < ROW_LANES; i = i + 1u) {{
                x = max(x, sh_m[tid + i]);
            }}
            dst[dims.at + row] = bitcast<u32>(x);
        }}
        workgroupBarrier();
    }}
}}
"#,
        name = spec.name,
        // (Fewer where the workgroup is not a multiple of them: each row's lanes in one.)
        lanes = crate::layout::ROW_SCALE_LANES.min(1 << spec.workgroup_size.trailing_zeros()),
    );
}
