//! The recording API on this machine's adapter: the caller's buffers wrapped without a
//! copy, several ops in one encoder, a KV cache on the device (append + decode equals the
//! forward's last row; paged equals contiguous), the steady state that creates nothing,
//! compile on first use, and every typed refusal leaving the device untouched.

use attn_dsl::{Cache, Dtype, Fp8, Masks, Scalar};
use runtime::BlockOn;
use runtime::dispatch::{Record, Recorder};
use runtime::harness::kv_fp8::{self, Fp8Case};
use runtime::ops::backward::BackwardArgs;
use runtime::ops::cache::{CacheError, CacheLayout, CacheSpec, KvCache};
use runtime::ops::convert::ConvertArgs;
use runtime::ops::decode::{Decode, DecodeArgs, DecodeSpec};
use runtime::ops::forward::{Forward, ForwardArgs, ForwardSpec};
use runtime::ops::rope::{Rope, RopeArgs, RopeSpec};
use runtime::verify::compare::judge_attention;
use runtime::verify::random;
use runtime::verify::reference::Problem;
use runtime::{
    Backward, BackwardInput, DeviceError, Error, ForwardInput, Gpu, Heads, InputError, Kernel,
    Tensor, TensorError, kernels,
};
use wgpu::util::DeviceExt;

fn gpu() -> Gpu {
    Gpu::new(kernels::FAMILY.iter().copied())
        .block_on()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn read(gpu: &Gpu, t: &Tensor) -> Vec<f32> {
    runtime::block_on(t.to_f32(gpu)).unwrap()
}

const HEADS: Heads = Heads {
    n_heads: 4,
    n_kv_heads: 2,
    head_dim: 64,
    head_dim_v: 64,
};

fn upload(gpu: &Gpu, shape: &[u32], seed: u64) -> (Vec<f32>, Tensor) {
    let n = shape.iter().product::<u32>() as usize;
    let data = random(n, seed);
    let t = Tensor::from_f32(gpu, shape, Scalar::F32, &data).unwrap();
    (data, t)
}

/// An f32 cache of `h`'s widths, without FP8.
fn f32_cache(h: Heads, slots: u32, layout: CacheLayout) -> CacheSpec {
    CacheSpec {
        slots,
        n_kv_heads: h.n_kv_heads,
        head_dim: h.head_dim,
        head_dim_v: h.head_dim_v,
        dtype: Dtype::F32,
        layout,
        kv_fp8: None,
    }
}

fn submit(gpu: &Gpu, encoder: wgpu::CommandEncoder) {
    gpu.queue.submit([encoder.finish()]);
}

/// A buffer of the caller's own making holding `data`, with the usages a framework gives
/// its tensors.
fn caller_buffer(gpu: &Gpu, data: &[f32]) -> wgpu::Buffer {
    gpu.device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("caller's"),
            contents: bytemuck::cast_slice(data),
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
        })
}

#[test]
fn wrapped_caller_buffers_are_read_and_written_in_place() {
    let gpu = gpu();
    let (b, s, h) = (2, 37, HEADS);
    let q_shape = [b, s, h.n_heads, h.head_dim];
    let kv_shape = [b, s, h.n_kv_heads, h.head_dim];
    let len = |shape: &[u32]| shape.iter().product::<u32>() as usize;
    let (q, k, v) = (
        random(len(&q_shape), 1),
        random(len(&kv_shape), 2),
        random(len(&kv_shape), 3),
    );
    // One buffer holds Q, K and V at aligned offsets, as a framework's pool might.
    let align = u64::from(gpu.limits().min_storage_buffer_offset_alignment);
    let k_at = (4 * q.len() as u64).next_multiple_of(align);
    let v_at = (k_at + 4 * k.len() as u64).next_multiple_of(align);
    let mut packed = vec![0.0f32; (v_at / 4) as usize + v.len()];
    packed[..q.len()].copy_from_slice(&q);
    packed[(k_at / 4) as usize..][..k.len()].copy_from_slice(&k);
    packed[(v_at / 4) as usize..][..v.len()].copy_from_slice(&v);
    let qkv = caller_buffer(&gpu, &packed);
    let out = caller_buffer(&gpu, &vec![0.0; len(&q_shape)]);
    let lse_buf = caller_buffer(&gpu, &vec![0.0; (b * s * h.n_heads) as usize]);
    let wrap = |buf: &wgpu::Buffer, at, shape: &[u32]| {
        Tensor::wrap(&gpu, buf, at, shape, Scalar::F32).unwrap()
    };
    let (qt, kt, vt) = (
        wrap(&qkv, 0, &q_shape),
        wrap(&qkv, k_at, &kv_shape),
        wrap(&qkv, v_at, &kv_shape),
    );
    let (ot, lset) = (
        wrap(&out, 0, &q_shape),
        wrap(&lse_buf, 0, &[b, s, h.n_heads]),
    );
    let spec = ForwardSpec {
        head_dim: 64,
        head_dim_v: 64,
        masks: Masks::new(true, false),
        dtype: Dtype::F32,
    };
    let mut fwd = Forward::new(&gpu, spec).unwrap();
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    let args = ForwardArgs::new(&qt, &kt, &vt, &ot, &lset);
    fwd.record(&gpu, &mut encoder, &args).unwrap();
    submit(&gpu, encoder);
    // The result is in the caller's own buffer; the inputs are untouched.
    let o = read(&gpu, &ot);
    let problem = Problem {
        batch: b as usize,
        n_q: s as usize,
        n_k: s as usize,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 64,
        scale: f64::from(h.default_scale()),
        causal: true,
        ..Problem::default()
    };
    let lse = read(&gpu, &lset);
    for (name, verdict) in judge_attention(&problem, [&q, &k, &v], &o, Some(&lse)) {
        assert!(verdict.pass(), "{name}: {verdict:?}");
    }
    assert_eq!(read(&gpu, &kt), k);
    // Writing O into the buffer that holds Q would bind it twice in one dispatch.
    let aliased = ForwardArgs { o: &qt, ..args };
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    match fwd.record(&gpu, &mut encoder, &aliased) {
        Err(Error::Input(InputError::Tensor(TensorError::Aliased { name, .. }))) => {
            assert_eq!(name, "o")
        }
        other => panic!("expected an aliasing error, got {other:?}"),
    }
}

#[test]
fn wrapping_checks_bounds_usage_alignment_and_device() {
    let gpu = gpu();
    let buffer = caller_buffer(&gpu, &[0.0; 64]);
    let err = tensor_err(Tensor::wrap(&gpu, &buffer, 0, &[65], Scalar::F32).unwrap_err());
    assert!(matches!(err, TensorError::OutOfBounds { .. }), "{err}");
    let err = tensor_err(Tensor::wrap(&gpu, &buffer, 4, &[8], Scalar::F32).unwrap_err());
    assert!(matches!(err, TensorError::Alignment { .. }), "{err}");
    let uniform = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 256,
        usage: wgpu::BufferUsages::UNIFORM,
        mapped_at_creation: false,
    });
    let err = tensor_err(Tensor::wrap(&gpu, &uniform, 0, &[8], Scalar::F32).unwrap_err());
    assert!(
        matches!(
            err,
            TensorError::Usage {
                missing: "STORAGE",
                ..
            }
        ),
        "{err}"
    );
    // A buffer of another device of the same instance (of another Instance:
    // `a_buffer_of_another_instance_is_refused`).
    let (adapter, [a, b]) = two_devices();
    let gpu = Gpu::from_wgpu(&adapter, a.0, a.1, []).unwrap();
    let foreign = b.0.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: &[0; 256],
        usage: wgpu::BufferUsages::STORAGE,
    });
    let err = tensor_err(Tensor::wrap(&gpu, &foreign, 0, &[64], Scalar::F32).unwrap_err());
    assert!(matches!(err, TensorError::Device { .. }), "{err}");
}

/// A buffer of another wgpu Instance whose id this instance does not hold is refused with
/// a typed error, not a panic (one whose id it also holds cannot be told apart: wgpu
/// resolves the id in the binding device's instance, docs/robustness.md).
#[test]
fn a_buffer_of_another_instance_is_refused() {
    let gpu = gpu();
    let (_adapter, [(other, _)]) = devices::<1>();
    // Enough buffers there that the last one's id is past every buffer of this instance.
    let foreign: Vec<wgpu::Buffer> = (0..4096)
        .map(|_| {
            other.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: 256,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            })
        })
        .collect();
    let last = foreign.last().expect("made above");
    let err = tensor_err(Tensor::wrap(&gpu, last, 0, &[64], Scalar::F32).unwrap_err());
    assert!(matches!(err, TensorError::Device { .. }), "{err}");
    assert!(err.to_string().contains("Instance"), "{err}");
    // The device still works.
    let ok = Tensor::from_f32(&gpu, &[4], Scalar::F32, &[1.0; 4]).unwrap();
    assert_eq!(ok.to_f32(&gpu).block_on().unwrap(), vec![1.0; 4]);
}

/// A tensor the runtime made on a device of another wgpu Instance is refused by an op, not
/// bound: wgpu compares devices by their ids, which the first device of every instance
/// shares.
#[test]
fn a_tensor_of_another_instance_is_refused_by_an_op() {
    let (adapter, [a]) = devices::<1>();
    let (other_adapter, [b]) = devices::<1>();
    let here = Gpu::from_wgpu(&adapter, a.0, a.1, []).unwrap();
    let there = Gpu::from_wgpu(&other_adapter, b.0, b.1, []).unwrap();
    let f = Scalar::F32;
    let shape = [1, 8, 2, 64];
    let [k, v, o] = [0; 3].map(|_| Tensor::zeros(&here, &shape, f).unwrap());
    let lse = Tensor::zeros(&here, &[1, 8, 2], f).unwrap();
    let q = Tensor::zeros(&there, &shape, f).unwrap();
    let mut enc = here.device.create_command_encoder(&Default::default());
    let spec = ForwardSpec::new(64, Masks::new(true, false), Dtype::F32);
    let mut fwd = Forward::new(&here, spec).unwrap();
    let r = fwd.record(&here, &mut enc, &ForwardArgs::new(&q, &k, &v, &o, &lse));
    assert!(
        matches!(
            r,
            Err(Error::Input(InputError::Tensor(TensorError::Device { .. })))
        ),
        "{r:?}"
    );
    // A second `Gpu` over the same device (a clone of it) makes tensors this one takes.
    let twin = Gpu::from_wgpu(&adapter, here.device.clone(), here.queue.clone(), []).unwrap();
    let q = Tensor::zeros(&twin, &shape, f).unwrap();
    fwd.record(&here, &mut enc, &ForwardArgs::new(&q, &k, &v, &o, &lse))
        .unwrap();
    here.queue.submit([enc.finish()]);
    assert_eq!(read(&here, &o).len(), 8 * 2 * 64);
}

