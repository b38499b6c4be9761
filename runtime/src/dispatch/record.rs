//! Recording one dispatch into the caller's encoder: a kernel's bindings resolved by name
//! to device tensors and uniform contents, every tensor checked against its binding
//! (element type, bounds, usage, alignment, aliasing) before anything is recorded, the
//! bind group made once per set of buffers and reused.

use attn_dsl::{Access, Binding, KernelAbi};

use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::dispatch::recorder::Recorder;
use crate::error::{Error, InputError};
use crate::modifiers::scalar_name;
use crate::tensor::{Tensor, TensorError};

/// Bind groups kept per kernel: an op alternates between a few sets of buffers (a layer
/// stack's layers, a cache's two length buffers), and each group keeps its buffers alive.
const GROUPS: usize = 8;

/// A dispatch: the tensors bound by name, the uniform fields by name (fields not given
/// are 0), and the grid.
pub(crate) struct Dispatch<'a> {
    pub tensors: Vec<(&'a str, &'a Tensor)>,
    pub dims: Vec<(&'a str, u32)>,
    pub params: Vec<(&'a str, f32)>,
}

impl<'a> Dispatch<'a> {
    pub fn new(tensors: Vec<(&'a str, &'a Tensor)>) -> Dispatch<'a> {
        Dispatch {
            tensors,
            dims: Vec::new(),
            params: Vec::new(),
        }
    }

    fn tensor(&self, name: &str) -> Option<&'a Tensor> {
        self.tensors
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| *t)
    }
}

/// A bind group with the (buffer, offset, size) of each binding, by which it is reused.
type CachedGroup = (Vec<(wgpu::Buffer, u64, u64)>, wgpu::BindGroup);

/// The pipelines of one op's kernel at each rows-per-workgroup its planner has picked, each
/// compiled on the first call that picks it.
#[derive(Default)]
pub(crate) struct ByTile {
    pipelines: Vec<(u32, Pipeline)>,
}

impl ByTile {
    /// The pipeline of `tile`, compiled by `compile` where no call has picked it yet.
    pub fn get(
        &mut self,
        tile: u32,
        compile: impl FnOnce() -> Result<Kernel, Error>,
    ) -> Result<&mut Pipeline, Error> {
        let at = match self.pipelines.iter().position(|(t, _)| *t == tile) {
            Some(at) => at,
            None => {
                self.pipelines.push((tile, Pipeline::new(compile()?)));
                self.pipelines.len() - 1
            }
        };
        Ok(&mut self.pipelines[at].1)
    }
}

/// A compiled kernel with the bind groups of its recent calls.
pub(crate) struct Pipeline {
    kernel: Kernel,
    /// Most recently used last.
    groups: Vec<CachedGroup>,
}

impl Pipeline {
    pub fn new(kernel: Kernel) -> Pipeline {
        Pipeline {
            kernel,
            groups: Vec::new(),
        }
    }

    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    pub fn abi(&self) -> &KernelAbi {
        self.kernel.abi()
    }

    /// Checks `d` against the kernel and records it with `grid` into `rec`'s pass.
    pub fn record(
        &mut self,
        gpu: &Gpu,
        rec: &mut Recorder,
        d: &Dispatch,
        grid: [u32; 3],
    ) -> Result<(), Error> {
        self.record_timed(gpu, rec, d, grid, None)
    }

    /// Checks `d` and `grid` as [`Pipeline::record`] does, recording nothing; the result
    /// records without failing ([`Pipeline::record_checked`]). For an op that changes its
    /// own state before recording, so that a refused call changes none.
    pub fn check(&self, gpu: &Gpu, d: &Dispatch, grid: [u32; 3]) -> Result<Checked, Error> {
        check_grid(gpu, grid)?;
        let ranges = self.resolve(gpu, d)?;
        let group = match self.cached(&ranges) {
            Some(group) => group,
            None => self.create_group(gpu, &ranges)?,
        };
        Ok(Checked {
            ranges,
            group,
            grid,
        })
    }

    /// Records a dispatch [`Pipeline::check`] accepted.
    pub fn record_checked(&mut self, rec: &mut Recorder, checked: Checked) {
        self.encode(rec, &checked, None);
    }

