//! A learnable modifier tensor (`grad`: the t5-bias preset's `rel_bias`) through both APIs:
//! every schedule's `drel_bias` passes the FlashAttention rule against the reference and
//! agrees with the others; the recording API adds it into the caller's tensor (twice over
//! after two accumulating calls); a missing, misshapen or unknown gradient and the
//! deterministic backward are refused with one line that says what to change.

use attn_dsl::flex::library;
use attn_dsl::{Dtype, Masks, Scalar};
use runtime::ops::backward::{BackwardArgs, BackwardSpec};
use runtime::ops::forward::{Forward, ForwardArgs, ForwardSpec};
use runtime::verify::compare::{judge_backward, max_abs_error};
use runtime::verify::reference::{Problem, cast};
use runtime::{
    Backward, BackwardInput, BlockOn, DeviceModifiers, Error, FlexOf, Gpu, Heads, InputError,
    Modifiers, Tensor,
};

const HEADS: Heads = Heads {
    n_heads: 4,
    n_kv_heads: 2,
    head_dim: 64,
    head_dim_v: 64,
};
const BATCH: u32 = 2;
const SEQ: u32 = 40;

fn masks() -> Masks {
    let flex = library::preset("t5-bias:4").unwrap();
    assert!(flex.tensors[0].grad, "the preset's table is learnable");
    Masks {
        flex: Some(flex.intern()),
        ..Masks::default()
    }
}

/// Q, K, V, dO and the `[heads, 9]` table, host values and device tensors.
struct Inputs {
    host: [Vec<f32>; 5],
    device: [Tensor; 5],
}

fn inputs(gpu: &Gpu) -> Inputs {
    let q = [BATCH, SEQ, HEADS.n_heads, 64];
    let kv = [BATCH, SEQ, HEADS.n_kv_heads, 64];
    let shapes = [&q[..], &kv, &kv, &q, &[HEADS.n_heads, 9]];
    let host: [Vec<f32>; 5] = std::array::from_fn(|i| {
        let n = shapes[i].iter().product::<u32>() as usize;
        runtime::verify::random(n, 30 + i as u64)
    });
    let device =
        std::array::from_fn(|i| Tensor::from_f32(gpu, shapes[i], Scalar::F32, &host[i]).unwrap());
    Inputs { host, device }
}

/// The forward's O and LSE on the device.
fn forward(gpu: &Gpu, x: &Inputs) -> (Tensor, Tensor) {
    let spec = ForwardSpec {
        head_dim: 64,
        head_dim_v: 64,
        masks: masks(),
        dtype: Dtype::F32,
    };
    let o = Tensor::zeros(gpu, &[BATCH, SEQ, HEADS.n_heads, 64], Scalar::F32).unwrap();
    let lse = Tensor::zeros(gpu, &[BATCH, SEQ, HEADS.n_heads], Scalar::F32).unwrap();
    let table = [("rel_bias", &x.device[4])];
    let mods = DeviceModifiers {
        flex: Some(FlexOf {
            modifiers: masks().flex.unwrap(),
            tensors: &table,
            block_mask: None,
        }),
        ..DeviceModifiers::default()
    };
    let mut fwd = Forward::new(gpu, spec).unwrap();
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    let [q, k, v, ..] = &x.device;
    let args = ForwardArgs {
        mods,
        ..ForwardArgs::new(q, k, v, &o, &lse)
    };
    fwd.record(gpu, &mut encoder, &args).unwrap();
    gpu.queue.submit([encoder.finish()]);
    (o, lse)
}

fn backward(gpu: &Gpu) -> Backward {
    Backward::new(gpu, BackwardSpec::new(64, masks(), Dtype::F32)).unwrap()
}

