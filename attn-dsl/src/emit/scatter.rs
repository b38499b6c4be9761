//! Atomic scatter: many workgroups add into one output. The adds are compensated: each
//! add's rounding error, exact by TwoSum from the value the atomic replaced, is added into
//! a second half of the binding (the [`Axis::Carry`] part), so that the value (the sum of
//! the halves) carries the error of the partial sums alone, however many workgroups add
//! and in whatever order they arrive.

use std::fmt::Write;

use crate::signature;
use crate::spec::{Axis, KernelSpec, Scatter};

/// The WGSL extent of an index axis, from the constants and the run-time dims.
fn extent(axis: Axis) -> &'static str {
    match axis {
        Axis::S | Axis::J => "dims.seq_len",
        Axis::H => "dims.n_heads",
        Axis::KvH => "dims.n_kv_heads",
        Axis::D => "HEAD_DIM",
        Axis::Part | Axis::Carry => "2u",
    }
}

/// `add_<t>(i, x)`: `t[i] += x` from many workgroups at once, compensated, by `spec`'s
/// scatter (native f32 atomics, or a compare-exchange loop on the f32 bits).
pub(super) fn atomic_add(out: &mut String, spec: &KernelSpec, t: &str) {
    let layout = signature::all_tensors(spec.op)
        .iter()
        .find(|x| x.name == t)
        .map_or(&[][..], |x| x.layout);
    let elems: Vec<&str> = layout.iter().map(|a| extent(*a)).collect();
    let _ = write!(
        out,
        "// Where `{t}` keeps the rounding errors of its adds: after its {} elements.\n\
         fn carry_{t}() -> u32 {{\n    return {};\n}}\n\n",
        layout
            .iter()
            .map(|a| a.name())
            .collect::<Vec<_>>()
            .join(" × "),
        elems.join(" * ")
    );
    match spec.scatter {
        Scatter::F32Atomic => {
            let _ = write!(
                out,
                r#"fn add_{t}(i: u32, x: f32) {{
    let old = atomicAdd(&{t}[i], x);
    let err = two_sum_err(old, x, old + x);
    if (err != 0.0) {{
        atomicAdd(&{t}[carry_{t}() + i], err);
    }}
}}

"#
            );
        }
        Scatter::Cas => {
            let _ = write!(
                out,
                r#"// f32 add on u32 words: retry until no other invocation changed the word between
// our load and our exchange. Returns the value the add replaced.
fn cas_add_{t}(i: u32, x: f32) -> f32 {{
    var old = atomicLoad(&{t}[i]);
    loop {{
        let r = atomicCompareExchangeWeak(&{t}[i], old, bitcast<u32>(bitcast<f32>(old) + x));
        if (r.exchanged) {{
            break;
        }}
        old = r.old_value;
    }}
    return bitcast<f32>(old);
}}

fn add_{t}(i: u32, x: f32) {{
    let old = cas_add_{t}(i, x);
    let err = two_sum_err(old, x, old + x);
    if (err != 0.0) {{
        cas_add_{t}(carry_{t}() + i, err);
    }}
}}

"#
            );
        }
    }
}
