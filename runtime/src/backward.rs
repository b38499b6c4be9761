//! The backward pass: one entry point over four schedules, a planner that picks one by
//! memory budget and adapter features, and scratch allocated once and reused.

use std::fmt;
use std::str::FromStr;

use attn_dsl::{Dtype, FlashConfig, KernelAbi, Masks, Scatter};

use crate::attention::{self, ForwardInput, Heads, length, submit};
use crate::buffers;
use crate::error::{Error, InputError};
use crate::gpu::Gpu;
use crate::kernel::Kernel;
use crate::kernels::BackwardKernels;
use crate::modifiers::Modifiers;
use crate::tuning::{self, Table};

/// How dQ, dK and dV are produced (DESIGN.md §4).
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
            Schedule::Split => 2 * scratch_elems(batch, seq_len, n_heads) * 4,
            _ => 0,
        }
    }
}

fn scratch_elems(batch: u32, seq_len: u32, n_heads: u32) -> u64 {
    u64::from(batch) * u64::from(seq_len) * u64::from(seq_len) * u64::from(n_heads)
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
                     (scattered-: of tuning::backward_candidates_in on tensor cores), e.g. \
                     tiled-16x8/2@64"
                )
            })
    }
}

/// The backward's inputs: the forward's Q, K, V, its saved O and LSE, and the upstream
/// gradient dO, laid out as for the forward (`[batch, seq, heads, head_dim]`).
#[derive(Clone, Copy, Debug)]
pub struct BackwardInput<'a> {
    pub batch: u32,
    pub seq_len: u32,
    pub heads: Heads,
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub o: &'a [f32],
    pub lse: &'a [f32],
    pub d_o: &'a [f32],
    pub seg: Option<&'a [u32]>,
    pub scale: Option<f32>,
    /// The forward's modifier values (the same dropout seed and offset regenerate its mask).
    pub mods: Modifiers<'a>,
}

/// dQ `[batch, seq, n_heads, d]`, dK and dV `[batch, seq, n_kv_heads, d]`, and with a
/// bias, dBias in the bias's layout (empty without one).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gradients {
    pub dq: Vec<f32>,
    pub dk: Vec<f32>,
    pub dv: Vec<f32>,
    pub dbias: Vec<f32>,
}

/// The kernels of one head_dim and dtype, compiled.
struct Compiled {
    head_dim: u32,
    /// What the kernels read Q, K, V, O and dO in (the gradients are f32 in every dtype).
    dtype: Dtype,
    prep: Kernel,
    /// Every schedule the device runs, with its kernels in dispatch order (after prep).
    schedules: Vec<(Schedule, Vec<Kernel>)>,
}

/// Scratch for the split schedule, grown on demand and reused.
struct Scratch {
    /// P then dS, `elems` each, in one binding.
    p_ds: wgpu::Buffer,
    elems: u64,
}

/// Runs the backward; owns its kernels and the split schedule's scratch.
pub struct Backward {
    compiled: Vec<Compiled>,
    scratch: Option<Scratch>,
    /// Most bytes of scratch the planner may give the split schedule.
    pub scratch_budget: u64,
    /// The tuning table the planner follows for this adapter.
    pub table: Table,
}

/// The default scratch budget: 256 MiB.
pub const DEFAULT_SCRATCH_BUDGET: u64 = 256 << 20;

