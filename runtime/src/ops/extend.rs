//! A continued cache's chunk on the forward's schedule: `n` new rows per sequence, their K
//! and V already appended, attend to their sequence's whole cache in query tiles of the
//! flash forward ([`attn_dsl::Op::Extend`]), on tensor cores where the dtype has them.
//! The split-K decode serves a few rows per sequence (it reads the cache once for every
//! query slot of a KV head); a prompt's chunk or a conversation's next turn has enough
//! rows for whole query tiles, and then the tiles' products are the work, not the reads.
//!
//! One workgroup walking the whole cache for its tile would leave a short chunk's GPU
//! mostly idle, so the keys are cut into slices as the split-K decode's are: each slice's
//! workgroups flush their rows' partial softmaxes in the split pass's record layout, and
//! the decode's reduce pass merges them (joining the sinks once).
//!
//! [`super::decode::Decode`] takes this path by itself for calls of at least
//! [`CHUNK_ROWS`] rows per sequence over a cache in its dtype (an fp8 cache keeps the
//! split-K decode, which widens its bytes).

use attn_dsl::{Cache, FlashConfig, KernelAbi, Op};

use super::{grid, grow};
use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::dispatch::record::{Dispatch, Pipeline};
use crate::dispatch::recorder::Recorder;
use crate::error::{Error, InputError};
use crate::modifiers::DeviceModifiers;
use crate::plan::calibration::{CHUNK_PER_SM, Calibration};
use crate::plan::decode::{Slicing, plan_slices};
use crate::plan::kernels::{self, AttentionSpec, ChunkForm};
use crate::plan::tuning::{self, Table};
use crate::shape::Heads;
use crate::tensor::Tensor;

/// The fewest new rows per sequence that run as a chunk where its tiles cannot pack a KV
/// head's query heads (scalar tiles, bf16). A chunk's query tile holds 64 rows, so its
/// time is flat up to 64 rows, while the split-K decode's grows with them (its workgroups
/// re-read the slice for every four queries). Measured on an H200 (2026-11-29, `bench
/// --decode 32768 --heads 32 --kv-heads 8 --head-dim 128`, f16): the chunk (in slices)
/// at 64 rows 0.527 ms, the split-K decode at 4 rows 0.245, at 16 rows 0.810, at 32 rows
/// 1.564; so they cross between 4 and 16 rows.
pub const CHUNK_ROWS: u32 = 16;

/// The fewest packed rows (new rows per sequence × query heads per KV head) that run as a
/// chunk whose tiles pack the query heads ([`attn_dsl::Grid::pack_heads`]): its time is
/// the cache's pass, flat from one row to a tile, while the split-K decode's grows with
/// the query slots a KV head serves, the same count. Measured on an H200 (2026-11-29, the
/// command above, f16, packed 64-row tiles, 4 query heads per KV head): 0.168 / 0.173 /
/// 0.176 / 0.189 ms at 1 / 4 / 8 / 16 rows, the split-K decode 0.083 / 0.206 / 0.381 /
/// 0.726; with 8 per KV head, 0.177 ms at 4 rows against 0.382.
pub const PACKED_CHUNK_ROWS: u32 = 16;

/// What a chunk kernel is built for: the decode's widths, masks and modifiers, dtype (of
/// Q, O and, without `kv_fp8`, the cache) and cache layout.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ChunkSpec {
    pub attention: AttentionSpec,
    pub cache: Cache,
    /// The cache's 8-bit format: its words are widened into the tiles, on tensor cores only.
    pub kv_fp8: Option<attn_dsl::Fp8>,
}

