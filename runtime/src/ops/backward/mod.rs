//! The backward pass: one entry point over four schedules, a planner that picks one by
//! memory budget and adapter features, and scratch allocated once and reused.

// The host-slice convenience: host data checked, uploaded, run, read back.
mod host;
pub use host::*;

use std::fmt;
use std::str::FromStr;

use attn_dsl::{Dtype, FlashConfig, KernelAbi, Masks, Scatter};

mod record;

pub use record::*;

use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::dispatch::record::Pipeline;
use crate::error::{Error, InputError};
use crate::kernels::BackwardKernels;
use crate::plan::kernels::{self, AttentionSpec};
use crate::plan::tuning::{self, Table};
use crate::shape::Heads;

/// What a backward computes: the attention's widths, masks and dtype.
pub type BackwardSpec = AttentionSpec;

/// How dQ, dK and dV are produced (docs/backward.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Schedule {
    /// (a) s-major flushes P and dS to scratch; j-major consumes them. No atomics.
    Split,
    /// (b) one query-major flash kernel in this tiling: query tiles own dQ; dK and dV,
    /// summed over a tile's rows, are added by atomic scatter (native `atomic<f32>` where
    /// the adapter has it). No scratch.
    Streaming(FlashConfig),
    /// (d) s-major dQ and j-major dK/dV kernels, each recomputing P. No scratch, no atomics.
    RecomputeSplit,
    /// (d) on the flash grids, both halves in this tiling: query and key tiles staged in
    /// workgroup memory, register blocks.
    Tiled(FlashConfig),
    /// (c) one key-major flash kernel in this tiling: key tiles own dK and dV, dQ by atomic
    /// scatter (native `atomic<f32>` where the adapter has it).
    Flash(FlashConfig),
    /// (d) on tensor cores with the key-major half spread over query heads: a workgroup per
    /// (key tile, query head) adds its dK and dV by atomics, where the tiled schedule has
    /// one per KV head walking the group in turn. For problems too small to fill the GPU.
    Scattered(FlashConfig),
}

impl Schedule {
    /// The schedules with one configuration (the per-row designs).
    pub const PER_ROW: [Schedule; 2] = [Schedule::Split, Schedule::RecomputeSplit];

    /// Scratch bytes the schedule needs: P and dS, each `[batch, seq, n_heads, seq]` f32.
    pub fn scratch_bytes(self, batch: u32, seq_len: u32, n_heads: u32) -> u64 {
        match self {
            Schedule::Split => scratch_elems(batch, seq_len, n_heads).saturating_mul(8),
            _ => 0,
        }
    }
}

fn scratch_elems(batch: u32, seq_len: u32, n_heads: u32) -> u64 {
    crate::tensor::elements(&[batch, seq_len, seq_len, n_heads])
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Schedule::Split => f.write_str("split"),
            Schedule::RecomputeSplit => f.write_str("recompute"),
            Schedule::Streaming(c) => write!(f, "streaming-{}", c.label()),
            Schedule::Tiled(c) => write!(f, "tiled-{}", c.label()),
            Schedule::Flash(c) => write!(f, "flash-{}", c.label()),
            Schedule::Scattered(c) => write!(f, "scattered-{}", c.label()),
        }
    }
}

impl FromStr for Schedule {
    type Err = String;

    fn from_str(s: &str) -> Result<Schedule, String> {
        if let Some((kind, label)) = s.split_once('-')
            && let Some(c) = FlashConfig::from_label(label)
        {
            match kind {
                "streaming" => return Ok(Schedule::Streaming(c)),
                "tiled" => return Ok(Schedule::Tiled(c)),
                "flash" => return Ok(Schedule::Flash(c)),
                "scattered" => return Ok(Schedule::Scattered(c)),
                _ => {}
            }
        }
        Schedule::PER_ROW
            .into_iter()
            .find(|x| x.to_string() == s)
            .ok_or_else(|| {
                format!(
                    "unknown schedule `{s}`; expected split, recompute, or streaming-, tiled-, \
                     flash- or scattered- with a configuration of tuning::backward_candidates \
                     (scattered-: of tuning::backward_configs on tensor cores), e.g. \
                     tiled-16x8/2@64"
                )
            })
    }
}

/// One schedule's kernels in dispatch order (after prep): their ABIs, and their pipelines
/// once the schedule has run.
pub(crate) struct Scheduled {
    pub schedule: Schedule,
    pub abis: Vec<KernelAbi>,
    pub pipelines: Option<Vec<Pipeline>>,
}

