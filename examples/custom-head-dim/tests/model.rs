use custom_head_dim::{HEADS, Model, forward_h8_kv2_d128};
use runtime::BlockOn;
use runtime::verify::compare::judge_attention;
use runtime::verify::random;
use runtime::verify::reference::Problem;
use runtime::{Error, InputError};

fn problem(n_q: usize, n_k: usize, causal: bool) -> Problem<'static> {
    Problem {
        batch: 1,
        n_q,
        n_k,
        n_heads: 8,
        n_kv_heads: 2,
        head_dim: 128,
        scale: f64::from(HEADS.default_scale()),
        causal,
        seg: None,
        ..Problem::default()
    }
}

#[test]
fn the_specialization_is_what_the_description_says() {
    assert_eq!(forward_h8_kv2_d128::HEAD_DIM, 128);
    assert_eq!(forward_h8_kv2_d128::TILE, 2);
    let dims = forward_h8_kv2_d128::Dims {
        seq_len: 33,
        n_heads: 8,
        n_kv_heads: 2,
        head_dim: 128,
        batch: 1,
        ..Default::default()
    };
    assert_eq!(forward_h8_kv2_d128::dispatch_grid(&dims), [17, 8, 1]);
    assert!(forward_h8_kv2_d128::WGSL.contains("return 4u;"));
}

#[test]
fn forward_and_decode_match_the_reference() {
    let model = Model::new().unwrap_or_else(|e| panic!("{e}"));
    let seq = 33;
    let (q, k, v) = (
        random(seq * 8 * 128, 1),
        random(seq * 2 * 128, 2),
        random(seq * 2 * 128, 3),
    );
    let out = model.forward(seq as u32, &q, &k, &v).unwrap();
    let verdicts = judge_attention(
        &problem(seq, seq, true),
        [&q, &k, &v],
        &out.o,
        Some(&out.lse),
    );
    assert!(verdicts.iter().all(|(_, v)| v.pass()), "{verdicts:?}");

    let q1 = random(8 * 128, 4);
    let o = model.decode(20, &q1, &k, &v).unwrap();
    let verdicts = judge_attention(&problem(1, 20, false), [&q1, &k, &v], &o, None);
    assert!(verdicts.iter().all(|(_, v)| v.pass()), "{verdicts:?}");
}

#[test]
fn heads_that_break_the_fixed_gqa_ratio_are_refused() {
    let model = Model::new().unwrap_or_else(|e| panic!("{e}"));
    let input = runtime::ForwardInput {
        batch: 1,
        seq_len: 2,
        heads: runtime::Heads {
            n_heads: 8,
            n_kv_heads: 4,
            head_dim: 128,
            head_dim_v: 128,
        },
        q: &[0.0; 2 * 8 * 128],
        k: &[0.0; 2 * 4 * 128],
        v: &[0.0; 2 * 4 * 128],
        seg: None,
        scale: None,
        mods: Default::default(),
    };
    let kernel = runtime::Kernel::new(&model.gpu, &forward_h8_kv2_d128::ABI)
        .block_on()
        .unwrap();
    let err = runtime::forward(&model.gpu, &kernel, &input)
        .block_on()
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Input(InputError::GqaRatio {
                ratio: 4,
                given: 2,
                ..
            })
        ),
        "{err}"
    );
}
