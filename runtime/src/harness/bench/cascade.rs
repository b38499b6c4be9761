//! `bench --decode PREFIX --cascade`: sequences sharing a prefix of PREFIX rows, each with
//! its own rows after it, decoded by [`Cascade`] (the prefix read once for all of them)
//! beside the paged decode of the same work (each sequence's block table listing the
//! prefix's pages, so each reads them). Both read one page pool.

use attn_dsl::{Cache, Dtype, Fp8, Scalar};

use super::e2e::{random, random_in};
use crate::device::Gpu;
use crate::error::Error;
use crate::ops::cascade::{Cascade, CascadeArgs};
use crate::ops::decode::{CacheView, Decode, DecodeArgs, DecodeSpec, QueryRows};
use crate::shape::Heads;
use crate::tensor::Tensor;

/// Rows of a page.
const PAGE: u32 = 16;

/// One cascade row: GPU ms of the cascade, of its prefix's pass and its suffixes' decode
/// each alone (the merge and the gaps are the rest), and of the paged decode; the bytes of
/// K and V each must read (the prefix once, or once per sequence).
pub struct CascadeRow {
    pub cascade_ms: f64,
    pub prefix_ms: f64,
    pub suffix_ms: f64,
    pub paged_ms: f64,
    pub cascade_bytes: f64,
    pub paged_bytes: f64,
}

/// `n` sequences over a prefix of `prefix` rows, `suffix` rows each after it, in `dtype`
/// (the cache in `kv_fp8`'s bytes where given, at unit scales).
pub fn row(
    gpu: &Gpu,
    h: Heads,
    (prefix, suffix, n): (u32, u32, u32),
    (dtype, kv_fp8): (Dtype, Option<Fp8>),
    runs: u32,
) -> Result<CascadeRow, Error> {
    let (p_pages, s_pages) = (prefix.div_ceil(PAGE), suffix.div_ceil(PAGE));
    let pages = p_pages + n * s_pages;
    let stored = kv_fp8.map_or(Scalar::from(dtype), Scalar::from);
    let pool = |width, seed| random_in(gpu, &[pages, PAGE, h.n_kv_heads, width], stored, seed);
    let (k, v) = (pool(h.head_dim, 1)?, pool(h.head_dim_v, 2)?);
    let ones = vec![1.0; 2 * h.n_kv_heads as usize];
    let scales = kv_fp8
        .map(|_| Tensor::from_f32(gpu, &[2, h.n_kv_heads], Scalar::F32, &ones))
        .transpose()?;
    let suffix_pages = |b: u32| (0..s_pages).map(move |i| p_pages + b * s_pages + i);
    let whole: Vec<u32> = (0..n)
        .flat_map(|b| (0..p_pages).chain(suffix_pages(b)))
        .collect();
    let whole = Tensor::from_u32(gpu, &[n, p_pages + s_pages], &whole)?;
    let own: Vec<u32> = (0..n).flat_map(suffix_pages).collect();
    let own = Tensor::from_u32(gpu, &[n, s_pages], &own)?;
    let shared: Vec<u32> = (0..p_pages).collect();
    let shared = Tensor::from_u32(gpu, &[1, p_pages], &shared)?;
    let lens = |len: u32, slots: u32| Tensor::from_u32(gpu, &[slots], &vec![len; slots as usize]);
    let (whole_lens, own_lens, prefix_lens) = (
        lens(prefix + suffix, n)?,
        lens(suffix, n)?,
        lens(prefix, 1)?,
    );
    let view = |table, seq_lens, max_len| CacheView {
        k: &k,
        v: &v,
        seq_lens,
        max_len,
        block_table: Some(table),
        slot0: 0,
        scales: scales.as_ref(),
    };
    let q = random(gpu, &[n, h.n_heads, h.head_dim], dtype, 3)?;
    let o = Tensor::zeros(gpu, &[n, h.n_heads, h.head_dim_v], dtype.into())?;
    let spec = DecodeSpec {
        cache: Cache::Paged,
        kv_fp8,
        ..DecodeSpec::new(h.head_dim, h.head_dim_v, dtype)
    };
    let mut cascade = Cascade::new(gpu, spec)?;
    let cascade_ms = gpu_ms(gpu, runs, |enc| {
        let args = CascadeArgs {
            q: &q,
            prefix: view(&shared, &prefix_lens, prefix),
            suffix: view(&own, &own_lens, suffix),
            o: &o,
            lse: None,
            scale: None,
            mods: Default::default(),
        };
        cascade.record(gpu, enc, &args)
    })?;
    let lse = Tensor::zeros(gpu, &[n, h.n_heads], attn_dsl::Scalar::F32)?;
    let part = |cache, rows| DecodeArgs {
        q: &q,
        rows,
        cache,
        o: &o,
        scale: None,
        mods: Default::default(),
        slice_len: None,
    };
    let mut prefix_pass = Decode::new(gpu, spec)?;
    let prefix_ms = gpu_ms(gpu, runs, |enc| {
        let args = part(view(&shared, &prefix_lens, prefix), QueryRows::Each(n));
        let mut rec = crate::dispatch::Recorder::new(enc);
        prefix_pass
            .record_shared(gpu, &mut rec, &args, &lse)
            .map(|_| ())
    })?;
    let mut suffix_pass = Decode::new(gpu, spec)?;
    let suffix_ms = gpu_ms(gpu, runs, |enc| {
        let args = part(view(&own, &own_lens, suffix), QueryRows::Each(1));
        suffix_pass.record_lse(gpu, enc, &args, &lse).map(|_| ())
    })?;
    let mut decode = Decode::new(gpu, spec)?;
    let paged_ms = gpu_ms(gpu, runs, |enc| {
        let args = DecodeArgs {
            q: &q,
            rows: QueryRows::Each(1),
            cache: view(&whole, &whole_lens, prefix + suffix),
            o: &o,
            scale: None,
            mods: Default::default(),
            slice_len: None,
        };
        decode.record(gpu, enc, &args).map(|_| ())
    })?;
    let elem_bytes = kv_fp8.map_or(dtype.bytes(), |_| 1);
    let row_bytes = f64::from(h.n_kv_heads * (h.head_dim + h.head_dim_v) * elem_bytes);
    Ok(CascadeRow {
        cascade_ms,
        prefix_ms,
        suffix_ms,
        paged_ms,
        cascade_bytes: row_bytes * f64::from(prefix + n * suffix),
        paged_bytes: row_bytes * f64::from(n * (prefix + suffix)),
    })
}

/// GPU ms of what `record` records, timed as every kernel row is (after a spin-up: the
/// cache uploads between rows leave the GPU idle, and on an H200 a row timed right after
/// an idle GPU ran several times slow).
fn gpu_ms<T>(
    gpu: &Gpu,
    runs: u32,
    record: impl FnMut(&mut wgpu::CommandEncoder) -> Result<T, Error>,
) -> Result<f64, Error> {
    Ok(crate::timing::time_recorded(gpu, 2, runs as usize, record)?
        .0
        .median_ms)
}
