//! Which flash configuration and backward schedule to use on an adapter: the candidates
//! `check` proves right, and the table `bench --tune` writes after timing them.
//!
//! The runtime reads the table for its adapter (from `ATTN_TUNING`, else the built-in
//! tables measured on known GPUs) and falls back to portable defaults. An entry that is not
//! among [`forward_candidates`] is refused, so a table can never select a configuration
//! that `check` did not cover.

use std::collections::BTreeMap;
use std::path::Path;

use attn_dsl::row_layer::RowSums;
use attn_dsl::{Dtype, FlashConfig, KernelAbi, Masks, Matrix, Op};
use serde::{Deserialize, Serialize};

use crate::device::Gpu;
use crate::plan::calibration::Calibration;
use crate::plan::kernels::{AttentionSpec, flash_forward};
use crate::shape::Heads;

/// Every flash forward configuration the planner may pick for `head_dim`, derived by
/// rule (`attn_dsl::configs`): candidate 0 fits WebGPU's defaults and is the default; the
/// `+sg` twins (subgroup reductions) come last.
pub fn forward_candidates(head_dim: u32) -> Vec<FlashConfig> {
    static DERIVED: Derived = Derived::new();
    DERIVED.get(head_dim, attn_dsl::configs::forward)
}

/// Every tiled backward configuration the planner may pick for `head_dim`, derived by
/// rule (`attn_dsl::configs`), each valid for both halves (dQ by query tiles, dK and dV by
/// key tiles); candidate 0 fits WebGPU's defaults where any does.
pub fn backward_candidates(head_dim: u32) -> Vec<FlashConfig> {
    static DERIVED: Derived = Derived::new();
    DERIVED.get(head_dim, attn_dsl::configs::backward)
}

/// Configurations derived once per head_dim: deriving builds and lays out every candidate
/// kernel spec, and the planners ask on every recorded call.
struct Derived(std::sync::Mutex<Vec<(u32, Vec<FlashConfig>)>>);

impl Derived {
    const fn new() -> Derived {
        Derived(std::sync::Mutex::new(Vec::new()))
    }

    fn get(&self, head_dim: u32, derive: fn(u32) -> Vec<FlashConfig>) -> Vec<FlashConfig> {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, configs)) = held.iter().find(|(d, _)| *d == head_dim) {
            return configs.clone();
        }
        let configs = derive(head_dim);
        held.push((head_dim, configs.clone()));
        configs
    }
}

/// The tiled backward's configurations in `dtype`, best first: the cooperative-matrix
/// ones that fit `gpu` where the adapter has them and the dtype is f16, then the first
/// scalar candidate (the portable one; half precision has no measured table to choose
/// among the others by).
pub fn backward_configs(gpu: &Gpu, head_dim: u32, dtype: Dtype) -> Vec<FlashConfig> {
    let coop = match gpu.coop16_for(dtype, Op::BackwardQ, head_dim) {
        true => attn_dsl::configs::coop_backward_in(
            head_dim,
            gpu.limits().max_compute_workgroup_storage_size,
            dtype,
        ),
        false => Vec::new(),
    };
    coop.into_iter()
        .chain(backward_candidates(head_dim).into_iter().take(1))
        .collect()
}

/// Whether `gpu` can run `abi`: its workgroup memory and storage buffers within the
/// device's limits, and the features it needs present.
pub fn fits(gpu: &Gpu, abi: &KernelAbi) -> bool {
    let limits = gpu.limits();
    gpu.supports(abi)
        && abi.workgroup_storage_bytes <= limits.max_compute_workgroup_storage_size
        && abi.storage_buffers() as u32 <= limits.max_storage_buffers_per_shader_stage
}

/// A tuning table: the measured best per head_dim on one adapter.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Table {
    /// The adapter's name, as wgpu reports it.
    pub adapter: String,
    /// Flash forward configuration by head_dim.
    pub forward: BTreeMap<u32, FlashConfig>,
    /// Backward schedule by head_dim, by [`crate::Schedule`]'s display name.
    #[serde(default)]
    pub backward: BTreeMap<u32, String>,
    /// The LayerNorm + Linear backward's row-sum schedule ("atomic" or "two-pass"), by
    /// `{hidden}x{out}`, then by the row count it was measured at (`bench --layernorm ROWS
    /// --tune`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub layernorm: BTreeMap<String, BTreeMap<u32, String>>,
    /// Workgroups of 256 invocations the adapter runs at once, measured by `bench --tune`
    /// (`harness::bench::probe`): what the planner's counts of workgroups scale by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resident_workgroups: Option<u32>,
}

