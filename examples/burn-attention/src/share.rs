//! One wgpu device for Burn and for our runtime, made either way round:
//!
//! - [`Owner::Burn`]: Burn acquires the device (`Device::wgpu_options().init_with_setup()`,
//!   which hands back the `WgpuSetup` it registered) and our runtime attaches to it with
//!   `Gpu::from_wgpu`.
//! - [`Owner::Ours`]: we create the instance, adapter, device and queue, and register them
//!   with Burn (`Device::wgpu_options().setup(WgpuSetup { .. }).init()`).
//!
//! Either way both sides hold clones of the same `wgpu::Device` and `wgpu::Queue`: one
//! wgpu crate instance (burn's `wgpu` re-export is our `wgpu = "=30.0.1"`, or this would not
//! compile), one device, one queue, so submissions of both are ordered.

use anyhow::{Context, Result, anyhow};
use burn::backend::wgpu::{MemoryConfiguration, WgpuSetup};
use burn::tensor::Device;
use runtime::Gpu;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Owner {
    /// Burn creates the device; the runtime attaches with `Gpu::from_wgpu`.
    Burn,
    /// We create the device; Burn registers it as an existing `WgpuSetup`.
    Ours,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Memory {
    /// Burn's default pool: small allocations sliced from shared pages, larger ones carved
    /// from pages sized to the largest allocation so far.
    Adaptive,
    /// One page (one wgpu buffer) per allocation.
    Exclusive,
}

impl Memory {
    fn config(self) -> MemoryConfiguration {
        match self {
            Memory::Adaptive => MemoryConfiguration::default(),
            Memory::Exclusive => MemoryConfiguration::ExclusivePages,
        }
    }
}

pub struct Shared {
    /// Burn's handle on the device (no autodiff; `.autodiff()` gives the autodiff one).
    pub device: Device,
    pub gpu: Gpu,
    pub adapter: wgpu::AdapterInfo,
}

pub fn share(owner: Owner, memory: Memory) -> Result<Shared> {
    match owner {
        Owner::Burn => {
            let (device, setup) = Device::wgpu_options()
                .memory_config(memory.config())
                .init_with_setup()
                .map_err(|e| anyhow!("Burn could not set up wgpu: {e}"))?;
            let adapter = setup.adapter.get_info();
            let gpu = Gpu::from_wgpu(&setup.adapter, setup.device, setup.queue, [])
                .context("the runtime on Burn's device")?;
            Ok(Shared {
                device,
                gpu,
                adapter,
            })
        }
        Owner::Ours => {
            let backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::PRIMARY);
            let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
                backends,
                ..wgpu::InstanceDescriptor::new_without_display_handle_from_env()
            });
            let mut adapters = pollster::block_on(instance.enumerate_adapters(backends));
            adapters.sort_by_key(|a| rank(a.get_info().device_type));
            let adapter = adapters
                .into_iter()
                .next()
                .ok_or_else(|| anyhow!("no adapter for backends {backends:?}"))?;
            // What Burn's own WGSL device request takes: every adapter feature but mappable
            // primary buffers, and the adapter's limits. cubecl reads the *adapter's* features
            // (f16, i64, f64, timestamps) to decide what its kernels may use, so a device with
            // fewer features than its adapter would get kernels it cannot compile.
            let desc = wgpu::DeviceDescriptor {
                label: Some("burn-attention shared device"),
                required_features: adapter
                    .features()
                    .difference(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS),
                required_limits: adapter.limits(),
                memory_hints: wgpu::MemoryHints::MemoryUsage,
                trace: wgpu::Trace::Off,
                // SAFETY: as Burn's own request. The experimental features the adapter offers
                // (cooperative matrices, passthrough shaders) are used only by the runtime's
                // `matrix = coop16` kernels where it found the exact product they need, and by
                // cubecl's native compilers, which this build does not enable.
                experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
            };
            let (device, queue) = pollster::block_on(adapter.request_device(&desc))
                .context("requesting the shared device")?;
            let info = adapter.get_info();
            let setup = WgpuSetup {
                instance,
                adapter: adapter.clone(),
                device: device.clone(),
                queue: queue.clone(),
                backend: info.backend,
            };
            let burn_device = Device::wgpu_options()
                .setup(setup)
                .memory_config(memory.config())
                .init()
                .map_err(|e| anyhow!("Burn refused our device: {e}"))?;
            let gpu =
                Gpu::from_wgpu(&adapter, device, queue, []).context("the runtime on our device")?;
            Ok(Shared {
                device: burn_device,
                gpu,
                adapter: info,
            })
        }
    }
}

/// As the runtime's adapter choice: a discrete GPU, else any GPU, else a CPU adapter.
fn rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}