impl Scheduled {
    /// The first kernel (and its output) that adds by atomics: none in a deterministic
    /// schedule.
    fn atomic_output(&self) -> Option<(String, String)> {
        self.abis.iter().find_map(|abi| {
            abi.atomic_output()
                .map(|o| (abi.name.to_string(), o.to_string()))
        })
    }
}

/// The schedules of one head_dim, head_dim_v and dtype.
pub(crate) struct Compiled {
    pub head_dim: u32,
    /// The width of V, O, dO and dV rows (MLA's 128 beside 192).
    pub head_dim_v: u32,
    /// What the kernels read Q, K, V, O and dO in (the gradients are f32 in every dtype).
    pub dtype: Dtype,
    pub prep_abi: KernelAbi,
    pub prep: Option<Pipeline>,
    /// Every schedule the device runs.
    pub schedules: Vec<Scheduled>,
    /// dSinks after any schedule, with sinks (compiled on first use).
    pub sink_grad: Option<Pipeline>,
}

/// Runs the backward; owns its kernels (each schedule's compiled on the first call that
/// runs it) and its scratch (grown on demand and reused).
pub struct Backward {
    pub(crate) compiled: Vec<Compiled>,
    pub(crate) scratch: crate::ops::backward::Scratch,
    /// Most bytes of scratch the planner may give the split schedule.
    pub scratch_budget: u64,
    /// The tuning table the planner follows for this adapter.
    pub table: Table,
    /// Bit-identical gradients run to run: the planner picks only schedules whose kernels
    /// own every output (no atomic adds, whose order changes the f32 sums), and a schedule
    /// asked for that adds by atomics is refused ([`InputError::NotDeterministic`]).
    pub deterministic: bool,
}

/// The default scratch budget: 256 MiB.
pub const DEFAULT_SCRATCH_BUDGET: u64 = 256 << 20;

impl Backward {
    /// The backward of `spec`: in f32 every schedule the device runs (the per-row ones,
    /// streaming where it has SHADER_FLOAT32_ATOMIC, each tiled and flash configuration
    /// that fits), in f16 and bf16 the tiled schedule in each configuration that fits, on
    /// tensor cores first where the adapter has cooperative matrices. Nothing is compiled
    /// for the device yet: a schedule's pipelines are created when it first runs.
    pub fn new(gpu: &Gpu, spec: BackwardSpec) -> Result<Backward, Error> {
        let mut backward = Backward::from_kernels(gpu, &[])?;
        backward.add(gpu, spec)?;
        Ok(backward)
    }

    /// The backward of kernel sets compiled by the macro (e.g. [`crate::kernels::BACKWARD`])
    /// or by [`BackwardKernels::compile`], each with every f32 schedule the device runs.
    pub fn from_kernels(gpu: &Gpu, sets: &[BackwardKernels]) -> Result<Backward, Error> {
        let mut backward = Backward {
            compiled: Vec::new(),
            scratch: Default::default(),
            scratch_budget: DEFAULT_SCRATCH_BUDGET,
            table: Table::for_gpu(gpu)?,
            deterministic: false,
        };
        for set in sets {
            backward.add_kernels(gpu, set)?;
        }
        Ok(backward)
    }

    /// Adds the kernels of `set` for its widths (f32); replaces any set of those widths.
    pub fn add_kernels(&mut self, gpu: &Gpu, set: &BackwardKernels) -> Result<(), Error> {
        let compiled = Compiled {
            head_dim: set.recompute_q.head_dim,
            head_dim_v: set.recompute_q.head_dim_v(),
            dtype: Dtype::F32,
            prep_abi: set.prep.clone().into_owned(),
            prep: None,
            schedules: lazy(schedule_abis(gpu, set)?),
            sink_grad: None,
        };
        self.hold(compiled);
        Ok(())
    }

