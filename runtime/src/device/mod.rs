//! The device layer: the context every op records against ([`Gpu`]), built on an adapter
//! the runtime picks or on the caller's own wgpu device, with what each kernel needs
//! checked against what the device has; its uniform cache and its pipeline cache.

mod compiled;
#[cfg(not(target_arch = "wasm32"))]
mod pipeline_cache;
mod reads;
mod uniforms;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use attn_dsl::KernelAbi;

use crate::error::Error;

pub(crate) use compiled::Compiled;
use compiled::CompiledPipelines;
#[cfg(not(target_arch = "wasm32"))]
pub use pipeline_cache::{PIPELINE_CACHE_ENV, PipelineCacheFile, default_pipeline_cache_dir};
use uniforms::UniformCache;

pub use crate::error::{DeviceError, OutOfRange};
pub(crate) use reads::{REPORT_WORDS, ReadReport};

/// When a pipeline was last created on any device of this process: GPU timing waits for
/// the spin-up after a batch of pipeline creations to pass.
#[cfg(not(target_arch = "wasm32"))]
static LAST_PIPELINE: Mutex<Option<std::time::Instant>> = Mutex::new(None);

/// Milliseconds since the process last created a pipeline (infinite if it never did).
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn since_last_pipeline_ms() -> f64 {
    LAST_PIPELINE
        .lock()
        .ok()
        .and_then(|t| t.map(|t| t.elapsed().as_secs_f64() * 1e3))
        .unwrap_or(f64::INFINITY)
}

/// Runs a future to completion on this thread: the one blocking shim over the async API
/// (native only; a browser awaits).
#[cfg(not(target_arch = "wasm32"))]
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    pollster::block_on(future)
}

/// Whether the device takes all the workgroup memory and storage buffers the adapter has.
/// Natively it does, so that flash configurations tuned for the adapter can run. In a
/// browser the device keeps WebGPU's defaults (raised only to what the kernels need), so
/// that exactly the portable (`target: webgpu`) kernels fit: what every browser runs and
/// what Tint checks in CI.
const RAISE_TO_ADAPTER: bool = cfg!(not(target_arch = "wasm32"));

/// What a set of kernels asks of a device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Requirements {
    /// The most storage buffers one kernel binds.
    pub storage_buffers_per_stage: u32,
    /// The most uniform buffers one kernel binds.
    pub uniform_buffers_per_stage: u32,
    /// The most workgroup memory one kernel declares, in bytes.
    pub workgroup_storage_bytes: u32,
    /// The largest workgroup of any kernel, in invocations.
    pub invocations_per_workgroup: u32,
}

impl Requirements {
    /// The most that any of `kernels` needs of each limit.
    pub fn of<'a>(kernels: impl IntoIterator<Item = &'a KernelAbi>) -> Requirements {
        kernels
            .into_iter()
            .fold(Requirements::default(), |r, k| Requirements {
                storage_buffers_per_stage: r
                    .storage_buffers_per_stage
                    .max(k.storage_buffers() as u32),
                uniform_buffers_per_stage: r
                    .uniform_buffers_per_stage
                    .max(k.uniform_buffers() as u32),
                workgroup_storage_bytes: r.workgroup_storage_bytes.max(k.workgroup_storage_bytes),
                invocations_per_workgroup: r
                    .invocations_per_workgroup
                    .max(k.workgroup_size.iter().product()),
            })
    }

    /// The device limits to request: WebGPU's defaults raised to what the kernels need,
    /// and buffer sizes and workgroup memory raised to what the adapter offers, so large
    /// problems and tuned flash tiles fit.
    fn limits(&self, adapter: &wgpu::Adapter) -> Result<wgpu::Limits, DeviceError> {
        let offered = adapter.limits();
        let name = adapter.get_info().name;
        let need = |what, needed: u32, offered: u32| {
            if needed <= offered {
                Ok(needed)
            } else {
                Err(DeviceError::Limit {
                    adapter: name.clone(),
                    what,
                    needed: needed.into(),
                    offered: offered.into(),
                })
            }
        };
        let base = wgpu::Limits::default();
        Ok(wgpu::Limits {
            // As many as the adapter has (capped), for kernels compiled after the device.
            max_storage_buffers_per_shader_stage: need(
                "max_storage_buffers_per_shader_stage",
                self.storage_buffers_per_stage
                    .max(base.max_storage_buffers_per_shader_stage),
                offered.max_storage_buffers_per_shader_stage,
            )
            .map(|n| match RAISE_TO_ADAPTER {
                true => n.max(offered.max_storage_buffers_per_shader_stage.min(16)),
                false => n,
            })?,
            // All the adapter has, so that flash configurations tuned for it can run.
            max_compute_workgroup_storage_size: need(
                "max_compute_workgroup_storage_size",
                self.workgroup_storage_bytes
                    .max(base.max_compute_workgroup_storage_size),
                offered.max_compute_workgroup_storage_size,
            )
            .map(|n| match RAISE_TO_ADAPTER {
                true => offered.max_compute_workgroup_storage_size,
                false => n,
            })?,
            max_compute_invocations_per_workgroup: need(
                "max_compute_invocations_per_workgroup",
                self.invocations_per_workgroup
                    .max(base.max_compute_invocations_per_workgroup),
                offered.max_compute_invocations_per_workgroup,
            )?,
            max_compute_workgroup_size_x: need(
                "max_compute_workgroup_size_x",
                self.invocations_per_workgroup
                    .max(base.max_compute_workgroup_size_x),
                offered.max_compute_workgroup_size_x,
            )?,
            max_storage_buffer_binding_size: offered.max_storage_buffer_binding_size,
            max_buffer_size: offered.max_buffer_size,
            ..base
        })
    }
}