/// One chunk's tensors: Q and O of `n` rows per sequence, the cache as the decode reads it
/// (after the new rows' append).
pub(crate) struct ChunkArgs<'a> {
    pub q: &'a Tensor,
    pub o: &'a Tensor,
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    pub seq_lens: &'a Tensor,
    pub block_table: Option<&'a Tensor>,
    pub slot0: u32,
    pub scale: Option<f32>,
    pub mods: DeviceModifiers<'a>,
    /// Where the unsliced kernel writes each row's LSE (else the op's own scratch).
    pub lse: Option<&'a Tensor>,
    /// An fp8 cache's scales ([`super::decode::CacheView::scales`]).
    pub scales: Option<&'a Tensor>,
    /// A ragged batch's row starts (`batch + 1`, each sequence at most `n` rows).
    pub q_starts: Option<&'a Tensor>,
}

/// Whether `spec`'s chunk kernels, in their portable configuration (an fp8 cache's: the
/// planned one, on tensor cores), compile and run on `gpu` (a description the forward's
/// tiles cannot hold keeps the split-K decode).
fn usable(gpu: &Gpu, spec: &ChunkSpec) -> bool {
    let width = spec.attention.width();
    let config = match spec.kv_fp8 {
        Some(_) => Table::for_gpu(gpu)
            .ok()
            .and_then(|t| t.extend(gpu, width, spec.attention.dtype)),
        None => tuning::forward_candidates(width).first().copied(),
    };
    config.is_some_and(|c| {
        [false, true].into_iter().all(|sliced| {
            let form = ChunkForm {
                sliced,
                ..ChunkForm::default()
            };
            compile(spec, c, form).is_ok_and(|abi| gpu.require(&abi).is_ok())
        })
    })
}

/// The chunk kernels of one decode spec (writing O, and writing key slices' partials;
/// each with and without packed heads), compiled on first use, the LSE the first writes
/// (a forward's by-product the decode does not return) and the partials of the second.
#[derive(Default)]
pub(crate) struct Chunks {
    /// Whether the kernels run on the device, decided at the first call of many rows.
    runs: Option<bool>,
    /// The planned configuration.
    planned: Option<FlashConfig>,
    /// On tensor cores, every candidate configuration with the workgroups of it an SM
    /// holds at once ([`chunk_config`] picks among them).
    resident: Vec<(FlashConfig, u32)>,
    /// Whether the tiles can pack a KV head's query heads, decided with the configuration.
    packs: bool,
    /// By configuration and form.
    pipelines: Vec<((FlashConfig, ChunkForm), Pipeline)>,
    lse: Option<Tensor>,
    partials: Option<Tensor>,
}

/// The rows of one chunk call and how its keys are cut: `batch` sequences of `n` rows,
/// the slicing asked for (`None`: by the rule, against the workgroups `calibration` scales
/// to this adapter).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChunkShape {
    pub batch: u32,
    pub n: u32,
    pub heads: Heads,
    pub slice_len: Option<u32>,
    pub calibration: Calibration,
    /// Each row sees the whole cache ([`ChunkForm::shared`]).
    pub shared: bool,
    /// Each sequence brings its own count of rows, at most `n` ([`ChunkForm::ragged`]).
    pub ragged: bool,
}

impl ChunkShape {
    /// The rows one tile's owner holds and the owners per sequence: a head's n rows, or
    /// with `packed` heads a KV head's n · group.
    fn owners(&self, packed: bool) -> (u32, u32) {
        let h = self.heads;
        match packed {
            true => (self.n * (h.n_heads / h.n_kv_heads.max(1)), h.n_kv_heads),
            false => (self.n, h.n_heads),
        }
    }
}

impl Chunks {
    /// Whether calls of many rows run as chunks on `gpu` (decided once, at the first).
    fn usable(&mut self, gpu: &Gpu, spec: &ChunkSpec) -> bool {
        *self.runs.get_or_insert_with(|| usable(gpu, spec))
    }

    /// Whether chunks run on `gpu` at all (a cascade's shared rows have no other path).
    pub fn serve(&mut self, gpu: &Gpu, spec: &ChunkSpec) -> bool {
        self.usable(gpu, spec) && self.planned(gpu, spec).is_ok()
    }