impl Backward {
    /// Compiles the backward kernels for each head_dim in `sets`; the native f32-atomic
    /// streaming variant only where the device has SHADER_FLOAT32_ATOMIC.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new(gpu: &Gpu, sets: &[BackwardKernels]) -> Result<Backward, Error> {
        pollster::block_on(Backward::new_async(gpu, sets))
    }

    /// [`Backward::new`] for an async caller (the browser).
    pub async fn new_async(gpu: &Gpu, sets: &[BackwardKernels]) -> Result<Backward, Error> {
        let mut backward = Backward {
            compiled: Vec::new(),
            scratch: None,
            scratch_budget: DEFAULT_SCRATCH_BUDGET,
            table: Table::for_gpu(gpu)?,
        };
        for set in sets {
            backward.add_async(gpu, set).await?;
        }
        Ok(backward)
    }

    /// Compiles `set`'s schedules for its head_dim (e.g. a set from
    /// [`BackwardKernels::compile`] for a head_dim the family lacks); replaces any held.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn add(&mut self, gpu: &Gpu, set: &BackwardKernels) -> Result<(), Error> {
        pollster::block_on(self.add_async(gpu, set))
    }

    /// [`Backward::add`] for an async caller (the browser).
    pub async fn add_async(&mut self, gpu: &Gpu, set: &BackwardKernels) -> Result<(), Error> {
        let compiled = Compiled {
            head_dim: set.prep.head_dim,
            dtype: Dtype::F32,
            prep: Kernel::new_async(gpu, &set.prep).await?,
            schedules: schedule_kernels_async(gpu, set).await?,
        };
        self.hold(compiled);
        Ok(())
    }

    /// Compiles the half-precision backward for `head_dim`, `masks` and `dtype` (f16 or
    /// bf16): the tiled schedule in each configuration that fits the device, on tensor
    /// cores first where the adapter has cooperative matrices and the dtype is f16.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn add_in(
        &mut self,
        gpu: &Gpu,
        head_dim: u32,
        masks: Masks,
        dtype: Dtype,
    ) -> Result<(), Error> {
        pollster::block_on(self.add_in_async(gpu, head_dim, masks, dtype))
    }

    /// [`Backward::add_in`] for an async caller (the browser).
    pub async fn add_in_async(
        &mut self,
        gpu: &Gpu,
        head_dim: u32,
        masks: Masks,
        dtype: Dtype,
    ) -> Result<(), Error> {
        let dsl = |e: attn_dsl::DslError| Error::Pipeline {
            kernel: format!("backward d{head_dim} {}", dtype.name()),
            message: e.to_string(),
        };
        if dtype == Dtype::F32 {
            // Every f32 schedule, as `add` compiles them.
            let set = BackwardKernels::compile(head_dim, masks).map_err(dsl)?;
            return self.add_async(gpu, &set).await;
        }
        let prep = tuning::backward_prep_in(head_dim, dtype).map_err(dsl)?;
        let configs = tuning::backward_candidates_in(gpu, head_dim, dtype);
        let schedules = tiled_schedules_async(gpu, (head_dim, masks, dtype), &configs).await?;
        self.hold(Compiled {
            head_dim,
            dtype,
            prep: Kernel::new_async(gpu, &prep).await?,
            schedules,
        });
        Ok(())
    }

    /// Keeps `compiled`, replacing any set of its head_dim and dtype.
    fn hold(&mut self, compiled: Compiled) {
        self.compiled
            .retain(|c| (c.head_dim, c.dtype) != (compiled.head_dim, compiled.dtype));
        self.compiled.push(compiled);
    }

    /// The schedules this device can run for `head_dim` (no tiled ones for a head_dim
    /// without a backward set).
    pub fn schedules(&self, gpu: &Gpu, head_dim: u32) -> Vec<Schedule> {
        self.schedules_in(gpu, head_dim, Dtype::F32)
    }

    /// The schedules compiled for `head_dim` in `dtype`, best first.
    pub fn schedules_in(&self, _gpu: &Gpu, head_dim: u32, dtype: Dtype) -> Vec<Schedule> {
        self.compiled
            .iter()
            .filter(|c| (c.head_dim, c.dtype) == (head_dim, dtype))
            .flat_map(|c| c.schedules.iter().map(|(s, _)| *s))
            .collect()
    }

    /// The tuning table's schedule for this head_dim when the device runs it (and, for
    /// split, when its scratch fits the budget and the largest binding); else the tiled
    /// schedule in its portable configuration, which needs neither scratch nor atomics.
    pub fn plan(&self, gpu: &Gpu, batch: u32, seq_len: u32, heads: Heads) -> Schedule {
        self.plan_in(gpu, batch, seq_len, heads, Dtype::F32)
    }

    /// [`Backward::plan`] in `dtype`: in half precision the first compiled schedule (the
    /// tiled one on tensor cores where the adapter has them; not yet measured per adapter),
    /// its key-major half spread over query heads ([`Schedule::Scattered`]) where compiled.
    pub fn plan_in(
        &self,
        gpu: &Gpu,
        batch: u32,
        seq_len: u32,
        heads: Heads,
        dtype: Dtype,
    ) -> Schedule {
        if dtype != Dtype::F32 {
            return half_plan(&self.schedules_in(gpu, heads.head_dim, dtype));
        }
        let runnable = self.schedules(gpu, heads.head_dim);
        let bytes = Schedule::Split.scratch_bytes(batch, seq_len, heads.n_heads);
        let fits =
            bytes <= self.scratch_budget && bytes <= gpu.limits().max_storage_buffer_binding_size;
        let tuned = self
            .table
            .backward
            .get(&heads.head_dim)
            .and_then(|name| name.parse::<Schedule>().ok())
            .filter(|s| runnable.contains(s) && (*s != Schedule::Split || fits));
        let portable = tuning::backward_candidates(heads.head_dim)
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
        self.scratch.as_ref().map_or(0, |s| 2 * s.elems * 4)
    }

    /// Fresh gradients of `input`, by `schedule` or the planner's choice.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn run(
        &mut self,
        gpu: &Gpu,
        input: &BackwardInput,
        schedule: Option<Schedule>,
    ) -> Result<(Gradients, Schedule), Error> {
        pollster::block_on(self.run_async(gpu, input, schedule))
    }

    /// [`Backward::run`] for an async caller (the browser).
    pub async fn run_async(
        &mut self,
        gpu: &Gpu,
        input: &BackwardInput<'_>,
        schedule: Option<Schedule>,
    ) -> Result<(Gradients, Schedule), Error> {
        let zeros = Gradients {
            dq: vec![0.0; input.q.len()],
            dk: vec![0.0; input.k.len()],
            dv: vec![0.0; input.v.len()],
            dbias: vec![0.0; input.mods.bias.map_or(0, |b| b.values.len())],
        };
        self.accumulate_async(gpu, input, schedule, zeros).await
    }

    /// `grads` plus the gradients of `input`: micro-steps add up.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn accumulate(
        &mut self,
        gpu: &Gpu,
        input: &BackwardInput,
        schedule: Option<Schedule>,
        grads: Gradients,
    ) -> Result<(Gradients, Schedule), Error> {
        pollster::block_on(self.accumulate_async(gpu, input, schedule, grads))
    }

    /// [`Backward::accumulate`] for an async caller (the browser).
    pub async fn accumulate_async(
        &mut self,
        gpu: &Gpu,
        input: &BackwardInput<'_>,
        schedule: Option<Schedule>,
        grads: Gradients,
    ) -> Result<(Gradients, Schedule), Error> {
        self.accumulate_in_async(gpu, input, schedule, grads, Dtype::F32)
            .await
    }

    /// Fresh gradients of `input` from the kernels of `dtype` (see [`Backward::add_in`]):
    /// Q, K, V, O and dO are rounded to it on upload; the gradients come back f32.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn run_in(
        &mut self,
        gpu: &Gpu,
        input: &BackwardInput,
        schedule: Option<Schedule>,
        dtype: Dtype,
    ) -> Result<(Gradients, Schedule), Error> {
        let zeros = Gradients {
            dq: vec![0.0; input.q.len()],
            dk: vec![0.0; input.k.len()],
            dv: vec![0.0; input.v.len()],
            dbias: vec![0.0; input.mods.bias.map_or(0, |b| b.values.len())],
        };
        pollster::block_on(self.accumulate_in_async(gpu, input, schedule, zeros, dtype))
    }

    /// [`Backward::accumulate_async`] with the kernels of `dtype`.
    pub async fn accumulate_in_async(
        &mut self,
        gpu: &Gpu,
        input: &BackwardInput<'_>,
        schedule: Option<Schedule>,
        grads: Gradients,
        dtype: Dtype,
    ) -> Result<(Gradients, Schedule), Error> {
        let set = self.validate(gpu, input, &grads, dtype)?;
        let schedule = schedule
            .unwrap_or_else(|| self.plan_in(gpu, input.batch, input.seq_len, input.heads, dtype));
        let h = input.heads;
        let dims = attention::sequence_dims(input.batch, input.seq_len, h);
        let rows = (input.batch * input.seq_len * h.n_heads) as usize;
        // Refuse what this device cannot run before uploading anything.
        let kernels = self.kernels_for(set, schedule)?;
        let data_scalar = self.compiled[set].prep.abi().scalar("o");
        // The streaming kernel adds dK and dV into one packed atomic binding, in lanes.
        let packed = kernels.iter().any(|k| k.abi().binding("dkv").is_some());
        let lanes = attn_dsl::DKV_LANES as usize;
        if packed {
            attention::binding_size(gpu.limits(), (8 * lanes * input.k.len()) as u64)?;
        }
        if schedule == Schedule::Split {
            let elems = scratch_elems(input.batch, input.seq_len, h.n_heads);
            attention::binding_size(gpu.limits(), 2 * elems * 4)?;
        }
        // dK and dV packed for the streaming kernel's one atomic binding: lane 0 holds the
        // gradients so far (dK first), the other lanes start at 0.
        let dkv: Vec<f32> = match packed {
            true => (grads.dk.iter().chain(&grads.dv).copied())
                .chain(std::iter::repeat_n(0.0, (lanes - 1) * 2 * grads.dk.len()))
                .collect(),
            false => vec![0.0; 4],
        };
        let named: Vec<(&str, wgpu::Buffer, usize)> = [
            ("q", input.q),
            ("k", input.k),
            ("v", input.v),
            ("o", input.o),
            ("lse", input.lse),
            ("d_o", input.d_o),
            ("dq", &grads.dq),
            ("dk", &grads.dk),
            ("dv", &grads.dv),
            ("dkv", &dkv),
            ("dbias", dbias_or_word(&grads.dbias)),
        ]
        .into_iter()
        .map(|(name, data)| {
            // The forward's tensors and dO in the kernels' dtype; everything else f32.
            let scalar = match ["q", "k", "v", "o", "d_o"].contains(&name) {
                true => data_scalar,
                false => attn_dsl::Scalar::F32,
            };
            (
                name,
                buffers::storage_as(gpu, name, data, scalar),
                data.len(),
            )
        })
        .collect();
        if schedule == Schedule::Split {
            self.reserve_scratch(gpu, scratch_elems(input.batch, input.seq_len, h.n_heads));
        }
        let kernels = self.kernels_for(set, schedule)?;
        let seg = attention::seg_buffer(gpu, input.seg, input.batch, input.seq_len);
        let stats = buffers::output::<f32>(gpu, "stats", 2 * rows);
        let (dims_buf, params_buf) = attention::modified_uniforms(
            gpu,
            kernels[0].abi(),
            &dims,
            input.scale,
            h,
            &input.mods,
        )?;
        let mods = input.mods.buffers(gpu);
        let mut bound: Vec<(&str, &wgpu::Buffer)> = named.iter().map(|(n, b, _)| (*n, b)).collect();
        bound.extend([
            ("seg", &seg),
            ("stats", &stats),
            ("dims", &dims_buf),
            ("params", &params_buf),
        ]);
        bound.extend(mods.iter().map(|(n, b)| (*n, b)));
        if let (Schedule::Split, Some(scratch)) = (schedule, &self.scratch) {
            bound.push(("p_ds", &scratch.p_ds));
        }
        let prep = needs_prep(&kernels).then_some(&self.compiled[set].prep);
        for kernel in prep.into_iter().chain(kernels.iter().copied()) {
            let grid = attention::checked_grid(kernel.abi(), gpu.limits(), &dims)?;
            submit(gpu, kernel, &bound, grid)?;
        }
        let mut outputs = match packed {
            true => vec!["dq", "dkv"],
            false => vec!["dq", "dk", "dv"],
        };
        let with_dbias = !grads.dbias.is_empty();
        if with_dbias {
            outputs.push("dbias");
        }
        let reads: Vec<(&wgpu::Buffer, usize)> = outputs
            .iter()
            .map(|name| {
                let (_, buffer, len) = named.iter().find(|(n, _, _)| n == name).expect("bound");
                (buffer, *len)
            })
            .collect();
        let mut out = buffers::read_many_async::<f32>(gpu, &reads).await?;
        let dbias = match with_dbias {
            true => out.pop().unwrap_or_default(),
            false => Vec::new(),
        };
        if packed {
            let mut dk = sum_lanes(&out[1], lanes);
            let dv = dk.split_off(grads.dk.len());
            out[1] = dk;
            out.push(dv);
        }
        let dv = out.pop().unwrap_or_default();
        let dk = out.pop().unwrap_or_default();
        let dq = out.pop().unwrap_or_default();
        Ok((Gradients { dq, dk, dv, dbias }, schedule))
    }

    fn validate(
        &self,
        gpu: &Gpu,
        input: &BackwardInput,
        grads: &Gradients,
        dtype: Dtype,
    ) -> Result<usize, InputError> {
        let h = input.heads;
        if !self.compiled.iter().any(|c| c.dtype == dtype) {
            return Err(InputError::Schedule {
                schedule: format!("any {} schedule", dtype.name()),
                head_dim: h.head_dim,
                available: format!(
                    "none in {}; compile them first with Backward::add_in",
                    dtype.name()
                ),
            });
        }
        let set = self
            .compiled
            .iter()
            .position(|c| (c.head_dim, c.dtype) == (h.head_dim, dtype))
            .ok_or_else(|| InputError::HeadDim {
                kernel: format!("backward {}", dtype.name()),
                kernel_head_dim: self
                    .compiled
                    .iter()
                    .find(|c| c.dtype == dtype)
                    .map_or(0, |c| c.head_dim),
                given: h.head_dim,
            })?;
        let Some((_, first)) = self.compiled[set].schedules.first() else {
            return Err(InputError::Schedule {
                schedule: format!("a {} schedule", dtype.name()),
                head_dim: h.head_dim,
                available: "none (no tiled configuration fits this device)".into(),
            });
        };
        let abi: &KernelAbi = first[0].abi();
        let view = ForwardInput {
            batch: input.batch,
            seq_len: input.seq_len,
            heads: h,
            q: input.q,
            k: input.k,
            v: input.v,
            seg: input.seg,
            scale: input.scale,
            mods: input.mods,
        };
        attention::validate_sequence(abi, gpu.limits(), &view)?;
        let dbias_len = input.mods.bias.map_or(0, |b| b.values.len());
        length(
            "dbias",
            grads.dbias.len(),
            dbias_len as u64,
            "the length of bias",
        )?;
        let rows = u64::from(input.batch) * u64::from(input.seq_len) * u64::from(h.n_heads);
        let q_len = rows * u64::from(h.head_dim);
        let q_layout = "batch × seq_len × n_heads × head_dim";
        length("o", input.o.len(), q_len, q_layout)?;
        length("d_o", input.d_o.len(), q_len, q_layout)?;
        length("lse", input.lse.len(), rows, "batch × seq_len × n_heads")?;
        length("dq", grads.dq.len(), q_len, q_layout)?;
        length(
            "dk",
            grads.dk.len(),
            input.k.len() as u64,
            "the length of k",
        )?;
        length(
            "dv",
            grads.dv.len(),
            input.v.len() as u64,
            "the length of v",
        )?;
        Ok(set)
    }

    /// The kernels of `schedule`, in dispatch order.
    fn kernels_for(&self, set: usize, schedule: Schedule) -> Result<Vec<&Kernel>, Error> {
        let found = self.compiled[set]
            .schedules
            .iter()
            .find(|(s, _)| *s == schedule);
        match found {
            Some((_, kernels)) => Ok(kernels.iter().collect()),
            None => Err(InputError::Schedule {
                schedule: schedule.to_string(),
                head_dim: self.compiled[set].head_dim,
                available: self.compiled[set]
                    .schedules
                    .iter()
                    .map(|(s, _)| s.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            }
            .into()),
        }
    }

    /// Scratch of at least `elems` per buffer, reusing what is held.
    fn reserve_scratch(&mut self, gpu: &Gpu, elems: u64) {
        if self.scratch.as_ref().is_none_or(|s| s.elems < elems) {
            self.scratch = None; // free the old buffer before allocating the new one
            self.scratch = Some(Scratch {
                p_ds: buffers::output::<f32>(gpu, "p_ds scratch", 2 * elems as usize),
                elems,
            });
        }
    }
}

