//! Split-K decode in the IR: both passes compile and validate at head_dims 64 to 256 under
//! WebGPU's defaults, and the ownership and source checks hold.

use attn_dsl::{Dtype, Gqa, Grid, KernelSpec, Major, Masks, Op, Source, WriteMode};

fn split(head_dim: u32, heads: u32, masks: Masks) -> KernelSpec {
    KernelSpec {
        grid: Grid::rows(Major::Slice, heads),
        writes: vec![("partials".into(), WriteMode::ScratchFlush)],
        ..KernelSpec::standard("split", Op::DecodeSplit, head_dim, masks)
    }
}

fn reduce(head_dim: u32) -> KernelSpec {
    KernelSpec {
        source: Source::Scratch,
        ..KernelSpec::standard("reduce", Op::DecodeReduce, head_dim, Masks::default())
    }
}

#[test]
fn both_passes_compile_under_webgpu_defaults() {
    let mods = Masks {
        window: true,
        alibi: true,
        softcap: true,
        ..Masks::default()
    };
    for hd in [32, 64, 80, 96, 128, 256] {
        for heads in 1..=4 {
            for masks in [Masks::default(), mods] {
                let abi = attn_dsl::compile(&split(hd, heads, masks))
                    .unwrap_or_else(|e| panic!("split d{hd} x{heads}: {e}"));
                assert!(abi.workgroup_storage_bytes <= 16384, "d{hd}");
                assert!(abi.storage_buffers() <= 8);
            }
        }
        attn_dsl::compile(&reduce(hd)).unwrap_or_else(|e| panic!("reduce d{hd}: {e}"));
    }
}

#[test]
fn a_slice_holds_whole_key_tiles() {
    for hd in [64, 128, 256] {
        let spec = split(hd, 4, Masks::default());
        let (tile, max) = (
            attn_dsl::emit::split_key_tile(&spec),
            attn_dsl::emit::split_max_slice(&spec),
        );
        assert!(
            max.is_multiple_of(tile) && max >= tile,
            "d{hd}: {max} / {tile}"
        );
    }
}

#[test]
fn owned_partials_and_named_producer_are_required() {
    let mut owned = split(64, 4, Masks::default());
    owned.writes[0].1 = WriteMode::Owned;
    let e = attn_dsl::compile(&owned).unwrap_err().to_string();
    assert!(e.contains("scratch"), "{e}");
    let mut no_source = reduce(64);
    no_source.source = Source::Recompute;
    let e = attn_dsl::compile(&no_source).unwrap_err().to_string();
    assert!(e.contains("source: scratch"), "{e}");
    let mut too_many = split(64, 5, Masks::default());
    too_many.gqa = Gqa::Any;
    assert!(attn_dsl::compile(&too_many).is_err());
    let causal = split(64, 4, Masks::new(true, false));
    assert!(attn_dsl::compile(&causal).is_err());
}

#[test]
fn only_the_split_pass_reads_a_paged_cache() {
    let paged = KernelSpec {
        cache: attn_dsl::Cache::Paged,
        ..split(128, 4, Masks::default())
    };
    let abi = attn_dsl::compile(&paged).unwrap();
    assert!(abi.binding("block_table").is_some());
    assert!(abi.storage_buffers() <= 8);
    let plain = KernelSpec {
        cache: attn_dsl::Cache::Paged,
        ..KernelSpec::standard("d", Op::Decode, 64, Masks::default())
    };
    let e = attn_dsl::compile(&plain).unwrap_err();
    assert_eq!(e.field(), Some(&attn_dsl::Field::Cache), "{e}");
}

/// In f16 and bf16 the query, the cache and O are 16-bit (four to a vec4 element: f16
/// `vec4<f16>`, bf16 two words; the split pass reads its cache eight to a 16-byte word);
/// the partials stay f32.
#[test]
fn both_passes_compile_in_half_precision() {
    for (dtype, wgsl) in [
        (attn_dsl::Dtype::F16, "array<vec4<f16>>"),
        (attn_dsl::Dtype::Bf16, "array<vec2<u32>>"),
    ] {
        for hd in [32, 128, 256] {
            let s = attn_dsl::compile(&KernelSpec {
                dtype,
                ..split(hd, 4, Masks::default())
            })
            .unwrap_or_else(|e| panic!("split {dtype:?} d{hd}: {e}"));
            assert_eq!(s.binding("q").unwrap().wgsl_type, wgsl);
            for name in ["k_cache", "v_cache"] {
                assert_eq!(
                    s.binding(name).unwrap().wgsl_type,
                    "array<vec4<u32>>",
                    "{name}"
                );
            }
            assert_eq!(s.binding("partials").unwrap().wgsl_type, "array<vec4<f32>>");
            let r = attn_dsl::compile(&KernelSpec {
                dtype,
                ..reduce(hd)
            })
            .unwrap_or_else(|e| panic!("reduce {dtype:?} d{hd}: {e}"));
            assert_eq!(r.binding("o").unwrap().wgsl_type, wgsl);
        }
    }
}