/// The key of a LayerNorm + Linear entry in [`Table::layernorm`].
pub fn layernorm_key(hidden: u32, out: u32) -> String {
    format!("{hidden}x{out}")
}

/// The row-sum schedule a table names; None for a name it cannot hold.
pub fn row_sums_named(name: &str) -> Option<RowSums> {
    [RowSums::Atomic, RowSums::TwoPass]
        .into_iter()
        .find(|s| row_sums_name(*s) == name)
}

/// The table's (and the bench's) name of a row-sum schedule.
pub fn row_sums_name(sums: RowSums) -> &'static str {
    match sums {
        RowSums::Atomic => "atomic",
        RowSums::TwoPass => "two-pass",
    }
}

/// Tables measured with `bench --tune` on known adapters, used when `ATTN_TUNING` names none.
const BUILT_IN: &[&str] = &[include_str!("../../tuning/nvidia-h100.json")];

pub use crate::error::TuningError;

impl Table {
    /// Reads and vets a table: every configuration must be a checked candidate.
    pub fn read(path: &Path) -> Result<Table, crate::error::Error> {
        let text = std::fs::read_to_string(path).map_err(|source| TuningError::Read {
            path: path.into(),
            source,
        })?;
        Ok(Table::parse(&text, path)?)
    }

    fn parse(text: &str, path: &Path) -> Result<Table, TuningError> {
        let table: Table = serde_json::from_str(text).map_err(|source| TuningError::Parse {
            path: path.into(),
            source,
        })?;
        for (&head_dim, config) in &table.forward {
            if !forward_candidates(head_dim).contains(config) {
                return Err(TuningError::Unchecked {
                    path: path.into(),
                    head_dim,
                    config: config.label(),
                });
            }
        }
        for (key, by_rows) in &table.layernorm {
            if let Some(name) = by_rows.values().find(|n| row_sums_named(n).is_none()) {
                return Err(TuningError::RowSums {
                    path: path.into(),
                    key: key.clone(),
                    name: name.clone(),
                });
            }
        }
        Ok(table)
    }

    /// The table at `path`, or an empty one for `adapter` when there is no file yet.
    pub fn read_or_new(path: &Path, adapter: &str) -> Result<Table, crate::error::Error> {
        if path.exists() {
            return Table::read(path);
        }
        Ok(Table {
            adapter: adapter.to_string(),
            ..Table::default()
        })
    }

    /// The planner's counts of workgroups for this adapter.
    pub fn calibration(&self) -> Calibration {
        Calibration {
            resident: self.resident_workgroups,
        }
    }

    /// The measured row-sum schedule of the LayerNorm + Linear backward `hidden -> out` on
    /// `rows` rows: the one measured at the most rows up to `rows` (else at the fewest);
    /// None when the table has no measurement at these widths.
    pub fn layernorm(&self, rows: u32, hidden: u32, out: u32) -> Option<RowSums> {
        let by_rows = self.layernorm.get(&layernorm_key(hidden, out))?;
        let (_, name) = by_rows
            .range(..=rows)
            .next_back()
            .or_else(|| by_rows.iter().next())?;
        row_sums_named(name)
    }