    /// Whether a call of `n` rows per sequence of `heads` runs as a chunk on `gpu`: from
    /// [`PACKED_CHUNK_ROWS`] packed rows where the tiles pack the query heads, else from
    /// [`CHUNK_ROWS`] rows.
    pub fn takes(&mut self, gpu: &Gpu, spec: &ChunkSpec, (n, heads): (u32, Heads)) -> bool {
        let group = heads.n_heads / heads.n_kv_heads.max(1);
        if n.saturating_mul(group) < PACKED_CHUNK_ROWS || !self.usable(gpu, spec) {
            return false;
        }
        match self.planned(gpu, spec).is_ok() && self.packs {
            true => n * group >= PACKED_CHUNK_ROWS,
            false => n >= CHUNK_ROWS,
        }
    }

    /// How a call of `shape` is laid out: heads packed where a head's rows fill less than
    /// a tile (past that, packing only adds each row's division: 3% slower at 128 and 512
    /// rows on an H200, 2026-11-29), and where the tiles can pack (the f16 chunks `check`
    /// runs on tensor cores) in the configuration [`chunk_config`] picks for a KV head's
    /// packed rows.
    fn plan(
        &mut self,
        gpu: &Gpu,
        spec: &ChunkSpec,
        (shape, sliced): (&ChunkShape, bool),
    ) -> Result<(ChunkTile, ChunkForm), Error> {
        let planned = self.planned(gpu, spec)?;
        let rows = shape.owners(self.packs).0;
        let tile = match self.packs {
            true => chunk_config(planned, &self.resident, rows),
            false => ChunkTile::planned(planned),
        };
        let packed = self.packs && shape.n < tile.config.tile;
        Ok((
            tile,
            ChunkForm {
                sliced,
                packed,
                shared: shape.shared,
                ragged: shape.ragged,
            },
        ))
    }

    /// The planned configuration for `spec` on `gpu` and, on tensor cores, every
    /// candidate's residency, decided once.
    fn planned(&mut self, gpu: &Gpu, spec: &ChunkSpec) -> Result<FlashConfig, Error> {
        if let Some(c) = self.planned {
            return Ok(c);
        }
        let width = spec.attention.width();
        let config = Table::for_gpu(gpu)?
            .extend(gpu, width, spec.attention.dtype)
            .ok_or(InputError::Unsupported {
                what: "a continued cache's chunk at this head_dim",
                needs: "a head_dim that is a multiple of 4, from 4 to 256",
            })?;
        // Packing needs tensor cores in f16 and a mask_mod that does not read the head.
        let packed = ChunkForm {
            sliced: true,
            packed: true,
            ..ChunkForm::default()
        };
        self.packs = compile(spec, config, packed).is_ok();
        let dtype = spec.attention.dtype;
        let candidates = match config.matrix {
            attn_dsl::Matrix::Coop16 => tuning::coop_candidates(gpu, width, dtype),
            attn_dsl::Matrix::Scalar => Vec::new(),
        };
        self.resident = candidates
            .into_iter()
            .map(|c| (c, tuning::resident(gpu, Op::Extend, width, c, dtype)))
            .collect();
        self.planned = Some(config);
        Ok(config)
    }