/// An fp8 cache: the split pass and the append read and write it as u32 words of four
/// values with the scales bound, in every dtype of Q and O and both layouts, within
/// WebGPU's 8 storage buffers; the other ops refuse it at the cache field.
#[test]
fn fp8_caches_are_words_of_four_with_their_scales() {
    use attn_dsl::{Cache, Dtype, Fp8, Scalar};
    for f in Fp8::ALL {
        for dtype in Dtype::ALL {
            for cache in [Cache::Contiguous, Cache::Paged] {
                let specs = [
                    split(128, 4, Masks::default()),
                    KernelSpec::standard("append", Op::CacheAppend, 128, Masks::default()),
                ];
                for spec in specs {
                    let spec = KernelSpec {
                        kv_fp8: Some(f),
                        dtype,
                        cache,
                        ..spec
                    };
                    let abi = attn_dsl::compile(&spec)
                        .unwrap_or_else(|e| panic!("{:?} {f:?} {dtype:?} {cache:?}: {e}", spec.op));
                    for name in ["k_cache", "v_cache"] {
                        let b = abi.binding(name).unwrap();
                        assert_eq!(b.scalar, Scalar::from(f));
                        assert_eq!(b.wgsl_type, "array<u32>");
                    }
                    assert_eq!(abi.binding("kv_scales").unwrap().scalar, Scalar::F32);
                    assert!(abi.storage_buffers() <= 8, "{:?}", spec.op);
                    assert!(abi.wgsl.contains("fn widen_kv4") || spec.op == Op::CacheAppend);
                }
            }
        }
    }
    // Without fp8 the cache is the dtype's vec4s and no scales are bound.
    let abi = attn_dsl::compile(&split(128, 4, Masks::default())).unwrap();
    assert_eq!(
        abi.binding("k_cache").unwrap().wgsl_type,
        "array<vec4<f32>>"
    );
    assert!(abi.binding("kv_scales").is_none());
    let forward = KernelSpec {
        kv_fp8: Some(Fp8::E4m3),
        ..KernelSpec::standard("f", Op::Forward, 64, Masks::default())
    };
    let e = attn_dsl::compile(&forward).unwrap_err();
    assert_eq!(e.field(), Some(&attn_dsl::Field::Cache), "{e}");
}

/// MLA's rows of two widths: every decode op and the append compile with K rows
/// `head_dim` wide and V rows `head_dim_v`, in every dtype, cache layout and fp8, and name
/// each width; a V row that ends within a vec4 is refused at head_dim_v.
#[test]
fn decode_ops_take_v_rows_of_another_width() {
    use attn_dsl::{Cache, Dtype, Field, Fp8};
    for (hd, dv) in [(192, 128), (64, 128), (128, 64)] {
        for dtype in Dtype::ALL {
            for cache in [Cache::Contiguous, Cache::Paged] {
                for fp8 in [None, Some(Fp8::E4m3)] {
                    let specs = [
                        split(hd, 4, Masks::default()),
                        KernelSpec::standard("append", Op::CacheAppend, hd, Masks::default()),
                    ];
                    for spec in specs {
                        let spec = KernelSpec {
                            dtype,
                            cache,
                            kv_fp8: fp8,
                            ..spec
                        }
                        .with_head_dim_v(dv);
                        let abi = attn_dsl::compile(&spec).unwrap_or_else(|e| {
                            panic!("{:?} {hd}/{dv} {dtype:?} {cache:?} {fp8:?}: {e}", spec.op)
                        });
                        assert_eq!((abi.head_dim, abi.head_dim_v()), (hd, dv));
                        assert!(abi.wgsl.contains(&format!("const V_DIM: u32 = {dv}u;")));
                        assert!(abi.wgsl.contains("const QK4: u32 = QK_DIM / 4u;"));
                    }
                }
            }
        }
        let one_row = KernelSpec::standard("d", Op::Decode, hd, Masks::default());
        for spec in [one_row, reduce(hd)] {
            let abi = attn_dsl::compile(&spec.with_head_dim_v(dv))
                .unwrap_or_else(|e| panic!("{hd}/{dv}: {e}"));
            assert_eq!(abi.head_dim_v(), dv);
        }
    }
    let ragged = split(128, 4, Masks::default()).with_head_dim_v(62);
    let e = attn_dsl::compile(&ragged).unwrap_err();
    assert_eq!(e.field(), Some(&Field::HeadDimV), "{e}");
}

