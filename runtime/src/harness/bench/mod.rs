//! What `bench` measures: the forward and every backward schedule on one shape, GPU-timed,
//! with FLOPs by FlashAttention's convention (forward 4·S²·H·D, halved when causal;
//! backward 2.5× forward).

pub mod cascade;
pub mod e2e;
pub mod flex;
pub mod head_dim_v;
pub mod probe;

use attn_dsl::emit::coop::Phases;
use attn_dsl::{Cache, Dtype, Fp8, KernelSpec, Masks, Op, Scalar};

use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::dispatch::uniforms::{checked_grid, uniforms};
use crate::error::Error;
use crate::harness::cases::{self, Runner, Shape};
use crate::kernels;
use crate::kernels::BackwardKernels;
use crate::ops::backward::Schedule;
use crate::ops::decode::{Combine, SplitLayout};
use crate::plan::kernels::AttentionSpec;
use crate::plan::tuning::{self, Table};
use crate::shape::Heads;
use crate::tensor::buffers;
use crate::timing::{self, Step, Timing};
use crate::verify::random;
use pollster::FutureExt as BlockOn;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BenchShape {
    /// Rows per sequence (with `packed`, of all the packed sequences together).
    pub seq: u32,
    /// Sequences of `seq` rows (the grid's third dimension).
    pub batch: u32,
    /// Sequences of these lengths packed along `seq` (documents from their `cu_seqlens`).
    pub packed: Option<Vec<u32>>,
    pub heads: Heads,
    pub causal: bool,
    /// A sliding window (`masks: [window]`): each query sees this many keys at most.
    pub window: Option<u32>,
    /// Attention sinks (`masks: [sinks]`): the backward's rows include the `sink_grad`
    /// kernel that writes dSinks.
    pub sinks: bool,
}

impl BenchShape {
    /// FlashAttention's count, `4·S²·H·D` per sequence (halved when causal), summed over the
    /// batch or the packed sequences: the work that no row skips. Under a window, `4·H·D`
    /// per visible (query, key) pair.
    pub fn forward_flops(&self) -> f64 {
        let h = self.heads;
        let hd = f64::from(h.n_heads) * f64::from(h.head_dim);
        if let Some(w) = self.window {
            let pairs = |s: u32| -> f64 {
                (0..s)
                    .map(|r| match self.causal {
                        true => f64::from((r + 1).min(w)),
                        false => f64::from((r + w).min(s) - (r + 1).saturating_sub(w)),
                    })
                    .sum()
            };
            let total: f64 = match &self.packed {
                Some(lengths) => lengths.iter().map(|&l| pairs(l)).sum(),
                None => f64::from(self.batch) * pairs(self.seq),
            };
            return 4.0 * hd * total;
        }
        let per = |s: u32| 4.0 * f64::from(s).powi(2) * hd;
        let full = match &self.packed {
            Some(lengths) => lengths.iter().map(|&l| per(l)).sum(),
            None => f64::from(self.batch) * per(self.seq),
        };
        if self.causal { full / 2.0 } else { full }
    }

    pub fn label(&self) -> String {
        let h = self.heads;
        let rows = match &self.packed {
            Some(l) if l.iter().all(|x| *x == l[0]) => format!("packed {}x{}", l.len(), l[0]),
            Some(l) => format!(
                "packed {}",
                l.iter().map(u32::to_string).collect::<Vec<_>>().join("+")
            ),
            None if self.batch > 1 => format!("seq={} b={}", self.seq, self.batch),
            None => format!("seq={}", self.seq),
        };
        format!(
            "{rows} h={} kv={} d={}{}{}",
            h.n_heads,
            h.n_kv_heads,
            h.head_dim,
            if self.causal { " causal" } else { "" },
            self.window
                .map_or(String::new(), |w| format!(" window={w}")),
        ) + if self.sinks { " sinks" } else { "" }
    }

    /// Document starts of the packed sequences, the same in every sequence of the batch.
    fn seg(&self) -> Option<Vec<u32>> {
        let one = crate::shape::seg_from_lengths(self.packed.as_ref()?)?;
        Some(one.repeat(self.batch as usize))
    }
}

pub struct BenchRow {
    pub shape: BenchShape,
    pub kernel: String,
    /// `None` when the configuration could not run here, with the reason in `note`.
    pub timing: Option<Timing>,
    pub flops: f64,
    pub note: String,
    /// The per-query (tile 1) design's median on the same work, for the ratio.
    pub baseline_ms: Option<f64>,
}

impl BenchRow {
    /// How many times faster than the tile-1 baseline.
    pub fn speedup(&self) -> Option<f64> {
        Some(self.baseline_ms? / self.timing?.median_ms)
    }

    /// None without a timing, or for a part of a kernel sequence (no FLOP count).
    pub fn tflops(&self) -> Option<f64> {
        self.timing
            .filter(|_| self.flops > 0.0)
            .map(|t| self.flops / (t.median_ms * 1e-3) / 1e12)
    }
}

/// Which kernels a run times.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Parts {
    #[default]
    All,
    Forward,
    Backward,
    /// The half-precision forwards and tiled backwards alone (f16 where the device has
    /// it, bf16), in every configuration.
    Half,
    /// [`Parts::Half`] in the planned forward configuration and the first backward
    /// candidate only.
    Planned,
    /// The planned tensor-core forward in each half dtype and the f16 tiled backward,
    /// whole, with no phase, with each phase alone and without each
    /// ([`attn_dsl::emit::coop::Phases`]); then the residency of every tensor-core
    /// configuration: the most of its workgroups in flight at once (the planned
    /// configuration where none is on tensor cores).
    Phases,
}

