//! The family's kernels by rule: each op's [`KernelSpec`] built from what the attention
//! computes ([`AttentionSpec`]) and a configuration, named as the family names them, on
//! the smallest target that holds it.

use attn_dsl::emit::coop::Phases;
use attn_dsl::{
    DslError, Dtype, FlashConfig, KernelAbi, KernelSpec, Masks, Op, Scatter, WriteMode,
};

/// What an attention op computes, whatever kernel runs it: the widths of Q and K rows
/// (`head_dim`) and of V and O rows (`head_dim_v`: `head_dim` but in MLA-style attention,
/// 192 and 128), the masks and modifiers its kernels are built with (the values come with
/// each call), and the dtype of Q, K, V, O and dO (gradients and LSE are f32).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionSpec {
    /// The width of Q and K rows.
    pub head_dim: u32,
    /// The width of V and O rows.
    pub head_dim_v: u32,
    /// The masks and modifiers the kernels are built with.
    pub masks: Masks,
    /// The element type of Q, K, V, O and dO.
    pub dtype: Dtype,
}

impl AttentionSpec {
    /// Q, K, V and O rows `head_dim` wide.
    pub fn new(head_dim: u32, masks: Masks, dtype: Dtype) -> AttentionSpec {
        AttentionSpec {
            head_dim,
            head_dim_v: head_dim,
            masks,
            dtype,
        }
    }

    /// V and O rows `head_dim_v` wide beside Q and K's `head_dim`.
    pub fn with_head_dim_v(self, head_dim_v: u32) -> AttentionSpec {
        AttentionSpec { head_dim_v, ..self }
    }

    /// (head_dim, head_dim_v).
    pub fn dims(&self) -> (u32, u32) {
        (self.head_dim, self.head_dim_v)
    }

    /// The wider row, which the tilings are laid out for.
    pub fn width(&self) -> u32 {
        self.head_dim.max(self.head_dim_v)
    }

    /// The family's flash kernel `base` of `op` under `config`, laid out for this spec,
    /// changed by `edit` (its writes, scatter, cache), then fitted to the smallest target
    /// that holds it.
    fn flash(
        &self,
        (base, op): (&str, Op),
        config: FlashConfig,
        edit: impl FnOnce(&mut KernelSpec),
    ) -> KernelSpec {
        let name = family_name(base, self.head_dim);
        let mut spec = KernelSpec {
            dtype: self.dtype,
            ..KernelSpec::flash(&name, op, self.head_dim, self.masks, config)
        }
        .with_head_dim_v(self.head_dim_v);
        edit(&mut spec);
        spec.fit_target();
        spec
    }
}

/// The family's naming: head_dim 64 unsuffixed, others `_d{head_dim}`.
pub fn family_name(base: &str, head_dim: u32) -> String {
    match head_dim {
        64 => base.to_string(),
        _ => format!("{base}_d{head_dim}"),
    }
}

/// [`family_name`] of a kernel that reads or writes a KV cache: an fp8 cache's kernel is
/// one of its own, `{base}_{format}`.
pub fn cache_family_name(base: &str, kv_fp8: Option<attn_dsl::Fp8>, head_dim: u32) -> String {
    match kv_fp8 {
        Some(f) => family_name(&format!("{base}_{}", f.name()), head_dim),
        None => family_name(base, head_dim),
    }
}

fn writes(names: &[(&str, WriteMode)]) -> Vec<(String, WriteMode)> {
    names.iter().map(|(n, m)| (n.to_string(), *m)).collect()
}

/// The flash forward under `config`, compiled now.
pub fn flash_forward(spec: AttentionSpec, config: FlashConfig) -> Result<KernelAbi, DslError> {
    flash_forward_phases(spec, config, Phases::ALL)
}

