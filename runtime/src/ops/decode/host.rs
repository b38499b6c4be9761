//! The decode of host slices: split-K (the two kernels, `decode_split` then
//! `decode_reduce`, the rule that cuts the cache into slices), the plain decode, and the
//! planner's choice between them ([`super::Decode`] records a decode on device tensors).
//!
//! The plain decode runs one workgroup per (head, sequence): 32 heads make 32 workgroups,
//! a fraction of a GPU's cores, each walking the whole cache alone. Split-K gives every
//! (slice, KV head, sequence) a workgroup, so the cache is read by hundreds of workgroups at
//! once, each reading its slice of K and V once for the query heads of its KV head.

use attn_dsl::{Cache, Dtype, KernelAbi, Op};

use crate::device::Gpu;
use crate::dispatch::Record;
use crate::dispatch::kernel::{Kernel, Step};
use crate::dispatch::uniforms::{checked_grid, modified_uniforms, submit};
use crate::error::{Error, InputError};
use crate::modifiers::Modifiers;
use crate::ops::decode::{Combine, DecodeSpec, SplitLayout};
use crate::plan::calibration::Calibration;
use crate::plan::decode::{Slicing, plan_slices};
use crate::shape::{
    Heads, binding_size, element_bytes, expect_op, length, nonzero, validate_heads, validate_scale,
};
use crate::tensor::Tensor;
use crate::tensor::buffers;

/// A paged KV cache: `DecodeInput::k_cache` and `v_cache` hold a pool of pages
/// `[n_pages, page_size, n_kv_heads, head_dim]`, and row `b` of `block_table`
/// (`[batch, pages_per_seq]`) names the pool page of sequence b's keys
/// `p·page_size..(p + 1)·page_size` (vLLM's PagedAttention layout). Entries past the
/// pages `cache_len` needs are never read.
#[derive(Clone, Copy, Debug)]
pub struct Pages<'a> {
    /// Each sequence's pool pages in order, `[batch, pages_per_seq]`.
    pub block_table: &'a [u32],
    /// Keys per page.
    pub page_size: u32,
}

/// The two kernels of split-K decode for one head_dim and mask set.
pub struct SplitDecode {
    split: Kernel,
    reduce: Kernel,
    /// The staged pass combining in place, taken where its grid is one wave.
    combined: Option<Kernel>,
    key_tile: u32,
    max_slice: u32,
    calibration: Calibration,
}

impl SplitDecode {
    /// From the ABIs of a `decode_split` kernel and the `decode_reduce` that reads it; the
    /// pipelines are created now (in a browser their validation goes to the device's
    /// uncaptured-error handler).
    pub fn new(gpu: &Gpu, split: &KernelAbi, reduce: &KernelAbi) -> Result<SplitDecode, Error> {
        expect_op(split, Op::DecodeSplit)?;
        expect_op(reduce, Op::DecodeReduce)?;
        if reduce.head_dim != split.head_dim {
            return Err(InputError::HeadDim {
                kernel: reduce.name.to_string(),
                kernel_head_dim: reduce.head_dim,
                given: split.head_dim,
            }
            .into());
        }
        if reduce.head_dim_v() != split.head_dim_v() {
            return Err(InputError::HeadDimV {
                kernel: reduce.name.to_string(),
                kernel_head_dim_v: reduce.head_dim_v(),
                given: split.head_dim_v(),
            }
            .into());
        }
        let (key_tile, max_slice) = crate::ops::decode::split_layout(split);
        Ok(SplitDecode {
            split: Kernel::now(gpu, split)?,
            reduce: Kernel::now(gpu, reduce)?,
            combined: None,
            key_tile,
            max_slice,
            calibration: crate::plan::tuning::Table::for_gpu(gpu)?.calibration(),
        })
    }

