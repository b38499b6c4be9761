//! Split-K decode: the slicing rule, the planner's choice, and its input errors.

use runtime::BlockOn;
use runtime::ops::decode::{
    Calibration, DecodePath, Decoder, SplitDecode, plan_decode, plan_slices,
};
use runtime::{DecodeInput, Gpu, Heads, InputError, kernels};

#[test]
fn slices_are_whole_key_tiles_and_cover_the_cache() {
    // The rule never panics, even for lengths no buffer could hold.
    let target = Calibration::default().decode_workgroups();
    let huge = plan_slices(u32::MAX, 1, 32, 512, target);
    assert_eq!(huge.slice_len, 512);
    for cache_len in [1, 7, 31, 32, 33, 300, 4099, 32768, 1 << 20] {
        for others in [1, 8, 64, 1024] {
            let s = plan_slices(cache_len, others, 32, 512, target);
            assert!(
                s.slice_len.is_multiple_of(32) && s.slice_len <= 512,
                "{s:?}"
            );
            assert!(s.n_slices * s.slice_len >= cache_len, "{cache_len}: {s:?}");
            assert!(
                (s.n_slices - 1) * s.slice_len < cache_len,
                "{cache_len}: {s:?}"
            );
        }
    }
    // 32 query heads over 8 KV heads and a 32768-row cache want 33 slices for the target;
    // the key tiles round that to 32 of the longest slice, 1024 keys (256 workgroups).
    let cap = attn_dsl::layout::decode::SLICE_CAP;
    let s = plan_slices(32768, 8, 32, cap, target);
    assert_eq!((s.n_slices, s.slice_len), (32, 1024));
    assert!(target.div_ceil(8) > s.n_slices);
    // An adapter that runs a quarter as many workgroups at once gets longer slices.
    let quarter = Calibration {
        resident: Some(runtime::plan::calibration::H100_RESIDENT / 4),
    };
    let s = plan_slices(32768, 8, 32, cap, quarter.decode_workgroups());
    assert_eq!(
        (s.n_slices, s.slice_len),
        (32, 1024),
        "8 slices wanted, 1024 keys at most"
    );
    let s = plan_slices(4096, 8, 32, cap, quarter.decode_workgroups());
    assert_eq!((s.n_slices, s.slice_len), (8, 512));
}

