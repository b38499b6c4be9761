//! `op: merge`: attention states of the same queries merged into one. An invocation per
//! vec4 of a query's output walks the parts in order with [`super::states::STATES`]; a part
//! whose LSE is not finite (no key: the forward's +inf, or −inf) weighs nothing, and a
//! sink joins once at the end, as a part of max `sinks[h]`, sum 1 and no value.

use super::states::STATES;
use super::writer::{Fragment, Template, Wgsl, uint};
use crate::spec::KernelSpec;

pub(super) fn constants(out: &mut Wgsl, spec: &KernelSpec) {
    out.put(CONSTANTS.fill([("wg", uint(spec.workgroup_size))]));
}

/// The workgroup, and the score no key has.
const CONSTANTS: Template = Template {
    name: "merge_constants",
    needs: &[],
    text: r#"const WG: u32 = $wg;
// A finite stand-in for -inf: exp(NEG_BIG - m) is 0 for any real m.
const NEG_BIG: f32 = -3.0e38;

"#,
};

pub(super) fn body(out: &mut Wgsl, spec: &KernelSpec) {
    super::dtype::vec4_codec(out, spec.dtype);
    out.put(STATES.plain());
    let sink = match spec.masks.sinks {
        true => "s = merge_state(s, sinks[q % dims.n_heads], 1.0, vec4<f32>(0.0));",
        false => "",
    };
    out.put(MERGE.fill([
        ("name", Fragment::from(spec.name.as_str())),
        ("sink", Fragment::from(sink)),
    ]));
}

const MERGE: Template = Template {
    name: "merge",
    needs: &[super::numerics::Helper::Lse],
    text: r#"@compute @workgroup_size(WG)
fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    // Not a constant expression: WGSL rejects non-finite constants.
    var inf_bits = 0x7f800000u;
    let v4 = dims.head_dim / 4u;
    let n = dims.queries * v4;
    for (var i = wg.x * WG + tid; i < n; i = i + groups.x * WG) {
        // Query q (row · n_heads + head), vec4 column c of its output.
        let q = i / v4;
        let c = i % v4;
        var s = state_empty();
        for (var p = 0u; p < dims.parts; p = p + 1u) {
            let part_lse = lse_parts[p * dims.queries + q];
            // An infinite LSE is a part with no key; a NaN joins, and shows.
            if ((bitcast<u32>(part_lse) & 0x7fffffffu) != 0x7f800000u) {
                let x = widen4(o_parts[(p * dims.queries + q) * v4 + c]);
                s = merge_state(s, part_lse, 1.0, x);
            }
        }
        $sink
        // No key in any part (and no sink): O = 0 and LSE = +inf, as the forward stores.
        var result = vec4<f32>(0.0);
        var merged = bitcast<f32>(inf_bits);
        if (s.l != 0.0) {
            result = s.acc / s.l;
            merged = lse_f32(s.m, s.l);
        }
        o[i] = narrow4(result);
        if (c == 0u) {
            lse[q] = merged;
        }
    }
}
"#,
};