    /// Saves the table to `path` as pretty-printed JSON, the form [`Table::read`] reads.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(self).expect("a table serializes");
        std::fs::write(path, text + "\n")
    }

    /// The table for `gpu`: `ATTN_TUNING` if set (an error if unreadable), else a built-in
    /// table measured on the same adapter, else an empty table (portable defaults).
    pub fn for_gpu(gpu: &Gpu) -> Result<Table, crate::error::Error> {
        if let Some(path) = std::env::var_os("ATTN_TUNING") {
            return Table::read(Path::new(&path));
        }
        for text in BUILT_IN {
            let table = Table::parse(text, Path::new("(built in)"))?;
            if table.adapter == gpu.info().name {
                return Ok(table);
            }
        }
        Ok(Table::default())
    }

    /// The configuration to run the forward with for `head_dim` on `gpu`: the table's
    /// choice when the device can hold it, else the portable default.
    fn scalar_forward(&self, gpu: &Gpu, head_dim: u32) -> Option<FlashConfig> {
        let portable = forward_candidates(head_dim).first().copied();
        let tuned = self.forward.get(&head_dim).copied().filter(|c| {
            let spec = AttentionSpec::new(head_dim, Masks::default(), Dtype::F32);
            flash_forward(spec, *c).is_ok_and(|abi| fits(gpu, &abi))
        });
        tuned.or(portable)
    }

    /// The forward's configuration for `head_dim` in `dtype`: in f16 on a device with
    /// cooperative matrices, the first `coop16` configuration that fits it (tensor cores
    /// run f16 products several times faster than any scalar layout); otherwise
    /// the tuned scalar configuration that fits, else the portable one.
    pub fn forward(&self, gpu: &Gpu, head_dim: u32, dtype: Dtype) -> Option<FlashConfig> {
        self.forward_of(Op::Forward, gpu, head_dim, dtype)
    }

    /// The configuration of a continued cache's chunk ([`Op::Extend`]): the forward's
    /// rule, tensor cores where the dtype has them for that op (f16).
    pub fn extend(&self, gpu: &Gpu, head_dim: u32, dtype: Dtype) -> Option<FlashConfig> {
        self.forward_of(Op::Extend, gpu, head_dim, dtype)
    }

    fn forward_of(&self, op: Op, gpu: &Gpu, head_dim: u32, dtype: Dtype) -> Option<FlashConfig> {
        let coop = gpu
            .coop16_for(dtype, op, head_dim)
            .then(|| coop_candidates(gpu, head_dim, dtype).into_iter().next())
            .flatten();
        coop.or_else(|| self.scalar_forward(gpu, head_dim))
    }

    /// [`Table::forward`] for a problem of `batch` sequences of `seq_len` rows: where a
    /// tensor-core configuration with more rows per workgroup than the first still gives
    /// the grid [`Calibration::full_grid`] workgroups and as many resident ones, the one
    /// with the most rows.
    pub fn forward_for(
        &self,
        gpu: &Gpu,
        heads: Heads,
        (batch, seq_len): (u32, u32),
        dtype: Dtype,
    ) -> Option<FlashConfig> {
        let planned = self.forward(gpu, heads.width(), dtype)?;
        let candidates = coop_candidates(gpu, heads.width(), dtype);
        let resident = |c: &FlashConfig| resident(gpu, Op::Forward, heads.width(), *c, dtype);
        Some(widest_filling(
            planned,
            &candidates,
            (heads.n_heads * batch, seq_len),
            (self.calibration().full_grid(), &resident),
        ))
    }
}

/// `planned`, or the tensor-core candidate with the most rows per workgroup (more than
/// `planned`'s) whose grid over `seq_len` rows of `heads` heads (all sequences) still has
/// `full_grid` workgroups ([`Calibration::full_grid`]) and of which `resident` counts as
/// many at once as of `planned`. `resident` divides the adapter's workgroup memory limit
/// by a workgroup's: on an H200 (2026-11-30, `bench --only phases`, counted by the kernels)
/// an SM ran exactly that many of each forward configuration but one (48 KiB: two of
/// 24,084 bytes, one of 24,852), and the wider tile was faster only where it kept their
/// count: at head_dim 64, seq 4096, 16 heads, f16, 64x32/16@256 (two) took 0.391 ms against
/// 0.463 for 128x32/16@256 (one); at 128, where both hold one, 0.836 against 0.682. The
/// rule is measured on NVIDIA's driver only; where an adapter allows 64 KiB it keeps the
/// 64-row tile at 128 too, unmeasured there.
fn widest_filling(
    planned: FlashConfig,
    candidates: &[FlashConfig],
    (heads, seq_len): (u32, u32),
    (full_grid, resident): (u32, &dyn Fn(&FlashConfig) -> u32),
) -> FlashConfig {
    let grid = |c: &FlashConfig| seq_len.div_ceil(c.tile) * heads;
    candidates
        .iter()
        .filter(|c| planned.matrix == Matrix::Coop16 && c.tile > planned.tile)
        .filter(|c| grid(c) >= full_grid && resident(c) >= resident(&planned))
        .max_by_key(|c| c.tile)
        .copied()
        .unwrap_or(planned)
}

