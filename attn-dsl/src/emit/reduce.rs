//! Workgroup-wide reductions through workgroup memory: portable to every target, and the
//! same result in every invocation.

use super::writer::{Fragment, Template, Wgsl};

/// `wg_reduce_max` and `wg_reduce_sum`, with the workgroup memory they use.
pub(super) fn reductions(out: &mut Wgsl) {
    out.push_str("var<workgroup> sh_red: array<f32, WG>;\n\n");
    for (name, op) in [("max", "max(a, b)"), ("sum", "a + b")] {
        out.put(REDUCE.fill([
            ("name", Fragment::from(name)),
            ("combine", Fragment::from(op)),
        ]));
    }
}

const REDUCE: Template = Template {
    name: "reduce",
    needs: &[],
    text: r#"fn combine_$name(a: f32, b: f32) -> f32 {
    return $combine;
}

fn wg_reduce_$name(tid: u32, x: f32) -> f32 {
    sh_red[tid] = x;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (tid < stride) {
            sh_red[tid] = combine_$name(sh_red[tid], sh_red[tid + stride]);
        }
        workgroupBarrier();
    }
    let r = sh_red[0];
    workgroupBarrier();
    return r;
}

"#,
};