/// A shape too large for the device, or whose element count overflows, is a typed refusal
/// from every constructor, not a panic inside wgpu.
#[test]
fn constructors_refuse_shapes_the_device_cannot_hold() {
    let gpu = gpu();
    let huge = [u32::MAX, u32::MAX, u32::MAX];
    for shape in [&huge[..], &[1 << 31, 1 << 26][..]] {
        let err = tensor_err(Tensor::zeros(&gpu, shape, Scalar::F32).unwrap_err());
        assert!(matches!(err, TensorError::Buffer { .. }), "{err}");
        assert!(err.to_string().contains("max_buffer_size"), "{err}");
    }
    let err = tensor_err(Tensor::from_f32(&gpu, &huge, Scalar::F32, &[0.0; 4]).unwrap_err());
    assert!(matches!(err, TensorError::Data { .. }), "{err}");
    let err = tensor_err(Tensor::from_u32(&gpu, &huge, &[0; 4]).unwrap_err());
    assert!(matches!(err, TensorError::Data { .. }), "{err}");
    let buffer = caller_buffer(&gpu, &[0.0; 64]);
    let err = tensor_err(Tensor::wrap(&gpu, &buffer, 0, &huge, Scalar::F32).unwrap_err());
    assert!(matches!(err, TensorError::OutOfBounds { .. }), "{err}");
}

/// An adapter and two devices on it with WebGPU's default limits and no optional feature:
/// what a browser page's device has.
fn two_devices() -> (wgpu::Adapter, [(wgpu::Device, wgpu::Queue); 2]) {
    devices::<2>()
}

/// N such devices on an adapter of a new wgpu Instance.
fn devices<const N: usize>() -> (wgpu::Adapter, [(wgpu::Device, wgpu::Queue); N]) {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::from_env().unwrap_or(wgpu::Backends::PRIMARY),
        ..wgpu::InstanceDescriptor::new_without_display_handle_from_env()
    });
    let adapter = runtime::block_on(instance.request_adapter(&Default::default())).unwrap();
    let device = |_| runtime::block_on(adapter.request_device(&Default::default())).unwrap();
    let all = std::array::from_fn(device);
    (adapter, all)
}

#[test]
fn a_training_step_records_forward_and_backward_in_one_encoder() {
    let gpu = gpu();
    let (b, s, h) = (1, 50, HEADS);
    let q_shape = [b, s, h.n_heads, h.head_dim];
    let kv_shape = [b, s, h.n_kv_heads, h.head_dim];
    let (q, qt) = upload(&gpu, &q_shape, 11);
    let (k, kt) = upload(&gpu, &kv_shape, 12);
    let (v, vt) = upload(&gpu, &kv_shape, 13);
    let (d_o, dot) = upload(&gpu, &q_shape, 14);
    let f = Scalar::F32;
    let (ot, lset) = (
        Tensor::zeros(&gpu, &q_shape, f).unwrap(),
        Tensor::zeros(&gpu, &[b, s, h.n_heads], f).unwrap(),
    );
    let (dq, dk, dv) = (
        Tensor::zeros(&gpu, &q_shape, f).unwrap(),
        Tensor::zeros(&gpu, &kv_shape, f).unwrap(),
        Tensor::zeros(&gpu, &kv_shape, f).unwrap(),
    );
    let masks = Masks::new(true, false);
    let mut fwd = Forward::new(
        &gpu,
        ForwardSpec {
            head_dim: 64,
            head_dim_v: 64,
            masks,
            dtype: Dtype::F32,
        },
    )
    .unwrap();
    let set = kernels::BackwardKernels::compile((64, 64), masks).unwrap();
    let mut bwd = Backward::from_kernels(&gpu, &[set]).unwrap();
    let before = gpu.pipelines_created();
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    let fargs = ForwardArgs::new(&qt, &kt, &vt, &ot, &lset);
    fwd.record(&gpu, &mut encoder, &fargs).unwrap();
    let bargs = BackwardArgs {
        q: &qt,
        k: &kt,
        v: &vt,
        o: &ot,
        lse: &lset,
        d_o: &dot,
        dq: &dq,
        dk: &dk,
        dv: &dv,
        dbias: None,
        dsinks: None,
        flex_grads: &[],
        seg: None,
        scale: None,
        mods: Default::default(),
        accumulate: false,
    };
    let ran = bwd.record(&gpu, &mut encoder, &bargs, None).unwrap();
    // Compiled on first use: the forward's kernel, the schedule's kernels and (where the
    // schedule needs it) the prep, nothing else.
    let created = gpu.pipelines_created() - before;
    assert!((2..=4).contains(&created), "{created} pipelines for {ran}");
    submit(&gpu, encoder);
    // Steps after the first create nothing: no buffer (a `seg` uploaded per call cost a
    // buffer and a bind group), no uniform, no pipeline.
    let counts = |gpu: &Gpu| {
        (
            gpu.buffers_created(),
            gpu.uniforms_created(),
            gpu.pipelines_created(),
        )
    };
    let steady = counts(&gpu);
    for _ in 0..2 {
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        fwd.record(&gpu, &mut encoder, &fargs).unwrap();
        bwd.record(&gpu, &mut encoder, &bargs, None).unwrap();
        submit(&gpu, encoder);
    }
    assert_eq!(counts(&gpu), steady);
    // The same step through the host-slice API.
    let host_fwd = runtime::forward(
        &gpu,
        &Kernel::new(&gpu, fwd.kernel_for(&gpu, b, s, h).unwrap().abi())
            .block_on()
            .unwrap(),
        &ForwardInput {
            batch: b,
            seq_len: s,
            heads: h,
            q: &q,
            k: &k,
            v: &v,
            seg: None,
            scale: None,
            mods: Default::default(),
        },
    )
    .block_on()
    .unwrap();
    assert_eq!(read(&gpu, &ot), host_fwd.o);
    let input = BackwardInput {
        batch: b,
        seq_len: s,
        heads: h,
        q: &q,
        k: &k,
        v: &v,
        o: &host_fwd.o,
        lse: &host_fwd.lse,
        d_o: &d_o,
        seg: None,
        scale: None,
        mods: Default::default(),
    };
    let (host, _) = bwd
        .run(&gpu, &input, Some(ran), Dtype::F32)
        .block_on()
        .unwrap();
    let close = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max)
    };
    assert!(close(&read(&gpu, &dq), &host.dq) < 1e-5);
    assert!(close(&read(&gpu, &dk), &host.dk) < 1e-5);
    assert!(close(&read(&gpu, &dv), &host.dv) < 1e-5);
    // Overwrite means overwrite: a second step gives the same gradients, not twice them.
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    bwd.record(&gpu, &mut encoder, &bargs, Some(ran)).unwrap();
    submit(&gpu, encoder);
    assert!(close(&read(&gpu, &dq), &host.dq) < 1e-5);
    // dV bound to dK's buffer is refused before the gradients are cleared: the encoder
    // submitted after the refusal leaves dQ as the last step wrote it.
    let aliased = BackwardArgs { dv: &dk, ..bargs };
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    match bwd.record(&gpu, &mut encoder, &aliased, Some(ran)) {
        Err(Error::Input(InputError::Tensor(TensorError::Aliased { .. }))) => {}
        other => panic!("expected an aliasing error, got {other:?}"),
    }
    submit(&gpu, encoder);
    assert!(close(&read(&gpu, &dq), &host.dq) < 1e-5);
}

/// A cache of `slots` sequences, K `[slots, len, kv, head_dim]` and V `[slots, len, kv,
/// head_dim_v]` appended a row at a time after a prefill of `prompt` rows; returns the
/// decode of `q` against it.
fn decode_after_appends(
    gpu: &Gpu,
    (h, layout): (Heads, CacheLayout),
    (k, v, q): (&[f32], &[f32], &[f32]),
    (slots, len, prompt): (u32, u32, u32),
) -> Vec<f32> {
    let spec = f32_cache(h, slots, layout);
    let mut cache = KvCache::new(gpu, spec).unwrap();
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    for slot in 0..slots {
        cache.open(&mut encoder, slot).unwrap();
    }
    let rows = |data: &[f32], width: u32, from: u32, n: u32| -> Tensor {
        let row = (h.n_kv_heads * width) as usize;
        let mut out = Vec::new();
        for b in 0..slots as usize {
            let seq = &data[b * len as usize * row..][..len as usize * row];
            out.extend_from_slice(&seq[from as usize * row..][..n as usize * row]);
        }
        let shape = [slots, n, h.n_kv_heads, width];
        Tensor::from_f32(gpu, &shape, Scalar::F32, &out).unwrap()
    };
    let (dk, dv) = (h.head_dim, h.head_dim_v);
    let (k0, v0) = (rows(k, dk, 0, prompt), rows(v, dv, 0, prompt));
    cache.append(gpu, &mut encoder, 0, &k0, &v0).unwrap();
    for t in prompt..len {
        let (kt, vt) = (rows(k, dk, t, 1), rows(v, dv, t, 1));
        cache.append(gpu, &mut encoder, 0, &kt, &vt).unwrap();
    }
    assert_eq!(cache.len(slots - 1), Some(len));
    let cache_kind = match layout {
        CacheLayout::Contiguous { .. } => Cache::Contiguous,
        CacheLayout::Paged { .. } => Cache::Paged,
    };
    let mut decode = Decode::new(
        gpu,
        DecodeSpec {
            cache: cache_kind,
            ..DecodeSpec::new(dk, dv, Dtype::F32)
        },
    )
    .unwrap();
    let q_shape = [slots, h.n_heads, h.head_dim];
    let qt = Tensor::from_f32(gpu, &q_shape, Scalar::F32, q).unwrap();
    let ot = Tensor::zeros(gpu, &[slots, h.n_heads, dv], Scalar::F32).unwrap();
    let args = DecodeArgs {
        rows: Default::default(),
        q: &qt,
        cache: cache.view(),
        o: &ot,
        scale: None,
        mods: Default::default(),
        slice_len: None,
    };
    decode.record(gpu, &mut encoder, &args).unwrap();
    submit(gpu, encoder);
    read(gpu, &ot)
}

