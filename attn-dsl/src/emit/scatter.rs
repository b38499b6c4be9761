//! Atomic scatter: many workgroups add into one output. Each workgroup adds a partial sum
//! over its tile's rows once per block, not one product at a time: fewer atomics, and
//! fewer roundings in the running sum. (Compensating the adds, with TwoSum on the value
//! the atomic returns, was tried: a returning atomic waits on memory, and the flash
//! backward ran 25% slower on an H100, for accuracy the rule did not need.)

use super::numerics::Helper;
use super::writer::{Fragment, Template, Wgsl};

use crate::spec::{KernelSpec, Scatter};

/// `add_<t>(i, x, lane)` for compensated sums in lanes, `t` = [lanes, 2, len] (each lane a
/// sum and its errors; `len` = the WGSL expression `len`, the lane count what the binding
/// holds): `x` (a value and the rounding errors it carries) added to lane `lane % lanes`
/// by atomics, the value to the sum and the add's rounding error (TwoSum on the value the
/// atomic returns) with the carried errors to its errors; a fold adds every lane to the
/// gradient in the end. For a gradient of many terms per element in whatever order the
/// workgroups run (a modifier tensor's): each sum carries about double f32 precision, far
/// inside the error of a pairwise f32 sum, and the lanes spread the atomics of one element
/// (a T5 table's diagonal: every pair at one distance) over as many addresses.
pub(super) fn compensated_add(out: &mut Wgsl, spec: &KernelSpec, t: &str, len: &str) {
    out.put(match spec.scatter {
        Scatter::F32Atomic => FETCH_ADD.fill([("t", Fragment::from(t))]),
        Scatter::Cas => cas_add(&format!("fetch_add_{t}"), t, true),
    });
    out.put(COMPENSATED_ADD.fill([("t", Fragment::from(t)), ("len", Fragment::from(len))]));
}

/// `fetch_add_$t(i, x)`: `$t[i] += x` by a native f32 atomic, returning the value added to.
const FETCH_ADD: Template = Template {
    name: "fetch_add",
    needs: &[],
    text: r#"fn fetch_add_$t(i: u32, x: f32) -> f32 {
    return atomicAdd(&$t[i], x);
}

"#,
};

/// `add_$t(i, x, lane)` of [`compensated_add`], over `fetch_add_$t`.
const COMPENSATED_ADD: Template = Template {
    name: "compensated_add",
    needs: &[Helper::TwoSumErr4],
    text: r#"fn add_$t(i: u32, x: vec2<f32>, lane: u32) {
    let len = $len;
    let at = lane % (arrayLength(&$t) / (2u * len)) * 2u * len + i;
    let old = fetch_add_$t(at, x.x);
    let e = two_sum_err4(vec4<f32>(old), vec4<f32>(x.x), vec4<f32>(old + x.x)).x;
    fetch_add_$t(at + len, e + x.y);
}

"#,
};

/// `add_<t>(i, x)`: `t[i] += x` from many workgroups at once, by `spec`'s scatter (native
/// f32 atomics, or a compare-exchange loop on the f32 bits).
pub(super) fn atomic_add(out: &mut Wgsl, spec: &KernelSpec, t: &str) {
    out.put(match spec.scatter {
        Scatter::F32Atomic => ATOMIC_ADD.fill([("t", Fragment::from(t))]),
        Scatter::Cas => cas_add(&format!("add_{t}"), t, false),
    });
}

/// `add_$t(i, x)` by a native f32 atomic.
const ATOMIC_ADD: Template = Template {
    name: "atomic_add",
    needs: &[],
    text: r#"fn add_$t(i: u32, x: f32) {
    atomicAdd(&$t[i], x);
}

"#,
};

/// `function(i, x)`: `t[i] += x` on u32 words holding f32 bits, by a compare-exchange
/// loop; returning the value added to where `returns`.
fn cas_add(function: &str, t: &str, returns: bool) -> Fragment {
    let (ty, ret) = match returns {
        true => (" -> f32", "return bitcast<f32>(old);"),
        false => ("", ""),
    };
    CAS_ADD.fill([
        ("function", Fragment::from(function)),
        ("t", Fragment::from(t)),
        ("ty", Fragment::from(ty)),
        ("ret", Fragment::from(ret)),
    ])
}

/// `$function(i, x)$ty`: `$t[i] += x` on u32 words by a compare-exchange loop (for
/// adapters without f32 atomics), `$ret` the return of the value added to, or nothing.
const CAS_ADD: Template = Template {
    name: "cas_add",
    needs: &[],
    text: r#"// f32 add on u32 words: retry until no other invocation changed the word between
// our load and our exchange.
fn $function(i: u32, x: f32)$ty {
    var old = atomicLoad(&$t[i]);
    loop {
        let r = atomicCompareExchangeWeak(&$t[i], old, bitcast<u32>(bitcast<f32>(old) + x));
        if (r.exchanged) {
            break;
        }
        old = r.old_value;
    }
    $ret
}

"#,
};