    /// Into `rec`'s open pass, or with `timestamps` into a pass of its own.
    fn encode(
        &mut self,
        rec: &mut Recorder,
        checked: &Checked,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) {
        self.remember(&checked.ranges, &checked.group);
        let name = &self.kernel.abi().name;
        let dispatch = |pass: &mut wgpu::ComputePass<'_>| {
            pass.set_pipeline(self.kernel.pipeline());
            pass.set_bind_group(0, &checked.group, &[]);
            let [x, y, z] = checked.grid;
            pass.dispatch_workgroups(x, y, z);
        };
        match timestamps {
            None => dispatch(rec.pass(name)),
            Some(writes) => dispatch(&mut rec.encoder().begin_compute_pass(
                &wgpu::ComputePassDescriptor {
                    label: Some(name),
                    timestamp_writes: Some(writes),
                },
            )),
        }
    }

    /// [`Pipeline::record`] with the dispatch's start and end written to timestamp queries
    /// (in a pass of its own).
    pub fn record_timed(
        &mut self,
        gpu: &Gpu,
        rec: &mut Recorder,
        d: &Dispatch,
        grid: [u32; 3],
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) -> Result<(), Error> {
        let checked = self.check(gpu, d, grid)?;
        self.encode(rec, &checked, timestamps);
        Ok(())
    }

    /// Every binding's buffer range, in binding order: tensors checked, uniforms filled.
    fn resolve(&self, gpu: &Gpu, d: &Dispatch) -> Result<Vec<(wgpu::Buffer, u64, u64)>, Error> {
        let abi = self.kernel.abi();
        let mut out = Vec::with_capacity(abi.bindings.len());
        for b in abi.bindings.iter() {
            let range = match b.access {
                Access::Uniform => {
                    let bytes = uniform_bytes(b, d);
                    let size = bytes.len() as u64;
                    (gpu.uniform(&bytes), 0, size)
                }
                _ if b.name == "flex_reads" => {
                    let report = gpu.read_report().ok_or_else(|| Error::Binding {
                        kernel: abi.name.to_string(),
                        binding: b.name.to_string(),
                    })?;
                    (report.bind(abi).clone(), 0, 4 * crate::device::REPORT_WORDS)
                }
                _ => {
                    let t = d.tensor(&b.name).ok_or_else(|| Error::Binding {
                        kernel: abi.name.to_string(),
                        binding: b.name.to_string(),
                    })?;
                    check_tensor(gpu, b, t)?;
                    (t.buffer().clone(), t.offset(), t.binding_bytes())
                }
            };
            out.push(range);
        }
        check_aliasing(abi, &out)?;
        Ok(out)
    }

    /// The bind group of a recent call with these buffer ranges.
    fn cached(&self, key: &[(wgpu::Buffer, u64, u64)]) -> Option<wgpu::BindGroup> {
        let found = self.groups.iter().find(|(k, _)| k == key);
        found.map(|(_, group)| group.clone())
    }

    /// `group` kept as the most recent of `key` (the oldest dropped past [`GROUPS`]).
    fn remember(&mut self, key: &[(wgpu::Buffer, u64, u64)], group: &wgpu::BindGroup) {
        match self.groups.iter().position(|(k, _)| k == key) {
            Some(i) => {
                let entry = self.groups.remove(i);
                self.groups.push(entry);
            }
            None => {
                if self.groups.len() >= GROUPS {
                    self.groups.remove(0);
                }
                self.groups.push((key.to_vec(), group.clone()));
            }
        }
    }

    /// A bind group of `key` ([`super::kernel::bind_group`]: a buffer the device refuses
    /// is a typed error).
    fn create_group(
        &self,
        gpu: &Gpu,
        key: &[(wgpu::Buffer, u64, u64)],
    ) -> Result<wgpu::BindGroup, TensorError> {
        let abi = self.kernel.abi();
        let entries: Vec<_> = abi
            .bindings
            .iter()
            .zip(key)
            .map(|(b, (buffer, offset, size))| wgpu::BindGroupEntry {
                binding: b.binding,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer,
                    offset: *offset,
                    size: wgpu::BufferSize::new(*size),
                }),
            })
            .collect();
        super::kernel::bind_group(gpu, &abi.name, self.kernel.layout(), &entries)
    }
}