/// An fp8 cache (both formats, both layouts): the append stores each value over its
/// head's scale exactly as the float8 crate (CUDA's conversions) rounds it, the decode of
/// what the cache holds passes the check's rule against the f64 reference, and the paged
/// cache decodes to the same bits.
#[test]
fn fp8_cache_appends_round_as_cuda_and_decode_what_it_holds() {
    let gpu = gpu();
    let h = HEADS;
    let (slots, len, prompt) = (2, 45, 30);
    let kv = (slots * len * h.n_kv_heads * h.head_dim) as usize;
    // Values over e4m3's range after the scale (saturated), and tiny ones (subnormal).
    let mut k = random(kv, 31);
    k[0] = 900.0;
    k[1] = -1e-4;
    let v = random(kv, 32);
    let q = random((slots * h.n_heads * h.head_dim) as usize, 33);
    let problem = last_row(slots, len);
    let row = (h.n_kv_heads * h.head_dim) as usize;
    // Powers of two, so that x / scale is exact on every device and the bytes can be
    // compared: K's by KV head, V's for the whole tensor.
    let (k_scales, v_scales) = ([0.5, 0.25], [0.125]);
    for f in Fp8::ALL {
        let run = |layout| {
            let case = Fp8Case {
                heads: h,
                dtype: Dtype::F32,
                fp8: f,
                layout,
                batch: slots,
                len,
                prompt,
                scales: (&k_scales, &v_scales),
                mods: Default::default(),
            };
            kv_fp8::decode(&gpu, &case, [&q, &k, &v]).unwrap()
        };
        let held = run(CacheLayout::Contiguous { capacity: 64 });
        let paged = run(CacheLayout::Paged {
            page_size: 16,
            n_pages: 8,
            pages_per_seq: 4,
        });
        assert_eq!(
            paged.o, held.o,
            "{f:?}: the same rows in pages decode the same"
        );
        assert_eq!(
            (paged.k.clone(), paged.v.clone()),
            (held.k.clone(), held.v.clone())
        );
        for (i, (&x, &got)) in k.iter().zip(&held.k).enumerate() {
            let s = k_scales[(i % row) / h.head_dim as usize];
            assert_eq!(got, runtime::fp8::round(f, x / s) * s, "{f:?} K[{i}] = {x}");
        }
        for (&x, &got) in v.iter().zip(&held.v) {
            assert_eq!(got, runtime::fp8::round(f, x / 0.125) * 0.125, "{f:?} V");
        }
        if f == Fp8::E4m3 {
            assert_eq!(held.k[0], 448.0 * 0.5, "1800 saturates to e4m3's largest");
        }
        for (name, verdict) in judge_attention(&problem, [&q, &held.k, &held.v], &held.o, None) {
            assert!(verdict.pass(), "{f:?} {name}: {verdict:?}");
        }
        // One key: O is its V, so V's subnormal bytes must widen exactly (no flush to 0).
        let quantum = runtime::fp8::to_f32(f, 1);
        let tiny: Vec<f32> = (0..row)
            .map(|i| 0.125 * quantum * (1 + i % 7) as f32)
            .collect();
        let one = Fp8Case {
            heads: h,
            dtype: Dtype::F32,
            fp8: f,
            layout: CacheLayout::Contiguous { capacity: 4 },
            batch: 1,
            len: 1,
            prompt: 1,
            scales: (&k_scales, &v_scales),
            mods: Default::default(),
        };
        let q1 = &q[..(h.n_heads * h.head_dim) as usize];
        let run = kv_fp8::decode(&gpu, &one, [q1, &tiny[..row], &tiny[..row]]).unwrap();
        assert_eq!(run.v, tiny, "{f:?}: subnormals stored exactly");
        let per_kv = (h.n_heads / h.n_kv_heads) as usize;
        for (i, o) in run.o.iter().enumerate() {
            let (head, c) = (i / h.head_dim as usize, i % h.head_dim as usize);
            let want = tiny[(head / per_kv) * h.head_dim as usize + c];
            assert_eq!(*o, want, "{f:?}: O[{i}] is its key's subnormal V");
        }
    }
}

/// The decode of `slots` sequences of `len` keys as the reference sees it: the query as
/// the last row of a causal forward over the whole sequence.
fn last_row(slots: u32, len: u32) -> Problem<'static> {
    last_row_of(HEADS, slots, len)
}

fn last_row_of(h: Heads, slots: u32, len: u32) -> Problem<'static> {
    Problem {
        batch: slots as usize,
        n_q: 1,
        n_k: len as usize,
        n_heads: h.n_heads as usize,
        n_kv_heads: h.n_kv_heads as usize,
        head_dim: h.head_dim as usize,
        head_dim_v: h.head_dim_v as usize,
        scale: f64::from(h.default_scale()),
        q_pos: len as usize - 1,
        ..Problem::default()
    }
}

#[test]
fn appends_then_decode_equal_the_forwards_last_row_and_paged_equals_contiguous() {
    let gpu = gpu();
    let h = HEADS;
    let (slots, len, prompt) = (2, 45, 30);
    let kv = (slots * len * h.n_kv_heads * h.head_dim) as usize;
    let (k, v) = (random(kv, 21), random(kv, 22));
    let q = random((slots * h.n_heads * h.head_dim) as usize, 23);
    let contiguous = decode_after_appends(
        &gpu,
        (h, CacheLayout::Contiguous { capacity: 64 }),
        (&k, &v, &q),
        (slots, len, prompt),
    );
    // The query as the last row of a causal forward over the whole sequence.
    let problem = last_row(slots, len);
    for (name, verdict) in judge_attention(&problem, [&q, &k, &v], &contiguous, None) {
        assert!(verdict.pass(), "{name}: {verdict:?}");
    }
    let paged = decode_after_appends(
        &gpu,
        (
            h,
            CacheLayout::Paged {
                page_size: 16,
                n_pages: 8,
                pages_per_seq: 4,
            },
        ),
        (&k, &v, &q),
        (slots, len, prompt),
    );
    assert_eq!(paged, contiguous, "the same rows in pages decode the same");
}

/// MLA's widths: K rows of 192 beside V rows of 128 appended to a cache (each tensor at its
/// own width, contiguous and paged) decode to the reference's O of 128 columns; a V of K's
/// width is refused with the width named.
#[test]
fn a_cache_of_two_widths_appends_and_decodes() {
    let gpu = gpu();
    let h = Heads {
        head_dim: 192,
        head_dim_v: 128,
        ..HEADS
    };
    let (slots, len, prompt) = (2, 45, 30);
    let rows = slots * len * h.n_kv_heads;
    let (k, v) = (
        random((rows * h.head_dim) as usize, 41),
        random((rows * h.head_dim_v) as usize, 42),
    );
    let q = random((slots * h.n_heads * h.head_dim) as usize, 43);
    let run = |layout| decode_after_appends(&gpu, (h, layout), (&k, &v, &q), (slots, len, prompt));
    let contiguous = run(CacheLayout::Contiguous { capacity: 64 });
    assert_eq!(
        contiguous.len(),
        (slots * h.n_heads * h.head_dim_v) as usize
    );
    let problem = last_row_of(h, slots, len);
    for (name, verdict) in judge_attention(&problem, [&q, &k, &v], &contiguous, None) {
        assert!(verdict.pass(), "{name}: {verdict:?}");
    }
    let paged = run(CacheLayout::Paged {
        page_size: 16,
        n_pages: 8,
        pages_per_seq: 4,
    });
    assert_eq!(paged, contiguous, "the same rows in pages decode the same");
    let spec = f32_cache(h, slots, CacheLayout::Contiguous { capacity: 64 });
    let mut cache = KvCache::new(&gpu, spec).unwrap();
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    cache.open(&mut encoder, 0).unwrap();
    let wide = Tensor::zeros(&gpu, &[1, 1, h.n_kv_heads, h.head_dim], Scalar::F32).unwrap();
    let e = cache
        .append(&gpu, &mut encoder, 0, &wide, &wide)
        .unwrap_err();
    assert!(e.to_string().contains("v_new"), "{e}");
    assert!(e.to_string().contains("head_dim_v"), "{e}");
    assert_eq!(
        cache.len(0),
        Some(0),
        "a refused append leaves the cache as it was"
    );
}

#[test]
fn refused_cache_changes_leave_it_as_it_was() {
    let gpu = gpu();
    let h = HEADS;
    let spec = f32_cache(
        h,
        2,
        CacheLayout::Paged {
            page_size: 4,
            n_pages: 3,
            pages_per_seq: 2,
        },
    );
    let mut cache = KvCache::new(&gpu, spec).unwrap();
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    let rows = |slots, n| Tensor::zeros(&gpu, &[slots, n, 2, 64], Scalar::F32).unwrap();
    let cache_err = |r: Result<(), Error>| match r {
        Err(Error::Input(InputError::Cache(e))) => e,
        other => panic!("expected a cache error, got {other:?}"),
    };
    // A free slot takes no rows.
    let e = cache_err(cache.append(&gpu, &mut enc, 0, &rows(1, 1), &rows(1, 1)));
    assert_eq!(e, CacheError::Free { slot: 0 });
    cache.open(&mut enc, 0).unwrap();
    cache.open(&mut enc, 1).unwrap();
    // The cache's lifecycle answers in the one error type its appends do.
    assert_eq!(
        cache_err(cache.open(&mut enc, 1)),
        CacheError::Open { slot: 1 }
    );
    cache
        .append(&gpu, &mut enc, 0, &rows(2, 3), &rows(2, 3))
        .unwrap();
    assert_eq!((cache.len(0), cache.free_pages()), (Some(3), 1));
    // Past a slot's capacity (2 pages of 4): refused, nothing taken.
    let e = cache_err(cache.append(&gpu, &mut enc, 1, &rows(1, 6), &rows(1, 6)));
    assert!(
        matches!(
            e,
            CacheError::Full {
                slot: 1,
                len: 3,
                ..
            }
        ),
        "{e}"
    );
    // Both slots need a second page and one is free: refused, nothing taken.
    let e = cache_err(cache.append(&gpu, &mut enc, 0, &rows(2, 2), &rows(2, 2)));
    assert_eq!(e, CacheError::OutOfPages { needed: 2, free: 1 });
    assert_eq!(
        (cache.len(0), cache.len(1), cache.free_pages()),
        (Some(3), Some(3), 1)
    );
    // Past the slots.
    let e = cache_err(cache.append(&gpu, &mut enc, 1, &rows(2, 1), &rows(2, 1)));
    assert!(matches!(e, CacheError::Slots { .. }), "{e}");
    // Wrong dtype.
    let half = Tensor::zeros(&gpu, &[1, 1, 2, 64], Scalar::F16).unwrap();
    match cache.append(&gpu, &mut enc, 0, &half, &half) {
        Err(Error::Input(InputError::Tensor(TensorError::Dtype { .. }))) => {}
        other => panic!("expected a dtype error, got {other:?}"),
    }
    // Freed: its pages return, and it takes no more rows.
    cache.free(&mut enc, 1).unwrap();
    assert_eq!((cache.len(1), cache.free_pages()), (None, 2));
    let e = cache_err(cache.append(&gpu, &mut enc, 1, &rows(1, 1), &rows(1, 1)));
    assert_eq!(e, CacheError::Free { slot: 1 });
    assert_eq!(
        cache_err(cache.free(&mut enc, 1)),
        CacheError::AlreadyFree { slot: 1 }
    );
    // Slots at the end of u32's range: refused, not overflowed.
    let e = cache_err(cache.open(&mut enc, u32::MAX));
    assert!(matches!(e, CacheError::Slots { .. }), "{e}");
    let e = cache_err(cache.free(&mut enc, u32::MAX));
    assert!(matches!(e, CacheError::Slots { .. }), "{e}");
    // No sequences, or no rows: nothing recorded, the lengths where they were.
    cache
        .append(&gpu, &mut enc, 0, &rows(0, 2), &rows(0, 2))
        .unwrap();
    cache
        .append(&gpu, &mut enc, 0, &rows(1, 0), &rows(1, 0))
        .unwrap();
    assert_eq!(cache.len(0), Some(3));
    submit(&gpu, enc);
    assert_eq!(
        runtime::block_on(cache.lengths().to_u32(&gpu)).unwrap(),
        [3, 0]
    );
    // And the next append lands after them.
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    cache
        .append(&gpu, &mut enc, 0, &rows(1, 1), &rows(1, 1))
        .unwrap();
    submit(&gpu, enc);
    assert_eq!(
        runtime::block_on(cache.lengths().to_u32(&gpu)).unwrap(),
        [4, 0]
    );
}

