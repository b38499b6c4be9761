//! A compiled kernel, created from any [`KernelAbi`] (the runtime's own family, a user's
//! `attention_kernel!`, or one compiled at run time), bound by binding name.

use attn_dsl::{Access, KernelAbi};

use crate::device::{Compiled, Gpu};
use crate::dispatch::recorder::Record;
use crate::error::Error;
use crate::tensor::TensorError;

/// Cloning shares the pipeline.
#[derive(Clone)]
pub struct Kernel {
    abi: std::sync::Arc<KernelAbi>,
    layout: wgpu::BindGroupLayout,
    pipeline: wgpu::ComputePipeline,
}

impl Kernel {
    /// Creates the pipeline; wgpu's validation errors come back as [`Error::Pipeline`]
    /// (awaited: a browser reports them through a promise).
    /// A kernel this device already compiled (for any op) is not compiled again.
    pub async fn new(gpu: &Gpu, abi: &KernelAbi) -> Result<Kernel, Error> {
        if let Some(kernel) = Kernel::kept(gpu, abi) {
            return Ok(kernel);
        }
        let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let kernel = Kernel::create(gpu, abi)?;
        if let Some(e) = scope.pop().await {
            return Err(Error::Pipeline {
                kernel: abi.name.to_string(),
                message: e.to_string(),
            });
        }
        gpu.keep_compiled(
            abi,
            Compiled {
                layout: kernel.layout.clone(),
                pipeline: kernel.pipeline.clone(),
            },
        );
        Ok(kernel)
    }

    fn kept(gpu: &Gpu, abi: &KernelAbi) -> Option<Kernel> {
        let Compiled { layout, pipeline } = gpu.compiled(abi)?;
        Some(Kernel {
            abi: std::sync::Arc::new(abi.clone()),
            layout,
            pipeline,
        })
    }

    /// The pipeline, created now on this thread, for an op compiling on first use inside a
    /// synchronous `record`. Natively wgpu reports a validation error at once, as
    /// [`Kernel::new`] reports it; in a browser, where that report is a promise, it goes to the
    /// device's uncaptured-error handler instead (an op's `prepare` awaits it).
    pub(crate) fn now(gpu: &Gpu, abi: &KernelAbi) -> Result<Kernel, Error> {
        #[cfg(not(target_arch = "wasm32"))]
        return crate::device::block_on(Kernel::new(gpu, abi));
        #[cfg(target_arch = "wasm32")]
        return Kernel::kept(gpu, abi).map_or_else(|| Kernel::create(gpu, abi), Ok);
    }

