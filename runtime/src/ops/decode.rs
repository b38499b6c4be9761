//! Decode on device tensors: one query row per head and sequence against a KV cache on the
//! device (contiguous or paged), each sequence at its own length, read from a `seq_lens`
//! tensor on the device. Split-K: the split pass flushes each cache slice's partial
//! softmax to scratch the op owns, the reduce pass combines them into O.
//!
//! Nothing in a call's uniforms depends on the lengths themselves, only on the longest
//! length the grid must cover: a decode loop whose caches grow a row per step records the
//! same uniforms step after step, and its lengths move on the device.

use attn_dsl::{Cache, Dtype, KernelAbi, KernelSpec, Masks, Op, Scalar, Source};

use super::{expect_all, grid};
use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::dispatch::record::{Dispatch, Pipeline};
use crate::error::{Error, InputError};
use crate::modifiers::DeviceModifiers;
use crate::plan::calibration::Calibration;
use crate::plan::decode::{Slicing, plan_slices};
use crate::plan::tuning::Table;
use crate::shape::{Heads, nonzero, validate_heads, validate_scale};
use crate::tensor::{Tensor, TensorError, elements};

/// What a decode op computes: head_dim (of Q and K) and head_dim_v (of V and O), the
/// modifiers its kernels take (`window`, `alibi`, `softcap`), the dtype of Q, the cache
/// and O, and the cache's layout.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeSpec {
    pub head_dim: u32,
    /// The width of V and O rows: `head_dim` but in MLA-style attention.
    pub head_dim_v: u32,
    pub masks: Masks,
    pub dtype: Dtype,
    pub cache: Cache,
    /// `Some`: the cache holds 8-bit floats with scales ([`CacheView::scales`]); Q and O
    /// stay in `dtype`.
    pub kv_fp8: Option<attn_dsl::Fp8>,
}

/// A KV cache as device tensors.
#[derive(Clone, Copy, Debug)]
pub struct CacheView<'a> {
    /// Contiguous: `[batch, capacity, n_kv_heads, head_dim]`; paged: the pool, `[n_pages,
    /// page_size, n_kv_heads, head_dim]`; V's rows `head_dim_v` wide.
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    /// Rows in each sequence's cache, `[batch]` u32.
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

/// One call: Q is `[batch, n_heads, head_dim]`, O `[batch, n_heads, head_dim_v]`, in the
/// op's dtype.
#[derive(Clone, Copy, Debug)]
pub struct DecodeArgs<'a> {
    pub q: &'a Tensor,
    pub cache: CacheView<'a>,
    pub o: &'a Tensor,
    pub scale: Option<f32>,
    /// The window (over each cache's last rows), ALiBi slopes and soft cap.
    pub mods: DeviceModifiers<'a>,
    /// The keys per slice; `None` follows the slicing rule ([`plan_slices`]).
    pub slice_len: Option<u32>,
}

/// The two passes' pipelines and the split kernel's layout.
pub(crate) struct Passes {
    pub split: Pipeline,
    pub reduce: Pipeline,
    pub key_tile: u32,
    pub max_slice: u32,
    /// The slicing rule's target workgroups on this adapter.
    pub target: u32,
}

impl Passes {
    /// From compiled kernels: a `decode_split` and the `decode_reduce` of its partials,
    /// sliced for an adapter of this calibration.
    pub fn new(split: Kernel, reduce: Kernel, calibration: Calibration) -> Passes {
        let (key_tile, max_slice) = split_layout(split.abi());
        Passes {
            key_tile,
            max_slice,
            target: calibration.decode_workgroups(),
            split: Pipeline::new(split),
            reduce: Pipeline::new(reduce),
        }
    }

    /// The slicing of a cache of `len` rows: the rule's, or `slice_len` checked.
    pub fn slicing(
        &self,
        h: Heads,
        batch: u32,
        len: u32,
        slice_len: Option<u32>,
    ) -> Result<Slicing, InputError> {
        let Some(slice_len) = slice_len else {
            let per_kv = h.n_heads / h.n_kv_heads.max(1);
            let groups = h.n_kv_heads * per_kv.div_ceil(self.split.abi().grid.tile);
            return Ok(plan_slices(
                len,
                groups * batch,
                self.key_tile,
                self.max_slice,
                self.target,
            ));
        };
        if slice_len == 0 || !slice_len.is_multiple_of(self.key_tile) || slice_len > self.max_slice
        {
            return Err(InputError::SliceLen {
                slice_len,
                key_tile: self.key_tile,
                max: self.max_slice,
            });
        }
        Ok(Slicing {
            slice_len,
            n_slices: len.div_ceil(slice_len).max(1),
        })
    }
}