/// Times the forward and each backward schedule the device runs on `shape` (or only one
/// of the two, by `parts`), with kernels specialized for it now (so any head_dim works).
pub fn run(
    gpu: &Gpu,
    shape: BenchShape,
    warmup: usize,
    runs: usize,
    parts: Parts,
) -> Result<Vec<BenchRow>, Error> {
    let h = shape.heads;
    let masks = Masks {
        window: shape.window.is_some(),
        sinks: shape.sinks,
        ..Masks::new(shape.causal, shape.packed.is_some())
    };
    let compile = |spec: &KernelSpec| {
        attn_dsl::compile(spec).map_err(|e| Error::Pipeline {
            kernel: spec.name.clone(),
            message: e.to_string(),
        })
    };
    let forward = Kernel::now(
        gpu,
        &compile(&KernelSpec::standard(
            "attention_forward",
            Op::Forward,
            h.head_dim,
            masks,
        ))?,
    )?;
    let set =
        BackwardKernels::compile((h.head_dim, h.head_dim), masks).map_err(|e| Error::Pipeline {
            kernel: "backward".into(),
            message: e.to_string(),
        })?;
    // Each candidate compiled, or why the device cannot run it.
    let flash = tuning::forward_candidates(h.head_dim)
        .iter()
        .map(|&config| {
            let abi = crate::plan::kernels::flash_forward(
                AttentionSpec::new(h.head_dim, masks, Dtype::F32),
                config,
            )
            .map_err(|e| Error::Pipeline {
                kernel: format!("forward flash {}", config.label()),
                message: e.to_string(),
            })?;
            let kernel = match (tuning::fits(gpu, &abi), gpu.supports(&abi)) {
                (true, _) => Ok(Kernel::now(gpu, &abi)?),
                (false, false) => Err("needs SUBGROUP, which the device lacks".to_string()),
                (false, true) => Err(format!(
                    "needs {} B of workgroup memory, over the device's",
                    abi.workgroup_storage_bytes
                )),
            };
            Ok((config, kernel))
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let (s, nh, nkv, d) = (
        (shape.batch * shape.seq) as usize,
        h.n_heads as usize,
        h.n_kv_heads as usize,
        h.head_dim as usize,
    );
    let (q_len, kv_len) = (s * nh * d, s * nkv * d);
    let data = [
        ("q", q_len, 1),
        ("k", kv_len, 2),
        ("v", kv_len, 3),
        ("d_o", q_len, 4),
    ];
    let inputs: Vec<(&str, wgpu::Buffer)> = data
        .iter()
        .map(|(n, len, seed)| (*n, buffers::storage(gpu, n, &random(*len, *seed))))
        .collect();
    let outputs: Vec<(&str, wgpu::Buffer)> = [
        ("o", q_len),
        ("lse", s * nh),
        ("stats", 2 * s * nh),
        ("dq", q_len),
        ("dk", kv_len),
        ("dv", kv_len),
        ("dkv", 2 * attn_dsl::DKV_LANES as usize * kv_len),
        ("dsinks", nh),
    ]
    .into_iter()
    .map(|(n, len)| (n, buffers::output::<f32>(gpu, n, len)))
    .collect();
    let mut dims = crate::shape::sequence_dims(shape.batch, shape.seq, h).to_vec();
    dims.push(("window", shape.window.unwrap_or(0)));
    let (dims_buf, params_buf) =
        uniforms(gpu, forward.abi(), &dims, &[("scale", h.default_scale())])?;
    let seg_buf = crate::tensor::buffers::storage(
        gpu,
        "seg",
        &crate::shape::seg_with_ends(shape.seg().as_deref(), shape.batch, shape.seq)
            .expect("the bench's documents cover its rows"),
    );
    let scratch_bytes = Schedule::Split.scratch_bytes(shape.batch, shape.seq, h.n_heads);
    let scratch = (scratch_bytes <= gpu.limits().max_storage_buffer_binding_size)
        .then(|| buffers::output::<f32>(gpu, "p_ds", (scratch_bytes / 4) as usize));
    let mut bound: Vec<(&str, &wgpu::Buffer)> = inputs
        .iter()
        .chain(&outputs)
        .map(|(n, b)| (*n, b))
        .collect();
    bound.extend([
        ("dims", &dims_buf),
        ("params", &params_buf),
        ("seg", &seg_buf),
    ]);
    bound.extend(scratch.as_ref().map(|b| ("p_ds", b)));
    // The bf16 tensor-core kernels' row maxima, as the `row_scale` pass finds them (its
    // dispatches are timed with each bf16 row that reads them, see `RowScalePasses`).
    let maxima: Vec<u32> = [(q_len, 1), (kv_len, 2), (kv_len, 3), (q_len, 5), (q_len, 4)]
        .into_iter()
        .flat_map(|(len, seed)| {
            let x = random(len, seed);
            let mut bits: Vec<u32> = x
                .chunks(h.head_dim as usize)
                .map(|row| row.iter().fold(0.0f32, |m, e| m.max(e.abs())).to_bits())
                .collect();
            bits.resize(s * nh, 0);
            bits
        })
        .collect();
    let row_max_buf = buffers::storage(gpu, "row_max", &maxima);
    bound.push(("row_max", &row_max_buf));
    let sinks_buf = buffers::storage(gpu, "sinks", &vec![0.5f32; nh]);
    if shape.sinks {
        bound.push(("sinks", &sinks_buf));
    }
    let sink = SinkPasses::new(gpu, &shape)?;
    // The counted kernels' `resident`: workgroups in flight, and the most at once.
    let counter = buffers::output::<u32>(gpu, "resident", 2);
    bound.push(("resident", &counter));
    let step = |kernel| -> Result<Step, Error> {
        Ok(Step {
            kernel,
            bound: bound.clone(),
            grid: checked_grid(kernel.abi(), gpu.limits(), &dims)?,
        })
    };

    let mut rows = Vec::new();
    if matches!(parts, Parts::All | Parts::Forward) {
        let baseline = timing::time(gpu, &[step(&forward)?], warmup, runs)?;
        rows.push(BenchRow {
            shape: shape.clone(),
            kernel: "forward tile-1".into(),
            timing: Some(baseline),
            flops: shape.forward_flops(),
            note: String::new(),
            baseline_ms: Some(baseline.median_ms),
        });
        for (config, flash) in &flash {
            let mut row = BenchRow {
                shape: shape.clone(),
                kernel: format!("forward flash {}", config.label()),
                timing: None,
                flops: shape.forward_flops(),
                note: String::new(),
                baseline_ms: Some(baseline.median_ms),
            };
            match flash {
                Ok(kernel) => row.timing = Some(timing::time(gpu, &[step(kernel)?], warmup, runs)?),
                Err(why) => row.note = why.clone(),
            }
            rows.push(row);
        }
    }
    if parts != Parts::Backward {
        // The per-query baseline, where this run timed it (not with `--only half`).
        let tile1 = rows
            .first()
            .filter(|r| r.kernel == "forward tile-1")
            .and_then(|r| r.timing.map(|t| t.median_ms));
        let half = match parts {
            Parts::Phases => phase_forwards(gpu, h, (shape.batch, shape.seq), masks)?,
            _ => half_forwards(
                gpu,
                h,
                (shape.batch, shape.seq),
                masks,
                parts == Parts::Planned,
            )?,
        };
        // The half kernels read and write 16-bit copies of the same data.
        // (and the backward reads a saved O in the dtype).
        let copies: Vec<(&str, Scalar, wgpu::Buffer)> = data
            .iter()
            .chain(&[("o", q_len, 5)])
            .map(|(n, len, seed)| (*n, random(*len, *seed)))
            .flat_map(|(n, x)| {
                [Scalar::F16, Scalar::Bf16].map(|s| (n, s, buffers::storage_as(gpu, n, &x, s)))
            })
            .collect();
        let o_half = buffers::output::<u16>(gpu, "o", q_len);
        // `bound` with the data tensors in `dtype`: O the output of a forward, or the copy
        // a backward reads.
        let in_dtype = |dtype: Scalar, o_out: bool| {
            let mut half_bound = bound.clone();
            for (name, buffer) in half_bound.iter_mut() {
                if *name == "o" && o_out {
                    *buffer = &o_half;
                } else if let Some((.., b)) =
                    copies.iter().find(|(n, s, _)| n == name && *s == dtype)
                {
                    *buffer = b;
                }
            }
            half_bound
        };
        let scale_passes = RowScalePasses::new(gpu, &shape)?;
        // A bf16 kernel on tensor cores as a user runs it: after the row maxima of its
        // operands (Q, K, V; and O, dO for a backward).
        let passes = |abi: &attn_dsl::KernelAbi, parts: usize| match abi.binding("row_max") {
            Some(_) => scale_passes.steps(gpu, &copies, &row_max_buf, parts),
            None => Ok(Vec::new()),
        };
        let mut passes_timed = false;
        for (label, dtype, kernel) in &half {
            let half_bound = in_dtype(*dtype, true);
            let mut steps = passes(kernel.abi(), 3)?;
            if !steps.is_empty() && !std::mem::replace(&mut passes_timed, true) {
                rows.push(BenchRow {
                    shape: shape.clone(),
                    kernel: "part: row_scale of Q, K, V".into(),
                    timing: Some(timing::time(gpu, &steps, warmup, runs)?),
                    flops: 0.0,
                    note: String::new(),
                    baseline_ms: None,
                });
            }
            steps.push(Step {
                kernel,
                bound: half_bound,
                grid: checked_grid(kernel.abi(), gpu.limits(), &dims)?,
            });
            rows.push(BenchRow {
                shape: shape.clone(),
                kernel: label.clone(),
                timing: Some(timing::time(gpu, &steps, warmup, runs)?),
                flops: shape.forward_flops(),
                note: String::new(),
                baseline_ms: tile1,
            });
        }
        if parts != Parts::Forward {
            let backwards = match parts {
                Parts::Phases => phase_backwards(gpu, h, masks)?,
                _ => half_backwards(gpu, h, masks, parts == Parts::Planned)?,
            };
            let mut parted = Vec::new();
            for (label, kernels) in backwards {
                let bound = in_dtype(kernels[0].abi().scalar("o"), false);
                let scaled = kernels
                    .iter()
                    .find(|k| k.abi().binding("row_max").is_some());
                let mut steps = match scaled {
                    Some(k) => passes(k.abi(), 5)?,
                    None => Vec::new(),
                };
                steps.extend(sink.steps_of(gpu, kernels.iter(), &bound, &dims)?);
                rows.push(BenchRow {
                    shape: shape.clone(),
                    kernel: label.clone(),
                    timing: Some(timing::time(gpu, &steps, warmup, runs)?),
                    flops: 2.5 * shape.forward_flops(),
                    note: determinism(kernels.iter().map(Kernel::abi)),
                    baseline_ms: None,
                });
                // Where the planned (first) schedule of each dtype's time goes, kernel by
                // kernel.
                let dtype = kernels[0].abi().scalar("o");
                if label.starts_with("backward") && !parted.contains(&dtype) {
                    parted.push(dtype);
                    for step in &steps {
                        rows.push(BenchRow {
                            shape: shape.clone(),
                            kernel: format!("part: {}", step.kernel.name()),
                            timing: Some(timing::time(
                                gpu,
                                std::slice::from_ref(step),
                                warmup,
                                runs,
                            )?),
                            flops: 0.0,
                            note: String::new(),
                            baseline_ms: None,
                        });
                    }
                }
            }
        }
        if parts == Parts::Phases {
            let problem = (shape.batch, shape.seq);
            for (label, dtype, forward, kernel) in counted_kernels(gpu, h, problem, masks)? {
                let step = Step {
                    kernel: &kernel,
                    bound: in_dtype(dtype, forward),
                    grid: checked_grid(kernel.abi(), gpu.limits(), &dims)?,
                };
                rows.push(residency_row(gpu, &shape, label, step, &counter)?);
            }
        }
    }
    if matches!(
        parts,
        Parts::Forward | Parts::Half | Parts::Planned | Parts::Phases
    ) {
        note_phase_sums(&mut rows);
        return Ok(rows);
    }
    let compiled = crate::ops::backward::schedule_kernels(gpu, &set)?;
    // With sinks every schedule is followed by dSinks' kernel.
    let sink_grad = match shape.sinks {
        true => Some(Kernel::now(
            gpu,
            &crate::ops::backward::sink_grad_abi(h.head_dim, attn_dsl::Dtype::F32)?,
        )?),
        false => None,
    };
    let prep = Kernel::now(gpu, &set.prep)?;
    let flops = 2.5 * shape.forward_flops();
    // The baseline is the per-row recompute split: the same schedule family as the tiled
    // and flash ones, and steady between runs (the per-row split's 24 MiB of scratch
    // traffic made it vary from 1.3 to 7.5 ms on the seeds' layer on an H100).
    let mut baseline_ms = None;
    for (schedule, kernels) in &compiled {
        let kernel = format!("backward {schedule}");
        let mut row = BenchRow {
            shape: shape.clone(),
            kernel,
            timing: None,
            flops,
            note: determinism(kernels.iter().map(Kernel::abi)),
            baseline_ms: None,
        };
        if *schedule == Schedule::Split && scratch.is_none() {
            row.note = format!("scratch {scratch_bytes} B over the adapter's largest binding");
        } else {
            let all = std::iter::once(&prep).chain(kernels).chain(&sink_grad);
            let steps = sink.steps_of(gpu, all, &bound, &dims)?;
            let timing = timing::time(gpu, &steps, warmup, runs)?;
            if *schedule == Schedule::RecomputeSplit {
                baseline_ms = Some(timing.median_ms);
            }
            row.timing = Some(timing);
        }
        rows.push(row);
    }
    for row in rows.iter_mut().filter(|r| r.kernel.starts_with("backward")) {
        row.baseline_ms = baseline_ms;
    }
    Ok(rows)
}

/// The labels of check rows that fail on `gpu` for forward and backward cases of
/// `head_dims`: every candidate the device holds is run, so a candidate that is wrong
/// here shows up by name.
pub fn failing_kernels(gpu: &Gpu, head_dims: &[u32]) -> Result<Vec<String>, Error> {
    let mut runner = Runner::new(gpu, kernels::FAMILY.iter().copied(), &kernels::BACKWARD)?;
    let mut failed = Vec::new();
    let cases = cases::default_matrix().into_iter().filter(|c| {
        head_dims.contains(&c.heads.head_dim)
            && matches!(c.shape, Shape::Forward { .. } | Shape::Backward { .. })
    });
    for (i, case) in cases.enumerate() {
        for row in cases::run_case(gpu, &mut runner, &case, 1 + 1000 * i as u64)? {
            if !row.pass() && !failed.contains(&row.label) {
                failed.push(row.label);
            }
        }
    }
    Ok(failed)
}

/// The tuning table for `gpu` from bench rows: per head_dim, the fastest flash forward and
/// the fastest backward schedule, among those no failing check row names.
pub fn tune(gpu: &Gpu, rows: &[BenchRow], failed: &[String]) -> Table {
    let passed = |r: &&BenchRow| {
        r.timing.is_some()
            && !failed
                .iter()
                .any(|f| f.strip_suffix(" (planned)").unwrap_or(f) == r.kernel)
    };
    // The table plans f32 kernels: the f16 and bf16 rows (suffixed) are other kernels.
    let f32_row = |r: &&BenchRow| !r.kernel.ends_with(" f16") && !r.kernel.ends_with(" bf16");
    let fastest = |prefix: &str, head_dim: u32| {
        rows.iter()
            .filter(f32_row)
            .filter(|r| r.shape.heads.head_dim == head_dim && r.kernel.starts_with(prefix))
            .filter(passed)
            .min_by(|a, b| {
                let ms = |r: &BenchRow| r.timing.map_or(f64::INFINITY, |t| t.median_ms);
                ms(a).total_cmp(&ms(b))
            })
    };
    let mut table = Table {
        adapter: gpu.info().name.clone(),
        ..Table::default()
    };
    let mut head_dims: Vec<u32> = rows.iter().map(|r| r.shape.heads.head_dim).collect();
    head_dims.sort_unstable();
    head_dims.dedup();
    for head_dim in head_dims {
        // The f32 configurations only: the f16 and bf16 rows (suffixed) are other kernels.
        let candidates = tuning::forward_candidates(head_dim);
        let forward = rows
            .iter()
            .filter(|r| r.shape.heads.head_dim == head_dim)
            .filter(passed)
            .filter_map(|r| {
                let c = candidates
                    .iter()
                    .find(|c| r.kernel == format!("forward flash {}", c.label()))?;
                Some((r.timing.map_or(f64::INFINITY, |t| t.median_ms), *c))
            })
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, c)| c);
        if let Some(config) = forward {
            table.forward.insert(head_dim, config);
        }
        if let Some(row) = fastest("backward ", head_dim) {
            let name = row.kernel["backward ".len()..]
                .split(' ')
                .next()
                .unwrap_or_default();
            table.backward.insert(head_dim, name.to_string());
        }
    }
    table
}

