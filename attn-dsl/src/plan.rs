//! The binding plan: every binding's group, index, name, type and access, stated once.
//!
//! The WGSL declarations, the generated Rust bindings struct, the JSON manifest and the
//! runtime's bind groups are all read off a [`KernelAbi`]. Its fields are `Cow` so that the
//! same type is built at expansion time (owned) and embedded in generated code as a `const`
//! (borrowed).

use std::borrow::Cow;

use serde::Serialize;

use crate::signature::{self, Elem, Role};
use crate::spec::{
    Axis, Dtype, Fp8, Gqa, Grid, KernelSpec, Major, Masks, Op, Scatter, Target, WriteMode,
};

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
    /// IEEE single precision.
    F32,
    /// Indices, lengths, seeds and packed words.
    U32,
    /// IEEE half (`enable f16`).
    F16,
    /// bfloat16 halves, two to a `u32` word.
    Bf16,
    /// 8-bit floats of a KV cache ([`Fp8`]), four to a `u32` word.
    E4m3,
    /// e5m2 8-bit floats, four to a `u32` word.
    E5m2,
}

impl Scalar {
    /// The WGSL element type of the array (bf16 pairs are `u32` words).
    pub fn wgsl(self) -> &'static str {
        match self {
            Scalar::F32 => "f32",
            Scalar::U32 | Scalar::Bf16 | Scalar::E4m3 | Scalar::E5m2 => "u32",
            Scalar::F16 => "f16",
        }
    }

    /// The 8-bit float format of this element, if it is one.
    pub fn fp8(self) -> Option<Fp8> {
        match self {
            Scalar::E4m3 => Some(Fp8::E4m3),
            Scalar::E5m2 => Some(Fp8::E5m2),
            _ => None,
        }
    }

    /// The element of tensor kind `e` in a kernel whose data tensors are `dtype` and whose
    /// KV cache (if it reads or writes one) is in `kv_fp8` when given. A Linear's rows are
    /// read here as its data; [`Scalar::in_spec`] gives them the dtypes of its form.
    pub fn of(e: Elem, dtype: Dtype, kv_fp8: Option<Fp8>) -> Scalar {
        match (e, kv_fp8) {
            (Elem::LinearIn4, _) => return Scalar::of(Elem::Data4, dtype, None),
            (Elem::LinearOut, _) => return Scalar::of(Elem::Data, dtype, None),
            (Elem::Cache4 | Elem::CacheRows, Some(f)) => return Scalar::from(f),
            (Elem::Cache4, None) => return Scalar::of(Elem::Data4, dtype, None),
            (Elem::CacheRows, None) => return Scalar::of(Elem::Data, dtype, None),
            _ => {}
        }
        match (e, dtype) {
            (Elem::F32 | Elem::F32x4, _) | (Elem::Data | Elem::Data4, Dtype::F32) => Scalar::F32,
            (Elem::U32 | Elem::Counter, _) => Scalar::U32,
            (Elem::Data | Elem::Data4, Dtype::F16) => Scalar::F16,
            (Elem::Data | Elem::Data4, Dtype::Bf16) => Scalar::Bf16,
            (Elem::Cache4 | Elem::CacheRows | Elem::LinearIn4 | Elem::LinearOut, _) => {
                unreachable!("answered above")
            }
        }
    }

    /// The element of tensor kind `e` in `spec`'s kernel: [`Scalar::of`], and a Linear's
    /// rows in the dtypes of its form.
    pub fn in_spec(e: Elem, spec: &KernelSpec) -> Scalar {
        let form = spec.matmul_form();
        match e {
            Elem::LinearIn4 => Scalar::of(Elem::Data4, form.x, None),
            Elem::LinearOut => Scalar::of(Elem::Data, form.y, None),
            _ => Scalar::of(e, spec.dtype, spec.kv_fp8),
        }
    }

    /// The data type whose tensors hold this element (none for `u32`).
    pub fn dtype(self) -> Option<Dtype> {
        match self {
            Scalar::F32 => Some(Dtype::F32),
            Scalar::F16 => Some(Dtype::F16),
            Scalar::Bf16 => Some(Dtype::Bf16),
            Scalar::U32 | Scalar::E4m3 | Scalar::E5m2 => None,
        }
    }
}

impl From<Fp8> for Scalar {
    fn from(f: Fp8) -> Scalar {
        match f {
            Fp8::E4m3 => Scalar::E4m3,
            Fp8::E5m2 => Scalar::E5m2,
        }
    }
}

