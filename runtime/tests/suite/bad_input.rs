//! Bad input is refused with a typed error before any GPU work, never a panic.

use attn_dsl::{Gqa, KernelSpec, Masks, Op};
use runtime::ops::decode::validate_decode;
use runtime::ops::forward::validate_forward;
use runtime::shape::validate_seg;
use runtime::{DecodeInput, ForwardInput, Heads, InputError, kernels};

const HEADS: Heads = Heads {
    n_heads: 4,
    n_kv_heads: 2,
    head_dim: 64,
    head_dim_v: 64,
};

fn limits() -> wgpu::Limits {
    wgpu::Limits::default()
}

struct Data {
    q: Vec<f32>,
    kv: Vec<f32>,
    seg: Vec<u32>,
}

fn data(seq: usize) -> Data {
    Data {
        q: vec![0.5; seq * 4 * 64],
        kv: vec![0.5; seq * 2 * 64],
        seg: vec![0; seq],
    }
}

fn input(d: &Data, seq: u32) -> ForwardInput<'_> {
    ForwardInput {
        batch: 1,
        seq_len: seq,
        heads: HEADS,
        q: &d.q,
        k: &d.kv,
        v: &d.kv,
        seg: Some(&d.seg),
        scale: None,
        mods: Default::default(),
    }
}

fn refuse(i: &ForwardInput) -> InputError {
    validate_forward(&kernels::attention_forward::ABI, &limits(), i)
        .expect_err("input should be refused")
}

#[test]
fn good_input_passes() {
    let d = data(8);
    validate_forward(&kernels::attention_forward::ABI, &limits(), &input(&d, 8)).unwrap();
}

#[test]
fn shapes_that_do_not_fit_are_refused() {
    let d = data(8);
    // Counts past u64 when multiplied out: refused as a length, not overflowed.
    assert!(matches!(
        refuse(&ForwardInput {
            batch: u32::MAX,
            heads: Heads {
                n_heads: u32::MAX,
                n_kv_heads: u32::MAX,
                ..HEADS
            },
            ..input(&d, u32::MAX)
        }),
        InputError::Length { .. } | InputError::GqaRatio { .. } | InputError::OverLimit { .. }
    ));
    let wrong_head_dim = Heads {
        head_dim: 128,
        head_dim_v: 128,
        ..HEADS
    };
    assert!(matches!(
        refuse(&ForwardInput {
            batch: 1,
            heads: wrong_head_dim,
            ..input(&d, 8)
        }),
        InputError::HeadDim {
            kernel_head_dim: 64,
            given: 128,
            ..
        }
    ));
    let three_kv = Heads {
        n_kv_heads: 3,
        ..HEADS
    };
    assert_eq!(
        refuse(&ForwardInput {
            batch: 1,
            heads: three_kv,
            ..input(&d, 8)
        }),
        InputError::HeadsNotDivisible {
            n_heads: 4,
            n_kv_heads: 3
        }
    );
    assert!(matches!(
        refuse(&input(&d, 9)),
        InputError::Length {
            name: "q",
            expected: 2304,
            got: 2048,
            ..
        }
    ));
    assert_eq!(
        refuse(&input(&d, 0)),
        InputError::ZeroDim { name: "seq_len" }
    );
    let no_kv = Heads {
        n_kv_heads: 0,
        ..HEADS
    };
    assert_eq!(
        refuse(&ForwardInput {
            batch: 1,
            heads: no_kv,
            ..input(&d, 8)
        }),
        InputError::ZeroDim { name: "n_kv_heads" }
    );
    assert_eq!(
        refuse(&ForwardInput {
            batch: 1,
            scale: Some(f32::NAN),
            ..input(&d, 8)
        })
        .to_string(),
        "scale NaN is not a finite number"
    );
    let short_v = vec![0.0; 10];
    assert!(matches!(
        refuse(&ForwardInput {
            batch: 1,
            v: &short_v,
            ..input(&d, 8)
        }),
        InputError::Length { name: "v", .. }
    ));
}

