//! Continued caches as an engine runs them, for `check` and the tests: a [`KvCache`] filled
//! by appends, then every sequence's next rows appended and attended over its whole cache
//! in one recorded piece of work ([`KvCache::extend`] where every sequence adds as many
//! rows, a [`Decode`] of ragged rows after appends where they differ), and what the cache
//! then holds read back, so that the reference judges the rows on the values they read.

use attn_dsl::{Cache, Dtype, Fp8, Scalar};

use crate::device::Gpu;
use crate::error::Error;
use crate::modifiers::Modifiers;
use crate::ops::cache::{CacheLayout, CacheSpec, ExtendArgs, KvCache};
use crate::ops::decode::{CacheView, Decode, DecodeArgs, DecodeSpec, QueryRows, SplitLayout};
use crate::shape::Heads;
use crate::tensor::Tensor;
use pollster::FutureExt as BlockOn;

/// What to continue: sequence b holds `cached[b]` rows, then adds `added[b]`; K and V are
/// `[rows, n_kv_heads, width]` per sequence, each sequence's `cached[b] + added[b]` rows in
/// turn, and Q the added rows' `[rows, n_heads, head_dim]` likewise.
pub struct ContinueCase<'a> {
    pub heads: Heads,
    pub dtype: Dtype,
    pub fp8: Option<(Fp8, &'a [f32], &'a [f32])>,
    pub layout: CacheLayout,
    pub split: SplitLayout,
    pub cached: &'a [u32],
    pub added: &'a [u32],
    pub mods: Modifiers<'a>,
    /// The keys per slice of the decode (`None`: the rule's, a uniform batch's through
    /// `KvCache::extend`); a chunk cut into slices whatever the adapter's rule says.
    pub slice_len: Option<u32>,
}

/// The added rows' outputs, packed `[rows, n_heads, head_dim_v]`, and K and V as the cache
/// holds them (fp8: each byte's value times its scale), laid out as the case's.
pub struct ContinueRun {
    pub o: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

impl ContinueCase<'_> {
    fn batch(&self) -> u32 {
        self.cached.len() as u32
    }

    fn len(&self, b: usize) -> u32 {
        self.cached[b] + self.added[b]
    }

    /// The first row of sequence b among all sequences' rows.
    fn start(&self, b: usize) -> u32 {
        (0..b).map(|i| self.len(i)).sum()
    }
}

