//! Workgroup-wide reductions through workgroup memory: portable to every target, and the
//! same result in every invocation.

/// `wg_reduce_max` and `wg_reduce_sum`, with the workgroup memory they use.
pub(super) fn reductions(out: &mut String) {
    out.push_str("var<workgroup> sh_red: array<f32, WG>;\n\n");
    for (name, op) in [("max", "max(a, b)"), ("sum", "a + b")] {
        out.push_str(&REDUCE.replace("NAME", name).replace("COMBINE", op));
    }
}

const REDUCE: &str = r#"fn combine_NAME(a: f32, b: f32) -> f32 {
    return COMBINE;
}

fn wg_reduce_NAME(tid: u32, x: f32) -> f32 {
    sh_red[tid] = x;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (tid < stride) {
            sh_red[tid] = combine_NAME(sh_red[tid], sh_red[tid + stride]);
        }
        workgroupBarrier();
    }
    let r = sh_red[0];
    workgroupBarrier();
    return r;
}

"#;