/// The device the runtime records on, its queue, and what it can run: a device of the
/// runtime's choosing ([`Gpu::new`]) or the caller's own ([`Gpu::from_wgpu`]).
pub struct Gpu {
    /// The wgpu device every op creates its buffers and pipelines on.
    pub device: wgpu::Device,
    /// The device's queue, which uploads and host-slice calls submit to.
    pub queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    limits: wgpu::Limits,
    features: wgpu::Features,
    /// Whether `matrix = coop16` kernels run here (see [`coop16_capable`]).
    coop16: bool,
    runtime_checks: bool,
    /// The `dims` and `params` uniforms of every op, one buffer per distinct content.
    uniforms: Mutex<UniformCache>,
    #[cfg(not(target_arch = "wasm32"))]
    pipeline_cache: Option<PipelineCacheFile>,
    /// Pipelines created on this device: compile on first use is visible in tests, and the
    /// pipeline cache is saved only when it grew.
    pipelines: AtomicU64,
    /// Tensors' buffers created here (tensors, scratch, uploads).
    buffers: AtomicU64,
    /// Every pipeline compiled here, by source: ops built again reuse them.
    compiled: CompiledPipelines,
    /// Where kernels built with [`Gpu::report_modifier_reads`] report.
    reads: Option<ReadReport>,
    /// This `Gpu`'s number among every one made in the process: a tensor made here is on
    /// its device without asking wgpu ([`crate::Tensor`]'s device check).
    token: u64,
}

/// The next [`Gpu`]'s token.
static NEXT_GPU: AtomicU64 = AtomicU64::new(0);

