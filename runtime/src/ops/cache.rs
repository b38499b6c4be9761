//! A KV cache on the device: K and V rows of `slots` sequences, contiguous
//! (`[slots, capacity, n_kv_heads, head_dim]`) or paged (vLLM's layout: a pool of pages
//! `[n_pages, page_size, n_kv_heads, head_dim]` and a block table `[slots,
//! pages_per_seq]`), with each slot's length on the device. V rows are `head_dim_v` wide
//! (MLA's 128 beside K's 192), `head_dim` but where a model says otherwise.
//!
//! Every change is recorded into the caller's encoder, in order with the ops around it:
//! an append copies the new rows and moves the lengths on in one dispatch (it reads one
//! of two length buffers and writes the other), opening or freeing a slot clears its
//! length, a new page's block-table entry is copied in. The host keeps a mirror of the
//! lengths and pages (what the device will hold once the recorded commands run, in the
//! order recorded): it refuses an append past the capacity, to a free slot, or beyond the
//! free pages before anything is recorded, so a refused call leaves the cache as it was.

use std::ops::Range;

use attn_dsl::{Cache, Dtype, Fp8, KernelSpec, Masks, Op, Scalar};
use wgpu::util::DeviceExt;

use super::decode::{CacheView, Decode, DecodeArgs, QueryRows};
use super::forward::{Forward, ForwardArgs};
use super::{grid, rank4};
use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::dispatch::record::{Dispatch, Pipeline};
use crate::dispatch::recorder::{Record, Recorder};
use crate::error::{Error, InputError};
use crate::modifiers::expect;
use crate::plan::decode::Slicing;
use crate::tensor::Tensor;

/// How the rows are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheLayout {
    /// `capacity` rows per slot, in one block.
    Contiguous {
        /// Rows each slot holds.
        capacity: u32,
    },
    /// A pool of `n_pages` pages of `page_size` rows, shared by the slots; a slot holds at
    /// most `pages_per_seq` of them.
    Paged {
        /// Rows per page.
        page_size: u32,
        /// Pages in the pool.
        n_pages: u32,
        /// The most pages one slot holds: the block table's row length.
        pages_per_seq: u32,
    },
}

impl CacheLayout {
    /// The most rows one slot can hold: the positions a modifier's `seq` tensors and a
    /// block mask cover in a decode of this cache.
    pub fn capacity(&self) -> u32 {
        match *self {
            CacheLayout::Contiguous { capacity } => capacity,
            CacheLayout::Paged {
                page_size,
                pages_per_seq,
                ..
            } => page_size.saturating_mul(pages_per_seq),
        }
    }
}

/// What a cache holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CacheSpec {
    /// Sequences held at once (the decode's batch).
    pub slots: u32,
    /// K and V heads of each row.
    pub n_kv_heads: u32,
    /// The width of K rows.
    pub head_dim: u32,
    /// The width of V rows: `head_dim` but in MLA-style attention.
    pub head_dim_v: u32,
    /// f32, f16 or bf16: what the appended rows and the decode's Q and O hold too.
    pub dtype: Dtype,
    /// Contiguous slots or a pool of pages.
    pub layout: CacheLayout,
    /// `Some`: the cache holds 8-bit floats (half an f16 cache's bytes), each value divided
    /// by its KV head's scale ([`KvCache::set_scales`], 1 until set) when appended, rounded
    /// to nearest even and saturated; a decode multiplies the scales back. `None`: `dtype`.
    pub kv_fp8: Option<Fp8>,
}

/// An fp8 cache's scales, all 1: `[2, n_kv_heads]` f32 (K's, then V's).
pub(crate) fn unit_scales(gpu: &Gpu, n_kv_heads: u32) -> Result<Tensor, Error> {
    let ones = vec![1.0; 2 * n_kv_heads as usize];
    Tensor::from_f32(gpu, &[2, n_kv_heads], Scalar::F32, &ones)
}

pub use crate::error::CacheError;

/// A slot's length and pages, as the device will hold them.
#[derive(Clone, Debug, Default)]
struct Slot {
    open: bool,
    len: u32,
    pages: Vec<u32>,
}

