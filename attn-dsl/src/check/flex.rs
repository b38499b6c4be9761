//! The user-written modifiers against the op: only ops that pair queries with keys take
//! them; their tensors must be storable and named apart from the op's own bindings; the
//! expressions must type (the macro has already said where, for what it parsed).

use crate::error::{DslError, Field};
use crate::flex::typing::{Scope, type_of};
use crate::flex::{Flex, TensorDecl, Ty, derive, variables};
use crate::signature;
use crate::spec::Op;

pub(super) fn check(op: Op, flex: &Flex) -> Result<(), DslError> {
    let field = match (&flex.score_mod, &flex.mask_mod) {
        (Some(_), _) => Field::Flex("score_mod"),
        (None, Some(_)) => Field::Flex("mask_mod"),
        (None, None) => Field::Flex("tensors"),
    };
    // The reduce merges the split pass's records, which already hold the modifiers'
    // effect: it takes the pair's description and reads none of it (its scratch contract
    // then matches the split's).
    if op == Op::DecodeReduce {
        return Ok(());
    }
    if !op.takes_modifiers() {
        return Err(DslError::spec(
            field,
            format!(
                "op {} takes no score_mod, mask_mod or tensors: only forward, extend, decode, \
                 decode_split (with its decode_reduce), backward_q and backward_kv compare \
                 queries with keys, and block_mask evaluates a mask_mod",
                op.name()
            ),
        ));
    }
    if op == Op::BlockMask && flex.mask_mod.is_none() {
        return Err(DslError::spec(
            field,
            "op block_mask evaluates a mask_mod, and this description has none: give it the \
             mask_mod of the kernels that read the block mask"
                .to_string(),
        ));
    }
    for (n, t) in flex.tensors.iter().enumerate() {
        check_tensor(op, t, &flex.tensors[..n])?;
    }
    let typed = |e: &crate::flex::Expr, score: bool, want: Ty, key: &'static str| {
        let err = |m: String| DslError::spec(Field::Flex(key), m);
        let got =
            type_of(e, &mut Scope::modifier(score, &flex.tensors)).map_err(|e| err(e.message))?;
        if got != want {
            return Err(err(format!(
                "this modifier returns {}, not {}",
                got.name(),
                want.name()
            )));
        }
        Ok(())
    };
    if let Some(e) = &flex.score_mod {
        typed(e, true, Ty::F32, "score_mod")?;
        derive::d_score(e).map_err(|e| DslError::spec(Field::Flex("score_mod"), e.message))?;
    }
    for t in flex.tensors.iter().filter(|t| t.grad) {
        check_grad(flex, t)?;
    }
    if let Some(e) = &flex.mask_mod {
        typed(e, false, Ty::Bool, "mask_mod")?;
    }
    Ok(())
}

/// A tensor declared `grad`: an f32 table the score modifier reads where the chain rule
/// reaches it.
fn check_grad(flex: &Flex, t: &TensorDecl) -> Result<(), DslError> {
    let err = |m: String| Err(DslError::spec(Field::Flex("tensors"), m));
    if t.ty != Ty::F32 {
        return err(format!(
            "tensor `{}` is {} and declared `grad`: only an f32 tensor has a gradient",
            t.name,
            t.ty.name()
        ));
    }
    let reads = match &flex.score_mod {
        Some(e) => derive::d_tensor(e, &t.name)
            .map_err(|e| DslError::spec(Field::Flex("score_mod"), e.message))?,
        None => Vec::new(),
    };
    if reads.is_empty() {
        return err(format!(
            "tensor `{}` is declared `grad`, but score_mod does not read it: a gradient \
             reaches only what the score depends on; drop `grad`",
            t.name
        ));
    }
    Ok(())
}