/// A `mask_mod` bounds which tiles of a slice the served queries can see: both loops step
/// from one such tile to the next (a mask that names `h` asks each served query's head), the
/// skipped keys' scores stay `NEG_BIG`; without a mask both loops visit every key.
#[test]
fn a_mask_mod_decode_skips_the_tiles_it_cannot_see() {
    use attn_dsl::flex::library::{self, build};
    use attn_dsl::flex::{BinOp, Flex};
    let with = |mask_mod| Masks {
        flex: Some(
            Flex {
                score_mod: None,
                mask_mod: Some(mask_mod),
                ..Flex::default()
            }
            .intern(),
        ),
        ..Masks::default()
    };
    let window = attn_dsl::compile(&split(64, 4, with(library::window_with_sinks(256, 4))))
        .expect("a window decode compiles");
    for step in [
        "k_next = next_tile(t0 + KEY_TILE, hi, KEY_TILE, sv, wg_b);",
        "v_next = next_tile(t + PV_STEP, hi, PV_STEP, sv, wg_b);",
        "sh_s[i] = vec4<f32>(NEG_BIG);",
        "return mask_tile(q0, q1, k0, k1, sv.h.x, b).x;",
    ] {
        assert!(window.wgsl.contains(step), "missing `{step}`");
    }
    // Head h sees only keys of its parity: a tile is visited if any served head sees it.
    let by_head = build::bin(
        BinOp::Eq,
        build::bin(BinOp::Sub, build::v("k"), build::v("h")),
        build::i(0),
    );
    let heads = attn_dsl::compile(&split(64, 4, with(by_head))).expect("compiles");
    assert!(
        heads
            .wgsl
            .contains("seen = seen || mask_tile(q0, q1, k0, k1, sv.h[i], b).x;")
    );
    let plain = attn_dsl::compile(&split(64, 4, Masks::default())).expect("compiles");
    assert!(!plain.wgsl.contains("next_tile"));
    assert!(
        plain
            .wgsl
            .contains("for (var t0 = first; t0 < hi; t0 = t0 + KEY_TILE) {")
    );
}

/// The streamed split pass of `split`'s description, by rule: subgroups natively, or the
/// workgroup-memory butterfly under WebGPU's defaults.
fn streamed(mut spec: KernelSpec, subgroups: bool) -> KernelSpec {
    spec.grid.flash = Some(attn_dsl::layout::decode::stream_flash(&spec));
    spec.grid.subgroups = subgroups;
    spec.fit_target();
    spec
}

