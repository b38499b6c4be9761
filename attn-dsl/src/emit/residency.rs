//! An instrument for the entry points of the flash and tensor-core kernels
//! ([`KernelSpec::counts_residency`]): each workgroup's first invocation counts it into
//! `resident` (word 0) as it starts, keeps the most in flight at once (word 1), and counts
//! it out as it ends. The GPU starts workgroups as fast as it has room for them, so over a
//! grid of several waves word 1 is how many it holds at once: `bench --only phases`'s
//! residency of a configuration.

use super::writer::{Fragment, Template};
use crate::spec::KernelSpec;

/// The count as a workgroup starts; nothing where `spec` does not count.
pub(super) fn enter(spec: &KernelSpec) -> Fragment {
    counted(spec, &ENTER)
}

/// The count as a workgroup ends (after its flush); nothing where `spec` does not count.
pub(super) fn leave(spec: &KernelSpec) -> Fragment {
    counted(spec, &LEAVE)
}

fn counted(spec: &KernelSpec, t: &Template) -> Fragment {
    match spec.counts_residency {
        true => t.plain(),
        false => Fragment::default(),
    }
}

const ENTER: Template = Template {
    name: "resident_enter",
    needs: &[],
    text: r#"if (tid == 0u) {
    let n = atomicAdd(&resident[0], 1u) + 1u;
    atomicMax(&resident[1], n);
}
"#,
};

const LEAVE: Template = Template {
    name: "resident_leave",
    needs: &[],
    text: r#"if (tid == 0u) {
    atomicSub(&resident[0], 1u);
}
"#,
};

#[cfg(test)]
mod tests {
    /// A kernel built to count its workgroups in flight binds `resident` after every other
    /// binding and counts each workgroup in and out of it; the kernel built plainly has
    /// neither, whatever else is the same. Both halves of the backward count alike, on
    /// tensor cores and in a scalar flash configuration.
    #[test]
    fn a_counted_kernel_binds_resident_last_and_counts_in_and_out() {
        let coop = crate::configs::coop_forward(128, crate::configs::CANDIDATE_WORKGROUP_BYTES)[0];
        let scalar = crate::FlashConfig::from_label("16x32/4@64").expect("a scalar config");
        let ops = [
            crate::Op::Forward,
            crate::Op::BackwardQ,
            crate::Op::BackwardKv,
        ];
        for (op, config) in ops.into_iter().flat_map(|op| [(op, coop), (op, scalar)]) {
            let plain = crate::KernelSpec {
                dtype: crate::Dtype::F16,
                ..crate::KernelSpec::flash(
                    "counted",
                    op,
                    128,
                    crate::Masks::new(true, false),
                    config,
                )
            };
            let mut counted = crate::KernelSpec {
                counts_residency: true,
                ..plain.clone()
            };
            // One more storage buffer than WebGPU's 8 in the backward: a native target.
            counted.fit_target();
            let (a, b) = (crate::compile(&plain), crate::compile(&counted));
            let (a, b) = (a.unwrap(), b.unwrap_or_else(|e| panic!("{op:?}: {e}")));
            assert!(a.binding("resident").is_none() && !a.wgsl.contains("resident"));
            assert_eq!(
                b.bindings.last().map(|b| &*b.name),
                Some("resident"),
                "{op:?}"
            );
            assert_eq!(b.bindings.len(), a.bindings.len() + 1);
            assert!(b.wgsl.contains("atomicAdd(&resident[0], 1u)"));
            assert!(b.wgsl.contains("atomicSub(&resident[0], 1u)"));
        }
    }
}
