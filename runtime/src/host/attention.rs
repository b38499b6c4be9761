//! The forward and decode operations: validate, upload, dispatch, read back.

use attn_dsl::{Access, Binding, KernelAbi, Op, Scalar};

use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::error::{Error, InputError};
use crate::host::buffers;
use crate::modifiers::Modifiers;
pub use crate::shape::{Heads, seg_from_cu_seqlens, seg_from_lengths, seg_with_ends, validate_seg};
pub(crate) use crate::shape::{
    binding_size, expect_op, length, nonzero, validate_heads, validate_scale,
};
use crate::tensor::Tensor;

/// Inputs of the forward, laid out `[batch, seq, heads, head_dim]` (K and V with
/// `n_kv_heads`); a 3-D `[seq, heads, head_dim]` tensor is batch 1.
#[derive(Clone, Copy, Debug)]
pub struct ForwardInput<'a> {
    /// Sequences of `seq_len` rows each (the grid's third dimension).
    pub batch: u32,
    /// Rows of each sequence, queries and keys alike.
    pub seq_len: u32,
    /// Query and KV heads and their widths.
    pub heads: Heads,
    /// Queries, `[batch, seq, n_heads, head_dim]`.
    pub q: &'a [f32],
    /// Keys, `[batch, seq, n_kv_heads, head_dim]`.
    pub k: &'a [f32],
    /// Values, `[batch, seq, n_kv_heads, head_dim_v]`.
    pub v: &'a [f32],
    /// The start index of each row's document, `[batch, seq]`, counted within its sequence;
    /// `None` is one document per sequence. Only kernels built with the document mask take
    /// it. Packed variable-length sequences (FlashAttention's `cu_seqlens`) are documents:
    /// see [`seg_from_cu_seqlens`].
    pub seg: Option<&'a [u32]>,
    /// Defaults to `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// The values of the kernel's score modifiers (window, ALiBi, bias, soft cap, dropout).
    pub mods: Modifiers<'a>,
}

/// What the forward read back: the attention output and its log-sum-exp, which the
/// backward takes.
#[derive(Clone, Debug, PartialEq)]
pub struct ForwardOutput {
    /// `[batch, seq, n_heads, head_dim]`
    pub o: Vec<f32>,
    /// `[batch, seq, n_heads]`; `+inf` for a row with no visible key.
    pub lse: Vec<f32>,
}

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

/// O and LSE of host data: the input checked, uploaded, run through
/// [`crate::ops::forward::Forward`] and read back.
pub async fn forward(
    gpu: &Gpu,
    kernel: &Kernel,
    input: &ForwardInput<'_>,
) -> Result<ForwardOutput, Error> {
    let abi = kernel.abi();
    validate_forward(abi, gpu.limits(), input)?;
    let h = input.heads;
    let (b, s) = (input.batch, input.seq_len);
    // Half-precision kernels get the inputs rounded to their dtype; O comes back widened.
    let data = abi.scalar("o");
    let q_shape = [b, s, h.n_heads, h.head_dim];
    let kv_shape = [b, s, h.n_kv_heads, h.head_dim];
    let q = Tensor::from_f32(gpu, &q_shape, data, input.q)?;
    let k = Tensor::from_f32(gpu, &kv_shape, data, input.k)?;
    let v = Tensor::from_f32(gpu, &[b, s, h.n_kv_heads, h.head_dim_v], data, input.v)?;
    let o = Tensor::zeros(gpu, &[b, s, h.n_heads, h.head_dim_v], data)?;
    let lse = Tensor::zeros(gpu, &[b, s, h.n_heads], Scalar::F32)?;
    let seg = match input.seg {
        Some(seg) => Some(crate::ops::forward::documents(gpu, seg, b, s)?),
        None => None,
    };
    let mut uploaded = input.mods.upload(gpu, b, s)?;
    super::make_block_mask(gpu, &mut uploaded, h.n_heads, s)?;
    let flex = uploaded.flex_tensors();
    let args = crate::ops::forward::ForwardArgs {
        q: &q,
        k: &k,
        v: &v,
        o: &o,
        lse: &lse,
        seg: seg.as_ref(),
        scale: input.scale,
        mods: uploaded.view(&input.mods, &flex),
    };
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    crate::ops::forward::Forward::from_kernel(kernel)?.record(gpu, &mut encoder, &args)?;
    gpu.queue.submit([encoder.finish()]);
    Ok(ForwardOutput {
        o: o.to_f32(gpu).await?,
        lse: lse.to_f32(gpu).await?,
    })
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

pub(crate) fn submit(
    gpu: &Gpu,
    kernel: &Kernel,
    bound: &[(&str, &wgpu::Buffer)],
    grid: [u32; 3],
) -> Result<(), Error> {
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    kernel.record(gpu, &mut encoder, bound, grid)?;
    gpu.queue.submit([encoder.finish()]);
    Ok(())
}

/// The `dims` uniform, filled by field name from the kernel's plan (fields not given are 0).
pub(crate) fn uniform_dims(
    gpu: &Gpu,
    abi: &KernelAbi,
    dims: &[(&str, u32)],
) -> Result<wgpu::Buffer, Error> {
    let bytes = fill(uniform_block(abi, "dims")?, |_, field| {
        by_name(dims, field).to_le_bytes()
    });
    Ok(buffers::uniform(gpu, "dims", &bytes))
}

fn by_name(values: &[(&str, u32)], field: &str) -> u32 {
    values
        .iter()
        .find(|(name, _)| *name == field)
        .map_or(0, |(_, v)| *v)
}

fn uniform_block<'a>(abi: &'a KernelAbi, name: &str) -> Result<&'a Binding, Error> {
    abi.binding(name)
        .filter(|b| b.access == Access::Uniform)
        .ok_or_else(|| Error::Binding {
            kernel: abi.name.to_string(),
            binding: name.to_string(),
        })
}