    /// The kernel of a call of `shape` writing O (or, `sliced`, partials), compiled now if
    /// it was not yet.
    fn pipeline(
        &mut self,
        gpu: &Gpu,
        spec: &ChunkSpec,
        (shape, sliced): (&ChunkShape, bool),
    ) -> Result<&mut Pipeline, Error> {
        let (tile, form) = self.plan(gpu, spec, (shape, sliced))?;
        let config = tile.config;
        let key = (config, form);
        let at = match self.pipelines.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                let abi = compile(spec, config, form)?;
                let pipeline = Pipeline::new(Kernel::now(gpu, &abi)?);
                self.pipelines.push((key, pipeline));
                self.pipelines.len() - 1
            }
        };
        Ok(&mut self.pipelines[at].1)
    }

    /// How a call of `shape` over a cache of `max_len` rows cuts its keys: by the decode's
    /// slicing rule (enough slices that the query tiles of every head and sequence reach
    /// the target workgroups, each a whole number of [`SLICE_BLOCK`] keys, at most
    /// [`MAX_SLICE`]), or as asked.
    fn slicing(
        &mut self,
        gpu: &Gpu,
        spec: &ChunkSpec,
        shape: ChunkShape,
        max_len: u32,
    ) -> Result<Slicing, Error> {
        if let Some(slice_len) = shape.slice_len {
            if slice_len == 0 {
                let (key_tile, max) = (1, max_len);
                return Err(InputError::SliceLen {
                    slice_len,
                    key_tile,
                    max,
                }
                .into());
            }
            let n_slices = max_len.div_ceil(slice_len).max(1);
            return Ok(Slicing {
                slice_len,
                n_slices,
            });
        }
        let (tile, form) = self.plan(gpu, spec, (&shape, true))?;
        let (rows, owners) = shape.owners(form.packed);
        let tiles = rows.div_ceil(tile.config.tile) * owners * shape.batch;
        let target = shape.calibration.chunk_workgroups(tile.per_sm);
        let rule = plan_slices(max_len, tiles, SLICE_BLOCK, MAX_SLICE, target);
        let slice_len = rule
            .slice_len
            .max(min_slice(&shape, spec.attention.dtype.bytes()));
        Ok(Slicing {
            slice_len,
            n_slices: max_len.div_ceil(slice_len).max(1),
        })
    }

    /// Plans a call of `shape` over `max_len` keys and compiles the kernel it runs,
    /// recording nothing.
    pub fn prepare(
        &mut self,
        gpu: &Gpu,
        spec: &ChunkSpec,
        (shape, max_len): (ChunkShape, u32),
    ) -> Result<(), Error> {
        let slicing = self.slicing(gpu, spec, shape, max_len)?;
        self.pipeline(gpu, spec, (&shape, slicing.n_slices > 1))
            .map(|_| ())
    }

    /// Records the chunk of a call the decode has checked. Returns its slicing, and with
    /// more than one slice the partials the decode's reduce must merge into O.
    pub fn record(
        &mut self,
        gpu: &Gpu,
        spec: &ChunkSpec,
        rec: &mut Recorder,
        args: &ChunkArgs,
        (shape, max_len): (ChunkShape, u32),
    ) -> Result<(Slicing, Option<Tensor>), Error> {
        let (batch, n, h) = (shape.batch, shape.n, shape.heads);
        let slicing = self.slicing(gpu, spec, shape, max_len)?;
        let sliced = slicing.n_slices > 1;
        let lse = grow(
            gpu,
            &mut self.lse,
            &[batch, n, h.n_heads],
            attn_dsl::Scalar::F32,
        )?;
        let partials = match sliced {
            true => {
                let records = [batch, slicing.n_slices, n * h.n_heads, h.head_dim_v + 4];
                let f32 = attn_dsl::Scalar::F32;
                Some(grow(gpu, &mut self.partials, &records, f32)?)
            }
            false => None,
        };
        let mut tensors = vec![("q", args.q), ("k", args.k), ("v", args.v)];
        match &partials {
            Some(p) => tensors.push(("partials", p)),
            None => tensors.extend([("o", args.o), ("lse", args.lse.unwrap_or(&lse))]),
        }
        tensors.push(("seq_lens", args.seq_lens));
        tensors.extend(args.q_starts.map(|t| ("q_starts", t)));
        tensors.extend(args.block_table.map(|t| ("block_table", t)));
        tensors.extend(args.scales.map(|t| ("kv_scales", t)));
        // The reduce joins the sinks of a sliced chunk.
        let mods = args.mods.tensors();
        tensors.extend(mods.filter(|(name, _)| !sliced || *name != "sinks"));
        let mut d = Dispatch::new(tensors);
        d.dims = dims(args, (batch, n), h, slicing);
        d.params = vec![("scale", args.scale.unwrap_or(h.default_scale()))];
        d.params.extend(args.mods.params());
        let pipeline = self.pipeline(gpu, spec, (&shape, sliced))?;
        let g = grid(pipeline.abi(), &d.dims);
        pipeline.record(gpu, rec, &d, g)?;
        Ok((slicing, partials))
    }
}

