//! Block masks over random document ids: the flash forward, every backward schedule and
//! the split-K decode (contiguous and paged) built to read a block mask (they skip hidden tiles and drop the
//! per-pair test in shown ones, the mask made on the device from the same ids) equal the
//! same kernels testing every pair, and the decode of a sequence's last row equals the
//! forward's, for ids of any pattern (documents of any length, an id that comes back
//! after others, one row to several blocks), causal or not, over random shapes.

use std::sync::{LazyLock, Mutex};

use attn_dsl::flex::library::{self, build, tensor};
use attn_dsl::flex::{BinOp, Dim, Flex, FlexRef, Ty};
use attn_dsl::{Cache, Dtype, Masks};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use runtime::ops::backward::BackwardSpec;
use runtime::ops::decode::DecodeSpec;
use runtime::plan::kernels::{AttentionSpec, flash_forward};
use runtime::plan::tuning::forward_candidates;
use runtime::verify::random;
use runtime::{
    Backward, BackwardInput, BlockOn, DecodeInput, ForwardInput, Gpu, Heads, Kernel, Modifiers,
    SplitDecode,
};

const D: u32 = 64;

struct Ctx {
    gpu: Gpu,
    /// Causal and not; each testing every pair, and reading a block mask.
    kernels: [[(Masks, Kernel); 2]; 2],
    /// Their backwards, every schedule, in the same order.
    backwards: [[Mutex<Backward>; 2]; 2],
    /// Their split-K decodes over a contiguous and a paged cache.
    decodes: [[[SplitDecode; 2]; 2]; 2],
}

/// Rows per page of the paged decode: no key tile or block lines up with it.
const PAGE: u32 = 7;

/// Keys of the query's own document (`doc[b][q] == doc[b][k]`), and with `causal` only
/// those up to the query.
fn same_document(causal: bool) -> FlexRef {
    use build::*;
    let mask = match causal {
        true => library::documents("doc"),
        false => {
            let id = |at: &str| idx("doc", vec![v("b"), v(at)]);
            bin(BinOp::Eq, id("q"), id("k"))
        }
    };
    Flex {
        mask_mod: Some(mask),
        tensors: vec![tensor("doc", &[Dim::Batch, Dim::Seq], Ty::U32)],
        ..Flex::default()
    }
    .intern()
}

static CTX: LazyLock<Ctx> = LazyLock::new(|| {
    let gpu = Gpu::new([]).block_on().unwrap_or_else(|e| panic!("{e}"));
    let kernel = |flex: FlexRef| {
        let masks = Masks {
            flex: Some(flex),
            ..Masks::default()
        };
        let config = forward_candidates(D)[0];
        let abi = flash_forward(AttentionSpec::new(D, masks, Dtype::F32), config).unwrap();
        (masks, Kernel::new(&gpu, &abi).block_on().unwrap())
    };
    let kernels = [false, true].map(|causal| {
        let flex = same_document(causal);
        [kernel(flex), kernel(flex.with_block_mask())]
    });
    let backwards = kernels.each_ref().map(|pair| {
        pair.each_ref().map(|(masks, _)| {
            let spec = BackwardSpec::new(D, *masks, Dtype::F32);
            Mutex::new(Backward::new(&gpu, spec).unwrap())
        })
    });
    let decodes = [Cache::Contiguous, Cache::Paged].map(|cache| {
        kernels.each_ref().map(|pair| {
            pair.each_ref().map(|(masks, _)| {
                let spec = DecodeSpec {
                    masks: *masks,
                    cache,
                    ..DecodeSpec::new(D, D, Dtype::F32)
                };
                SplitDecode::for_spec(&gpu, &spec).unwrap()
            })
        })
    });
    Ctx {
        gpu,
        kernels,
        backwards,
        decodes,
    }
});

fn config() -> Config {
    Config {
        cases: 16,
        rng_seed: RngSeed::Fixed(20261130),
        failure_persistence: None,
        ..Config::default()
    }
}