    /// Adds the schedules of another `spec` ([`Backward::new`]'s); replaces any set of its
    /// widths and dtype.
    pub fn add(&mut self, gpu: &Gpu, spec: BackwardSpec) -> Result<(), Error> {
        let spec = BackwardSpec {
            masks: gpu.masks(spec.masks),
            ..spec
        };
        let dsl = |e: attn_dsl::DslError| Error::Pipeline {
            kernel: format!(
                "backward d{}/{} {}",
                spec.head_dim,
                spec.head_dim_v,
                spec.dtype.name()
            ),
            message: e.to_string(),
        };
        if spec.dtype == Dtype::F32 {
            let set = BackwardKernels::compile(spec.dims(), spec.masks).map_err(dsl)?;
            return self.add_kernels(gpu, &set);
        }
        let prep = kernels::backward_prep(spec).map_err(dsl)?;
        let configs = tuning::backward_configs(gpu, spec.width(), spec.dtype);
        let schedules = tiled_abis(gpu, spec, &configs)?;
        self.hold(Compiled {
            head_dim: spec.head_dim,
            head_dim_v: spec.head_dim_v,
            dtype: spec.dtype,
            prep_abi: prep,
            prep: None,
            schedules: lazy(schedules),
            sink_grad: None,
        });
        Ok(())
    }

    /// Keeps `compiled`, replacing any set of its widths and dtype.
    fn hold(&mut self, compiled: Compiled) {
        self.compiled
            .retain(|c| (c.dims(), c.dtype) != (compiled.dims(), compiled.dtype));
        self.compiled.push(compiled);
    }

    /// The schedules compiled for rows of Q and K `dims.0` wide and of V and O `dims.1`
    /// in `dtype`, best first (with [`Backward::deterministic`], those that own every
    /// output); on two widths, the per-row schedules alone so far.
    pub fn schedules(&self, dims: (u32, u32), dtype: Dtype) -> Vec<Schedule> {
        self.compiled
            .iter()
            .filter(|c| (c.dims(), c.dtype) == (dims, dtype))
            .flat_map(|c| c.schedules.iter())
            .filter(|s| !self.deterministic || s.atomic_output().is_none())
            .map(|s| s.schedule)
            .collect()
    }

    /// The schedule a call of `batch` sequences of `seq_len` rows runs in `dtype`. In f32
    /// the tuning table's schedule for this head_dim when the device runs it (and, for
    /// split, when its scratch fits the budget and the largest binding); else the tiled
    /// schedule in its portable configuration, which needs neither scratch nor atomics. In
    /// half precision the first compiled schedule (the tiled one on tensor cores where the
    /// adapter has them; not yet measured per adapter), its key-major half spread over
    /// query heads ([`Schedule::Scattered`]) where compiled.
    pub fn plan(
        &self,
        gpu: &Gpu,
        batch: u32,
        seq_len: u32,
        heads: Heads,
        dtype: Dtype,
    ) -> Schedule {
        let planned = self.fastest_plan(gpu, batch, seq_len, heads, dtype);
        match self.deterministic {
            true => self.deterministic_plan(heads.dims(), dtype, planned),
            false => planned,
        }
    }

    /// With [`Backward::deterministic`], `planned` where it owns every output, else the
    /// first compiled tiled schedule that does, else recompute (split's scratch is left out:
    /// it may not fit). A set where every schedule adds by atomics (a shared bias's dBias)
    /// keeps `planned`, which [`Backward::record`] then refuses with the reason.
    fn deterministic_plan(&self, dims: (u32, u32), dtype: Dtype, planned: Schedule) -> Schedule {
        let Some(c) = self
            .compiled
            .iter()
            .find(|c| (c.dims(), c.dtype) == (dims, dtype))
        else {
            return planned;
        };
        let owned: Vec<Schedule> = c
            .schedules
            .iter()
            .filter(|s| s.atomic_output().is_none())
            .map(|s| s.schedule)
            .collect();
        let rank = |s: &Schedule| match s {
            s if *s == planned => 0,
            Schedule::Tiled(_) => 1,
            Schedule::RecomputeSplit => 2,
            _ => 3,
        };
        owned
            .iter()
            .filter(|s| rank(s) < 3)
            .min_by_key(|s| rank(s))
            .copied()
            .unwrap_or(planned)
    }

    /// Schedule `given`, or the planner's, for this call; refused where it cannot be
    /// deterministic and [`Backward::deterministic`] asks for that.
    pub(crate) fn schedule_for(
        &self,
        gpu: &Gpu,
        set: usize,
        given: Option<Schedule>,
        shape: (u32, u32, Heads),
        dtype: Dtype,
    ) -> Result<(Schedule, usize), Error> {
        let (batch, seq, heads) = shape;
        let schedule = given.unwrap_or_else(|| self.plan(gpu, batch, seq, heads, dtype));
        let c = &self.compiled[set];
        let at = c.kernels_for(schedule)?;
        if let Some((kernel, output)) = c.schedules[at].atomic_output()
            && self.deterministic
        {
            return Err(InputError::NotDeterministic {
                schedule: schedule.to_string(),
                kernel,
                output,
            }
            .into());
        }
        Ok((schedule, at))
    }

