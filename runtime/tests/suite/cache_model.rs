//! The device KV cache against a host model of it: random sequences of open, free, append
//! and extend (a run of one or two slots' new rows, and with extend their attention: a
//! prefill on an empty slot) and decode (a run of slots' last rows: one each, or a ragged
//! batch), valid and not, over a contiguous and a paged cache in f32, in half precision and in fp8
//! bytes (e4m3, e5m2). After every step the cache's own lengths, the lengths on the device
//! and every open slot's rows equal the model's, a refused step is an error that changes
//! neither nor its output, and an extend's or a decode's outputs equal attention computed
//! on the host from the model's rows.

use runtime::BlockOn;
use std::sync::LazyLock;

use attn_dsl::{Cache, Dtype, Fp8, Scalar};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use runtime::ops::cache::{CacheLayout, CacheSpec, ExtendArgs, KvCache};
use runtime::ops::decode::{CacheView, Decode, DecodeArgs, DecodeSpec, QueryRows};
use runtime::verify::random;
use runtime::{Gpu, Tensor, kernels};

static GPU: LazyLock<Gpu> = LazyLock::new(|| {
    Gpu::new(kernels::FAMILY.iter().copied())
        .block_on()
        .unwrap_or_else(|e| panic!("{e}"))
});

const SLOTS: u32 = 3;
const KV_HEADS: u32 = 1;
const HEADS: u32 = 2;
const D: u32 = 64;
const CAPACITY: u32 = 40;
/// The paged cache's pool holds fewer pages than its slots could take, so a step can run
/// out of pages.
const PAGED: CacheLayout = CacheLayout::Paged {
    page_size: 8,
    n_pages: 8,
    pages_per_seq: 5,
};

#[derive(Clone, Debug)]
enum Step {
    Open(u32),
    Free(u32),
    /// `rows` rows for each of slots `slot..slot + batch`.
    Append {
        slot: u32,
        batch: u32,
        rows: u32,
    },
    /// The same, with their attention over each slot's cache.
    Extend {
        slot: u32,
        batch: u32,
        rows: u32,
    },
    /// Query rows for each of slots `slot..slot + batch`, the last rows each holds: one
    /// each, or where `rows` asks for more and every slot holds a row, `rows[b]` (at most
    /// what slot b holds) in a ragged batch; `bad_slice` asks for a slice length of 0,
    /// which the op refuses.
    Decode {
        slot: u32,
        batch: u32,
        rows: [u32; 2],
        bad_slice: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    // Slot SLOTS is past the cache; rows reach past the capacity and past a chunk's 16.
    let slot = 0..=SLOTS;
    prop_oneof![
        1 => slot.clone().prop_map(Step::Open),
        1 => slot.clone().prop_map(Step::Free),
        3 => (slot.clone(), 1u32..=2, 0u32..=20)
            .prop_map(|(slot, batch, rows)| Step::Append { slot, batch, rows }),
        3 => (slot.clone(), 1u32..=2, 0u32..=20)
            .prop_map(|(slot, batch, rows)| Step::Extend { slot, batch, rows }),
        2 => (slot, 1u32..=2, decode_rows(), prop::bool::weighted(0.2)).prop_map(
            |(slot, batch, rows, bad_slice)| Step::Decode {
                slot,
                batch,
                rows,
                bad_slice
            }
        ),
    ]
}

/// A decode's rows per sequence: one each, or up to 18 (past a chunk's 16).
fn decode_rows() -> impl Strategy<Value = [u32; 2]> {
    prop_oneof![
        Just([1, 1]),
        (1u32..=18, 1u32..=18).prop_map(|(a, b)| [a, b])
    ]
}

/// Two slots opened and filled (slot 0 by a chunk of 16 or more rows, slot 1 by an
/// append), so that every case stores and attends rows; then `2..12` random steps.
fn steps() -> impl Strategy<Value = Vec<Step>> {
    let start = (16u32..=20, 1u32..=8).prop_map(|(chunk, rows)| {
        vec![
            Step::Open(0),
            Step::Open(1),
            Step::Extend {
                slot: 0,
                batch: 1,
                rows: chunk,
            },
            Step::Append {
                slot: 1,
                batch: 1,
                rows,
            },
        ]
    });
    (start, prop::collection::vec(step(), 2..12)).prop_map(|(start, rest)| [start, rest].concat())
}

/// The host model: each slot's K and V rows (`D` values per KV head, as the cache holds
/// them), `None` when free.
struct Model {
    slots: Vec<Option<(Vec<f32>, Vec<f32>)>>,
    layout: CacheLayout,
    fp8: Option<Fp8>,
}

impl Model {
    /// Rows as the cache stores them: an fp8 cache's bytes (its scales are 1).
    fn stored(&self, x: &[f32]) -> Vec<f32> {
        match self.fp8 {
            Some(f) => x.iter().map(|v| runtime::fp8::round(f, *v)).collect(),
            None => x.to_vec(),
        }
    }
}

impl Model {
    fn len(&self, slot: usize) -> Option<u32> {
        self.slots[slot]
            .as_ref()
            .map(|(k, _)| (k.len() / (KV_HEADS * D) as usize) as u32)
    }