impl Gpu {
    /// Picks a discrete GPU, else any GPU, else a CPU adapter (lavapipe), among those that
    /// meet what `kernels` need (in a browser: the browser's adapter). `WGPU_BACKEND`
    /// (e.g. `vulkan`) narrows the backends tried. Natively, pipelines are cached on disk
    /// where the backend has a pipeline cache (Vulkan), in [`default_pipeline_cache_dir`]
    /// unless [`PIPELINE_CACHE_ENV`] says otherwise.
    pub async fn new<'a>(kernels: impl IntoIterator<Item = &'a KernelAbi>) -> Result<Gpu, Error> {
        let mut gpus = Gpu::several(1, kernels).await?;
        Ok(gpus.pop().expect("one device asked for"))
    }

    /// `count` devices, for work spread over several GPUs of one host (one sequence's keys
    /// over two GPUs, say): one on each adapter of the kind and backend [`Gpu::new`] would
    /// pick (the discrete GPUs where there are any; one backend, so that a GPU that two
    /// backends list counts once), in the order the backend lists them. Where fewer
    /// adapters meet what `kernels` need than `count`, they are taken again in turn: two
    /// devices on one adapter are independent (their own queues and memory) but share its
    /// hardware, so they test the work's split, not its speed (natively: a browser's adapter
    /// gives one device). `count` 0 gives none.
    pub async fn several<'a>(
        count: usize,
        kernels: impl IntoIterator<Item = &'a KernelAbi>,
    ) -> Result<Vec<Gpu>, Error> {
        let requirements = Requirements::of(kernels);
        let backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::PRIMARY);
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends,
            ..wgpu::InstanceDescriptor::new_without_display_handle_from_env()
        });
        let mut adapters = instance.enumerate_adapters(backends).await;
        adapters.sort_by_key(|a| rank(a.get_info().device_type));
        if count == 0 {
            return Ok(Vec::new());
        }
        let mut refusal = None;
        let mut fit: Vec<(wgpu::Adapter, wgpu::Limits)> = Vec::new();
        for adapter in adapters {
            let info = adapter.get_info();
            if let Some((first, _)) = fit.first() {
                let of = first.get_info();
                if rank(of.device_type) != rank(info.device_type) {
                    break;
                }
                if of.backend != info.backend {
                    continue;
                }
            }
            match requirements.limits(&adapter) {
                Ok(limits) => fit.push((adapter, limits)),
                Err(e) => refusal = refusal.or(Some(e)),
            }
        }
        if fit.is_empty() {
            return Err(refusal
                .unwrap_or(DeviceError::NoAdapter {
                    backends: format!("{backends:?}"),
                })
                .into());
        }
        let mut gpus = Vec::with_capacity(count);
        for (adapter, limits) in fit.iter().cycle().take(count) {
            let gpu = request(adapter.clone(), limits.clone()).await?;
            #[cfg(not(target_arch = "wasm32"))]
            let gpu = gpu.with_pipeline_cache(pipeline_cache::dir_from_env().as_deref());
            gpus.push(gpu);
        }
        Ok(gpus)
    }

    /// The runtime on the caller's own device (a Burn or Bevy app's, an inference
    /// engine's): nothing is copied, tensors are shared. The device keeps the features
    /// and limits it was created with; each of `kernels` is checked against them, and a
    /// kernel that needs more is refused with the feature or limit it lacks. Ops compiled
    /// later check their own kernels the same way. `adapter` is the one the device came
    /// from: it tells which cooperative-matrix products the hardware has.
    pub fn from_wgpu<'a>(
        adapter: &wgpu::Adapter,
        device: wgpu::Device,
        queue: wgpu::Queue,
        kernels: impl IntoIterator<Item = &'a KernelAbi>,
    ) -> Result<Gpu, Error> {
        let features = device.features();
        let coop16 = coop16_capable(adapter)
            && features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX);
        let gpu = Gpu::assemble(adapter.get_info(), device, queue, features, coop16);
        for abi in kernels {
            gpu.require(abi)?;
        }
        Ok(gpu)
    }

    fn assemble(
        info: wgpu::AdapterInfo,
        device: wgpu::Device,
        queue: wgpu::Queue,
        features: wgpu::Features,
        coop16: bool,
    ) -> Gpu {
        Gpu {
            limits: device.limits(),
            device,
            queue,
            info,
            features,
            coop16,
            runtime_checks: true,
            uniforms: Mutex::new(UniformCache::default()),
            #[cfg(not(target_arch = "wasm32"))]
            pipeline_cache: None,
            pipelines: AtomicU64::new(0),
            buffers: AtomicU64::new(0),
            compiled: CompiledPipelines::default(),
            reads: None,
            token: NEXT_GPU.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// This `Gpu`'s number in the process (see the field).
    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    pub(crate) fn pipeline_created(&self) {
        self.pipelines.fetch_add(1, Ordering::Relaxed);
        #[cfg(not(target_arch = "wasm32"))]
        if let Ok(mut t) = LAST_PIPELINE.lock() {
            *t = Some(std::time::Instant::now());
        }
    }

    /// Compute pipelines created on this device so far (ops compile on first use; a
    /// kernel another op already compiled here is not compiled again).
    pub fn pipelines_created(&self) -> u64 {
        self.pipelines.load(Ordering::Relaxed)
    }

    /// Tensor buffers created on this device so far (the caller's tensors, the ops'
    /// scratch and uploads): flat in an engine's steady state, where each created buffer
    /// would cost an allocation and a bind group per call.
    pub fn buffers_created(&self) -> u64 {
        self.buffers.load(Ordering::Relaxed)
    }

    pub(crate) fn count_buffer(&self) {
        self.buffers.fetch_add(1, Ordering::Relaxed);
    }

    /// The pipeline this device compiled for `abi` under its current runtime checks.
    pub(crate) fn compiled(&self, abi: &KernelAbi) -> Option<Compiled> {
        self.compiled.get(abi, self.runtime_checks)
    }

    /// Keeps a validated pipeline for the ops built later.
    pub(crate) fn keep_compiled(&self, abi: &KernelAbi, compiled: Compiled) {
        self.compiled.insert(abi, self.runtime_checks, compiled);
    }

    /// Distinct pipelines kept on this device.
    pub fn pipelines_kept(&self) -> usize {
        self.compiled.len()
    }

    /// Uniform buffers created so far: flat once every shape in use has been seen.
    pub fn uniforms_created(&self) -> u64 {
        self.uniforms
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .created()
    }

    /// Whether this device can run `abi`: every feature it needs, and its storage
    /// buffers, uniform buffers, workgroup memory and invocations within the limits the
    /// device was created with. The error names the first that is missing.
    pub fn require(&self, abi: &KernelAbi) -> Result<(), Error> {
        let kernel = || abi.name.to_string();
        let adapter_features = self.features;
        let missing = [
            (
                abi.f32_atomics,
                wgpu::Features::SHADER_FLOAT32_ATOMIC,
                "SHADER_FLOAT32_ATOMIC",
            ),
            (
                abi.grid.uses_subgroups(),
                wgpu::Features::SUBGROUP,
                "SUBGROUP",
            ),
            (abi.uses_f16(), wgpu::Features::SHADER_F16, "SHADER_F16"),
            (
                abi.binding("arrivals").is_some(),
                wgpu::Features::MEMORY_DECORATION_COHERENT,
                "MEMORY_DECORATION_COHERENT",
            ),
        ]
        .into_iter()
        .find(|(needed, feature, _)| *needed && !adapter_features.contains(*feature));
        if let Some((_, _, feature)) = missing {
            return Err(DeviceError::MissingFeature {
                kernel: kernel(),
                feature,
            }
            .into());
        }
        if abi.grid.uses_coop() && !self.coop16 {
            return Err(DeviceError::MissingFeature {
                kernel: kernel(),
                feature: "EXPERIMENTAL_COOPERATIVE_MATRIX (f16 16x16x16 products, f32 \
                          accumulators, subgroups of 32)",
            }
            .into());
        }
        let needs = Requirements::of([abi]);
        let l = &self.limits;
        for (what, needed, has) in [
            (
                "max_storage_buffers_per_shader_stage",
                needs.storage_buffers_per_stage,
                l.max_storage_buffers_per_shader_stage,
            ),
            (
                "max_uniform_buffers_per_shader_stage",
                needs.uniform_buffers_per_stage,
                l.max_uniform_buffers_per_shader_stage,
            ),
            (
                "max_compute_workgroup_storage_size",
                needs.workgroup_storage_bytes,
                l.max_compute_workgroup_storage_size,
            ),
            (
                "max_compute_invocations_per_workgroup",
                needs.invocations_per_workgroup,
                l.max_compute_invocations_per_workgroup,
            ),
            (
                "max_compute_workgroup_size_x",
                abi.workgroup_size[0],
                l.max_compute_workgroup_size_x,
            ),
        ] {
            if needed > has {
                return Err(DeviceError::DeviceLimit {
                    kernel: kernel(),
                    what,
                    needed: needed.into(),
                    has: has.into(),
                }
                .into());
            }
        }
        Ok(())
    }

    /// The uniform buffer holding `bytes`: one per distinct content, created once and never
    /// written again, so that a command recorded with it reads what it was recorded with
    /// however many calls come before the submit.
    pub(crate) fn uniform(&self, bytes: &[u8]) -> wgpu::Buffer {
        let mut cache = self.uniforms.lock().unwrap_or_else(|e| e.into_inner());
        cache.get_or_create(&self.device, bytes)
    }

    /// The adapter the device was created on: its name keys the tuning table.
    pub fn info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }

    /// The limits the device was created with.
    pub fn limits(&self) -> &wgpu::Limits {
        &self.limits
    }

    /// Kernels created from now on skip wgpu's shader runtime checks (index clamping and
    /// loop bounding that naga adds to the WGSL). Measured on an H100, they cost a third of
    /// the flash kernels' time. Only for attn-dsl kernels run through this runtime's
    /// validated entry points; a browser always keeps the checks.
    pub fn unchecked(mut self) -> Gpu {
        self.runtime_checks = false;
        self
    }

    /// A debug switch: ops built from now on build their user-written modifiers
    /// (`score_mod`, `mask_mod`) to record the first read outside a tensor's declared shape
    /// (which reads 0, as always), and [`Gpu::modifier_reads`] returns it as an error naming
    /// the kernel, the tensor and the indices. The kernels bind one more storage buffer and
    /// test each read: for finding a modifier's bug, not for speed. Kernels the caller
    /// compiled (`Forward::from_kernel`, the macro's) are as they were built.
    pub fn report_modifier_reads(mut self) -> Gpu {
        self.reads = Some(ReadReport::new(&self.device));
        self
    }

    /// `masks` as this device's ops build them: with [`Gpu::report_modifier_reads`], the
    /// modifiers' reporting build.
    pub fn masks(&self, masks: attn_dsl::Masks) -> attn_dsl::Masks {
        match (&self.reads, masks.flex) {
            (Some(_), Some(flex)) => attn_dsl::Masks {
                flex: Some(flex.reporting()),
                ..masks
            },
            _ => masks,
        }
    }

    /// The report of [`Gpu::report_modifier_reads`], where it is on.
    pub(crate) fn read_report(&self) -> Option<&ReadReport> {
        self.reads.as_ref()
    }

    /// Whether kernels get wgpu's shader runtime checks (the default).
    pub fn runtime_checks(&self) -> bool {
        self.runtime_checks
    }

    /// Whether kernels with native `atomic<f32>` adds can run here.
    pub fn has_f32_atomics(&self) -> bool {
        self.features
            .contains(wgpu::Features::SHADER_FLOAT32_ATOMIC)
    }

    /// Whether kernels with `dtype: f16` can run here.
    pub fn has_f16(&self) -> bool {
        self.features.contains(wgpu::Features::SHADER_F16)
    }

    /// Whether one workgroup can read, in the same dispatch, what another stored before a
    /// storage barrier: a device-scope barrier (as native backends emit it; a browser's
    /// WGSL orders storage only within a workgroup) and storage declared `@coherent`
    /// (without it an H200 served one workgroup a stale record of another's).
    pub fn orders_storage_across_workgroups(&self) -> bool {
        self.info.backend != wgpu::Backend::BrowserWebGpu
            && self
                .features
                .contains(wgpu::Features::MEMORY_DECORATION_COHERENT)
    }

    /// Whether kernels with subgroup operations can run here.
    pub fn has_subgroups(&self) -> bool {
        self.features.contains(wgpu::Features::SUBGROUP)
    }

    /// The half-precision dtypes kernels can read and write here: f16 where the device has
    /// SHADER_F16, bf16 (u32 words) everywhere.
    pub fn half_dtypes(&self) -> Vec<attn_dsl::Dtype> {
        [attn_dsl::Dtype::F16, attn_dsl::Dtype::Bf16]
            .into_iter()
            .filter(|d| self.supports_dtype(*d))
            .collect()
    }

    /// Whether kernels on `dtype` tensors can run here.
    pub fn supports_dtype(&self, dtype: attn_dsl::Dtype) -> bool {
        match dtype {
            attn_dsl::Dtype::F32 | attn_dsl::Dtype::Bf16 => true,
            attn_dsl::Dtype::F16 => self.has_f16(),
        }
    }

    /// Whether kernels with cooperative-matrix products (`matrix = coop16`) can run here.
    pub fn has_coop16(&self) -> bool {
        self.coop16
    }

    /// Whether `op` in `dtype` over rows `width` wide has a tensor-core (`matrix = coop16`)
    /// path here ([`attn_dsl::layout::coop::on_tensor_cores`]).
    pub fn coop16_for(&self, dtype: attn_dsl::Dtype, op: attn_dsl::Op, width: u32) -> bool {
        self.has_coop16() && attn_dsl::layout::coop::on_tensor_cores(dtype, op, width)
    }

    /// Whether the device has every feature `abi` needs.
    pub fn supports(&self, abi: &KernelAbi) -> bool {
        (!abi.f32_atomics || self.has_f32_atomics())
            && (!abi.grid.uses_subgroups() || self.has_subgroups())
            && (!abi.uses_f16() || self.has_f16())
            && (!abi.grid.uses_coop() || self.has_coop16())
    }

    /// The optional features the device has, for reports.
    pub fn feature_names(&self) -> Vec<String> {
        let subgroups = format!(
            "subgroups of {}..{}",
            self.info.subgroup_min_size, self.info.subgroup_max_size
        );
        [
            (self.has_f32_atomics(), "f32 atomics".to_string()),
            (self.has_subgroups(), subgroups),
            (self.has_f16(), "f16".to_string()),
            (self.has_coop16(), "cooperative matrices".to_string()),
            (self.has_timestamps(), "timestamps".to_string()),
        ]
        .into_iter()
        .filter_map(|(has, name)| has.then_some(name))
        .collect()
    }

    /// Whether GPU timestamps can time compute passes here.
    pub fn has_timestamps(&self) -> bool {
        self.features.contains(wgpu::Features::TIMESTAMP_QUERY)
    }

    /// `name (backend, type)`, for logs and reports.
    pub fn describe(&self) -> String {
        format!(
            "{} ({:?}, {:?})",
            self.info.name, self.info.backend, self.info.device_type
        )
    }
}

