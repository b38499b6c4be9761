//! Every op compiles through naga across the specializations it supports, and bad specs
//! fail with an error naming the field at fault.

use attn_dsl::{
    Access, DslError, Field, Gqa, KernelSpec, Major, Masks, Op, Target, WriteMode, compile,
};

const CAUSAL_DOC: Masks = Masks::new(true, true);

fn forward(head_dim: u32, masks: Masks) -> KernelSpec {
    KernelSpec::standard("attention_forward", Op::Forward, head_dim, masks)
}

fn field_of(spec: &KernelSpec) -> Field {
    match compile(spec) {
        Err(e) => e
            .field()
            .cloned()
            .unwrap_or_else(|| panic!("not a spec error: {e}")),
        Ok(_) => panic!("spec {} compiled but should not", spec.name),
    }
}

#[test]
fn forward_compiles_for_every_mask_and_head_dim() {
    for head_dim in [1, 32, 64, 96, 128, 256] {
        for (causal, document) in [(false, false), (true, false), (false, true), (true, true)] {
            let spec = forward(head_dim, Masks::new(causal, document));
            let abi =
                compile(&spec).unwrap_or_else(|e| panic!("d{head_dim} {causal} {document}: {e}"));
            assert_eq!(abi.binding("seg").is_some(), document);
        }
    }
}

#[test]
fn decode_and_fixed_gqa_and_tiles_compile() {
    compile(&KernelSpec::standard(
        "dec",
        Op::Decode,
        64,
        Masks::default(),
    ))
    .unwrap();
    let mut spec = forward(64, CAUSAL_DOC);
    spec.gqa = Gqa::Ratio(3);
    spec.grid.tile = 4;
    let abi = compile(&spec).unwrap();
    assert!(abi.wgsl.contains("return 3u;"));
    assert!(abi.wgsl.contains("const TILE: u32 = 4u;"));
}

#[test]
fn forward_binding_plan_matches_the_seeds_abi() {
    let abi = compile(&forward(64, CAUSAL_DOC)).unwrap();
    let names: Vec<_> = abi
        .bindings
        .iter()
        .map(|b| (b.binding, b.name.as_ref(), b.access))
        .collect();
    assert_eq!(
        names,
        [
            (0, "q", Access::Read),
            (1, "k", Access::Read),
            (2, "v", Access::Read),
            (3, "o", Access::ReadWrite),
            (4, "lse", Access::ReadWrite),
            (5, "dims", Access::Uniform),
            (6, "params", Access::Uniform),
            (7, "seg", Access::Read),
        ]
    );
    assert_eq!(abi.workgroup_storage_bytes, 4 * (2 * 64 + 3 * 256) + 16);
}

#[test]
fn head_dim_over_the_limit_is_refused() {
    assert_eq!(field_of(&forward(512, CAUSAL_DOC)), Field::HeadDim);
    assert_eq!(field_of(&forward(0, CAUSAL_DOC)), Field::HeadDim);
}

#[test]
fn decode_refuses_masks_it_cannot_honour() {
    let spec = KernelSpec::standard("dec", Op::Decode, 64, Masks::new(true, false));
    assert_eq!(field_of(&spec), Field::Mask("causal".into()));
}

#[test]
fn owned_output_on_a_grid_that_does_not_fix_its_axes_is_a_race() {
    let mut spec = KernelSpec::standard("dec", Op::Decode, 64, Masks::default());
    spec.grid.major = Major::Head;
    // Decode's `o` is [h, d]: owned under a head grid. Forward's `o` is [s, h, d]: a j-major
    // grid leaves `s` free, so two workgroups would write one element.
    compile(&spec).unwrap();
    let mut fwd = forward(64, CAUSAL_DOC);
    fwd.grid.major = Major::J;
    assert_eq!(field_of(&fwd), Field::Write("o".into()));
    let err = compile(&fwd).unwrap_err().to_string();
    assert!(
        err.contains("lacks axis `j`") && err.contains("atomic"),
        "{err}"
    );
}

#[test]
fn writes_must_name_outputs_and_cover_them() {
    let mut spec = forward(64, CAUSAL_DOC);
    spec.writes.retain(|(n, _)| n != "lse");
    assert!(matches!(field_of(&spec), Field::Write(_)));
    let mut spec = forward(64, CAUSAL_DOC);
    spec.writes.push(("q".into(), WriteMode::Owned));
    assert_eq!(field_of(&spec), Field::Write("q".into()));
    let mut spec = forward(64, CAUSAL_DOC);
    spec.writes[0].1 = WriteMode::AtomicScatter;
    assert_eq!(field_of(&spec), Field::Write("o".into()));
}

