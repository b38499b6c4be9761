//! Decode on device tensors: one query row per head and sequence against a KV cache on the
//! device (contiguous or paged), each sequence at its own length, read from a `seq_lens`
//! tensor on the device. Split-K: the split pass flushes each cache slice's partial
//! softmax to scratch the op owns, the reduce pass combines them into O.
//!
//! Nothing in a call's uniforms depends on the lengths themselves, only on the longest
//! length the grid must cover: a decode loop whose caches grow a row per step records the
//! same uniforms step after step, and its lengths move on the device.

// The host-slice convenience: host data checked, uploaded, run, read back.
mod host;
pub use host::*;

use attn_dsl::emit::coop::Phases;
use attn_dsl::{Cache, Dtype, KernelAbi, KernelSpec, Masks, Op, Scalar, Source};

use super::extend::{ChunkArgs, ChunkShape, ChunkSpec, Chunks};
use super::{expect_all, grid, grow};
use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::dispatch::record::{Dispatch, Pipeline};
use crate::dispatch::recorder::{Record, Recorder};
use crate::error::{Error, InputError};
use crate::modifiers::{DeviceModifiers, expect};
pub use crate::plan::calibration::Calibration;
pub use crate::plan::decode::{Slicing, combines_in_place, plan_slices};
use crate::plan::tuning::Table;
use crate::shape::{Heads, nonzero, validate_heads, validate_scale};
use crate::tensor::{Tensor, TensorError};

/// What a decode op computes: head_dim (of Q and K) and head_dim_v (of V and O), the
/// modifiers its kernels take (`window`, `alibi`, `softcap`), the dtype of Q, the cache
/// and O, and the cache's layout.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeSpec {
    /// The width of Q and K rows.
    pub head_dim: u32,
    /// The width of V and O rows: `head_dim` but in MLA-style attention.
    pub head_dim_v: u32,
    /// The masks and modifiers the kernels are built with.
    pub masks: Masks,
    /// The element type of Q, O and (without `kv_fp8`) the cache.
    pub dtype: Dtype,
    /// Contiguous or paged.
    pub cache: Cache,
    /// `Some`: the cache holds 8-bit floats with scales ([`CacheView::scales`]); Q and O
    /// stay in `dtype`.
    pub kv_fp8: Option<attn_dsl::Fp8>,
}

impl DecodeSpec {
    /// The chunk kernel's spec for this decode's calls of many rows.
    fn chunk(&self) -> ChunkSpec {
        let attention =
            crate::plan::kernels::AttentionSpec::new(self.head_dim, self.masks, self.dtype);
        ChunkSpec {
            attention: attention.with_head_dim_v(self.head_dim_v),
            cache: self.cache,
            kv_fp8: self.kv_fp8,
        }
    }

    /// A contiguous cache of `dtype` rows, no masks: Q and K rows `head_dim` wide, V and O
    /// rows `head_dim_v`; set the fields for more (`DecodeSpec { cache, ..DecodeSpec::new(..) }`).
    pub fn new(head_dim: u32, head_dim_v: u32, dtype: Dtype) -> DecodeSpec {
        DecodeSpec {
            head_dim,
            head_dim_v,
            masks: Masks::default(),
            dtype,
            cache: Cache::Contiguous,
            kv_fp8: None,
        }
    }
}

/// A KV cache as device tensors.
#[derive(Clone, Copy, Debug)]
pub struct CacheView<'a> {
    /// The cache slot of the call's sequence 0: sequence b reads slot `slot0 + b` (its
    /// rows, its length in `seq_lens`, its row of `block_table`).
    pub slot0: u32,
    /// Contiguous: `[batch, capacity, n_kv_heads, head_dim]`; paged: the pool, `[n_pages,
    /// page_size, n_kv_heads, head_dim]`; V's rows `head_dim_v` wide.
    pub k: &'a Tensor,
    /// The values, laid out as `k` with rows `head_dim_v` wide.
    pub v: &'a Tensor,
    /// Rows in each slot's cache, `[slots]` u32 (at least `slot0 + batch`).
    pub seq_lens: &'a Tensor,
    /// At least every value of `seq_lens`: the length the grid covers. A bound that moves
    /// rarely (a power of two) keeps the uniforms the same from call to call.
    pub max_len: u32,
    /// Paged: the page of each sequence's keys `p·page_size..`, `[batch, pages_per_seq]`.
    pub block_table: Option<&'a Tensor>,
    /// An fp8 cache's scales, `[2, n_kv_heads]` f32 (K's, then V's): a value is its byte's
    /// value times its KV head's scale.
    pub scales: Option<&'a Tensor>,
}

/// The query rows a call brings per sequence. A sequence's rows are the last rows of its
/// cache (their K and V appended before the call), so row r of n sits at position `len -
/// n + r` and sees the keys up to itself: one row is a decode step; several continue a
/// cache (a prompt's next chunk, a chat's next turn, speculative drafts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueryRows<'a> {
    /// `n` rows per sequence: Q `[batch, n, n_heads, head_dim]`, or `[batch · n, n_heads,
    /// head_dim]` (with one row, `[batch, n_heads, head_dim]`); O likewise.
    Each(u32),
    /// A ragged batch: sequence b's rows are rows `starts[b]..starts[b + 1]` of Q `[rows,
    /// n_heads, head_dim]` (FlashInfer's `qo_indptr`, `batch + 1` entries from 0, none
    /// decreasing, each sequence at least one row); O likewise.
    Ragged(&'a [u32]),
}

impl Default for QueryRows<'_> {
    fn default() -> Self {
        QueryRows::Each(1)
    }
}

/// One call: Q `[batch, n_heads, head_dim]` (or several rows per sequence, `rows`), O of
/// the same rows `head_dim_v` wide, in the op's dtype.
#[derive(Clone, Copy, Debug)]
pub struct DecodeArgs<'a> {
    /// The query rows.
    pub q: &'a Tensor,
    /// The query rows per sequence: one (a decode step) unless said otherwise.
    pub rows: QueryRows<'a>,
    /// The cache the rows attend over.
    pub cache: CacheView<'a>,
    /// The output, written: a row per query row, `head_dim_v` wide.
    pub o: &'a Tensor,
    /// Defaults to `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// The window (over each cache's last rows), ALiBi slopes and soft cap.
    pub mods: DeviceModifiers<'a>,
    /// The keys per slice; `None` follows the slicing rule ([`plan_slices`]).
    pub slice_len: Option<u32>,
}