/// The planned flash forward in f16, where the device has SHADER_F16 (on tensor cores
/// where it has cooperative matrices, then, unless `planned_only`, the other tensor-core
/// configurations and the scalar plan beside it), and in bf16:
/// (row label, dtype, kernel).
fn half_forwards(
    gpu: &Gpu,
    heads: Heads,
    problem: (u32, u32),
    masks: Masks,
    planned_only: bool,
) -> Result<Vec<(String, Scalar, Kernel)>, Error> {
    let head_dim = heads.head_dim;
    let table = tuning::Table::for_gpu(gpu).unwrap_or_default();
    let scalar = table
        .forward(gpu, head_dim, Dtype::F32)
        .unwrap_or(tuning::forward_candidates(head_dim)[0]);
    let mut out = Vec::new();
    for dtype in gpu.half_dtypes() {
        let planned = table
            .forward_for(gpu, heads, problem, dtype)
            .unwrap_or(scalar);
        let mut configs = vec![planned];
        configs.extend(other_coop_forwards(gpu, head_dim, dtype, planned));
        configs.extend((planned != scalar).then_some(scalar));
        if planned_only {
            configs.truncate(1);
        }
        for config in configs {
            let kernel = format!("forward flash {} {}", config.label(), dtype.name());
            let abi = crate::plan::kernels::flash_forward(
                AttentionSpec::new(head_dim, masks, dtype),
                config,
            )
            .map_err(|e| Error::Pipeline {
                kernel: kernel.clone(),
                message: e.to_string(),
            })?;
            if tuning::fits(gpu, &abi) {
                out.push((kernel, abi.scalar("o"), Kernel::now(gpu, &abi)?));
            }
        }
    }
    Ok(out)
}