#[test]
fn a_decode_loop_creates_nothing_in_its_steady_state() {
    let gpu = gpu();
    let h = HEADS;
    let slots = 2;
    let spec = f32_cache(h, slots, CacheLayout::Contiguous { capacity: 128 });
    let mut cache = KvCache::new(&gpu, spec).unwrap();
    let mut decode = Decode::new(&gpu, DecodeSpec::new(64, 64, Dtype::F32)).unwrap();
    let mut rope = Rope::new(&gpu, RopeSpec::new(64)).unwrap();
    let q = Tensor::zeros(&gpu, &[slots, 1, h.n_heads, h.head_dim], Scalar::F32).unwrap();
    let k = Tensor::zeros(&gpu, &[slots, 1, h.n_kv_heads, h.head_dim], Scalar::F32).unwrap();
    let o = Tensor::zeros(&gpu, &[slots, h.n_heads, h.head_dim], Scalar::F32).unwrap();
    let q3 = q.reshape(&[slots, h.n_heads, h.head_dim]).unwrap();
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    cache.open(&mut enc, 0).unwrap();
    cache.open(&mut enc, 1).unwrap();
    submit(&gpu, enc);
    let mut counts = Vec::new();
    // Steps 33..64 share the grid bound 64: the same uniforms, the same bind groups.
    for step in 0..64 {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for x in [&q, &k] {
            let args = RopeArgs {
                x,
                positions: cache.lengths(),
                base: 10000.0,
            };
            rope.record(&gpu, &mut enc, &args).unwrap();
        }
        cache.append(&gpu, &mut enc, 0, &k, &k).unwrap();
        let args = DecodeArgs {
            rows: Default::default(),
            q: &q3,
            cache: cache.view(),
            o: &o,
            scale: None,
            mods: Default::default(),
            slice_len: None,
        };
        decode.record(&gpu, &mut enc, &args).unwrap();
        submit(&gpu, enc);
        if step >= 33 {
            counts.push((
                gpu.uniforms_created(),
                gpu.pipelines_created(),
                gpu.buffers_created(),
            ));
        }
    }
    assert!(counts.windows(2).all(|w| w[0] == w[1]), "{counts:?}");
    assert_eq!(cache.len(1), Some(64));
}

/// Decode steps (RoPE, the cache's append, decode) recorded into one compute pass through
/// a `Recorder`, the slot opened in it too, against the same steps op by op: the same
/// outputs, bit for bit, every step (each step's decode reads the row its append wrote; a
/// paged append that takes a page copies the block table, ending the recorder's pass).
#[test]
fn a_step_in_one_compute_pass_equals_the_step_op_by_op() {
    let gpu = gpu();
    let h = HEADS;
    let layout = CacheLayout::Paged {
        page_size: 16,
        n_pages: 4,
        pages_per_seq: 4,
    };
    let mut caches = [(); 2].map(|_| KvCache::new(&gpu, f32_cache(h, 1, layout)).unwrap());
    let mut ops = (
        Rope::new(&gpu, RopeSpec::new(64)).unwrap(),
        Decode::new(
            &gpu,
            DecodeSpec {
                cache: Cache::Paged,
                ..DecodeSpec::new(64, 64, Dtype::F32)
            },
        )
        .unwrap(),
    );
    let o = Tensor::zeros(&gpu, &[1, h.n_heads, h.head_dim], Scalar::F32).unwrap();
    for step in 0..20u64 {
        let mut got = Vec::new();
        for (shared, cache) in caches.iter_mut().enumerate() {
            // RoPE rotates in place: each recording rotates its own upload of the rows.
            let q = upload(&gpu, &[1, 1, h.n_heads, h.head_dim], 100 + step).1;
            let k = upload(&gpu, &[1, 1, h.n_kv_heads, h.head_dim], 200 + step).1;
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            match shared == 1 {
                true => decode_step(
                    &gpu,
                    &mut Recorder::new(&mut enc),
                    &mut ops,
                    cache,
                    [&q, &k, &o],
                    step == 0,
                ),
                false => decode_step(&gpu, &mut enc, &mut ops, cache, [&q, &k, &o], step == 0),
            }
            submit(&gpu, enc);
            got.push(read(&gpu, &o));
        }
        assert_eq!(got[0], got[1], "step {step}");
        assert!(
            got[0].iter().all(|x| x.is_finite() && *x != 0.0),
            "step {step}"
        );
    }
}

/// One decode step of one sequence into `rec` (its slot opened first where `open`).
fn decode_step(
    gpu: &Gpu,
    rec: &mut impl Record,
    (rope, decode): &mut (Rope, Decode),
    cache: &mut KvCache,
    [q, k, o]: [&Tensor; 3],
    open: bool,
) {
    if open {
        cache.open(rec, 0).unwrap();
    }
    for x in [q, k] {
        let args = RopeArgs {
            x,
            positions: cache.lengths(),
            base: 10000.0,
        };
        rope.record(gpu, rec, &args).unwrap();
    }
    cache.append(gpu, rec, 0, k, k).unwrap();
    let args = DecodeArgs {
        rows: Default::default(),
        q: &q.reshape(o.shape()).unwrap(),
        cache: cache.view(),
        o,
        scale: None,
        mods: Default::default(),
        slice_len: None,
    };
    decode.record(gpu, rec, &args).unwrap();
}

/// One decode step on a fresh cache and fresh ops: its output and the pipelines created.
fn fresh_decode_step(gpu: &Gpu, k: &Tensor, q: &Tensor) -> (Vec<f32>, u64) {
    let before = gpu.pipelines_created();
    let spec = f32_cache(HEADS, 1, CacheLayout::Contiguous { capacity: 16 });
    let mut cache = KvCache::new(gpu, spec).unwrap();
    let mut decode = Decode::new(gpu, DecodeSpec::new(64, 64, Dtype::F32)).unwrap();
    let o = Tensor::zeros(gpu, &[1, HEADS.n_heads, HEADS.head_dim], Scalar::F32).unwrap();
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    cache.open(&mut enc, 0).unwrap();
    cache.append(gpu, &mut enc, 0, k, k).unwrap();
    let args = DecodeArgs {
        rows: Default::default(),
        q,
        cache: cache.view(),
        o: &o,
        scale: None,
        mods: Default::default(),
        slice_len: None,
    };
    decode.record(gpu, &mut enc, &args).unwrap();
    submit(gpu, enc);
    (read(gpu, &o), gpu.pipelines_created() - before)
}

#[test]
fn ops_built_again_on_a_device_reuse_its_pipelines() {
    let gpu = gpu();
    let (_, k) = upload(&gpu, &[1, 1, HEADS.n_kv_heads, HEADS.head_dim], 1);
    let (_, q) = upload(&gpu, &[1, HEADS.n_heads, HEADS.head_dim], 2);
    let (first, compiled) = fresh_decode_step(&gpu, &k, &q);
    assert!(
        compiled > 0,
        "the first cache and decode compile their kernels"
    );
    let kept = gpu.pipelines_kept();
    let (again, compiled_again) = fresh_decode_step(&gpu, &k, &q);
    assert_eq!(
        compiled_again, 0,
        "a second cache and decode compiled again"
    );
    assert_eq!(gpu.pipelines_kept(), kept);
    assert_eq!(first, again);
    // Another device compiles its own.
    let other = self::gpu();
    let (_, k2) = upload(&other, &[1, 1, HEADS.n_kv_heads, HEADS.head_dim], 1);
    let (_, q2) = upload(&other, &[1, HEADS.n_heads, HEADS.head_dim], 2);
    let (on_other, compiled_other) = fresh_decode_step(&other, &k2, &q2);
    assert_eq!(compiled_other, compiled);
    assert_eq!(on_other, first);
}

#[test]
fn a_callers_device_is_checked_for_what_each_kernel_needs() {
    let (adapter, [(device, queue), _]) = two_devices();
    let gpu = Gpu::from_wgpu(
        &adapter,
        device.clone(),
        queue.clone(),
        [&kernels::attention_forward::ABI],
    )
    .unwrap();
    // The flash backward (c) binds 9 storage buffers, one over the default.
    match Gpu::from_wgpu(
        &adapter,
        device.clone(),
        queue.clone(),
        [&kernels::attention_backward_flash::ABI],
    ) {
        Err(Error::Device(DeviceError::DeviceLimit { what, .. })) => {
            assert_eq!(what, "max_storage_buffers_per_shader_stage")
        }
        Err(e) => panic!("expected a limit error, got {e}"),
        Ok(_) => panic!("expected a limit error"),
    }
    match Gpu::from_wgpu(
        &adapter,
        device,
        queue,
        [&kernels::attention_forward_flash_f16::ABI],
    ) {
        Err(Error::Device(DeviceError::MissingFeature { feature, .. })) => {
            assert_eq!(feature, "SHADER_F16")
        }
        Err(e) => panic!("expected a feature error, got {e}"),
        Ok(_) => panic!("expected a feature error"),
    }
    // The page's device runs the portable forward.
    let (b, s, h) = (1, 9, HEADS);
    let (_, q) = upload(&gpu, &[b, s, 4, 64], 1);
    let (_, k) = upload(&gpu, &[b, s, 2, 64], 2);
    let o = Tensor::zeros(&gpu, &[b, s, 4, 64], Scalar::F32).unwrap();
    let lse = Tensor::zeros(&gpu, &[b, s, 4], Scalar::F32).unwrap();
    let mut fwd = Forward::from_kernel(
        &Kernel::new(&gpu, &kernels::attention_forward::ABI)
            .block_on()
            .unwrap(),
    )
    .unwrap();
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    let args = ForwardArgs::new(&q, &k, &k, &o, &lse);
    fwd.record(&gpu, &mut enc, &args).unwrap();
    submit(&gpu, enc);
    assert!(read(&gpu, &lse).iter().all(|x| x.is_finite()));
    let _ = h;
}