    /// The kernels of `spec`: the family's where it has them (f32, one width, the
    /// planned layout), else compiled from the same descriptions now (any head_dim that
    /// is a multiple of 4, any masks, f16 with SHADER_F16, bf16, an fp8 cache: the host
    /// calls upload the cache rounded to it, with scales of 1). One split pass, the staged
    /// one: the streamed pass that [`crate::ops::decode::Decode::new`] plans beside it for
    /// narrow rows over long caches is the device API's.
    pub fn for_spec(gpu: &Gpu, spec: &DecodeSpec) -> Result<SplitDecode, Error> {
        let family = match spec.cache {
            Cache::Contiguous => &crate::kernels::DECODE_SPLIT,
            Cache::Paged => &crate::kernels::DECODE_SPLIT_PAGED,
        };
        // The family's kernels are f32 over an f32 cache.
        let found = family
            .iter()
            .find(|(s, _)| s.head_dim == spec.head_dim && s.masks == spec.masks);
        let plain = spec.dtype == Dtype::F32
            && spec.kv_fp8.is_none()
            && spec.head_dim == spec.head_dim_v
            && SplitLayout::PLANNED == SplitLayout::Staged;
        match found {
            Some((s, r)) if plain => SplitDecode::new(gpu, s, r),
            _ => SplitDecode::with_layout(gpu, spec, SplitLayout::PLANNED),
        }
    }

    /// [`SplitDecode::for_spec`] with the split pass in `layout` (streamed needs
    /// SUBGROUP), whatever the runtime plans: `bench` and `check` time and test each.
    pub fn with_layout(
        gpu: &Gpu,
        spec: &DecodeSpec,
        layout: SplitLayout,
    ) -> Result<SplitDecode, Error> {
        SplitDecode::with_passes(gpu, spec, layout, Combine::planned(gpu, layout))
    }

    /// [`SplitDecode::with_layout`] with the slices combined as `combine` asks (in place
    /// only where the device runs it), whatever the runtime plans.
    pub fn with_passes(
        gpu: &Gpu,
        spec: &DecodeSpec,
        layout: SplitLayout,
        combine: Combine,
    ) -> Result<SplitDecode, Error> {
        let [split, reduce] = crate::ops::decode::abis(gpu, spec, layout, combine)?;
        let mut decode = SplitDecode::new(gpu, &split, &reduce)?;
        if combine == Combine::ByGrid
            && let Some(abi) = crate::ops::decode::combined_pass(gpu, spec, layout)?
        {
            decode.combined = Some(Kernel::now(gpu, &abi)?);
        }
        Ok(decode)
    }

    /// Whether every call's split pass combines its slices itself, with no reduce pass
    /// after it ([`Combine::InPlace`]).
    pub fn combines(&self) -> bool {
        crate::ops::decode::combines(self.split.abi())
    }

    /// The longest slice the split kernel's workgroup memory holds.
    pub fn max_slice(&self) -> u32 {
        self.max_slice
    }

    /// Keys the split kernel scores per step; a slice is a whole number of them.
    pub fn key_tile(&self) -> u32 {
        self.key_tile
    }

    /// The split pass, which flushes each slice's partial softmax.
    pub fn split_kernel(&self) -> &Kernel {
        &self.split
    }

    /// The reduce pass, which merges the slices' partials into O.
    pub fn reduce_kernel(&self) -> &Kernel {
        &self.reduce
    }

    /// The slicing [`plan_slices`] picks for this input.
    pub fn slicing(&self, input: &DecodeInput) -> Slicing {
        self.slicing_of(input.heads, input.batch, input.cache_len)
    }

    /// The slicing [`plan_slices`] picks for a shape.
    pub fn slicing_of(&self, h: Heads, batch: u32, cache_len: u32) -> Slicing {
        let per_kv = h.n_heads / h.n_kv_heads.max(1);
        let groups = h
            .n_kv_heads
            .saturating_mul(per_kv.div_ceil(self.split.abi().grid.tile));
        plan_slices(
            cache_len,
            groups.saturating_mul(batch),
            self.key_tile,
            self.max_slice,
            self.calibration.decode_workgroups(),
        )
    }

    /// Validates, uploads and runs both passes; `slice_len` overrides the rule (a multiple of
    /// the key tile, at most the kernel's longest slice). Returns O, `[batch, n_heads,
    /// head_dim_v]`.
    pub async fn run(
        &self,
        gpu: &Gpu,
        input: &DecodeInput<'_>,
        slice_len: Option<u32>,
    ) -> Result<Vec<f32>, Error> {
        self.run_on_device(gpu, input, None, slice_len).await
    }

    /// [`SplitDecode::run`] on a paged cache (kernels described with `cache: paged`).
    pub async fn run_paged(
        &self,
        gpu: &Gpu,
        input: &DecodeInput<'_>,
        pages: &Pages<'_>,
        slice_len: Option<u32>,
    ) -> Result<Vec<f32>, Error> {
        self.run_on_device(gpu, input, Some(pages), slice_len).await
    }