/// Whether a schedule's kernels need the prep to pack LSE and D into `stats`: not where
/// the first reads the LSE itself (the dQ half on cooperative matrices packs them).
pub fn needs_prep(kernels: &[&Kernel]) -> bool {
    kernels
        .first()
        .is_none_or(|k| k.abi().binding("lse").is_none())
}

/// The dBias so far, or one word to bind where the kernels write no dBias.
fn dbias_or_word(dbias: &[f32]) -> &[f32] {
    match dbias.is_empty() {
        true => &[0.0],
        false => dbias,
    }
}

/// The streaming kernel's `dkv` lanes summed pairwise: dK then dV, packed.
fn sum_lanes(dkv: &[f32], lanes: usize) -> Vec<f32> {
    let len = dkv.len() / lanes;
    (0..len)
        .map(|i| crate::reference::pairwise(lanes, &|l| dkv[l * len + i]))
        .collect()
}

/// Every schedule `gpu` runs for `set`'s head_dim and masks, with its kernels in dispatch
/// order (after prep): the per-row ones from `set`, streaming-f32 where the adapter has
/// SHADER_FLOAT32_ATOMIC, and each tiled and flash candidate that fits the device.
#[cfg(not(target_arch = "wasm32"))]
pub fn schedule_kernels(
    gpu: &Gpu,
    set: &BackwardKernels,
) -> Result<Vec<(Schedule, Vec<Kernel>)>, Error> {
    pollster::block_on(schedule_kernels_async(gpu, set))
}