    /// The fastest schedule by the tuning table and the rules, atomics or not.
    fn fastest_plan(
        &self,
        gpu: &Gpu,
        batch: u32,
        seq_len: u32,
        heads: Heads,
        dtype: Dtype,
    ) -> Schedule {
        if dtype != Dtype::F32 {
            return half_plan(&self.schedules(heads.dims(), dtype));
        }
        let runnable = self.schedules(heads.dims(), Dtype::F32);
        let bytes = Schedule::Split.scratch_bytes(batch, seq_len, heads.n_heads);
        let fits =
            bytes <= self.scratch_budget && bytes <= gpu.limits().max_storage_buffer_binding_size;
        // Rows of two widths run the tilings of the wider.
        let tuned = self
            .table
            .backward
            .get(&heads.width())
            .and_then(|name| name.parse::<Schedule>().ok())
            .filter(|s| runnable.contains(s) && (*s != Schedule::Split || fits));
        let portable = tuning::backward_candidates(heads.width())
            .first()
            .map(|c| Schedule::Tiled(*c));
        match tuned {
            Some(s) => s,
            None if portable.is_some_and(|p| runnable.contains(&p)) => portable.expect("checked"),
            None => Schedule::RecomputeSplit,
        }
    }

    /// Bytes of scratch held for reuse.
    pub fn scratch_held(&self) -> u64 {
        self.scratch.held()
    }

    /// The set of rows `dims` wide (Q and K's, V and O's) in `dtype`, or why there is none.
    pub(crate) fn set_of(&self, dims: (u32, u32), dtype: Dtype) -> Result<usize, InputError> {
        let head_dim = dims.0;
        if !self.compiled.iter().any(|c| c.dtype == dtype) {
            return Err(InputError::Schedule {
                schedule: format!("any {} schedule", dtype.name()),
                head_dim,
                available: format!(
                    "none in {}; add them first with Backward::add",
                    dtype.name()
                ),
            });
        }
        if let Some(c) = self
            .compiled
            .iter()
            .find(|c| (c.head_dim, c.dtype) == (head_dim, dtype) && c.head_dim_v != dims.1)
            .filter(|_| {
                !self
                    .compiled
                    .iter()
                    .any(|c| (c.dims(), c.dtype) == (dims, dtype))
            })
        {
            return Err(InputError::HeadDimV {
                kernel: format!("backward {}", dtype.name()),
                kernel_head_dim_v: c.head_dim_v,
                given: dims.1,
            });
        }
        let set = self
            .compiled
            .iter()
            .position(|c| (c.dims(), c.dtype) == (dims, dtype))
            .ok_or_else(|| InputError::HeadDim {
                kernel: format!("backward {}", dtype.name()),
                kernel_head_dim: self
                    .compiled
                    .iter()
                    .find(|c| c.dtype == dtype)
                    .map_or(0, |c| c.head_dim),
                given: head_dim,
            })?;
        if self.compiled[set].schedules.is_empty() {
            return Err(InputError::Schedule {
                schedule: format!("a {} schedule", dtype.name()),
                head_dim,
                available: "none (no tiled configuration fits this device)".into(),
            });
        }
        Ok(set)
    }
}

impl Compiled {
    /// Q and K's width, V and O's.
    fn dims(&self) -> (u32, u32) {
        (self.head_dim, self.head_dim_v)
    }

    /// The `sink_grad` kernel of this set's head_dim and dtype, created on first use (it
    /// reads O and dO rows, `head_dim_v` wide).
    pub(crate) fn sink_grad(&mut self, gpu: &Gpu) -> Result<&mut Pipeline, Error> {
        if self.sink_grad.is_none() {
            let abi = sink_grad_abi(self.head_dim_v, self.dtype)?;
            self.sink_grad = Some(Pipeline::new(Kernel::now(gpu, &abi)?));
        }
        Ok(self.sink_grad.as_mut().expect("made above"))
    }