/// Keys a streamed slice holds for a decode of narrow rows ([`NARROW_ROWS`]) to take the
/// streamed split pass instead of the staged one.
///
/// Measured on an H200 (2026-11-30, `bench --decode N --head-dim 64`, 32 query heads over
/// 8, the `again` rows, one device command): the streamed pass (its rule's slices, up to
/// 8192 keys) against the staged one (1024-key slices) in f16 took 0.085 / 0.069 ms at one
/// sequence of 32k (streamed slices of 1024 keys), 0.107 / 0.107 at two sequences and at
/// eight of 8192 rows (2048), 0.148 / 0.175 at four (4096), 0.150 / 0.176 at one of 128k
/// (4096) and 0.229 / 0.309 at eight of 32k (8192); f32 and bf16 alike, fp8 caches faster
/// staged at every one. At head_dim 128 the staged pass was the faster at 32k with eight
/// sequences and at 128k (0.373 / 0.386, 0.206 / 0.217 ms), as before.
pub const LONG_SLICE: u32 = 4096;

/// The widest K and V rows whose decode takes the streamed pass where its slices are long
/// ([`LONG_SLICE`]): a staged slice's fixed work (its queries staged, its max and sum, its
/// flush, each behind barriers) weighs twice as much per byte at 64 as at 128.
pub const NARROW_ROWS: u32 = 64;

/// The two passes' pipelines and the split kernel's layout.
pub(crate) struct Passes {
    pub split: SplitPass,
    /// The streamed split pass, taken where its slices hold [`LONG_SLICE`] keys (rows of
    /// at most [`NARROW_ROWS`]); `None` where the planner keeps one pass.
    pub long: Option<SplitPass>,
    /// The staged pass that combines its slices itself, taken where its grid is one wave
    /// ([`Combine::ByGrid`]); `None` where the planner keeps the reduce pass.
    pub combined: Option<SplitPass>,
    pub reduce: Pipeline,
    /// The reduce that also writes each query's LSE, created at the first call asking it.
    pub reduce_lse: Option<Pipeline>,
    /// The slicing rule's target workgroups on this adapter: the split pass's.
    pub target: u32,
    /// What scales a chunk's target to this adapter.
    pub calibration: Calibration,
}

impl Passes {
    /// From compiled kernels: a `decode_split` and the `decode_reduce` of its partials,
    /// sliced for an adapter of this calibration.
    pub fn new(split: Kernel, reduce: Kernel, calibration: Calibration) -> Passes {
        Passes {
            split: SplitPass::new(split),
            long: None,
            combined: None,
            target: calibration.decode_workgroups(),
            calibration,
            reduce: Pipeline::new(reduce),
            reduce_lse: None,
        }
    }

    /// These passes with `long` taken where its slices are long.
    pub fn with_long(mut self, long: Kernel) -> Passes {
        self.long = Some(SplitPass::new(long));
        self
    }

    /// These passes with `combined` taken where its grid is one wave.
    pub fn with_combined(mut self, combined: Kernel) -> Passes {
        self.combined = Some(SplitPass::new(combined));
        self
    }

    /// The split kernel's ABI (both passes bind alike).
    pub fn split_abi(&self) -> &KernelAbi {
        self.split.pipeline.abi()
    }

    /// The slicing of a cache of `len` rows: the rule's, or `slice_len` checked.
    pub fn slicing(
        &self,
        h: Heads,
        rows: (u32, u32),
        len: u32,
        slice_len: Option<u32>,
    ) -> Result<Slicing, Error> {
        Ok(self.plan(h, rows, len, slice_len)?.0)
    }

    /// The slicing of a cache of `len` rows and the pass that takes it: the streamed one
    /// where its rule's slices hold at least [`LONG_SLICE`] keys, else the staged one,
    /// combining in place where it has that pass and its grid is at most the target (a
    /// `slice_len` asked is the staged pass's).
    pub fn plan(
        &self,
        h: Heads,
        (batch, n_rows): (u32, u32),
        len: u32,
        slice_len: Option<u32>,
    ) -> Result<(Slicing, PassKind), Error> {
        let per_kv = h.n_heads / h.n_kv_heads.max(1);
        let slots = (n_rows.max(1).saturating_mul(per_kv)).div_ceil(self.split_abi().grid.tile);
        // Saturated: a grid past the device's limit is refused when it is recorded.
        let others = h.n_kv_heads.saturating_mul(slots).saturating_mul(batch);
        let staged = |s: Slicing| match &self.combined {
            Some(_) if combines_in_place(s, others, self.target) => PassKind::Combined,
            _ => PassKind::Staged,
        };
        let Some(slice_len) = slice_len else {
            if let Some(long) = &self.long {
                let s = long.slicing(len, others, self.target);
                if s.slice_len >= LONG_SLICE {
                    return Ok((s, PassKind::Long));
                }
            }
            let s = self.split.slicing(len, others, self.target);
            return Ok((s, staged(s)));
        };
        let SplitPass {
            key_tile,
            max_slice,
            ..
        } = self.split;
        if slice_len == 0 || !slice_len.is_multiple_of(key_tile) || slice_len > max_slice {
            return Err(InputError::SliceLen {
                slice_len,
                key_tile,
                max: max_slice,
            }
            .into());
        }
        let s = Slicing {
            slice_len,
            n_slices: len.div_ceil(slice_len).max(1),
        };
        Ok((s, staged(s)))
    }

    /// The pipeline of a planned pass.
    fn pipeline(&mut self, kind: PassKind) -> &mut Pipeline {
        let pass = match kind {
            PassKind::Long => self.long.as_mut(),
            PassKind::Combined => self.combined.as_mut(),
            PassKind::Staged => None,
        };
        &mut pass.unwrap_or(&mut self.split).pipeline
    }
}

/// Which split pass a call takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassKind {
    /// The staged pass (in place, where it is the only one and combines).
    Staged,
    /// The streamed pass of long slices.
    Long,
    /// The staged pass that combines its slices itself.
    Combined,
}

/// A split pass's pipeline and its layout: the keys it scores per step and the longest
/// slice it holds.
pub(crate) struct SplitPass {
    pub pipeline: Pipeline,
    pub key_tile: u32,
    pub max_slice: u32,
}

impl SplitPass {
    fn new(kernel: Kernel) -> SplitPass {
        let (key_tile, max_slice) = split_layout(kernel.abi());
        SplitPass {
            pipeline: Pipeline::new(kernel),
            key_tile,
            max_slice,
        }
    }

    /// The rule's slicing of `len` keys beside `others` workgroups per slice.
    fn slicing(&self, len: u32, others: u32, target: u32) -> Slicing {
        plan_slices(len, others, self.key_tile, self.max_slice, target)
    }
}