    /// The host input checked, uploaded, decoded through [`crate::ops::decode`] (every
    /// sequence at `cache_len`) and read back.
    async fn run_on_device(
        &self,
        gpu: &Gpu,
        input: &DecodeInput<'_>,
        pages: Option<&Pages<'_>>,
        slice_len: Option<u32>,
    ) -> Result<Vec<f32>, Error> {
        self.validate_layout(gpu, input, pages)?;
        let h = input.heads;
        let b = input.batch;
        let split = self.split.abi();
        let data = split.scalar("q");
        let kv_row = u64::from(h.n_kv_heads) * u64::from(h.head_dim);
        let cache_shape = match pages {
            None => {
                let capacity = input.k_cache.len() as u64 / (u64::from(b) * kv_row);
                [b, capacity as u32, h.n_kv_heads, h.head_dim]
            }
            Some(p) => {
                let n_pages = input.k_cache.len() as u64 / (u64::from(p.page_size) * kv_row);
                [n_pages as u32, p.page_size, h.n_kv_heads, h.head_dim]
            }
        };
        let [rows, per, n_kv, _] = cache_shape;
        let q_shape = [b, h.n_heads, h.head_dim];
        let q = Tensor::from_f32(gpu, &q_shape, data, input.q)?;
        let cache = split.scalar("k_cache");
        let k = Tensor::from_f32(gpu, &cache_shape, cache, input.k_cache)?;
        let v = Tensor::from_f32(gpu, &[rows, per, n_kv, h.head_dim_v], cache, input.v_cache)?;
        let scales = match cache.fp8() {
            Some(_) => Some(crate::ops::cache::unit_scales(gpu, h.n_kv_heads)?),
            None => None,
        };
        let seq_lens = Tensor::from_u32(gpu, &[b], &vec![input.cache_len; b as usize])?;
        let table = match pages {
            None => None,
            Some(p) => {
                let per_seq = p.block_table.len() as u32 / b;
                Some(Tensor::from_u32(gpu, &[b, per_seq], p.block_table)?)
            }
        };
        let o = Tensor::zeros(
            gpu,
            &[b, h.n_heads, h.head_dim_v],
            self.reduce.abi().scalar("o"),
        )?;
        // The modifiers' tensors and a block mask cover the cache's positions: a slot's
        // capacity.
        let capacity = capacity(input, pages);
        let mut uploaded = input.mods.upload(gpu, b, (1, capacity))?;
        crate::ops::block_mask::make_block_mask(gpu, &mut uploaded, h.n_heads, capacity)?;
        let flex = uploaded.flex_tensors();
        let args = crate::ops::decode::DecodeArgs {
            rows: Default::default(),
            q: &q,
            cache: crate::ops::decode::CacheView {
                slot0: 0,
                k: &k,
                v: &v,
                seq_lens: &seq_lens,
                max_len: input.cache_len,
                block_table: table.as_ref(),
                scales: scales.as_ref(),
            },
            o: &o,
            scale: input.scale,
            mods: uploaded.view(&input.mods, &flex),
            slice_len,
        };
        let mut passes = crate::ops::decode::Passes::new(
            self.split.clone(),
            self.reduce.clone(),
            self.calibration,
        );
        if let Some(combined) = &self.combined {
            passes = passes.with_combined(combined.clone());
        }
        let mut scratch = crate::ops::decode::Scratch::default();
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        encoder.recorder(|rec| {
            crate::ops::decode::record(gpu, &mut passes, &mut scratch, rec, (&args, None))
        })?;
        gpu.queue.submit([encoder.finish()]);
        o.to_f32(gpu).await
    }

    /// Whether the split kernel reads a paged cache.
    pub fn paged(&self) -> bool {
        self.split.abi().binding("block_table").is_some()
    }

    /// The cache layout checks: contiguous as the plain decode's, or the pool and table of
    /// `pages`; a kernel of the other layout is refused.
    fn validate_layout(
        &self,
        gpu: &Gpu,
        input: &DecodeInput,
        pages: Option<&Pages>,
    ) -> Result<(), InputError> {
        let abi = self.split.abi();
        let name = |paged| if paged { "paged" } else { "contiguous" };
        if self.paged() != pages.is_some() {
            return Err(InputError::CacheLayout {
                kernel: abi.name.to_string(),
                reads: name(self.paged()),
                given: name(pages.is_some()),
            });
        }
        match pages {
            None => validate_cache(abi, gpu.limits(), input),
            Some(p) => {
                validate_query(abi, input)?;
                validate_pages(gpu.limits(), input, p)?;
                validate_mods(abi, input, capacity(input, pages))
            }
        }
    }

