//! A block mask made on the device: each block's state is what the mask_mod gives its
//! pairs (a mask reading a tensor, `b` and `h`, so a state per sequence and head), a
//! decode that skips blocks by it equals the same decode without it, and a kernel built to
//! read one refuses a call without it, or with one made for another shape.

use attn_dsl::flex::library::{self, build, tensor};
use attn_dsl::flex::{BLOCK_EMPTY, BLOCK_FULL, BLOCK_PARTIAL, BinOp, Dim, Flex, MASK_BLOCK, Ty};
use attn_dsl::{Dtype, Masks, Scalar};
use runtime::ops::block_mask::BlockMask;
use runtime::ops::decode::DecodeSpec;
use runtime::ops::decode::SplitDecode;
use runtime::ops::forward::{Forward, ForwardArgs, ForwardSpec};
use runtime::{BlockOn, DecodeInput, DeviceModifiers, FlexOf, Gpu, Heads, Modifiers, Tensor};

const POSITIONS: u32 = 200;
const BATCH: u32 = 2;
const HEADS: u32 = 3;
const PREFIX: [u32; 2] = [70, 5];

/// Causal, and each sequence's first `prefix[b] + 40·h` keys: a state per (b, h).
fn staggered() -> Flex {
    use build::*;
    let reach = bin(
        BinOp::Add,
        cast(idx("prefix", vec![v("b")]), Ty::I32),
        bin(BinOp::Mul, v("h"), i(40)),
    );
    Flex {
        mask_mod: Some(bin(
            BinOp::Or,
            library::causal(),
            bin(BinOp::Lt, v("k"), reach),
        )),
        tensors: vec![tensor("prefix", &[Dim::Batch], Ty::U32)],
        ..Flex::default()
    }
}