    /// The kernels of `schedule`, in dispatch order, or which schedules there are.
    pub(crate) fn kernels_for(&self, schedule: Schedule) -> Result<usize, InputError> {
        self.schedules
            .iter()
            .position(|s| s.schedule == schedule)
            .ok_or_else(|| InputError::Schedule {
                schedule: schedule.to_string(),
                head_dim: self.head_dim,
                available: self
                    .schedules
                    .iter()
                    .map(|s| s.schedule.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

/// The `sink_grad` kernel for `head_dim` with O and dO in `dtype`, compiled now: dSinks
/// after any schedule.
pub(crate) fn sink_grad_abi(head_dim: u32, dtype: Dtype) -> Result<KernelAbi, Error> {
    let masks = Masks {
        sinks: true,
        ..Masks::default()
    };
    let spec = attn_dsl::KernelSpec {
        dtype,
        ..attn_dsl::KernelSpec::standard(
            "attention_sink_grad",
            attn_dsl::Op::SinkGrad,
            head_dim,
            masks,
        )
    };

    attn_dsl::compile(&spec).map_err(|e| Error::Pipeline {
        kernel: spec.name.clone(),
        message: e.to_string(),
    })
}

/// Whether a schedule's kernels need the prep to pack LSE and D into `stats`: not where
/// the first reads the LSE itself (the dQ half on cooperative matrices packs them).
pub fn needs_prep(kernels: &[&KernelAbi]) -> bool {
    kernels.first().is_none_or(|k| k.binding("lse").is_none())
}

fn lazy(schedules: Vec<(Schedule, Vec<KernelAbi>)>) -> Vec<Scheduled> {
    schedules
        .into_iter()
        .map(|(schedule, abis)| Scheduled {
            schedule,
            abis,
            pipelines: None,
        })
        .collect()
}

/// The pipelines of `abis`, in order.
#[cfg(not(target_arch = "wasm32"))]
fn compile(gpu: &Gpu, abis: &[KernelAbi]) -> Result<Vec<Kernel>, Error> {
    abis.iter().map(|abi| Kernel::now(gpu, abi)).collect()
}

/// Every schedule `gpu` runs for `set`'s head_dim and masks, each compiled now, with its
/// kernels in dispatch order (after prep): for timing every schedule.
#[cfg(not(target_arch = "wasm32"))]
pub fn schedule_kernels(
    gpu: &Gpu,
    set: &BackwardKernels,
) -> Result<Vec<(Schedule, Vec<Kernel>)>, Error> {
    schedule_abis(gpu, set)?
        .into_iter()
        .map(|(s, abis)| Ok((s, compile(gpu, &abis)?)))
        .collect()
}

/// The tiled schedule in each of `configs` that fits `gpu`, both halves compiled now for
/// `spec`.
#[cfg(not(target_arch = "wasm32"))]
pub fn tiled_schedules(
    gpu: &Gpu,
    spec: BackwardSpec,
    configs: &[FlashConfig],
) -> Result<Vec<(Schedule, Vec<Kernel>)>, Error> {
    tiled_abis(gpu, spec, configs)?
        .into_iter()
        .map(|(s, abis)| Ok((s, compile(gpu, &abis)?)))
        .collect()
}

/// The tiled schedule in each of `configs` that fits `gpu`, its two halves' kernels for
/// `spec`; on tensor cores also its spread (scattered) variant.
pub fn tiled_abis(
    gpu: &Gpu,
    spec: BackwardSpec,
    configs: &[FlashConfig],
) -> Result<Vec<(Schedule, Vec<KernelAbi>)>, Error> {
    let (head_dim, dtype) = (spec.head_dim, spec.dtype);
    let mut out = Vec::new();
    let dsl = |e: attn_dsl::DslError| Error::Pipeline {
        kernel: format!("tiled backward d{head_dim} {}", dtype.name()),
        message: e.to_string(),
    };
    let mut scattered = Vec::new();
    for config in configs {
        let [q, kv] = kernels::flash_backward(spec, *config).map_err(dsl)?;
        if !(tuning::fits(gpu, &q) && tuning::fits(gpu, &kv)) {
            continue;
        }
        if config.matrix == attn_dsl::Matrix::Coop16 {
            let spread =
                kernels::flash_backward_scattered(spec, *config, scatter(gpu)).map_err(dsl)?;
            scattered.push((Schedule::Scattered(*config), vec![q.clone(), spread]));
        }
        out.push((Schedule::Tiled(*config), vec![q, kv]));
    }
    out.extend(scattered);
    Ok(out)
}

/// The half-precision plan among the `compiled` schedules (best first): the first, with
/// its key-major half spread over query heads where that variant is compiled.
pub(crate) fn half_plan(compiled: &[Schedule]) -> Schedule {
    let first = compiled.first().copied();
    // On an H100 the spread key-major half was the faster at every shape measured, by 1.7x
    // at the seeds' (seq 512, 12 heads over 4, d 64: 0.081 against 0.140 ms), where a
    // workgroup per KV head walks its group in turn and the grid is too small for the
    // GPU; 1.16x at seq 2048 with 32 heads over 8, d 128 (1.534 against 1.786 ms); 1.07x
    // at seq 4096 with 32 over 8 (4.777 against 5.104); and 1.03x without GQA, seq 4096
    // with 16 heads (2.599 against 2.685), where each dK element gets one add.
    let spread = match first {
        Some(Schedule::Tiled(c)) => Some(Schedule::Scattered(c)).filter(|s| compiled.contains(s)),
        _ => None,
    };
    spread.or(first).unwrap_or(Schedule::RecomputeSplit)
}

/// How atomic outputs are added on `gpu`: native f32 atomics where it has them.
pub(crate) fn scatter(gpu: &Gpu) -> Scatter {
    match gpu.has_f32_atomics() {
        true => Scatter::F32Atomic,
        false => Scatter::Cas,
    }
}

/// Every schedule `gpu` runs for `set`'s head_dim and masks, its kernels in dispatch order
/// (after prep): the per-row ones from `set`, streaming-f32 where the adapter has
/// SHADER_FLOAT32_ATOMIC, and each tiled and flash candidate that fits the device.
pub fn schedule_abis(
    gpu: &Gpu,
    set: &BackwardKernels,
) -> Result<Vec<(Schedule, Vec<KernelAbi>)>, Error> {
    let own = |a: &std::borrow::Cow<'static, KernelAbi>| a.clone().into_owned();
    let mut out = vec![
        (Schedule::Split, vec![own(&set.split_q), own(&set.split_kv)]),
        (
            Schedule::RecomputeSplit,
            vec![own(&set.recompute_q), own(&set.recompute_kv)],
        ),
    ];
    let (head_dim, masks) = (set.recompute_q.head_dim, set.recompute_q.masks);
    let dims = (head_dim, set.recompute_q.head_dim_v());
    let spec = BackwardSpec::new(head_dim, masks, Dtype::F32).with_head_dim_v(dims.1);
    let scatter = scatter(gpu);
    let dsl = |what: &str, e: attn_dsl::DslError| Error::Pipeline {
        kernel: format!("{what} backward d{head_dim}"),
        message: e.to_string(),
    };
    // The tilings of the wider row.
    let candidates = tuning::backward_candidates(dims.0.max(dims.1));
    out.extend(tiled_abis(gpu, spec, &candidates)?);
    let streaming = candidates
        .iter()
        .filter(|c| c.tile >= attn_dsl::check::MIN_STREAMING_TILE);
    for config in streaming {
        let q =
            kernels::flash_streaming(spec, *config, scatter).map_err(|e| dsl("streaming", e))?;
        if tuning::fits(gpu, &q) {
            out.push((Schedule::Streaming(*config), vec![q]));
        }
    }
    for config in &candidates {
        let kv = kernels::flash_scatter(spec, *config, scatter).map_err(|e| dsl("flash", e))?;
        if tuning::fits(gpu, &kv) {
            out.push((Schedule::Flash(*config), vec![kv]));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_plan_spreads_the_tensor_core_schedule_over_query_heads() {
        let configs =
            attn_dsl::configs::coop_backward(64, attn_dsl::configs::CANDIDATE_WORKGROUP_BYTES);
        let (first, second) = (configs[0], configs[1]);
        let compiled = [
            Schedule::Tiled(first),
            Schedule::Tiled(second),
            Schedule::Scattered(first),
            Schedule::Scattered(second),
        ];
        assert_eq!(half_plan(&compiled), Schedule::Scattered(first));
        // Without tensor cores there is no spread variant: the first.
        let scalar = [Schedule::Tiled(tuning::backward_candidates(64)[0])];
        assert_eq!(half_plan(&scalar), scalar[0]);
        assert_eq!(half_plan(&[]), Schedule::RecomputeSplit);
        // The name round-trips, so a tuning table or `--schedule` can give it.
        let name = Schedule::Scattered(first).to_string();
        assert_eq!(name, "scattered-64x32/16@256+tc");
        assert_eq!(name.parse::<Schedule>(), Ok(Schedule::Scattered(first)));
    }
}