fn rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

/// Optional features: taken when the adapter has them, so kernels that need them can run.
const OPTIONAL_FEATURES: wgpu::Features = wgpu::Features::SHADER_FLOAT32_ATOMIC
    .union(wgpu::Features::TIMESTAMP_QUERY)
    .union(wgpu::Features::SUBGROUP)
    .union(wgpu::Features::SHADER_F16);

/// Native-only optional features: a pipeline cache on disk (Vulkan), and `@coherent`
/// storage for the split pass that combines its slices in one dispatch.
const NATIVE_FEATURES: wgpu::Features = match cfg!(target_arch = "wasm32") {
    true => wgpu::Features::empty(),
    false => wgpu::Features::PIPELINE_CACHE.union(wgpu::Features::MEMORY_DECORATION_COHERENT),
};

/// Whether `matrix = coop16` kernels can run on `adapter`: cooperative matrices with the
/// product they use (16x16x16, f16 operands, f32 accumulators), f16 and subgroups, and
/// subgroups of exactly 32 invocations, the layout the kernels assume.
fn coop16_capable(adapter: &wgpu::Adapter) -> bool {
    use wgpu::wgt::CooperativeScalarType as T;
    let needed = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
        | wgpu::Features::SHADER_F16
        | wgpu::Features::SUBGROUP;
    let info = adapter.get_info();
    adapter.features().contains(needed)
        && (info.subgroup_min_size, info.subgroup_max_size) == (32, 32)
        && adapter.cooperative_matrix_properties().iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
                && p.ab_type == T::F16
                && p.cr_type == T::F32
        })
}

async fn request(adapter: wgpu::Adapter, limits: wgpu::Limits) -> Result<Gpu, DeviceError> {
    let info = adapter.get_info();
    let coop16 = coop16_capable(&adapter);
    let mut features = adapter.features() & (OPTIONAL_FEATURES | NATIVE_FEATURES);
    if coop16 {
        features |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
    }
    let desc = wgpu::DeviceDescriptor {
        label: Some("attn runtime"),
        required_features: features,
        required_limits: limits.clone(),
        // SAFETY: the one experimental feature taken is cooperative matrices, used only by
        // `matrix = coop16` kernels, which naga validated and which run only where
        // `coop16_capable` found the exact product they use.
        experimental_features: match coop16 {
            true => unsafe { wgpu::ExperimentalFeatures::enabled() },
            false => wgpu::ExperimentalFeatures::disabled(),
        },
        ..Default::default()
    };
    let (device, queue) =
        adapter
            .request_device(&desc)
            .await
            .map_err(|source| DeviceError::Request {
                adapter: info.name.clone(),
                source,
            })?;
    let mut gpu = Gpu::assemble(info, device, queue, features, coop16);
    // The limits requested: what the device reports may be higher.
    gpu.limits = limits;
    Ok(gpu)
}