    /// Whether `rows` more rows fit each of slots `slots`: each open and within its
    /// capacity, and (paged) the new pages they need together within the pool's free ones.
    fn fits(&self, slots: std::ops::Range<u32>, rows: u32) -> bool {
        let lens: Option<Vec<u32>> = slots
            .map(|s| {
                self.slots
                    .get(s as usize)
                    .and_then(|_| self.len(s as usize))
            })
            .collect();
        let Some(lens) = lens else {
            return false;
        };
        if lens.iter().any(|len| len + rows > CAPACITY) {
            return false;
        }
        let CacheLayout::Paged {
            page_size, n_pages, ..
        } = self.layout
        else {
            return true;
        };
        let held: u32 = (0..SLOTS as usize)
            .filter_map(|s| self.len(s))
            .map(|l| l.div_ceil(page_size))
            .sum();
        let new: u32 = lens
            .iter()
            .map(|len| (len + rows).div_ceil(page_size) - len.div_ceil(page_size))
            .sum();
        new <= n_pages - held
    }
}

fn cache_spec(layout: CacheLayout, dtype: Dtype, kv_fp8: Option<Fp8>) -> CacheSpec {
    CacheSpec {
        slots: SLOTS,
        n_kv_heads: KV_HEADS,
        head_dim: D,
        head_dim_v: D,
        dtype,
        layout,
        kv_fp8,
    }
}

/// `data` as the cache's dtype holds it.
fn rounded(data: &[f32], dtype: Dtype) -> Vec<f32> {
    let t = Tensor::from_f32(&GPU, &[data.len() as u32], Scalar::from(dtype), data).unwrap();
    t.to_f32(&GPU).block_on().unwrap()
}

/// Attention of `q` (`rows` rows of `HEADS` heads, the last rows of `k` and `v`), causal
/// among them, on the host.
fn attention(q: &[f32], k: &[f32], v: &[f32], rows: usize) -> Vec<f32> {
    let (d, len) = (D as usize, k.len() / D as usize);
    let scale = 1.0 / (D as f64).sqrt();
    let mut o = Vec::new();
    for r in 0..rows {
        let pos = len - rows + r;
        for h in 0..HEADS as usize {
            let qr = &q[(r * HEADS as usize + h) * d..][..d];
            let s: Vec<f64> = (0..=pos)
                .map(|j| {
                    let kr = &k[j * d..][..d];
                    scale
                        * qr.iter()
                            .zip(kr)
                            .map(|(a, b)| f64::from(a * b))
                            .sum::<f64>()
                })
                .collect();
            let m = s.iter().cloned().fold(f64::MIN, f64::max);
            let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let l: f64 = p.iter().sum();
            for c in 0..d {
                let acc: f64 = (0..=pos).map(|j| p[j] * f64::from(v[j * d + c])).sum();
                o.push((acc / l) as f32);
            }
        }
    }
    o
}

/// The model's decode of `rows[b]` query rows (`HEADS` heads each) for each slot
/// `slot + b`, the slot's last rows: attention over its rows, zeros where it holds none
/// (free or empty).
fn decoded(model: &Model, slot: u32, q: &[f32], rows: &[u32]) -> Vec<f32> {
    let per_row = (HEADS * D) as usize;
    let mut at = 0;
    let mut out = Vec::new();
    for (b, &n) in rows.iter().enumerate() {
        let qb = &q[at * per_row..][..n as usize * per_row];
        at += n as usize;
        out.extend(match &model.slots[slot as usize + b] {
            Some((k, v)) if !k.is_empty() => attention(qb, k, v, n as usize),
            _ => vec![0.0; qb.len()],
        });
    }
    out
}

/// Runs `steps` on a fresh cache, checking it against the model after each.
fn run(layout: CacheLayout, dtypes: (Dtype, Option<Fp8>), steps: &[Step], seed: u64) {
    let mut case = Case::new(layout, dtypes, seed);
    for (i, step) in steps.iter().enumerate() {
        let what = format!("{layout:?} {dtypes:?} step {i} {step:?}");
        let mut enc = GPU.device.create_command_encoder(&Default::default());
        case.step = i as u64;
        match *step {
            Step::Open(slot) => case.open(&mut enc, slot, &what),
            Step::Free(slot) => case.free(&mut enc, slot, &what),
            Step::Decode {
                slot,
                batch,
                rows,
                bad_slice,
            } => case.decode(&mut enc, (slot, batch), rows, bad_slice, &what),
            Step::Append { slot, batch, rows } => {
                case.add(&mut enc, (slot, batch), rows, false, &what)
            }
            Step::Extend { slot, batch, rows } => {
                case.add(&mut enc, (slot, batch), rows, true, &what)
            }
        }
        GPU.queue.submit([enc.finish()]);
        agree(&case.cache, &case.model, &what);
    }
}

/// One case's cache, its decode op and its model, stepped together.
struct Case {
    cache: KvCache,
    decode: Decode,
    model: Model,
    dtype: Dtype,
    seed: u64,
    /// The step being run: with the seed, what its random values are drawn from.
    step: u64,
}

impl Case {
    fn new(layout: CacheLayout, (dtype, fp8): (Dtype, Option<Fp8>), seed: u64) -> Case {
        let cache = match layout {
            CacheLayout::Paged { .. } => Cache::Paged,
            _ => Cache::Contiguous,
        };
        let decode_spec = DecodeSpec {
            cache,
            kv_fp8: fp8,
            ..DecodeSpec::new(D, D, dtype)
        };
        Case {
            cache: KvCache::new(&GPU, cache_spec(layout, dtype, fp8)).unwrap(),
            decode: Decode::new(&GPU, decode_spec).unwrap(),
            model: Model {
                slots: vec![None; SLOTS as usize],
                layout,
                fp8,
            },
            dtype,
            seed,
            step: 0,
        }
    }