fn check_tensor(op: Op, t: &TensorDecl, before: &[TensorDecl]) -> Result<(), DslError> {
    let err = |m: String| Err(DslError::spec(Field::Flex("tensors"), m));
    if !TensorDecl::declarable(t.ty) {
        return err(format!(
            "tensor `{}` is {}: declare it f32 or u32 (read a u32 `as i32` where a signed \
             value is needed)",
            t.name,
            t.ty.name()
        ));
    }
    let taken = signature::all_tensors(op).iter().any(|s| s.name == t.name)
        || variables(true).iter().any(|(v, _)| *v == t.name)
        || t.name.starts_with('_')
        || t.name.starts_with("sh_");
    if taken {
        return err(format!(
            "tensor name `{}` is taken by the kernel (a binding, a variable, or a reserved \
             prefix `_` / `sh_`); rename it",
            t.name
        ));
    }
    if before.iter().any(|b| b.name == t.name) {
        return err(format!("tensor `{}` is declared twice", t.name));
    }
    let grads = |t: &TensorDecl| t.grad_name();
    if let Some(g) = grads(t).filter(|g| {
        [Op::BackwardQ, Op::BackwardKv]
            .iter()
            .any(|op| signature::all_tensors(*op).iter().any(|s| s.name == g))
            || before
                .iter()
                .any(|b| &b.name == g || grads(b).as_ref() == Some(g))
    }) {
        return err(format!(
            "the gradient of `{}`, `{g}`, is taken by the backward or another tensor; rename it",
            t.name
        ));
    }
    if t.dims.is_empty() {
        return err(format!("tensor `{}` needs at least one dimension", t.name));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::flex::library::{self, build::*};
    use crate::flex::{Dim, Flex};
    use crate::{KernelSpec, Masks, Op, WriteMode, configs};

    fn t5() -> Flex {
        library::preset("t5-bias:4").unwrap()
    }

    /// A flash backward_q of `flex` writing dQ and `writes`.
    fn backward_q(flex: &Flex, writes: &[(&str, WriteMode)]) -> KernelSpec {
        let masks = Masks {
            flex: Some(flex.intern()),
            ..Masks::default()
        };
        let mut spec = KernelSpec::flash("t5", Op::BackwardQ, 64, masks, configs::backward(64)[0]);
        spec.writes = [("dq", WriteMode::Owned), ("dkv", WriteMode::AtomicScatter)]
            .iter()
            .chain(writes)
            .map(|(n, m)| (n.to_string(), *m))
            .collect();
        spec.fit_target();
        spec
    }

    /// The gradient of a `grad` tensor binds after the tensors, added by compensated
    /// atomics in the step every schedule shares.
    #[test]
    fn a_grad_tensor_binds_its_gradient() {
        let spec = backward_q(&t5(), &[("drel_bias", WriteMode::AtomicScatter)]);
        let abi = crate::compile(&spec).unwrap();
        let last = abi.bindings.last().unwrap();
        assert_eq!(
            (&*last.name, last.write),
            ("drel_bias", Some(WriteMode::AtomicScatter))
        );
        // The entry adds what each invocation still holds once its loop is done.
        let entry = &abi.wgsl[abi.wgsl.find("@compute").unwrap()..];
        assert!(entry.contains("flex_flush();"), "{entry}");
        for needed in [
            "fn flex_grads(",
            "flex_grads(row, h, j, dot, gf)",
            "fn add_drel_bias(",
            "two_sum_err4(",
            "fn flex_drel_bias_0_flush(",
        ] {
            assert!(abi.wgsl.contains(needed), "{needed}");
        }
        // Without the write, no binding and no store.
        let abi = crate::compile(&backward_q(&t5(), &[])).unwrap();
        assert!(abi.binding("drel_bias").is_none());
        assert!(!abi.wgsl.contains("flex_grads("));
    }

    #[test]
    fn grad_errors_say_what_to_change() {
        let err = |spec: KernelSpec| crate::compile(&spec).unwrap_err().to_string();
        let owned = err(backward_q(&t5(), &[("drel_bias", WriteMode::Owned)]));
        assert!(owned.contains("write it `atomic`"), "{owned}");
        let mut forward = backward_q(&t5(), &[("drel_bias", WriteMode::AtomicScatter)]);
        forward.op = Op::Forward;
        forward.writes = vec![
            ("o".into(), WriteMode::Owned),
            ("lse".into(), WriteMode::Owned),
            ("drel_bias".into(), WriteMode::AtomicScatter),
        ];
        let forward = err(forward);
        assert!(
            forward.contains("only a backward_q or backward_kv writes it"),
            "{forward}"
        );
        // `kv` declared grad would write `dkv`, the backward's own.
        let taken = Flex {
            score_mod: Some(bin(
                crate::flex::BinOp::Add,
                v("score"),
                idx("kv", vec![v("h")]),
            )),
            mask_mod: None,
            tensors: vec![library::tensor("kv", &[Dim::Heads], crate::flex::Ty::F32).learnable()],
            ..Flex::default()
        };
        let taken = err(backward_q(&taken, &[]));
        assert!(taken.contains("`dkv`, is taken by the backward"), "{taken}");
        let unread = Flex {
            score_mod: Some(v("score")),
            mask_mod: None,
            tensors: vec![library::tensor("w", &[Dim::Heads], crate::flex::Ty::F32).learnable()],
            ..Flex::default()
        };
        let unread = err(backward_q(&unread, &[]));
        assert!(unread.contains("score_mod does not read it"), "{unread}");
    }
}