/// The description of a split pass: `heads` query heads of one KV head per workgroup,
/// partials flushed to scratch.
pub fn split_spec(name: &str, head_dim: u32, masks: Masks, heads: u32) -> KernelSpec {
    KernelSpec {
        grid: attn_dsl::Grid::rows(attn_dsl::Major::Slice, heads),
        writes: vec![("partials".into(), attn_dsl::WriteMode::ScratchFlush)],
        ..KernelSpec::standard(name, Op::DecodeSplit, head_dim, masks)
    }
}

/// A split kernel's key tile and longest slice, from its description as the ABI keeps it:
/// head_dim, heads, workgroup size, target, and the bytes of the cache's elements (the
/// lanes per key follow them).
pub(crate) fn split_layout(abi: &KernelAbi) -> (u32, u32) {
    let spec = KernelSpec {
        workgroup_size: abi.workgroup_size[0],
        target: abi.target,
        dtype: abi.scalar("q").dtype().unwrap_or_default(),
        kv_fp8: abi.scalar("k_cache").fp8(),
        grid: abi.grid,
        ..split_spec(&abi.name, abi.head_dim, abi.masks, abi.grid.tile)
    }
    .with_head_dim_v(abi.head_dim_v());
    (
        attn_dsl::emit::split_key_tile(&spec),
        attn_dsl::emit::split_max_slice(&spec),
    )
}

/// The masks of the reduce of a split-K decode built with `masks`: the sinks alone, which
/// join the denominator where the slices meet.
pub(crate) fn reduce_masks(masks: Masks) -> Masks {
    Masks {
        sinks: masks.sinks,
        ..Masks::default()
    }
}

/// How the split pass walks a slice.
///
/// Measured on an H200 (2026-11-28, `bench --decode`, 32 query heads over 8, d 128,
/// beside each other in one process): the staged pass was the faster at a 32k cache in
/// every dtype (f16 0.089 against 0.101 ms), at 128k in bf16, f32 and fp8, and at batch 8
/// in bf16 and f32; the streamed pass in f16 at 128k (0.232 against 0.270) and batch 8
/// (0.443 against 0.477). So the runtime plans the staged pass, and beside it, for rows
/// of at most [`NARROW_ROWS`], the streamed one where its slices hold [`LONG_SLICE`] keys
/// ([`Decode::new`]); the streamed one is a description (`slice_major(flash)`) any caller
/// can pick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitLayout {
    /// The slice's scores staged in workgroup memory (`slice_major(tile = 4)`).
    Staged,
    /// Keys streamed through key groups with an online softmax each; needs SUBGROUP.
    Streamed,
}

impl SplitLayout {
    /// The layout the runtime plans (see the type's measurements).
    pub const PLANNED: SplitLayout = SplitLayout::Staged;
}

/// Where a split-K decode's slices meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Combine {
    /// In the split pass: the last workgroup of each query group to flush merges the
    /// group's partials into O (a staged pass, natively: WGSL alone does not order one
    /// workgroup's stores before another's loads).
    InPlace,
    /// In a second dispatch, the reduce pass.
    ReducePass,
    /// In place where the split pass's grid is at most the slicing rule's target (about
    /// one wave of workgroups), else by the reduce pass: the planner's.
    ByGrid,
}

impl Combine {
    /// The planner's: [`Combine::ByGrid`] for the staged pass wherever the backend orders
    /// storage across workgroups (not in a browser), else the reduce pass.
    ///
    /// Measured on an H200 (2026-11-30, `bench --decode 32768 --kv-heads 8 --head-dim 128`,
    /// 32 heads unless said, f16, one device command, the `again` rows, in place against
    /// the reduce pass): one sequence (256 workgroups) 0.0653 against 0.0723 ms (e4m3 cache
    /// 0.0672 against 0.0738); 64 heads (512) 0.1038 against 0.1058; 8 sequences (2048)
    /// 0.3835 against 0.3483; a 131072-row cache (1024) 0.2188 against 0.1976. The
    /// dispatch saved pays where the grid is one wave; past it each wave costs more than it
    /// saves (the same with each group's queries merged one after another, an earlier
    /// build: 0.0664 / 0.0713, 0.3847 / 0.3492, 0.2229 / 0.1979 ms).
    pub fn planned(gpu: &Gpu, layout: SplitLayout) -> Combine {
        match layout == SplitLayout::Staged && gpu.orders_storage_across_workgroups() {
            true => Combine::ByGrid,
            false => Combine::ReducePass,
        }
    }
}

/// The description of `spec`'s split pass in `layout`: its slices as long as the device's
/// workgroup memory holds, its sums across invocations by subgroup operations where the
/// device has them.
fn split_kernel_spec(
    gpu: &Gpu,
    spec: &DecodeSpec,
    layout: SplitLayout,
    combine: Combine,
) -> KernelSpec {
    let streamed = layout == SplitLayout::Streamed;
    let base = match (spec.cache, streamed) {
        (Cache::Contiguous, false) => "attention_decode_split",
        (Cache::Paged, false) => "attention_decode_split_paged",
        (Cache::Contiguous, true) => "attention_decode_stream",
        (Cache::Paged, true) => "attention_decode_stream_paged",
    };
    let name = crate::plan::kernels::cache_family_name(base, spec.kv_fp8, spec.head_dim);
    let name = match combine {
        Combine::InPlace => format!("{name}_combined"),
        Combine::ReducePass | Combine::ByGrid => name,
    };
    let mut split = KernelSpec {
        cache: spec.cache,
        dtype: spec.dtype,
        kv_fp8: spec.kv_fp8,
        ..split_spec(
            &name,
            spec.head_dim,
            spec.masks,
            attn_dsl::emit::MAX_SPLIT_HEADS,
        )
    }
    .with_head_dim_v(spec.head_dim_v);
    if streamed {
        split.grid.flash = Some(attn_dsl::layout::decode::stream_flash(&split));
    }
    split.grid.subgroups = streamed || gpu.has_subgroups();
    if combine == Combine::InPlace {
        split.writes.push(("o".into(), attn_dsl::WriteMode::Owned));
    }
    // WebGPU's defaults where the kernel fits them; else just the storage buffers it binds
    // (a paged fp8 cache with ALiBi binds 9, as do three modifier tensors), which an
    // adapter with more runs and one without refuses naming the limit; a pass summing by
    // subgroups is native. Longer slices than WebGPU's 16 KiB hold where the device has
    // the memory for them (`attn_dsl::layout::decode::SLICE_CAP` has what they gain).
    split.fit_device(gpu.limits().max_compute_workgroup_storage_size);
    split
}