    /// `rows` rows of `heads` heads of random values, as the dtype holds them.
    fn data(&self, rows: u32, heads: u32, salt: u64) -> Vec<f32> {
        let seed = self.seed * 1000 + self.step * 10 + salt;
        rounded(&random((rows * heads * D) as usize, seed), self.dtype)
    }

    /// `values` on the device, `shape` with `D` last, in the dtype.
    fn tensor(&self, values: &[f32], shape: &[u32]) -> Tensor {
        let shape = [shape, &[D]].concat();
        Tensor::from_f32(&GPU, &shape, Scalar::from(self.dtype), values).unwrap()
    }

    fn zeros(&self, shape: &[u32]) -> Tensor {
        Tensor::zeros(&GPU, &[shape, &[D]].concat(), Scalar::from(self.dtype)).unwrap()
    }

    fn open(&mut self, enc: &mut wgpu::CommandEncoder, slot: u32, what: &str) {
        let ok = slot < SLOTS && self.model.slots[slot as usize].is_none();
        assert_eq!(self.cache.open(enc, slot).is_ok(), ok, "{what}");
        if ok {
            self.model.slots[slot as usize] = Some((Vec::new(), Vec::new()));
        }
    }

    fn free(&mut self, enc: &mut wgpu::CommandEncoder, slot: u32, what: &str) {
        let ok = slot < SLOTS && self.model.slots[slot as usize].is_some();
        assert_eq!(self.cache.free(enc, slot).is_ok(), ok, "{what}");
        if ok {
            self.model.slots[slot as usize] = None;
        }
    }

    /// The rows each of slots `slot..slot + batch` brings to a decode: one each, or where
    /// `rows` asks for more and every slot holds a row, `rows[b]` of its last ones.
    fn decode_rows(&self, (slot, batch): (u32, u32), rows: [u32; 2]) -> Vec<u32> {
        let held: Option<Vec<u32>> = (slot..slot + batch)
            .map(|s| {
                self.model
                    .slots
                    .get(s as usize)
                    .and_then(|_| self.model.len(s as usize))
            })
            .map(|len| len.filter(|l| *l > 0))
            .collect();
        match held {
            Some(lens) if rows != [1, 1] => lens.iter().zip(rows).map(|(l, r)| r.min(*l)).collect(),
            _ => vec![1; batch as usize],
        }
    }

