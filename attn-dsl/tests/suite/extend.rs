//! `extend`, new rows over a KV cache on the forward's schedule: every flash and
//! tensor-core configuration, both cache layouts and the modifiers a decode takes compile
//! and validate; its rows are positions after the cache's, causal among themselves with
//! `causal` and each seeing the whole cache without it, and the checks refuse what a
//! continued cache cannot honour.

use attn_dsl::WriteMode::{Owned, ScratchFlush};
use attn_dsl::{Cache, Dtype, KernelSpec, Masks, Op, configs};

/// A continued cache's chunk: `masks` with `causal` (its new rows causal among themselves).
fn extend(head_dim: u32, cache: Cache, dtype: Dtype, masks: Masks, coop: bool) -> KernelSpec {
    let masks = Masks {
        causal: true,
        ..masks
    };
    let config = match coop {
        true => configs::coop_forward(head_dim, configs::CANDIDATE_WORKGROUP_BYTES)[0],
        false => configs::forward(head_dim)[0],
    };
    let mut spec = KernelSpec {
        cache,
        dtype,
        writes: vec![("o".into(), Owned), ("lse".into(), Owned)],
        ..KernelSpec::flash("extend", Op::Extend, head_dim, masks, config)
    };
    spec.fit_target();
    spec
}

/// The same, its keys cut into slices whose partials a decode_reduce merges.
fn sliced(head_dim: u32, cache: Cache, dtype: Dtype, masks: Masks, coop: bool) -> KernelSpec {
    let mut spec = KernelSpec {
        writes: vec![("partials".into(), ScratchFlush)],
        ..extend(head_dim, cache, dtype, masks, coop)
    };
    spec.fit_target();
    spec
}

#[test]
fn extend_compiles_in_every_layout_dtype_and_schedule() {
    let mods = [
        Masks::default(),
        Masks {
            window: true,
            alibi: true,
            softcap: true,
            sinks: true,
            ..Masks::default()
        },
    ];
    for head_dim in [64, 128] {
        for cache in [Cache::Contiguous, Cache::Paged] {
            for masks in mods {
                for (dtype, coop) in [
                    (Dtype::F32, false),
                    (Dtype::F16, false),
                    (Dtype::Bf16, false),
                    (Dtype::F16, true),
                ] {
                    let what = format!("d{head_dim} {cache:?} {dtype:?} coop {coop} {masks:?}");
                    let abi = attn_dsl::compile(&extend(head_dim, cache, dtype, masks, coop))
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let no_sinks = Masks {
                        sinks: false,
                        ..masks
                    };
                    let slices = attn_dsl::compile(&sliced(head_dim, cache, dtype, no_sinks, coop))
                        .unwrap_or_else(|e| panic!("{what} sliced: {e}"));
                    let names: Vec<_> = slices.bindings.iter().map(|b| b.name.as_ref()).collect();
                    assert!(
                        names.contains(&"partials") && !names.contains(&"o"),
                        "{what}"
                    );
                    // Each workgroup walks its slice, and leaves its output unnormalized.
                    assert!(slices.wgsl.contains(", slice_lo)"), "{what}");
                    assert!(slices.wgsl.contains("min(row + 1u, slice_hi)"), "{what}");
                    assert!(slices.wgsl.contains("let inv = 1.0;"), "{what}");
                    let names: Vec<_> = abi.bindings.iter().map(|b| b.name.as_ref()).collect();
                    assert_eq!(
                        names.contains(&"block_table"),
                        cache == Cache::Paged,
                        "{what}"
                    );
                    assert!(names.contains(&"seq_lens"), "{what}");
                    // Rows are positions: the tile starts after the cached rows, and Q is
                    // indexed from the first new row.
                    assert!(abi.wgsl.contains("first_row + tile * BR"), "{what}");
                    assert!(abi.wgsl.contains("row - first_row"), "{what}");
                    assert!(abi.wgsl.contains("continue_rows();"), "{what}");
                    assert!(!abi.wgsl.contains("dims.seq_len) - 1u"), "{what}");
                }
            }
        }
    }
}

#[test]
fn extend_with_causal_is_causal_among_its_new_rows() {
    let abi = attn_dsl::compile(&extend(
        64,
        Cache::Contiguous,
        Dtype::F32,
        Masks::default(),
        false,
    ))
    .unwrap();
    assert!(
        abi.wgsl.contains("return vec2<u32>(0u, row + 1u);"),
        "{}",
        abi.wgsl
    );
}

/// Without `causal` every row sees the cache's every key (a cascade's queries over their
/// shared prefix), never past its length.
#[test]
fn extend_without_causal_sees_the_whole_cache() {
    let spec = KernelSpec {
        masks: Masks::default(),
        ..extend(64, Cache::Contiguous, Dtype::F32, Masks::default(), false)
    };
    let abi = attn_dsl::compile(&spec).unwrap();
    assert!(
        abi.wgsl.contains("return vec2<u32>(0u, kv_len);"),
        "{}",
        abi.wgsl
    );
}