    /// Buffers and grids of both passes for `input`, validated.
    pub fn prepare(
        &self,
        gpu: &Gpu,
        input: &DecodeInput,
        pages: Option<&Pages>,
        slice_len: Option<u32>,
    ) -> Result<Prepared, Error> {
        let split = self.split.abi();
        self.validate_layout(gpu, input, pages)?;
        let slicing = match slice_len {
            None => self.slicing(input),
            Some(len) => self.checked_slice(input.cache_len, len)?,
        };
        let h = input.heads;
        let dims = [
            ("cache_len", input.cache_len),
            ("n_heads", h.n_heads),
            ("n_kv_heads", h.n_kv_heads),
            ("head_dim", h.head_dim),
            ("batch", input.batch),
            ("capacity", capacity(input, pages)),
            ("slice_len", slicing.slice_len),
            ("n_slices", slicing.n_slices),
            ("page_size", pages.map_or(0, |p| p.page_size)),
            (
                "pages_per_seq",
                pages.map_or(0, |p| p.block_table.len() as u32 / input.batch),
            ),
            ("n_rows", 1),
            ("slot0", 0),
        ];
        let split_grid = checked_grid(split, gpu.limits(), &dims)?;
        let groups = (split_grid[1] * split_grid[2]) as usize;
        let reduce_grid = checked_grid(self.reduce.abi(), gpu.limits(), &dims)?;
        let parts = (input.batch * slicing.n_slices * h.n_heads) as usize;
        // A record per (sequence, slice, head): the output, then (m, l, 0, 0).
        let record = h.head_dim_v as usize + 4;
        let (dims, params) = modified_uniforms(gpu, split, &dims, input.scale, h, &input.mods)?;
        let o_len = input.q.len() / h.head_dim as usize * h.head_dim_v as usize;
        Ok(Prepared {
            q: buffers::storage_as(gpu, "q", input.q, split.scalar("q")),
            k: buffers::storage_as(gpu, "k_cache", input.k_cache, split.scalar("k_cache")),
            v: buffers::storage_as(gpu, "v_cache", input.v_cache, split.scalar("v_cache")),
            partials: buffers::output::<f32>(gpu, "partials", parts * record),
            arrivals: buffers::output::<u32>(gpu, "arrivals", groups),
            q_starts: buffers::storage(gpu, "q_starts", &(0..=input.batch).collect::<Vec<u32>>()),
            o: buffers::output_as(gpu, "o", o_len, self.reduce.abi().scalar("o")),
            o_len,
            dims,
            params,
            mods: input.mods.buffers(gpu),
            block_table: buffers::storage(
                gpu,
                "block_table",
                pages.map_or(&[0][..], |p| p.block_table),
            ),
            seq_lens: buffers::storage(
                gpu,
                "seq_lens",
                &vec![input.cache_len; input.batch as usize],
            ),
            kv_scales: buffers::storage(gpu, "kv_scales", &vec![1.0f32; 2 * h.n_kv_heads as usize]),
            split_grid,
            reduce_grid,
            slicing,
        })
    }

    fn checked_slice(&self, cache_len: u32, len: u32) -> Result<Slicing, InputError> {
        if len == 0 || !len.is_multiple_of(self.key_tile) || len > self.max_slice {
            return Err(InputError::SliceLen {
                slice_len: len,
                key_tile: self.key_tile,
                max: self.max_slice,
            });
        }
        Ok(Slicing {
            slice_len: len,
            n_slices: cache_len.div_ceil(len),
        })
    }
}