/// The description of a split pass: `heads` query heads of one KV head per workgroup,
/// partials flushed to scratch.
pub fn split_spec(name: &str, head_dim: u32, masks: Masks, heads: u32) -> KernelSpec {
    KernelSpec {
        grid: attn_dsl::Grid::rows(attn_dsl::Major::Slice, heads),
        writes: vec![
            ("part_o".into(), attn_dsl::WriteMode::ScratchFlush),
            ("part_ml".into(), attn_dsl::WriteMode::ScratchFlush),
        ],
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
/// (0.443 against 0.477). So the runtime plans the staged pass; the streamed one is a
/// description (`slice_major(flash)`) any caller can pick.
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

/// The family's split and reduce kernels for a spec (compiled by the DSL now; the
/// pipelines are created later), the split pass in `layout`.
pub(crate) fn abis(spec: &DecodeSpec, layout: SplitLayout) -> Result<[KernelAbi; 2], Error> {
    let streamed = layout == SplitLayout::Streamed;
    let base = match (spec.cache, streamed) {
        (Cache::Contiguous, false) => "attention_decode_split",
        (Cache::Paged, false) => "attention_decode_split_paged",
        (Cache::Contiguous, true) => "attention_decode_stream",
        (Cache::Paged, true) => "attention_decode_stream_paged",
    };
    let compile = |s: &KernelSpec| {
        attn_dsl::compile(s).map_err(|e| Error::Pipeline {
            kernel: s.name.clone(),
            message: e.to_string(),
        })
    };
    let name = crate::plan::tuning::cache_family_name(base, spec.kv_fp8, spec.head_dim);
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
        split.grid.flash = Some(attn_dsl::layout::decode::stream_flash(&split, true));
    }
    // A paged fp8 cache with ALiBi binds a ninth storage buffer (the scales): such a kernel
    // needs an adapter with more than WebGPU's default 8, and says so where it has not; a
    // streamed pass's subgroups are native.
    if spec.kv_fp8.is_some() || streamed {
        split.fit_target();
    }
    let split = compile(&split)?;
    let name = crate::plan::tuning::family_name("attention_decode_reduce", spec.head_dim);
    let reduce = compile(
        &KernelSpec {
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
        .with_head_dim_v(spec.head_dim_v),
    )?;
    Ok([split, reduce])
}

/// Decode against a device cache, recorded into the caller's encoder.
pub struct Decode {
    abis: [KernelAbi; 2],
    passes: Option<Passes>,
    scratch: Scratch,
}

impl Decode {
    /// Checks `spec`, builds its kernels' WGSL and checks that this device can run them
    /// (a missing feature or limit is an error now, not at the first call); the pipelines
    /// are created on the first call.
    pub fn new(gpu: &Gpu, spec: DecodeSpec) -> Result<Decode, Error> {
        let abis = abis(&spec, SplitLayout::PLANNED)?;
        for abi in &abis {
            gpu.require(abi)?;
        }
        Ok(Decode {
            abis,
            passes: None,
            scratch: Scratch::default(),
        })
    }

    /// Creates both pipelines now, awaiting the device's report (in a browser, before the
    /// first `record`).
    pub async fn prepare(&mut self, gpu: &Gpu) -> Result<(), Error> {
        if self.passes.is_none() {
            let [s, r] = &self.abis;
            let split = Kernel::new(gpu, s).await?;
            let reduce = Kernel::new(gpu, r).await?;
            let calibration = Table::for_gpu(gpu)?.calibration();
            self.passes = Some(Passes::new(split, reduce, calibration));
        }
        Ok(())
    }

    fn passes(&mut self, gpu: &Gpu) -> Result<&mut Passes, Error> {
        if self.passes.is_none() {
            let [s, r] = &self.abis;
            let calibration = Table::for_gpu(gpu)?.calibration();
            let (split, reduce) = (Kernel::now(gpu, s)?, Kernel::now(gpu, r)?);
            self.passes = Some(Passes::new(split, reduce, calibration));
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
        Ok(self.passes(gpu)?.slicing(h, batch, max_len, None)?)
    }

    /// Records both passes: O overwritten. Returns the slicing it ran.
    pub fn record(
        &mut self,
        gpu: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        args: &DecodeArgs,
    ) -> Result<Slicing, Error> {
        self.passes(gpu)?;
        let passes = self.passes.as_mut().expect("created above");
        record(gpu, passes, &mut self.scratch, encoder, args)
    }
}

/// The partials of the split pass, grown to the largest call and reused.
#[derive(Default)]
pub(crate) struct Scratch {
    part_o: Option<Tensor>,
    part_ml: Option<Tensor>,
}

impl Scratch {
    /// Views of at least `o` and `ml` f32 elements.
    fn views(&mut self, gpu: &Gpu, o: &[u32], ml: &[u32]) -> Result<(Tensor, Tensor), TensorError> {
        Ok((
            grow(gpu, &mut self.part_o, o, Scalar::F32)?,
            grow(gpu, &mut self.part_ml, ml, Scalar::F32)?,
        ))
    }
}

/// `held`, replaced by a zeroed tensor of at least `shape`'s elements where it is shorter,
/// viewed as `shape`.
fn grow(
    gpu: &Gpu,
    held: &mut Option<Tensor>,
    shape: &[u32],
    scalar: Scalar,
) -> Result<Tensor, TensorError> {
    if held.as_ref().is_none_or(|t| t.len() < elements(shape)) {
        *held = Some(Tensor::zeros(gpu, &[elements(shape) as u32], scalar));
    }
    held.as_ref().expect("grown above").view(shape)
}

/// Records split-K decode of `args` with `passes`, its partials in `scratch`.
pub(crate) fn record(
    gpu: &Gpu,
    passes: &mut Passes,
    scratch: &mut Scratch,
    encoder: &mut wgpu::CommandEncoder,
    args: &DecodeArgs,
) -> Result<Slicing, Error> {
    let (batch, h) = check(passes.split.abi(), passes.reduce.abi(), args)?;
    let c = &args.cache;
    let slicing = passes.slicing(h, batch, c.max_len, args.slice_len)?;
    let (capacity, page_size, pages_per_seq) = match c.block_table {
        None => (c.k.shape()[1], 0, 0),
        Some(t) => (0, c.k.shape()[1], t.shape()[1]),
    };
    let parts = [batch, slicing.n_slices, h.n_heads];
    let (part_o, part_ml) = scratch.views(
        gpu,
        &[parts[0], parts[1], parts[2], h.head_dim_v],
        &[2, parts[0], parts[1], parts[2]],
    )?;
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
    ];
    dims.extend(args.mods.dims());
    let mut params = vec![("scale", args.scale.unwrap_or(h.default_scale()))];
    params.extend(args.mods.params());
    let mut tensors = vec![
        ("q", args.q),
        ("k_cache", c.k),
        ("v_cache", c.v),
        ("part_o", &part_o),
        ("part_ml", &part_ml),
        ("seq_lens", c.seq_lens),
    ];
    tensors.extend(c.block_table.map(|t| ("block_table", t)));
    tensors.extend(c.scales.map(|t| ("kv_scales", t)));
    tensors.extend(args.mods.tensors());
    let g = grid(passes.split.abi(), &dims);
    let split = Dispatch {
        tensors,
        dims: dims.clone(),
        params,
    };
    passes.split.record(gpu, encoder, &split, g)?;
    let mut tensors = vec![("part_o", &part_o), ("part_ml", &part_ml), ("o", args.o)];
    tensors.extend(args.mods.sinks.map(|t| ("sinks", t)));
    let reduce = Dispatch {
        tensors,
        dims: dims.clone(),
        params: Vec::new(),
    };
    let g = grid(passes.reduce.abi(), &dims);
    passes.reduce.record(gpu, encoder, &reduce, g)?;
    Ok(slicing)
}

/// Shapes, dtypes, heads, scale and modifiers of a decode call against its split kernel;
/// the batch and heads.
fn check(
    abi: &KernelAbi,
    reduce: &KernelAbi,
    args: &DecodeArgs,
) -> Result<(u32, Heads), InputError> {
    let c = &args.cache;
    let layout = "[batch, n_heads, head_dim]";
    let o_layout = "[batch, n_heads, head_dim_v]";
    let [batch, n_heads, head_dim] =
        <[u32; 3]>::try_from(args.q.shape()).map_err(|_| TensorError::Rank {
            name: "q".into(),
            got: args.q.shape().to_vec(),
            rank: 3,
            layout,
        })?;
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
    let mut tensors = vec![
        ("q", args.q, vec![batch, n_heads, head_dim], layout),
        ("k_cache", c.k, kv, kv_layout),
        (
            "v_cache",
            c.v,
            vec![rows, per, n_kv_heads, head_dim_v],
            v_layout,
        ),
        ("seq_lens", c.seq_lens, vec![batch], "[batch]"),
    ];
    if let Some(scales) = c.scales {
        tensors.push(("kv_scales", scales, vec![2, n_kv_heads], "[2, n_kv_heads]"));
    }
    let capacity = match c.block_table {
        None => {
            if rows != batch {
                return Err(TensorError::Shape {
                    name: "k_cache".into(),
                    got: c.k.shape().to_vec(),
                    want: vec![batch, per, n_kv_heads, head_dim],
                    layout: kv_layout,
                }
                .into());
            }
            u64::from(per)
        }
        Some(table) => {
            let pages_per_seq = table.shape().get(1).copied().unwrap_or(0);
            tensors.push((
                "block_table",
                table,
                vec![batch, pages_per_seq],
                "[batch, pages_per_seq]",
            ));
            u64::from(pages_per_seq) * u64::from(per)
        }
    };
    expect_all(abi, &tensors)?;
    expect_all(
        reduce,
        &[("o", args.o, vec![batch, n_heads, head_dim_v], o_layout)],
    )?;
    if u64::from(c.max_len) > capacity {
        return Err(InputError::CacheTooShort {
            cache_len: c.max_len,
            capacity,
        });
    }
    args.mods.validate(abi, batch, 1, n_heads)?;
    Ok((batch, h))
}