/// The pipelines of `abis`, in order.
async fn compile(gpu: &Gpu, abis: &[&KernelAbi]) -> Result<Vec<Kernel>, Error> {
    let mut kernels = Vec::with_capacity(abis.len());
    for abi in abis {
        kernels.push(Kernel::new_async(gpu, abi).await?);
    }
    Ok(kernels)
}

/// The tiled schedule in each of `configs` that fits `gpu`, its two halves compiled for
/// (head_dim, masks, dtype).
#[cfg(not(target_arch = "wasm32"))]
pub fn tiled_schedules(
    gpu: &Gpu,
    kind: (u32, Masks, Dtype),
    configs: &[FlashConfig],
) -> Result<Vec<(Schedule, Vec<Kernel>)>, Error> {
    pollster::block_on(tiled_schedules_async(gpu, kind, configs))
}

/// [`tiled_schedules`] for an async caller (the browser).
pub async fn tiled_schedules_async(
    gpu: &Gpu,
    (head_dim, masks, dtype): (u32, Masks, Dtype),
    configs: &[FlashConfig],
) -> Result<Vec<(Schedule, Vec<Kernel>)>, Error> {
    let mut out = Vec::new();
    let dsl = |e: attn_dsl::DslError| Error::Pipeline {
        kernel: format!("tiled backward d{head_dim} {}", dtype.name()),
        message: e.to_string(),
    };
    let mut scattered = Vec::new();
    for config in configs {
        let [q, kv] = tuning::flash_backward_in(head_dim, masks, *config, dtype).map_err(dsl)?;
        if !(tuning::fits(gpu, &q) && tuning::fits(gpu, &kv)) {
            continue;
        }
        out.push((Schedule::Tiled(*config), compile(gpu, &[&q, &kv]).await?));
        if config.matrix == attn_dsl::Matrix::Coop16 {
            let kv = tuning::flash_backward_scattered(head_dim, masks, *config, scatter(gpu))
                .map_err(dsl)?;
            scattered.push((Schedule::Scattered(*config), compile(gpu, &[&q, &kv]).await?));
        }
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
fn scatter(gpu: &Gpu) -> Scatter {
    match gpu.has_f32_atomics() {
        true => Scatter::F32Atomic,
        false => Scatter::Cas,
    }
}

/// [`schedule_kernels`] for an async caller (the browser).
pub async fn schedule_kernels_async(
    gpu: &Gpu,
    set: &BackwardKernels,
) -> Result<Vec<(Schedule, Vec<Kernel>)>, Error> {
    let mut out = vec![
        (
            Schedule::Split,
            compile(gpu, &[&set.split_q, &set.split_kv]).await?,
        ),
        (
            Schedule::RecomputeSplit,
            compile(gpu, &[&set.recompute_q, &set.recompute_kv]).await?,
        ),
    ];
    let (head_dim, masks) = (set.recompute_q.head_dim, set.recompute_q.masks);
    let scatter = scatter(gpu);
    let dsl = |what: &str, e: attn_dsl::DslError| Error::Pipeline {
        kernel: format!("{what} backward d{head_dim}"),
        message: e.to_string(),
    };
    let candidates = tuning::backward_candidates(head_dim);
    out.extend(tiled_schedules_async(gpu, (head_dim, masks, Dtype::F32), &candidates).await?);
    let streaming = candidates
        .iter()
        .filter(|c| c.tile >= attn_dsl::check::MIN_STREAMING_TILE);
    for config in streaming {
        let q = tuning::flash_streaming(head_dim, masks, *config, scatter)
            .map_err(|e| dsl("streaming", e))?;
        if tuning::fits(gpu, &q) {
            out.push((Schedule::Streaming(*config), compile(gpu, &[&q]).await?));
        }
    }
    for config in &candidates {
        let kv = tuning::flash_scatter(head_dim, masks, *config, scatter)
            .map_err(|e| dsl("flash", e))?;
        if tuning::fits(gpu, &kv) {
            out.push((Schedule::Flash(*config), compile(gpu, &[&kv]).await?));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_plan_spreads_the_tensor_core_schedule_over_query_heads() {
        let configs = attn_dsl::configs::coop_backward(64, attn_dsl::configs::CANDIDATE_WORKGROUP_BYTES);
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