/// The family's split and reduce kernels for a spec (compiled by the DSL now; the
/// pipelines are created later), the split pass as [`split_kernel_spec`] describes it,
/// combining its slices as `combine` asks where the device runs that (else the reduce
/// pass does; it is built either way, for calls that write LSE).
pub(crate) fn abis(
    gpu: &Gpu,
    spec: &DecodeSpec,
    layout: SplitLayout,
    combine: Combine,
) -> Result<[KernelAbi; 2], Error> {
    let in_place = match combine {
        Combine::InPlace => combined_pass(gpu, spec, layout)?,
        Combine::ReducePass | Combine::ByGrid => None,
    };
    let split = match in_place {
        Some(split) => split,
        None => compile(&split_kernel_spec(gpu, spec, layout, Combine::ReducePass))?,
    };
    let reduce = compile(&reduce_spec(spec, false))?;
    Ok([split, reduce])
}

/// The split pass that combines its slices itself, where the device runs it.
pub(crate) fn combined_pass(
    gpu: &Gpu,
    spec: &DecodeSpec,
    layout: SplitLayout,
) -> Result<Option<KernelAbi>, Error> {
    let split = compile(&split_kernel_spec(gpu, spec, layout, Combine::InPlace))?;
    Ok(gpu.require(&split).is_ok().then_some(split))
}

/// Whether a split pass combines its slices itself (it writes O).
pub(crate) fn combines(split: &KernelAbi) -> bool {
    split.binding("arrivals").is_some()
}

/// The staged split pass of `spec` with only the phases in `keep` (`bench --decode
/// --phases`: [`attn_dsl::emit::coop::Phases::decode_sets`]); its bindings are the whole
/// pass's, so it runs on the same prepared buffers.
pub fn staged_phases(gpu: &Gpu, spec: &DecodeSpec, keep: Phases) -> Result<KernelAbi, Error> {
    let split = split_kernel_spec(gpu, spec, SplitLayout::Staged, Combine::ReducePass);
    attn_dsl::compile_phases(&split, keep).map_err(|e| Error::Pipeline {
        kernel: split.name.clone(),
        message: e.to_string(),
    })
}

fn compile(spec: &KernelSpec) -> Result<KernelAbi, Error> {
    attn_dsl::compile(spec).map_err(|e| Error::Pipeline {
        kernel: spec.name.clone(),
        message: e.to_string(),
    })
}

/// The streamed split pass the planner takes beside the staged one where its slices are
/// long ([`LONG_SLICE`]): rows of at most [`NARROW_ROWS`] in a cache of the queries' dtype,
/// on a device with subgroups that can run it.
fn long_pass(gpu: &Gpu, spec: &DecodeSpec) -> Result<Option<KernelAbi>, Error> {
    let narrow = spec.head_dim.max(spec.head_dim_v) <= NARROW_ROWS;
    if !narrow || spec.kv_fp8.is_some() || !gpu.has_subgroups() {
        return Ok(None);
    }
    let [split, _] = abis(gpu, spec, SplitLayout::Streamed, Combine::ReducePass)?;
    Ok(gpu.require(&split).is_ok().then_some(split))
}

/// The reduce pass of `spec`'s decode, writing each query's LSE beside O where `lse`.
fn reduce_spec(spec: &DecodeSpec, lse: bool) -> KernelSpec {
    let name = crate::plan::kernels::family_name("attention_decode_reduce", spec.head_dim);
    let name = match lse {
        true => format!("{name}_lse"),
        false => name,
    };
    let mut reduce = KernelSpec {
        source: Source::Scratch,
        dtype: spec.dtype,
        // The reduce joins the sinks (of the split's masks, only they apply there).
        ..KernelSpec::standard(
            &name,
            Op::DecodeReduce,
            spec.head_dim,
            reduce_masks(spec.masks),
        )
    }
    .with_head_dim_v(spec.head_dim_v);
    if lse {
        reduce
            .writes
            .push(("lse".into(), attn_dsl::WriteMode::Owned));
    }
    reduce
}

/// What a call writes beside O, and how its rows see the cache.
#[derive(Clone, Copy, Default)]
struct Extra<'a> {
    /// Each query's log-sum-exp, `[rows, n_heads]` as Q's rows.
    lse: Option<&'a Tensor>,
    /// Q's rows each see the whole cache ([`super::cascade`]'s prefix).
    shared: bool,
}

/// Decode against a device cache, recorded into the caller's encoder.
pub struct Decode {
    spec: DecodeSpec,
    abis: [KernelAbi; 2],
    /// The streamed split pass the planner takes where its slices are long.
    long: Option<KernelAbi>,
    /// The staged pass combining in place, taken where its grid is one wave.
    combined: Option<KernelAbi>,
    passes: Option<Passes>,
    scratch: Scratch,
    /// Calls of many rows per sequence ([`super::extend`]); `None` for an fp8 cache, whose
    /// calls keep the split-K decode (as where the chunk's kernel cannot run).
    chunks: Option<Chunks>,
}

impl Decode {
    /// Checks `spec`, builds its kernels' WGSL and checks that this device can run them
    /// (a missing feature or limit is an error now, not at the first call); the pipelines
    /// are created on the first call.
    pub fn new(gpu: &Gpu, spec: DecodeSpec) -> Result<Decode, Error> {
        let mut decode = Decode::with_layout(gpu, spec, SplitLayout::PLANNED)?;
        decode.long = long_pass(gpu, &decode.spec)?;
        Ok(decode)
    }

    /// [`Decode::new`] with the split pass in `layout` (streamed needs SUBGROUP), whatever
    /// the runtime plans.
    pub fn with_layout(gpu: &Gpu, spec: DecodeSpec, layout: SplitLayout) -> Result<Decode, Error> {
        Decode::with_passes(gpu, spec, layout, Combine::planned(gpu, layout))
    }

    /// [`Decode::with_layout`] with the slices combined as `combine` asks (in place only
    /// where the device runs it).
    pub fn with_passes(
        gpu: &Gpu,
        spec: DecodeSpec,
        layout: SplitLayout,
        combine: Combine,
    ) -> Result<Decode, Error> {
        let spec = DecodeSpec {
            masks: gpu.masks(spec.masks),
            ..spec
        };
        let abis = abis(gpu, &spec, layout, combine)?;
        for abi in &abis {
            gpu.require(abi)?;
        }
        let combined = match combine {
            Combine::ByGrid => combined_pass(gpu, &spec, layout)?,
            Combine::InPlace | Combine::ReducePass => None,
        };
        Ok(Decode {
            spec,
            abis,
            long: None,
            combined,
            passes: None,
            scratch: Scratch::default(),
            chunks: Some(Chunks::default()),
        })
    }