    /// The pipeline, errors left to the caller's error scope.
    fn create(gpu: &Gpu, abi: &KernelAbi) -> Result<Kernel, Error> {
        if !gpu.supports(abi) {
            return Err(Error::Feature {
                kernel: abi.name.to_string(),
                adapter: gpu.describe(),
            });
        }
        // Over a limit: wgpu would report it as a validation error, or panic without a scope.
        gpu.require(abi)?;
        let device = &gpu.device;
        let label = Some(abi.name.as_ref());
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label,
            entries: &layout_entries(abi),
        });
        let desc = wgpu::ShaderModuleDescriptor {
            label,
            source: wgpu::ShaderSource::Wgsl(abi.wgsl.clone()),
        };
        // SAFETY: wgpu's default checks minus loop bounding (or none, when the user opted
        // out with Gpu::unchecked). Index clamping stays on by default. Loop bounding, a
        // counter naga adds to every loop so that a shader cannot spin forever, is left off
        // for attn-dsl kernels whose loops are all counted (`for` over a bound computed from
        // constants and dims: each terminates); only the compare-exchange scatter has an
        // open `loop`, and it keeps the counter. Measured on an H100, the counters cost a
        // quarter to a half of the flash kernels' time. With Gpu::unchecked the kernels
        // also lose index clamping: they bound their own indices by construction and the
        // runtime validates lengths before every dispatch.
        let checks = if gpu.runtime_checks() {
            wgpu::ShaderRuntimeChecks {
                force_loop_bounding: has_open_loop(abi),
                ..wgpu::ShaderRuntimeChecks::checked()
            }
        } else {
            wgpu::ShaderRuntimeChecks::unchecked()
        };
        let module = unsafe { device.create_shader_module_trusted(desc, checks) };
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label,
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label,
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some(&abi.entry_point),
            compilation_options: Default::default(),
            #[cfg(not(target_arch = "wasm32"))]
            cache: gpu.wgpu_pipeline_cache(),
            #[cfg(target_arch = "wasm32")]
            cache: None,
        });
        gpu.pipeline_created();
        Ok(Kernel {
            abi: std::sync::Arc::new(abi.clone()),
            layout,
            pipeline,
        })
    }

    /// The ABI it was compiled from: its bindings, grid and specialization.
    pub fn abi(&self) -> &KernelAbi {
        &self.abi
    }

    /// The kernel's name, as its ABI gives it.
    pub fn name(&self) -> &str {
        &self.abi.name
    }

    pub(crate) fn layout(&self) -> &wgpu::BindGroupLayout {
        &self.layout
    }

    pub(crate) fn pipeline(&self) -> &wgpu::ComputePipeline {
        &self.pipeline
    }

    /// Records one dispatch of `grid` workgroups with `buffers` bound by binding name.
    /// Every binding of the kernel must be given.
    pub fn record(
        &self,
        gpu: &Gpu,
        encoder: &mut impl Record,
        buffers: &[(&str, &wgpu::Buffer)],
        grid: [u32; 3],
    ) -> Result<(), Error> {
        let group = self.group(gpu, buffers)?;
        encoder.recorder(|rec| self.dispatch(rec.pass(&self.abi.name), &group, grid));
        Ok(())
    }

    /// [`Kernel::record`], with the pass's start and end written to timestamp queries.
    pub fn record_timed(
        &self,
        gpu: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        buffers: &[(&str, &wgpu::Buffer)],
        grid: [u32; 3],
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) -> Result<(), Error> {
        let group = self.group(gpu, buffers)?;
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(&self.abi.name),
            timestamp_writes: timestamps,
        });
        self.dispatch(&mut pass, &group, grid);
        Ok(())
    }

    fn dispatch(&self, pass: &mut wgpu::ComputePass<'_>, group: &wgpu::BindGroup, grid: [u32; 3]) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, group, &[]);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
    }

    /// A bind group of `buffers` by binding name, every binding given.
    fn group(
        &self,
        gpu: &Gpu,
        buffers: &[(&str, &wgpu::Buffer)],
    ) -> Result<wgpu::BindGroup, Error> {
        let entries = self
            .abi
            .bindings
            .iter()
            .map(|b| {
                let (_, buffer) = buffers
                    .iter()
                    .find(|(name, _)| *name == b.name)
                    .ok_or_else(|| Error::Binding {
                        kernel: self.abi.name.to_string(),
                        binding: b.name.to_string(),
                    })?;
                Ok(wgpu::BindGroupEntry {
                    binding: b.binding,
                    resource: buffer.as_entire_binding(),
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(bind_group(gpu, &self.abi.name, &self.layout, &entries)?)
    }
}

/// A bind group of `entries` for kernel `name`, made under an error scope where the
/// platform reports at once (native): what the runtime's checks cannot see, a destroyed
/// buffer, is a typed error before anything is recorded instead of wgpu's panic (or, with
/// an uncaptured-error handler, an encoder that no longer submits).
pub(crate) fn bind_group(
    gpu: &Gpu,
    name: &str,
    layout: &wgpu::BindGroupLayout,
    entries: &[wgpu::BindGroupEntry],
) -> Result<wgpu::BindGroup, TensorError> {
    #[cfg(not(target_arch = "wasm32"))]
    let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(name),
        layout,
        entries,
    });
    #[cfg(not(target_arch = "wasm32"))]
    if let Some(e) = crate::device::block_on(scope.pop()) {
        return Err(TensorError::Unbindable {
            kernel: name.to_string(),
            message: e.to_string(),
        });
    }
    Ok(group)
}

/// Whether `abi` has a loop without a counted bound: the compare-exchange retry loop of a
/// CAS scatter.
fn has_open_loop(abi: &KernelAbi) -> bool {
    abi.bindings
        .iter()
        .any(|b| b.wgsl_type.contains("atomic<u32>"))
}

/// The bind-group layout of `abi`, in binding order.
pub fn layout_entries(abi: &KernelAbi) -> Vec<wgpu::BindGroupLayoutEntry> {
    abi.bindings
        .iter()
        .map(|b| wgpu::BindGroupLayoutEntry {
            binding: b.binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: match b.access {
                    Access::Read => wgpu::BufferBindingType::Storage { read_only: true },
                    Access::ReadWrite => wgpu::BufferBindingType::Storage { read_only: false },
                    Access::Uniform => wgpu::BufferBindingType::Uniform,
                },
                has_dynamic_offset: false,
                min_binding_size: match b.access {
                    Access::Uniform => wgpu::BufferSize::new(b.uniform_size()),
                    _ => None,
                },
            },
            count: None,
        })
        .collect()
}

/// One dispatch: a kernel, its buffers by binding name, and its grid.
pub struct Step<'a> {
    /// The kernel dispatched.
    pub kernel: &'a Kernel,
    /// A buffer for each of its bindings, by the binding's name.
    pub bound: Vec<(&'a str, &'a wgpu::Buffer)>,
    /// Workgroups to dispatch along x, y and z.
    pub grid: [u32; 3],
}