/// Each phase-cut kernel's `all` row noted with none + the sum of each phase alone (*only
/// − none*), and `all` as a share of it: phases that wait on one another add up (100%),
/// overlapped ones come in under it.
pub fn note_phase_sums(rows: &mut [BenchRow]) {
    let ms = |rows: &[BenchRow], label: &str| {
        rows.iter()
            .find(|r| r.kernel == label)
            .and_then(|r| r.timing)
            .map(|t| t.median_ms)
    };
    for i in 0..rows.len() {
        let Some(prefix) = rows[i].kernel.strip_suffix(": all") else {
            continue;
        };
        let only: Vec<f64> = rows
            .iter()
            .filter(|r| r.kernel.starts_with(&format!("{prefix}: only ")))
            .filter_map(|r| r.timing.map(|t| t.median_ms))
            .collect();
        let (Some(all), Some(none)) = (
            ms(rows, &rows[i].kernel),
            ms(rows, &format!("{prefix}: none")),
        ) else {
            continue;
        };
        if only.is_empty() {
            continue;
        }
        let sum = none + only.iter().map(|o| o - none).sum::<f64>();
        let share = format!(
            "none + each alone {sum:.3} ms; all is {:.0}% of it",
            100.0 * all / sum
        );
        rows[i].note = match rows[i].note.is_empty() {
            true => share,
            false => format!("{}; {share}", rows[i].note),
        };
    }
}

/// The phase sets a kernel is timed with: all, none, and each of `each` alone and cut.
fn phase_sets(each: [(&str, Phases); 4]) -> Vec<(String, Phases)> {
    let mut sets = vec![
        ("all".to_string(), Phases::ALL),
        ("none".into(), Phases::NONE),
    ];
    for (name, only) in each {
        sets.push((format!("only {name}"), only));
        sets.push((format!("without {name}"), Phases::ALL.without(only)));
    }
    sets
}

/// The tensor-core forward candidates of `dtype` other than `planned` (none where the
/// adapter has no tensor cores for it).
fn other_coop_forwards(
    gpu: &Gpu,
    head_dim: u32,
    dtype: Dtype,
    planned: attn_dsl::FlashConfig,
) -> Vec<attn_dsl::FlashConfig> {
    match gpu.coop16_for(dtype, Op::Forward, head_dim) {
        true => tuning::coop_candidates(gpu, head_dim, dtype)
            .into_iter()
            .filter(|c| *c != planned)
            .collect(),
        false => Vec::new(),
    }
}

/// The planned forward's configuration in each half dtype (on tensor cores or not).
fn planned_forward_configs(
    gpu: &Gpu,
    heads: Heads,
    problem: (u32, u32),
) -> Vec<(attn_dsl::Dtype, attn_dsl::FlashConfig)> {
    let table = tuning::Table::for_gpu(gpu).unwrap_or_default();
    gpu.half_dtypes()
        .into_iter()
        .filter_map(|dtype| Some((dtype, table.forward_for(gpu, heads, problem, dtype)?)))
        .collect()
}

/// Each half dtype's tensor-core backward configurations, or its first configuration of
/// any kind where none runs on tensor cores.
fn backward_configs_by_dtype(
    gpu: &Gpu,
    heads: Heads,
) -> Vec<(attn_dsl::Dtype, Vec<attn_dsl::FlashConfig>)> {
    let coop = |c: &attn_dsl::FlashConfig| c.matrix == attn_dsl::Matrix::Coop16;
    gpu.half_dtypes()
        .into_iter()
        .map(|dtype| {
            let configs = tuning::backward_configs(gpu, heads.head_dim, dtype);
            let tensor_core: Vec<_> = configs.iter().copied().filter(coop).collect();
            match tensor_core.is_empty() {
                true => (dtype, configs.into_iter().take(1).collect()),
                false => (dtype, tensor_core),
            }
        })
        .collect()
}

/// The tiled backward configuration the phase model cuts in each half dtype: the first on
/// tensor cores.
fn phase_backward_configs(
    gpu: &Gpu,
    heads: Heads,
) -> Vec<(attn_dsl::Dtype, attn_dsl::FlashConfig)> {
    backward_configs_by_dtype(gpu, heads)
        .into_iter()
        .filter_map(|(dtype, configs)| {
            let first = configs
                .first()
                .filter(|c| c.matrix == attn_dsl::Matrix::Coop16)?;
            Some((dtype, *first))
        })
        .collect()
}

/// Every tensor-core backward configuration in each half dtype, the phase model's first;
/// the first configuration where the adapter has no tensor cores.
fn counted_backward_configs(
    gpu: &Gpu,
    heads: Heads,
) -> Vec<(attn_dsl::Dtype, attn_dsl::FlashConfig)> {
    backward_configs_by_dtype(gpu, heads)
        .into_iter()
        .flat_map(|(dtype, configs)| configs.into_iter().map(move |c| (dtype, c)))
        .collect()
}

