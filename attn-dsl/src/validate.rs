//! naga validation of emitted WGSL, and a cross-check that the module declares exactly the
//! bindings of the plan (so the Rust side and the shader cannot drift).

use naga::valid::{Capabilities, ValidationFlags, Validator};

pub use crate::error::ValidateError;
use crate::plan::{Access, Binding};
use crate::spec::{KernelSpec, Scatter, Target};

/// Shader capabilities a kernel may use: core WGSL for `webgpu` (naga gates the core
/// `pack2x16float` / `unpack2x16float` behind a capability of their own, which every wgpu
/// backend but old GLES has), all of naga's for `native`, plus f32 atomics wherever the kernel's scatter asks for them (the runtime
/// only creates such a kernel on a device with SHADER_FLOAT32_ATOMIC).
pub fn capabilities(spec: &KernelSpec) -> Capabilities {
    let base = match spec.target {
        Target::Webgpu => Capabilities::SHADER_FLOAT16_IN_FLOAT32,
        Target::Native(_) => Capabilities::all(),
    };
    let atomics = match spec.has_atomics() && spec.scatter == Scatter::F32Atomic {
        true => Capabilities::SHADER_FLOAT32_ATOMIC,
        false => Capabilities::empty(),
    };
    // f16 is an optional WebGPU feature (`shader-f16`): the runtime creates such a kernel
    // only on a device with SHADER_F16, under either target.
    let half = match spec.uses_f16() {
        true => Capabilities::SHADER_FLOAT16,
        false => Capabilities::empty(),
    };
    base | atomics | half
}

/// Parses and validates `wgsl` with every validation flag on, then checks its globals
/// against `bindings`.
pub fn validate(
    wgsl: &str,
    caps: naga::valid::Capabilities,
    bindings: &[Binding],
) -> Result<(), ValidateError> {
    let module = naga::front::wgsl::parse_str(wgsl).map_err(|e| ValidateError::Parse {
        rendered: e.emit_to_string(wgsl),
    })?;
    Validator::new(ValidationFlags::all(), caps)
        .validate(&module)
        .map_err(|e| ValidateError::Invalid {
            rendered: e.emit_to_string(wgsl),
        })?;
    check_globals(&module, bindings)?;
    check_helpers(&module)
}

/// Every numerics helper the module defines is called: the emitters declare the helpers
/// their fragments call, and a declaration without a call is a stale one.
fn check_helpers(module: &naga::Module) -> Result<(), ValidateError> {
    let mut called = vec![false; module.functions.len()];
    let bodies = module
        .functions
        .iter()
        .map(|(_, f)| &f.body)
        .chain(module.entry_points.iter().map(|e| &e.function.body));
    for body in bodies {
        mark_calls(body, &mut called);
    }
    for ((_, f), called) in module.functions.iter().zip(called) {
        let name = f.name.as_deref().unwrap_or_default();
        if !called && crate::emit::helper_names().any(|h| h == name) {
            return Err(ValidateError::UnusedHelper(name.to_string()));
        }
    }
    Ok(())
}

fn mark_calls(block: &naga::Block, called: &mut [bool]) {
    use naga::Statement as S;
    for statement in block.iter() {
        match statement {
            S::Call { function, .. } => called[function.index()] = true,
            S::Block(b) => mark_calls(b, called),
            S::If { accept, reject, .. } => {
                mark_calls(accept, called);
                mark_calls(reject, called);
            }
            S::Switch { cases, .. } => cases.iter().for_each(|c| mark_calls(&c.body, called)),
            S::Loop {
                body, continuing, ..
            } => {
                mark_calls(body, called);
                mark_calls(continuing, called);
            }
            _ => {}
        }
    }
}

fn check_globals(module: &naga::Module, bindings: &[Binding]) -> Result<(), ValidateError> {
    let mut declared = 0;
    for (_, var) in module.global_variables.iter() {
        let Some(rb) = &var.binding else { continue };
        declared += 1;
        let name = var.name.as_deref().unwrap_or("<unnamed>");
        let Some(b) = bindings
            .iter()
            .find(|b| b.group == rb.group && b.binding == rb.binding)
        else {
            return Err(ValidateError::PlanMismatch(format!(
                "`{name}` at @group({}) @binding({}) is not in the plan",
                rb.group, rb.binding
            )));
        };
        if b.name != name || !space_matches(var.space, b.access) {
            return Err(ValidateError::PlanMismatch(format!(
                "@group({}) @binding({}) is `{name}` ({:?}) in WGSL but `{}` ({:?}) in the plan",
                rb.group, rb.binding, var.space, b.name, b.access
            )));
        }
    }
    if declared != bindings.len() {
        return Err(ValidateError::PlanMismatch(format!(
            "WGSL declares {declared} bindings, the plan {}",
            bindings.len()
        )));
    }
    Ok(())
}

fn space_matches(space: naga::AddressSpace, access: Access) -> bool {
    use naga::{AddressSpace, StorageAccess};
    match (space, access) {
        (AddressSpace::Uniform, Access::Uniform) => true,
        (AddressSpace::Storage { access: a }, Access::Read) => a == StorageAccess::LOAD,
        (AddressSpace::Storage { access: a }, Access::ReadWrite) => {
            a == StorageAccess::LOAD | StorageAccess::STORE
        }
        _ => false,
    }
}