    /// This decode with every call on the split-K passes, however many rows it brings
    /// (what a continued cache's chunk is measured against).
    pub fn without_chunks(mut self) -> Decode {
        self.chunks = None;
        self
    }

    /// Creates both pipelines now, awaiting the device's report (in a browser, before the
    /// first `record`).
    pub async fn prepare(&mut self, gpu: &Gpu) -> Result<(), Error> {
        if self.passes.is_none() {
            let [s, r] = &self.abis;
            let split = Kernel::new(gpu, s).await?;
            let reduce = Kernel::new(gpu, r).await?;
            let calibration = Table::for_gpu(gpu)?.calibration();
            let mut passes = Passes::new(split, reduce, calibration);
            if let Some(long) = &self.long {
                passes = passes.with_long(Kernel::new(gpu, long).await?);
            }
            if let Some(combined) = &self.combined {
                passes = passes.with_combined(Kernel::new(gpu, combined).await?);
            }
            self.passes = Some(passes);
        }
        Ok(())
    }

    fn passes(&mut self, gpu: &Gpu) -> Result<&mut Passes, Error> {
        if self.passes.is_none() {
            let [s, r] = &self.abis;
            let calibration = Table::for_gpu(gpu)?.calibration();
            let (split, reduce) = (Kernel::now(gpu, s)?, Kernel::now(gpu, r)?);
            let mut passes = Passes::new(split, reduce, calibration);
            if let Some(long) = &self.long {
                passes = passes.with_long(Kernel::now(gpu, long)?);
            }
            if let Some(combined) = &self.combined {
                passes = passes.with_combined(Kernel::now(gpu, combined)?);
            }
            self.passes = Some(passes);
        }
        Ok(self.passes.as_mut().expect("created above"))
    }

    /// The slicing a call of this shape gets.
    pub fn slicing(
        &mut self,
        gpu: &Gpu,
        h: Heads,
        batch: u32,
        max_len: u32,
    ) -> Result<Slicing, Error> {
        self.passes(gpu)?.slicing(h, (batch, 1), max_len, None)
    }

    /// Checks a call as [`Decode::record`] does, recording nothing (the pipelines are
    /// created if they were not): for an op that records other work before this one only
    /// if this one will be recorded too.
    pub fn check(&mut self, gpu: &Gpu, args: &DecodeArgs) -> Result<(), Error> {
        self.check_in(gpu, args, false)
    }

    /// [`Decode::check`] of a call [`Decode::record_shared`] records.
    pub(crate) fn check_shared(&mut self, gpu: &Gpu, args: &DecodeArgs) -> Result<(), Error> {
        self.check_in(gpu, args, true)
    }

    fn check_in(&mut self, gpu: &Gpu, args: &DecodeArgs, shared: bool) -> Result<(), Error> {
        let passes = self.passes(gpu)?;
        let c = check(passes.split_abi(), passes.reduce.abi(), args)?;
        check_bindings(gpu, passes, args)?;
        let calibration = passes.calibration;
        let split = passes.slicing(c.h, (c.batch, c.n_rows), args.cache.max_len, args.slice_len);
        let spec = self.spec.chunk();
        let ragged = matches!(args.rows, QueryRows::Ragged(_));
        let n = c.n_rows;
        let chunked = match self.chunks.as_mut() {
            Some(chunks) if shared => !ragged && chunks.serve(gpu, &spec),
            Some(chunks) => chunks.takes(gpu, &spec, (n, c.h)),
            None => false,
        };
        if chunked {
            // The chunk's kernel compiled now, so that its record cannot fail on it.
            let shape = ChunkShape {
                batch: c.batch,
                n,
                heads: c.h,
                slice_len: args.slice_len,
                calibration,
                shared,
                ragged,
            };
            let chunks = self.chunks.as_mut().expect("matched above");
            chunks.prepare(gpu, &spec, (shape, args.cache.max_len))?;
            return Ok(());
        }
        if shared {
            return Err(unshared());
        }
        split?;
        Ok(())
    }

    /// Records the decode: O overwritten. Returns the slicing it ran. A call of at least
    /// [`super::extend::CHUNK_ROWS`] rows per sequence (where the tiles pack a KV head's
    /// query heads, [`super::extend::PACKED_CHUNK_ROWS`] rows by query heads per KV head)
    /// runs as a chunk on the forward's
    /// schedule, its keys cut into slices (merged by the reduce pass) where its query tiles
    /// alone would leave the GPU idle.
    pub fn record(
        &mut self,
        gpu: &Gpu,
        encoder: &mut impl Record,
        args: &DecodeArgs,
    ) -> Result<Slicing, Error> {
        encoder.recorder(|rec| self.record_in(gpu, rec, args, Extra::default()))
    }

    /// [`Decode::record`], writing beside O each query's log-sum-exp (natural log, the
    /// sinks counted as O counts them; +inf for a query that sees no key) into `lse`,
    /// shaped as Q without its last axis (`[batch, n_heads]` for one row per sequence),
    /// f32: what [`super::merge::Merge`] needs to join this decode with attention over
    /// other keys.
    pub fn record_lse(
        &mut self,
        gpu: &Gpu,
        encoder: &mut impl Record,
        args: &DecodeArgs,
        lse: &Tensor,
    ) -> Result<Slicing, Error> {
        let extra = Extra {
            lse: Some(lse),
            shared: false,
        };
        encoder.recorder(|rec| self.record_in(gpu, rec, args, extra))
    }

    /// Q's `n` rows (`QueryRows::Each(n)`, one sequence) each over the whole cache of
    /// `args.cache`'s one slot, none causal to another, their LSE into `lse`: a cascade's
    /// queries of n sequences over their shared prefix. The rows need at least n keys.
    pub(crate) fn record_shared(
        &mut self,
        gpu: &Gpu,
        rec: &mut Recorder,
        args: &DecodeArgs,
        lse: &Tensor,
    ) -> Result<Slicing, Error> {
        let extra = Extra {
            lse: Some(lse),
            shared: true,
        };
        self.record_in(gpu, rec, args, extra)
    }