/// The chunk kernel's dims for a call.
fn dims(
    args: &ChunkArgs,
    (batch, n): (u32, u32),
    h: Heads,
    slicing: Slicing,
) -> Vec<(&'static str, u32)> {
    let (capacity, page_size, pages_per_seq) = super::cache_geometry(args.k, args.block_table);
    let mut dims = vec![
        ("seq_len", n),
        ("n_heads", h.n_heads),
        ("n_kv_heads", h.n_kv_heads),
        ("head_dim", h.head_dim),
        ("batch", batch),
        ("capacity", capacity),
        ("page_size", page_size),
        ("pages_per_seq", pages_per_seq),
        ("slot0", args.slot0),
        ("n_slices", slicing.n_slices),
        ("slice_len", slicing.slice_len),
    ];
    dims.extend(args.mods.dims());
    dims
}

/// The chunk's configuration for a KV head's `rows` packed rows, and the workgroups per SM
/// its slices aim for, among the tensor-core candidates with the workgroups of each an SM
/// holds at once ([`tuning::resident`]).
///
/// - Rows that fill at most half the planned tile leave one or two workgroups per SM
///   (head_dim 128, 64) walking their slices block by block, each block a chain of
///   barriers with nothing else to run. They take the candidate of more than one
///   subgroup that keeps the most products in flight per SM (resident × the rows a tile
///   holds × the keys of its block: a block of twice the keys took 1.4x as long, so per
///   key its chain is the shorter), then the one cutting them into the fewest tiles (each
///   reads the slice), then the one of fewer invocations; and their slices make one wave
///   of the pick's residency. (A workgroup of one subgroup stages, multiplies and
///   exponentiates in turn.)
/// - Rows past the planned tile take its twin of twice the rows where an SM holds as many
///   of it (the forward's rule), sliced for [`CHUNK_PER_SM`].
///
/// On an H200 (2026-12-03, `bench --decode 32768 --heads 32 --kv-heads 8 --head-dim D
/// --continued`, f16, each configuration forced and sliced for one wave of its residency,
/// one device command), at 4 / 8 new rows, d128:
/// 32x16/16@64 (four an SM) 0.113 / 0.120 ms, 32x32/16@64 with V over K (three) 0.103 /
/// 0.108, 32x32/16@128 with V over K 0.139 / 0.146 (its registers hold fewer than three:
/// in the grid of two an SM it took 0.111), without (two) 0.107 / 0.110; d64: 32x16/16@64
/// (six) 0.078 / 0.080, 32x32/16@64 with V over K (four) 0.068 / 0.071, 32x32/16@128 with
/// V over K 0.067 / 0.069, without (three) 0.081 / 0.082. Measured before V over K and
/// the wave of the pick's residency:
///
/// On an H200 (2026-12-03, `bench --decode 32768 --heads H --kv-heads 8 --head-dim D
/// --continued`, f16, each configuration forced in turn, two device commands), at 4 new
/// rows of 32/8 heads (16 packed rows), d128: 32x16/16@64 (four an SM) 0.115 ms,
/// 64x16/16@128 0.146, 16x16/16@32 (four of one subgroup) 0.160, the planned 64x32/16@256
/// (one) 0.152; at 32 packed rows 32x16/16@64 0.121 against 0.157 (8 rows of 32/8) and
/// 0.121 against 0.156 (4 rows of 64/8); at 64 (16 rows of 32/8) 64x16/16@128 0.165, the
/// planned 0.171. At d64: 0.082 / 0.094 / 0.092 ms at 16 packed rows (32x16/16@64,
/// 16x16/16@32, planned), 0.086 against 0.093 at 32, and at 64 the planned 0.099 against
/// 0.128 in 64x16/16@128 and 0.121 in two tiles of 32x16/16@64. The twin at d64
/// (128x32/16@256, one an SM against the planned tile's two) took 0.206 ms at 32 rows of
/// 32/8 (128 packed) and 0.332 at 64 rows, the planned tile 0.145 and 0.219; at d128,
/// where both hold one, 128-row tiles took 0.268 against 0.310 at 32 rows and 2.438
/// against 3.124 at 512 (2026-11-29).
fn chunk_config(planned: FlashConfig, resident: &[(FlashConfig, u32)], rows: u32) -> ChunkTile {
    let count = |c: &FlashConfig| resident.iter().find(|(r, _)| r == c).map_or(0, |r| r.1);
    if rows <= planned.tile / 2 {
        let few = resident
            .iter()
            // Reversed: of candidates alike in every key, the menu's first.
            .rev()
            .filter(|(c, n)| c.workgroup_size > attn_dsl::layout::coop::SUBGROUP && *n > 0)
            .max_by_key(|(c, n)| {
                let tiles = rows.div_ceil(c.tile.max(1));
                (
                    n * c.tile.min(rows) * c.inner,
                    std::cmp::Reverse(tiles),
                    std::cmp::Reverse(c.workgroup_size),
                )
            });
        return few.map_or(ChunkTile::planned(planned), |&(config, per_sm)| ChunkTile {
            config,
            per_sm,
        });
    }
    let wide = resident
        .iter()
        .map(|(c, _)| *c)
        .find(|c| c.tile == 2 * planned.tile && c.inner == planned.inner);
    match wide {
        Some(w) if rows > planned.tile && count(&w) >= count(&planned) => ChunkTile::planned(w),
        _ => ChunkTile::planned(planned),
    }
}