/// The block table against the pool: whole rows per sequence, pages enough for
/// `cache_len`, and every page a row uses inside the pool.
fn validate_pages(
    limits: &wgpu::Limits,
    input: &DecodeInput,
    pages: &Pages,
) -> Result<(), InputError> {
    let h = input.heads;
    let page_size = u64::from(pages.page_size);
    if page_size == 0 {
        return Err(InputError::ZeroDim { name: "page_size" });
    }
    let page = page_size * u64::from(h.n_kv_heads) * u64::from(h.head_dim);
    let pool = input.k_cache.len() as u64;
    if !pool.is_multiple_of(page) || pool == 0 {
        return Err(InputError::Pages(format!(
            "k_cache holds {pool} floats, not a whole number of pages of page_size × n_kv_heads              × head_dim = {page}"
        )));
    }
    length(
        "v_cache",
        input.v_cache.len(),
        pool / u64::from(h.head_dim) * u64::from(h.head_dim_v),
        "the same pages as k_cache, head_dim_v wide",
    )?;
    let table = pages.block_table;
    let batch = input.batch as usize;
    if table.is_empty() || !table.len().is_multiple_of(batch) {
        return Err(InputError::Pages(format!(
            "block_table has {} entries, not batch ({batch}) rows of pages_per_seq",
            table.len()
        )));
    }
    let per_seq = table.len() / batch;
    let capacity = per_seq as u64 * page_size;
    if u64::from(input.cache_len) > capacity {
        return Err(InputError::CacheTooShort {
            cache_len: input.cache_len,
            capacity,
        });
    }
    let n_pages = pool / page;
    let used = u64::from(input.cache_len).div_ceil(page_size) as usize;
    for (b, row) in table.chunks(per_seq).enumerate() {
        if let Some((p, &page)) = row[..used]
            .iter()
            .enumerate()
            .find(|(_, x)| u64::from(**x) >= n_pages)
        {
            return Err(InputError::Pages(format!(
                "block_table[{b}, {p}] = {page} is past the pool's {n_pages} pages"
            )));
        }
    }
    binding_size(limits, pool * 4)
}

/// Both passes' buffers and grids, for running or timing.
pub struct Prepared {
    q: wgpu::Buffer,
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    partials: wgpu::Buffer,
    /// A combining split pass's arrivals per query group, zeros between dispatches.
    arrivals: wgpu::Buffer,
    /// One query row per sequence: row b of Q and O.
    q_starts: wgpu::Buffer,
    /// The output O, which the reduce pass writes.
    pub o: wgpu::Buffer,
    /// Elements of O: `batch · n_heads · head_dim_v`.
    pub o_len: usize,
    dims: wgpu::Buffer,
    params: wgpu::Buffer,
    mods: Vec<(String, wgpu::Buffer)>,
    block_table: wgpu::Buffer,
    seq_lens: wgpu::Buffer,
    /// An fp8 cache's scales: all 1 (the host values were rounded as they are).
    kv_scales: wgpu::Buffer,
    split_grid: [u32; 3],
    reduce_grid: [u32; 3],
    /// How the cache is cut into slices for the split pass.
    pub slicing: Slicing,
}

impl Prepared {
    /// Workgroups of the split pass.
    pub fn split_workgroups(&self) -> u32 {
        self.split_grid.iter().product()
    }

    /// The query and the cache, uploaded once, for another decode kernel to read (bench).
    #[cfg(all(feature = "harness", not(target_arch = "wasm32")))]
    pub(crate) fn inputs(&self) -> [(&'static str, &wgpu::Buffer); 3] {
        [("q", &self.q), ("k_cache", &self.k), ("v_cache", &self.v)]
    }

    /// The split pass, then the reduce (where the split pass does not combine its slices
    /// itself), as dispatch steps.
    pub fn steps<'a>(&'a self, kernels: &'a SplitDecode) -> Vec<Step<'a>> {
        let mut split = vec![
            ("q", &self.q),
            ("k_cache", &self.k),
            ("v_cache", &self.v),
            ("partials", &self.partials),
            ("q_starts", &self.q_starts),
            ("dims", &self.dims),
            ("params", &self.params),
            ("block_table", &self.block_table),
            ("seq_lens", &self.seq_lens),
            ("kv_scales", &self.kv_scales),
            ("o", &self.o),
            ("arrivals", &self.arrivals),
        ];
        split.extend(self.mods.iter().map(|(n, b)| (n.as_str(), b)));
        let mut reduce = vec![
            ("partials", &self.partials),
            ("q_starts", &self.q_starts),
            ("o", &self.o),
            ("dims", &self.dims),
        ];
        reduce.extend(self.mods.iter().map(|(n, b)| (n.as_str(), b)));
        let mut steps = vec![Step {
            kernel: &kernels.split,
            bound: split,
            grid: self.split_grid,
        }];
        if !kernels.combines() {
            steps.push(Step {
                kernel: &kernels.reduce,
                bound: reduce,
                grid: self.reduce_grid,
            });
        }
        steps
    }
}

/// The decode the planner runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodePath {
    /// One workgroup per head over the whole cache.
    Plain,
    /// Split-K with this slicing, then the reduce.
    Split(Slicing),
}