#[test]
fn conversions_round_to_nearest_even_and_widen_back() {
    let gpu = gpu();
    let data = random(64, 31);
    let src = Tensor::from_f32(&gpu, &[4, 16], Scalar::F32, &data).unwrap();
    for dtype in [Dtype::Bf16, Dtype::F16] {
        if dtype == Dtype::F16 && !gpu.has_f16() {
            continue;
        }
        let scalar = match dtype {
            Dtype::F16 => Scalar::F16,
            _ => Scalar::Bf16,
        };
        let mut convert = runtime::ops::convert::Convert::new(&gpu, dtype).unwrap();
        let half = Tensor::zeros(&gpu, &[4, 16], scalar).unwrap();
        let back = Tensor::zeros(&gpu, &[4, 16], Scalar::F32).unwrap();
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        let there = ConvertArgs {
            src: &src,
            dst: &half,
        };
        convert.record(&gpu, &mut enc, &there).unwrap();
        let back_again = ConvertArgs {
            src: &half,
            dst: &back,
        };
        convert.record(&gpu, &mut enc, &back_again).unwrap();
        // No elements: nothing recorded (a binding of none is smaller than the kernel's
        // vec4, which the encoder would refuse at its end).
        let (none, none_half) = (
            Tensor::zeros(&gpu, &[0], Scalar::F32).unwrap(),
            Tensor::zeros(&gpu, &[0], scalar).unwrap(),
        );
        let empty = ConvertArgs {
            src: &none,
            dst: &none_half,
        };
        convert.record(&gpu, &mut enc, &empty).unwrap();
        submit(&gpu, enc);
        let want: Vec<f32> = data
            .iter()
            .map(|x| match dtype {
                Dtype::F16 => half::f16::from_f32(*x).to_f32(),
                _ => half::bf16::from_f32(*x).to_f32(),
            })
            .collect();
        assert_eq!(read(&gpu, &back), want, "{dtype:?}");
        assert_eq!(read(&gpu, &half), want, "{dtype:?}");
    }
}

/// With sinks the recording API asks for dSinks and refuses what does not match, naming
/// it; given both, dSinks on the device equals the host-slice call's.
#[test]
fn sinks_need_dsinks_on_the_device_and_match_the_host_call() {
    let gpu = gpu();
    let (b, s, h) = (1, 30, HEADS);
    let q_shape = [b, s, h.n_heads, h.head_dim];
    let kv_shape = [b, s, h.n_kv_heads, h.head_dim];
    let [(q, qt), (k, kt), (v, vt), (d_o, dot)] = [
        (&q_shape, 31),
        (&kv_shape, 32),
        (&kv_shape, 33),
        (&q_shape, 34),
    ]
    .map(|(shape, seed)| upload(&gpu, shape, seed));
    let logits = [0.5f32, -1.0, 2.0, 0.0];
    let f = Scalar::F32;
    let sinks = Tensor::from_f32(&gpu, &[h.n_heads], f, &logits).unwrap();
    let dsinks = Tensor::zeros(&gpu, &[h.n_heads], f).unwrap();
    let masks = Masks {
        sinks: true,
        ..Masks::new(true, false)
    };
    let mods = runtime::DeviceModifiers {
        sinks: Some(&sinks),
        ..Default::default()
    };
    let (ot, lset) = (
        Tensor::zeros(&gpu, &q_shape, f).unwrap(),
        Tensor::zeros(&gpu, &[b, s, h.n_heads], f).unwrap(),
    );
    let spec = ForwardSpec {
        head_dim: 64,
        head_dim_v: 64,
        masks,
        dtype: Dtype::F32,
    };
    let mut fwd = Forward::new(&gpu, spec).unwrap();
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    let fargs = ForwardArgs {
        mods,
        ..ForwardArgs::new(&qt, &kt, &vt, &ot, &lset)
    };
    fwd.record(&gpu, &mut encoder, &fargs).unwrap();
    submit(&gpu, encoder);
    let grads =
        [&q_shape, &kv_shape, &kv_shape].map(|shape| Tensor::zeros(&gpu, shape, f).unwrap());
    let set = kernels::BackwardKernels::compile((64, 64), masks).unwrap();
    let mut bwd = Backward::from_kernels(&gpu, &[set]).unwrap();
    let bargs = |with_dsinks: bool, with_sinks: bool| BackwardArgs {
        q: &qt,
        k: &kt,
        v: &vt,
        o: &ot,
        lse: &lset,
        d_o: &dot,
        dq: &grads[0],
        dk: &grads[1],
        dv: &grads[2],
        dbias: None,
        flex_grads: &[],
        dsinks: with_dsinks.then_some(&dsinks),
        seg: None,
        scale: None,
        mods: if with_sinks { mods } else { Default::default() },
        accumulate: false,
    };
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    let missing = bwd.record(&gpu, &mut encoder, &bargs(false, true), None);
    assert!(
        missing
            .as_ref()
            .is_err_and(|e| e.to_string().contains("dsinks")),
        "{missing:?}"
    );
    let unasked = bwd.record(&gpu, &mut encoder, &bargs(true, false), None);
    assert!(
        unasked
            .as_ref()
            .is_err_and(|e| e.to_string().contains("sinks")),
        "{unasked:?}"
    );
    bwd.record(&gpu, &mut encoder, &bargs(true, true), None)
        .unwrap();
    submit(&gpu, encoder);
    let on_device = read(&gpu, &dsinks);
    assert!(on_device.iter().all(|x| *x != 0.0), "{on_device:?}");

    let (o, lse) = (read(&gpu, &ot), read(&gpu, &lset));
    let input = BackwardInput {
        batch: b,
        seq_len: s,
        heads: h,
        q: &q,
        k: &k,
        v: &v,
        o: &o,
        lse: &lse,
        d_o: &d_o,
        seg: None,
        scale: None,
        mods: runtime::Modifiers {
            sinks: Some(&logits),
            ..Default::default()
        },
    };
    let (host, _) = bwd.run(&gpu, &input, None, Dtype::F32).block_on().unwrap();
    assert_eq!(host.dsinks, on_device);
}

/// A continued cache's bad input, each a typed error before anything is recorded: n = 0,
/// rows past a slot's capacity, Q of the wrong width or dtype, a free slot, a ragged
/// batch whose starts decrease or overrun Q. The cache's lengths and O stay as they were.
#[test]
fn refused_continuations_leave_the_cache_and_o_as_they_were() {
    use runtime::ops::cache::ExtendArgs;
    use runtime::ops::decode::{CacheView, QueryRows};
    let gpu = gpu();
    let h = HEADS;
    let spec = f32_cache(h, 2, CacheLayout::Contiguous { capacity: 8 });
    let mut cache = KvCache::new(&gpu, spec).unwrap();
    let mut decode = Decode::new(&gpu, DecodeSpec::new(64, 64, Dtype::F32)).unwrap();
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    cache.open(&mut enc, 0).unwrap();
    let kv = |n| Tensor::zeros(&gpu, &[1, n, h.n_kv_heads, h.head_dim], Scalar::F32).unwrap();
    cache.append(&gpu, &mut enc, 0, &kv(5), &kv(5)).unwrap();
    submit(&gpu, enc);
    let (_, o) = upload(&gpu, &[1, 4, h.n_heads, h.head_dim], 9);
    let before = read(&gpu, &o);
    let q = |n, d, s| Tensor::zeros(&gpu, &[1, n, h.n_heads, d], s).unwrap();
    let extend = |cache: &mut KvCache, decode: &mut Decode, slot, n, q: &Tensor| {
        let (k, v) = (kv(n), kv(n));
        let args = ExtendArgs {
            k_new: &k,
            v_new: &v,
            q,
            o: &o,
            scale: None,
            mods: Default::default(),
        };
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        let r = cache
            .extend(&gpu, &mut enc, decode, slot, &args)
            .map(|_| ());
        submit(&gpu, enc);
        r
    };
    let input = |r: Result<(), Error>| match r {
        Err(Error::Input(e)) => e,
        other => panic!("expected an input error, got {other:?}"),
    };
    assert!(matches!(
        input(extend(
            &mut cache,
            &mut decode,
            0,
            0,
            &q(0, 64, Scalar::F32)
        )),
        InputError::QueryRows(_) | InputError::Tensor(_)
    ));
    assert!(matches!(
        input(extend(
            &mut cache,
            &mut decode,
            0,
            4,
            &q(4, 64, Scalar::F32)
        )),
        InputError::Cache(CacheError::Full {
            slot: 0,
            len: 5,
            adding: 4,
            capacity: 8
        })
    ));
    let e = input(extend(
        &mut cache,
        &mut decode,
        0,
        3,
        &q(3, 32, Scalar::F32),
    ));
    assert!(
        matches!(e, InputError::HeadDim { .. } | InputError::Tensor(_)),
        "{e}"
    );
    assert!(matches!(
        input(extend(
            &mut cache,
            &mut decode,
            0,
            3,
            &q(3, 64, Scalar::F16)
        )),
        InputError::Tensor(TensorError::Dtype { .. })
    ));
    assert!(matches!(
        input(extend(
            &mut cache,
            &mut decode,
            1,
            3,
            &q(3, 64, Scalar::F32)
        )),
        InputError::Cache(CacheError::Free { slot: 1 })
    ));
    // Q in O's buffer: refused by the attention's binding checks, before the append that
    // would otherwise have been recorded ahead of them.
    let (k, v, o3) = (
        kv(3),
        kv(3),
        o.view(&[1, 3, h.n_heads, h.head_dim]).unwrap(),
    );
    let args = ExtendArgs {
        k_new: &k,
        v_new: &v,
        q: &o3,
        o: &o3,
        scale: None,
        mods: Default::default(),
    };
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    let e = input(
        cache
            .extend(&gpu, &mut enc, &mut decode, 0, &args)
            .map(|_| ()),
    );
    assert!(
        matches!(e, InputError::Tensor(TensorError::Aliased { .. })),
        "{e}"
    );
    submit(&gpu, enc);
    assert_eq!(cache.len(0), Some(5));
    assert_eq!(
        runtime::block_on(cache.lengths().to_u32(&gpu)).unwrap(),
        [5, 0]
    );
    // Ragged starts that decrease, or end past Q's rows.
    let q3 = Tensor::zeros(&gpu, &[4, h.n_heads, h.head_dim], Scalar::F32).unwrap();
    let o3 = o.reshape(&[4, h.n_heads, h.head_dim]).unwrap();
    for starts in [&[0u32, 3, 2][..], &[0, 2, 5], &[1, 4], &[0]] {
        let args = DecodeArgs {
            q: &q3,
            rows: QueryRows::Ragged(starts),
            cache: CacheView {
                max_len: 8,
                ..cache.view()
            },
            o: &o3,
            scale: None,
            mods: Default::default(),
            slice_len: None,
        };
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        let e = input(decode.record(&gpu, &mut enc, &args).map(|_| ()));
        assert!(matches!(e, InputError::QueryRows(_)), "{starts:?}: {e}");
    }
    assert_eq!(read(&gpu, &o), before);
}

/// Tensors of another device (made there by the runtime, or read back here) are typed
/// errors from every op before anything is recorded: the encoder stays valid and submits.
/// The other device is of the same wgpu Instance, then of another one (whose first device
/// has the same id as this one's).
#[test]
fn tensors_of_another_device_are_refused_by_every_op() {
    let (adapter, [a, b]) = two_devices();
    let here = Gpu::from_wgpu(&adapter, a.0, a.1, []).unwrap();
    let there = Gpu::from_wgpu(&adapter, b.0, b.1, []).unwrap();
    every_op_refuses_tensors_of(&here, &there);
    let (adapter, [a]) = devices::<1>();
    let (other_adapter, [b]) = devices::<1>();
    let here = Gpu::from_wgpu(&adapter, a.0, a.1, []).unwrap();
    let there = Gpu::from_wgpu(&other_adapter, b.0, b.1, []).unwrap();
    every_op_refuses_tensors_of(&here, &there);
}