/// The `dims` and `params` uniforms of an attention op: `dims` and the scale (default
/// `1 / sqrt(head_dim)`), with the fields of the modifiers.
pub(crate) fn modified_uniforms(
    gpu: &Gpu,
    abi: &KernelAbi,
    dims: &[(&'static str, u32)],
    scale: Option<f32>,
    h: Heads,
    mods: &Modifiers,
) -> Result<(wgpu::Buffer, wgpu::Buffer), Error> {
    let dims: Vec<_> = dims.iter().copied().chain(mods.dims()).collect();
    let params: Vec<_> = std::iter::once(("scale", scale.unwrap_or(h.default_scale())))
        .chain(mods.params())
        .collect();
    uniforms(gpu, abi, &dims, &params)
}

/// The `dims` and `params` uniforms, filled from the kernel's plan by field name (fields
/// not given are 0).
pub(crate) fn uniforms(
    gpu: &Gpu,
    abi: &KernelAbi,
    dims: &[(&str, u32)],
    params: &[(&str, f32)],
) -> Result<(wgpu::Buffer, wgpu::Buffer), Error> {
    let params_bytes = fill(uniform_block(abi, "params")?, |_, field| {
        let value = params
            .iter()
            .find(|(name, _)| *name == field)
            .map_or(0.0, |(_, v)| *v);
        value.to_le_bytes()
    });
    Ok((
        uniform_dims(gpu, abi, dims)?,
        buffers::uniform(gpu, "params", &params_bytes),
    ))
}

fn fill(b: &Binding, value: impl Fn(usize, &str) -> [u8; 4]) -> Vec<u8> {
    b.fields
        .iter()
        .enumerate()
        .flat_map(|(i, f)| value(i, f))
        .collect()
}

/// The checks [`forward`] makes before it uploads anything: the kernel's op, the dims
/// against the kernel, the slices' lengths, the adapter's binding size, the scale, `seg`
/// and the modifiers.
pub fn validate_forward(
    abi: &KernelAbi,
    limits: &wgpu::Limits,
    input: &ForwardInput,
) -> Result<(), InputError> {
    expect_op(abi, Op::Forward)?;
    validate_sequence(abi, limits, input)
}

/// Dims, Q/K/V lengths, buffer sizes, scale and `seg` of a full-sequence op, against the
/// kernel that will run it.
pub(crate) fn validate_sequence(
    abi: &KernelAbi,
    limits: &wgpu::Limits,
    input: &ForwardInput,
) -> Result<(), InputError> {
    nonzero("batch", input.batch)?;
    nonzero("seq_len", input.seq_len)?;
    let h = input.heads;
    validate_heads(abi, h)?;
    let (s, nh, nkv, d) = (
        u64::from(input.batch) * u64::from(input.seq_len),
        h.n_heads as u64,
        h.n_kv_heads as u64,
        h.head_dim as u64,
    );
    length(
        "q",
        input.q.len(),
        s * nh * d,
        "batch × seq_len × n_heads × head_dim",
    )?;
    length(
        "k",
        input.k.len(),
        s * nkv * d,
        "batch × seq_len × n_kv_heads × head_dim",
    )?;
    let dv = u64::from(h.head_dim_v);
    length(
        "v",
        input.v.len(),
        s * nkv * dv,
        "batch × seq_len × n_kv_heads × head_dim_v",
    )?;
    binding_size(
        limits,
        (s * nh * d.max(dv)).max(s * nkv * d.max(dv)) * element_bytes(abi, "q"),
    )?;
    validate_scale(input.scale)?;
    input
        .mods
        .validate(abi, input.batch, input.seq_len, h.n_heads)?;
    if let Some(b) = input.mods.bias {
        binding_size(limits, b.values.len() as u64 * 4)?;
    }
    match input.seg {
        Some(_) if !abi.masks.document => Err(InputError::SegWithoutDocumentMask {
            kernel: abi.name.to_string(),
        }),
        Some(seg) => {
            length("seg", seg.len(), s, "batch × seq_len")?;
            seg.chunks(input.seq_len as usize)
                .enumerate()
                .try_for_each(|(b, rows)| {
                    validate_seg(rows).map_err(|e| match e {
                        InputError::Seg {
                            index,
                            value,
                            reason,
                        } => InputError::Seg {
                            index: b * input.seq_len as usize + index,
                            value,
                            reason,
                        },
                        other => other,
                    })
                })
        }
        None => Ok(()),
    }
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
    Ok(())
}

/// Bytes per element of binding `name` as the kernel stores it (2 for f16 and bf16).
fn element_bytes(abi: &KernelAbi, name: &str) -> u64 {
    match abi.scalar(name) {
        attn_dsl::Scalar::F16 | attn_dsl::Scalar::Bf16 => 2,
        attn_dsl::Scalar::F32 | attn_dsl::Scalar::U32 => 4,
        attn_dsl::Scalar::E4m3 | attn_dsl::Scalar::E5m2 => 1,
    }
}

/// What every decode checks whatever its cache's layout: dims, heads, Q's length, the
/// scale and the modifiers.
pub(crate) fn validate_query(abi: &KernelAbi, input: &DecodeInput) -> Result<(), InputError> {
    nonzero("batch", input.batch)?;
    nonzero("cache_len", input.cache_len)?;
    let h = input.heads;
    validate_heads(abi, h)?;
    length(
        "q",
        input.q.len(),
        u64::from(input.batch) * u64::from(h.n_heads) * u64::from(h.head_dim),
        "batch × n_heads × head_dim",
    )?;
    validate_scale(input.scale)?;
    input.mods.validate(abi, input.batch, 1, h.n_heads)
}

pub(crate) fn checked_grid(
    abi: &KernelAbi,
    limits: &wgpu::Limits,
    dims: &[(&str, u32)],
) -> Result<[u32; 3], InputError> {
    let ordered: Vec<u32> = abi
        .binding("dims")
        .map(|b| b.fields.iter().map(|f| by_name(dims, f)).collect())
        .unwrap_or_default();
    let grid = abi.dispatch_grid(&ordered);
    let limit = limits.max_compute_workgroups_per_dimension;
    match grid.iter().find(|g| **g > limit) {
        Some(&g) => Err(InputError::OverLimit {
            what: "workgroups in one grid dimension",
            value: g.into(),
            limit: limit.into(),
        }),
        None => Ok(grid),
    }
}

impl Modifiers<'_> {
    /// The modifiers' input buffers, by binding name (a placeholder word where absent:
    /// a kernel without the modifier does not bind it), then the user-written modifiers'
    /// tensors in their declared element types.
    pub(crate) fn buffers(&self, gpu: &Gpu) -> Vec<(String, wgpu::Buffer)> {
        let alibi = self.alibi.unwrap_or(&[0.0]);
        let bias = self.bias.map_or(&[0.0][..], |b| b.values);
        let sinks = self.sinks.unwrap_or(&[0.0]);
        let mut out = vec![
            ("alibi".to_string(), buffers::storage(gpu, "alibi", alibi)),
            ("bias".to_string(), buffers::storage(gpu, "bias", bias)),
            ("sinks".to_string(), buffers::storage(gpu, "sinks", sinks)),
        ];
        let Some(flex) = self.flex else { return out };
        for t in &flex.modifiers.parsed().tensors {
            let Some(values) = flex.tensor(&t.name) else {
                continue;
            };
            let buffer = match t.ty {
                attn_dsl::flex::Ty::F32 => buffers::storage(gpu, &t.name, values),
                _ => buffers::storage(gpu, &t.name, &crate::modifiers::u32_words(values)),
            };
            out.push((t.name.clone(), buffer));
        }
        out
    }
}