/// [`flash_forward`] with a tensor-core forward's key loop cut to the phases in `keep`
/// (`bench --only phases`; not attention unless `keep` is [`Phases::ALL`]).
pub fn flash_forward_phases(
    spec: AttentionSpec,
    config: FlashConfig,
    keep: Phases,
) -> Result<KernelAbi, DslError> {
    let kernel = spec.flash(("attention_forward_flash", Op::Forward), config, |_| ());
    attn_dsl::compile_phases(&kernel, keep)
}

/// [`flash_forward`] built to count its workgroups in flight (`resident`): how many the
/// GPU holds at once, `bench --only phases`'s residency of `config`.
pub fn flash_forward_counted(
    spec: AttentionSpec,
    config: FlashConfig,
) -> Result<KernelAbi, DslError> {
    let kernel = spec.flash(("attention_forward_flash", Op::Forward), config, |k| {
        k.counts_residency = true
    });
    attn_dsl::compile(&kernel)
}

/// The tiled backward's dQ and dK/dV kernels under `config`.
pub fn flash_backward(
    spec: AttentionSpec,
    config: FlashConfig,
) -> Result<[KernelAbi; 2], DslError> {
    flash_backward_phases(spec, config, Phases::ALL)
}

/// [`flash_backward`] with a tensor-core configuration's block loops cut to the phases in
/// `keep` (`bench --only phases`; not a backward unless `keep` is [`Phases::ALL`]).
pub fn flash_backward_phases(
    spec: AttentionSpec,
    config: FlashConfig,
    keep: Phases,
) -> Result<[KernelAbi; 2], DslError> {
    flash_backward_built(spec, config, keep, false)
}

/// [`flash_backward`]'s two halves built to count their workgroups in flight, as
/// [`flash_forward_counted`].
pub fn flash_backward_counted(
    spec: AttentionSpec,
    config: FlashConfig,
) -> Result<[KernelAbi; 2], DslError> {
    flash_backward_built(spec, config, Phases::ALL, true)
}

fn flash_backward_built(
    spec: AttentionSpec,
    config: FlashConfig,
    keep: Phases,
    counted: bool,
) -> Result<[KernelAbi; 2], DslError> {
    let q = spec.flash(
        ("attention_backward_dq_flash", Op::BackwardQ),
        config,
        |k| {
            k.writes.extend(spec.masks.score_grad_writes());
            k.counts_residency = counted;
        },
    );
    let kv = spec.flash(
        ("attention_backward_dkdv_flash", Op::BackwardKv),
        config,
        |k| {
            k.writes = writes(&[("dk", WriteMode::Owned), ("dv", WriteMode::Owned)]);
            k.counts_residency = counted;
        },
    );
    Ok([
        attn_dsl::compile_phases(&q, keep)?,
        attn_dsl::compile_phases(&kv, keep)?,
    ])
}

/// The key-major half of [`flash_backward`] on tensor cores (f16 or bf16) with dK and dV
/// added by `scatter` atomics from a workgroup per query head
/// ([`crate::ops::backward::Schedule::Scattered`]).
pub fn flash_backward_scattered(
    spec: AttentionSpec,
    config: FlashConfig,
    scatter: Scatter,
) -> Result<KernelAbi, DslError> {
    use WriteMode::AtomicScatter;
    let base = ("attention_backward_dkdv_flash_scattered", Op::BackwardKv);
    let kv = spec.flash(base, config, |k| {
        k.writes = writes(&[("dk", AtomicScatter), ("dv", AtomicScatter)]);
        k.scatter = scatter;
    });
    attn_dsl::compile(&kv)
}

/// The backward's prep (D = rowsum(dO ∘ O), packed with LSE) reading O and dO in the
/// spec's dtype; the masks do not enter it.
pub fn backward_prep(spec: AttentionSpec) -> Result<KernelAbi, DslError> {
    let mut kernel = KernelSpec {
        dtype: spec.dtype,
        workgroup_size: spec.width().next_power_of_two().max(32),
        ..KernelSpec::standard(
            &family_name("attention_backward_prep", spec.head_dim),
            Op::BackwardPrep,
            spec.head_dim,
            Masks::default(),
        )
    }
    .with_head_dim_v(spec.head_dim_v);
    kernel.fit_target();
    attn_dsl::compile(&kernel)
}