/// A dispatch checked against its pipeline: every binding's buffer range and the grid.
pub struct Checked {
    ranges: Vec<(wgpu::Buffer, u64, u64)>,
    group: wgpu::BindGroup,
    grid: [u32; 3],
}

/// The uniform block `b` filled from `d` by field name.
fn uniform_bytes(b: &Binding, d: &Dispatch) -> Vec<u8> {
    let find = |values: &[(&str, u32)], field: &str| {
        values
            .iter()
            .find(|(n, _)| *n == field)
            .map_or(0, |(_, v)| *v)
    };
    let params: Vec<(&str, u32)> = d.params.iter().map(|(n, v)| (*n, v.to_bits())).collect();
    let values = match b.name.as_ref() {
        "dims" => &d.dims[..],
        _ => &params[..],
    };
    b.fields
        .iter()
        .flat_map(|field| find(values, field).to_le_bytes())
        .collect()
}

/// The tensor's element type against the binding's, and its range against the device.
fn check_tensor(gpu: &Gpu, b: &Binding, t: &Tensor) -> Result<(), TensorError> {
    if t.scalar() != b.scalar {
        return Err(TensorError::Dtype {
            name: b.name.to_string(),
            got: scalar_name(t.scalar()),
            want: scalar_name(b.scalar),
        });
    }
    t.check_binding(gpu, &b.name)
}

/// The caller's tensors of an op checked before the op records anything: each tensor a
/// kernel binds by its name as [`Pipeline::check`] checks it (element type, device,
/// bounds, usage, alignment), and each the op writes (`written`, by name) sharing its
/// buffer with no other tensor of the call, whichever of the op's kernels binds them. For
/// ops that record work of their own first (an append before the attention over it,
/// clears before a backward) or choose their kernels as they record, so that a refused
/// call leaves the caller's tensors and the op's state as they were.
pub(crate) fn check_given(
    gpu: &Gpu,
    abis: &[&KernelAbi],
    given: &[(&str, &Tensor)],
    written: &[&str],
) -> Result<(), TensorError> {
    let bindings = abis.iter().flat_map(|abi| abi.bindings.iter());
    for b in bindings.filter(|b| b.access != Access::Uniform) {
        if let Some((_, t)) = given.iter().find(|(n, _)| *n == b.name) {
            check_tensor(gpu, b, t)?;
        }
    }
    for (name, t) in given.iter().filter(|(n, _)| written.contains(n)) {
        let other = given
            .iter()
            .find(|(n, u)| n != name && u.buffer() == t.buffer());
        if let Some((other, _)) = other {
            return Err(TensorError::Aliased {
                name: name.to_string(),
                other: other.to_string(),
            });
        }
    }
    Ok(())
}

/// A binding the kernel writes may share its buffer with no other binding: WebGPU refuses
/// a buffer bound read-write and bound again in one dispatch.
fn check_aliasing(abi: &KernelAbi, ranges: &[(wgpu::Buffer, u64, u64)]) -> Result<(), TensorError> {
    for (i, b) in abi.bindings.iter().enumerate() {
        if b.access != Access::ReadWrite {
            continue;
        }
        let other = abi
            .bindings
            .iter()
            .zip(ranges)
            .enumerate()
            .find(|(j, (_, r))| *j != i && r.0 == ranges[i].0);
        if let Some((_, (o, _))) = other {
            return Err(TensorError::Aliased {
                name: b.name.to_string(),
                other: o.name.to_string(),
            });
        }
    }
    Ok(())
}

/// Each grid dimension within the device's limit.
fn check_grid(gpu: &Gpu, grid: [u32; 3]) -> Result<(), InputError> {
    let limit = gpu.limits().max_compute_workgroups_per_dimension;
    match grid.iter().find(|g| **g > limit) {
        Some(&g) => Err(InputError::OverLimit {
            what: "workgroups in one grid dimension",
            value: g.into(),
            limit: limit.into(),
        }),
        None => Ok(()),
    }
}