/// The planned forward and every other tensor-core forward candidate, and every
/// tensor-core backward configuration (or the first, on adapters without tensor cores), in
/// each half dtype, built to count their workgroups in flight: the forwards and both
/// backward halves (row label, dtype, whether a forward, kernel).
fn counted_kernels(
    gpu: &Gpu,
    heads: Heads,
    problem: (u32, u32),
    masks: Masks,
) -> Result<Vec<(String, Scalar, bool, Kernel)>, Error> {
    use crate::plan::kernels::{flash_backward_counted, flash_forward_counted};
    let pipeline = |label: &str, e: attn_dsl::DslError| Error::Pipeline {
        kernel: label.to_string(),
        message: e.to_string(),
    };
    let mut out = Vec::new();
    for (dtype, planned) in planned_forward_configs(gpu, heads, problem) {
        // The planned configuration, then every other tensor-core candidate that fits.
        let others = other_coop_forwards(gpu, heads.head_dim, dtype, planned);
        for config in std::iter::once(planned).chain(others) {
            let label = format!(
                "residency: forward {} {}{}",
                config.label(),
                dtype.name(),
                if config == planned { " (planned)" } else { "" }
            );
            let spec = AttentionSpec::new(heads.head_dim, masks, dtype);
            let abi = flash_forward_counted(spec, config).map_err(|e| pipeline(&label, e))?;
            if tuning::fits(gpu, &abi) {
                out.push((label, Scalar::from(dtype), true, Kernel::now(gpu, &abi)?));
            }
        }
    }
    for (dtype, config) in counted_backward_configs(gpu, heads) {
        let spec =
            AttentionSpec::new(heads.head_dim, masks, dtype).with_head_dim_v(heads.head_dim_v);
        let label = format!(
            "residency: backward tiled-{} {}",
            config.label(),
            dtype.name()
        );
        let abis = flash_backward_counted(spec, config).map_err(|e| pipeline(&label, e))?;
        for (half, abi) in ["dQ", "dK/dV"].into_iter().zip(&abis) {
            let label = format!("{label}, {half} half");
            out.push((label, Scalar::from(dtype), false, Kernel::now(gpu, abi)?));
        }
    }
    Ok(out)
}

/// A counted kernel run (once warm, three times) on `step`, then its `resident` counter
/// read: the most of its workgroups the GPU held at once, beside its grid.
fn residency_row(
    gpu: &Gpu,
    shape: &BenchShape,
    label: String,
    step: Step,
    counter: &wgpu::Buffer,
) -> Result<BenchRow, Error> {
    gpu.queue
        .write_buffer(counter, 0, bytemuck::cast_slice(&[0u32; 2]));
    let timing = timing::time(gpu, std::slice::from_ref(&step), 1, 3)?;
    let words: Vec<u32> = crate::tensor::readback::read(gpu, counter, 2).block_on()?;
    let grid: u32 = step.grid.iter().product();
    // Beside the count, the planner's estimate of it per SM (`tuning::widest_filling`).
    let bytes = step.kernel.abi().workgroup_storage_bytes;
    let limit = gpu.limits().max_compute_workgroup_storage_size;
    let fit = limit / bytes.max(1);
    Ok(BenchRow {
        shape: shape.clone(),
        kernel: label,
        timing: Some(timing),
        flops: 0.0,
        note: format!(
            "{} workgroups in flight at once, of {grid} ({bytes} bytes each: {fit} in the \
             device's {limit})",
            words[1]
        ),
        baseline_ms: None,
    })
}

/// The planned tensor-core forward in each half dtype with its key loop cut to phases:
/// whole, none, each alone, all but each (row label, dtype, kernel); empty where no half
/// dtype runs on tensor cores.
fn phase_forwards(
    gpu: &Gpu,
    heads: Heads,
    problem: (u32, u32),
    masks: Masks,
) -> Result<Vec<(String, Scalar, Kernel)>, Error> {
    let sets = phase_sets(Phases::each());
    let mut out = Vec::new();
    let coop = planned_forward_configs(gpu, heads, problem)
        .into_iter()
        .filter(|(_, c)| c.matrix == attn_dsl::Matrix::Coop16);
    for (dtype, config) in coop {
        for (name, keep) in &sets {
            let kernel = format!("phases {} {}: {name}", config.label(), dtype.name());
            let abi = crate::plan::kernels::flash_forward_phases(
                AttentionSpec::new(heads.head_dim, masks, dtype),
                config,
                *keep,
            )
            .map_err(|e| Error::Pipeline {
                kernel: kernel.clone(),
                message: e.to_string(),
            })?;
            out.push((kernel, Scalar::from(dtype), Kernel::now(gpu, &abi)?));
        }
    }
    Ok(out)
}

/// The first tensor-core tiled backward configuration in f16 (both halves, the dK/dV
/// half owning its outputs) with its block loops cut to phases: whole, none, each alone,
/// all but each (row label, kernels); empty without tensor cores.
fn phase_backwards(
    gpu: &Gpu,
    heads: Heads,
    masks: Masks,
) -> Result<Vec<(String, Vec<Kernel>)>, Error> {
    let mut out = Vec::new();
    for (dtype, config) in phase_backward_configs(gpu, heads) {
        for (name, keep) in phase_sets(Phases::each_backward()) {
            let label = format!(
                "phases backward tiled-{} {}: {name}",
                config.label(),
                dtype.name()
            );
            let abis = crate::plan::kernels::flash_backward_phases(
                AttentionSpec::new(heads.head_dim, masks, dtype).with_head_dim_v(heads.head_dim_v),
                config,
                keep,
            )
            .map_err(|e| Error::Pipeline {
                kernel: label.clone(),
                message: e.to_string(),
            })?;
            let kernels = abis
                .iter()
                .map(|abi| Kernel::now(gpu, abi))
                .collect::<Result<Vec<_>, _>>()?;
            out.push((label, kernels));
        }
    }
    Ok(out)
}

/// The `row_scale` pass over the bf16 copies of Q, K, V, O and dO (parts 0-4 of
/// `row_max`), each part's dispatch with its dims.
struct RowScalePasses {
    kernel: Kernel,
    dims: Vec<Vec<(&'static str, u32)>>,
    uniforms: Vec<wgpu::Buffer>,
}

impl RowScalePasses {
    const TENSORS: [&'static str; 5] = ["q", "k", "v", "o", "d_o"];

    fn new(gpu: &Gpu, shape: &BenchShape) -> Result<RowScalePasses, Error> {
        let spec = crate::ops::row_max::spec();
        let abi = attn_dsl::compile(&spec).map_err(|e| Error::Pipeline {
            kernel: spec.name.clone(),
            message: e.to_string(),
        })?;
        let h = shape.heads;
        let rows = shape.batch * shape.seq;
        let part = rows * h.n_heads;
        let dims: Vec<Vec<(&'static str, u32)>> = [h.n_heads, h.n_kv_heads, h.n_kv_heads]
            .into_iter()
            .chain([h.n_heads; 2])
            .enumerate()
            .map(|(at, heads)| {
                vec![
                    ("rows", rows * heads),
                    ("width4", h.head_dim / 4),
                    ("at", at as u32 * part),
                ]
            })
            .collect();
        let uniforms = dims
            .iter()
            .map(|d| crate::dispatch::uniforms::uniform_dims(gpu, &abi, d))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RowScalePasses {
            kernel: Kernel::now(gpu, &abi)?,
            dims,
            uniforms,
        })
    }

    /// The first `parts` dispatches, reading the bf16 copies among `copies`.
    fn steps<'a>(
        &'a self,
        gpu: &Gpu,
        copies: &'a [(&str, Scalar, wgpu::Buffer)],
        row_max: &'a wgpu::Buffer,
        parts: usize,
    ) -> Result<Vec<Step<'a>>, Error> {
        (0..parts)
            .map(|at| {
                let src = copies
                    .iter()
                    .find(|(n, s, _)| *n == Self::TENSORS[at] && *s == Scalar::Bf16)
                    .map(|(.., b)| b)
                    .expect("a bf16 copy of every operand");
                Ok(Step {
                    kernel: &self.kernel,
                    bound: vec![("src", src), ("dst", row_max), ("dims", &self.uniforms[at])],
                    grid: checked_grid(self.kernel.abi(), gpu.limits(), &self.dims[at])?,
                })
            })
            .collect()
    }
}