/// The flash backward (schedule (c)): the key-major kernel of `config` that owns dK and
/// dV and adds dQ into `dq` by `scatter` atomics.
pub fn flash_scatter(
    spec: AttentionSpec,
    config: FlashConfig,
    scatter: Scatter,
) -> Result<KernelAbi, DslError> {
    use WriteMode::{AtomicScatter, Owned};
    let own = [("dk", Owned), ("dv", Owned), ("dq", AtomicScatter)];
    atomic_kernel(
        spec,
        ("attention_backward_flash", Op::BackwardKv),
        config,
        &own,
        scatter,
    )
}

/// The streaming backward (schedule (b)): the query-major kernel of `config` that owns dQ
/// and adds dK and dV into `dkv` by `scatter` atomics; each lane of `dkv` holds dK's rows,
/// then dV's, at their widths.
pub fn flash_streaming(
    spec: AttentionSpec,
    config: FlashConfig,
    scatter: Scatter,
) -> Result<KernelAbi, DslError> {
    use WriteMode::{AtomicScatter, Owned};
    let own = [("dq", Owned), ("dkv", AtomicScatter)];
    atomic_kernel(
        spec,
        ("attention_backward", Op::BackwardQ),
        config,
        &own,
        scatter,
    )
}

/// A flash kernel of `op` with `writes` and the gradients every dS adds to (it sees every
/// dS), its atomic outputs added by `scatter`.
fn atomic_kernel(
    spec: AttentionSpec,
    (base, op): (&str, Op),
    config: FlashConfig,
    own: &[(&str, WriteMode)],
    scatter: Scatter,
) -> Result<KernelAbi, DslError> {
    let kernel = spec.flash((base, op), config, |k| {
        k.writes = writes(own);
        k.writes.extend(spec.masks.score_grad_writes());
        k.scatter = scatter;
    });
    attn_dsl::compile(&kernel)
}

/// How a chunk kernel's tiles and outputs are laid out: `sliced`, its key slices'
/// partials for the decode's reduce (else O and LSE); `packed`, the query heads of a KV
/// head in one tile ([`attn_dsl::Grid::pack_heads`]); `shared`, rows that each see the
/// whole cache (a cascade's queries of many sequences over their shared prefix) instead
/// of a continued cache's rows, causal among themselves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChunkForm {
    /// Partials of key slices instead of O and LSE.
    pub sliced: bool,
    /// A KV head's query heads packed into one tile's rows.
    pub packed: bool,
    /// Every row sees every key of the cache.
    pub shared: bool,
    /// Each sequence brings its own count of rows, from `q_starts`.
    pub ragged: bool,
}

