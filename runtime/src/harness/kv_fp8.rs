//! fp8 KV caches as a user runs them, for `check`, `bench` and the tests: a [`KvCache`]
//! filled by appends (the kernel quantizes), a split-K [`Decode`] of it, and what the cache
//! then holds read back and scaled, so that the reference judges the decode on the values
//! it read.

use attn_dsl::{Cache, Dtype, Fp8, Masks, Scalar};

use crate::device::Gpu;
use crate::error::Error;
use crate::modifiers::Modifiers;
use crate::ops::cache::{CacheLayout, CacheSpec, KvCache};
use crate::ops::decode::{Decode, DecodeArgs, DecodeSpec};
use crate::shape::Heads;
use crate::tensor::Tensor;
use pollster::FutureExt as BlockOn;

/// One decode of an fp8 cache.
pub struct Fp8Run {
    /// `[batch, n_heads, head_dim]`.
    pub o: Vec<f32>,
    /// K and V as the cache holds them, `[batch, len, n_kv_heads, head_dim]`: each byte's
    /// value times its KV head's scale (in f32, as the decode's inputs are judged).
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// What to decode: `batch` sequences of `len` rows, the first `prompt` appended at once,
/// the rest a row at a time; the scales of K and V (one, or one per KV head).
pub struct Fp8Case<'a> {
    pub heads: Heads,
    pub dtype: Dtype,
    pub fp8: Fp8,
    pub layout: CacheLayout,
    pub batch: u32,
    pub len: u32,
    pub prompt: u32,
    pub scales: (&'a [f32], &'a [f32]),
    pub mods: Modifiers<'a>,
}

/// Per KV head, the scale that maps the head's largest magnitude of `x` (`[.., n_kv_heads,
/// head_dim]`) to the format's largest value (as vLLM's and FlashAttention 3's calibrated
/// scales do); 1 for an all-zero head.
pub fn amax_scales(x: &[f32], heads: Heads, fp8: Fp8) -> Vec<f32> {
    let d = heads.head_dim as usize;
    let mut amax = vec![0.0f32; heads.n_kv_heads as usize];
    for (i, v) in x.iter().enumerate() {
        let h = (i / d) % amax.len();
        amax[h] = amax[h].max(v.abs());
    }
    amax.iter()
        .map(|&a| if a > 0.0 { a / fp8.max() } else { 1.0 })
        .collect()
}

/// Appends `k` and `v` (`[batch, len, n_kv_heads, head_dim]`) to a new fp8 cache and
/// decodes `q` (`[batch, n_heads, head_dim]`) against it.
pub fn decode(gpu: &Gpu, case: &Fp8Case, [q, k, v]: [&[f32]; 3]) -> Result<Fp8Run, Error> {
    let h = case.heads;
    let spec = CacheSpec {
        slots: case.batch,
        n_kv_heads: h.n_kv_heads,
        head_dim: h.head_dim,
        head_dim_v: h.head_dim_v,
        dtype: case.dtype,
        layout: case.layout,
        kv_fp8: Some(case.fp8),
    };
    let mut cache = KvCache::new(gpu, spec)?;
    cache.set_scales(gpu, case.scales.0, case.scales.1)?;
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    for slot in 0..case.batch {
        cache.open(&mut encoder, slot)?;
    }
    let data = Scalar::from(case.dtype);
    // Rows `from..from + n` of each sequence of `x`, its rows `width` wide.
    let rows = |x: &[f32], width: u32, from: u32, n: u32| -> Result<Tensor, Error> {
        let row = (h.n_kv_heads * width) as usize;
        let mut out = Vec::new();
        for seq in x.chunks(case.len as usize * row) {
            out.extend_from_slice(&seq[from as usize * row..][..n as usize * row]);
        }
        let shape = [case.batch, n, h.n_kv_heads, width];
        Tensor::from_f32(gpu, &shape, data, &out)
    };
    let (dk, dv) = (h.head_dim, h.head_dim_v);
    let prompt = case.prompt.min(case.len);
    cache.append(
        gpu,
        &mut encoder,
        0,
        &rows(k, dk, 0, prompt)?,
        &rows(v, dv, 0, prompt)?,
    )?;
    for t in prompt..case.len {
        let (kt, vt) = (rows(k, dk, t, 1)?, rows(v, dv, t, 1)?);
        cache.append(gpu, &mut encoder, 0, &kt, &vt)?;
    }
    let masks: Masks = case.mods.masks(false, false);
    let kind = match case.layout {
        CacheLayout::Contiguous { .. } => Cache::Contiguous,
        CacheLayout::Paged { .. } => Cache::Paged,
    };
    let mut decode = Decode::new(
        gpu,
        DecodeSpec {
            head_dim: h.head_dim,
            head_dim_v: h.head_dim_v,
            masks,
            dtype: case.dtype,
            cache: kind,
            kv_fp8: Some(case.fp8),
        },
    )?;
    let q_shape = [case.batch, h.n_heads, h.head_dim];
    let qt = Tensor::from_f32(gpu, &q_shape, data, q)?;
    let o = Tensor::zeros(gpu, &[case.batch, h.n_heads, dv], data)?;
    let mut uploaded = case.mods.upload(gpu, case.batch, (1, cache.capacity()))?;
    crate::ops::block_mask::make_block_mask(gpu, &mut uploaded, h.n_heads, cache.capacity())?;
    let flex = uploaded.flex_tensors();
    let args = DecodeArgs {
        rows: Default::default(),
        q: &qt,
        cache: cache.view(),
        o: &o,
        scale: None,
        mods: uploaded.view(&case.mods, &flex),
        slice_len: None,
    };
    decode.record(gpu, &mut encoder, &args)?;
    gpu.queue.submit([encoder.finish()]);
    let view = cache.view();
    let table = match view.block_table {
        Some(t) => t.to_u32(gpu).block_on()?,
        None => Vec::new(),
    };
    let held = |t: &Tensor, scales: &[f32], width: u32| -> Result<Vec<f32>, Error> {
        let row = (h.n_kv_heads * width) as usize;
        let all = t.to_f32(gpu).block_on()?;
        let mut out = Vec::with_capacity(case.batch as usize * case.len as usize * row);
        for b in 0..case.batch {
            for j in 0..case.len {
                let at =
                    crate::harness::continued::stored_row(case.layout, &table, b, j) as usize * row;
                let values = all[at..][..row].iter().enumerate();
                out.extend(values.map(|(i, x)| x * scales[(i / width as usize) % scales.len()]));
            }
        }
        Ok(out)
    };
    Ok(Fp8Run {
        o: o.to_f32(gpu).block_on()?,
        k: held(view.k, case.scales.0, dk)?,
        v: held(view.v, case.scales.1, dv)?,
    })
}