/// The sink kernel's two dispatches: each pass's dims (the blocks of rows, `pass`) and the
/// blocks' partial sums.
struct SinkPasses {
    dims: [Vec<(&'static str, u32)>; 2],
    uniforms: Vec<wgpu::Buffer>,
    parts: wgpu::Buffer,
}

impl SinkPasses {
    fn new(gpu: &Gpu, shape: &BenchShape) -> Result<SinkPasses, Error> {
        let h = shape.heads;
        let abi = crate::ops::backward::sink_grad_abi(h.head_dim, attn_dsl::Dtype::F32)?;
        let blocks = (shape.batch * shape.seq).div_ceil(abi.workgroup_size[0]);
        let dims = [0, 1].map(|pass| {
            let mut d = crate::shape::sequence_dims(shape.batch, shape.seq, h).to_vec();
            d.extend([("n_slices", blocks), ("sink_pass", pass)]);
            d
        });
        let uniforms = match shape.sinks {
            true => dims
                .iter()
                .map(|d| crate::dispatch::uniforms::uniform_dims(gpu, &abi, d))
                .collect::<Result<Vec<_>, _>>()?,
            false => Vec::new(),
        };
        let len = 2 * h.n_heads * blocks;
        let parts = buffers::output::<f32>(gpu, "dsinks_part", len as usize);
        Ok(SinkPasses {
            dims,
            uniforms,
            parts,
        })
    }

    /// A backward's kernels as steps: the sink kernel's two passes each with its dims.
    fn steps_of<'a>(
        &'a self,
        gpu: &Gpu,
        kernels: impl IntoIterator<Item = &'a Kernel>,
        bound: &[(&'a str, &'a wgpu::Buffer)],
        dims: &[(&str, u32)],
    ) -> Result<Vec<Step<'a>>, Error> {
        let mut steps = Vec::new();
        for kernel in kernels {
            if kernel.abi().op == Op::SinkGrad {
                steps.extend(self.steps(gpu, kernel, bound)?);
                continue;
            }
            steps.push(Step {
                kernel,
                bound: bound.to_vec(),
                grid: checked_grid(kernel.abi(), gpu.limits(), dims)?,
            });
        }
        Ok(steps)
    }

    fn steps<'a>(
        &'a self,
        gpu: &Gpu,
        kernel: &'a Kernel,
        bound: &[(&'a str, &'a wgpu::Buffer)],
    ) -> Result<Vec<Step<'a>>, Error> {
        (0..2)
            .map(|pass| {
                let mut bound: Vec<_> = bound
                    .iter()
                    .filter(|(n, _)| *n != "dims")
                    .copied()
                    .collect();
                bound.extend([("dims", &self.uniforms[pass]), ("dsinks_part", &self.parts)]);
                Ok(Step {
                    kernel,
                    bound,
                    grid: checked_grid(kernel.abi(), gpu.limits(), &self.dims[pass])?,
                })
            })
            .collect()
    }
}

/// The note of a backward row whose kernels own every output (`Backward::deterministic`
/// may plan it).
pub const DETERMINISTIC: &str = "deterministic";

fn determinism<'a>(mut abis: impl Iterator<Item = &'a attn_dsl::KernelAbi>) -> String {
    match abis.all(|abi| abi.atomic_output().is_none()) {
        true => DETERMINISTIC.into(),
        false => String::new(),
    }
}

/// The half-precision tiled backward in each dtype the device has, in each configuration
/// [`tuning::backward_configs`] gives that fits (only the first with
/// `planned_only`), the planned schedule first: (row label, the prep where the schedule
/// needs it and the two halves).
fn half_backwards(
    gpu: &Gpu,
    heads: Heads,
    masks: Masks,
    planned_only: bool,
) -> Result<Vec<(String, Vec<Kernel>)>, Error> {
    let head_dim = heads.head_dim;
    let mut out = Vec::new();
    for dtype in gpu.half_dtypes() {
        let prep = crate::plan::kernels::backward_prep(AttentionSpec::new(
            head_dim,
            Masks::default(),
            dtype,
        ))
        .map_err(|e| Error::Pipeline {
            kernel: format!("backward prep {}", dtype.name()),
            message: e.to_string(),
        })?;
        let mut configs = tuning::backward_configs(gpu, head_dim, dtype);
        if planned_only {
            configs.truncate(1);
        }
        let mut schedules = crate::ops::backward::tiled_schedules(
            gpu,
            AttentionSpec::new(head_dim, masks, dtype),
            &configs,
        )?;
        let names: Vec<_> = schedules.iter().map(|(s, _)| *s).collect();
        let planned = crate::ops::backward::half_plan(&names);
        if let Some(at) = names.iter().position(|s| *s == planned) {
            let first = schedules.remove(at);
            schedules.insert(0, first);
        }
        for (schedule, halves) in schedules {
            let mut kernels: Vec<Kernel> = halves;
            if crate::ops::backward::needs_prep(
                &kernels.iter().map(|k| k.abi()).collect::<Vec<_>>(),
            ) {
                kernels.insert(0, Kernel::now(gpu, &prep)?);
            }
            if masks.sinks {
                let abi = crate::ops::backward::sink_grad_abi(head_dim, dtype)?;
                kernels.push(Kernel::now(gpu, &abi)?);
            }
            out.push((format!("backward {schedule} {}", dtype.name()), kernels));
        }
    }
    Ok(out)
}

/// A decode step to time: one query row per head against `cache_len` rows of a KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeShape {
    pub cache_len: u32,
    pub batch: u32,
    pub heads: Heads,
}

impl DecodeShape {
    pub fn label(&self) -> String {
        let h = self.heads;
        let d = match h.head_dim_v == h.head_dim {
            true => h.head_dim.to_string(),
            false => format!("{}/{}", h.head_dim, h.head_dim_v),
        };
        format!(
            "cache={}{} h={} kv={} d={d}",
            self.cache_len,
            if self.batch > 1 {
                format!(" b={}", self.batch)
            } else {
                String::new()
            },
            h.n_heads,
            h.n_kv_heads,
        )
    }

    /// Bytes a decode must move at least once: K and V of the cache read, Q read, O written.
    pub fn bytes(&self) -> f64 {
        self.bytes_in(4.0)
    }

    /// [`DecodeShape::bytes`] with elements of `size` bytes.
    pub fn bytes_in(&self, size: f64) -> f64 {
        self.bytes_of(size, size)
    }

    /// Bytes moved with the cache's elements of `kv` bytes and Q's and O's of `qo` (an fp8
    /// cache's scales are a few bytes per KV head, left out); K and Q rows `head_dim` wide,
    /// V and O rows `head_dim_v`.
    pub fn bytes_of(&self, kv: f64, qo: f64) -> f64 {
        let h = self.heads;
        let widths = f64::from(h.head_dim) + f64::from(h.head_dim_v);
        let cache = f64::from(self.cache_len) * f64::from(h.n_kv_heads) * widths;
        let ends = f64::from(h.n_heads) * widths;
        f64::from(self.batch) * (kv * cache + qo * ends)
    }
}

/// One timed decode: its label, GPU time and bytes moved.
pub struct DecodeRow {
    pub kernel: String,
    pub timing: Timing,
    pub bytes: f64,
}

impl DecodeRow {
    pub fn gbps(&self) -> f64 {
        self.bytes / (self.timing.median_ms * 1e-3) / 1e9
    }
}