#[test]
fn extend_refuses_what_a_continued_cache_cannot_honour() {
    let err = |masks: Masks| {
        attn_dsl::compile(&extend(64, Cache::Contiguous, Dtype::F32, masks, false))
            .unwrap_err()
            .to_string()
    };
    let doc = err(Masks {
        document: true,
        ..Masks::default()
    });
    assert!(doc.contains("one document"), "{doc}");
    let dropout = err(Masks {
        dropout: true,
        ..Masks::default()
    });
    assert!(dropout.contains("inference"), "{dropout}");
    let per_row = KernelSpec {
        writes: vec![("o".into(), Owned), ("lse".into(), Owned)],
        ..KernelSpec::standard("extend", Op::Extend, 64, Masks::default())
    };
    let grid = attn_dsl::compile(&per_row).unwrap_err().to_string();
    assert!(grid.contains("s_major(flash)"), "{grid}");
    let fp8 = KernelSpec {
        kv_fp8: Some(attn_dsl::Fp8::E4m3),
        ..extend(64, Cache::Contiguous, Dtype::F16, Masks::default(), false)
    };
    let fp8 = attn_dsl::compile(&fp8).unwrap_err().to_string();
    assert!(fp8.contains("e4m3"), "{fp8}");
    let sinks = Masks {
        sinks: true,
        ..Masks::default()
    };
    let sliced_sinks = sliced(64, Cache::Contiguous, Dtype::F32, sinks, false);
    let e = attn_dsl::compile(&sliced_sinks).unwrap_err().to_string();
    assert!(e.contains("decode_reduce"), "{e}");
    let both = KernelSpec {
        writes: vec![
            ("o".into(), Owned),
            ("lse".into(), Owned),
            ("partials".into(), ScratchFlush),
        ],
        ..extend(64, Cache::Contiguous, Dtype::F32, Masks::default(), false)
    };
    let e = attn_dsl::compile(&both).unwrap_err().to_string();
    assert!(e.contains("not both"), "{e}");
}

/// A sliced chunk's grid has a workgroup per (query tile, head, sequence × slice).
#[test]
fn a_sliced_grid_covers_every_slice_of_every_sequence() {
    let abi = attn_dsl::compile(&sliced(
        128,
        Cache::Contiguous,
        Dtype::F16,
        Masks::default(),
        true,
    ))
    .unwrap();
    let tile = abi.grid.tile;
    // seq_len, n_heads, n_kv_heads, head_dim, batch, window, capacity, page_size,
    // pages_per_seq, slot0, n_slices, slice_len.
    let grid = abi.dispatch_grid(&[100, 32, 8, 128, 3, 0, 4096, 0, 0, 0, 5, 832]);
    assert_eq!(grid, [100u32.div_ceil(tile), 32, 15]);
}

/// On tensor cores an extend reads an fp8 cache: four values a word widened into its f16
/// tiles with the KV head's scales, every layout and format, sliced or not.
#[test]
fn an_fp8_cache_extends_on_tensor_cores() {
    for fp8 in [attn_dsl::Fp8::E4m3, attn_dsl::Fp8::E5m2] {
        for cache in [Cache::Contiguous, Cache::Paged] {
            for head_dim in [64, 128] {
                let whole = extend(head_dim, cache, Dtype::F16, Masks::default(), true);
                let sliced = KernelSpec {
                    writes: vec![("partials".into(), ScratchFlush)],
                    ..whole.clone()
                };
                let mut packed = sliced.clone();
                packed.grid.pack_heads = true;
                for (form, spec) in [("whole", whole), ("sliced", sliced), ("packed", packed)] {
                    let spec = KernelSpec {
                        kv_fp8: Some(fp8),
                        ..spec
                    };
                    let what = format!("{fp8:?} {cache:?} d{head_dim} {form}");
                    let abi = attn_dsl::compile(&spec).unwrap_or_else(|e| panic!("{what}: {e}"));
                    let ty = |name: &str| abi.binding(name).map(|b| b.wgsl_type.to_string());
                    assert_eq!(ty("k").as_deref(), Some("array<u32>"), "{what}");
                    assert_eq!(ty("v").as_deref(), Some("array<u32>"), "{what}");
                    assert!(ty("kv_scales").is_some(), "{what}");
                    // Widened exactly at the store; the scales go to the scores and O.
                    assert!(abi.wgsl.contains("vec4<f16>(widen_kv4(pk_0))"), "{what}");
                    assert!(abi.wgsl.contains("vec4<f16>(widen_kv4(pv_0))"), "{what}");
                    assert!(
                        abi.wgsl.contains("params.scale * kv_unit(kv_head(h))"),
                        "{what}"
                    );
                    assert!(abi.wgsl.contains("* (inv * o_unit)"), "{what}");
                }
            }
        }
    }
}