    fn record_in(
        &mut self,
        gpu: &Gpu,
        rec: &mut Recorder,
        args: &DecodeArgs,
        extra: Extra,
    ) -> Result<Slicing, Error> {
        let (heads, n) = {
            let passes = self.passes(gpu)?;
            let c = check(passes.split_abi(), passes.reduce.abi(), args)?;
            check_bindings(gpu, passes, args)?;
            if let Some(lse) = extra.lse {
                check_lse(lse, args.q)?;
            }
            (c.h, c.n_rows)
        };
        if extra.lse.is_some() {
            self.reduce_lse(gpu)?;
        }
        let spec = self.spec.chunk();
        let ragged = matches!(args.rows, QueryRows::Ragged(_));
        if extra.shared {
            return match self.serves_shared(gpu) && !ragged {
                true => self.record_chunk(gpu, rec, args, extra),
                false => Err(unshared()),
            };
        }
        if self
            .chunks
            .as_mut()
            .is_some_and(|c| c.takes(gpu, &spec, (n, heads)))
        {
            return self.record_chunk(gpu, rec, args, extra);
        }
        let passes = self.passes.as_mut().expect("created above");
        record(gpu, passes, &mut self.scratch, rec, (args, extra.lse))
    }

    /// Whether rows over a shared prefix (a cascade's) run on `gpu`: they have only the
    /// chunk's path.
    pub(crate) fn serves_shared(&mut self, gpu: &Gpu) -> bool {
        let spec = self.spec.chunk();
        self.chunks.as_mut().is_some_and(|c| c.serve(gpu, &spec))
    }

    /// The reduce writing LSE, created now if it was not.
    fn reduce_lse(&mut self, gpu: &Gpu) -> Result<(), Error> {
        let spec = self.spec;
        let passes = self.passes(gpu)?;
        if passes.reduce_lse.is_none() {
            let reduce = reduce_spec(&spec, true);
            let abi = attn_dsl::compile(&reduce).map_err(|e| Error::Pipeline {
                kernel: reduce.name.clone(),
                message: e.to_string(),
            })?;
            passes.reduce_lse = Some(Pipeline::new(Kernel::now(gpu, &abi)?));
        }
        Ok(())
    }

    /// A call as a chunk (of at most `n` rows per sequence, each its own count where the
    /// batch is ragged), and its reduce where it was sliced.
    fn record_chunk(
        &mut self,
        gpu: &Gpu,
        rec: &mut Recorder,
        args: &DecodeArgs,
        extra: Extra,
    ) -> Result<Slicing, Error> {
        let passes = self.passes.as_mut().expect("created by record");
        let chunks = self.chunks.as_mut().expect("checked by record");
        let c = check(passes.split_abi(), passes.reduce.abi(), args)?;
        let (n, ragged) = (c.n_rows, matches!(args.rows, QueryRows::Ragged(_)));
        let q_starts = self.scratch.starts(gpu, &c.starts)?.clone();
        let view = &args.cache;
        let chunk = ChunkArgs {
            q: args.q,
            o: args.o,
            k: view.k,
            v: view.v,
            seq_lens: view.seq_lens,
            block_table: view.block_table,
            slot0: view.slot0,
            scale: args.scale,
            mods: args.mods,
            lse: extra.lse,
            scales: view.scales,
            q_starts: ragged.then_some(&q_starts),
        };
        let shape = ChunkShape {
            batch: c.batch,
            n,
            heads: c.h,
            slice_len: args.slice_len,
            calibration: passes.calibration,
            shared: extra.shared,
            ragged,
        };
        let spec = self.spec.chunk();
        let (slicing, partials) = chunks.record(gpu, &spec, rec, &chunk, (shape, view.max_len))?;
        if let Some(partials) = partials {
            let dims = pass_dims(view, c.h, (c.batch, n), slicing, args);
            let out = (args, extra.lse);
            record_reduce(gpu, passes, rec, (&partials, &q_starts), dims, out)?;
        }
        Ok(slicing)
    }
}

/// Why rows over a shared prefix cannot run: they have only the chunk's path.
fn unshared() -> Error {
    InputError::Unsupported {
        what: "rows over a shared prefix (a cascade) where the forward's tiles do not run",
        needs: "a cache in the queries' dtype (f32, f16 or bf16), or an fp8 cache with f16 \
                queries on a device with cooperative matrices",
    }
    .into()
}

/// The partials of the split pass, grown to the largest call and reused, and the query
/// rows' starts of recent calls (by content: a decode loop's are the same every step).
#[derive(Default)]
pub(crate) struct Scratch {
    partials: Option<Tensor>,
    /// A split pass's arrivals per query group, each back to 0 when its dispatch ends.
    arrivals: Option<Tensor>,
    starts: Vec<(Vec<u32>, Tensor)>,
}

/// Query-row starts kept per op: a loop alternates between few layouts.
const KEPT_STARTS: usize = 8;

impl Scratch {
    /// A view of at least `shape`'s f32 elements.
    fn partials(&mut self, gpu: &Gpu, shape: &[u32]) -> Result<Tensor, Error> {
        grow(gpu, &mut self.partials, shape, Scalar::F32)
    }

    /// A view of at least `groups` counters, all 0 (made so, and left so by every split
    /// pass that counts in them).
    fn arrivals(&mut self, gpu: &Gpu, groups: u32) -> Result<Tensor, Error> {
        grow(gpu, &mut self.arrivals, &[groups], Scalar::U32)
    }

    /// `starts` on the device, uploaded once.
    fn starts(&mut self, gpu: &Gpu, starts: &[u32]) -> Result<&Tensor, Error> {
        let at = match self.starts.iter().position(|(s, _)| s == starts) {
            Some(at) => at,
            None => {
                if self.starts.len() == KEPT_STARTS {
                    self.starts.remove(0);
                }
                let t = Tensor::from_u32(gpu, &[starts.len() as u32], starts)?;
                self.starts.push((starts.to_vec(), t));
                self.starts.len() - 1
            }
        };
        Ok(&self.starts[at].1)
    }
}

/// The caller's tensors of `args` against the passes' bindings, as their records will
/// check them, and O sharing its buffer with none of them: a call refused here has
/// recorded nothing (a continued cache's append runs only after it).
fn check_bindings(gpu: &Gpu, passes: &Passes, args: &DecodeArgs) -> Result<(), Error> {
    let c = &args.cache;
    let mut given = vec![
        ("q", args.q),
        ("o", args.o),
        ("k_cache", c.k),
        ("v_cache", c.v),
        ("seq_lens", c.seq_lens),
    ];
    given.extend(c.block_table.map(|t| ("block_table", t)));
    given.extend(c.scales.map(|t| ("kv_scales", t)));
    given.extend(args.mods.tensors());
    // O against every other tensor, whichever pass the plan takes as the call records.
    let abis = [passes.split_abi(), passes.reduce.abi()];
    Ok(crate::dispatch::record::check_given(
        gpu,
        &abis,
        &given,
        &["o"],
    )?)
}