fn every_op_refuses_tensors_of(here: &Gpu, there: &Gpu) {
    use runtime::ops::convert::Convert;
    use runtime::ops::linear::{Linear, LinearArgs, LinearSpec};
    let f = Scalar::F32;
    let (n, d) = (8, 64);
    let shape = [1, n, 2, d];
    let [ka, va, oa] = [0; 3].map(|_| Tensor::zeros(here, &shape, f).unwrap());
    let lse = Tensor::zeros(here, &[1, n, 2], f).unwrap();
    let qb = Tensor::zeros(there, &shape, f).unwrap();
    let is_foreign = |r: Result<(), Error>, what: &str| match r {
        Err(Error::Input(InputError::Tensor(TensorError::Device { .. }))) => {}
        other => panic!("{what}: {other:?}"),
    };
    let scope = here.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let mut enc = here.device.create_command_encoder(&Default::default());
    let spec = ForwardSpec::new(d, Masks::new(true, false), Dtype::F32);
    let mut fwd = Forward::new(here, spec).unwrap();
    is_foreign(
        fwd.record(here, &mut enc, &ForwardArgs::new(&qb, &ka, &va, &oa, &lse)),
        "forward",
    );
    let positions = Tensor::from_u32(there, &[1], &[0]).unwrap();
    let x = qb.reshape(&[1, n, 2, d]).unwrap();
    let args = RopeArgs {
        x: &x,
        positions: &positions,
        base: 10000.0,
    };
    is_foreign(
        Rope::new(here, RopeSpec::new(d))
            .unwrap()
            .record(here, &mut enc, &args),
        "rope",
    );
    let half = Tensor::zeros(here, &shape, Scalar::Bf16).unwrap();
    is_foreign(
        Convert::new(here, Dtype::Bf16).unwrap().record(
            here,
            &mut enc,
            &ConvertArgs {
                src: &qb,
                dst: &half,
            },
        ),
        "convert",
    );
    let spec = LinearSpec::new(d, 16, Dtype::F32);
    let (xl, yl) = (
        Tensor::zeros(there, &[2, d], f).unwrap(),
        Tensor::zeros(here, &[2, 16], f).unwrap(),
    );
    let w = Tensor::zeros(here, &[16, d], f).unwrap();
    let args = LinearArgs {
        x: &xl,
        w: &w,
        b: None,
        y: &yl,
    };
    is_foreign(
        Linear::new(here, spec)
            .unwrap()
            .record(here, &mut enc, &args),
        "linear",
    );
    let spec = CacheSpec {
        slots: 1,
        n_kv_heads: 2,
        head_dim: d,
        head_dim_v: d,
        dtype: Dtype::F32,
        layout: CacheLayout::Contiguous { capacity: 16 },
        kv_fp8: None,
    };
    let mut cache = KvCache::new(here, spec).unwrap();
    cache.open(&mut enc, 0).unwrap();
    let kb = Tensor::zeros(there, &[1, 1, 2, d], f).unwrap();
    is_foreign(cache.append(here, &mut enc, 0, &kb, &kb), "append");
    assert_eq!(cache.len(0), Some(0), "a refused append leaves the length");
    let mut decode = Decode::new(here, DecodeSpec::new(d, d, Dtype::F32)).unwrap();
    let (q3, o3) = (
        Tensor::zeros(there, &[1, 4, d], f).unwrap(),
        Tensor::zeros(here, &[1, 4, d], f).unwrap(),
    );
    let args = DecodeArgs {
        q: &q3,
        rows: Default::default(),
        cache: cache.view(),
        o: &o3,
        scale: None,
        mods: Default::default(),
        slice_len: None,
    };
    is_foreign(decode.record(here, &mut enc, &args).map(|_| ()), "decode");
    is_foreign(
        qb.to_f32(here).block_on().map(|_| ()),
        "a readback on the wrong device",
    );
    here.queue.submit([enc.finish()]);
    let error = scope.pop().block_on();
    assert!(error.is_none(), "the encoder was invalidated: {error:?}");
}

/// Each of `others` read back equals `base` within 1e-5 (f32 paths of the same rows).
fn agree<'a>(
    gpu: &Gpu,
    (base, name): (&[f32], &str),
    others: impl Iterator<Item = (&'a Tensor, &'a str)>,
    layout: &CacheLayout,
) {
    for (o, what) in others {
        let other = read(gpu, o);
        let diff = base.iter().zip(&other).map(|(x, y)| (x - y).abs());
        let worst = diff.fold(0.0, f32::max);
        assert!(
            worst < 1e-5,
            "{layout:?}: {name} and the {what} differ by {worst}"
        );
    }
}

/// Two slots of 160 rows, contiguous and in 16-row pages, each with its f32 decode at
/// head_dim 64.
fn two_slot_layouts() -> [(CacheLayout, DecodeSpec); 2] {
    let paged = CacheLayout::Paged {
        page_size: 16,
        n_pages: 2 * 160 / 16,
        pages_per_seq: 160 / 16,
    };
    [
        (CacheLayout::Contiguous { capacity: 160 }, Cache::Contiguous),
        (paged, Cache::Paged),
    ]
    .map(|(layout, cache)| {
        let spec = DecodeSpec {
            cache,
            ..DecodeSpec::new(64, 64, Dtype::F32)
        };
        (layout, spec)
    })
}

/// A decode of `rows` of `q` over `cache` into a fresh O (shaped as Q, head_dim wide),
/// recorded into `enc`: on the split-K passes where `split`, else as planned, with
/// `slice_len` asked. Returns O and how many slices it ran in.
fn decode_fresh(
    gpu: &Gpu,
    (spec, enc): (DecodeSpec, &mut wgpu::CommandEncoder),
    (q, rows, cache): (
        &Tensor,
        runtime::ops::decode::QueryRows,
        runtime::ops::decode::CacheView,
    ),
    (split, slice_len): (bool, Option<u32>),
) -> (Tensor, u32) {
    let o = Tensor::zeros(gpu, q.shape(), Scalar::F32).unwrap();
    let mut op = Decode::new(gpu, spec).unwrap();
    if split {
        op = op.without_chunks();
    }
    let args = DecodeArgs {
        q,
        rows,
        cache,
        o: &o,
        scale: None,
        mods: Default::default(),
        slice_len,
    };
    let ran = op.record(gpu, enc, &args).unwrap();
    (o, ran.n_slices)
}

/// A continuation of many rows (a prompt's chunk) runs on the forward's tiles and equals
/// the split-K decode of the same rows over the same cache, and the chunk in one slice and
/// cut into key slices, in both layouts: each slot at its own cached length, one of them
/// empty before the chunk.
#[test]
fn a_chunk_equals_the_split_decode_of_its_rows() {
    use runtime::ops::cache::ExtendArgs;
    use runtime::ops::decode::QueryRows;
    use runtime::ops::extend::CHUNK_ROWS;
    let gpu = gpu();
    let h = HEADS;
    let n = CHUNK_ROWS + 3;
    for (layout, spec) in two_slot_layouts() {
        let mut cache = KvCache::new(&gpu, f32_cache(h, 2, layout)).unwrap();
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for slot in 0..2 {
            cache.open(&mut enc, slot).unwrap();
        }
        let kv = |rows, seed| upload(&gpu, &[1, rows, h.n_kv_heads, h.head_dim], seed).1;
        let (k0, v0) = (kv(70, 1), kv(70, 2));
        cache.append(&gpu, &mut enc, 0, &k0, &v0).unwrap();
        let rows = [2, n, h.n_kv_heads, h.head_dim];
        let (k, v) = (upload(&gpu, &rows, 3).1, upload(&gpu, &rows, 4).1);
        let (_, q) = upload(&gpu, &[2, n, h.n_heads, h.head_dim], 5);
        let chunk_o = Tensor::zeros(&gpu, &[2, n, h.n_heads, h.head_dim], Scalar::F32).unwrap();
        let mut decode = Decode::new(&gpu, spec).unwrap();
        let args = ExtendArgs {
            k_new: &k,
            v_new: &v,
            q: &q,
            o: &chunk_o,
            scale: None,
            mods: Default::default(),
        };
        cache.extend(&gpu, &mut enc, &mut decode, 0, &args).unwrap();
        // The same rows again: split-K, the chunk in one slice, and cut into 64-key slices.
        let others = [(true, None), (false, Some(u32::MAX)), (false, Some(64))];
        let outputs = others.map(|run| {
            let rows = (&q, QueryRows::Each(n), cache.view());
            let (o, slices) = decode_fresh(&gpu, (spec, &mut enc), rows, run);
            let one = run.1 == Some(u32::MAX);
            assert_eq!(slices == 1, one, "{layout:?}: {run:?}");
            o
        });
        submit(&gpu, enc);
        assert_eq!(cache.len(0), Some(70 + n));
        let chunk = read(&gpu, &chunk_o);
        assert!(
            chunk.iter().any(|x| *x != 0.0),
            "{layout:?}: the chunk wrote O"
        );
        let others = ["split-K", "one-slice chunk", "sliced chunk"];
        agree(
            &gpu,
            (&chunk, "the chunk"),
            outputs.iter().zip(others),
            &layout,
        );
    }
}

/// A ragged batch of many rows (a prompt's chunk beside a fresh slot's few: vLLM's and
/// FlashInfer's layout) runs on the forward's tiles, each sequence's rows from its start,
/// and equals the split-K decode of the same rows, whole, in one slice and cut into key
/// slices, in both layouts.
#[test]
fn a_ragged_chunk_equals_the_split_decode_of_its_rows() {
    use runtime::ops::decode::QueryRows;
    use runtime::ops::extend::CHUNK_ROWS;
    let gpu = gpu();
    let h = HEADS;
    let (long, short) = (CHUNK_ROWS + 3, 5);
    let starts = [0, long, long + short];
    for (layout, spec) in two_slot_layouts() {
        let mut cache = KvCache::new(&gpu, f32_cache(h, 2, layout)).unwrap();
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        let kv = |rows, seed| upload(&gpu, &[1, rows, h.n_kv_heads, h.head_dim], seed).1;
        for (slot, rows) in [(0, 70 + long), (1, short)] {
            cache.open(&mut enc, slot).unwrap();
            let (k, v) = (kv(rows, 1 + slot as u64), kv(rows, 3 + slot as u64));
            cache.append(&gpu, &mut enc, slot, &k, &v).unwrap();
        }
        let (_, q) = upload(&gpu, &[long + short, h.n_heads, h.head_dim], 5);
        let runs = [
            (true, None),
            (false, None),
            (false, Some(u32::MAX)),
            (false, Some(64)),
        ];
        let mut kept = Vec::new();
        let outputs = runs.map(|run| {
            kept.push(gpu.pipelines_kept());
            let rows = (&q, QueryRows::Ragged(&starts), cache.view());
            let (o, slices) = decode_fresh(&gpu, (spec, &mut enc), rows, run);
            if run.1 == Some(u32::MAX) {
                assert_eq!(slices, 1, "{layout:?}: the chunk in one slice");
            }
            o
        });
        // The planned chunk compiled the ragged tiles' kernel; the split-K passes had not.
        assert!(
            gpu.pipelines_kept() > kept[1],
            "{layout:?}: no chunk kernel"
        );
        submit(&gpu, enc);
        let split = read(&gpu, &outputs[0]);
        assert!(
            split.iter().all(|x| *x != 0.0),
            "{layout:?}: every row written"
        );
        let others = ["planned chunk", "one-slice chunk", "sliced chunk"];
        let split_k = (&split[..], "the split-K decode");
        agree(&gpu, split_k, outputs[1..].iter().zip(others), &layout);
    }
}