/// Bytes of the buffer the copy-bandwidth probe copies (each way: read and written).
const COPY_BYTES: u64 = 256 << 20;
/// Copies per timed run of the probe, so a fast GPU's run is long beside the timestamps'
/// granularity.
const COPIES: u32 = 4;

/// A copy kernel: each invocation loads `UNROLL` `vec4<u32>`s, `WG` apart, before storing
/// any, so several loads are in flight per invocation as in a decode.
const COPY_WGSL: &str = "
const WG: u32 = 256u;
const UNROLL: u32 = 4u;
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>;

@compute @workgroup_size(WG)
fn copy4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let base = wg.x * UNROLL * WG + t;
    let x0 = src[base];
    let x1 = src[base + WG];
    let x2 = src[base + 2u * WG];
    let x3 = src[base + 3u * WG];
    dst[base] = x0;
    dst[base + WG] = x1;
    dst[base + 2u * WG] = x2;
    dst[base + 3u * WG] = x3;
}
";

/// Bytes one workgroup of [`COPY_WGSL`] copies.
const COPY_PER_WORKGROUP: u64 = 256 * 4 * 16;

/// The adapter's copy bandwidth in the same units as [`DecodeRow::gbps`] (bytes read plus
/// bytes written per second), two ways: a copy kernel (the reference a decode is judged
/// by: it reads and writes through the same load and store path), and
/// `copy_buffer_to_buffer` (which on the H100's driver moves a third of what the kernel
/// does, so it is no bandwidth test), each timed by timestamps written by empty compute
/// passes before and after the copies.
pub fn copy_bandwidth(gpu: &Gpu, warmup: usize, runs: usize) -> Result<[DecodeRow; 2], Error> {
    let limits = gpu.limits();
    let bytes = COPY_BYTES
        .min(limits.max_buffer_size)
        .min(limits.max_storage_buffer_binding_size)
        .min(u64::from(limits.max_compute_workgroups_per_dimension) * COPY_PER_WORKGROUP)
        / COPY_PER_WORKGROUP
        * COPY_PER_WORKGROUP;
    let make = |label| {
        gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes,
            usage: wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        })
    };
    let (src, dst) = (make("copy src"), make("copy dst"));
    // A pattern in the source, so that the kernel's copy can be checked, not just timed.
    let word = |i: u64| (i as u32).wrapping_mul(0x9E37_79B9) ^ 0x5bd1_e995;
    let words: Vec<u32> = (0..bytes / 4).map(word).collect();
    gpu.queue
        .write_buffer(&src, 0, bytemuck::cast_slice(&words));
    drop(words);
    let module = gpu
        .device
        .create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("copy4"),
            source: wgpu::ShaderSource::Wgsl(COPY_WGSL.into()),
        });
    let pipeline = gpu
        .device
        .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("copy4"),
            layout: None,
            module: &module,
            entry_point: Some("copy4"),
            compilation_options: Default::default(),
            cache: None,
        });
    let group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("copy4"),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: src.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: dst.as_entire_binding(),
            },
        ],
    });
    let groups = (bytes / COPY_PER_WORKGROUP) as u32;
    let kernel = timing::time_encoded(gpu, warmup, runs, |encoder| {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &group, &[]);
        for _ in 0..COPIES {
            pass.dispatch_workgroups(groups, 1, 1);
        }
    })?;
    // Its first and last workgroups' bytes: a wrong index would leave either stale.
    let span = COPY_PER_WORKGROUP.min(bytes);
    for offset in [0, bytes - span] {
        let got = crate::tensor::readback::read_range(gpu, &dst, offset, span).block_on()?;
        let want = (offset / 4..(offset + span) / 4).flat_map(|i| word(i).to_le_bytes());
        if !got.into_iter().eq(want) {
            return Err(Error::Readback(format!(
                "the copy kernel did not copy bytes {offset}..{}",
                offset + span
            )));
        }
    }
    let copied = timing::time_encoded(gpu, warmup, runs, |encoder| {
        for _ in 0..COPIES {
            encoder.copy_buffer_to_buffer(&src, 0, &dst, 0, bytes);
        }
    })?;
    let moved = 2.0 * bytes as f64 * f64::from(COPIES);
    Ok([
        DecodeRow {
            kernel: format!("copy kernel {} MiB x{COPIES}", bytes >> 20),
            timing: kernel,
            bytes: moved,
        },
        DecodeRow {
            kernel: format!("copy_buffer_to_buffer {} MiB x{COPIES}", bytes >> 20),
            timing: copied,
            bytes: moved,
        },
    ])
}

/// Keys per page of the paged decode row: vLLM's default.
const PAGE: u32 = 16;

/// The caches `decode` can time split-K over, by the names `--cache-dtypes` takes.
pub const DECODE_CACHES: [&str; 5] = ["f32", "f16", "bf16", "e4m3", "e5m2"];

/// Which of `decode`'s split-K rows a run times.
#[derive(Clone, Copy, Debug, Default)]
pub struct DecodeRows<'a> {
    /// The caches by name ([`DECODE_CACHES`]); empty: every one the adapter has.
    pub caches: &'a [String],
    /// Also the staged split pass cut to its phases
    /// ([`attn_dsl::emit::coop::Phases::decode_sets`]).
    pub phases: bool,
}

