//! attn-dsl: the dataflow IR of attention kernels, its checks, the WGSL emitter, naga
//! validation and the binding plan. Pure: no wgpu and no proc-macro types, so a build
//! script, a test, a CLI or a runtime can all drive it.
//!
//! Layers, each using only those before it (`tests/suite/layers.rs` fails on an edge that points
//! back): `spec` (the IR) and `signature` (each op's tensors) → `error` → `layout` (the
//! rules every size follows: workgroup bytes, flash and tensor-core tilings, the
//! configurations derived from the limits, split-K slices, row tiles, targets) → `plan`
//! (the bindings) → `check` (before any WGSL) and `emit` (the WGSL) → `validate` (naga).
//! [`compile`] runs them in that order.
//!
//! ```
//! use attn_dsl::{compile, KernelSpec, Masks, Op};
//! let spec = KernelSpec::standard("fwd", Op::Forward, 64, Masks::new(true, true));
//! let abi = compile(&spec).unwrap();
//! assert_eq!(abi.bindings.len(), 8);
//! assert!(abi.wgsl.contains("@workgroup_size(WG)"));
//! ```

#![warn(missing_docs)]

pub mod check;
pub mod contract;
pub mod emit;
mod error;
pub mod flex;
pub mod implied;
pub mod layout;
pub mod manifest;
pub mod plan;
pub mod row_layer;
pub mod signature;
pub mod spec;
pub mod validate;

// The layout rules' modules under the paths they had before the `layout` layer.
pub use layout::{configs, tiling};

use std::borrow::Cow;

pub use error::{DslError, Field};

/// Lanes of the streaming backward's atomic `dkv`: query tile `t` adds its dK and dV into
/// lane `t % DKV_LANES`, and the reader sums the lanes. Each element's atomic additions
/// come in an order no one controls; split over 4 lanes, each chain is a quarter as long,
/// and so is its rounding error (one chain of 30 adds measured 1.26x the pass bound on an
/// H100).
pub const DKV_LANES: u32 = 4;
pub use plan::{Access, Binding, KernelAbi, Scalar};
pub use spec::{
    Axis, BiasHeads, Cache, Dtype, Flash, FlashConfig, Fp8, Gqa, Grid, KernelSpec, Limits, Major,
    Masks, Matrix, Modifier, Op, Scatter, Source, Target, WriteMode,
};
pub use validate::ValidateError;

/// Philox-4x32-10 in WGSL (`philox4x32_10(counter, key)`), as every dropout kernel has it.
pub const PHILOX_WGSL: &str = emit::scores::PHILOX;

/// Checks `spec`, plans its bindings, emits its WGSL and validates it with naga.
pub fn compile(spec: &KernelSpec) -> Result<KernelAbi, DslError> {
    compile_phases(spec, emit::coop::Phases::ALL)
}

/// [`compile`] with a tensor-core kernel's block loop cut to the phases in `keep`: a
/// measuring instrument (`bench --only phases`), whose output is not attention unless
/// `keep` is [`emit::coop::Phases::ALL`].
pub fn compile_phases(spec: &KernelSpec, keep: emit::coop::Phases) -> Result<KernelAbi, DslError> {
    check::check_spec(spec)?;
    let bindings = plan::bindings(spec);
    let wgsl = emit::emit_phases(spec, &bindings, keep);
    let abi = KernelAbi {
        name: Cow::Owned(spec.name.clone()),
        op: spec.op,
        entry_point: Cow::Owned(spec.name.clone()),
        workgroup_size: [spec.workgroup_size, 1, 1],
        grid: spec.grid,
        head_dim: spec.head_dim,
        out_dim: spec.out_dim,
        gqa: spec.gqa,
        masks: spec.masks,
        target: spec.target,
        f32_atomics: spec.has_atomics() && spec.scatter == Scatter::F32Atomic,
        workgroup_storage_bytes: layout::workgroup_bytes(spec),
        bindings: Cow::Owned(bindings),
        wgsl: Cow::Owned(wgsl),
    };
    check::check_limits(spec, &abi)?;
    validate::validate(&abi.wgsl, validate::capabilities(spec), &abi.bindings)?;
    Ok(abi)
}