/// Runs `case` on `q`, `k` and `v` (laid out as [`ContinueCase`] says).
pub fn run(gpu: &Gpu, case: &ContinueCase, [q, k, v]: [&[f32]; 3]) -> Result<ContinueRun, Error> {
    let h = case.heads;
    let batch = case.batch();
    let spec = CacheSpec {
        slots: batch,
        n_kv_heads: h.n_kv_heads,
        head_dim: h.head_dim,
        head_dim_v: h.head_dim_v,
        dtype: case.dtype,
        layout: case.layout,
        kv_fp8: case.fp8.map(|f| f.0),
    };
    let mut cache = KvCache::new(gpu, spec)?;
    if let Some((_, ks, vs)) = case.fp8 {
        cache.set_scales(gpu, ks, vs)?;
    }
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    for slot in 0..batch {
        cache.open(&mut encoder, slot)?;
    }
    let data = Scalar::from(case.dtype);
    // Rows `from..from + n` of sequence b of `x`, rows `width` wide, as [1, n, heads, width].
    let rows = |x: &[f32], width: u32, heads: u32, b: usize, from: u32, n: u32| {
        let row = (heads * width) as usize;
        let at = (case.start(b) + from) as usize * row;
        Tensor::from_f32(
            gpu,
            &[1, n, heads, width],
            data,
            &x[at..][..n as usize * row],
        )
    };
    let (dk, dv) = (h.head_dim, h.head_dim_v);
    for b in 0..batch as usize {
        let c = case.cached[b];
        if c > 0 {
            let (kt, vt) = (
                rows(k, dk, h.n_kv_heads, b, 0, c)?,
                rows(v, dv, h.n_kv_heads, b, 0, c)?,
            );
            cache.append(gpu, &mut encoder, b as u32, &kt, &vt)?;
        }
    }
    let spec = DecodeSpec {
        head_dim: dk,
        head_dim_v: dv,
        masks: case.mods.masks(false, false),
        dtype: case.dtype,
        cache: match case.layout {
            CacheLayout::Contiguous { .. } => Cache::Contiguous,
            CacheLayout::Paged { .. } => Cache::Paged,
        },
        kv_fp8: case.fp8.map(|f| f.0),
    };
    // As planned: what an engine's `Decode::new` runs, the streamed pass beside the staged
    // one where the rule takes it.
    let mut decode = match case.split == SplitLayout::PLANNED {
        true => Decode::new(gpu, spec)?,
        false => Decode::with_layout(gpu, spec, case.split)?,
    };
    let total: u32 = case.added.iter().sum();
    let o = Tensor::zeros(gpu, &[total, h.n_heads, dv], data)?;
    let mut uploaded = case.mods.upload(gpu, batch, (1, cache.capacity()))?;
    crate::ops::block_mask::make_block_mask(gpu, &mut uploaded, h.n_heads, cache.capacity())?;
    let flex = uploaded.flex_tensors();
    let mods = uploaded.view(&case.mods, &flex);
    let uniform = case.added.iter().all(|&n| n == case.added[0]);
    if uniform {
        // Every sequence adds n rows: the cache appends and attends them in one call.
        let n = case.added[0];
        let gather = |x: &[f32], width: u32, heads: u32, from: &dyn Fn(usize) -> u32| {
            let row = (heads * width) as usize;
            let mut out = Vec::new();
            for b in 0..batch as usize {
                let at = (case.start(b) + from(b)) as usize * row;
                out.extend_from_slice(&x[at..][..n as usize * row]);
            }
            Tensor::from_f32(gpu, &[batch, n, heads, width], data, &out)
        };
        let k_new = gather(k, dk, h.n_kv_heads, &|b| case.cached[b])?;
        let v_new = gather(v, dv, h.n_kv_heads, &|b| case.cached[b])?;
        let qt = Tensor::from_f32(gpu, &[batch, n, h.n_heads, dk], data, q)?;
        let o4 = o.view(&[batch, n, h.n_heads, dv])?;
        match case.slice_len {
            None => {
                let args = ExtendArgs {
                    k_new: &k_new,
                    v_new: &v_new,
                    q: &qt,
                    o: &o4,
                    scale: None,
                    mods,
                };
                cache.extend(gpu, &mut encoder, &mut decode, 0, &args)?;
            }
            Some(slice_len) => {
                cache.append(gpu, &mut encoder, 0, &k_new, &v_new)?;
                let longest = (0..batch as usize).map(|b| case.len(b)).max().unwrap_or(1);
                let args = DecodeArgs {
                    q: &qt,
                    rows: QueryRows::Each(n),
                    cache: CacheView {
                        max_len: longest,
                        ..cache.view()
                    },
                    o: &o4,
                    scale: None,
                    mods,
                    slice_len: Some(slice_len),
                };
                decode.record(gpu, &mut encoder, &args)?;
            }
        }
    } else {
        // Ragged: each sequence's rows appended, then one decode of all of them.
        for b in 0..batch as usize {
            let (c, n) = (case.cached[b], case.added[b]);
            let (kt, vt) = (
                rows(k, dk, h.n_kv_heads, b, c, n)?,
                rows(v, dv, h.n_kv_heads, b, c, n)?,
            );
            cache.append(gpu, &mut encoder, b as u32, &kt, &vt)?;
        }
        let mut starts = vec![0u32];
        for &n in case.added {
            starts.push(starts[starts.len() - 1] + n);
        }
        let qt = Tensor::from_f32(gpu, &[total, h.n_heads, dk], data, q)?;
        let longest = (0..batch as usize).map(|b| case.len(b)).max().unwrap_or(1);
        let args = DecodeArgs {
            q: &qt,
            rows: QueryRows::Ragged(&starts),
            cache: CacheView {
                max_len: longest,
                ..cache.view()
            },
            o: &o,
            scale: None,
            mods,
            slice_len: case.slice_len,
        };
        decode.record(gpu, &mut encoder, &args)?;
    }
    gpu.queue.submit([encoder.finish()]);
    let (k, v) = held(gpu, case, &cache)?;
    Ok(ContinueRun {
        o: o.to_f32(gpu).block_on()?,
        k,
        v,
    })
}

/// K and V as the cache holds them, each sequence's rows in turn (fp8 values scaled).
fn held(gpu: &Gpu, case: &ContinueCase, cache: &KvCache) -> Result<(Vec<f32>, Vec<f32>), Error> {
    let h = case.heads;
    let view = cache.view();
    let table = match view.block_table {
        Some(t) => t.to_u32(gpu).block_on()?,
        None => Vec::new(),
    };
    let unit = [1.0f32];
    let (ks, vs) = case.fp8.map_or((&unit[..], &unit[..]), |f| (f.1, f.2));
    let read = |t: &Tensor, scales: &[f32], width: u32| -> Result<Vec<f32>, Error> {
        let row = (h.n_kv_heads * width) as usize;
        let all = t.to_f32(gpu).block_on()?;
        let mut out = Vec::new();
        for b in 0..case.batch() {
            for j in 0..case.len(b as usize) {
                let at = stored_row(case.layout, &table, b, j) as usize * row;
                let values = all[at..][..row].iter().enumerate();
                out.extend(values.map(|(i, x)| x * scales[(i / width as usize) % scales.len()]));
            }
        }
        Ok(out)
    };
    Ok((
        read(view.k, ks, h.head_dim)?,
        read(view.v, vs, h.head_dim_v)?,
    ))
}

/// The cache row (of `[rows, n_kv_heads, head_dim]`) that holds row `j` of slot `b`.
pub(crate) fn stored_row(layout: CacheLayout, table: &[u32], b: u32, j: u32) -> u32 {
    match layout {
        CacheLayout::Contiguous { capacity } => b * capacity + j,
        CacheLayout::Paged {
            page_size,
            pages_per_seq,
            ..
        } => table[(b * pages_per_seq + j / page_size) as usize] * page_size + j % page_size,
    }
}