#[test]
fn the_streamed_pass_compiles_for_every_width_dtype_and_cache() {
    use attn_dsl::{Cache, Dtype, Fp8};
    let mods = Masks {
        window: true,
        alibi: true,
        softcap: true,
        ..Masks::default()
    };
    for (hd, hv) in [
        (32, 32),
        (64, 64),
        (80, 80),
        (96, 96),
        (128, 128),
        (256, 256),
        (192, 128),
        (36, 36),
    ] {
        for (dtype, fp8) in [
            (Dtype::F32, None),
            (Dtype::F16, None),
            (Dtype::Bf16, None),
            (Dtype::F16, Some(Fp8::E4m3)),
            (Dtype::F32, Some(Fp8::E5m2)),
        ] {
            for cache in [Cache::Contiguous, Cache::Paged] {
                for (heads, masks, sg) in [(4, Masks::default(), true), (3, mods, false)] {
                    let spec = streamed(
                        KernelSpec {
                            dtype,
                            kv_fp8: fp8,
                            cache,
                            ..split(hd, heads, masks)
                        }
                        .with_head_dim_v(hv),
                        sg,
                    );
                    let abi = attn_dsl::compile(&spec).unwrap_or_else(|e| {
                        panic!("stream d{hd}/{hv} {dtype:?} {fp8:?} {cache:?} x{heads}: {e}")
                    });
                    assert!(abi.workgroup_storage_bytes <= 16384, "d{hd}");
                    let (tile, max) = (
                        attn_dsl::emit::split_key_tile(&spec),
                        attn_dsl::emit::split_max_slice(&spec),
                    );
                    assert!(
                        max.is_multiple_of(tile) && max > 512,
                        "d{hd}: {max} / {tile}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_streamed_grid_says_its_step() {
    let mut spec = streamed(split(128, 4, Masks::default()), true);
    spec.grid.flash = spec.grid.flash.map(|f| attn_dsl::Flash {
        inner: f.inner + 1,
        ..f
    });
    let e = attn_dsl::compile(&spec).unwrap_err().to_string();
    assert!(e.contains("key_tile ="), "{e}");
    let mut webgpu = streamed(split(128, 4, Masks::default()), true);
    webgpu.target = attn_dsl::Target::Webgpu;
    let e = attn_dsl::compile(&webgpu).unwrap_err().to_string();
    assert!(e.contains("native"), "{e}");
}

#[test]
fn a_device_with_more_workgroup_memory_takes_longer_slices() {
    let longest = |storage: u32| {
        let mut spec = KernelSpec {
            dtype: attn_dsl::Dtype::F16,
            ..split(128, 4, Masks::default())
        };
        spec.fit_device(storage);
        attn_dsl::compile(&spec).expect("the split pass compiles");
        (attn_dsl::emit::split_max_slice(&spec), spec.target)
    };
    // WebGPU's 16 KiB: the slices its memory holds, and WebGPU's target.
    let (slice, target) = longest(16384);
    assert_eq!((slice, target), (608, attn_dsl::Target::Webgpu));
    // An H200's 48 KiB: the cap, on a native target holding just that layout.
    let (slice, target) = longest(49152);
    assert_eq!(slice, attn_dsl::layout::decode::SLICE_CAP);
    let attn_dsl::Target::Native(limits) = target else {
        panic!("a 1024-key slice needs more than WebGPU's workgroup memory: {target:?}");
    };
    assert!(limits.workgroup_storage_bytes > 16384 && limits.workgroup_storage_bytes < 49152);
    // In between, the longest slice that fits.
    let (slice, _) = longest(20480);
    assert!(
        slice > 608 && slice < 1024 && slice.is_multiple_of(32),
        "{slice}"
    );
}

/// The staged pass with `subgroups`: each key's lanes summed by a butterfly (the scores
/// loop then has no barrier), the slice's max and sum by subgroup reductions, the
/// workgroup-memory sums kept for adapters whose subgroups do not hold a key's lanes;
/// refused under WebGPU's defaults, which have no subgroups.
#[test]
fn the_staged_pass_sums_by_subgroups_natively() {
    for (hd, dtype) in [(64, Dtype::F32), (128, Dtype::F16), (128, Dtype::Bf16)] {
        let mut spec = KernelSpec {
            dtype,
            ..split(hd, 4, Masks::default())
        };
        spec.grid.subgroups = true;
        let err = attn_dsl::compile(&spec).unwrap_err().to_string();
        assert!(err.contains("native"), "{err}");
        spec.fit_device(16384);
        let abi = attn_dsl::compile(&spec).unwrap_or_else(|e| panic!("d{hd}: {e}"));
        for step in [
            "let s = group_sum4(vec4<f32>(",
            "sh_red[tid] = subgroupMax(x);",
            "sh_red[tid] = subgroupAdd(x);",
            "let use_sg = workgroupUniformLoad(&sh_subgroups_off) == 0u;",
        ] {
            assert!(abi.wgsl.contains(step), "d{hd}: missing `{step}`");
        }
        assert!(abi.grid.uses_subgroups());
        let plain = attn_dsl::compile(&KernelSpec {
            dtype,
            ..split(hd, 4, Masks::default())
        })
        .unwrap();
        assert!(!plain.wgsl.contains("subgroup") && !plain.grid.uses_subgroups());
    }
}

/// The staged pass cut to each set of its phases (`bench --decode --phases`) compiles in
/// every cache dtype, with subgroup sums and without; the set of all is the pass itself,
/// a set without the loads reads neither cache, and a set with the key pass or P·V calls
/// that pass's fetches.
#[test]
fn the_staged_pass_compiles_cut_to_its_phases() {
    use attn_dsl::Fp8;
    use attn_dsl::emit::coop::Phases;
    for (dtype, fp8) in [
        (Dtype::F32, None),
        (Dtype::F16, None),
        (Dtype::Bf16, None),
        (Dtype::F16, Some(Fp8::E4m3)),
    ] {
        for subgroups in [false, true] {
            let mut spec = KernelSpec {
                dtype,
                kv_fp8: fp8,
                ..split(128, 4, Masks::default())
            };
            spec.grid.subgroups = subgroups;
            spec.fit_device(16384);
            let whole = attn_dsl::compile(&spec).unwrap();
            for (name, keep) in Phases::decode_sets() {
                let cut = attn_dsl::compile_phases(&spec, keep)
                    .unwrap_or_else(|e| panic!("{dtype:?} {fp8:?} {name}: {e}"));
                assert_eq!(name == "all", cut.wgsl == whole.wgsl, "{name}");
                let reads = cut.wgsl.contains("x = k_cache[") && cut.wgsl.contains("x = v_cache[");
                assert_eq!(reads, keep.stage, "{dtype:?} {name}");
                assert_eq!(cut.wgsl.contains("= fetch_k("), keep.scores, "{name}");
                assert_eq!(cut.wgsl.contains("= fetch_v("), keep.accumulate, "{name}");
            }
        }
    }
}

/// A staged split pass that writes `o` combines its slices itself: natively, with its
/// group's arrivals counted atomically and the reduce's merge (sinks and LSE where asked);
/// refused under WebGPU's defaults (WGSL orders storage only within a workgroup), in the
/// streamed layout, and where it writes LSE without O.
#[test]
fn a_split_pass_that_writes_o_combines_its_slices_natively() {
    let sinks = Masks {
        sinks: true,
        ..Masks::default()
    };
    let owned = |names: &[&str]| {
        let mut writes = vec![("partials".to_string(), WriteMode::ScratchFlush)];
        writes.extend(names.iter().map(|n| (n.to_string(), WriteMode::Owned)));
        writes
    };
    for (hd, dtype, masks, outs) in [
        (64, Dtype::F32, Masks::default(), &["o"][..]),
        (128, Dtype::F16, sinks, &["o", "lse"][..]),
        (128, Dtype::Bf16, Masks::default(), &["o"][..]),
    ] {
        let mut spec = KernelSpec {
            dtype,
            writes: owned(outs),
            ..split(hd, 4, masks)
        };
        let err = attn_dsl::compile(&spec).unwrap_err().to_string();
        assert!(
            err.contains("native") && err.contains("storageBarrier"),
            "{err}"
        );
        spec.fit_device(16384);
        assert!(spec.combines_slices());
        let abi = attn_dsl::compile(&spec).unwrap_or_else(|e| panic!("d{hd}: {e}"));
        for step in [
            "var<storage, read_write> arrivals: array<atomic<u32>>;",
            "atomicAdd(&arrivals[group], 1u)",
            "atomicStore(&arrivals[group], 0u);",
            "combine_served(tid, sv);",
        ] {
            assert!(abi.wgsl.contains(step), "d{hd}: missing `{step}`");
        }
        assert_eq!(abi.wgsl.contains("sinks[h % dims.n_heads]"), masks.sinks);
        assert_eq!(abi.wgsl.contains("lse[q_row0"), outs.contains(&"lse"));
        assert!(abi.binding("o").is_some() && abi.binding("arrivals").is_some());
    }
    let mut lse_alone = KernelSpec {
        writes: owned(&["lse"]),
        ..split(128, 4, Masks::default())
    };
    lse_alone.fit_device(16384);
    let err = attn_dsl::compile(&lse_alone).unwrap_err().to_string();
    assert!(err.contains("`lse` only where it combines"), "{err}");
    let plain = attn_dsl::compile(&split(128, 4, Masks::default())).unwrap();
    assert!(plain.binding("arrivals").is_none() && !plain.wgsl.contains("combine_query"));
}