    fn decode(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        (slot, batch): (u32, u32),
        rows: [u32; 2],
        bad_slice: bool,
        what: &str,
    ) {
        let each = self.decode_rows((slot, batch), rows);
        let starts: Vec<u32> = std::iter::once(0)
            .chain(each.iter().scan(0, |end, r| {
                *end += r;
                Some(*end)
            }))
            .collect();
        let total = *starts.last().unwrap();
        let q = self.data(total, HEADS, 4);
        let (qt, o) = (
            self.tensor(&q, &[total, HEADS]),
            self.zeros(&[total, HEADS]),
        );
        let args = DecodeArgs {
            q: &qt,
            rows: match total == batch {
                true => QueryRows::Each(1),
                false => QueryRows::Ragged(&starts),
            },
            cache: CacheView {
                slot0: slot,
                ..self.cache.view()
            },
            o: &o,
            scale: None,
            mods: Default::default(),
            slice_len: bad_slice.then_some(0),
        };
        let ok = slot + batch <= SLOTS && !bad_slice;
        let r = self.decode.record(&GPU, enc, &args);
        assert_eq!(r.is_ok(), ok, "{what}: {r:?}");
        let want = match ok {
            true => decoded(&self.model, slot, &q, &each),
            false => vec![0.0; q.len()],
        };
        self.expect(enc, &o, &want, &format!("{what} ({each:?} rows)"));
    }

    /// An append (or with `extend` an extend) of `rows` rows to each of slots `slot..slot
    /// + batch`.
    fn add(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        (slot, batch): (u32, u32),
        rows: u32,
        extend: bool,
        what: &str,
    ) {
        let kv = [1, 2].map(|salt| self.data(batch * rows, KV_HEADS, salt));
        let [kt, vt] = kv
            .each_ref()
            .map(|x| self.tensor(x, &[batch, rows, KV_HEADS]));
        let ok = self.model.fits(slot..slot + batch, rows) && !(extend && rows == 0);
        // Sequence b's share of rows `x` of `heads` heads.
        let of = |x: &[f32], b: u32, heads: u32| {
            let per = (rows * heads * D) as usize;
            x[b as usize * per..][..per].to_vec()
        };
        if !extend {
            let r = self.cache.append(&GPU, enc, slot, &kt, &vt);
            assert_eq!(r.is_ok(), ok, "{what}: {r:?}");
        } else {
            let q = self.data(batch * rows, HEADS, 3);
            let shape = [batch, rows, HEADS];
            let (qt, o) = (self.tensor(&q, &shape), self.zeros(&shape));
            let args = ExtendArgs {
                k_new: &kt,
                v_new: &vt,
                q: &qt,
                o: &o,
                scale: None,
                mods: Default::default(),
            };
            let r = self.cache.extend(&GPU, enc, &mut self.decode, slot, &args);
            assert_eq!(r.is_ok(), ok, "{what}: {r:?}");
            if ok {
                let want: Vec<f32> = (0..batch)
                    .flat_map(|b| {
                        let (mk, mv) = self.model.slots[(slot + b) as usize].as_ref().unwrap();
                        let [k, v] = kv
                            .each_ref()
                            .map(|x| self.model.stored(&of(x, b, KV_HEADS)));
                        let (all_k, all_v) = ([&mk[..], &k].concat(), [&mv[..], &v].concat());
                        attention(&of(&q, b, HEADS), &all_k, &all_v, rows as usize)
                    })
                    .collect();
                self.expect(enc, &o, &want, what);
            }
        }
        if ok {
            for b in 0..batch {
                let [k, v] = kv
                    .each_ref()
                    .map(|x| self.model.stored(&of(x, b, KV_HEADS)));
                let (mk, mv) = self.model.slots[(slot + b) as usize].as_mut().unwrap();
                mk.extend(k);
                mv.extend(v);
            }
        }
    }

