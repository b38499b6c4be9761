//! Cascade decode for `check` and the tests: sequences sharing a prefix, each with its own
//! suffix (its query's row last), decoded by [`Cascade`] and judged, sequence by sequence, as
//! a decode over the prefix's rows followed by the suffix's.

use attn_dsl::{Cache, Dtype, Fp8, Scalar};
use pollster::FutureExt as BlockOn;

use crate::device::Gpu;
use crate::error::Error;
use crate::harness::cases::page_cache;
use crate::modifiers::Modifiers;
use crate::ops::cascade::{Cascade, CascadeArgs};
use crate::ops::decode::{CacheView, DecodeSpec};
use crate::shape::Heads;
use crate::tensor::Tensor;
use crate::tensor::buffers::{round_to, rounded};
use crate::verify::compare::{Verdict, judge};
use crate::verify::random;
use crate::verify::reference::{self, Attention, Problem};

/// What to cascade: `batch` queries over a prefix of `prefix` rows, sequence b's suffix of
/// `suffixes[b]` rows after it.
pub struct CascadeCase<'a> {
    pub heads: Heads,
    pub dtype: Dtype,
    pub cache: Cache,
    /// K and V in this fp8 format (K's scales per KV head, V's one for the tensor, from
    /// their largest magnitudes), Q and O in `dtype`.
    pub fp8: Option<Fp8>,
    pub prefix: u32,
    pub suffixes: &'a [u32],
    /// The soft cap and sinks (the modifiers a cascade takes).
    pub mods: Modifiers<'a>,
}

/// The case's verdicts for O and LSE, on inputs drawn from `seed`.
pub fn run(
    gpu: &Gpu,
    case: &CascadeCase,
    seed: u64,
) -> Result<Vec<(&'static str, Verdict)>, Error> {
    let h = case.heads;
    let batch = case.suffixes.len() as u32;
    let scalar = Scalar::from(case.dtype);
    let draw = |n: u32, width: u32, heads: u32, s: u64| {
        rounded(&random((n * heads * width) as usize, s), scalar)
    };
    let q = draw(batch, h.head_dim, h.n_heads, seed);
    let cap = case.suffixes.iter().copied().max().unwrap_or(0).max(1);
    let kv = |rows: u32, s: u64| {
        [
            draw(rows, h.head_dim, h.n_kv_heads, s),
            draw(rows, h.head_dim_v, h.n_kv_heads, s + 1),
        ]
    };
    let [pk, pv] = kv(case.prefix, seed + 1);
    let [sk, sv] = kv(batch * cap, seed + 3);
    let scales = case.fp8.map(|f| Scales::of(f, h, [&pk, &sk], [&pv, &sv]));
    let held = |x: &[f32], width: u32, s: &dyn Fn(&Scales) -> &[f32]| match &scales {
        Some(sc) => sc.held(x, width, s(sc)),
        None => x.to_vec(),
    };
    let (dk, dv) = (h.head_dim, h.head_dim_v);
    let [pk, sk] = [&pk, &sk].map(|x| held(x, dk, &|s| &s.k));
    let [pv, sv] = [&pv, &sv].map(|x| held(x, dv, &|s| &s.v));
    let parts = ([&pk[..], &pv[..]], [&sk[..], &sv[..]]);
    let (o, lse) = cascade(gpu, case, &q, parts, (cap, scales.as_ref()))?;
    let (r64, r32) = references(case, &q, parts, cap);
    Ok(vec![
        ("o", judge(&o, &r64.o, &r32.o)),
        ("lse", judge(&lse, &r64.lse, &r32.lse)),
    ])
}