fn gpu() -> Gpu {
    Gpu::new([]).block_on().unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn each_state_is_what_the_mask_gives_its_blocks_pairs() {
    let gpu = gpu();
    let prefix = Tensor::from_u32(&gpu, &[BATCH], &PREFIX).unwrap();
    let flex = staggered().intern();
    let mut mask = BlockMask::new(&gpu, flex, BATCH, HEADS, POSITIONS).unwrap();
    let blocks = POSITIONS.div_ceil(MASK_BLOCK);
    assert_eq!(mask.states().shape(), [BATCH, HEADS, blocks, blocks + 4]);
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    mask.record(&gpu, &mut encoder, &[("prefix", &prefix)])
        .unwrap();
    gpu.queue.submit([encoder.finish()]);
    let got = mask.states().tensor().to_u32(&gpu).block_on().unwrap();
    // Each row: its states, then (blocks - first, last + 1) of the key blocks it shows and
    // of the query blocks that show the key block of its index.
    let mut want = Vec::new();
    for b in 0..BATCH {
        for h in 0..HEADS {
            for qb in 0..blocks {
                let row: Vec<u32> = (0..blocks).map(|kb| state(b, h, qb, kb)).collect();
                let col: Vec<u32> = (0..blocks).map(|x| state(b, h, x, qb)).collect();
                want.extend(&row);
                want.extend(shown(&row, blocks));
                want.extend(shown(&col, blocks));
            }
        }
    }
    assert_eq!(got, want);
    assert!(want.contains(&BLOCK_EMPTY) && want.contains(&BLOCK_PARTIAL));
    assert!(want.contains(&BLOCK_FULL));
    // A tensor of another device is refused before the states are cleared: the encoder
    // submitted after the refusal leaves them as they were.
    let there = gpu_other();
    let foreign = Tensor::from_u32(&there, &[BATCH], &PREFIX).unwrap();
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    let err = mask
        .record(&gpu, &mut encoder, &[("prefix", &foreign)])
        .unwrap_err();
    assert!(err.to_string().contains("prefix"), "{err}");
    gpu.queue.submit([encoder.finish()]);
    let after = mask.states().tensor().to_u32(&gpu).block_on().unwrap();
    assert_eq!(after, want);
}

/// A second device on the same adapter.
fn gpu_other() -> Gpu {
    gpu()
}

/// (blocks - first, last + 1) of the blocks not empty in `states`; (0, 0) where none is.
fn shown(states: &[u32], blocks: u32) -> [u32; 2] {
    let seen = |s: &&u32| **s != BLOCK_EMPTY;
    let first = states.iter().position(|s| seen(&s));
    let last = states.iter().rposition(|s| seen(&s));
    match (first, last) {
        (Some(f), Some(l)) => [blocks - f as u32, l as u32 + 1],
        _ => [0, 0],
    }
}

/// The state of block (qb, kb) of sequence b, head h, pair by pair.
fn state(b: u32, h: u32, qb: u32, kb: u32) -> u32 {
    let (mut shown, mut hidden) = (false, false);
    let within = |x: u32| (x * MASK_BLOCK..(x + 1) * MASK_BLOCK).filter(|p| *p < POSITIONS);
    for q in within(qb) {
        for k in within(kb) {
            match k <= q || k < PREFIX[b as usize] + 40 * h {
                true => shown = true,
                false => hidden = true,
            }
        }
    }
    match (shown, hidden) {
        (true, true) => BLOCK_PARTIAL,
        (true, false) => BLOCK_FULL,
        _ => BLOCK_EMPTY,
    }
}

/// Each sequence's first `prefix[b]` keys and the last 16 before the query.
fn prefix_and_window() -> Flex {
    use build::*;
    let prefix = cast(idx("prefix", vec![v("b")]), Ty::I32);
    Flex {
        mask_mod: Some(bin(
            BinOp::Or,
            bin(BinOp::Lt, v("k"), prefix),
            bin(BinOp::Lt, bin(BinOp::Sub, v("q"), v("k")), i(16)),
        )),
        tensors: vec![tensor("prefix", &[Dim::Batch], Ty::U32)],
        ..Flex::default()
    }
}

/// The split-K decode over a cache of 300 rows (five blocks, two of them hidden from the
/// query), built to read a block mask and not: the same O.
#[test]
fn a_decode_that_skips_blocks_equals_one_that_tests_every_pair() {
    let gpu = gpu();
    let heads = Heads {
        n_heads: 6,
        n_kv_heads: 2,
        head_dim: 64,
        head_dim_v: 64,
    };
    let (cache_len, capacity) = (300, 320);
    let data = |n: u32, seed| runtime::verify::random(n as usize, seed);
    let q = data(BATCH * heads.n_heads * heads.head_dim, 1);
    let k = data(BATCH * capacity * heads.n_kv_heads * heads.head_dim, 2);
    let v = data(BATCH * capacity * heads.n_kv_heads * heads.head_dim, 3);
    let prefix: Vec<f32> = PREFIX.iter().map(|&p| p as f32).collect();
    let flex = prefix_and_window().intern();
    let run = |flex| {
        let masks = Masks {
            flex: Some(flex),
            ..Masks::default()
        };
        let spec = DecodeSpec {
            masks,
            ..DecodeSpec::new(64, 64, Dtype::F32)
        };
        let decode = SplitDecode::for_spec(&gpu, &spec).unwrap();
        let tensors = [("prefix", &prefix[..])];
        let input = DecodeInput {
            batch: BATCH,
            cache_len,
            heads,
            q: &q,
            k_cache: &k,
            v_cache: &v,
            scale: None,
            mods: Modifiers::with_flex(masks, &tensors),
        };
        // Slices of 64 keys, so that whole slices lie in hidden blocks.
        decode.run(&gpu, &input, Some(64)).block_on().unwrap()
    };
    let (tested, skipped) = (run(flex), run(flex.with_block_mask()));
    let worst = tested
        .iter()
        .zip(&skipped)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(worst <= 1e-6, "the decodes differ by {worst}");
}

/// The forward of the `documents` example (it asks for a block mask): refused without one,
/// and with one made for another sequence length; nothing is written.
#[test]
fn a_kernel_that_reads_a_block_mask_refuses_a_call_without_its_own() {
    let gpu = gpu();
    let (seq, d) = (128, 64);
    let flex = library::preset("documents").unwrap().intern();
    let masks = Masks {
        flex: Some(flex),
        ..Masks::default()
    };
    let shape = [1, seq, 2, d];
    let t = |s: &[u32]| Tensor::zeros(&gpu, s, Scalar::F32).unwrap();
    let (q, k, v, o, lse) = (t(&shape), t(&shape), t(&shape), t(&shape), t(&[1, seq, 2]));
    let doc = Tensor::from_u32(&gpu, &[1, seq], &vec![0; seq as usize]).unwrap();
    let tensors = [("doc", &doc)];
    let mut forward = Forward::new(&gpu, ForwardSpec::new(d, masks, Dtype::F32)).unwrap();
    let other = BlockMask::new(&gpu, flex, 1, 2, seq / 2).unwrap();
    for (given, says) in [
        (None, "make one with `BlockMask::new`"),
        (
            Some(other.states()),
            "made for other modifiers or another shape",
        ),
    ] {
        let args = ForwardArgs {
            mods: DeviceModifiers {
                flex: Some(FlexOf {
                    modifiers: flex,
                    tensors: &tensors,
                    block_mask: given,
                }),
                ..DeviceModifiers::default()
            },
            ..ForwardArgs::new(&q, &k, &v, &o, &lse)
        };
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        let err = forward.record(&gpu, &mut encoder, &args).unwrap_err();
        assert!(err.to_string().contains(says), "{err}");
    }
}