/// The element of a data tensor (Q, K, V, O) in `dtype`.
impl From<Dtype> for Scalar {
    fn from(dtype: Dtype) -> Scalar {
        Scalar::of(Elem::Data, dtype, None)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
/// One binding of a kernel's bind group, as the generated Rust and the runtime see it.
pub struct Binding {
    /// The bind group (always 0).
    pub group: u32,
    /// The binding's index in the group.
    pub binding: u32,
    /// The name the runtime binds it by (`q`, `o`, `dims`, ..).
    pub name: Cow<'static, str>,
    /// How the kernel uses it: read, read-write, or uniform.
    pub access: Access,
    /// The element type.
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
    /// Rust module name and WGSL label.
    pub name: Cow<'static, str>,
    /// What the kernel computes.
    pub op: Op,
    /// The WGSL entry point.
    pub entry_point: Cow<'static, str>,
    /// `@workgroup_size`.
    pub workgroup_size: [u32; 3],
    /// How its workgroups cover the work.
    pub grid: Grid,
    /// The compile-time width of a row: head_dim, or hidden of a row-wise layer.
    pub head_dim: u32,
    /// The width of an output row: the Linear's of a row-wise layer; attention's V and O
    /// rows (`head_dim_v`) where they differ from head_dim, else 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub out_dim: u32,
    /// Query heads per KV head.
    pub gqa: Gqa,
    /// The masks and score modifiers compiled in.
    pub masks: Masks,
    /// The limits the kernel was checked against.
    pub target: Target,
    /// Needs the SHADER_FLOAT32_ATOMIC feature (native f32 atomic scatter).
    pub f32_atomics: bool,
    /// Workgroup memory the kernel declares, in bytes.
    pub workgroup_storage_bytes: u32,
    /// Every binding, in binding order.
    pub bindings: Cow<'static, [Binding]>,
    /// The kernel's WGSL (kept out of the manifest: it has a file of its own).
    #[serde(skip)]
    pub wgsl: Cow<'static, str>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl KernelAbi {
    /// The width of V, O, dO and dV rows (attention's `head_dim_v`).
    pub fn head_dim_v(&self) -> u32 {
        match self.out_dim {
            0 => self.head_dim,
            d => d,
        }
    }

    /// The binding named `name`, if the kernel has one.
    pub fn binding(&self, name: &str) -> Option<&Binding> {
        self.bindings.iter().find(|b| b.name == name)
    }

    /// The first output the kernel adds by atomics, whose order (and so the f32 sum) can
    /// change from run to run.
    pub fn atomic_output(&self) -> Option<&str> {
        self.bindings
            .iter()
            .find(|b| b.write == Some(WriteMode::AtomicScatter))
            .map(|b| &*b.name)
    }

    /// Whether a binding holds f16 (the kernel needs `enable f16`).
    pub fn uses_f16(&self) -> bool {
        self.bindings.iter().any(|b| b.scalar == Scalar::F16) || self.grid.uses_coop()
    }

    /// The element type of binding `name` (f32 when there is none).
    pub fn scalar(&self, name: &str) -> Scalar {
        self.binding(name).map_or(Scalar::F32, |b| b.scalar)
    }

    /// Storage buffers the kernel binds (the limit WebGPU sets at 8 by default).
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
        let wg = self.workgroup_size[0].max(1);
        let strided = |n: u32| {
            n.div_ceil(wg)
                .clamp(1, crate::layout::MAX_STRIDE_WORKGROUPS)
        };
        match self.op {
            // vec4s of one sequence's new rows (n_new · n_kv_heads · head_dim / 4), by
            // sequence; workgroup 0 writes the lengths even when no row is new.
            Op::CacheAppend => return [strided(at(0) * at(2) * (at(3) / 4)), at(4), 1],
            Op::DkvReduce | Op::ToDtype | Op::FromDtype | Op::GradFold => {
                return [strided(at(0)), 1, 1];
            }
            Op::RowScale => return [strided(at(0) * crate::layout::ROW_SCALE_LANES), 1, 1],
            // An invocation per vec4 of the merged outputs.
            Op::Merge => return [strided(at(0) * (at(2) / 4)), 1, 1],
            // (seq_len, n_heads, blocks, mask_heads, batch, mask_batch): a workgroup per
            // block, of each of the mask's sequences and heads.
            Op::BlockMask => return [at(2), at(2), at(5) * at(3)],
            // (m, n, k, split): a workgroup per block of c and part of the reduction.
            Op::Matmul => {
                use crate::layout::matmul::{BM, BN};
                return [at(1).div_ceil(BN), at(0).div_ceil(BM), at(3).max(1)];
            }
            // Pass 0: a workgroup per (head, block of rows); pass 1: one per head, which
            // owns dsinks[h].
            Op::SinkGrad if at(6) == 0 => return [at(1), at(5), 1],
            Op::SinkGrad => return [at(1), 1, 1],
            // (rows, hidden, out): a workgroup per block of output columns and of rows.
            Op::LinearRows => {
                let bytes = match self.scalar("w") {
                    Scalar::F16 | Scalar::Bf16 => 2,
                    _ => 4,
                };
                let wg = self.workgroup_size[0];
                let block = crate::layout::rows::linear_layout(self.grid.tile, bytes, wg).block(wg);
                return [
                    at(2).div_ceil(block.max(1)),
                    at(0).div_ceil(self.grid.tile.max(1)),
                    1,
                ];
            }
            // Field 10 is n_slices: a continued cache's key slices, each its own workgroups.
            // Packed, a KV head's query heads share its tiles: the rows are n · group.
            Op::Extend if self.grid.pack_heads => {
                let rows = at(0) * at(1).checked_div(at(2)).unwrap_or(0);
                return [rows.div_ceil(self.grid.tile), at(2), at(4) * at(10).max(1)];
            }
            Op::Extend => {
                return [at(0).div_ceil(self.grid.tile), at(1), at(4) * at(10).max(1)];
            }
            // Field 11 is n_rows: a workgroup per query (row, head) and sequence.
            Op::DecodeReduce => return [at(1) * at(11).max(1), at(4), 1],
            _ => {}
        }
        match self.grid.major {
            Major::S => [at(0).div_ceil(self.grid.tile), at(1), at(4)],
            // A key-major kernel that adds dK by atomics serves one query head a workgroup.
            Major::J
                if self.binding("dk").and_then(|b| b.write) == Some(WriteMode::AtomicScatter) =>
            {
                [at(0).div_ceil(self.grid.tile), at(1), at(4)]
            }
            Major::J => [at(0).div_ceil(self.grid.tile), at(2), at(4)],
            Major::Head => [at(1), at(4), 1],
            // Field 9 is n_slices, 11 n_rows; each KV head's query slots (rows by its query
            // heads) in groups of `tile`.
            Major::Slice => [
                at(9),
                at(2)
                    * (at(11).max(1) * at(1).checked_div(at(2)).unwrap_or(0))
                        .div_ceil(self.grid.tile),
                at(4),
            ],
            Major::R => [
                at(0).div_ceil(self.grid.tile),
                crate::layout::rows::grid_y(
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

    /// Uniform buffers the kernel binds.
    pub fn uniform_buffers(&self) -> usize {
        self.bindings
            .iter()
            .filter(|b| b.access == Access::Uniform)
            .count()
    }
}

/// The bindings of `spec`, all in group 0, in the op's signature order, then the tensors
/// its user-written modifiers read (read-only, in declaration order).
pub fn bindings(spec: &KernelSpec) -> Vec<Binding> {
    let mut out = signature_bindings(spec);
    out.extend(flex_bindings(spec, out.len() as u32));
    out
}

fn flex_bindings(spec: &KernelSpec, first: u32) -> Vec<Binding> {
    let Some(flex) = spec.flex() else {
        return Vec::new();
    };
    let read = flex.tensors.iter().map(|t| {
        let scalar = match t.ty {
            crate::flex::Ty::F32 => Scalar::F32,
            _ => Scalar::U32,
        };
        (
            t.name.clone(),
            Access::Read,
            scalar,
            array_type(Elem::F32, scalar, None),
            None,
        )
    });
    // The gradients of tensors declared `grad`, where this kernel writes them.
    let grads = flex.tensors.iter().filter_map(|t| {
        let name = t.grad_name()?;
        let write = spec.write_mode(&name)?;
        let scatter = (write == WriteMode::AtomicScatter).then_some(spec.scatter);
        let wgsl_type = array_type(Elem::F32, Scalar::F32, scatter);
        Some((name, Access::ReadWrite, Scalar::F32, wgsl_type, Some(write)))
    });
    // The block mask this kernel's tile tests read.
    let blocks = spec.reads_block_mask().then(|| {
        let name = "block_mask".to_string();
        let wgsl_type = array_type(Elem::F32, Scalar::U32, None);
        (name, Access::Read, Scalar::U32, wgsl_type, None)
    });
    // Where the modifiers report their first out-of-range read.
    let report = flex.report_reads.then(|| {
        let atomic = Cow::Borrowed("array<atomic<u32>>");
        let name = "flex_reads".to_string();
        (name, Access::ReadWrite, Scalar::U32, atomic, None)
    });
    read.chain(grads)
        .chain(blocks)
        .chain(report)
        .enumerate()
        .map(|(i, (name, access, scalar, wgsl_type, write))| Binding {
            group: 0,
            binding: first + i as u32,
            name: Cow::Owned(name),
            access,
            scalar,
            wgsl_type,
            fields: Cow::Borrowed(&[]),
            layout: Cow::Borrowed(&[]),
            write,
        })
        .collect()
}

fn signature_bindings(spec: &KernelSpec) -> Vec<Binding> {
    signature::tensors(spec)
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let write = spec.write_mode(t.name);
            let scalar = Scalar::in_spec(t.elem, spec);
            let (access, wgsl_type, fields) = match t.role {
                Role::Uniform => {
                    let block = signature::uniform_block(spec.op, t.name)
                        .expect("every uniform in a signature has a block");
                    let fields = block.fields.iter().map(|f| Cow::Borrowed(*f)).collect();
                    (Access::Uniform, Cow::Borrowed(block.struct_name), fields)
                }
                // A split pass loads its cache in words of eight elements where it can.
                Role::Input if t.elem == Elem::Cache4 && split_word(spec).is_some() => (
                    Access::Read,
                    Cow::Borrowed(split_word(spec).unwrap_or_default()),
                    Vec::new(),
                ),
                Role::Input => (Access::Read, array_type(t.elem, scalar, None), Vec::new()),
                Role::Output if write == Some(WriteMode::AtomicScatter) => (
                    Access::ReadWrite,
                    array_type(t.elem, scalar, Some(spec.scatter)),
                    Vec::new(),
                ),
                Role::Output => (
                    Access::ReadWrite,
                    array_type(t.elem, scalar, None),
                    Vec::new(),
                ),
            };
            Binding {
                group: 0,
                binding: i as u32,
                name: Cow::Borrowed(t.name),
                access,
                scalar,
                wgsl_type,
                fields: Cow::Owned(fields),
                layout: Cow::Borrowed(t.layout),
                write,
            }
        })
        .collect()
}

/// The array type of a split pass's cache where its words are eight elements, not four.
fn split_word(spec: &KernelSpec) -> Option<&'static str> {
    let word = crate::layout::decode::word(spec);
    (spec.op == Op::DecodeSplit && word == 8).then(
        || match crate::layout::decode::stream_word_type(spec, word) {
            "vec2<u32>" => "array<vec2<u32>>",
            _ => "array<vec4<u32>>",
        },
    )
}

/// `array<f32>`, or the atomic array an atomic-scatter output is added into: `u32` words
/// holding f32 bits for the compare-exchange loop, or `f32` for native atomic adds.
fn array_type(e: Elem, scalar: Scalar, scatter: Option<Scatter>) -> Cow<'static, str> {
    // A Linear's half-precision y: two columns a word, each word one invocation's store.
    if e == Elem::LinearOut && scalar != Scalar::F32 {
        return Cow::Borrowed("array<u32>");
    }
    // A cache in the kernel's dtype is its data, four at a time.
    let e = match e {
        Elem::Cache4 | Elem::LinearIn4 => Elem::Data4,
        Elem::CacheRows | Elem::LinearOut => Elem::Data,
        e => e,
    };
    Cow::Borrowed(match (scatter, e, scalar) {
        (Some(Scatter::Cas), _, _) | (None, Elem::Counter, _) => "array<atomic<u32>>",
        (Some(Scatter::F32Atomic), _, _) => "array<atomic<f32>>",
        (None, Elem::F32x4, _) | (None, Elem::Data4, Scalar::F32) => "array<vec4<f32>>",
        // Four bf16 halves in two words.
        (None, Elem::Data4, Scalar::Bf16) => "array<vec2<u32>>",
        (None, _, Scalar::F32) => "array<f32>",
        // Four fp8 values per word, as vec4 loads of the other dtypes.
        (None, _, Scalar::U32 | Scalar::Bf16 | Scalar::E4m3 | Scalar::E5m2) => "array<u32>",
        // Four halves per element: one 8-byte load per vec4 of a row.
        (None, _, Scalar::F16) => "array<vec4<f16>>",
    })
}
