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
    if !op.takes_modifiers() {
        return Err(DslError::spec(
            field,
            format!(
                "op {} takes no score_mod, mask_mod or tensors: only forward, decode, \
                 decode_split, backward_q and backward_kv compare queries with keys",
                op.name()
            ),
        ));
    }
    for (n, t) in flex.tensors.iter().enumerate() {
        check_tensor(op, t, &flex.tensors[..n])?;
    }
    let typed = |e: &crate::flex::Expr, score: bool, want: Ty, key: &'static str| {
        let err = |m: String| DslError::spec(Field::Flex(key), m);
        let got = type_of(e, &mut Scope::modifier(score, &flex.tensors)).map_err(|e| err(e.message))?;
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
    if let Some(e) = &flex.mask_mod {
        typed(e, false, Ty::Bool, "mask_mod")?;
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
    if t.dims.is_empty() {
        return err(format!("tensor `{}` needs at least one dimension", t.name));
    }
    Ok(())
}