/// Records split-K decode of `args` with `passes`, its partials in `scratch`.
pub(crate) fn record(
    gpu: &Gpu,
    passes: &mut Passes,
    scratch: &mut Scratch,
    rec: &mut Recorder,
    (args, lse): (&DecodeArgs, Option<&Tensor>),
) -> Result<Slicing, Error> {
    let Checked {
        batch,
        h,
        starts,
        n_rows,
    } = check(passes.split_abi(), passes.reduce.abi(), args)?;
    let c = &args.cache;
    let (slicing, kind) = passes.plan(h, (batch, n_rows), c.max_len, args.slice_len)?;
    // A call writing LSE has the reduce write it: the pass beside the reduce serves it.
    let kind = match (kind, lse) {
        (PassKind::Combined, Some(_)) => PassKind::Staged,
        _ => kind,
    };
    // A record per (sequence, slice, row, head): the output, then (m, l, 0, 0).
    let record = h.head_dim_v + 4;
    let partials = scratch.partials(gpu, &[batch, slicing.n_slices, n_rows * h.n_heads, record])?;
    let q_starts = scratch.starts(gpu, &starts)?.clone();
    let dims = pass_dims(c, h, (batch, n_rows), slicing, args);
    let mut params = vec![("scale", args.scale.unwrap_or(h.default_scale()))];
    params.extend(args.mods.params());
    let mut tensors = vec![
        ("q", args.q),
        ("k_cache", c.k),
        ("v_cache", c.v),
        ("partials", &partials),
        ("seq_lens", c.seq_lens),
        ("q_starts", &q_starts),
    ];
    tensors.extend(c.block_table.map(|t| ("block_table", t)));
    tensors.extend(c.scales.map(|t| ("kv_scales", t)));
    tensors.extend(args.mods.tensors());
    let pipeline = passes.pipeline(kind);
    let g = grid(pipeline.abi(), &dims);
    let combined = combines(pipeline.abi());
    let arrivals = match combined {
        true => Some(scratch.arrivals(gpu, g[1] * g[2])?),
        false => None,
    };
    if let Some(arrivals) = &arrivals {
        tensors.extend([("o", args.o), ("arrivals", arrivals)]);
        tensors.extend(args.mods.sinks.map(|t| ("sinks", t)));
    }
    let split = Dispatch {
        tensors,
        dims: dims.clone(),
        params,
    };
    pipeline.record(gpu, rec, &split, g)?;
    // A call writing LSE has the reduce write it (and, after a pass that combines its
    // slices, O again: the same values).
    if !combined || lse.is_some() {
        record_reduce(gpu, passes, rec, (&partials, &q_starts), dims, (args, lse))?;
    }
    Ok(slicing)
}

/// Both passes' dims for `batch` sequences of up to `n_rows` rows over `c`, cut as
/// `slicing` says.
fn pass_dims(
    c: &CacheView,
    h: Heads,
    (batch, n_rows): (u32, u32),
    slicing: Slicing,
    args: &DecodeArgs,
) -> Vec<(&'static str, u32)> {
    let (capacity, page_size, pages_per_seq) = super::cache_geometry(c.k, c.block_table);
    let mut dims = vec![
        ("cache_len", c.max_len),
        ("n_heads", h.n_heads),
        ("n_kv_heads", h.n_kv_heads),
        ("head_dim", h.head_dim),
        ("batch", batch),
        ("capacity", capacity),
        ("page_size", page_size),
        ("slice_len", slicing.slice_len),
        ("n_slices", slicing.n_slices),
        ("pages_per_seq", pages_per_seq),
        ("n_rows", n_rows),
        ("slot0", c.slot0),
    ];
    dims.extend(args.mods.dims());
    dims
}