/// The workgroups of a tensor-core configuration of `op` (the forward, or a continued
/// cache's chunk) an SM holds at once: the adapter's workgroup memory over the
/// configuration's (the count an H200 ran, see `widest_filling`); none for a configuration
/// that declares no memory.
pub fn resident(gpu: &Gpu, op: Op, head_dim: u32, config: FlashConfig, dtype: Dtype) -> u32 {
    let bytes = attn_dsl::configs::coop_bytes(op, head_dim, config, dtype);
    let limit = gpu.limits().max_compute_workgroup_storage_size;
    limit.checked_div(bytes).unwrap_or(0)
}

/// The cooperative-matrix forward configurations for `head_dim` in `dtype` that fit
/// `gpu`'s workgroup memory, best first (empty without cooperative matrices).
pub fn coop_candidates(gpu: &Gpu, head_dim: u32, dtype: Dtype) -> Vec<FlashConfig> {
    match gpu.has_coop16() {
        true => attn_dsl::configs::coop_forward_in(
            head_dim,
            gpu.limits().max_compute_workgroup_storage_size,
            dtype,
        ),
        false => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::kernels::*;
    use attn_dsl::KernelSpec;

    fn f32_spec(head_dim: u32, masks: Masks) -> AttentionSpec {
        AttentionSpec::new(head_dim, masks, Dtype::F32)
    }

    fn f16_spec((head_dim, head_dim_v): (u32, u32), masks: Masks) -> AttentionSpec {
        AttentionSpec::new(head_dim, masks, Dtype::F16).with_head_dim_v(head_dim_v)
    }

    #[test]
    fn every_candidate_compiles_and_the_first_fits_webgpu() {
        for head_dim in [32, 64, 80, 96, 128, 256] {
            let candidates = forward_candidates(head_dim);
            assert!(!candidates.is_empty());
            for (i, c) in candidates.iter().enumerate() {
                let masks = Masks::new(true, true);
                let abi = flash_forward(f32_spec(head_dim, masks), *c)
                    .unwrap_or_else(|e| panic!("{} d{head_dim}: {e}", c.label()));
                if i == 0 {
                    assert_eq!(abi.target, attn_dsl::Target::Webgpu, "{}", c.label());
                }
            }
        }
    }

    #[test]
    fn every_backward_candidate_compiles_and_the_first_fits_webgpu() {
        let masks = Masks::new(true, true);
        for head_dim in [32, 64, 80, 96, 128] {
            for (i, c) in backward_candidates(head_dim).iter().enumerate() {
                let pair = flash_backward(f32_spec(head_dim, masks), *c)
                    .unwrap_or_else(|e| panic!("{} d{head_dim}: {e}", c.label()));
                for abi in &pair {
                    if i == 0 {
                        assert_eq!(abi.target, attn_dsl::Target::Webgpu, "{}", c.label());
                    }
                }
            }
        }
    }

    /// The family's flash descriptions are the portable candidates, so `generated/` and the
    /// snapshots hold exactly what the runtime runs by default.
    #[test]
    fn family_flash_kernels_are_the_portable_candidates() {
        use crate::kernels::*;
        let masks = Masks::new(true, true);
        let forward = [
            (64, &attention_forward_flash::ABI),
            (128, &attention_forward_flash_d128::ABI),
        ];
        for (head_dim, abi) in forward {
            let compiled =
                flash_forward(f32_spec(head_dim, masks), forward_candidates(head_dim)[0]);
            assert_eq!(&compiled.unwrap(), abi);
        }
        let backward = [
            (
                64,
                [
                    &attention_backward_dq_flash::ABI,
                    &attention_backward_dkdv_flash::ABI,
                ],
            ),
            (
                128,
                [
                    &attention_backward_dq_flash_d128::ABI,
                    &attention_backward_dkdv_flash_d128::ABI,
                ],
            ),
        ];
        for (head_dim, [q, kv]) in backward {
            let [cq, ckv] =
                flash_backward(f32_spec(head_dim, masks), backward_candidates(head_dim)[0])
                    .unwrap();
            assert_eq!(&cq, q);
            assert_eq!(&ckv, kv);
        }
    }

    #[test]
    fn family_flash_backward_is_the_scatter_kernel_of_candidate_0() {
        let masks = Masks::new(true, true);
        let kv = backward_candidates(64)[0];
        for (scatter, abi) in [
            (
                attn_dsl::Scatter::Cas,
                &crate::kernels::attention_backward_flash::ABI,
            ),
            (
                attn_dsl::Scatter::F32Atomic,
                &crate::kernels::attention_backward_flash::ABI_F32_ATOMIC,
            ),
        ] {
            assert_eq!(
                &flash_scatter(f32_spec(64, masks), kv, scatter).unwrap(),
                abi
            );
        }
    }

    #[test]
    fn family_streaming_backward_is_the_query_kernel_of_candidate_0() {
        let masks = Masks::new(true, true);
        use crate::kernels::attention_backward;
        let q = backward_candidates(64)[0];
        let cas = flash_streaming(f32_spec(64, masks), q, attn_dsl::Scatter::Cas).unwrap();
        let f32a = flash_streaming(f32_spec(64, masks), q, attn_dsl::Scatter::F32Atomic).unwrap();
        assert_eq!(&cas, &attention_backward::ABI);
        assert_eq!(&f32a, &attention_backward::ABI_F32_ATOMIC);
    }

    #[test]
    fn family_tensor_core_forward_is_the_first_coop_candidate() {
        let first =
            attn_dsl::configs::coop_forward(128, attn_dsl::configs::CANDIDATE_WORKGROUP_BYTES)[0];
        assert_eq!(first.label(), "64x32/16@256+tc");
        let mut spec = KernelSpec {
            dtype: Dtype::F16,
            ..KernelSpec::flash(
                "attention_forward_flash_tc_d128",
                Op::Forward,
                128,
                Masks::new(true, true),
                first,
            )
        };
        spec.fit_target();
        let compiled = attn_dsl::compile(&spec).unwrap();
        assert_eq!(
            &compiled,
            &crate::kernels::attention_forward_flash_tc_d128::ABI
        );
        // Labels round-trip, so a tuning table can name the configuration.
        assert_eq!(FlashConfig::from_label(&first.label()), Some(first));
    }

    #[test]
    fn family_scattered_half_is_the_first_coop_candidate_at_head_dim_64() {
        use crate::kernels::attention_backward_dkdv_flash_scattered_tc as family;
        let first =
            attn_dsl::configs::coop_backward(64, attn_dsl::configs::CANDIDATE_WORKGROUP_BYTES)[0];
        for (scatter, abi) in [
            (attn_dsl::Scatter::Cas, &family::ABI),
            (attn_dsl::Scatter::F32Atomic, &family::ABI_F32_ATOMIC),
        ] {
            let spec = f16_spec((64, 64), Masks::new(true, true));
            let compiled = flash_backward_scattered(spec, first, scatter).unwrap();
            // The same kernel but for its name (the runtime's omits `_tc`).
            let text = |abi: &KernelAbi| abi.wgsl.replace(&*abi.name, "NAME");
            assert_eq!(compiled.target, abi.target);
            assert_eq!(text(&compiled), text(abi));
        }
    }

    /// How many of each forward workgroup 48 KiB holds at `head_dim` in f16.
    fn resident_in_48k(head_dim: u32) -> impl Fn(&FlashConfig) -> u32 {
        move |c| 49152 / attn_dsl::configs::coop_forward_bytes(head_dim, *c, Dtype::F16)
    }

    #[test]
    fn wide_tensor_core_tiles_only_where_the_grid_fills() {
        let coop =
            attn_dsl::configs::coop_forward(128, attn_dsl::configs::CANDIDATE_WORKGROUP_BYTES);
        let first = coop[0];
        let wide = *coop
            .iter()
            .find(|c| c.tile == 128)
            .expect("a 128-row candidate");
        assert_eq!(wide.label(), "128x32/16@256+tc");
        let fill = |planned, problem| {
            widest_filling(planned, &coop, problem, (256, &resident_in_48k(128)))
        };
        // seq 4096, 16 heads: 512 workgroups of 128 rows.
        assert_eq!(fill(first, (16, 4096)), wide);
        // The seeds' layer, seq 512 with 12 heads: 48 of 128 rows, too few.
        assert_eq!(fill(first, (12, 512)), first);
        assert_eq!(fill(first, (2 * 12, 1024)), first);
        assert_eq!(fill(first, (4 * 16, 1024)), wide);
        // A scalar plan stays scalar.
        let scalar = forward_candidates(128)[0];
        assert_eq!(fill(scalar, (16, 4096)), scalar);
    }

    /// At head_dim 64 the first candidate's workgroups fit twice in 48 KiB and the 128-row
    /// tile's once: the wider tile would halve the workgroups an SM runs at once.
    #[test]
    fn wide_tensor_core_tiles_only_where_as_many_stay_resident() {
        let coop =
            attn_dsl::configs::coop_forward(64, attn_dsl::configs::CANDIDATE_WORKGROUP_BYTES);
        let first = coop[0];
        let resident = resident_in_48k(64);
        let wide = coop.iter().find(|c| c.tile == 128).expect("a 128-row tile");
        assert_eq!(
            (first.label().as_str(), resident(&first)),
            ("64x32/16@256+tc", 2)
        );
        assert_eq!(resident(wide), 1);
        assert_eq!(
            widest_filling(first, &coop, (16, 4096), (256, &resident)),
            first
        );
        // At 128 both hold one: the wider tile is taken.
        let resident = resident_in_48k(128);
        let coop =
            attn_dsl::configs::coop_forward(128, attn_dsl::configs::CANDIDATE_WORKGROUP_BYTES);
        assert_eq!(
            (resident(&coop[0]), resident(&coop[coop.len() - 1])),
            (1, 1)
        );
    }

    #[test]
    fn scattered_key_major_half_walks_query_heads_and_adds_by_atomics() {
        let masks = Masks::new(true, true);
        for head_dim in [64, 128] {
            let configs = attn_dsl::configs::coop_backward(
                head_dim,
                attn_dsl::configs::CANDIDATE_WORKGROUP_BYTES,
            );
            for config in configs {
                for scatter in [attn_dsl::Scatter::Cas, attn_dsl::Scatter::F32Atomic] {
                    let abi = flash_backward_scattered(
                        f16_spec((head_dim, head_dim), masks),
                        config,
                        scatter,
                    )
                    .unwrap();
                    let owned =
                        flash_backward(f16_spec((head_dim, head_dim), masks), config).unwrap();
                    // seq 512, 12 query heads over 4 KV heads, batch 2.
                    let dims = [512, 12, 4, head_dim, 2];
                    let tiles = 512 / config.tile;
                    assert_eq!(abi.dispatch_grid(&dims), [tiles, 12, 2]);
                    assert_eq!(owned[1].dispatch_grid(&dims), [tiles, 4, 2]);
                    let add = match scatter {
                        attn_dsl::Scatter::Cas => "atomicCompareExchangeWeak(&dk[i]",
                        attn_dsl::Scatter::F32Atomic => "atomicAdd(&dk[i], x)",
                    };
                    assert!(abi.wgsl.contains(add), "{}", config.label());
                    assert!(abi.wgsl.contains("add_dv(at + e, sh_s[x + e]);"));
                    assert!(abi.wgsl.contains("let kv_h = kv_head(qh);"));
                }
            }
        }
    }

    /// The tensor-core backward at two widths: every candidate of the wider width compiles
    /// (naga-validated) in both halves and the scattered key-major half, dV stored at its
    /// own offsets and dK, dQ at theirs.
    #[test]
    fn tensor_core_backward_takes_rows_of_two_widths() {
        let masks = Masks::new(true, true);
        for dims in [(192, 128), (64, 128), (128, 64)] {
            let width = dims.0.max(dims.1);
            let configs = attn_dsl::configs::coop_backward(
                width,
                attn_dsl::configs::CANDIDATE_WORKGROUP_BYTES,
            );
            assert!(!configs.is_empty(), "{dims:?}");
            for config in configs {
                let what = format!("{dims:?} {}", config.label());
                let [q, kv] = flash_backward(f16_spec(dims, masks), config)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!((q.head_dim, q.head_dim_v()), dims);
                assert!(
                    kv.wgsl.contains("let base_v = v_index(out_row, kv_h);"),
                    "{what}"
                );
                let scatter = attn_dsl::Scatter::Cas;
                flash_backward_scattered(f16_spec(dims, masks), config, scatter)
                    .unwrap_or_else(|e| panic!("scattered {what}: {e}"));
            }
        }
    }

    #[test]
    fn family_tensor_core_backward_is_the_first_coop_candidate() {
        let first =
            attn_dsl::configs::coop_backward(128, attn_dsl::configs::CANDIDATE_WORKGROUP_BYTES)[0];
        assert_eq!(first.label(), "64x32/16@256+tc");
        let [q, kv] = flash_backward(f16_spec((128, 128), Masks::new(true, true)), first).unwrap();
        let family = [
            &crate::kernels::attention_backward_dq_flash_tc_d128::ABI,
            &crate::kernels::attention_backward_dkdv_flash_tc_d128::ABI,
        ];
        // The same kernels but for their names (the runtime's omit `_tc`).
        for (compiled, family) in [q, kv].iter().zip(family) {
            assert_eq!(compiled.target, family.target, "{}", family.name);
            let text = |abi: &KernelAbi| abi.wgsl.replace(&*abi.name, "NAME");
            assert_eq!(text(compiled), text(family), "{}", family.name);
        }
    }

    #[test]
    fn family_subgroup_forward_is_a_candidate() {
        let masks = Masks::new(true, true);
        let sg = FlashConfig {
            tile: 64,
            inner: 32,
            rows_per_thread: 4,
            workgroup_size: 128,
            subgroups: true,
            matrix: attn_dsl::Matrix::Scalar,
        };
        assert!(forward_candidates(64).contains(&sg));
        let spec = KernelSpec::flash("attention_forward_flash_sg", Op::Forward, 64, masks, sg);
        let compiled = attn_dsl::compile(&spec).unwrap();
        assert_eq!(&compiled, &crate::kernels::attention_forward_flash_sg::ABI);
    }

    #[test]
    fn built_in_tables_pick_only_candidates() {
        for text in BUILT_IN {
            Table::parse(text, Path::new("(built in)")).unwrap();
        }
    }

    #[test]
    fn layernorm_entries_pick_the_nearest_measurement_below_and_refuse_unknown_names() {
        let text = r#"{"adapter": "x", "forward": {},
            "layernorm": {"768x3072": {"512": "atomic", "8192": "two-pass"}}}"#;
        let table = Table::parse(text, Path::new("t.json")).unwrap();
        assert_eq!(table.layernorm(100, 768, 3072), Some(RowSums::Atomic));
        assert_eq!(table.layernorm(4096, 768, 3072), Some(RowSums::Atomic));
        assert_eq!(table.layernorm(9000, 768, 3072), Some(RowSums::TwoPass));
        assert_eq!(table.layernorm(9000, 768, 768), None);
        let bad = text.replace("two-pass", "scatter");
        let err = Table::parse(&bad, Path::new("t.json")).unwrap_err();
        assert!(err.to_string().contains("`scatter`"), "{err}");
    }

    #[test]
    fn a_table_naming_an_unchecked_config_is_refused() {
        let text = r#"{"adapter": "x", "forward": {"64": {"tile": 8, "inner": 8,
            "rows_per_thread": 1, "workgroup_size": 64}}}"#;
        let err = Table::parse(text, Path::new("t.json")).unwrap_err();
        assert!(err.to_string().contains("not a candidate"), "{err}");
    }
}
