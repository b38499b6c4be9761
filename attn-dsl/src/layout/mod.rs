//! The layout rules: what each kernel keeps in workgroup memory and how many bytes that
//! takes, the flash and tensor-core tilings and the configurations derived from the
//! limits, split-K decode's slices, the row layers' tiles, the target a description needs.
//! Below the checks and the emitter, which both read them; above the IR alone.

pub mod configs;
pub mod coop;
pub mod decode;
pub mod matmul;
pub mod rows;
pub mod tiling;

use crate::signature::{self, Role};
use crate::spec::{Flash, FlashConfig, Grid, KernelSpec, Limits, Masks, Op, Target};
use coop::CoopTiling;
use tiling::Tiling;

/// The most workgroups along a grid-stride loop's axis (`cache_append`, `dkv_reduce`, the
/// conversions): enough for every core of a large GPU several times over; longer work
/// loops.
pub const MAX_STRIDE_WORKGROUPS: u32 = 4096;

/// Invocations per row of the `row_scale` pass, reading the row's consecutive vec4s. (One
/// invocation per row made each load touch 32 rows, with too few invocations in flight:
/// 820 GB/s on an H100.)
pub const ROW_SCALE_LANES: u32 = 16;

/// Bytes of `var<workgroup>` memory the emitted kernel declares.
pub fn workgroup_bytes(spec: &KernelSpec) -> u32 {
    if let Some(t) = CoopTiling::of(spec) {
        return t.bytes();
    }
    if let Some(Ok(t)) = Tiling::of(spec) {
        return t.bytes(spec.op);
    }
    let (hd, wg) = (spec.width(), spec.workgroup_size);
    // The per-row schedules' reductions: one f32 per invocation.
    let reduce = 4 * wg;
    match spec.op {
        // sh_q + sh_acc, sh_p + sh_partial, sh_state + sh_range, and the reductions.
        Op::Forward | Op::Extend | Op::Decode => 4 * (2 * hd + 2 * wg) + 8 + 8 + reduce,
        Op::BackwardPrep => 0,
        // Two f32 (a double-f32) per invocation for the sum's tree.
        Op::SinkGrad => 2 * reduce,
        // sh_q, sh_do, sh_acc; sh_ds, sh_partial; sh_range.
        Op::BackwardQ => 4 * (3 * hd + 2 * wg) + 8,
        // sh_k, sh_v, sh_dk, sh_dv; sh_p, sh_ds, sh_pk, sh_pv; sh_range.
        Op::BackwardKv => 4 * (4 * hd + 4 * wg) + 8,
        Op::Rope
        | Op::RopeBackward
        | Op::CacheAppend
        | Op::DkvReduce
        | Op::ToDtype
        | Op::FromDtype
        | Op::GradFold
        | Op::Merge => 0,
        // The block's two flags.
        Op::BlockMask => 4,
        // Each invocation's partial maximum.
        Op::RowScale => reduce,
        Op::Matmul => matmul::workgroup_bytes(spec.matmul_form()),
        Op::DecodeSplit | Op::DecodeReduce => decode::workgroup_bytes(spec),
        Op::LayernormLinear
        | Op::LayernormLinearBackward
        | Op::LayernormLinearWeightGrad
        | Op::LayernormLinearReduce
        | Op::LayernormRows
        | Op::LayernormGradRows
        | Op::LayernormRowsBackward
        | Op::LinearRows => rows::workgroup_bytes(spec),
    }
}

impl KernelSpec {
    /// WebGPU's defaults when the kernel fits them, else a `native` target with just the
    /// workgroup memory and storage buffers it needs (always `native` with subgroups or
    /// cooperative matrices, which core WebGPU lacks).
    pub fn fit_target(&mut self) {
        self.target = Target::Webgpu;
        self.fit_bytes(workgroup_bytes(self));
    }

    /// [`KernelSpec::fit_target`] for a kernel whose layout grows with the workgroup
    /// memory it may take (the split pass's longest slice): laid out within
    /// `workgroup_storage_bytes` (what the device offers), then the least target that holds
    /// that layout, WebGPU's defaults where they do.
    pub fn fit_device(&mut self, workgroup_storage_bytes: u32) {
        self.target = Target::Native(Limits {
            workgroup_storage_bytes,
            ..Limits::WEBGPU
        });
        let bytes = workgroup_bytes(self);
        self.fit_target();
        if bytes > workgroup_bytes(self) {
            self.fit_bytes(bytes);
        }
    }

    /// WebGPU's defaults, or where `bytes` of workgroup memory, the storage buffers the
    /// kernel binds, its subgroups or its combine (a split pass's, ordered across
    /// workgroups natively) pass them, a `native` target with just what it needs.
    fn fit_bytes(&mut self, bytes: u32) {
        self.target = Target::Webgpu;
        let storage = signature::tensors(self)
            .iter()
            .filter(|t| t.role != Role::Uniform)
            .count() as u32
            + self.flex_buffers();
        let base = Limits::WEBGPU;
        if bytes > base.workgroup_storage_bytes
            || storage > base.storage_buffers_per_stage
            || self.grid.uses_subgroups()
            || self.combines_slices()
        {
            self.target = Target::Native(Limits {
                workgroup_storage_bytes: bytes.max(base.workgroup_storage_bytes),
                storage_buffers_per_stage: storage.max(base.storage_buffers_per_stage),
                ..base
            });
        }
    }
}

impl KernelSpec {
    /// [`KernelSpec::standard`] on the flash grid of `config`, targeting WebGPU's defaults
    /// when its workgroup memory fits them and a `native` target with just enough otherwise.
    pub fn flash(
        name: &str,
        op: Op,
        head_dim: u32,
        masks: Masks,
        config: FlashConfig,
    ) -> KernelSpec {
        let mut spec = KernelSpec {
            grid: Grid {
                major: op.major(),
                tile: config.tile,
                flash: Some(Flash {
                    inner: config.inner,
                    rows_per_thread: config.rows_per_thread,
                }),
                matrix: config.matrix,
                pack_heads: false,
                ragged: false,
                subgroups: config.subgroups,
            },
            workgroup_size: config.workgroup_size,
            ..KernelSpec::standard(name, op, head_dim, masks)
        };
        spec.fit_target();
        spec
    }
}