    /// Submits what `enc` holds and checks `o` against `want` (a fresh encoder after).
    fn expect(&self, enc: &mut wgpu::CommandEncoder, o: &Tensor, want: &[f32], what: &str) {
        let done = std::mem::replace(enc, GPU.device.create_command_encoder(&Default::default()));
        GPU.queue.submit([done.finish()]);
        let got = o.to_f32(&GPU).block_on().unwrap();
        let worst = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        let tolerance = match self.dtype {
            Dtype::F32 => 1e-4,
            _ => 2e-2,
        };
        assert!(worst < tolerance, "{what}: the outputs differ by {worst}");
    }
}

/// The cache's lengths (its own and the device's) and every open slot's rows equal the
/// model's.
fn agree(cache: &KvCache, model: &Model, what: &str) {
    let gpu = &*GPU;
    let on_device = cache.lengths().to_u32(gpu).block_on().unwrap();
    let view = cache.view();
    let values = |t: &Tensor| match model.fp8 {
        None => t.to_f32(gpu).block_on().unwrap(),
        // Four bytes to a word, element 4i + t in byte t.
        Some(f) => (t.to_u32(gpu).block_on().unwrap().iter())
            .flat_map(|w| w.to_le_bytes())
            .map(|b| runtime::fp8::to_f32(f, b))
            .collect(),
    };
    let (k, v) = (values(view.k), values(view.v));
    let table = view.block_table.map(|t| t.to_u32(gpu).block_on().unwrap());
    let row = (KV_HEADS * D) as usize;
    for slot in 0..SLOTS as usize {
        let len = model.len(slot);
        assert_eq!(cache.len(slot as u32), len, "{what}: slot {slot}'s length");
        assert_eq!(
            on_device[slot],
            len.unwrap_or(0),
            "{what}: slot {slot} on the device"
        );
        let Some((mk, mv)) = &model.slots[slot] else {
            continue;
        };
        for j in 0..len.unwrap() as usize {
            let at = match (&table, model.layout) {
                (
                    Some(t),
                    CacheLayout::Paged {
                        page_size,
                        pages_per_seq,
                        ..
                    },
                ) => {
                    let page = t[slot * pages_per_seq as usize + j / page_size as usize];
                    page as usize * page_size as usize + j % page_size as usize
                }
                _ => slot * CAPACITY as usize + j,
            };
            assert_eq!(
                &k[at * row..][..row],
                &mk[j * row..][..row],
                "{what}: K row {j}"
            );
            assert_eq!(
                &v[at * row..][..row],
                &mv[j * row..][..row],
                "{what}: V row {j}"
            );
        }
    }
}

/// A free slot decodes to zeros in either layout, also where a paged cache's block table
/// still names another slot's page for it.
#[test]
fn a_free_slot_decodes_to_zeros() {
    let steps = [
        Step::Open(0),
        Step::Extend {
            slot: 0,
            batch: 1,
            rows: 16,
        },
        Step::Decode {
            slot: 1,
            batch: 2,
            rows: [1, 1],
            bad_slice: false,
        },
    ];
    for layout in [CacheLayout::Contiguous { capacity: CAPACITY }, PAGED] {
        run(layout, (Dtype::F32, None), &steps, 0);
    }
}

fn config() -> Config {
    Config {
        cases: 64,
        rng_seed: RngSeed::Fixed(20261129),
        failure_persistence: None,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_contiguous_cache_follows_its_model(steps in steps(), seed in 0u64..1000) {
        run(CacheLayout::Contiguous { capacity: CAPACITY }, (Dtype::F32, None), &steps, seed);
    }

    #[test]
    fn a_paged_cache_follows_its_model(steps in steps(), seed in 0u64..1000) {
        run(PAGED, (Dtype::F32, None), &steps, seed);
    }

    #[test]
    fn a_half_precision_cache_follows_its_model(steps in steps(), seed in 0u64..1000, paged in prop::bool::ANY) {
        let Some(&dtype) = GPU.half_dtypes().first() else {
            panic!("the adapter has no half-precision dtype: this test needs SHADER_F16");
        };
        let layout = if paged { PAGED } else { CacheLayout::Contiguous { capacity: CAPACITY } };
        run(layout, (dtype, None), &steps, seed);
    }

    #[test]
    fn an_fp8_cache_follows_its_model(steps in steps(), seed in 0u64..1000, paged in prop::bool::ANY, e5m2 in prop::bool::ANY) {
        let fp8 = if e5m2 { Fp8::E5m2 } else { Fp8::E4m3 };
        let layout = if paged { PAGED } else { CacheLayout::Contiguous { capacity: CAPACITY } };
        let dtype = GPU.half_dtypes().first().copied().unwrap_or(Dtype::F32);
        run(layout, (dtype, Some(fp8)), &steps, seed);
    }
}