/// Times the plain decode (one workgroup per head) and split-K decode (both passes) on
/// `shape`, on the same uploaded cache, then split-K on a paged copy of it, then split-K
/// over each cache the adapter has (those `which` names) in each layout with its passes
/// alone (and the staged pass's phases, where `which` asks); `slice_len` overrides the
/// slicing rule. `each` sees every row as it is measured (a run of large caches takes a
/// minute).
pub fn decode(
    gpu: &Gpu,
    (shape, which): (DecodeShape, DecodeRows),
    slice_len: Option<u32>,
    (warmup, runs): (usize, usize),
    mut each: impl FnMut(&DecodeRow),
) -> Result<Vec<DecodeRow>, Error> {
    let h = shape.heads;
    let masks = Masks::default();
    let widths = (h.head_dim, h.head_dim_v);
    let f32_split = |cache| {
        let spec = crate::ops::decode::DecodeSpec {
            cache,
            ..crate::ops::decode::DecodeSpec::new(widths.0, widths.1, Dtype::F32)
        };
        crate::ops::decode::SplitDecode::for_spec(gpu, &spec)
    };
    let split = f32_split(Cache::Contiguous)?;
    let plain_spec = KernelSpec::standard(
        &crate::plan::kernels::family_name("attention_decode", h.head_dim),
        Op::Decode,
        h.head_dim,
        masks,
    )
    .with_head_dim_v(h.head_dim_v);
    let plain = Kernel::now(
        gpu,
        &attn_dsl::compile(&plain_spec).map_err(|e| Error::Pipeline {
            kernel: plain_spec.name.clone(),
            message: e.to_string(),
        })?,
    )?;
    let (b, len) = (shape.batch as usize, shape.cache_len as usize);
    let rows = b * len * h.n_kv_heads as usize;
    let q = random(b * (h.n_heads * h.head_dim) as usize, 1);
    let k = random(rows * h.head_dim as usize, 2);
    let v = random(rows * h.head_dim_v as usize, 3);
    let input = crate::ops::decode::DecodeInput {
        batch: shape.batch,
        cache_len: shape.cache_len,
        heads: h,
        q: &q,
        k_cache: &k,
        v_cache: &v,
        scale: None,
        mods: Default::default(),
    };
    let prepared = split.prepare(gpu, &input, None, slice_len)?;
    let dims = [
        ("cache_len", shape.cache_len),
        ("n_heads", h.n_heads),
        ("n_kv_heads", h.n_kv_heads),
        ("head_dim", h.head_dim),
        ("batch", shape.batch),
        ("capacity", shape.cache_len),
    ];
    let (dims_buf, params_buf) =
        uniforms(gpu, plain.abi(), &dims, &[("scale", h.default_scale())])?;
    let o = buffers::output::<f32>(gpu, "o", b * (h.n_heads * h.head_dim_v) as usize);
    let mut bound = prepared.inputs().to_vec();
    bound.extend([("o", &o), ("dims", &dims_buf), ("params", &params_buf)]);
    let plain_step = Step {
        kernel: &plain,
        bound,
        grid: checked_grid(plain.abi(), gpu.limits(), &dims)?,
    };
    let s = prepared.slicing;
    let bytes = shape.bytes();
    // The same cache paged, in pages of PAGE keys in reverse order in a pool of just those
    // pages (so it fits wherever the contiguous cache does).
    let paged = f32_split(Cache::Paged)?;
    let (table, k_pool, v_pool) =
        crate::harness::cases::page_cache(h, (shape.batch, shape.cache_len), PAGE, 0, [&k, &v]);
    let pages = crate::ops::decode::Pages {
        block_table: &table,
        page_size: PAGE,
    };
    let paged_input = crate::ops::decode::DecodeInput {
        k_cache: &k_pool,
        v_cache: &v_pool,
        ..input
    };
    let paged_prepared = paged.prepare(gpu, &paged_input, Some(&pages), slice_len)?;
    let mut rows = Vec::new();
    let mut push = |row: DecodeRow| {
        each(&row);
        rows.push(row);
    };
    push(DecodeRow {
        kernel: format!("decode plain ({} workgroups)", h.n_heads * shape.batch),
        timing: timing::time(gpu, &[plain_step], warmup, runs)?,
        bytes,
    });
    push(DecodeRow {
        kernel: format!(
            "decode split-K {}x{} + reduce ({} workgroups)",
            s.n_slices,
            s.slice_len,
            prepared.split_workgroups()
        ),
        timing: timing::time(gpu, &prepared.steps(&split), warmup, runs)?,
        bytes,
    });
    push(DecodeRow {
        kernel: format!(
            "decode split-K {}x{} paged ({PAGE}-key pages)",
            s.n_slices, s.slice_len
        ),
        timing: timing::time(gpu, &paged_prepared.steps(&paged), warmup, runs)?,
        bytes,
    });
    // The same step in every dtype and fp8 cache, with the split pass staged and (where the
    // device has subgroups) streamed, each followed by its split pass alone: what the
    // streaming costs beside the reduce's fixed cost and the second dispatch's.
    let ends = gpu.half_dtypes().first().copied().unwrap_or(Dtype::F32);
    let mut variants: Vec<(Dtype, Option<Fp8>)> = vec![(Dtype::F32, None)];
    variants.extend(gpu.half_dtypes().into_iter().map(|d| (d, None)));
    variants.extend(Fp8::ALL.map(|f| (ends, Some(f))));
    let named = |(dtype, kv_fp8): &(Dtype, Option<Fp8>)| {
        let name = kv_fp8.map_or(dtype.name(), Fp8::name);
        which.caches.is_empty() || which.caches.iter().any(|o| o == name)
    };
    variants.retain(named);
    for (dtype, kv_fp8) in variants {
        for (layout, combine) in decode_layouts(gpu) {
            let spec = crate::ops::decode::DecodeSpec {
                masks,
                kv_fp8,
                ..crate::ops::decode::DecodeSpec::new(h.head_dim, h.head_dim_v, dtype)
            };
            let kernels =
                crate::ops::decode::SplitDecode::with_passes(gpu, &spec, layout, combine)?;
            if slice_len.is_some_and(|len| len > kernels.max_slice()) {
                continue;
            }
            let prepared = kernels.prepare(gpu, &input, None, slice_len)?;
            let s = prepared.slicing;
            let steps = prepared.steps(&kernels);
            let (label, bytes) = match kv_fp8 {
                None => (
                    format!("{}{}", dtype.name(), layout_name(layout, combine)),
                    shape.bytes_in(f64::from(dtype.bytes())),
                ),
                Some(f) => (
                    format!(
                        "{} cache{}{FP8_ROW}{}",
                        f.name(),
                        layout_name(layout, combine),
                        dtype.name()
                    ),
                    shape.bytes_of(1.0, f64::from(dtype.bytes())),
                ),
            };
            let passes = match kernels.combines() {
                true => "combined in place",
                false => "+ reduce",
            };
            push(DecodeRow {
                kernel: format!(
                    "decode split-K {}x{} {passes}, {label}",
                    s.n_slices, s.slice_len
                ),
                timing: timing::time(gpu, &steps, warmup, runs)?,
                bytes,
            });
            let (split_pass, reduce_pass) = steps.split_at(1);
            let parts = [("split", split_pass, bytes), ("reduce", reduce_pass, 0.0)];
            for (part, steps, bytes) in parts.into_iter().filter(|_| !kernels.combines()) {
                push(DecodeRow {
                    kernel: format!("  part: {part} pass alone"),
                    timing: timing::time(gpu, steps, warmup, runs)?,
                    bytes,
                });
            }
            // The whole decode timed again on the same buffers, after the passes alone: a
            // row whose first timing is slow and this one is not was slowed by what came
            // before it (its cache's upload), not by its kernels.
            push(DecodeRow {
                kernel: "  again: the whole decode".into(),
                timing: timing::time(gpu, &steps, warmup, runs)?,
                bytes,
            });
            if which.phases && layout == SplitLayout::Staged && combine == Combine::ReducePass {
                let split = &steps[0];
                for (name, keep) in Phases::decode_sets() {
                    let abi = crate::ops::decode::staged_phases(gpu, &spec, keep)?;
                    let kernel = Kernel::now(gpu, &abi)?;
                    let step = Step {
                        kernel: &kernel,
                        bound: split.bound.clone(),
                        grid: split.grid,
                    };
                    push(DecodeRow {
                        kernel: format!("  phases: {name}"),
                        timing: timing::time(gpu, &[step], warmup, runs)?,
                        bytes,
                    });
                }
            }
        }
    }
    Ok(rows)
}

/// The split-pass layouts `bench --decode` times: staged, and streamed where the device has
/// subgroups.
/// The split passes timed: the staged one and its reduce, the staged one combining its
/// slices in place where the planner takes it on one wave's grids, and the streamed one
/// where the device has subgroups; each at every grid (the planner's pick is among them).
fn decode_layouts(gpu: &Gpu) -> Vec<(SplitLayout, Combine)> {
    let staged = SplitLayout::Staged;
    let mut layouts = vec![(staged, Combine::ReducePass)];
    if Combine::planned(gpu, staged) != Combine::ReducePass {
        layouts.push((staged, Combine::InPlace));
    }
    if gpu.has_subgroups() {
        layouts.push((SplitLayout::Streamed, Combine::ReducePass));
    }
    layouts
}

fn layout_name(layout: SplitLayout, combine: Combine) -> &'static str {
    match (layout, combine) {
        (SplitLayout::Staged, Combine::InPlace) => " in-place",
        (SplitLayout::Staged, _) => " staged",
        (SplitLayout::Streamed, _) => " streamed",
    }
}

/// What an fp8 decode row's label says before the dtype of Q and O.
pub const FP8_ROW: &str = ", Q and O ";