/// A chunk's configuration and the workgroups per SM its slicing aims for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ChunkTile {
    config: FlashConfig,
    per_sm: u32,
}

impl ChunkTile {
    /// `config` sliced for [`CHUNK_PER_SM`].
    fn planned(config: FlashConfig) -> ChunkTile {
        ChunkTile {
            config,
            per_sm: CHUNK_PER_SM,
        }
    }
}

/// A slice's keys are a whole number of these (a multiple of every configuration's key
/// block), so that only the cache's last block is ragged.
const SLICE_BLOCK: u32 = 64;

/// The fewest keys a chunk's slice holds where its rows are many: enough that a slice's
/// partials (each row's unnormalized O and (m, l) in f32, written and read back by the
/// reduce) take no more bytes than the keys it reads, a whole number of [`SLICE_BLOCK`]s,
/// at most [`MAX_SLICE`]. A cascade's 64 sequences of 32 heads over a 4096-row prefix
/// had taken the rule's 32 slices of 128 keys: 35 MB of partials for a prefix of 16 MB;
/// with 320-key slices its pass went from 0.132 to 0.109 ms on an H200 (2026-11-29,
/// `bench --decode 4096 --cascade`, docs/decode.md).
fn min_slice(shape: &ChunkShape, elem_bytes: u32) -> u32 {
    let h = shape.heads;
    let records = u64::from(shape.n) * u64::from(h.n_heads) * u64::from(h.head_dim_v + 4) * 4;
    let keys =
        u64::from(h.n_kv_heads) * u64::from(h.head_dim + h.head_dim_v) * u64::from(elem_bytes);
    let len = records
        .div_ceil(keys.max(1))
        .div_ceil(u64::from(SLICE_BLOCK))
        * u64::from(SLICE_BLOCK);
    len.min(u64::from(MAX_SLICE)) as u32
}