#[test]
fn every_schedule_returns_the_tables_gradient() {
    let gpu = Gpu::new(runtime::kernels::FAMILY.iter().copied())
        .block_on()
        .unwrap();
    let x = inputs(&gpu);
    let (o, lse) = forward(&gpu, &x);
    let (o, lse) = (
        o.to_f32(&gpu).block_on().unwrap(),
        lse.to_f32(&gpu).block_on().unwrap(),
    );
    let [q, k, v, d_o, table] = &x.host;
    let tensors = [("rel_bias", &table[..])];
    let mods = Modifiers::with_flex(masks(), &tensors);
    let input = BackwardInput {
        batch: BATCH,
        seq_len: SEQ,
        heads: HEADS,
        q,
        k,
        v,
        o: &o,
        lse: &lse,
        d_o,
        seg: None,
        scale: None,
        mods,
    };
    let p = Problem {
        batch: BATCH as usize,
        n_q: SEQ as usize,
        n_k: SEQ as usize,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 64,
        scale: f64::from(1.0 / 8.0f32),
        mods,
        ..Problem::default()
    };
    let mut bwd = backward(&gpu);
    let mut first: Option<Vec<f32>> = None;
    for schedule in bwd.schedules((64, 64), Dtype::F32) {
        let (g, _) = bwd
            .run(&gpu, &input, Some(schedule), Dtype::F32)
            .block_on()
            .unwrap();
        let table_grad = g.flex("drel_bias").expect("the table's gradient").to_vec();
        assert_eq!(table_grad.len(), 4 * 9);
        let verdicts = judge_backward(
            &p,
            [q, k, v, d_o],
            (&o, &lse),
            [&g.dq, &g.dk, &g.dv],
            [&[], &[]],
            &g.dflex,
        );
        let judged = verdicts.iter().find(|(n, _)| *n == "drel_bias");
        assert!(
            judged.is_some_and(|(_, v)| v.pass()),
            "{schedule}: {verdicts:?}"
        );
        assert!(
            verdicts.iter().all(|(_, v)| v.pass()),
            "{schedule}: {verdicts:?}"
        );
        // Compensated sums: the schedules agree far inside the rule's bound.
        let first = first.get_or_insert(table_grad.clone());
        let apart = max_abs_error(&table_grad, &cast(first));
        assert!(
            apart <= 1e-6,
            "{schedule}: {apart:e} from the first schedule"
        );
    }
}

#[test]
fn the_recording_api_adds_into_the_callers_gradient() {
    let gpu = Gpu::new(runtime::kernels::FAMILY.iter().copied())
        .block_on()
        .unwrap();
    let x = inputs(&gpu);
    let (o, lse) = forward(&gpu, &x);
    let f = Scalar::F32;
    let [q, k, v, d_o, table] = &x.device;
    let grads = [q, k, v].map(|t| Tensor::zeros(&gpu, t.shape(), f).unwrap());
    let drel_bias = Tensor::zeros(&gpu, &[4, 9], f).unwrap();
    let tables = [("rel_bias", table)];
    let mods = DeviceModifiers {
        flex: Some(FlexOf {
            modifiers: masks().flex.unwrap(),
            tensors: &tables,
            block_mask: None,
        }),
        ..DeviceModifiers::default()
    };
    let mut bwd = backward(&gpu);
    macro_rules! args {
        ($flex_grads:expr) => {
            BackwardArgs {
                q,
                k,
                v,
                o: &o,
                lse: &lse,
                d_o,
                dq: &grads[0],
                dk: &grads[1],
                dv: &grads[2],
                dbias: None,
                dsinks: None,
                flex_grads: $flex_grads,
                seg: None,
                scale: None,
                mods,
                accumulate: true,
            }
        };
    }
    let given = [("drel_bias", &drel_bias)];
    let mut sums = Vec::new();
    for _ in 0..2 {
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        bwd.record(&gpu, &mut encoder, &args!(&given), None)
            .unwrap();
        gpu.queue.submit([encoder.finish()]);
        sums.push(drel_bias.to_f32(&gpu).block_on().unwrap());
    }
    let once = &sums[0];
    assert!(once.iter().any(|x| *x != 0.0), "{once:?}");
    let twice: Vec<f64> = once.iter().map(|x| 2.0 * f64::from(*x)).collect();
    let apart = max_abs_error(&sums[1], &twice);
    assert!(apart <= 1e-5, "two calls {apart:e} from twice one");

    // Refusals, each before anything is recorded.
    macro_rules! refused {
        ($flex_grads:expr) => {{
            let mut encoder = gpu.device.create_command_encoder(&Default::default());
            match bwd.record(&gpu, &mut encoder, &args!($flex_grads), None) {
                Err(e) => e.to_string(),
                Ok(s) => panic!("{s} ran"),
            }
        }};
    }
    let missing = refused!(&[]);
    assert!(
        missing.contains("pass its gradient `drel_bias`"),
        "{missing}"
    );
    let wrong = Tensor::zeros(&gpu, &[4, 8], f).unwrap();
    let misshapen = refused!(&[("drel_bias", &wrong)]);
    assert!(
        misshapen.contains("the gradient of `rel_bias`"),
        "{misshapen}"
    );
    let unknown = refused!(&[("dslopes", &drel_bias)]);
    assert!(
        unknown.contains("`dslopes` is not the gradient"),
        "{unknown}"
    );
    bwd.deterministic = true;
    let deterministic = refused!(&given);
    assert!(deterministic.contains("declared `grad`"), "{deterministic}");
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    let err = bwd
        .record(&gpu, &mut encoder, &args!(&given), None)
        .unwrap_err();
    assert!(
        matches!(err, Error::Input(InputError::NotDeterministic { .. })),
        "{err:?}"
    );
}