/// The kernel of a continued cache's chunk ([`Op::Extend`]) over a cache of `cache`'s
/// layout (in `kv_fp8`'s bytes where given) under `config`: writing O and LSE, or (sliced)
/// its key slices' partials for the decode's reduce, which then joins the sinks.
pub fn extend(
    spec: AttentionSpec,
    ((cache, kv_fp8), form): ((attn_dsl::Cache, Option<attn_dsl::Fp8>), ChunkForm),
    config: FlashConfig,
) -> Result<KernelAbi, DslError> {
    let sliced = form.sliced;
    let base = match (cache, sliced) {
        (attn_dsl::Cache::Contiguous, false) => "attention_extend",
        (attn_dsl::Cache::Paged, false) => "attention_extend_paged",
        (attn_dsl::Cache::Contiguous, true) => "attention_extend_sliced",
        (attn_dsl::Cache::Paged, true) => "attention_extend_sliced_paged",
    };
    let base = match form.packed {
        true => format!("{base}_packed"),
        false => base.to_string(),
    };
    let base = match form.shared {
        true => format!("{base}_shared"),
        false => base,
    };
    let base = match form.ragged {
        true => format!("{base}_ragged"),
        false => base,
    };
    // A continued cache's rows are causal among themselves; shared rows see the whole cache.
    let masks = Masks {
        causal: !form.shared,
        ..spec.masks
    };
    let spec = AttentionSpec { masks, ..spec };
    let (spec, own) = match sliced {
        true => {
            let masks = Masks {
                sinks: false,
                ..spec.masks
            };
            let partials = [("partials", WriteMode::ScratchFlush)];
            (AttentionSpec { masks, ..spec }, writes(&partials))
        }
        false => (
            spec,
            writes(&[("o", WriteMode::Owned), ("lse", WriteMode::Owned)]),
        ),
    };
    let kernel = spec.flash((&base, Op::Extend), config, |k| {
        k.writes = own;
        k.cache = cache;
        k.kv_fp8 = kv_fp8;
        k.grid.pack_heads = form.packed;
        k.grid.ragged = form.ragged;
    });
    attn_dsl::compile(&kernel)
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_dsl::{Cache, Dtype, Matrix};

    /// The tensor-core chunk's configuration the planner starts from.
    fn coop() -> FlashConfig {
        attn_dsl::configs::coop_forward(128, 48 * 1024)[0]
    }

    /// Packed chunks are valid WGSL (naga) for every mask the decode takes, both cache
    /// layouts, both outputs and every library modifier; this VM's adapter has no tensor
    /// cores, so `check` runs them on the device machine.
    #[test]
    fn packed_chunks_compile_for_every_decode_mask() {
        let mut masks = vec![
            Masks::default(),
            Masks {
                window: true,
                alibi: true,
                softcap: true,
                sinks: true,
                ..Masks::default()
            },
        ];
        for example in attn_dsl::flex::library::examples() {
            masks.push(Masks {
                flex: Some(example.flex.intern()),
                ..Masks::default()
            });
        }
        for m in masks {
            for cache in [Cache::Contiguous, Cache::Paged] {
                for sliced in [false, true] {
                    let spec = AttentionSpec::new(128, m, Dtype::F16);
                    let form = ChunkForm {
                        sliced,
                        packed: true,
                        ..ChunkForm::default()
                    };
                    let reads_h = m
                        .flex
                        .and_then(|f| f.get().mask_mod.clone())
                        .is_some_and(|e| e.mentions("h"));
                    let abi = extend(spec, ((cache, None), form), coop());
                    assert_eq!(abi.is_ok(), !reads_h, "{m:?} {cache:?} sliced {sliced}");
                    if let Ok(abi) = abi {
                        assert!(abi.grid.pack_heads && abi.grid.matrix == Matrix::Coop16);
                    }
                }
            }
        }
    }

    /// The grid of a packed chunk covers n rows of every query head of a KV head in its
    /// tiles: 3 rows x 4 heads in one 16-row tile per KV head and slice.
    #[test]
    fn a_packed_grid_counts_rows_by_kv_head() {
        let config = attn_dsl::configs::coop_forward(128, 48 * 1024)
            .into_iter()
            .find(|c| c.tile == 16)
            .expect("a 16-row tensor-core tile");
        let spec = AttentionSpec::new(128, Masks::default(), Dtype::F16);
        let form = ChunkForm {
            sliced: true,
            packed: true,
            ..ChunkForm::default()
        };
        let abi = extend(spec, ((Cache::Contiguous, None), form), config).unwrap();
        // seq_len, n_heads, n_kv_heads, head_dim, batch, capacity, page_size, pages, slot0,
        // ..., n_slices (field 10).
        let dims = [3, 32, 8, 128, 2, 4096, 0, 0, 0, 0, 5];
        assert_eq!(abi.dispatch_grid(&dims), [1, 8, 10]);
        let dims = [5, 32, 8, 128, 2, 4096, 0, 0, 0, 0, 5];
        assert_eq!(abi.dispatch_grid(&dims), [2, 8, 10]);
    }
}