/// The most keys a chunk's slice holds, past what the workgroup target asks: one
/// workgroup walking a long slice waits on each block's loads with nothing else to run.
/// Measured on an H200 (2026-11-29, `bench --decode 32768 --heads 32 --kv-heads 8
/// --head-dim 128`, f16, slices asked, one slice to 64): 64 rows 1.943 ms in one slice,
/// 0.523-0.544 in 4 to 32 slices, 0.587 in 64; 512 rows 3.620 in one, 3.701 in 4 (what the
/// target alone asks: 3), 3.264 in 8, 3.229 in 16 (2048 keys), 3.320 in 32, 3.587 in 64.
const MAX_SLICE: u32 = 2048;

/// The chunk kernel of `spec` under `config` in `form`.
fn compile(spec: &ChunkSpec, config: FlashConfig, form: ChunkForm) -> Result<KernelAbi, Error> {
    let cache = (spec.cache, spec.kv_fp8);
    kernels::extend(spec.attention, (cache, form), config).map_err(|e| Error::Pipeline {
        kernel: format!("extend d{} {}", spec.attention.head_dim, config.label()),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(n: u32) -> ChunkShape {
        ChunkShape {
            batch: 1,
            n,
            heads: Heads {
                n_heads: 32,
                n_kv_heads: 8,
                head_dim: 128,
                head_dim_v: 128,
            },
            slice_len: None,
            calibration: Calibration::default(),
            shared: true,
            ragged: false,
        }
    }

    /// A slice's partials never outweigh its keys: 64 rows of 32 heads write 132 f32 a
    /// row and head (1.08 MB) per slice, which 264 f16 keys of 8 KV heads outweigh (320
    /// as whole blocks); a few rows keep the rule's shortest slice, many the longest.
    #[test]
    fn a_slice_holds_at_least_the_keys_its_partials_weigh() {
        assert_eq!(min_slice(&shape(64), 2), 320);
        assert_eq!(min_slice(&shape(4), 2), SLICE_BLOCK);
        assert_eq!(min_slice(&shape(512), 2), MAX_SLICE);
        assert_eq!(min_slice(&shape(64), 4), 192);
    }

    /// The picks the H200 measured best under NVIDIA's 48 KiB, f16: for 16 and 32 packed
    /// rows a 32-row tile of 32-key blocks with V over K, sliced for the three an SM hold
    /// at d128 and the four at d64; at d128 the planned 64-row tile at 64 and its 128-row
    /// twin past it (both one an SM); at d64 the planned tile past 32 rows (two an SM, its
    /// twin one).
    #[test]
    fn chunk_tiles_follow_rows_and_residency() {
        let limit = 48 * 1024;
        let f16 = attn_dsl::Dtype::F16;
        for (d, picks) in [
            (
                128,
                [
                    ("32x32/16@64+tc", 3),
                    ("32x32/16@64+tc", 3),
                    ("64x32/16@256+tc", CHUNK_PER_SM),
                    ("128x32/16@256+tc", CHUNK_PER_SM),
                ],
            ),
            (
                64,
                [
                    ("32x32/16@64+tc", 4),
                    ("32x32/16@64+tc", 4),
                    ("64x32/16@256+tc", CHUNK_PER_SM),
                    ("64x32/16@256+tc", CHUNK_PER_SM),
                ],
            ),
        ] {
            let candidates = attn_dsl::configs::coop_forward_in(d, limit, f16);
            let planned = candidates[0];
            let resident: Vec<(FlashConfig, u32)> = candidates
                .into_iter()
                .map(|c| {
                    (
                        c,
                        limit / attn_dsl::configs::coop_bytes(Op::Extend, d, c, f16),
                    )
                })
                .collect();
            for (rows, (want, per_sm)) in [16, 32, 64, 128].into_iter().zip(picks) {
                let got = chunk_config(planned, &resident, rows);
                assert_eq!(
                    (got.config.label().as_str(), got.per_sm),
                    (want, per_sm),
                    "d{d}, {rows} rows"
                );
            }
            assert_eq!(chunk_config(planned, &[], 16), ChunkTile::planned(planned));
        }
    }
}