/// `batch` sequences of `seq` ids each: runs of random lengths (1 to 90 rows) of ids from
/// 0 to 3, so that an id may come back after others.
fn ids() -> impl Strategy<Value = (u32, u32, Vec<u32>)> {
    (1u32..=2, 1u32..=200).prop_flat_map(|(batch, seq)| {
        let runs = prop::collection::vec((1u32..=90, 0u32..4), 1..12);
        prop::collection::vec(runs, batch as usize).prop_map(move |sequences| {
            let ids = sequences
                .iter()
                .flat_map(|runs| {
                    let row = runs
                        .iter()
                        .flat_map(|&(n, id)| std::iter::repeat_n(id, n as usize));
                    row.cycle().take(seq as usize).collect::<Vec<_>>()
                })
                .collect();
            (batch, seq, ids)
        })
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_block_mask_changes_no_output((batch, seq, ids) in ids(), heads in 1u32..=2, causal in prop::bool::ANY) {
        let ctx = &*CTX;
        let heads = Heads { n_heads: heads, n_kv_heads: heads, head_dim: D, head_dim_v: D };
        let n = (batch * seq * heads.n_heads * D) as usize;
        let (q, k, v) = (random(n, 1), random(n, 2), random(n, 3));
        let doc: Vec<f32> = ids.iter().map(|&id| id as f32).collect();
        let tensors = [("doc", &doc[..])];
        let run = |(masks, kernel): &(Masks, Kernel)| {
            let input = ForwardInput {
                batch,
                seq_len: seq,
                heads,
                q: &q,
                k: &k,
                v: &v,
                seg: None,
                scale: None,
                mods: Modifiers::with_flex(*masks, &tensors),
            };
            runtime::forward(&ctx.gpu, kernel, &input).block_on().unwrap()
        };
        let [tested, skipped] = ctx.kernels[causal as usize].each_ref().map(run);
        let worst = |a: &[f32], b: &[f32]| {
            a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
        };
        prop_assert!(worst(&tested.o, &skipped.o) <= 1e-6, "O differs by {}", worst(&tested.o, &skipped.o));
        prop_assert_eq!(&tested.lse, &skipped.lse);
        // A decode step of each sequence's last row over the whole sequence as its cache, in
        // slices of 32 keys so that whole slices lie in hidden blocks: the forward's last
        // row.
        let row = (heads.n_heads * D) as usize;
        let last_rows = |x: &[f32]| -> Vec<f32> {
            (0..batch as usize)
                .flat_map(|b| x[((b + 1) * seq as usize - 1) * row..][..row].to_vec())
                .collect()
        };
        let last = last_rows(&q);
        let decoded = [0, 1].map(|i| {
            let (masks, decode) = (ctx.kernels[causal as usize][i].0, &ctx.decodes[0][causal as usize][i]);
            let input = DecodeInput {
                batch,
                cache_len: seq,
                heads,
                q: &last,
                k_cache: &k,
                v_cache: &v,
                scale: None,
                mods: Modifiers::with_flex(masks, &tensors),
            };
            decode.run(&ctx.gpu, &input, Some(32)).block_on().unwrap()
        });
        prop_assert!(worst(&decoded[0], &decoded[1]) <= 1e-6, "the decodes differ by {}", worst(&decoded[0], &decoded[1]));
        // The same over a paged cache: pages of PAGE rows in reverse order, the ids over
        // its positions (each sequence's pages' rows, the last page's spare rows a new id).
        let per_seq = seq.div_ceil(PAGE);
        let positions = per_seq * PAGE;
        let n_pages = batch * per_seq;
        let table: Vec<u32> = (0..n_pages).map(|i| n_pages - 1 - i).collect();
        let row = (heads.n_kv_heads * D) as usize;
        let pool = |x: &[f32]| {
            let mut out = vec![0.0; (n_pages * PAGE) as usize * row];
            for b in 0..batch {
                for j in 0..seq {
                    let page = table[(b * per_seq + j / PAGE) as usize];
                    let at = (page * PAGE + j % PAGE) as usize * row;
                    out[at..][..row].copy_from_slice(&x[(b * seq + j) as usize * row..][..row]);
                }
            }
            out
        };
        let (k_pool, v_pool) = (pool(&k), pool(&v));
        let doc_paged: Vec<f32> = (0..batch * positions)
            .map(|i| match i % positions < seq {
                true => doc[(i / positions * seq + i % positions) as usize],
                false => 99.0,
            })
            .collect();
        let paged_tensors = [("doc", &doc_paged[..])];
        let pages = runtime::ops::decode::Pages {
            block_table: &table,
            page_size: PAGE,
        };
        for i in 0..2 {
            let (masks, decode) = (ctx.kernels[causal as usize][i].0, &ctx.decodes[1][causal as usize][i]);
            let input = DecodeInput {
                batch,
                cache_len: seq,
                heads,
                q: &last,
                k_cache: &k_pool,
                v_cache: &v_pool,
                scale: None,
                mods: Modifiers::with_flex(masks, &paged_tensors),
            };
            let got = decode.run_paged(&ctx.gpu, &input, &pages, Some(32)).block_on().unwrap();
            prop_assert!(worst(&got, &decoded[0]) <= 1e-6, "the paged decode ({i}) differs by {}", worst(&got, &decoded[0]));
        }
        let forward_last = last_rows(&tested.o);
        prop_assert!(worst(&decoded[0], &forward_last) <= 1e-5, "the decode differs from the forward's last row by {}", worst(&decoded[0], &forward_last));
        // Every schedule's gradients, from the same O and LSE.
        let d_o = random(n, 4);
        let [plain, masked] = ctx.backwards[causal as usize].each_ref();
        let (mut plain, mut masked) = (plain.lock().unwrap(), masked.lock().unwrap());
        for schedule in plain.schedules((D, D), Dtype::F32) {
            let grads = |backward: &mut Backward, masks: Masks| {
                let input = BackwardInput {
                    batch,
                    seq_len: seq,
                    heads,
                    q: &q,
                    k: &k,
                    v: &v,
                    o: &tested.o,
                    lse: &tested.lse,
                    d_o: &d_o,
                    seg: None,
                    scale: None,
                    mods: Modifiers::with_flex(masks, &tensors),
                };
                let run = backward.run(&ctx.gpu, &input, Some(schedule), Dtype::F32);
                run.block_on().unwrap().0
            };
            let a = grads(&mut plain, ctx.kernels[causal as usize][0].0);
            let b = grads(&mut masked, ctx.kernels[causal as usize][1].0);
            for (name, x, y) in [("dQ", &a.dq, &b.dq), ("dK", &a.dk, &b.dk), ("dV", &a.dv, &b.dv)] {
                // Atomic schedules add in any order: a few units of the last place.
                let scale = x.iter().fold(1.0f32, |m, v| m.max(v.abs()));
                prop_assert!(
                    worst(x, y) <= 1e-5 * scale,
                    "{name} of {schedule:?} differs by {} (largest {scale})",
                    worst(x, y)
                );
            }
        }
    }
}