/// An fp8 cache's scales: K's per KV head, V's one for the tensor.
struct Scales {
    fp8: Fp8,
    n_kv_heads: u32,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Scales {
    /// From the largest magnitudes of K's and V's parts.
    fn of(fp8: Fp8, h: Heads, k: [&[f32]; 2], v: [&[f32]; 2]) -> Scales {
        let amax = v.concat().iter().fold(0.0f32, |m, x| m.max(x.abs()));
        Scales {
            fp8,
            n_kv_heads: h.n_kv_heads,
            k: crate::harness::kv_fp8::amax_scales(&k.concat(), h, fp8),
            v: vec![if amax > 0.0 { amax / fp8.max() } else { 1.0 }],
        }
    }

    /// The scale of element `i` of rows `width` wide per KV head.
    fn of_element(&self, scales: &[f32], width: u32, i: usize) -> f32 {
        let head = (i / width as usize) % self.n_kv_heads as usize;
        scales[head % scales.len()]
    }

    /// `x` (rows `width` wide per KV head) as the cache holds it: each value over its
    /// head's scale rounded to the format, times the scale.
    fn held(&self, x: &[f32], width: u32, scales: &[f32]) -> Vec<f32> {
        let scale = |i| self.of_element(scales, width, i);
        let f = self.fp8;
        x.iter()
            .enumerate()
            .map(|(i, v)| crate::fp8::round(f, v / scale(i)) * scale(i))
            .collect()
    }

    /// The values the cache's bytes store: `held`'s over their scales, exact in the format.
    fn stored(&self, x: &[f32], width: u32, scales: &[f32]) -> Vec<f32> {
        let scale = |i| self.of_element(scales, width, i);
        x.iter().enumerate().map(|(i, v)| v / scale(i)).collect()
    }

    /// The scales as the kernels bind them: K's, then V's, per KV head.
    fn tensor(&self, gpu: &Gpu) -> Result<Tensor, Error> {
        let n = self.n_kv_heads as usize;
        let per_head = |s: &[f32]| (0..n).map(|i| s[i % s.len()]).collect::<Vec<_>>();
        let all = [per_head(&self.k), per_head(&self.v)].concat();
        Tensor::from_f32(gpu, &[2, self.n_kv_heads], Scalar::F32, &all)
    }
}

/// The device's O and LSE for the case (over an fp8 cache, `prefix` and `suffix` as the
/// cache holds them).
fn cascade(
    gpu: &Gpu,
    case: &CascadeCase,
    q: &[f32],
    (prefix, suffix): ([&[f32]; 2], [&[f32]; 2]),
    (cap, scales): (u32, Option<&Scales>),
) -> Result<(Vec<f32>, Vec<f32>), Error> {
    let h = case.heads;
    let batch = case.suffixes.len() as u32;
    let scalar = Scalar::from(case.dtype);
    let spec = DecodeSpec {
        masks: case.mods.masks(false, false),
        cache: case.cache,
        kv_fp8: case.fp8,
        ..DecodeSpec::new(h.head_dim, h.head_dim_v, case.dtype)
    };
    let mut op = Cascade::new(gpu, spec)?;
    let (dk, dv) = (h.head_dim, h.head_dim_v);
    let stored = |[k, v]: [&[f32]; 2]| match scales {
        Some(s) => [s.stored(k, dk, &s.k), s.stored(v, dv, &s.v)],
        None => [k.to_vec(), v.to_vec()],
    };
    let [pk, pv] = stored(prefix);
    let [sk, sv] = stored(suffix);
    let scales = scales.map(|s| s.tensor(gpu)).transpose()?;
    let mut prefix_cache = Caches::new(gpu, case, (1, case.prefix), [&pk, &pv], &[case.prefix])?;
    let mut suffix_cache = Caches::new(gpu, case, (batch, cap), [&sk, &sv], case.suffixes)?;
    prefix_cache.scales = scales.clone();
    suffix_cache.scales = scales;
    let qt = Tensor::from_f32(gpu, &[batch, h.n_heads, h.head_dim], scalar, q)?;
    let o = Tensor::zeros(gpu, &[batch, h.n_heads, h.head_dim_v], scalar)?;
    let lse = Tensor::zeros(gpu, &[batch, h.n_heads], Scalar::F32)?;
    let uploaded = case.mods.upload(gpu, batch, (1, cap))?;
    let mods = uploaded.view(&case.mods, &[]);
    let args = CascadeArgs {
        q: &qt,
        prefix: prefix_cache.view(case.prefix),
        suffix: suffix_cache.view(cap),
        o: &o,
        lse: Some(&lse),
        scale: None,
        mods,
    };
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    op.record(gpu, &mut encoder, &args)?;
    gpu.queue.submit([encoder.finish()]);
    Ok((o.to_f32(gpu).block_on()?, lse.to_f32(gpu).block_on()?))
}

/// A cache on the device: contiguous `[slots, capacity, ..]` or paged in 16-row pages.
struct Caches {
    k: Tensor,
    v: Tensor,
    lens: Tensor,
    table: Option<Tensor>,
    scales: Option<Tensor>,
}

impl Caches {
    fn new(
        gpu: &Gpu,
        case: &CascadeCase,
        (slots, capacity): (u32, u32),
        [k, v]: [&[f32]; 2],
        lens: &[u32],
    ) -> Result<Caches, Error> {
        let h = case.heads;
        let scalar = case.fp8.map_or(Scalar::from(case.dtype), Scalar::from);
        let lens = Tensor::from_u32(gpu, &[slots], lens)?;
        let tensor = |rows: u32, per: u32, width: u32, data: &[f32]| {
            Tensor::from_f32(gpu, &[rows, per, h.n_kv_heads, width], scalar, data)
        };
        let (dk, dv) = (h.head_dim, h.head_dim_v);
        Ok(match case.cache {
            Cache::Contiguous => Caches {
                k: tensor(slots, capacity, dk, k)?,
                v: tensor(slots, capacity, dv, v)?,
                lens,
                table: None,
                scales: None,
            },
            Cache::Paged => {
                let page = 16;
                let (table, k_pool, v_pool) = page_cache(h, (slots, capacity), page, 2, [k, v]);
                let pages = k_pool.len() as u32 / (page * h.n_kv_heads * dk);
                let per_seq = capacity.div_ceil(page);
                Caches {
                    k: tensor(pages, page, dk, &k_pool)?,
                    v: tensor(pages, page, dv, &v_pool)?,
                    lens,
                    table: Some(Tensor::from_u32(gpu, &[slots, per_seq], &table)?),
                    scales: None,
                }
            }
        })
    }