/// Which decode the planner runs for `input`: split-K, except for a cache of one slice
/// whose KV heads each serve one query head, where split-K would run the plain decode's
/// workgroups plus a reduce pass. On lavapipe split-K was as fast or faster at every other
/// shape measured, down to a 7-row cache (GQA sharing alone: 32 heads over 8, 3.8x).
pub fn plan_decode(split: &SplitDecode, input: &DecodeInput) -> DecodePath {
    let slicing = split.slicing(input);
    let h = input.heads;
    if slicing.n_slices == 1 && h.n_heads == h.n_kv_heads {
        DecodePath::Plain
    } else {
        DecodePath::Split(slicing)
    }
}

/// Decode with the planner's choice between the plain kernel and split-K, both for one
/// head_dim and mask set.
pub struct Decoder {
    plain: Kernel,
    split: SplitDecode,
}

impl Decoder {
    /// Pairs the plain kernel with the split pair; they must be of one head_dim,
    /// head_dim_v and mask set.
    pub fn new(gpu: &Gpu, plain: &KernelAbi, split: SplitDecode) -> Result<Decoder, Error> {
        expect_op(plain, Op::Decode)?;
        let s = split.split.abi();
        if plain.head_dim != s.head_dim
            || plain.head_dim_v() != s.head_dim_v()
            || plain.masks != s.masks
        {
            return Err(InputError::HeadDim {
                kernel: plain.name.to_string(),
                kernel_head_dim: plain.head_dim,
                given: s.head_dim,
            }
            .into());
        }
        Ok(Decoder {
            plain: Kernel::now(gpu, plain)?,
            split,
        })
    }

    /// The path [`plan_decode`] picks for `input`.
    pub fn plan(&self, input: &DecodeInput) -> DecodePath {
        plan_decode(&self.split, input)
    }

    /// Runs the planned decode; returns O, `[batch, n_heads, head_dim_v]`, and the path
    /// taken.
    pub async fn run(
        &self,
        gpu: &Gpu,
        input: &DecodeInput<'_>,
    ) -> Result<(Vec<f32>, DecodePath), Error> {
        let path = self.plan(input);
        let o = match path {
            DecodePath::Plain => decode(gpu, &self.plain, input).await?,
            DecodePath::Split(s) => self.split.run(gpu, input, Some(s.slice_len)).await?,
        };
        Ok((o, path))
    }
}

// The plain decode of host slices (one workgroup per head).

/// One query row per head and sequence against the first `cache_len` rows of a KV cache
/// laid out `[batch, capacity, n_kv_heads, head_dim]`; `q` is `[batch, n_heads, head_dim]`.
#[derive(Clone, Copy, Debug)]
pub struct DecodeInput<'a> {
    /// Sequences, each with its own query row and cache.
    pub batch: u32,
    /// Cache rows each query attends over, the same for every sequence.
    pub cache_len: u32,
    /// Query and KV heads and their widths.
    pub heads: Heads,
    /// The query rows, `[batch, n_heads, head_dim]`.
    pub q: &'a [f32],
    /// Cached keys, `[batch, capacity, n_kv_heads, head_dim]`.
    pub k_cache: &'a [f32],
    /// Cached values, `[batch, capacity, n_kv_heads, head_dim_v]`.
    pub v_cache: &'a [f32],
    /// Defaults to `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// The window (over the cache's last rows), ALiBi slopes and soft cap the kernel takes.
    pub mods: Modifiers<'a>,
}