/// A split-K decode whose modifiers read three tensors binds 9 storage buffers, past
/// WebGPU's default 8: built for just what it binds, it runs on an adapter that has them
/// (lavapipe), and equals the same score read from one tensor; on a device made with
/// WebGPU's default limits (an engine holding itself to a browser's) it is refused when
/// built, naming the limit.
#[test]
fn a_decode_with_three_modifier_tensors_runs_where_the_adapter_allows() {
    use attn_dsl::flex::library::{build::*, tensor};
    use attn_dsl::flex::{BinOp, Dim, Flex, Ty};
    use runtime::FlexOf;
    let gpu = gpu();
    let h = HEADS;
    let heads = [Dim::Heads];
    // score + (ta[h] + tb[h] + tc[h]) · (k - q), and the same with s, their sum.
    let distance = cast(bin(BinOp::Sub, v("k"), v("q")), Ty::F32);
    let sum = bin(
        BinOp::Add,
        bin(BinOp::Add, idx("ta", vec![v("h")]), idx("tb", vec![v("h")])),
        idx("tc", vec![v("h")]),
    );
    let three = Flex {
        score_mod: Some(bin(
            BinOp::Add,
            v("score"),
            bin(BinOp::Mul, sum, distance.clone()),
        )),
        mask_mod: None,
        tensors: ["ta", "tb", "tc"]
            .map(|n| tensor(n, &heads, Ty::F32))
            .to_vec(),
        ..Flex::default()
    };
    let three_flex = three.clone();
    let one = Flex {
        score_mod: Some(bin(
            BinOp::Add,
            v("score"),
            bin(BinOp::Mul, idx("s", vec![v("h")]), distance),
        )),
        mask_mod: None,
        tensors: vec![tensor("s", &heads, Ty::F32)],
        ..Flex::default()
    };
    let parts = [
        [0.01f32, -0.02, 0.03, 0.005],
        [0.02, 0.01, -0.01, 0.0],
        [0.0, 0.03, 0.02, 0.01],
    ];
    let total: Vec<f32> = (0..4).map(|i| parts.iter().map(|p| p[i]).sum()).collect();
    let t = |x: &[f32]| Tensor::from_f32(&gpu, &[h.n_heads], Scalar::F32, x).unwrap();
    let (a, b, c, s) = (t(&parts[0]), t(&parts[1]), t(&parts[2]), t(&total));
    let mut cache = KvCache::new(
        &gpu,
        f32_cache(h, 1, CacheLayout::Contiguous { capacity: 64 }),
    )
    .unwrap();
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    cache.open(&mut enc, 0).unwrap();
    let (_, k) = upload(&gpu, &[1, 40, h.n_kv_heads, h.head_dim], 1);
    let (_, vv) = upload(&gpu, &[1, 40, h.n_kv_heads, h.head_dim], 2);
    cache.append(&gpu, &mut enc, 0, &k, &vv).unwrap();
    let (_, q) = upload(&gpu, &[1, h.n_heads, h.head_dim], 3);
    let outputs = [
        (three, vec![("ta", &a), ("tb", &b), ("tc", &c)]),
        (one, vec![("s", &s)]),
    ]
    .map(|(flex, tensors)| {
        let flex = flex.intern();
        let spec = DecodeSpec {
            masks: Masks {
                flex: Some(flex),
                ..Masks::default()
            },
            ..DecodeSpec::new(64, 64, Dtype::F32)
        };
        let mut decode = Decode::new(&gpu, spec).unwrap_or_else(|e| panic!("{e}"));
        let o = Tensor::zeros(&gpu, &[1, h.n_heads, h.head_dim], Scalar::F32).unwrap();
        let args = DecodeArgs {
            rows: Default::default(),
            q: &q,
            cache: cache.view(),
            o: &o,
            scale: None,
            mods: runtime::DeviceModifiers {
                flex: Some(FlexOf {
                    modifiers: flex,
                    tensors: &tensors,
                    block_mask: None,
                }),
                ..Default::default()
            },
            slice_len: None,
        };
        decode
            .record(&gpu, &mut enc, &args)
            .unwrap_or_else(|e| panic!("{e}"));
        o
    });
    submit(&gpu, enc);
    let [x, y] = outputs.map(|o| read(&gpu, &o));
    let worst = x
        .iter()
        .zip(&y)
        .map(|(p, q)| (p - q).abs())
        .fold(0.0, f32::max);
    assert!(worst < 1e-5, "three tensors and one differ by {worst}");
    assert!(x.iter().any(|v| *v != 0.0));
    let (adapter, [(device, queue), _]) = two_devices();
    let browser = Gpu::from_wgpu(&adapter, device, queue, [&kernels::attention_forward::ABI])
        .unwrap_or_else(|e| panic!("{e}"));
    let spec = DecodeSpec {
        masks: Masks {
            flex: Some(three_flex.intern()),
            ..Masks::default()
        },
        ..DecodeSpec::new(64, 64, Dtype::F32)
    };
    match Decode::new(&browser, spec) {
        Err(runtime::Error::Device(DeviceError::DeviceLimit {
            what, needed, has, ..
        })) => {
            assert_eq!(what, "max_storage_buffers_per_shader_stage");
            assert_eq!((needed, has), (9, 8));
        }
        Err(e) => panic!("expected the storage-buffer limit, got {e}"),
        Ok(_) => panic!("a decode binding 9 storage buffers was built under WebGPU's 8"),
    }
}

/// The tensor's refusal inside a `runtime::Error`.
fn tensor_err(e: runtime::Error) -> TensorError {
    match e {
        runtime::Error::Input(runtime::InputError::Tensor(t)) => t,
        other => panic!("not a tensor's refusal: {other}"),
    }
}

/// A buffer the caller destroyed after wrapping it, and tensors with a zero-length
/// dimension: the forward, a macro kernel's raw `Kernel::record` and the cache's append
/// refuse them with a typed error before recording anything (wgpu panicked on the
/// destroyed buffer), the cache keeps its length, and the encoder still submits.
#[test]
fn destroyed_and_zero_sized_tensors_are_refused_and_the_encoder_still_submits() {
    let gpu = gpu();
    let (b, s, h) = (1, 8, HEADS);
    let q_shape = [b, s, h.n_heads, h.head_dim];
    let kv_shape = [b, s, h.n_kv_heads, h.head_dim];
    let n = |shape: &[u32]| shape.iter().product::<u32>() as usize;
    let doomed = caller_buffer(&gpu, &vec![0.5; n(&q_shape)]);
    let q = Tensor::wrap(&gpu, &doomed, 0, &q_shape, Scalar::F32).unwrap();
    let k = Tensor::zeros(&gpu, &kv_shape, Scalar::F32).unwrap();
    let o = Tensor::zeros(&gpu, &q_shape, Scalar::F32).unwrap();
    let lse = Tensor::zeros(&gpu, &[b, s, h.n_heads], Scalar::F32).unwrap();
    let spec = ForwardSpec {
        head_dim: 64,
        head_dim_v: 64,
        masks: Masks::new(true, false),
        dtype: Dtype::F32,
    };
    let mut fwd = Forward::new(&gpu, spec).unwrap();
    let mut cache = KvCache::new(
        &gpu,
        f32_cache(h, 1, CacheLayout::Contiguous { capacity: 8 }),
    )
    .unwrap();
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    cache.open(&mut encoder, 0).unwrap();
    let rows = Tensor::wrap(&gpu, &doomed, 0, &[1, 2, 2, 64], Scalar::F32).unwrap();
    doomed.destroy();
    let unbindable = |r: Result<(), Error>| match r {
        Err(Error::Input(InputError::Tensor(TensorError::Unbindable { kernel, message }))) => {
            assert!(message.contains("destroyed"), "{message}");
            kernel
        }
        other => panic!("expected an unbindable tensor, got {other:?}"),
    };
    let args = ForwardArgs::new(&q, &k, &k, &o, &lse);
    unbindable(fwd.record(&gpu, &mut encoder, &args));
    unbindable(cache.append(&gpu, &mut encoder, 0, &rows, &rows));
    assert_eq!(cache.len(0), Some(0));
    let raw = Kernel::new(&gpu, &kernels::rope::ABI).block_on().unwrap();
    let buffers: Vec<(&str, &wgpu::Buffer)> = kernels::rope::ABI
        .bindings
        .iter()
        .map(|b| (b.name.as_ref(), &doomed))
        .collect();
    assert_eq!(
        unbindable(raw.record(&gpu, &mut encoder, &buffers, [1, 1, 1])),
        "rope"
    );
    // A sequence of no rows.
    let zero = |shape: &[u32]| Tensor::zeros(&gpu, shape, Scalar::F32).unwrap();
    let (zq, zk, zl) = (
        zero(&[1, 0, h.n_heads, h.head_dim]),
        zero(&[1, 0, h.n_kv_heads, h.head_dim]),
        zero(&[1, 0, h.n_heads]),
    );
    match fwd.record(
        &gpu,
        &mut encoder,
        &ForwardArgs::new(&zq, &zk, &zk, &zq, &zl),
    ) {
        Err(Error::Input(InputError::ZeroDim { .. })) => {}
        other => panic!("expected a zero-length dimension refused, got {other:?}"),
    }
    submit(&gpu, encoder);
}