/// The new rows of [`KvCache::extend`], `n` per slot, in the cache's dtype (its Q and O
/// dtype for an fp8 cache), RoPE applied at their positions where the model uses it.
#[derive(Clone, Copy, Debug)]
pub struct ExtendArgs<'a> {
    /// The new rows' keys, `[batch, n, n_kv_heads, head_dim]`.
    pub k_new: &'a Tensor,
    /// The new rows' values, `[batch, n, n_kv_heads, head_dim_v]`.
    pub v_new: &'a Tensor,
    /// The new rows' queries, `[batch, n, n_heads, head_dim]`.
    pub q: &'a Tensor,
    /// Their outputs, `[batch, n, n_heads, head_dim_v]`, written.
    pub o: &'a Tensor,
    /// Defaults to `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// The window, ALiBi slopes, soft cap, sinks and user tensors the decode takes.
    pub mods: crate::modifiers::DeviceModifiers<'a>,
}

/// A KV cache on the device and the host's mirror of its slots (see the module docs): the
/// appends, prefills and extends that write it, and the views a decode reads.
pub struct KvCache {
    spec: CacheSpec,
    k: Tensor,
    v: Tensor,
    /// The lengths, `[slots]` u32, twice: appends read `lens[current]` and write the other.
    lens: [Tensor; 2],
    current: usize,
    table: Option<Tensor>,
    /// An fp8 cache's scales, `[2, n_kv_heads]` f32: K's, then V's.
    scales: Option<Tensor>,
    slots: Vec<Slot>,
    free_pages: Vec<u32>,
    append_abi: attn_dsl::KernelAbi,
    append: Option<Pipeline>,
}

impl KvCache {
    /// A cache with every slot free, its buffers allocated now (zeroed).
    pub fn new(gpu: &Gpu, spec: CacheSpec) -> Result<KvCache, Error> {
        for (what, n) in [
            ("slots", spec.slots),
            ("n_kv_heads", spec.n_kv_heads),
            ("head_dim", spec.head_dim),
            ("head_dim_v", spec.head_dim_v),
        ] {
            if n == 0 {
                return Err(InputError::Cache(CacheError::Zero { what }).into());
            }
        }
        let (rows, per, cache) = match spec.layout {
            CacheLayout::Contiguous { capacity } => (spec.slots, capacity, Cache::Contiguous),
            CacheLayout::Paged {
                page_size, n_pages, ..
            } => (n_pages, page_size, Cache::Paged),
        };
        if let CacheLayout::Paged { pages_per_seq, .. } = spec.layout
            && pages_per_seq == 0
        {
            return Err(InputError::Cache(CacheError::Zero {
                what: "pages_per_seq",
            })
            .into());
        }
        if rows == 0 || per == 0 {
            return Err(InputError::Cache(CacheError::Zero {
                what: "capacity (rows or pages)",
            })
            .into());
        }
        let base = match cache {
            Cache::Contiguous => "attention_cache_append",
            Cache::Paged => "attention_cache_append_paged",
        };
        let append_spec = KernelSpec {
            cache,
            dtype: spec.dtype,
            kv_fp8: spec.kv_fp8,
            ..KernelSpec::standard(
                &crate::plan::kernels::cache_family_name(base, spec.kv_fp8, spec.head_dim),
                Op::CacheAppend,
                spec.head_dim,
                Masks::default(),
            )
        }
        .with_head_dim_v(spec.head_dim_v);
        let append_abi = attn_dsl::compile(&append_spec).map_err(|e| Error::Pipeline {
            kernel: append_spec.name.clone(),
            message: e.to_string(),
        })?;
        let shape = [rows, per, spec.n_kv_heads, spec.head_dim];
        let v_shape = [rows, per, spec.n_kv_heads, spec.head_dim_v];
        let scalar = spec.kv_fp8.map_or(Scalar::from(spec.dtype), Scalar::from);
        for s in [&shape, &v_shape] {
            let bytes =
                crate::tensor::elements(s).saturating_mul(crate::tensor::element_bytes(scalar));
            crate::shape::binding_size(gpu.limits(), bytes)?;
        }
        let table = match spec.layout {
            CacheLayout::Paged { pages_per_seq, .. } => Some(Tensor::zeros(
                gpu,
                &[spec.slots, pages_per_seq],
                Scalar::U32,
            )?),
            CacheLayout::Contiguous { .. } => None,
        };
        let free_pages = match spec.layout {
            // Taken from the end, so the first pages go first.
            CacheLayout::Paged { n_pages, .. } => (0..n_pages).rev().collect(),
            CacheLayout::Contiguous { .. } => Vec::new(),
        };
        let scales = match spec.kv_fp8 {
            Some(_) => Some(unit_scales(gpu, spec.n_kv_heads)?),
            None => None,
        };
        Ok(KvCache {
            k: Tensor::zeros(gpu, &shape, scalar)?,
            v: Tensor::zeros(gpu, &v_shape, scalar)?,
            scales,
            lens: [
                Tensor::zeros(gpu, &[spec.slots], Scalar::U32)?,
                Tensor::zeros(gpu, &[spec.slots], Scalar::U32)?,
            ],
            current: 0,
            table,
            slots: vec![Slot::default(); spec.slots as usize],
            free_pages,
            append_abi,
            append: None,
            spec,
        })
    }

