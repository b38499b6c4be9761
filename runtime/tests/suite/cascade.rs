//! Cascade decode (`ops::cascade`): sequences sharing a prefix decoded with the prefix read
//! once for all of them, judged as a decode over the prefix and each suffix by the check's
//! rule (twice a framework-grade f32 error plus 1e-6), and its refusals.

use attn_dsl::{Cache, Masks};
use runtime::harness::cascaded::{CascadeCase, run};
use runtime::ops::cascade::{Cascade, CascadeArgs};
use runtime::ops::decode::{CacheView, DecodeSpec};
use runtime::{BlockOn, Dtype, Error, Gpu, Heads, InputError, Modifiers, Scalar, Tensor, kernels};

fn gpu() -> Gpu {
    Gpu::new(kernels::FAMILY.iter().copied())
        .block_on()
        .unwrap_or_else(|e| panic!("{e}"))
}

const HEADS: Heads = Heads {
    n_heads: 8,
    n_kv_heads: 2,
    head_dim: 64,
    head_dim_v: 64,
};

fn passes(gpu: &Gpu, case: &CascadeCase, seed: u64) {
    for (name, v) in run(gpu, case, seed).unwrap() {
        assert!(
            v.pass(),
            "{name} of {:?} {:?} prefix {} suffixes {:?}: error {:e} over bound {:e}",
            case.dtype,
            case.cache,
            case.prefix,
            case.suffixes,
            v.error,
            v.bound
        );
    }
}

/// f32 contiguous without modifiers and paged with soft cap and sinks, the adapter's half
/// dtypes with them (`check` runs every layout and dtype over its decode cases); one
/// sequence's suffix its query's row alone, one longer than the prefix.
#[test]
fn a_cascade_equals_a_decode_over_prefix_and_suffix() {
    let gpu = gpu();
    let sinks = [0.5f32, -1.0, 2.0, 0.0, 1.0, -0.5, 0.25, 3.0];
    let capped = Modifiers {
        softcap: Some(2.0),
        sinks: Some(&sinks),
        ..Modifiers::default()
    };
    let mut runs = vec![
        (Dtype::F32, Cache::Contiguous, Modifiers::default()),
        (Dtype::F32, Cache::Paged, capped),
    ];
    runs.extend(
        gpu.half_dtypes()
            .into_iter()
            .map(|d| (d, Cache::Contiguous, capped)),
    );
    for (i, (dtype, cache, mods)) in runs.into_iter().enumerate() {
        let case = CascadeCase {
            heads: HEADS,
            dtype,
            cache,
            fp8: None,
            prefix: 70,
            suffixes: &[1, 9, 90],
            mods,
        };
        passes(&gpu, &case, 11 + i as u64);
    }
}

/// More sequences than a packed tile holds rows (17 x 4 heads per KV head), GQA 4.
#[test]
fn a_cascade_of_many_sequences_passes() {
    let gpu = gpu();
    let suffixes: Vec<u32> = (0..17).map(|b| 1 + (b * 7) % 23).collect();
    let case = CascadeCase {
        heads: HEADS,
        dtype: Dtype::F32,
        cache: Cache::Contiguous,
        fp8: None,
        prefix: 130,
        suffixes: &suffixes,
        mods: Modifiers::default(),
    };
    passes(&gpu, &case, 5);
}

/// Masks that move with a query's position, and a prefix shorter than the batch: typed
/// errors, and O untouched.
#[test]
fn a_cascade_refuses_what_it_cannot_compute() {
    let gpu = gpu();
    let window = DecodeSpec {
        masks: Masks {
            window: true,
            ..Masks::default()
        },
        ..DecodeSpec::new(64, 64, Dtype::F32)
    };
    assert!(matches!(
        Cascade::new(&gpu, window),
        Err(Error::Input(InputError::Unsupported { .. }))
    ));
    // An fp8 cache's prefix runs only as a chunk on tensor cores under f16 queries.
    let fp8 = |dtype| DecodeSpec {
        kv_fp8: Some(attn_dsl::Fp8::E4m3),
        ..DecodeSpec::new(64, 64, dtype)
    };
    assert!(matches!(
        Cascade::new(&gpu, fp8(Dtype::F32)),
        Err(Error::Input(InputError::Unsupported { .. }))
    ));
    let tensor_cores = gpu.coop16_for(Dtype::F16, attn_dsl::Op::Extend, 64);
    assert_eq!(Cascade::new(&gpu, fp8(Dtype::F16)).is_ok(), tensor_cores);
    let mut op = Cascade::new(&gpu, DecodeSpec::new(64, 64, Dtype::F32)).unwrap();
    let h = HEADS;
    let f32 = Scalar::F32;
    let kv = |slots, rows| Tensor::zeros(&gpu, &[slots, rows, h.n_kv_heads, 64], f32).unwrap();
    let (pk, pv, sk, sv) = (kv(1, 2), kv(1, 2), kv(3, 4), kv(3, 4));
    let plens = Tensor::from_u32(&gpu, &[1], &[2]).unwrap();
    let slens = Tensor::from_u32(&gpu, &[3], &[1, 2, 3]).unwrap();
    let q = Tensor::from_f32(&gpu, &[3, 8, 64], f32, &vec![1.0; 3 * 8 * 64]).unwrap();
    let o = Tensor::from_f32(&gpu, &[3, 8, 64], f32, &vec![7.0; 3 * 8 * 64]).unwrap();
    let view = |k, v, lens, max_len| CacheView {
        k,
        v,
        seq_lens: lens,
        max_len,
        block_table: None,
        slot0: 0,
        scales: None,
    };
    let args = CascadeArgs {
        q: &q,
        prefix: view(&pk, &pv, &plens, 2),
        suffix: view(&sk, &sv, &slens, 3),
        o: &o,
        lse: None,
        scale: None,
        mods: Default::default(),
    };
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    let refused = op.record(&gpu, &mut encoder, &args);
    assert!(
        matches!(refused, Err(Error::Input(InputError::QueryRows(_)))),
        "{refused:?}"
    );
    gpu.queue.submit([encoder.finish()]);
    assert!(o.to_f32(&gpu).block_on().unwrap().iter().all(|x| *x == 7.0));
}