/// Rows 64 wide: `Decode::new` takes the streamed split pass where its slices hold
/// `LONG_SLICE` keys and the staged one where they would not, either equal to the staged
/// pass alone. The long case is a paged cache whose grid covers 2^20 rows (a block table
/// that names its few pages first, then page 0 again) holding 5000.
#[test]
fn narrow_rows_take_the_streamed_pass_where_its_slices_are_long() {
    use runtime::ops::decode::{CacheView, LONG_SLICE, SplitLayout};
    let gpu = gpu();
    let h = Heads {
        n_heads: 2,
        n_kv_heads: 2,
        ..HEADS
    };
    let spec = DecodeSpec {
        cache: Cache::Paged,
        ..DecodeSpec::new(64, 64, Dtype::F32)
    };
    let mut planned = Decode::new(&gpu, spec).unwrap();
    let mut staged = Decode::with_layout(&gpu, spec, SplitLayout::Staged).unwrap();
    let (page, len, pages_per_seq) = (16u32, 5000u32, 1u32 << 16);
    let pages = len.div_ceil(page);
    let (_, k) = upload(&gpu, &[pages, page, 2, 64], 71);
    let (_, v) = upload(&gpu, &[pages, page, 2, 64], 72);
    let (_, q) = upload(&gpu, &[1, 2, 64], 73);
    let table: Vec<u32> = (0..pages_per_seq)
        .map(|p| if p < pages { p } else { 0 })
        .collect();
    let table = Tensor::from_u32(&gpu, &[1, pages_per_seq], &table).unwrap();
    let lens = Tensor::from_u32(&gpu, &[1], &[len]).unwrap();
    for (max_len, long) in [(len, false), (page * pages_per_seq, gpu.has_subgroups())] {
        let slicing = planned.slicing(&gpu, h, 1, max_len).unwrap();
        let alone = staged.slicing(&gpu, h, 1, max_len).unwrap();
        assert_eq!(
            slicing.slice_len >= LONG_SLICE,
            long,
            "{max_len}: {slicing:?}"
        );
        assert!(alone.slice_len < LONG_SLICE, "{max_len}: {alone:?}");
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        let outputs = [&mut planned, &mut staged].map(|decode| {
            let o = Tensor::zeros(&gpu, &[1, 2, 64], Scalar::F32).unwrap();
            let cache = CacheView {
                slot0: 0,
                k: &k,
                v: &v,
                seq_lens: &lens,
                max_len,
                block_table: Some(&table),
                scales: None,
            };
            let args = DecodeArgs {
                rows: Default::default(),
                q: &q,
                cache,
                o: &o,
                scale: None,
                mods: Default::default(),
                slice_len: None,
            };
            decode.record(&gpu, &mut encoder, &args).unwrap();
            o
        });
        submit(&gpu, encoder);
        let [a, b] = outputs.map(|o| read(&gpu, &o));
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        assert!(worst < 1e-5, "{max_len}: {worst}");
    }
}

/// The raw readbacks refuse ranges past a buffer or off its words, and read elements of
/// any size: each was a panic inside wgpu or bytemuck.
#[test]
fn readbacks_of_ranges_a_buffer_cannot_give_are_typed_errors() {
    use runtime::tensor::readback::{read, read_range};
    let gpu = gpu();
    let buffer = caller_buffer(&gpu, &[1.0, 2.0, 3.0, 4.0]);
    match read::<f32>(&gpu, &buffer, 64).block_on() {
        Err(Error::Input(InputError::Tensor(TensorError::OutOfBounds { size: 16, .. }))) => {}
        other => panic!("expected an out-of-bounds error, got {other:?}"),
    }
    let words = read::<u64>(&gpu, &buffer, 1).block_on().unwrap();
    assert_eq!(bytemuck::cast_slice::<u64, f32>(&words), [1.0, 2.0]);
    assert!(matches!(
        read_range(&gpu, &buffer, 2, 4).block_on(),
        Err(Error::Readback(_))
    ));
    assert!(matches!(
        read_range(&gpu, &buffer, 8, 16).block_on(),
        Err(Error::Input(InputError::Tensor(
            TensorError::OutOfBounds { .. }
        )))
    ));
    let back = read_range(&gpu, &buffer, 4, 8).block_on().unwrap();
    assert_eq!(bytemuck::cast_slice::<u8, f32>(&back), [2.0, 3.0]);
}

/// RoPE of f16 and bf16 rows rotates each pair in f32 and rounds it once: Q and K in one
/// dispatch, and Q alone, equal the f32 rotation of the same values rounded into the
/// dtype, to within its last place (the two kernels may contract their products apart);
/// bf16 at a head_dim that is not a multiple of 4 is refused.
#[test]
fn rope_in_half_precision_rounds_the_f32_rotation_once() {
    let gpu = gpu();
    let (b, s, h, kv, d) = (2u32, 3u32, 4u32, 2u32, 24u32);
    let (q_len, k_len) = ((b * s * h * d) as usize, (b * s * kv * d) as usize);
    let positions = Tensor::from_u32(&gpu, &[b], &[7, 1000]).unwrap();
    let rotate = |rope: &mut Rope, x: &Tensor, k: Option<&Tensor>| {
        let args = RopeArgs {
            x,
            positions: &positions,
            base: 10000.0,
        };
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        match k {
            Some(k) => rope.record_pair(&gpu, &mut enc, &args, k).unwrap(),
            None => rope.record(&gpu, &mut enc, &args).unwrap(),
        }
        gpu.queue.submit([enc.finish()]);
    };
    let f = Scalar::F32;
    let mut wide = Rope::new(&gpu, RopeSpec::new(d)).unwrap();
    let halves = [Dtype::Bf16]
        .into_iter()
        .chain(gpu.has_f16().then_some(Dtype::F16));
    for dtype in halves {
        let (scalar, bits) = (
            Scalar::from(dtype),
            if dtype == Dtype::F16 { 10 } else { 7 },
        );
        let data = runtime::tensor::buffers::rounded(&random(q_len + k_len, 17), scalar);
        let (q32, k32) = (
            Tensor::from_f32(&gpu, &[b, s, h, d], f, &data[..q_len]).unwrap(),
            Tensor::from_f32(&gpu, &[b, s, kv, d], f, &data[q_len..]).unwrap(),
        );
        rotate(&mut wide, &q32, None);
        rotate(&mut wide, &k32, None);
        let mut want = q32.to_f32(&gpu).block_on().unwrap();
        want.extend(k32.to_f32(&gpu).block_on().unwrap());
        let want = runtime::tensor::buffers::rounded(&want, scalar);
        let spec = RopeSpec {
            dtype,
            ..RopeSpec::new(d)
        };
        let mut narrow = Rope::new(&gpu, spec).unwrap();
        let both = Tensor::from_f32(&gpu, &[(q_len + k_len) as u32], scalar, &data).unwrap();
        let q = both.slice(0, &[b, s, h, d]).unwrap();
        let k = both.slice(q_len as u64, &[b, s, kv, d]).unwrap();
        rotate(&mut narrow, &q, Some(&k));
        let got = both.to_f32(&gpu).block_on().unwrap();
        let step = |w: f32| w.abs() * 2f32.powi(-bits) + 1e-7;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= step(*w), "{dtype:?} {i}: {g} against {w}");
        }
        assert_ne!(got, data, "{dtype:?}: nothing was rotated");
        let alone = Tensor::from_f32(&gpu, &[b, s, h, d], scalar, &data[..q_len]).unwrap();
        rotate(&mut narrow, &alone, None);
        assert_eq!(
            alone.to_f32(&gpu).block_on().unwrap(),
            got[..q_len],
            "{dtype:?}"
        );
    }
    let odd = RopeSpec {
        dtype: Dtype::Bf16,
        ..RopeSpec::new(6)
    };
    assert!(matches!(Rope::new(&gpu, odd), Err(Error::Pipeline { .. })));
}

/// RoPE of a fused projection's Q and K in one dispatch (K's rows after Q's, right after
/// or past padding rows, as `Linear::parts` lays them) rotates each exactly as two
/// separate calls do, each sequence from its own position, the rows between untouched; a
/// K elsewhere is refused with a typed error and nothing rotated.
#[test]
fn rope_of_q_and_k_in_one_dispatch_equals_them_apart() {
    let gpu = gpu();
    let (b, s, h, kv, d) = (2u32, 3u32, 4u32, 2u32, 16u32);
    let (q_len, k_len) = ((b * s * h * d) as usize, (b * s * kv * d) as usize);
    let data = random(q_len + k_len, 91);
    let f = Scalar::F32;
    let positions = Tensor::from_u32(&gpu, &[b], &[5, 300]).unwrap();
    let mut rope = Rope::new(&gpu, RopeSpec::new(d)).unwrap();
    let rotate = |rope: &mut Rope, x: &Tensor, k: Option<&Tensor>| {
        let args = RopeArgs {
            x,
            positions: &positions,
            base: 10000.0,
        };
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        let done = match k {
            Some(k) => rope.record_pair(&gpu, &mut enc, &args, k),
            None => rope.record(&gpu, &mut enc, &args),
        };
        gpu.queue.submit([enc.finish()]);
        done
    };
    // Apart: each in a buffer of its own.
    let qa = Tensor::from_f32(&gpu, &[b, s, h, d], f, &data[..q_len]).unwrap();
    let ka = Tensor::from_f32(&gpu, &[b, s, kv, d], f, &data[q_len..]).unwrap();
    rotate(&mut rope, &qa, None).unwrap();
    rotate(&mut rope, &ka, None).unwrap();
    let mut apart = qa.to_f32(&gpu).block_on().unwrap();
    apart.extend(ka.to_f32(&gpu).block_on().unwrap());
    assert_ne!(apart, data, "nothing was rotated");
    // Together: Q and K as two parts of one buffer, K right after Q or three head rows
    // later (a fused projection's parts with their rows padded); the gap untouched.
    for gap in [0, 3 * d as usize] {
        let mut laid = data[..q_len].to_vec();
        laid.extend((0..gap).map(|i| i as f32));
        laid.extend(&data[q_len..]);
        let both = Tensor::from_f32(&gpu, &[laid.len() as u32], f, &laid).unwrap();
        let q = both.slice(0, &[b, s, h, d]).unwrap();
        let k = both.slice((q_len + gap) as u64, &[b, s, kv, d]).unwrap();
        rotate(&mut rope, &q, Some(&k)).unwrap();
        let mut together = both.to_f32(&gpu).block_on().unwrap();
        let between: Vec<f32> = together.drain(q_len..q_len + gap).collect();
        assert_eq!(between, laid[q_len..q_len + gap], "gap {gap}");
        assert_eq!(together, apart, "gap {gap}");
    }
    // K half a head row after Q, or before it: refused.
    let both = Tensor::zeros(&gpu, &[(q_len + k_len + 8) as u32], f).unwrap();
    let half_row = [
        both.slice(0, &[b, s, h, d]).unwrap(),
        both.slice(q_len as u64 + 8, &[b, s, kv, d]).unwrap(),
    ];
    let before = [
        both.slice(k_len as u64, &[b, s, h, d]).unwrap(),
        both.slice(0, &[b, s, kv, d]).unwrap(),
    ];
    for [q, k] in [half_row, before] {
        let e = rotate(&mut rope, &q, Some(&k));
        assert!(
            matches!(e, Err(Error::Input(InputError::Unsupported { .. }))),
            "{e:?}"
        );
    }
    // K in a buffer of its own is not after Q: refused, Q untouched.
    let e = rotate(&mut rope, &qa, Some(&ka));
    assert!(
        matches!(e, Err(Error::Input(InputError::Unsupported { .. }))),
        "{e:?}"
    );
    assert_eq!(qa.to_f32(&gpu).block_on().unwrap(), apart[..q_len]);
}