    fn view(&self, max_len: u32) -> CacheView<'_> {
        CacheView {
            k: &self.k,
            v: &self.v,
            seq_lens: &self.lens,
            max_len,
            block_table: self.table.as_ref(),
            slot0: 0,
            scales: self.scales.as_ref(),
        }
    }
}

/// The f64 reference over each sequence's prefix and suffix at once, and the baseline as a
/// framework computes a cascade (FlashInfer's `merge_state`): each part in f32 with P
/// rounded to a half dtype as its products' operand, its O stored in the dtype, the parts
/// merged in f32 (the sinks joined there) and O stored again.
fn references(
    case: &CascadeCase,
    q: &[f32],
    (prefix, suffix): ([&[f32]; 2], [&[f32]; 2]),
    cap: u32,
) -> (Attention<f64>, Attention<f32>) {
    let h = case.heads;
    let scalar = Scalar::from(case.dtype);
    let round = |x: f32| match scalar {
        Scalar::F32 => x,
        s => round_to(x, s),
    };
    let mut r64 = Attention {
        o: Vec::new(),
        lse: Vec::new(),
    };
    let mut r32 = Attention {
        o: Vec::new(),
        lse: Vec::new(),
    };
    let q_row = (h.n_heads * h.head_dim) as usize;
    for (b, &len) in case.suffixes.iter().enumerate() {
        let keys = |i: usize, width: u32| {
            let row = (h.n_kv_heads * width) as usize;
            let at = b * cap as usize * row;
            [prefix[i], &suffix[i][at..][..len as usize * row]].concat()
        };
        let (k, v) = (keys(0, h.head_dim), keys(1, h.head_dim_v));
        let n_k = (case.prefix + len) as usize;
        let qb = &q[b * q_row..][..q_row];
        let p = Problem {
            batch: 1,
            n_q: 1,
            n_k,
            n_heads: h.n_heads as usize,
            n_kv_heads: h.n_kv_heads as usize,
            head_dim: h.head_dim as usize,
            head_dim_v: h.head_dim_v as usize,
            scale: f64::from(h.default_scale()),
            mods: case.mods,
            q_pos: n_k - 1,
            ..Problem::default()
        };
        let cast = |x: &[f32]| reference::cast::<f64>(x);
        let a64 = reference::attention(&p, &cast(qb), &cast(&k), &cast(&v));
        r64.o.extend(a64.o);
        r64.lse.extend(a64.lse);
        let parts: Vec<Attention<f32>> = [(0, case.prefix as usize), (case.prefix as usize, n_k)]
            .map(|keys| {
                let part = Problem {
                    keys: Some(keys),
                    mods: Modifiers {
                        sinks: None,
                        ..case.mods
                    },
                    ..p
                };
                reference::attention_rounding_p(&part, qb, &k, &v, &round)
            })
            .into();
        let o_parts: Vec<Vec<f32>> = parts.iter().map(|a| rounded(&a.o, scalar)).collect();
        let lse_parts: Vec<Vec<f32>> = parts.into_iter().map(|a| a.lse).collect();
        let dv = h.head_dim_v as usize;
        let (o, lse) = reference::merge_states(
            &o_parts,
            &lse_parts,
            dv,
            h.n_heads as usize,
            case.mods.sinks,
        );
        r32.o.extend(rounded(&o, scalar));
        r32.lse.extend(lse);
    }
    (r64, r32)
}
