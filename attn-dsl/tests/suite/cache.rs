//! The device KV cache's kernels in the IR: `cache_append` for both layouts and every
//! dtype, and `dkv_reduce`, compile and validate under WebGPU's defaults; their grids cover
//! their work; and the checks refuse what they cannot honour.

use attn_dsl::{Cache, Dtype, KernelSpec, Masks, Op};

fn append(head_dim: u32, cache: Cache, dtype: Dtype) -> KernelSpec {
    KernelSpec {
        cache,
        dtype,
        ..KernelSpec::standard("append", Op::CacheAppend, head_dim, Masks::default())
    }
}

#[test]
fn append_compiles_for_both_layouts_and_every_dtype() {
    for head_dim in [32, 64, 128, 192, 256] {
        for cache in [Cache::Contiguous, Cache::Paged] {
            for dtype in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
                let abi = attn_dsl::compile(&append(head_dim, cache, dtype))
                    .unwrap_or_else(|e| panic!("d{head_dim} {cache:?} {dtype:?}: {e}"));
                assert!(abi.storage_buffers() <= 8);
                assert_eq!(abi.workgroup_storage_bytes, 0);
                let names: Vec<_> = abi.bindings.iter().map(|b| b.name.as_ref()).collect();
                assert_eq!(names.contains(&"block_table"), cache == Cache::Paged);
                assert!(names.contains(&"seq_lens") && names.contains(&"seq_lens_next"));
            }
        }
    }
}

#[test]
fn append_grid_covers_every_new_vec4_and_every_sequence() {
    let abi = attn_dsl::compile(&append(128, Cache::Contiguous, Dtype::F16)).unwrap();
    // n_new, n_slots, n_kv_heads, head_dim, batch.
    let grid = abi.dispatch_grid(&[4, 8, 8, 128, 3]);
    assert_eq!(
        grid,
        [4, 3, 1],
        "4 rows × 8 heads × 32 vec4s over 256 invocations"
    );
    // A long prefill strides rather than growing the grid past the cap.
    let grid = abi.dispatch_grid(&[1 << 20, 1, 8, 128, 1]);
    assert_eq!(grid[0], attn_dsl::emit::MAX_STRIDE_WORKGROUPS);
    // No new rows still gets a workgroup, which writes the lengths.
    assert_eq!(abi.dispatch_grid(&[0, 1, 8, 128, 1]), [1, 1, 1]);
}

#[test]
fn dkv_reduce_compiles_and_sums_every_lane() {
    let spec = KernelSpec::standard("reduce", Op::DkvReduce, 64, Masks::default());
    let abi = attn_dsl::compile(&spec).unwrap();
    let lanes = (0..attn_dsl::DKV_LANES)
        .filter(|l| abi.wgsl.contains(&format!("lane({l}u, part, i)")))
        .count() as u32;
    assert_eq!(lanes, attn_dsl::DKV_LANES);
    assert_eq!(
        abi.dispatch_grid(&[1000]),
        [4, 1, 1],
        "1000 vec4s over 256 invocations"
    );
}

#[test]
fn the_new_ops_take_no_masks() {
    for op in [Op::CacheAppend, Op::DkvReduce] {
        let spec = KernelSpec::standard("k", op, 64, Masks::new(true, false));
        let err = attn_dsl::compile(&spec).unwrap_err().to_string();
        assert!(err.contains("cannot honour `causal`"), "{err}");
    }
}

#[test]
fn conversions_compile_for_every_dtype() {
    for op in [Op::ToDtype, Op::FromDtype] {
        for dtype in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
            let spec = KernelSpec {
                dtype,
                ..KernelSpec::standard("convert", op, 4, Masks::default())
            };
            let abi = attn_dsl::compile(&spec).unwrap_or_else(|e| panic!("{op:?} {dtype:?}: {e}"));
            assert_eq!(
                abi.dispatch_grid(&[1 << 30]),
                [attn_dsl::emit::MAX_STRIDE_WORKGROUPS, 1, 1]
            );
        }
    }
}

/// Rows the kernels read as vec4: a width that is not a multiple of 4 is refused at the
/// head_dim, with the reason, not emitted as WGSL naga rejects.
#[test]
fn vec4_rows_refuse_widths_off_a_multiple_of_4() {
    for (spec, what) in [
        (append(2, Cache::Contiguous, Dtype::F32), "cache append"),
        (append(6, Cache::Paged, Dtype::F16), "cache append"),
        (
            KernelSpec::standard("merge", Op::Merge, 6, Masks::default()),
            "merge",
        ),
    ] {
        let e = attn_dsl::compile(&spec).expect_err(what).to_string();
        assert!(e.contains("not a multiple of 4") && e.contains(what), "{e}");
    }
}