/// `n` values in [-2, 2) from a linear congruential generator at `state`.
fn noise(state: &mut u32, n: impl TryInto<usize>) -> Vec<f32> {
    let n = n.try_into().unwrap_or(0);
    (0..n)
        .map(|_| {
            *state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (*state >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
        })
        .collect()
}

/// The largest difference of `got` from `want`, relative to `want`'s value or `floor`; a
/// NaN counts as off by infinity (f32::max would skip it).
fn relative_off(got: &[f32], want: &[f32], floor: f32) -> f32 {
    got.iter()
        .zip(want)
        .map(|(x, y)| match (x - y).abs() / y.abs().max(floor) {
            e if e.is_nan() => f32::INFINITY,
            e => e,
        })
        .fold(0.0f32, f32::max)
}

fn input<'a>(cache_len: u32, q: &'a [f32], kv: &'a [f32]) -> DecodeInput<'a> {
    DecodeInput {
        batch: 1,
        cache_len,
        heads: Heads {
            n_heads: 8,
            n_kv_heads: 2,
            head_dim: 64,
            head_dim_v: 64,
        },
        q,
        k_cache: kv,
        v_cache: kv,
        scale: None,
        mods: Default::default(),
    }
}

#[test]
fn planner_splits_caches_longer_than_a_slice_and_refuses_bad_slices() {
    let gpu = Gpu::new(kernels::FAMILY.iter().copied())
        .block_on()
        .unwrap_or_else(|e| panic!("{e}"));
    let (split, reduce) = kernels::DECODE_SPLIT[0];
    let split = SplitDecode::new(&gpu, split, reduce).unwrap();
    let q = vec![0.5f32; 8 * 64];
    let kv = vec![0.25f32; 4099 * 2 * 64];
    // 4 query heads per KV head: split-K shares each K and V read, even over one slice.
    assert!(matches!(
        plan_decode(&split, &input(7, &q, &kv)),
        DecodePath::Split(s) if s.n_slices == 1
    ));
    assert!(matches!(
        plan_decode(&split, &input(4099, &q, &kv)),
        DecodePath::Split(s) if s.n_slices > 1
    ));
    let mha = DecodeInput {
        heads: Heads {
            n_heads: 2,
            ..input(7, &q, &kv).heads
        },
        q: &q[..2 * 64],
        k_cache: &kv[..7 * 2 * 64],
        v_cache: &kv[..7 * 2 * 64],
        ..input(7, &q, &kv)
    };
    assert_eq!(plan_decode(&split, &mha), DecodePath::Plain);
    let bad = split.key_tile() + 1;
    let err = split
        .run(&gpu, &input(4099, &q, &kv), Some(bad))
        .block_on()
        .unwrap_err();
    assert!(
        matches!(err, runtime::Error::Input(InputError::SliceLen { .. })),
        "{err}"
    );
    // Equal keys and values: every head's output is the value row itself, on either path.
    let o = split
        .run(&gpu, &input(4099, &q, &kv), None)
        .block_on()
        .unwrap();
    assert!(o.iter().all(|x| (x - 0.25).abs() < 1e-6));
    let decoder = Decoder::new(&gpu, &kernels::attention_decode::ABI, split).unwrap();
    for inp in [input(4099, &q, &kv), mha] {
        let (o, path) = decoder.run(&gpu, &inp).block_on().unwrap();
        assert_eq!(path, decoder.plan(&inp));
        assert!(o.iter().all(|x| (x - 0.25).abs() < 1e-6));
    }
}

#[test]
fn paged_input_errors_come_before_any_dispatch() {
    use runtime::ops::decode::Pages;
    let gpu = Gpu::new(kernels::FAMILY.iter().copied())
        .block_on()
        .unwrap_or_else(|e| panic!("{e}"));
    let (split, reduce) = kernels::DECODE_SPLIT_PAGED[0];
    let paged = SplitDecode::new(&gpu, split, reduce).unwrap();
    let q = vec![0.5f32; 8 * 64];
    // A pool of 4 pages of 16 keys, 2 KV heads.
    let pool = vec![0.25f32; 4 * 16 * 2 * 64];
    let ok = Pages {
        block_table: &[3, 1],
        page_size: 16,
    };
    let o = paged
        .run_paged(&gpu, &input(20, &q, &pool), &ok, None)
        .block_on()
        .unwrap();
    assert!(o.iter().all(|x| (x - 0.25).abs() < 1e-6));
    let past = Pages {
        block_table: &[3, 4],
        ..ok
    };
    let err = paged
        .run_paged(&gpu, &input(20, &q, &pool), &past, None)
        .block_on()
        .unwrap_err();
    assert!(err.to_string().contains("past the pool's 4 pages"), "{err}");
    // Only the pages cache_len needs are read, so a stale entry after them is fine.
    paged
        .run_paged(&gpu, &input(16, &q, &pool), &past, None)
        .block_on()
        .unwrap();
    let short = paged
        .run_paged(&gpu, &input(33, &q, &pool), &ok, None)
        .block_on()
        .unwrap_err();
    assert!(
        matches!(
            short,
            runtime::Error::Input(InputError::CacheTooShort { .. })
        ),
        "{short}"
    );
    let contiguous = paged
        .run(&gpu, &input(20, &q, &pool), None)
        .block_on()
        .unwrap_err();
    assert!(
        matches!(
            contiguous,
            runtime::Error::Input(InputError::CacheLayout { .. })
        ),
        "{contiguous}"
    );
}

/// The staged split pass summing across invocations by subgroups (each key's lanes by a
/// butterfly, the slice's max and sum by subgroup reductions) gives the workgroup-memory
/// pass's outputs to f32 rounding, over several slices and a ragged last one, on either of
/// its paths: with the subgroup check forced to fail (the fallback), and with the
/// fallback's lane sum broken on purpose (right only where the shuffles ran, which they
/// must where the adapter's subgroups hold a key's 8 lanes). An adapter without SUBGROUP
/// refuses the pass by name.
#[test]
fn the_staged_pass_sums_by_subgroups_as_through_workgroup_memory() {
    let gpu = Gpu::new(kernels::FAMILY.iter().copied())
        .block_on()
        .unwrap_or_else(|e| panic!("{e}"));
    let (plain, reduce) = kernels::DECODE_SPLIT[0];
    let mut spec =
        runtime::ops::decode::split_spec("split_sg", plain.head_dim, plain.masks, plain.grid.tile);
    spec.grid.subgroups = true;
    spec.fit_device(16384);
    let sg = attn_dsl::compile(&spec).unwrap();
    assert!(sg.wgsl.contains("const LANES: u32 = 8u;"));
    assert!(!plain.wgsl.contains("subgroup"));
    if let Err(e) = SplitDecode::new(&gpu, &sg, reduce) {
        assert!(!gpu.has_subgroups(), "{e}");
        assert!(e.to_string().contains("SUBGROUP"), "{e}");
        return;
    }
    let edit = |edits: &[(&str, &str)]| {
        let mut abi = sg.clone();
        for (from, to) in edits {
            assert!(abi.wgsl.contains(from), "`{from}` moved");
            abi.wgsl = abi.wgsl.replace(from, to).into();
        }
        abi
    };
    let force = ("if (sg_size < LANES ||", "if (true ||");
    let breaking = ("var y = sh_red[g0];", "var y = vec4<f32>(1.0e30);");
    let (fallback, broken) = (edit(&[force]), edit(&[breaking]));
    let mut state = 7u32;
    let (q, kv) = (noise(&mut state, 8 * 64), noise(&mut state, 4099 * 2 * 64));
    let run = |split: &attn_dsl::KernelAbi| {
        let split = SplitDecode::new(&gpu, split, reduce).unwrap();
        split
            .run(&gpu, &input(4099, &q, &kv), Some(split.key_tile() * 4))
            .block_on()
            .unwrap()
    };
    let want = run(plain);
    let off = |abi: &attn_dsl::KernelAbi| relative_off(&run(abi), &want, 1e-3);
    assert!(off(&sg) < 1e-4, "subgroup sums off by {}", off(&sg));
    assert!(
        off(&fallback) < 1e-4,
        "the fallback off by {}",
        off(&fallback)
    );
    assert!(
        off(&edit(&[force, breaking])) > 1.0,
        "the broken fallback still right"
    );
    let shuffled = off(&broken) < 1e-4;
    let (sg_min, sg_max) = (gpu.info().subgroup_min_size, gpu.info().subgroup_max_size);
    if sg_min >= 8 {
        assert!(
            shuffled,
            "subgroups of {sg_min}+ hold 8 lanes, yet the fallback ran"
        );
    } else if sg_max < 8 {
        assert!(
            !shuffled,
            "subgroups of {sg_max} cannot hold 8 lanes, yet shuffles ran"
        );
    }
}

/// A split pass that combines its slices itself (where the device orders storage across
/// workgroups) decodes as the two-pass one (the same states merged, in another order), call
/// after call of one op into one O (each dispatch leaves its arrivals at 0 for the next: a
/// count left over would leave O unwritten), over ragged lengths with sinks.
#[test]
fn a_decode_combined_in_place_equals_the_two_pass_decode_call_after_call() {
    use attn_dsl::{Dtype, Masks, Scalar};
    use runtime::Tensor;
    use runtime::ops::decode::{
        CacheView, Combine, Decode, DecodeArgs, DecodeSpec, QueryRows, SplitLayout,
    };
    let gpu = Gpu::new(kernels::FAMILY.iter().copied())
        .block_on()
        .unwrap_or_else(|e| panic!("{e}"));
    // Without it `Combine::InPlace` builds the reduce pass, and the test would compare it
    // with itself.
    assert!(
        gpu.orders_storage_across_workgroups(),
        "the adapter builds no combining pass (MEMORY_DECORATION_COHERENT)"
    );
    let (batch, capacity, n_heads, n_kv, d) = (3u32, 1500u32, 8u32, 2u32, 64u32);
    let mut state = 11u32;
    let mut noise = |n: u32| noise(&mut state, n);
    let cache_shape = [batch, capacity, n_kv, d];
    let kv = noise(batch * capacity * n_kv * d);
    let k = Tensor::from_f32(&gpu, &cache_shape, Scalar::F32, &kv).unwrap();
    let v = Tensor::from_f32(&gpu, &cache_shape, Scalar::F32, &noise(kv.len() as u32)).unwrap();
    let seq_lens = Tensor::from_u32(&gpu, &[batch], &[1500, 1100, 37]).unwrap();
    let sinks = Tensor::from_f32(&gpu, &[n_heads], Scalar::F32, &noise(n_heads)).unwrap();
    let spec = DecodeSpec {
        masks: Masks {
            sinks: true,
            ..Masks::default()
        },
        ..DecodeSpec::new(d, d, Dtype::F32)
    };
    let staged = SplitLayout::Staged;
    let mut planned = Decode::with_passes(&gpu, spec, staged, Combine::InPlace).unwrap();
    let mut two = Decode::with_passes(&gpu, spec, staged, Combine::ReducePass).unwrap();
    let o = Tensor::zeros(&gpu, &[batch, n_heads, d], Scalar::F32).unwrap();
    let want = Tensor::zeros(&gpu, &[batch, n_heads, d], Scalar::F32).unwrap();
    for call in 0..3 {
        let q = noise(batch * n_heads * d);
        let q = Tensor::from_f32(&gpu, &[batch, n_heads, d], Scalar::F32, &q).unwrap();
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for (op, out) in [(&mut planned, &o), (&mut two, &want)] {
            let args = DecodeArgs {
                rows: QueryRows::Each(1),
                q: &q,
                cache: CacheView {
                    slot0: 0,
                    k: &k,
                    v: &v,
                    seq_lens: &seq_lens,
                    max_len: capacity,
                    block_table: None,
                    scales: None,
                },
                o: out,
                scale: None,
                mods: runtime::modifiers::DeviceModifiers {
                    sinks: Some(&sinks),
                    ..Default::default()
                },
                // 6 slices of the longest cache, 5 and 1 of the others.
                slice_len: Some(256),
            };
            let s = op.record(&gpu, &mut enc, &args).unwrap();
            assert_eq!(s.n_slices, 6);
        }
        gpu.queue.submit([enc.finish()]);
        let (got, want) = (o.to_f32(&gpu).block_on(), want.to_f32(&gpu).block_on());
        let (got, want) = (got.unwrap(), want.unwrap());
        assert!(want.iter().all(|x| x.is_finite()) && want.iter().any(|x| *x != 0.0));
        let off = relative_off(&got, &want, 1e-2);
        assert!(off < 1e-5, "call {call}: the combined decode off by {off}");
    }
}

/// A described split pass that combines its slices, at every tile a description may ask
/// (each query's share of the workgroup a power of two or not), declares its partials
/// coherent and decodes as the same pass with the reduce after it, in slices of one key
/// tile.
#[test]
fn a_combining_split_pass_of_any_tile_decodes_as_two_passes() {
    let gpu = Gpu::new(kernels::FAMILY.iter().copied())
        .block_on()
        .unwrap_or_else(|e| panic!("{e}"));
    let (_, reduce) = kernels::DECODE_SPLIT[0];
    let mut state = 5u32;
    let (q, kv) = (noise(&mut state, 8 * 64), noise(&mut state, 1000 * 2 * 64));
    for tile in 1..=4 {
        let plain = runtime::ops::decode::split_spec("split", 64, reduce.masks, tile);
        let mut combined = plain.clone();
        combined
            .writes
            .push(("o".into(), attn_dsl::WriteMode::Owned));
        combined.fit_device(16384);
        let run = |spec: &attn_dsl::KernelSpec| {
            let abi = attn_dsl::compile(spec).unwrap_or_else(|e| panic!("tile {tile}: {e}"));
            // The last workgroup reads the others' records in the same dispatch: only
            // coherent storage is promised to show them (an H200 merged a stale one).
            let coherent = abi
                .wgsl
                .contains("@coherent var<storage, read_write> partials");
            assert_eq!(coherent, spec.combines_slices(), "tile {tile}");
            // What the runtime requires the decoration for is the same kernels.
            assert_eq!(coherent, abi.binding("arrivals").is_some(), "tile {tile}");
            let split = SplitDecode::new(&gpu, &abi, reduce).unwrap();
            let inp = input(1000, &q, &kv);
            let o = split.run(&gpu, &inp, Some(split.key_tile())).block_on();
            (split.combines(), o)
        };
        let ((two_pass, want), (in_place, got)) = (run(&plain), run(&combined));
        let (want, got) = (want.unwrap(), got.unwrap());
        assert!(!two_pass && in_place, "tile {tile}");
        let off = relative_off(&got, &want, 1e-2);
        assert!(off < 1e-5, "tile {tile}: off by {off}");
    }
}
