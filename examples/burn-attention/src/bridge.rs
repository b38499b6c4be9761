//! Burn tensors seen by our runtime without a copy: the wgpu buffer and byte offset behind
//! a Burn wgpu tensor, wrapped with `runtime::Tensor::wrap`.
//!
//! The path: `Tensor::try_into_primitive::<Cube>()` (Burn's `extension` feature) gives the
//! `CubeTensor`, whose `client.get_resource::<WgpuServer<AutoCompiler>>(handle)` gives a
//! `ManagedResource<WgpuResource>`: the `wgpu::Buffer`, the byte offset of the tensor in it
//! and its size. Holding the `ManagedResource` pins the allocation (cubecl neither frees,
//! reuses nor relocates it while it is held), so each [`Bound`] keeps it.
//!
//! Where a tensor cannot be bound in place (an offset the device cannot bind, or an output
//! that shares its buffer with another tensor of the same dispatch, which the runtime
//! refuses as `TensorError::Aliased`), it is staged: the kernels use a runtime-owned buffer,
//! and a `copy_buffer_to_buffer` in the same encoder moves the bytes in (inputs) or back
//! out (outputs). Every staging is reported.

use std::any::Any;

use anyhow::{Result, anyhow, bail, ensure};
use burn::backend::Cube;
use burn::backend::wgpu::AutoCompiler;
use burn::cubecl::wgpu::WgpuServer;
use burn::tensor::{DType, Tensor};
use runtime::{Gpu, Scalar, TensorError};

/// Where a Burn tensor's bytes are.
pub struct Region {
    pub buffer: wgpu::Buffer,
    pub offset: u64,
    pub bytes: u64,
    pub shape: Vec<u32>,
    /// The `ManagedResource<WgpuResource>`: keeps the allocation in place while held.
    _pin: Box<dyn Any>,
}

/// The buffer and offset behind `t`, an f32 row-major tensor on a Burn wgpu device (no
/// autodiff: call `.inner()` first on an autodiff tensor).
pub fn region<const D: usize>(t: &Tensor<D>) -> Result<Region> {
    let prim = t
        .clone()
        .try_into_primitive::<Cube>()
        .map_err(|e| anyhow!("not a Burn cubecl tensor: {e:?}"))?;
    ensure!(
        prim.dtype == DType::F32,
        "the tensor holds {:?}, not f32",
        prim.dtype
    );
    let (shape, strides) = (prim.meta.shape(), prim.meta.strides());
    ensure!(
        !prim.meta.is_tiled() && row_major(shape, strides),
        "the tensor is not row-major (shape {:?}, strides {:?}); our kernels read \
         contiguous [batch, seq, heads, head_dim]",
        &shape[..],
        &strides[..]
    );
    let dims = shape
        .iter()
        .map(|d| u32::try_from(*d))
        .collect::<Result<Vec<u32>, _>>()?;
    let managed = prim
        .client
        .get_resource::<WgpuServer<AutoCompiler>>(prim.handle.clone())
        .map_err(|e| anyhow!("cubecl would not hand out the tensor's buffer: {e}"))?;
    let res = managed.resource();
    let bytes = 4 * shape.iter().product::<usize>() as u64;
    ensure!(
        res.size >= bytes,
        "the resource holds {} bytes, the tensor {bytes}",
        res.size
    );
    Ok(Region {
        buffer: res.buffer.clone(),
        offset: res.offset,
        bytes,
        shape: dims,
        _pin: Box::new(managed),
    })
}

fn row_major(shape: &[usize], strides: &[usize]) -> bool {
    let mut expect = 1;
    for (d, s) in shape.iter().zip(strides).rev() {
        if *d != 1 && *s != expect {
            return false;
        }
        expect *= d;
    }
    true
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Input,
    Output,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// The kernels read or write the Burn tensor's own bytes.
    InPlace,
    /// Through a runtime-owned buffer and a copy.
    Staged(&'static str),
}

pub struct Bound {
    pub name: &'static str,
    pub role: Role,
    pub region: Region,
    /// What the kernels bind: a view of the Burn buffer, or the staging buffer.
    pub tensor: runtime::Tensor,
    pub placement: Placement,
}

/// The tensors of one dispatch (or of one encoder's dispatches), bound.
pub struct Binding {
    pub bound: Vec<Bound>,
}

impl Binding {
    /// Wraps each tensor's region, in place where the runtime can bind it, staged where not.
    pub fn new(gpu: &Gpu, regions: Vec<(&'static str, Role, Region)>) -> Result<Binding> {
        let mut bound = Vec::with_capacity(regions.len());
        for (i, (name, role, region)) in regions.iter().enumerate() {
            // An output sharing its buffer with any other tensor bound next to it.
            let shared = *role == Role::Output
                && regions
                    .iter()
                    .enumerate()
                    .any(|(j, (_, _, other))| j != i && other.buffer == region.buffer);
            let wrapped = runtime::Tensor::wrap(
                gpu,
                &region.buffer,
                region.offset,
                &region.shape,
                Scalar::F32,
            );
            let (tensor, placement) = match (wrapped, shared) {
                (Ok(t), false) => (t, Placement::InPlace),
                (Ok(_), true) => (
                    runtime::Tensor::zeros(gpu, &region.shape, Scalar::F32)?,
                    Placement::Staged("shares its buffer with another tensor of the dispatch"),
                ),
                (Err(TensorError::Alignment { .. }), _) => (
                    runtime::Tensor::zeros(gpu, &region.shape, Scalar::F32)?,
                    Placement::Staged("offset not aligned for a storage binding"),
                ),
                (Err(e), _) => bail!("`{name}`: {e}"),
            };
            bound.push((tensor, placement));
        }
        Ok(Binding {
            bound: regions
                .into_iter()
                .zip(bound)
                .map(|((name, role, region), (tensor, placement))| Bound {
                    name,
                    role,
                    region,
                    tensor,
                    placement,
                })
                .collect(),
        })
    }

    pub fn get(&self, name: &str) -> &runtime::Tensor {
        &self
            .bound
            .iter()
            .find(|b| b.name == name)
            .unwrap_or_else(|| panic!("no tensor `{name}` bound"))
            .tensor
    }

    /// Copies staged inputs into their staging buffers (record before the dispatches).
    pub fn record_in(&self, encoder: &mut wgpu::CommandEncoder) {
        for b in self.staged(Role::Input) {
            encoder.copy_buffer_to_buffer(
                &b.region.buffer,
                b.region.offset,
                b.tensor.buffer(),
                0,
                b.region.bytes,
            );
        }
    }

    /// Copies staged outputs back into the Burn tensors (record after the dispatches).
    pub fn record_out(&self, encoder: &mut wgpu::CommandEncoder) {
        for b in self.staged(Role::Output) {
            encoder.copy_buffer_to_buffer(
                b.tensor.buffer(),
                0,
                &b.region.buffer,
                b.region.offset,
                b.region.bytes,
            );
        }
    }

    fn staged(&self, role: Role) -> impl Iterator<Item = &Bound> {
        self.bound
            .iter()
            .filter(move |b| b.role == role && b.placement != Placement::InPlace)
    }
}