/// A ragged chunk reads each sequence's rows from `q_starts` (scalar tiles and tensor
/// cores, whole, sliced and packed), and its tiles past a sequence's rows see no keys;
/// another op refuses the grid's `ragged`.
#[test]
fn a_ragged_chunk_takes_each_sequence_s_rows_from_q_starts() {
    for coop in [false, true] {
        let dtype = if coop { Dtype::F16 } else { Dtype::F32 };
        let whole = extend(128, Cache::Paged, dtype, Masks::default(), coop);
        let cut = sliced(128, Cache::Contiguous, dtype, Masks::default(), coop);
        let mut packed = cut.clone();
        packed.grid.pack_heads = coop;
        for (form, mut spec) in [("whole", whole), ("sliced", cut), ("packed", packed)] {
            let what = format!("coop {coop} {form}");
            let plain = attn_dsl::compile(&spec).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(plain.binding("q_starts").is_none(), "{what}");
            spec.grid.ragged = true;
            let abi = attn_dsl::compile(&spec).unwrap_or_else(|e| panic!("{what}: {e}"));
            let ty = abi.binding("q_starts").map(|b| b.wgsl_type.to_string());
            assert_eq!(ty.as_deref(), Some("array<u32>"), "{what}");
            assert!(abi.wgsl.contains("q_row0 = q_starts[batch];"), "{what}");
            assert!(abi.wgsl.contains("q_starts[batch + 1u] - q_row0"), "{what}");
            assert!(abi.wgsl.contains("return vec4<u32>(0u);"), "{what}");
            assert!(
                plain.wgsl.contains("q_row0 = batch * dims.seq_len;"),
                "{what}"
            );
        }
    }
    let mut forward = KernelSpec::flash(
        "forward",
        Op::Forward,
        64,
        Masks::default(),
        configs::forward(64)[0],
    );
    forward.grid.ragged = true;
    let err = attn_dsl::compile(&forward).unwrap_err().to_string();
    assert!(err.contains("`ragged` belongs to op extend"), "{err}");
}

/// A bf16 chunk on tensor cores scales each row by its own values as it is fetched (no
/// `row_scale` pass has seen a cache's rows): K's and V's maxima over the lanes of one
/// subgroup that fetched the row, Q's before Q is staged; sliced, O stays unnormalized.
/// Rows wider than a subgroup's lanes stay on scalar tiles.
#[test]
fn a_bf16_chunk_scales_its_rows_as_they_are_fetched() {
    use attn_dsl::layout::coop::on_tensor_cores;
    let bf16 = |head_dim: u32, cache: Cache, bytes: u32| {
        let config = configs::coop_forward_in(head_dim, bytes, Dtype::Bf16)[0];
        let masks = Masks::new(true, false);
        let mut spec = KernelSpec {
            cache,
            dtype: Dtype::Bf16,
            writes: vec![("o".into(), Owned), ("lse".into(), Owned)],
            ..KernelSpec::flash("extend", Op::Extend, head_dim, masks, config)
        };
        spec.fit_target();
        spec
    };
    for cache in [Cache::Contiguous, Cache::Paged] {
        for head_dim in [64, 128] {
            let whole = bf16(head_dim, cache, configs::CANDIDATE_WORKGROUP_BYTES);
            let mut cut = KernelSpec {
                writes: vec![("partials".into(), ScratchFlush)],
                ..whole.clone()
            };
            cut.fit_target();
            for (form, spec) in [("whole", whole), ("sliced", cut)] {
                let what = format!("{cache:?} d{head_dim} {form}");
                let abi = attn_dsl::compile(&spec).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(abi.binding("row_max").is_none(), "{what}");
                for x in [
                    "let bk_0 = lanes_row_bits(pk_0);",
                    "let bv_0 = lanes_row_bits(pv_0);",
                    "put(sg * 32u + lane + 0u * WG, KB, to_half(pk_0, bk_0));",
                    "q_row_maxima(row0, h, sg * 32u + lane);",
                    "m = max(m, subgroupShuffleXor(m, 8u));",
                ] {
                    assert!(abi.wgsl.contains(x), "{what}: {x}");
                }
                assert!(!abi.wgsl.contains("kv_bits("), "{what}");
                let unnormalized = abi.wgsl.contains("exp2(mo - m * LOG2E), lt != 0.0)");
                assert_eq!(unnormalized, form == "sliced", "{what}");
            }
        }
    }
    assert!(on_tensor_cores(Dtype::Bf16, Op::Extend, 128));
    assert!(!on_tensor_cores(Dtype::Bf16, Op::Extend, 256));
    assert!(on_tensor_cores(Dtype::Bf16, Op::Forward, 256));
    let e = attn_dsl::compile(&bf16(256, Cache::Contiguous, 1 << 20)).unwrap_err();
    assert!(e.to_string().contains("head_dim / 4 must divide 32"), "{e}");
}
