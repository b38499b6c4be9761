//! The binding plan: every binding's group, index, name, type and access, stated once.
//!
//! The WGSL declarations, the generated Rust bindings struct, the JSON manifest and the
//! runtime's bind groups are all read off a [`KernelAbi`]. Its fields are `Cow` so that the
//! same type is built at expansion time (owned) and embedded in generated code as a `const`
//! (borrowed).

use std::borrow::Cow;

use serde::Serialize;

use crate::signature::{self, Elem, Role};
use crate::spec::{Axis, Gqa, Grid, KernelSpec, Major, Masks, Op, Scatter, Target, WriteMode};

/// How a shader may touch a binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// `var<storage, read>`
    Read,
    /// `var<storage, read_write>`
    ReadWrite,
    /// `var<uniform>`
    Uniform,
}

/// Scalar element type of a binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scalar {
    F32,
    U32,
}

impl Scalar {
    pub fn wgsl(self) -> &'static str {
        match self {
            Scalar::F32 => "f32",
            Scalar::U32 => "u32",
        }
    }
}

impl From<Elem> for Scalar {
    fn from(e: Elem) -> Scalar {
        match e {
            Elem::F32 => Scalar::F32,
            Elem::U32 => Scalar::U32,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Binding {
    pub group: u32,
    pub binding: u32,
    pub name: Cow<'static, str>,
    pub access: Access,
    pub scalar: Scalar,
    /// The WGSL type: `array<f32>` for storage, the struct name for uniforms.
    pub wgsl_type: Cow<'static, str>,
    /// Uniform struct fields in order (all of type `scalar`); empty for storage.
    pub fields: Cow<'static, [Cow<'static, str>]>,
    /// Index axes of a storage tensor, outermost first.
    pub layout: Cow<'static, [Axis]>,
    /// How this kernel writes the binding, if it is an output.
    pub write: Option<WriteMode>,
}

impl Binding {
    /// Size in bytes of a uniform block (its fields are 4-byte scalars).
    pub fn uniform_size(&self) -> u64 {
        4 * self.fields.len() as u64
    }
}

/// Everything a host needs to create, bind and dispatch one generated kernel.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelAbi {
    pub name: Cow<'static, str>,
    pub op: Op,
    pub entry_point: Cow<'static, str>,
    pub workgroup_size: [u32; 3],
    pub grid: Grid,
    pub head_dim: u32,
    pub gqa: Gqa,
    pub masks: Masks,
    pub target: Target,
    /// Needs the SHADER_FLOAT32_ATOMIC feature (native f32 atomic scatter).
    pub f32_atomics: bool,
    pub workgroup_storage_bytes: u32,
    pub bindings: Cow<'static, [Binding]>,
    /// The kernel's WGSL (kept out of the manifest: it has a file of its own).
    #[serde(skip)]
    pub wgsl: Cow<'static, str>,
}

impl KernelAbi {
    pub fn binding(&self, name: &str) -> Option<&Binding> {
        self.bindings.iter().find(|b| b.name == name)
    }

    pub fn storage_buffers(&self) -> usize {
        self.bindings
            .iter()
            .filter(|b| b.access != Access::Uniform)
            .count()
    }

    /// Workgroups to dispatch, given the `dims` uniform's values in field order (the walked
    /// length, n_heads, n_kv_heads, head_dim, batch, ..).
    pub fn dispatch_grid(&self, dims: &[u32]) -> [u32; 3] {
        let at = |i: usize| dims.get(i).copied().unwrap_or(0);
        // Field 4 is `batch` (the number of sequences) in every attention op's dims; the
        // row-wise layers' dims are (rows, hidden, out, n_tiles, n_blocks).
        match self.grid.major {
            Major::S => [at(0).div_ceil(self.grid.tile), at(1), at(4)],
            Major::J => [at(0).div_ceil(self.grid.tile), at(2), at(4)],
            Major::Head => [at(1), at(4), 1],
            Major::R => [
                at(0).div_ceil(self.grid.tile),
                crate::row_layer::grid_y(
                    self.op,
                    at(1),
                    at(2),
                    self.grid.tile,
                    self.binding("dgamma").and_then(|b| b.write) == Some(WriteMode::AtomicScatter),
                ),
                1,
            ],
            Major::Elem => {
                // dγ, dβ, dW and db, one element per invocation.
                let elements = at(1) * at(2) + 2 * at(1) + at(2);
                [elements.div_ceil(self.workgroup_size[0].max(1)), 1, 1]
            }
        }
    }

    pub fn uniform_buffers(&self) -> usize {
        self.bindings
            .iter()
            .filter(|b| b.access == Access::Uniform)
            .count()
    }
}

/// The bindings of `spec`, all in group 0, in the op's signature order.
pub fn bindings(spec: &KernelSpec) -> Vec<Binding> {
    signature::tensors(spec)
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let write = spec.write_mode(t.name);
            let (access, wgsl_type, fields) = match t.role {
                Role::Uniform => {
                    let block = signature::uniform_block(spec.op, t.name)
                        .expect("every uniform in a signature has a block");
                    let fields = block.fields.iter().map(|f| Cow::Borrowed(*f)).collect();
                    (Access::Uniform, Cow::Borrowed(block.struct_name), fields)
                }
                Role::Input => (Access::Read, array_type(t.elem, None), Vec::new()),
                Role::Output if write == Some(WriteMode::AtomicScatter) => (
                    Access::ReadWrite,
                    array_type(t.elem, Some(spec.scatter)),
                    Vec::new(),
                ),
                Role::Output => (Access::ReadWrite, array_type(t.elem, None), Vec::new()),
            };
            Binding {
                group: 0,
                binding: i as u32,
                name: Cow::Borrowed(t.name),
                access,
                scalar: t.elem.into(),
                wgsl_type,
                fields: Cow::Owned(fields),
                layout: Cow::Borrowed(t.layout),
                write,
            }
        })
        .collect()
}

/// `array<f32>`, or the atomic array an atomic-scatter output is added into: `u32` words
/// holding f32 bits for the compare-exchange loop, or `f32` for native atomic adds.
fn array_type(e: Elem, scatter: Option<Scatter>) -> Cow<'static, str> {
    Cow::Borrowed(match (scatter, Scalar::from(e)) {
        (Some(Scatter::Cas), _) => "array<atomic<u32>>",
        (Some(Scatter::F32Atomic), _) => "array<atomic<f32>>",
        (None, Scalar::F32) => "array<f32>",
        (None, Scalar::U32) => "array<u32>",
    })
}