#[test]
fn bad_document_starts_are_refused() {
    assert!(matches!(
        validate_seg(&[0, 2, 2]),
        Err(InputError::Seg {
            index: 1,
            value: 2,
            ..
        })
    ));
    assert!(matches!(
        validate_seg(&[0, 1, 0]),
        Err(InputError::Seg { index: 2, .. })
    ));
    assert!(matches!(
        validate_seg(&[0, 0, 1]),
        Err(InputError::Seg {
            index: 2,
            value: 1,
            ..
        })
    ));
    validate_seg(&[0, 0, 2, 2, 4]).unwrap();
    let mut d = data(3);
    d.seg = vec![0, 2, 2];
    assert!(matches!(refuse(&input(&d, 3)), InputError::Seg { .. }));
}

#[test]
fn seg_needs_a_kernel_with_the_document_mask() {
    let abi = attn_dsl::compile(&KernelSpec::standard(
        "causal_only",
        Op::Forward,
        64,
        Masks::new(true, false),
    ))
    .unwrap();
    let d = data(4);
    let err = validate_forward(&abi, &limits(), &input(&d, 4)).unwrap_err();
    assert_eq!(
        err,
        InputError::SegWithoutDocumentMask {
            kernel: "causal_only".into()
        }
    );
    validate_forward(
        &abi,
        &limits(),
        &ForwardInput {
            batch: 1,
            seg: None,
            ..input(&d, 4)
        },
    )
    .unwrap();
}

#[test]
fn fixed_gqa_ratio_is_enforced() {
    let mut spec = KernelSpec::standard("gqa3", Op::Forward, 64, Masks::default());
    spec.gqa = Gqa::Ratio(3);
    let abi = attn_dsl::compile(&spec).unwrap();
    let d = data(4);
    let err = validate_forward(
        &abi,
        &limits(),
        &ForwardInput {
            batch: 1,
            seg: None,
            ..input(&d, 4)
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            InputError::GqaRatio {
                ratio: 3,
                given: 2,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn decode_checks_the_cache_and_the_kernel_op() {
    let q = vec![0.0; 4 * 64];
    let cache = vec![0.0; 10 * 2 * 64];
    let good = DecodeInput {
        batch: 1,
        cache_len: 10,
        heads: HEADS,
        q: &q,
        k_cache: &cache,
        v_cache: &cache,
        scale: None,
        mods: Default::default(),
    };
    validate_decode(&kernels::attention_decode::ABI, &limits(), &good).unwrap();
    let too_long = DecodeInput {
        batch: 1,
        cache_len: 11,
        ..good
    };
    assert_eq!(
        validate_decode(&kernels::attention_decode::ABI, &limits(), &too_long).unwrap_err(),
        InputError::CacheTooShort {
            cache_len: 11,
            capacity: 10
        }
    );
    let ragged = vec![0.0; 10 * 2 * 64 + 1];
    let bad = DecodeInput {
        batch: 1,
        k_cache: &ragged,
        ..good
    };
    assert!(matches!(
        validate_decode(&kernels::attention_decode::ABI, &limits(), &bad).unwrap_err(),
        InputError::Length {
            name: "k_cache",
            ..
        }
    ));
    assert!(matches!(
        validate_decode(&kernels::attention_forward::ABI, &limits(), &good).unwrap_err(),
        InputError::WrongOp {
            wanted: "decode",
            ..
        }
    ));
}

#[test]
fn buffers_over_the_adapter_limit_are_refused() {
    let tiny = wgpu::Limits {
        max_storage_buffer_binding_size: 1024,
        ..limits()
    };
    let d = data(8);
    let err = validate_forward(&kernels::attention_forward::ABI, &tiny, &input(&d, 8)).unwrap_err();
    assert!(matches!(err, InputError::OverLimit { .. }), "{err}");
}
