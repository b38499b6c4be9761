//! The fixed tensor signature of each op: names, roles and index layouts, in binding order.
//!
//! Binding order follows the seeds' bind-group tables, which are the reference ABI.

use crate::spec::{Axis, Masks, Op};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Input,
    Output,
    Uniform,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    F32,
    U32,
}

/// One tensor (or uniform block) an op touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor {
    pub name: &'static str,
    pub role: Role,
    pub elem: Elem,
    /// Index axes, outermost first. Empty for uniforms.
    pub layout: &'static [Axis],
}

/// The fields of a uniform block: all `u32` (dims) or all `f32` (params), 16 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UniformBlock {
    pub binding: &'static str,
    pub struct_name: &'static str,
    pub elem: Elem,
    pub fields: &'static [&'static str],
}

const fn t(name: &'static str, role: Role, elem: Elem, layout: &'static [Axis]) -> Tensor {
    Tensor {
        name,
        role,
        elem,
        layout,
    }
}

use Axis::{D, H, J, KvH, S};
use Elem::{F32, U32};
use Role::{Input, Output, Uniform};

const FORWARD: &[Tensor] = &[
    t("q", Input, F32, &[S, H, D]),
    t("k", Input, F32, &[J, KvH, D]),
    t("v", Input, F32, &[J, KvH, D]),
    t("o", Output, F32, &[S, H, D]),
    t("lse", Output, F32, &[S, H]),
    t("dims", Uniform, U32, &[]),
    t("params", Uniform, F32, &[]),
    t("seg", Input, U32, &[S]),
];

const DECODE: &[Tensor] = &[
    t("q", Input, F32, &[H, D]),
    t("k_cache", Input, F32, &[J, KvH, D]),
    t("v_cache", Input, F32, &[J, KvH, D]),
    t("o", Output, F32, &[H, D]),
    t("dims", Uniform, U32, &[]),
    t("params", Uniform, F32, &[]),
];

/// Tensors of `op` in binding order; tensors that only a mask needs are present only when
/// the mask is on (`seg` with the document mask).
pub fn tensors(op: Op, masks: Masks) -> Vec<Tensor> {
    let all = match op {
        Op::Forward => FORWARD,
        Op::Decode => DECODE,
    };
    all.iter()
        .filter(|t| t.name != "seg" || masks.document)
        .copied()
        .collect()
}

pub const PARAMS: UniformBlock = UniformBlock {
    binding: "params",
    struct_name: "Params",
    elem: F32,
    fields: &["scale", "_pad0", "_pad1", "_pad2"],
};

/// The run-time dims of `op`. Field 0 is the length the grid walks (or the cache length).
pub fn dims(op: Op) -> UniformBlock {
    let fields: &'static [&'static str] = match op {
        Op::Forward => &["seq_len", "n_heads", "n_kv_heads", "head_dim"],
        Op::Decode => &["cache_len", "n_heads", "n_kv_heads", "head_dim"],
    };
    UniformBlock {
        binding: "dims",
        struct_name: "Dims",
        elem: U32,
        fields,
    }
}

/// The uniform block behind a uniform binding name.
pub fn uniform_block(op: Op, binding: &str) -> Option<UniformBlock> {
    match binding {
        "dims" => Some(dims(op)),
        "params" => Some(PARAMS),
        _ => None,
    }
}