/// The plain decode of host data (one workgroup per head), read back.
pub async fn decode(
    gpu: &Gpu,
    kernel: &Kernel,
    input: &DecodeInput<'_>,
) -> Result<Vec<f32>, Error> {
    let abi = kernel.abi();
    validate_decode(abi, gpu.limits(), input)?;
    let h = input.heads;
    let row = u64::from(input.batch) * u64::from(h.n_kv_heads) * u64::from(h.head_dim);
    let capacity = (input.k_cache.len() as u64 / row) as u32;
    let dims = [
        ("cache_len", input.cache_len),
        ("n_heads", h.n_heads),
        ("n_kv_heads", h.n_kv_heads),
        ("head_dim", h.head_dim),
        ("batch", input.batch),
        ("capacity", capacity),
    ];
    let grid = checked_grid(abi, gpu.limits(), &dims)?;
    let q = buffers::storage(gpu, "q", input.q);
    let k = buffers::storage(gpu, "k_cache", input.k_cache);
    let v = buffers::storage(gpu, "v_cache", input.v_cache);
    let o_len = (u64::from(input.batch) * u64::from(h.n_heads) * u64::from(h.head_dim_v)) as usize;
    let o = buffers::output::<f32>(gpu, "o", o_len);
    let (dims, params) = modified_uniforms(gpu, abi, &dims, input.scale, h, &input.mods)?;
    let mods = input.mods.buffers(gpu);
    let mut bound = vec![
        ("q", &q),
        ("k_cache", &k),
        ("v_cache", &v),
        ("o", &o),
        ("dims", &dims),
        ("params", &params),
    ];
    bound.extend(mods.iter().map(|(n, b)| (n.as_str(), b)));
    submit(gpu, kernel, &bound, grid)?;
    buffers::read(gpu, &o, o_len).await
}

/// The checks [`decode`] makes before it uploads anything: the kernel's op, the query
/// against the kernel, the cache's lengths, `cache_len` against the cache's capacity and
/// the adapter's binding size.
pub fn validate_decode(
    abi: &KernelAbi,
    limits: &wgpu::Limits,
    input: &DecodeInput,
) -> Result<(), InputError> {
    expect_op(abi, Op::Decode)?;
    validate_cache(abi, limits, input)
}

/// Dims, Q and cache lengths, scale and modifiers of a decode (plain or split-K), against
/// the kernel that reads the cache.
pub(crate) fn validate_cache(
    abi: &KernelAbi,
    limits: &wgpu::Limits,
    input: &DecodeInput,
) -> Result<(), InputError> {
    validate_query(abi, input)?;
    let h = input.heads;
    let (nkv, d) = (h.n_kv_heads as u64, h.head_dim as u64);
    let batch = u64::from(input.batch);
    // A row of the cache holds every sequence's KV heads.
    let row = batch * nkv * d;
    let capacity = input.k_cache.len() as u64 / row;
    if !(input.k_cache.len() as u64).is_multiple_of(row) {
        return Err(InputError::Length {
            name: "k_cache",
            expected: (capacity + 1) * row,
            got: input.k_cache.len() as u64,
            layout: "batch × capacity × n_kv_heads × head_dim, for a whole capacity".into(),
        });
    }
    length(
        "v_cache",
        input.v_cache.len(),
        capacity * row / d * u64::from(h.head_dim_v),
        "the same rows as k_cache, head_dim_v wide",
    )?;
    if u64::from(input.cache_len) > capacity {
        return Err(InputError::CacheTooShort {
            cache_len: input.cache_len,
            capacity,
        });
    }
    binding_size(
        limits,
        input.k_cache.len() as u64 * element_bytes(abi, "k_cache"),
    )?;
    validate_mods(abi, input, capacity as u32)
}

/// What every decode checks whatever its cache's layout: dims, heads, Q's length and the
/// scale (the modifiers once the cache's capacity is known: [`validate_mods`]).
pub(crate) fn validate_query(abi: &KernelAbi, input: &DecodeInput) -> Result<(), InputError> {
    nonzero("batch", input.batch)?;
    nonzero("cache_len", input.cache_len)?;
    let h = input.heads;
    validate_heads(abi, h)?;
    length(
        "q",
        input.q.len(),
        crate::tensor::elements(&[input.batch, h.n_heads, h.head_dim]),
        "batch × n_heads × head_dim",
    )?;
    validate_scale(input.scale)
}

/// The modifiers against the kernel, their tensors' `seq` dimensions over the cache's
/// `positions` (its capacity).
fn validate_mods(abi: &KernelAbi, input: &DecodeInput, positions: u32) -> Result<(), InputError> {
    let h = input.heads;
    input
        .mods
        .validate(abi, input.batch, (1, positions), h.n_heads)
}

/// A host cache's positions per sequence: the rows of its contiguous layout, or the pages
/// of a row of the block table (the lengths checked before).
fn capacity(input: &DecodeInput, pages: Option<&Pages>) -> u32 {
    let h = input.heads;
    match pages {
        None => {
            let row = u64::from(input.batch) * u64::from(h.n_kv_heads) * u64::from(h.head_dim);
            (input.k_cache.len() as u64 / row.max(1)) as u32
        }
        Some(p) => p.block_table.len() as u32 / input.batch.max(1) * p.page_size,
    }
}
