//! The kernels a description implies beyond itself: a forward's backward (the prep pass and
//! each schedule's two halves, with the forward's masks and modifiers, the dQ halves
//! writing dBias and the modifiers' gradients) and a split-K decode's reduce. The runtime
//! builds its backward from these, and the macro compiles them under the description's
//! target, so that a target that cannot hold one is refused at expansion, not when a
//! backward is first recorded.

use crate::spec::{KernelSpec, Masks, Op, Source, WriteMode};

/// The kernels `spec` implies (none for ops without a companion), named for what they
/// are, under `spec`'s target.
pub fn kernels(spec: &KernelSpec) -> Vec<KernelSpec> {
    let with_target = |k: KernelSpec| KernelSpec {
        target: spec.target,
        ..k
    };
    let dims = (spec.head_dim, spec.v_dim());
    match spec.op {
        Op::Forward => backward(dims, spec.masks)
            .into_iter()
            .map(with_target)
            .collect(),
        Op::DecodeSplit => vec![with_target(decode_reduce(spec))],
        _ => Vec::new(),
    }
}

/// The backward of attention `dims` wide (Q and K rows, then V, O and dO rows) under
/// `masks`, WebGPU's target: the prep, then the split schedule's halves (dQ flushing P and
/// dS, then dK and dV from them) and the recompute schedule's.
pub fn backward((head_dim, head_dim_v): (u32, u32), masks: Masks) -> [KernelSpec; 5] {
    use WriteMode::{Owned, ScratchFlush};
    let half = |name: &str, op, writes: &[(&str, WriteMode)], source| {
        KernelSpec {
            writes: writes
                .iter()
                .map(|(n, m)| (n.to_string(), *m))
                .chain(
                    masks
                        .score_grad_writes()
                        .into_iter()
                        .filter(|_| op == Op::BackwardQ),
                )
                .collect(),
            source,
            ..KernelSpec::standard(name, op, head_dim, masks)
        }
        .with_head_dim_v(head_dim_v)
    };
    let prep = KernelSpec {
        workgroup_size: head_dim.max(head_dim_v).next_power_of_two().max(32),
        ..KernelSpec::standard(
            "attention_backward_prep",
            Op::BackwardPrep,
            head_dim,
            Masks::default(),
        )
    }
    .with_head_dim_v(head_dim_v);
    let (bq, bkv) = (Op::BackwardQ, Op::BackwardKv);
    let (rec, scr) = (Source::Recompute, Source::Scratch);
    let scratch = [("dq", Owned), ("p_ds", ScratchFlush)];
    let owned_kv = [("dk", Owned), ("dv", Owned)];
    [
        prep,
        half("attention_backward_short", bq, &scratch, rec),
        half("attention_backward_short_dkdv", bkv, &owned_kv, scr),
        half("attention_backward_dq", bq, &[("dq", Owned)], rec),
        half("attention_backward_dkdv", bkv, &owned_kv, rec),
    ]
}

/// The reduce of a split pass: its partials merged into O, the sinks joined there.
fn decode_reduce(split: &KernelSpec) -> KernelSpec {
    let masks = Masks {
        sinks: split.masks.sinks,
        ..Masks::default()
    };
    KernelSpec {
        source: Source::Scratch,
        dtype: split.dtype,
        ..KernelSpec::standard(
            "attention_decode_reduce",
            Op::DecodeReduce,
            split.head_dim,
            masks,
        )
    }
    .with_head_dim_v(split.v_dim())
}