/// The reduce pass: each query's slices' partials merged into O (the sinks joined), and
/// into `lse` where given (its pipeline created by the caller).
fn record_reduce(
    gpu: &Gpu,
    passes: &mut Passes,
    rec: &mut Recorder,
    (partials, q_starts): (&Tensor, &Tensor),
    dims: Vec<(&'static str, u32)>,
    (args, lse): (&DecodeArgs, Option<&Tensor>),
) -> Result<(), Error> {
    let mut tensors = vec![
        ("partials", partials),
        ("o", args.o),
        ("q_starts", q_starts),
    ];
    tensors.extend(lse.map(|t| ("lse", t)));
    tensors.extend(args.mods.sinks.map(|t| ("sinks", t)));
    let pipeline = match lse {
        Some(_) => passes.reduce_lse.as_mut().expect("created before the call"),
        None => &mut passes.reduce,
    };
    let g = grid(pipeline.abi(), &dims);
    let reduce = Dispatch {
        tensors,
        dims,
        params: Vec::new(),
    };
    pipeline.record(gpu, rec, &reduce, g)
}

/// `lse` against Q: f32, Q's shape without its last axis.
fn check_lse(lse: &Tensor, q: &Tensor) -> Result<(), InputError> {
    let rows = &q.shape()[..q.shape().len().saturating_sub(1)];
    expect(
        lse,
        "lse",
        rows,
        Scalar::F32,
        "Q's shape without head_dim, f32",
    )?;
    Ok(())
}

/// A checked call: its sequences, heads, query rows' starts and the most rows a sequence
/// brings.
struct Checked {
    batch: u32,
    h: Heads,
    starts: Vec<u32>,
    n_rows: u32,
}

/// The query rows of a call, from Q's shape and `rows`: the batch, the starts of each
/// sequence's rows (`batch + 1` of them), the most rows a sequence brings, and the shape
/// O has (Q's, `head_dim_v` wide).
fn query_rows(q: &Tensor, rows: QueryRows) -> Result<(u32, Vec<u32>, u32, Vec<u32>), InputError> {
    let layout =
        "[batch, n_heads, head_dim], [batch, n, n_heads, head_dim] or [rows, n_heads, head_dim]";
    let shape = q.shape();
    let rank = |r| TensorError::Rank {
        name: "q".into(),
        got: shape.to_vec(),
        rank: r,
        layout,
    };
    let total = match shape.len() {
        3 => shape[0],
        4 => shape[0].checked_mul(shape[1]).ok_or_else(|| rank(3))?,
        _ => return Err(rank(3).into()),
    };
    let bad = |m: String| InputError::QueryRows(m);
    match rows {
        QueryRows::Each(0) => Err(bad(
            "n = 0: a call brings at least one row per sequence".into()
        )),
        QueryRows::Each(n) => {
            if shape.len() == 4 && shape[1] != n {
                return Err(bad(format!(
                    "q is {shape:?}: its rows per sequence ({}) are not n = {n}",
                    shape[1]
                )));
            }
            if !total.is_multiple_of(n) || total == 0 {
                return Err(bad(format!(
                    "q's {total} rows are not a whole number of sequences of {n} rows"
                )));
            }
            let batch = total / n;
            let starts = (0..=batch).map(|b| b * n).collect();
            Ok((batch, starts, n, shape.to_vec()))
        }
        QueryRows::Ragged(starts) => {
            if shape.len() != 3 {
                return Err(rank(3).into());
            }
            if starts.len() < 2 || starts[0] != 0 {
                return Err(bad(format!(
                    "a ragged batch's starts are batch + 1 row indices from 0, not {starts:?}"
                )));
            }
            if let Some(b) = starts.windows(2).position(|w| w[1] <= w[0]) {
                return Err(bad(format!(
                    "starts[{}] = {} is not past starts[{b}] = {}: each sequence brings at least one row",
                    b + 1,
                    starts[b + 1],
                    starts[b]
                )));
            }
            let last = starts[starts.len() - 1];
            if last != total {
                return Err(bad(format!(
                    "the starts end at row {last}, and q holds {total} rows"
                )));
            }
            let n_rows = starts.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(1);
            Ok((
                starts.len() as u32 - 1,
                starts.to_vec(),
                n_rows,
                shape.to_vec(),
            ))
        }
    }
}

/// Shapes, dtypes, heads, scale and modifiers of a decode call against its split kernel.
fn check(abi: &KernelAbi, reduce: &KernelAbi, args: &DecodeArgs) -> Result<Checked, InputError> {
    let c = &args.cache;
    let (batch, starts, n_rows, q_shape) = query_rows(args.q, args.rows)?;
    let layout = "[batch, n_heads, head_dim]";
    let o_layout = "Q's rows, head_dim_v wide";
    let [n_heads, head_dim] = [q_shape[q_shape.len() - 2], q_shape[q_shape.len() - 1]];
    let kv_layout = match c.block_table {
        None => "[batch, capacity, n_kv_heads, head_dim]",
        Some(_) => "[n_pages, page_size, n_kv_heads, head_dim]",
    };
    let [rows, per, n_kv_heads, _] = super::rank4(c.k, "k_cache", kv_layout)?;
    let v_layout = match c.block_table {
        None => "[batch, capacity, n_kv_heads, head_dim_v]",
        Some(_) => "[n_pages, page_size, n_kv_heads, head_dim_v]",
    };
    let [.., head_dim_v] = super::rank4(c.v, "v_cache", v_layout)?;
    let h = Heads {
        n_heads,
        n_kv_heads,
        head_dim,
        head_dim_v,
    };
    nonzero("batch", batch)?;
    validate_heads(abi, h)?;
    validate_scale(args.scale)?;
    let paged = abi.binding("block_table").is_some();
    if paged != c.block_table.is_some() {
        let name = |paged| if paged { "paged" } else { "contiguous" };
        return Err(InputError::CacheLayout {
            kernel: abi.name.to_string(),
            reads: name(paged),
            given: name(c.block_table.is_some()),
        });
    }
    let fp8 = abi.binding("kv_scales").is_some();
    if fp8 != c.scales.is_some() {
        let name = |fp8| if fp8 { "fp8 (with scales)" } else { "unscaled" };
        return Err(InputError::CacheLayout {
            kernel: abi.name.to_string(),
            reads: name(fp8),
            given: name(c.scales.is_some()),
        });
    }
    let kv = vec![rows, per, n_kv_heads, head_dim];
    let slots = c
        .slot0
        .checked_add(batch)
        .ok_or(InputError::QueryRows(format!(
            "slot0 {} + batch {batch} overflows",
            c.slot0
        )))?;
    let lens = c.seq_lens.shape().first().copied().unwrap_or(0);
    if c.seq_lens.shape().len() != 1 || lens < slots {
        return Err(TensorError::Shape {
            name: "seq_lens".into(),
            got: c.seq_lens.shape().to_vec(),
            want: vec![slots],
            layout: "[slots], at least slot0 + batch",
        }
        .into());
    }
    let mut tensors = vec![
        ("q", args.q, q_shape.clone(), layout),
        ("k_cache", c.k, kv, kv_layout),
        (
            "v_cache",
            c.v,
            vec![rows, per, n_kv_heads, head_dim_v],
            v_layout,
        ),
        ("seq_lens", c.seq_lens, vec![lens], "[slots]"),
    ];
    if let Some(scales) = c.scales {
        tensors.push(("kv_scales", scales, vec![2, n_kv_heads], "[2, n_kv_heads]"));
    }
    let capacity = match c.block_table {
        None => {
            if rows < slots {
                return Err(TensorError::Shape {
                    name: "k_cache".into(),
                    got: c.k.shape().to_vec(),
                    want: vec![slots, per, n_kv_heads, head_dim],
                    layout: "[slots, capacity, n_kv_heads, head_dim], at least slot0 + batch slots",
                }
                .into());
            }
            u64::from(per)
        }
        Some(table) => {
            let [table_rows, pages_per_seq] = <[u32; 2]>::try_from(table.shape()).unwrap_or([0, 0]);
            let table_rows = table_rows.max(slots);
            tensors.push((
                "block_table",
                table,
                vec![table_rows, pages_per_seq],
                "[slots, pages_per_seq], at least slot0 + batch slots",
            ));
            u64::from(pages_per_seq) * u64::from(per)
        }
    };
    expect_all(abi, &tensors)?;
    let mut o_shape = q_shape.clone();
    *o_shape.last_mut().expect("q has a rank") = head_dim_v;
    expect_all(reduce, &[("o", args.o, o_shape, o_layout)])?;
    if u64::from(c.max_len) > capacity {
        return Err(InputError::CacheTooShort {
            cache_len: c.max_len,
            capacity,
        });
    }
    // A block mask covers the cache's positions.
    let positions = u32::try_from(capacity).unwrap_or(u32::MAX);
    args.mods.validate(abi, batch, (1, positions), n_heads)?;
    Ok(Checked {
        batch,
        h,
        starts,
        n_rows,
    })
}