    /// What the cache was created to hold.
    pub fn spec(&self) -> &CacheSpec {
        &self.spec
    }

    /// Sets an fp8 cache's scales: `k` and `v` hold one value (the whole tensor) or one per
    /// KV head, each finite and > 0. Written through the queue, so they hold for every
    /// command buffer submitted after this call, appends recorded earlier included: set
    /// them before the first append (rows already stored keep the scale they were stored
    /// with).
    pub fn set_scales(&self, gpu: &Gpu, k: &[f32], v: &[f32]) -> Result<(), Error> {
        let Some(scales) = &self.scales else {
            return Err(CacheError::NotFp8 {
                dtype: self.spec.dtype.name(),
            }
            .into());
        };
        let n = self.spec.n_kv_heads as usize;
        let mut values = Vec::with_capacity(2 * n);
        for (what, given) in [("K", k), ("V", v)] {
            if given.len() != 1 && given.len() != n {
                return Err(CacheError::Scales {
                    what,
                    given: given.len(),
                    n_kv_heads: self.spec.n_kv_heads,
                }
                .into());
            }
            if let Some(&value) = given.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
                return Err(CacheError::BadScale { value }.into());
            }
            values.extend((0..n).map(|h| given[h % given.len()]));
        }
        gpu.queue.write_buffer(
            scales.buffer(),
            scales.offset(),
            bytemuck::cast_slice(&values),
        );
        Ok(())
    }

    /// Rows slot `slot` holds; `None` for a free slot (or one past the cache).
    pub fn len(&self, slot: u32) -> Option<u32> {
        self.slots
            .get(slot as usize)
            .filter(|s| s.open)
            .map(|s| s.len)
    }

    /// Pages of the pool no slot holds (0 for a contiguous cache).
    pub fn free_pages(&self) -> u32 {
        self.free_pages.len() as u32
    }

    /// The slots' lengths on the device, `[slots]` u32: RoPE's positions for new rows
    /// (before they are appended).
    pub fn lengths(&self) -> &Tensor {
        &self.lens[self.current]
    }

    /// The most rows one slot can hold.
    pub fn capacity(&self) -> u32 {
        self.spec.layout.capacity()
    }

    /// Starts a sequence in free slot `slot`, empty.
    pub fn open(&mut self, encoder: &mut impl Record, slot: u32) -> Result<(), Error> {
        encoder.recorder(|rec| {
            self.check_slots(slot..slot.saturating_add(1))?;
            if self.slots[slot as usize].open {
                return Err(CacheError::Open { slot }.into());
            }
            self.slots[slot as usize] = Slot {
                open: true,
                len: 0,
                pages: Vec::new(),
            };
            self.clear_length(rec, slot);
            Ok(())
        })
    }

    /// Ends the sequence in slot `slot`: its pages go back to the pool, its length to 0 (a
    /// decode of a free slot gives zeros).
    pub fn free(&mut self, encoder: &mut impl Record, slot: u32) -> Result<(), Error> {
        encoder.recorder(|rec| {
            self.check_slots(slot..slot.saturating_add(1))?;
            let s = &mut self.slots[slot as usize];
            if !s.open {
                return Err(CacheError::AlreadyFree { slot }.into());
            }
            self.free_pages.extend(s.pages.drain(..).rev());
            *s = Slot::default();
            self.clear_length(rec, slot);
            Ok(())
        })
    }

    fn clear_length(&self, rec: &mut Recorder, slot: u32) {
        let lens = &self.lens[self.current];
        rec.encoder()
            .clear_buffer(lens.buffer(), lens.offset() + 4 * u64::from(slot), Some(4));
    }

    fn check_slots(&self, slots: Range<u32>) -> Result<(), CacheError> {
        if slots.end > self.spec.slots || slots.start > slots.end {
            return Err(CacheError::Slots {
                first: slots.start,
                end: slots.end,
                slots: self.spec.slots,
            });
        }
        Ok(())
    }

    /// Appends `k_new`, `[batch, n, n_kv_heads, head_dim]`, and `v_new`, `[batch, n,
    /// n_kv_heads, head_dim_v]`, in the cache's dtype, to slots `first_slot..first_slot +
    /// batch`, each at its length.
    pub fn append(
        &mut self,
        gpu: &Gpu,
        encoder: &mut impl Record,
        first_slot: u32,
        k_new: &Tensor,
        v_new: &Tensor,
    ) -> Result<(), Error> {
        encoder.recorder(|rec| {
            let layout = "[batch, n, n_kv_heads, head_dim]";
            let [batch, n, _, _] = rank4(k_new, "k_new", layout)?;
            let shape = [batch, n, self.spec.n_kv_heads, self.spec.head_dim];
            let v_shape = [batch, n, self.spec.n_kv_heads, self.spec.head_dim_v];
            let dtype = Scalar::from(self.spec.dtype);
            expect(k_new, "k_new", &shape, dtype, layout)?;
            let v_layout = "[batch, n, n_kv_heads, head_dim_v]";
            expect(v_new, "v_new", &v_shape, dtype, v_layout)?;
            let range = first_slot..first_slot.saturating_add(batch);
            let needed = self
                .pages_needed(range.clone(), n)
                .map_err(InputError::Cache)?;
            if n == 0 || batch == 0 {
                // Nothing to store, and a binding of no rows is smaller than the kernel's vec4.
                return Ok(());
            }
            if self.append.is_none() {
                self.append = Some(Pipeline::new(Kernel::now(gpu, &self.append_abi)?));
            }
            let checked = {
                let (d, g) = self.append_dispatch(first_slot, (batch, n), k_new, v_new);
                let pipeline = self.append.as_ref().expect("compiled above");
                pipeline.check(gpu, &d, g)?
            };
            // Checked and compiled: from here on the call only records, and the host's
            // bookkeeping follows what it records.
            let pages = self.take_pages(&needed);
            self.record_pages(gpu, rec, range.clone(), &pages);
            let pipeline = self.append.as_mut().expect("compiled above");
            pipeline.record_checked(rec, checked);
            self.current = 1 - self.current;
            for (slot, new_pages) in range.zip(pages) {
                let s = &mut self.slots[slot as usize];
                s.len += n;
                s.pages.extend(new_pages);
            }
            Ok(())
        })
    }

    /// The append kernel's dispatch of `n` rows for each of `batch` slots from
    /// `first_slot`, and its grid.
    fn append_dispatch<'a>(
        &'a self,
        first_slot: u32,
        (batch, n): (u32, u32),
        k_new: &'a Tensor,
        v_new: &'a Tensor,
    ) -> (Dispatch<'a>, [u32; 3]) {
        let (next, current) = (&self.lens[1 - self.current], &self.lens[self.current]);
        let mut tensors = vec![
            ("k_new", k_new),
            ("v_new", v_new),
            ("k_cache", &self.k),
            ("v_cache", &self.v),
            ("seq_lens", current),
            ("seq_lens_next", next),
        ];
        tensors.extend(self.table.as_ref().map(|t| ("block_table", t)));
        tensors.extend(self.scales.as_ref().map(|t| ("kv_scales", t)));
        let (capacity, page_size, pages_per_seq) = match self.spec.layout {
            CacheLayout::Contiguous { capacity } => (capacity, 0, 0),
            CacheLayout::Paged {
                page_size,
                pages_per_seq,
                ..
            } => (0, page_size, pages_per_seq),
        };
        let mut d = Dispatch::new(tensors);
        d.dims = vec![
            ("n_new", n),
            ("n_slots", self.spec.slots),
            ("n_kv_heads", self.spec.n_kv_heads),
            ("head_dim", self.spec.head_dim),
            ("batch", batch),
            ("capacity", capacity),
            ("page_size", page_size),
            ("pages_per_seq", pages_per_seq),
            ("slot0", first_slot),
        ];
        let g = grid(&self.append_abi, &d.dims);
        (d, g)
    }

    /// `needed[i]` pages from the pool for each slot, once every check has passed.
    fn take_pages(&mut self, needed: &[u32]) -> Vec<Vec<u32>> {
        needed
            .iter()
            .map(|&k| {
                (0..k)
                    .map(|_| self.free_pages.pop().expect("counted"))
                    .collect()
            })
            .collect()
    }

    /// How many pages each slot of `slots` needs for `n` more rows, or why it cannot take
    /// them: a slot out of range or free, past the capacity, or more pages than are free.
    fn pages_needed(&self, slots: Range<u32>, n: u32) -> Result<Vec<u32>, CacheError> {
        self.check_slots(slots.clone())?;
        let capacity = self.capacity();
        let mut needed = Vec::new();
        for slot in slots.clone() {
            let s = &self.slots[slot as usize];
            if !s.open {
                return Err(CacheError::Free { slot });
            }
            if u64::from(s.len) + u64::from(n) > u64::from(capacity) {
                return Err(CacheError::Full {
                    slot,
                    len: s.len,
                    adding: n,
                    capacity,
                });
            }
            let pages = match self.spec.layout {
                CacheLayout::Paged { page_size, .. } => {
                    (s.len + n).div_ceil(page_size) - s.pages.len() as u32
                }
                CacheLayout::Contiguous { .. } => 0,
            };
            needed.push(pages);
        }
        let total: u32 = needed.iter().sum();
        if total as usize > self.free_pages.len() {
            return Err(CacheError::OutOfPages {
                needed: total,
                free: self.free_pages.len() as u32,
            });
        }
        Ok(needed)
    }

    /// Records the block-table entries of new pages (one copy per slot that got some).
    fn record_pages(&self, gpu: &Gpu, rec: &mut Recorder, slots: Range<u32>, pages: &[Vec<u32>]) {
        let (Some(table), CacheLayout::Paged { pages_per_seq, .. }) =
            (&self.table, self.spec.layout)
        else {
            return;
        };
        for (slot, new) in slots.zip(pages) {
            if new.is_empty() {
                continue;
            }
            let held = self.slots[slot as usize].pages.len() as u64;
            let src = gpu
                .device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("attn block table entries"),
                    contents: bytemuck::cast_slice(new),
                    usage: wgpu::BufferUsages::COPY_SRC,
                });
            let at = table.offset() + 4 * (u64::from(slot) * u64::from(pages_per_seq) + held);
            rec.encoder()
                .copy_buffer_to_buffer(&src, 0, table.buffer(), at, 4 * new.len() as u64);
        }
    }

    /// The cache as the decode reads it: every slot (a free one decodes to zeros), the
    /// grid sized for the longest slot rounded up to a power of two, so that a decode
    /// loop's uniforms change only when that bound doubles.
    pub fn view(&self) -> CacheView<'_> {
        let longest = self.slots.iter().map(|s| s.len).max().unwrap_or(0);
        CacheView {
            slot0: 0,
            k: &self.k,
            v: &self.v,
            seq_lens: &self.lens[self.current],
            max_len: longest.max(1).next_power_of_two().min(self.capacity()),
            block_table: self.table.as_ref(),
            scales: self.scales.as_ref(),
        }
    }

    /// Continues slots `first_slot..first_slot + batch` by `n` rows each and records the
    /// new rows' attention over each slot's whole cache: the rows it held and the new ones,
    /// causal among the new ones (row r of n at position `len + r`). A chunk of a long
    /// prompt, a conversation's next turn, a speculative draft to verify; an empty slot
    /// too (its rows then see only each other). Appended and attended in one recorded
    /// piece of work: the append moves the lengths on the device, the decode (`decode`,
    /// built for this cache's widths, dtype and layout) reads them: split-K for a few rows,
    /// the forward's tiles for a chunk of [`super::extend::CHUNK_ROWS`] or more (on tensor cores in f16
    /// from [`super::extend::PACKED_CHUNK_ROWS`] rows times query heads per KV head).
    ///
    /// Everything is checked before anything is recorded: a refused call leaves the cache,
    /// its lengths and `o` as they were.
    pub fn extend(
        &mut self,
        gpu: &Gpu,
        encoder: &mut impl Record,
        decode: &mut Decode,
        first_slot: u32,
        args: &ExtendArgs,
    ) -> Result<Slicing, Error> {
        encoder.recorder(|rec| {
            let layout = "[batch, n, n_kv_heads, head_dim]";
            let [batch, n, _, _] = rank4(args.k_new, "k_new", layout)?;
            if n == 0 {
                return Err(
                    InputError::QueryRows("n = 0: extend adds at least one row".into()).into(),
                );
            }
            let range = first_slot..first_slot.saturating_add(batch);
            self.pages_needed(range.clone(), n)
                .map_err(InputError::Cache)?;
            let longest = range
                .clone()
                .map(|slot| self.slots[slot as usize].len + n)
                .max()
                .unwrap_or(n);
            // The decode as it will read the cache once the append is recorded: the other
            // length buffer, which the append writes.
            let after = CacheView {
                slot0: first_slot,
                seq_lens: &self.lens[1 - self.current],
                max_len: longest.next_power_of_two().min(self.capacity()),
                ..self.view()
            };
            fn decode_args<'a>(
                args: &ExtendArgs<'a>,
                n: u32,
                cache: CacheView<'a>,
            ) -> DecodeArgs<'a> {
                DecodeArgs {
                    q: args.q,
                    rows: QueryRows::Each(n),
                    cache,
                    o: args.o,
                    scale: args.scale,
                    mods: args.mods,
                    slice_len: None,
                }
            }
            decode.check(gpu, &decode_args(args, n, after))?;
            self.append(gpu, rec, first_slot, args.k_new, args.v_new)?;
            let view = CacheView {
                slot0: first_slot,
                max_len: longest.next_power_of_two().min(self.capacity()),
                ..self.view()
            };
            decode.record(gpu, rec, &decode_args(args, n, view))
        })
    }

    /// Appends a prompt's K and V to slots `first_slot..` (each open and empty) and
    /// records the forward over the prompt: the prompt's rows see only each other, as in
    /// `args` (causal or not, as `forward` was built).
    pub fn prefill(
        &mut self,
        gpu: &Gpu,
        encoder: &mut impl Record,
        forward: &mut Forward,
        first_slot: u32,
        args: &ForwardArgs,
    ) -> Result<(), Error> {
        encoder.recorder(|rec| {
            let batch = args.k.shape().first().copied().unwrap_or(0);
            let range = first_slot..first_slot.saturating_add(batch);
            self.check_slots(range.clone()).map_err(InputError::Cache)?;
            if let Some((slot, s)) = range
                .clone()
                .map(|slot| (slot, &self.slots[slot as usize]))
                .find(|(_, s)| s.open && s.len > 0)
            {
                return Err(InputError::Cache(CacheError::NotEmpty { slot, len: s.len }).into());
            }
            // The forward's own checks first, so that a refused prefill appends nothing.
            forward.check(gpu, args)?;
            self.append(gpu, rec, first_slot, args.k, args.v)?;
            forward.record(gpu, rec, args)
        })
    }
}