#[test]
fn workgroup_memory_over_the_target_limit_is_refused() {
    let mut spec = forward(256, CAUSAL_DOC);
    spec.workgroup_size = 1024;
    spec.target = Target::Native(attn_dsl::Limits {
        workgroup_storage_bytes: 8192,
        invocations_per_workgroup: 1024,
        ..attn_dsl::Limits::WEBGPU
    });
    let err = compile(&spec).unwrap_err();
    assert!(
        matches!(
            err,
            DslError::Spec {
                field: Field::WorkgroupSize,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("workgroup memory"), "{err}");
}

fn backward_q(writes: &[(&str, WriteMode)]) -> KernelSpec {
    let mut spec = KernelSpec::standard("bq", Op::BackwardQ, 64, CAUSAL_DOC);
    spec.writes
        .extend(writes.iter().map(|(n, m)| (n.to_string(), *m)));
    spec
}

#[test]
fn every_backward_schedule_compiles_within_webgpu_limits() {
    use WriteMode::{AtomicScatter, ScratchFlush};
    for head_dim in [32, 64, 128] {
        for masks in [CAUSAL_DOC, Masks::new(false, true), Masks::default()] {
            let split = backward_q(&[("p_ds", ScratchFlush)]);
            let cas = backward_q(&[("dkv", AtomicScatter)]);
            let native = KernelSpec {
                scatter: attn_dsl::Scatter::F32Atomic,
                ..cas.clone()
            };
            let recompute = backward_q(&[]);
            let kv_scratch = KernelSpec {
                source: attn_dsl::Source::Scratch,
                ..KernelSpec::standard("bkv", Op::BackwardKv, head_dim, masks)
            };
            let kv_recompute = KernelSpec::standard("bkv", Op::BackwardKv, head_dim, masks);
            let prep = KernelSpec::standard("prep", Op::BackwardPrep, head_dim, Masks::default());
            let specs = [
                split,
                cas,
                native,
                recompute,
                kv_scratch,
                kv_recompute,
                prep,
            ]
            .map(|s| KernelSpec {
                head_dim,
                masks: if s.op == Op::BackwardPrep {
                    s.masks
                } else {
                    masks
                },
                ..s
            });
            for spec in &specs {
                assert_eq!(spec.target, Target::Webgpu);
                let abi = compile(spec)
                    .unwrap_or_else(|e| panic!("{} d{head_dim} {masks:?}: {e}", spec.op.name()));
                assert!(
                    abi.storage_buffers() <= 8,
                    "{}: {} storage buffers",
                    spec.op.name(),
                    abi.storage_buffers()
                );
            }
            let abi = compile(&specs[1]).unwrap();
            assert_eq!(abi.binding("dkv").unwrap().wgsl_type, "array<atomic<u32>>");
            assert!(!abi.f32_atomics);
            let abi = compile(&specs[2]).unwrap();
            assert_eq!(abi.binding("dkv").unwrap().wgsl_type, "array<atomic<f32>>");
            assert!(abi.f32_atomics);
        }
    }
}

#[test]
fn backward_outputs_have_rules() {
    use WriteMode::{AtomicScatter, Owned, ScratchFlush};
    // dK/dV indexed [part, j, kv_h, d] from an s-major grid: a race unless scattered.
    let err = compile(&backward_q(&[("dkv", Owned)])).unwrap_err();
    assert_eq!(err.field(), Some(&Field::Write("dkv".into())));
    assert!(err.to_string().contains("lacks axis `s`"), "{err}");
    // Both schedules at once are refused.
    assert!(
        compile(&backward_q(&[
            ("p_ds", ScratchFlush),
            ("dkv", AtomicScatter)
        ]))
        .is_err()
    );
    // A backward_kv owns dK and dV: its j-major grid tells key rows apart.
    let kv = KernelSpec::standard("bkv", Op::BackwardKv, 64, CAUSAL_DOC);
    compile(&kv).unwrap();
}

#[test]
fn rope_compiles_and_needs_an_even_head_dim() {
    for op in [Op::Rope, Op::RopeBackward] {
        let abi = compile(&KernelSpec::standard("rope", op, 64, Masks::default())).unwrap();
        let names: Vec<_> = abi.bindings.iter().map(|b| b.name.as_ref()).collect();
        assert_eq!(names, ["x", "inv_freq", "dims", "positions"]);
        assert_eq!(
            field_of(&KernelSpec::standard("rope", op, 63, Masks::default())),
            Field::HeadDim
        );
        let causal = Masks::new(true, false);
        assert_eq!(
            field_of(&KernelSpec::standard("rope", op, 64, causal)),
            Field::Mask("causal".into())
        );
    }
}

#[test]
fn flash_forward_compiles_for_every_mask() {
    let config = attn_dsl::FlashConfig {
        tile: 16,
        inner: 16,
        rows_per_thread: 2,
        workgroup_size: 64,
        subgroups: false,
        matrix: attn_dsl::Matrix::Scalar,
    };
    for head_dim in [64, 128] {
        for (causal, document) in [(true, true), (true, false), (false, true), (false, false)] {
            let masks = Masks::new(causal, document);
            for subgroups in [false, true] {
                let config = attn_dsl::FlashConfig {
                    subgroups,
                    ..config
                };
                let spec = KernelSpec::flash("fwd", Op::Forward, head_dim, masks, config);
                let abi = compile(&spec).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(abi.wgsl.contains("subgroupShuffleXor"), subgroups);
                // Core WebGPU has no subgroups.
                if subgroups {
                    assert_ne!(abi.target, attn_dsl::Target::Webgpu);
                }
            }
        }
    }
}

#[test]
fn flash_backward_halves_compile_for_every_mask() {
    let config = attn_dsl::FlashConfig {
        tile: 16,
        inner: 8,
        rows_per_thread: 2,
        workgroup_size: 64,
        subgroups: false,
        matrix: attn_dsl::Matrix::Scalar,
    };
    for head_dim in [64, 128] {
        for (causal, document) in [(true, true), (true, false), (false, true), (false, false)] {
            let masks = Masks::new(causal, document);
            for op in [Op::BackwardQ, Op::BackwardKv] {
                let spec = KernelSpec::flash("bwd", op, head_dim, masks, config);
                compile(&spec).unwrap_or_else(|e| panic!("{op:?} d{head_dim}: {e}"));
            }
        }
    }
}

/// Every mask and score modifier at once, the bias per head or shared.
fn every_modifier(causal: bool, heads: attn_dsl::BiasHeads) -> Masks {
    Masks {
        window: true,
        alibi: true,
        bias: Some(heads),
        softcap: true,
        dropout: true,
        ..Masks::new(causal, true)
    }
}

#[test]
fn every_schedule_compiles_with_every_modifier() {
    use WriteMode::{AtomicScatter, Owned, ScratchFlush};
    let config = attn_dsl::FlashConfig::from_label("16x16/2@64").unwrap();
    for heads in [attn_dsl::BiasHeads::PerHead, attn_dsl::BiasHeads::Shared] {
        let dbias = match heads {
            attn_dsl::BiasHeads::PerHead => Owned,
            attn_dsl::BiasHeads::Shared => AtomicScatter,
        };
        for causal in [false, true] {
            let masks = every_modifier(causal, heads);
            let with = |mut spec: KernelSpec, writes: &[(&str, WriteMode)]| {
                spec.writes = writes.iter().map(|(n, m)| (n.to_string(), *m)).collect();
                spec.fit_target();
                compile(&spec).unwrap_or_else(|e| panic!("{} {heads:?} {causal}: {e}", spec.name))
            };
            let std = |op| KernelSpec::standard("kern", op, 64, masks);
            let flash = |op| KernelSpec::flash("kern", op, 64, masks, config);
            let abi = with(std(Op::Forward), &[("o", Owned), ("lse", Owned)]);
            assert!(abi.binding("bias").is_some() && abi.binding("alibi").is_some());
            with(flash(Op::Forward), &[("o", Owned), ("lse", Owned)]);
            let split = [("dq", Owned), ("p_ds", ScratchFlush), ("dbias", dbias)];
            let abi = with(std(Op::BackwardQ), &split);
            assert_eq!(abi.binding("dbias").unwrap().write, Some(dbias));
            with(std(Op::BackwardQ), &[("dq", Owned), ("dbias", dbias)]);
            with(std(Op::BackwardKv), &[("dk", Owned), ("dv", Owned)]);
            let streaming = [("dq", Owned), ("dkv", AtomicScatter), ("dbias", dbias)];
            with(flash(Op::BackwardQ), &streaming);
            with(flash(Op::BackwardKv), &[("dk", Owned), ("dv", Owned)]);
            let scatter = [
                ("dk", Owned),
                ("dv", Owned),
                ("dq", AtomicScatter),
                ("dbias", dbias),
            ];
            with(flash(Op::BackwardKv), &scatter);
        }
    }
    let decode = Masks {
        window: true,
        alibi: true,
        softcap: true,
        ..Masks::default()
    };
    compile(&KernelSpec::standard("dec", Op::Decode, 64, decode)).unwrap();
}

#[test]
fn modifiers_a_kernel_cannot_honour_are_refused_at_their_word() {
    let dropout = Masks {
        dropout: true,
        ..Masks::default()
    };
    let spec = KernelSpec::standard("dec", Op::Decode, 64, dropout);
    assert_eq!(field_of(&spec), Field::Mask("dropout".into()));
    let window = Masks {
        window: true,
        ..Masks::default()
    };
    let spec = KernelSpec::standard("rope", Op::Rope, 64, window);
    assert_eq!(field_of(&spec), Field::Mask("window".into()));
    // dBias of a bias shared by the heads: every head's workgroup adds into one element.
    let shared = every_modifier(true, attn_dsl::BiasHeads::Shared);
    let mut spec = KernelSpec::standard("bq", Op::BackwardQ, 64, shared);
    spec.writes.push(("dbias".into(), WriteMode::Owned));
    assert_eq!(field_of(&spec), Field::Write("dbias".into()));
    // dBias without a bias.
    let mut spec = KernelSpec::standard("bq", Op::BackwardQ, 64, CAUSAL_DOC);
    spec.writes.push(("dbias".into(), WriteMode::Owned));
    assert_eq!(field_of(&spec), Field::Write("dbias".into()));
}

/// The forward in f16 and bf16: the data bindings change type, LSE stays f32, and only
/// the forward takes a dtype (bf16 only on a flash grid, whose stores fill whole words).
#[test]
fn half_precision_forwards_compile_and_other_ops_refuse_a_dtype() {
    use attn_dsl::{Dtype, Scalar};
    let flash_cfg = attn_dsl::configs::forward(64)[0];
    for dtype in [Dtype::F16, Dtype::Bf16] {
        let flash = KernelSpec {
            dtype,
            ..KernelSpec::flash("fwd", Op::Forward, 64, CAUSAL_DOC, flash_cfg)
        };
        let abi = compile(&flash).unwrap_or_else(|e| panic!("{dtype:?}: {e}"));
        let scalar = |name: &str| abi.binding(name).unwrap().scalar;
        let want = if dtype == Dtype::F16 {
            Scalar::F16
        } else {
            Scalar::Bf16
        };
        for name in ["q", "k", "v", "o"] {
            assert_eq!(scalar(name), want, "{name}");
        }
        assert_eq!(scalar("lse"), Scalar::F32);
        let backward = KernelSpec {
            dtype,
            ..backward_q(&[("dq", WriteMode::Owned)])
        };
        assert_eq!(field_of(&backward), Field::Dtype);
    }
    let per_row = |dtype| KernelSpec {
        dtype,
        ..forward(64, CAUSAL_DOC)
    };
    let abi = compile(&per_row(Dtype::F16)).unwrap();
    assert!(abi.wgsl.starts_with("//") && abi.wgsl.contains("enable f16;"));
    assert_eq!(field_of(&per_row(Dtype::Bf16)), Field::Dtype);
}

/// The half-precision backward: prep and both flash halves read the forward's tensors and
/// dO in the dtype and add into f32 gradients.
#[test]
fn half_precision_backwards_read_the_dtype_and_write_f32_gradients() {
    use attn_dsl::{Dtype, Scalar};
    let config = attn_dsl::configs::backward(64)[0];
    for dtype in [Dtype::F16, Dtype::Bf16] {
        let want = match dtype {
            Dtype::F16 => Scalar::F16,
            _ => Scalar::Bf16,
        };
        let q = KernelSpec {
            dtype,
            ..KernelSpec::flash("bq", Op::BackwardQ, 64, CAUSAL_DOC, config)
        };
        let kv = KernelSpec {
            dtype,
            writes: vec![
                ("dk".into(), WriteMode::Owned),
                ("dv".into(), WriteMode::Owned),
            ],
            ..KernelSpec::flash("bkv", Op::BackwardKv, 64, CAUSAL_DOC, config)
        };
        let prep = KernelSpec {
            dtype,
            ..KernelSpec::standard("prep", Op::BackwardPrep, 64, Masks::default())
        };
        for (spec, data, grads) in [
            (q, &["q", "k", "v", "d_o"][..], &["dq"][..]),
            (kv, &["q", "k", "v", "d_o"], &["dk", "dv"]),
            (prep, &["o", "d_o"], &[]),
        ] {
            let abi = compile(&spec).unwrap_or_else(|e| panic!("{} {dtype:?}: {e}", spec.name));
            for name in data {
                assert_eq!(
                    abi.binding(name).unwrap().scalar,
                    want,
                    "{} {name}",
                    spec.name
                );
            }
            for name in grads {
                assert_eq!(abi.binding(name).unwrap().scalar, Scalar::F32, "{name}");
            }
        }
    }
}

/// The cooperative-matrix forward: f16, native, one subgroup of 32 per 16 query rows.
fn coop_spec(head_dim: u32, masks: Masks) -> KernelSpec {
    let config = attn_dsl::FlashConfig::from_label("64x32/16@128+tc").unwrap();
    KernelSpec {
        dtype: attn_dsl::Dtype::F16,
        ..KernelSpec::flash("fwd_tc", Op::Forward, head_dim, masks, config)
    }
}

#[test]
fn coop_forward_compiles_for_every_mask_and_modifier() {
    let every = Masks {
        window: true,
        alibi: true,
        bias: Some(attn_dsl::BiasHeads::PerHead),
        softcap: true,
        dropout: true,
        ..Masks::new(true, true)
    };
    for head_dim in [16, 64, 128, 256] {
        for masks in [Masks::default(), Masks::new(true, false), every] {
            let abi = compile(&coop_spec(head_dim, masks)).unwrap_or_else(|e| panic!("{e}"));
            assert!(abi.wgsl.contains("coopMultiplyAdd"));
            assert!(matches!(abi.target, attn_dsl::Target::Native(_)));
            assert_eq!(abi.workgroup_size, [128, 1, 1]);
            // Two subgroups per 16 rows, splitting keys and head_dim in halves.
            if head_dim >= 32 {
                let config = attn_dsl::FlashConfig::from_label("64x32/16@256+tc").unwrap();
                let split = KernelSpec {
                    dtype: attn_dsl::Dtype::F16,
                    ..KernelSpec::flash("fwd_tc2", Op::Forward, head_dim, masks, config)
                };
                let abi = compile(&split).unwrap_or_else(|e| panic!("{e}"));
                assert!(abi.wgsl.contains("const SPLIT: u32 = 2u;"));
            }
        }
    }
}

/// The tiled backward's halves on cooperative matrices, for every mask and modifier.
#[test]
fn coop_backward_halves_compile_for_every_mask_and_modifier() {
    let every = Masks {
        window: true,
        alibi: true,
        bias: Some(attn_dsl::BiasHeads::PerHead),
        softcap: true,
        dropout: true,
        ..Masks::new(true, true)
    };
    for label in ["32x32/16@64+tc", "32x32/16@128+tc"] {
        let config = attn_dsl::FlashConfig::from_label(label).unwrap();
        for head_dim in [32, 64, 128] {
            for masks in [Masks::default(), Masks::new(true, false), every] {
                let mut q = KernelSpec {
                    dtype: attn_dsl::Dtype::F16,
                    ..KernelSpec::flash("bq_tc", Op::BackwardQ, head_dim, masks, config)
                };
                if let Some(mode) = masks.dbias_mode() {
                    q.writes.push(("dbias".into(), mode));
                }
                let kv = KernelSpec {
                    dtype: attn_dsl::Dtype::F16,
                    writes: vec![
                        ("dk".into(), WriteMode::Owned),
                        ("dv".into(), WriteMode::Owned),
                    ],
                    ..KernelSpec::flash("bkv_tc", Op::BackwardKv, head_dim, masks, config)
                };
                for mut spec in [q, kv] {
                    spec.fit_target();
                    let abi = compile(&spec)
                        .unwrap_or_else(|e| panic!("{} {label} d{head_dim}: {e}", spec.name));
                    assert!(abi.wgsl.contains("coopMultiplyAdd"));
                    assert!(matches!(abi.target, attn_dsl::Target::Native(_)));
                }
            }
        }
    }
    // dQ by atomic scatter is the scalar flash schedule's.
    let config = attn_dsl::FlashConfig::from_label("32x32/16@64+tc").unwrap();
    let scatter = KernelSpec {
        dtype: attn_dsl::Dtype::F16,
        writes: vec![
            ("dk".into(), WriteMode::Owned),
            ("dv".into(), WriteMode::Owned),
            ("dq".into(), WriteMode::AtomicScatter),
        ],
        ..KernelSpec::flash("bkv_tc", Op::BackwardKv, 64, Masks::default(), config)
    };
    assert_eq!(field_of(&scatter), Field::Matrix);
}

#[test]
fn coop_forward_refusals_name_the_matrix_and_what_to_change() {
    let base = coop_spec(64, Masks::default());
    let refused = |spec: KernelSpec| compile(&spec).expect_err("refused").to_string();
    let webgpu = refused(KernelSpec {
        target: attn_dsl::Target::Webgpu,
        ..base.clone()
    });
    assert!(webgpu.contains("not in WebGPU"), "{webgpu}");
    let f32 = refused(KernelSpec {
        dtype: attn_dsl::Dtype::F32,
        ..base.clone()
    });
    assert!(f32.contains("dtype: f16"), "{f32}");
    let wg = refused(KernelSpec {
        workgroup_size: 192,
        ..base.clone()
    });
    assert!(wg.contains("needs workgroup_size 128 or 256"), "{wg}");
    let d = refused(coop_spec(72, Masks::default()));
    assert!(d.contains("multiples of 16"), "{d}");
}

/// Rows of two widths: MLA's 192/128 and V wider than Q and K, on every forward grid;
/// another op, or a narrower row that ends inside a vec4, names the field at fault.
#[test]
fn forward_takes_v_rows_of_another_width() {
    let limits = attn_dsl::Limits::WEBGPU;
    for (head_dim, head_dim_v) in [(192, 128), (64, 128), (128, 64)] {
        let per_row = forward(head_dim, CAUSAL_DOC).with_head_dim_v(head_dim_v);
        let abi = compile(&per_row).unwrap_or_else(|e| panic!("{head_dim}/{head_dim_v}: {e}"));
        assert_eq!((abi.head_dim, abi.head_dim_v()), (head_dim, head_dim_v));
        assert!(
            abi.wgsl
                .contains(&format!("const V_DIM: u32 = {head_dim_v}u;"))
        );
        assert!(abi.name.ends_with(&format!("_v{head_dim_v}")));
        let width = head_dim.max(head_dim_v);
        let config = attn_dsl::configs::for_description(Op::Forward, width, &limits, None)
            .expect("a flash configuration at the width");
        let flash = KernelSpec::flash("f", Op::Forward, head_dim, CAUSAL_DOC, config)
            .with_head_dim_v(head_dim_v);
        compile(&flash).unwrap_or_else(|e| panic!("flash {head_dim}/{head_dim_v}: {e}"));
    }
    let equal = forward(64, CAUSAL_DOC).with_head_dim_v(64);
    assert_eq!(equal.out_dim, 0, "an equal width is no second width");
    // The per-row backward takes two widths; the flash backward refuses them, for now.
    for op in [Op::BackwardPrep, Op::BackwardQ, Op::BackwardKv] {
        for (head_dim, head_dim_v) in [(192, 128), (64, 128), (128, 64)] {
            let masks = match op {
                Op::BackwardPrep => attn_dsl::Masks::default(),
                _ => CAUSAL_DOC,
            };
            let mut spec = KernelSpec::standard("b", op, head_dim, masks);
            spec.workgroup_size = spec.workgroup_size.max(head_dim.max(head_dim_v));
            if op == Op::BackwardKv {
                spec.writes = vec![
                    ("dk".into(), WriteMode::Owned),
                    ("dv".into(), WriteMode::Owned),
                ];
            }
            let abi = compile(&spec.with_head_dim_v(head_dim_v))
                .unwrap_or_else(|e| panic!("{op:?} {head_dim}/{head_dim_v}: {e}"));
            assert!(
                abi.wgsl
                    .contains(&format!("const V_DIM: u32 = {head_dim_v}u;"))
            );
        }
    }
    // The flash backward takes them too, the streaming schedule's `dkv` lanes included
    // (each lane dK's rows, then dV's, at their widths); a per-row `dkv` scatter refuses them.
    let config = attn_dsl::configs::for_description(Op::BackwardQ, 128, &limits, None).unwrap();
    let flash = KernelSpec::flash("b", Op::BackwardQ, 128, CAUSAL_DOC, config).with_head_dim_v(64);
    compile(&flash).unwrap_or_else(|e| panic!("flash backward 128/64: {e}"));
    let dkv = vec![
        ("dq".into(), WriteMode::Owned),
        ("dkv".into(), WriteMode::AtomicScatter),
    ];
    let config = attn_dsl::configs::for_description(Op::BackwardQ, 64, &limits, None).unwrap();
    let streaming = KernelSpec {
        writes: dkv.clone(),
        ..KernelSpec::flash("s", Op::BackwardQ, 64, CAUSAL_DOC, config)
    }
    .with_head_dim_v(32);
    let abi = compile(&streaming).unwrap_or_else(|e| panic!("streaming 64/32: {e}"));
    assert!(abi.wgsl.contains("fn dkv_lane() -> u32"));
    let per_row = KernelSpec {
        writes: dkv,
        ..KernelSpec::standard("s", Op::BackwardQ, 128, CAUSAL_DOC)
    }
    .with_head_dim_v(64);
    assert_eq!(field_of(&per_row), Field::HeadDimV);
    let config = attn_dsl::configs::for_description(Op::Forward, 128, &limits, None).unwrap();
    let ragged = KernelSpec::flash("r", Op::Forward, 128, CAUSAL_DOC, config).with_head_dim_v(62);
    assert_eq!(field_of(&ragged), Field::HeadDimV);
}

/// Modifiers built to report their first out-of-range read: the forward, the split-K
/// decode and both backward halves of every library example that reads a tensor validate,
/// bind `flex_reads` and test each read through `flex_read_ok`; the plain build of the same
/// modifiers binds nothing more.
#[test]
fn reporting_modifiers_bind_flex_reads_in_every_kernel() {
    for example in attn_dsl::flex::library::examples() {
        if example.flex.tensors.is_empty() {
            continue;
        }
        let plain = example.flex.intern();
        for (flex, reports) in [(plain, false), (plain.reporting(), true)] {
            assert_eq!(flex.plain(), plain);
            let masks = Masks {
                causal: true,
                flex: Some(flex),
                ..Masks::default()
            };
            let config = attn_dsl::configs::forward(64)[0];
            let specs = [
                KernelSpec::flash("f", Op::Forward, 64, masks, config),
                KernelSpec {
                    grid: attn_dsl::Grid::rows(attn_dsl::Major::Slice, 4),
                    writes: vec![("partials".into(), WriteMode::ScratchFlush)],
                    ..KernelSpec::standard(
                        "d",
                        Op::DecodeSplit,
                        64,
                        Masks {
                            causal: false,
                            ..masks
                        },
                    )
                },
            ];
            for mut spec in specs {
                spec.fit_target();
                let what = format!("{} {:?} reports {reports}", example.name, spec.op);
                let abi = attn_dsl::compile(&spec).unwrap_or_else(|e| panic!("{what}: {e}"));
                let bound = abi.binding("flex_reads").is_some();
                assert_eq!(bound, reports, "{what}");
                assert_eq!(abi.wgsl.contains("flex_read_ok("), reports, "{what}");
            }
        }
    }
}

/// Modifiers that ask for a block mask: the forward, both tensor-core backward halves and
/// the split-K decode of a mask that interval arithmetic cannot bound (a tensor read, `b`)
/// bind `block_mask` and narrow their tile tests by it (the key-major half asking the mask
/// of no pair in a full block), and `op: block_mask` makes it from the same modifiers; a
/// mask whose key ranges are exact needs no tile test, so its kernels bind none (a window,
/// and prefix-LM's keys below the larger of `q + 1` and `prefix[b]`).
#[test]
fn block_mask_modifiers_bind_the_mask_where_tiles_are_tested() {
    use attn_dsl::{Dtype, flex::library};
    let examples = [
        ("documents", true),
        ("prefix-lm", false),
        ("sliding-window", false),
    ];
    for (example, reads) in examples {
        let flex = library::preset(example).unwrap().intern().with_block_mask();
        let masks = Masks {
            causal: true,
            flex: Some(flex),
            ..Masks::default()
        };
        let config = attn_dsl::configs::forward(64)[0];
        let coop = attn_dsl::configs::coop_backward_in(
            64,
            attn_dsl::configs::CANDIDATE_WORKGROUP_BYTES,
            Dtype::F16,
        )[0];
        let tensor_cores = |op| KernelSpec {
            dtype: Dtype::F16,
            ..KernelSpec::flash("t", op, 64, masks, coop)
        };
        let specs = [
            KernelSpec::flash("f", Op::Forward, 64, masks, config),
            tensor_cores(Op::BackwardQ),
            tensor_cores(Op::BackwardKv),
            KernelSpec {
                grid: attn_dsl::Grid::rows(attn_dsl::Major::Slice, 4),
                writes: vec![("partials".into(), WriteMode::ScratchFlush)],
                ..KernelSpec::standard(
                    "d",
                    Op::DecodeSplit,
                    64,
                    Masks {
                        causal: false,
                        ..masks
                    },
                )
            },
        ];
        for spec in specs {
            let what = format!("{example} {:?}", spec.op);
            let abi = attn_dsl::compile(&spec).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(abi.binding("block_mask").is_some(), reads, "{what}");
            assert_eq!(abi.wgsl.contains("& block_tile("), reads, "{what}");
            // A tile or block the tile test finds full asks the mask of no pair.
            let full_skips = match spec.op {
                Op::BackwardKv => Some("shown(q, h, col, tile_full)"),
                Op::BackwardQ => Some("(tile_full || key_visible(row, h, j))"),
                Op::Forward => Some("if (!tile_full) {"),
                _ => None,
            };
            if let Some(text) = full_skips {
                assert_eq!(abi.wgsl.contains(text), reads, "{what}");
            }
            // documents read `doc[b][..]`: the tile test takes the workgroup's sequence.
            assert_eq!(
                abi.wgsl.contains("sh_batch = vec4<u32>(batch);"),
                reads,
                "{what}"
            );
        }
        let maker = KernelSpec::block_mask("m", flex);
        let abi = attn_dsl::compile(&maker).unwrap_or_else(|e| panic!("{example} maker: {e}"));
        assert!(abi.wgsl.contains("fn mask_mod("), "{example}");
        assert_eq!(
            abi.binding("block_mask").map(|b| b.write.is_some()),
            Some(true),
            "{example}"
        );
    }
}

/// An inclusive end fixed per sequence at i32's largest value (`k <= 2147483647`: every
/// key) is a range (its end held below overflow, `flex::bounds`): the forward, both
/// backward halves and the split-K decode compile it with no pair test.
#[test]
fn an_inclusive_fixed_end_at_i32_max_compiles_as_a_range() {
    use attn_dsl::flex::{BinOp, Flex, library, library::build::*};
    let flex = Flex {
        mask_mod: Some(bin(
            BinOp::Or,
            library::causal(),
            bin(BinOp::Le, v("k"), i(i64::from(i32::MAX))),
        )),
        ..Flex::default()
    }
    .intern();
    let masks = Masks {
        flex: Some(flex),
        ..Masks::default()
    };
    let config = attn_dsl::configs::forward(64)[0];
    let specs = [
        KernelSpec::flash("f", Op::Forward, 64, masks, config),
        KernelSpec::standard("bq", Op::BackwardQ, 64, masks),
        KernelSpec::standard("bkv", Op::BackwardKv, 64, masks),
        KernelSpec {
            grid: attn_dsl::Grid::rows(attn_dsl::Major::Slice, 4),
            writes: vec![("partials".into(), WriteMode::ScratchFlush)],
            ..KernelSpec::standard("d", Op::DecodeSplit, 64, masks)
        },
    ];
    for spec in specs {
        assert!(!spec.tests_mask_pairs());
        let abi = attn_dsl::compile(&spec).unwrap_or_else(|e| panic!("{:?}: {e}", spec.op));
        assert!(
            abi.wgsl.contains("fn mask_reach_0() -> i32"),
            "{:?}",
            spec.op
        );
    }
}
