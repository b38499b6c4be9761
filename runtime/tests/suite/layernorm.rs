//! The fused LayerNorm + Linear on this machine's adapter: bad input is a typed error
//! before any dispatch, and both backward schedules pass the rule at the seed's shape.

use attn_dsl::Matrix;
use attn_dsl::row_layer::RowSums;
use runtime::BlockOn;
use runtime::harness::layernorm::check::run;
use runtime::ops::layernorm::{Input, layernorm_linear};
use runtime::ops::layernorm::{LayerNormLinear, LayerNormSpec};
use runtime::verify::layernorm::judge::LnCase;
use runtime::{Error, Gpu, InputError, kernels};

fn gpu() -> Gpu {
    Gpu::new(kernels::FAMILY.iter().copied())
        .block_on()
        .expect("an adapter (lavapipe at least)")
}

/// The layer `[rows, hidden, out]` with atomic row sums and products as `matrix` says.
fn layer(
    gpu: &Gpu,
    [rows, hidden, out]: [u32; 3],
    matrix: Matrix,
) -> Result<LayerNormLinear, Error> {
    let spec = LayerNormSpec {
        sums: Some(RowSums::Atomic),
        matrix,
        ..LayerNormSpec::new(rows, hidden, out)
    };
    LayerNormLinear::new(gpu, spec)
}

#[test]
fn bad_input_is_a_typed_error() {
    let gpu = gpu();
    let layer = layer(&gpu, [16, 8, 16], Matrix::Scalar).unwrap();
    let (x, gamma, w, b) = (
        vec![0.5; 16 * 8],
        vec![1.0; 8],
        vec![0.1; 16 * 8],
        vec![0.0; 16],
    );
    let good = Input {
        rows: 16,
        hidden: 8,
        out: 16,
        x: &x,
        gamma: &gamma,
        beta: &gamma,
        w: &w,
        b: &b,
        eps: 1e-5,
    };
    let input_error = |input: Input| match layernorm_linear(&gpu, &layer, &input).block_on() {
        Err(Error::Input(e)) => e,
        other => panic!(
            "expected an input error, got {:?}",
            other.map(|o| o.y.len())
        ),
    };
    assert!(matches!(
        input_error(Input { eps: 0.0, ..good }),
        InputError::BadValue { what: "eps", .. }
    ));
    assert!(matches!(
        input_error(Input {
            eps: f32::NAN,
            ..good
        }),
        InputError::BadValue { what: "eps", .. }
    ));
    assert_eq!(
        input_error(Input { hidden: 9, ..good }),
        InputError::RowLayer {
            kernel: "layernorm_linear".into(),
            what: "hidden",
            built: 8,
            given: 9
        }
    );
    assert!(matches!(
        input_error(Input { x: &x[1..], ..good }),
        InputError::Length {
            name: "x",
            expected: 128,
            got: 127,
            ..
        }
    ));
    assert_eq!(
        input_error(Input { rows: 0, ..good }),
        InputError::ZeroDim { name: "rows" }
    );
    assert_eq!(
        layernorm_linear(&gpu, &layer, &good)
            .block_on()
            .unwrap()
            .y
            .len(),
        16 * 16
    );
}

/// The seed's shape, and the browser page's, whose 96 outputs are two 64-wide blocks of
/// one forward workgroup, the second partial.
#[test]
fn both_schedules_pass_at_the_seed_shape() {
    let gpu = gpu();
    let seed = LnCase {
        batch: 4,
        seq: 4,
        hidden: 8,
        out: 16,
    };
    let partial = LnCase {
        batch: 1,
        seq: 128,
        hidden: 64,
        out: 96,
    };
    for case in [seed, partial] {
        let rows = run(&gpu, case, 3).unwrap();
        // The tensor-core rows (`+tc`: the forward, one backward) where the adapter has
        // cooperative matrices.
        assert_eq!(rows.len(), if gpu.has_coop16() { 5 } else { 3 });
        for row in &rows {
            assert!(row.pass(), "{}: {:?}", row.label, row.verdicts);
        }
    }
}

/// The row sums and the long products hold the rule over many seeds, where plain blocked
/// sums failed some (`check`'s seeds 5, 6 and 10: db and dβ over 69 rows, dx of a
/// 3072-wide dy·W): the shapes that failed, seeds 1 to 12 of `check`'s draw for each.
#[test]
fn the_backward_passes_over_many_seeds() {
    let gpu = gpu();
    let cases = [
        LnCase {
            batch: 3,
            seq: 23,
            hidden: 8,
            out: 16,
        },
        LnCase {
            batch: 2,
            seq: 1,
            hidden: 768,
            out: 3072,
        },
    ];
    for seed in 1..=12 {
        for (i, case) in cases.into_iter().enumerate() {
            // `check` draws case i of its list at seed + 7000 + i; these are its second
            // and fourth cases.
            let rows = run(&gpu, case, seed + 7000 + [1, 3][i]).unwrap();
            for row in &rows {
                assert!(
                    row.pass(),
                    "seed {seed}, {} {}: {:?}",
                    row.label,
                    case.label(),
                    row.verdicts
                );
            }
        }
    }
}

/// Products on tensor cores are built where the adapter has cooperative matrices (their
/// rows then run in `both_schedules_pass_at_the_seed_shape`) and refused by a typed error
/// elsewhere; widths that are not multiples of 4 are refused by the rules first.
#[test]
fn tensor_core_products_need_the_adapter_and_vec4_widths() {
    let gpu = gpu();
    let made = layer(&gpu, [64, 8, 16], Matrix::Coop16);
    match gpu.has_coop16() {
        true => assert_eq!(made.unwrap().matrix(), Matrix::Coop16),
        false => assert!(
            matches!(made, Err(Error::Feature { .. })),
            "{:?}",
            made.map(|l| l.widths())
        ),
    }
    let odd = layer(&gpu, [64, 10, 16], Matrix::Coop16);
    match odd {
        Err(Error::Pipeline { message, .. }) => {
            assert!(message.contains("multiples of 4"), "{message}")
        }
        other => panic!(
            "expected the rules' refusal, got {:?}",
            other.map(|l| l.widths())
        ),
    }
    let scalar = layer(&gpu, [64, 10, 16], Matrix::Scalar).unwrap();
    assert_eq!(scalar.matrix(), Matrix::Scalar);
}

/// generated/ holds what the runtime runs: the family's forward, reduce and two-pass
/// backward kernels are the ones `LayerNormLinear` compiles for 768 -> 3072 (the backward
/// at up to 448 rows, whose row tile is 64).
#[test]
fn the_family_kernels_are_the_ones_the_runtime_compiles() {
    use attn_dsl::Op;
    use attn_dsl::row_layer::{self, spec};
    use runtime::ops::layernorm::backward_tile;
    let forward_tile = row_layer::forward_tile(768, 16384);
    let tile = backward_tile(448, 768, 3072);
    assert_eq!(tile, 64);
    let expected = [
        (
            Op::LayernormLinear,
            forward_tile,
            &kernels::layernorm_linear::ABI,
        ),
        (
            Op::LayernormLinearBackward,
            tile,
            &kernels::layernorm_linear_backward::ABI,
        ),
        (
            Op::LayernormLinearWeightGrad,
            tile,
            &kernels::layernorm_linear_weight_grad::ABI,
        ),
        (
            Op::LayernormLinearReduce,
            1,
            &kernels::layernorm_linear_reduce::ABI,
        ),
    ];
    for (op, tile, family) in expected {
        let spec = spec(op.name(), op, 768, 3072, tile, RowSums::TwoPass);
        assert_eq!(&attn_dsl::compile(&spec).unwrap(), family, "{}", op.name());
    }
}

#[test]
fn the_planner_takes_the_table_else_the_size_rule() {
    use runtime::ops::layernorm::{backward_tile, plan_sums, sums_by_size};
    use runtime::plan::tuning::Table;
    let one_tile = backward_tile(64, 768, 3072);
    assert_eq!(sums_by_size(one_tile, 768, 3072), RowSums::Atomic);
    assert_eq!(sums_by_size(8192, 768, 3072), RowSums::TwoPass);
    let mut table = Table::default();
    assert_eq!(plan_sums(&table, 8192, 768, 3072), RowSums::TwoPass);
    table
        .layernorm
        .entry(runtime::plan::tuning::layernorm_key(768, 3072))
        .or_default()
        .insert(4096, "atomic".into());
    assert_eq!(plan_sums(&table, 8192, 768, 3072), RowSums::Atomic);
    assert_eq!(plan_sums(&table, 8192, 768, 768), RowSums::TwoPass);
}

/// The tensor-core backward cuts dW's reduction into parts of 1024 rows, at most 8, and no
/// more than the scratch budget holds: one part for few rows or very wide layers.
#[test]
fn the_dw_matmul_parts_follow_the_rows_and_the_budget() {
    use runtime::ops::layernorm::{SCRATCH_BUDGET, dw_parts};
    assert_eq!(dw_parts(37, 768, 3072), 1);
    assert_eq!(dw_parts(2048, 64, 96), 2);
    assert_eq!(dw_parts(65536, 64, 96), 8);
    // 9 MiB a part at 768 -> 3072: seven fit 64 MiB.
    assert_eq!(dw_parts(8192, 768, 3072), 7);
    let parts = dw_parts(8192, 768, 3072) as u64;
    assert!(parts * 4 * 768 * 3072 <= SCRATCH_BUDGET);
    assert_eq!(dw_parts(8192, 16384, 16384), 1);
}

/// One call of `op` on `rows` rows of random x (W and b random too, from `seed`), judged
/// against an f64 reference by the check's rule (twice a pairwise f32 sum's error plus
/// 1e-6), the weights as the kernel reads them (rounded to their dtype).
fn linear_verdict(
    gpu: &Gpu,
    op: &mut runtime::ops::linear::Linear,
    rows: u32,
    seed: u64,
) -> runtime::verify::compare::Verdict {
    let ([x, w, b], y) = linear_run(gpu, op, rows, seed);
    let h = op.spec().hidden as usize;
    let b = op.spec().bias.then_some(&b[..]);
    let r64 = runtime::verify::reference::linear::<f64>(&x, &w, b, h);
    let r32 = runtime::verify::reference::linear::<f32>(&x, &w, b, h);
    runtime::verify::compare::judge(&y, &r64, &r32)
}

/// One call of `op` on `rows` rows of random x, W and b (from `seed`; W rounded to its
/// dtype): x, W and b as the kernel read them, and y as it wrote it.
fn linear_run(
    gpu: &Gpu,
    op: &mut runtime::ops::linear::Linear,
    rows: u32,
    seed: u64,
) -> ([Vec<f32>; 3], Vec<f32>) {
    let (inputs, y) = linear_into(gpu, op, [rows, rows], seed);
    (inputs, y.unwrap())
}

/// [`linear_run`] into a y of `y_rows` rows (-7 before the call): the call's result, or
/// its refusal.
fn linear_into(
    gpu: &Gpu,
    op: &mut runtime::ops::linear::Linear,
    [rows, y_rows]: [u32; 2],
    seed: u64,
) -> ([Vec<f32>; 3], Result<Vec<f32>, Error>) {
    use attn_dsl::Scalar;
    use runtime::Tensor;
    use runtime::ops::linear::LinearArgs;
    use runtime::verify::random;
    let spec = op.spec();
    let (hidden, out) = (spec.hidden, spec.out);
    let rounded = runtime::tensor::buffers::rounded;
    let x = rounded(
        &random((rows * hidden) as usize, seed),
        Scalar::from(spec.x),
    );
    let w = rounded(
        &random((out * hidden) as usize, seed + 1),
        Scalar::from(spec.weights),
    );
    let b = random(out as usize, seed + 2);
    let xt = Tensor::from_f32(gpu, &[rows, hidden], Scalar::from(spec.x), &x).unwrap();
    let wt = Tensor::from_f32(gpu, &[out, hidden], Scalar::from(spec.weights), &w).unwrap();
    let bt = Tensor::from_f32(gpu, &[out], Scalar::F32, &b).unwrap();
    let before = vec![-7.0; (y_rows * out) as usize];
    let yt = Tensor::from_f32(gpu, &[y_rows, out], Scalar::from(spec.y), &before).unwrap();
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    let args = LinearArgs {
        x: &xt,
        w: &wt,
        b: spec.bias.then_some(&bt),
        y: &yt,
    };
    let done = op.record(gpu, &mut enc, &args);
    gpu.queue.submit([enc.finish()]);
    let y = done.map(|()| yt.to_f32(gpu).block_on().unwrap());
    ([x, w, b], y)
}

/// A Linear at a few rows, as an engine's projections run at a decode step: every row
/// count the planner distinguishes (and past one workgroup's 16), weights in f32, f16
/// (where the adapter has it) and bf16, with and without a bias, each judged by the rule.
#[test]
fn a_linear_at_a_few_rows_passes_the_rule_in_every_weight_dtype() {
    use attn_dsl::Dtype;
    use runtime::ops::linear::{Linear, LinearSpec};
    let gpu = gpu();
    for weights in gpu.half_dtypes().into_iter().chain([Dtype::F32]) {
        for bias in [false, true] {
            let spec = LinearSpec {
                bias,
                ..LinearSpec::new(200, 37, weights)
            };
            let mut op = Linear::new(&gpu, spec).unwrap();
            for rows in [1, 3, 16, 21] {
                let v = linear_verdict(&gpu, &mut op, rows, u64::from(rows) * 5);
                assert!(v.pass(), "{weights:?} bias {bias} rows {rows}: {v:?}");
            }
        }
    }
    // The kernel for each row count: the smallest of 1, 2, 4, 8 and 16 that holds them.
    let per: Vec<u32> = [1, 2, 3, 5, 9, 16, 40]
        .map(Linear::rows_per_workgroup)
        .to_vec();
    assert_eq!(per, [1, 2, 4, 8, 16, 16, 16]);
}

/// A Linear reading x in f16 or bf16 widens it exactly (judged by the rule on the values
/// it read); one writing f16 or bf16 rounds each of the f32 Linear's sums once (bf16 to
/// nearest even, f16 within one unit of the last place), cut into parts or not. A half y
/// with an odd part (stored two columns a word), or an x in another dtype than the
/// spec's, is refused.
#[test]
fn a_linear_reads_and_writes_half_precision_rows_rounding_once() {
    use attn_dsl::{Dtype, Scalar};
    use runtime::ops::linear::{Linear, LinearSpec};
    let gpu = gpu();
    let f = Dtype::F32;
    for h in gpu.half_dtypes() {
        // Ulps counted on the half dtype's own bits (an f32 bit difference shifted down
        // over-counts among f16's subnormals).
        let bits = |v: f32| match h {
            Dtype::F16 => half::f16::from_f32(v).to_bits(),
            _ => half::bf16::from_f32(v).to_bits(),
        };
        for parts in [[38, 0, 0], [64, 64, 32]] {
            let plain = LinearSpec {
                bias: true,
                parts,
                ..LinearSpec::new(200, parts.iter().sum(), h)
            };
            let op = |x, y| Linear::new(&gpu, LinearSpec { x, y, ..plain }).unwrap();
            let (mut f32s, mut x_h, mut y_h, mut both) = (op(f, f), op(h, f), op(f, h), op(h, h));
            for rows in [1u32, 3, 16, 21] {
                let seed = 70 + u64::from(rows);
                if parts[1] == 0 {
                    let v = linear_verdict(&gpu, &mut x_h, rows, seed);
                    assert!(v.pass(), "{h:?} x, rows {rows}: {v:?}");
                }
                for (wide, narrow) in [(&mut f32s, &mut y_h), (&mut x_h, &mut both)] {
                    let (_, want) = linear_run(&gpu, wide, rows, seed);
                    let (_, got) = linear_run(&gpu, narrow, rows, seed);
                    let rounded = runtime::tensor::buffers::rounded(&want, Scalar::from(h));
                    for (i, (g, r)) in got.iter().zip(&rounded).enumerate() {
                        let ulps = bits(*g).abs_diff(bits(*r));
                        let allowed = u16::from(h == Dtype::F16);
                        assert!(
                            ulps <= allowed,
                            "{h:?} y {parts:?} rows {rows} at {i}: {g} {r}"
                        );
                    }
                }
            }
        }
    }
    for (y, parts) in [(Dtype::Bf16, [37, 1, 0]), (Dtype::F16, [37, 0, 0])] {
        let odd = LinearSpec {
            parts,
            y,
            ..LinearSpec::new(200, parts.iter().sum(), f)
        };
        match Linear::new(&gpu, odd) {
            Err(Error::Input(InputError::Unsupported { .. })) => {}
            other => panic!("{y:?} {parts:?}: {:?}", other.err()),
        }
    }
    let mut wants_bf16_x = Linear::new(
        &gpu,
        LinearSpec {
            x: Dtype::Bf16,
            ..LinearSpec::new(200, 38, f)
        },
    )
    .unwrap();
    let x = runtime::Tensor::zeros(&gpu, &[2, 200], Scalar::F32).unwrap();
    let w = runtime::Tensor::zeros(&gpu, &[38, 200], Scalar::F32).unwrap();
    let y = runtime::Tensor::zeros(&gpu, &[2, 38], Scalar::F32).unwrap();
    let args = runtime::ops::linear::LinearArgs {
        x: &x,
        w: &w,
        b: None,
        y: &y,
    };
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    match wants_bf16_x.record(&gpu, &mut enc, &args) {
        Err(Error::Input(InputError::Tensor(_))) => {}
        other => panic!("{:?}", other.err()),
    }
}

/// A Linear cut into parts (a fused Q, K and V projection) writes each part's rows whole,
/// one part after another: each part holds, bit for bit, the columns the same Linear uncut
/// writes, and `Linear::parts` hands each back as a tensor of its own. Parts that do not
/// cut `out` are refused with a typed error.
#[test]
fn a_linear_cut_into_parts_writes_each_part_whole() {
    use attn_dsl::{Dtype, Scalar};
    use runtime::ops::linear::{Linear, LinearSpec};
    let gpu = gpu();
    let whole = LinearSpec {
        bias: true,
        ..LinearSpec::new(200, 160, Dtype::F32)
    };
    let cut = LinearSpec {
        parts: [64, 64, 32],
        ..whole
    };
    let (mut uncut, mut parted) = (
        Linear::new(&gpu, whole).unwrap(),
        Linear::new(&gpu, cut).unwrap(),
    );
    for rows in [1u32, 3, 16, 21] {
        let (_, y) = linear_run(&gpu, &mut uncut, rows, 40 + u64::from(rows));
        let (_, got) = linear_run(&gpu, &mut parted, rows, 40 + u64::from(rows));
        let (r, mut start, mut at) = (rows as usize, 0, 0);
        for width in [64, 64, 32] {
            for row in 0..r {
                let want = &y[row * 160 + start..][..width];
                assert_eq!(
                    &got[at + row * width..][..width],
                    want,
                    "rows {rows} row {row}"
                );
            }
            (start, at) = (start + width, at + r * width);
        }
        let y = runtime::Tensor::from_f32(&gpu, &[rows, 160], Scalar::F32, &got).unwrap();
        let parts = parted.parts(&y).unwrap();
        let shapes: Vec<Vec<u32>> = parts.iter().map(|p| p.shape().to_vec()).collect();
        assert_eq!(shapes, [[rows, 64], [rows, 64], [rows, 32]]);
        let last = parts[2].to_f32(&gpu).block_on().unwrap();
        assert_eq!(last, got[r * 128..], "rows {rows}");
    }
    for parts in [[64, 0, 96], [0, 64, 96], [64, 64, 64], [160, 1, 0]] {
        let spec = LinearSpec { parts, ..whole };
        match Linear::new(&gpu, spec) {
            Err(Error::Input(InputError::LinearParts { .. })) => {}
            other => panic!("{parts:?}: {:?}", other.err()),
        }
    }
}

/// A cut y padded to the rows `Linear::part_rows` gives (the fewest from the call's on
/// whose parts all start where the device binds them, in each dtype): each part's first
/// rows equal the uncut Linear's columns, its padding rows are untouched; a cut y of fewer
/// rows than x or of more than the padding needs, or an uncut y of other rows, is refused.
#[test]
fn a_linear_cut_into_parts_pads_its_rows_so_that_each_part_binds() {
    use attn_dsl::Dtype;
    use runtime::ops::linear::{Linear, LinearSpec};
    let gpu = gpu();
    let align = u64::from(gpu.limits().min_storage_buffer_offset_alignment);
    let whole = LinearSpec {
        bias: true,
        ..LinearSpec::new(64, 44, Dtype::F32)
    };
    let widths = [20u32, 12, 12];
    let cut = LinearSpec {
        parts: widths,
        ..whole
    };
    let (mut uncut, mut parted) = (
        Linear::new(&gpu, whole).unwrap(),
        Linear::new(&gpu, cut).unwrap(),
    );
    let binds = |y_rows: u32, bytes: u64| {
        [widths[0], widths[0] + widths[1]]
            .iter()
            .all(|start| (u64::from(y_rows) * u64::from(*start) * bytes).is_multiple_of(align))
    };
    for rows in [1u32, 3, 17] {
        for dtype in [Dtype::F32, Dtype::F16] {
            let padded = parted.part_rows(&gpu, rows, dtype);
            let bytes = u64::from(dtype.bytes());
            assert!(
                padded >= rows && binds(padded, bytes),
                "{rows} {dtype:?}: {padded}"
            );
            assert!(
                (rows..padded).all(|r| !binds(r, bytes)),
                "{rows} {dtype:?}: {padded}"
            );
        }
        let y_rows = parted.part_rows(&gpu, rows, Dtype::F16);
        let seed = 60 + u64::from(rows);
        let (_, y) = linear_run(&gpu, &mut uncut, rows, seed);
        let (_, got) = linear_into(&gpu, &mut parted, [rows, y_rows], seed);
        let got = got.unwrap();
        let (r, pad) = (rows as usize, y_rows as usize);
        let (mut start, mut at) = (0, 0);
        for width in widths.map(|w| w as usize) {
            for row in 0..r {
                let want = &y[row * 44 + start..][..width];
                assert_eq!(&got[at + row * width..][..width], want, "{rows} row {row}");
            }
            let padding = &got[at + r * width..at + pad * width];
            assert!(
                padding.iter().all(|v| *v == -7.0),
                "{rows}: padding written"
            );
            (start, at) = (start + width, at + pad * width);
        }
        let (_, fewer) = linear_into(&gpu, &mut parted, [rows + 1, rows], seed);
        let (_, past) = linear_into(&gpu, &mut parted, [rows, y_rows + 1], seed);
        let (_, other) = linear_into(&gpu, &mut uncut, [rows, rows + 1], seed);
        for e in [fewer, past, other] {
            assert!(
                matches!(e, Err(Error::Input(InputError::Tensor(_)))),
                "{rows}: {e:?}"
            );
        }
    }
}

/// The LayerNorm alone (an engine's norm in front of a fused projection) writes
/// x̂·γ + β of each row, as the f64 reference does to f32's accuracy, and refuses a y
/// of another width.
#[test]
fn a_layernorm_alone_normalizes_each_row() {
    use runtime::ops::layernorm::LayerNorm;
    let gpu = gpu();
    let hidden = 96u32;
    let mut op = LayerNorm::new(&gpu, hidden).unwrap();
    // One op planning one, two and sixteen rows a workgroup as the calls' rows grow.
    for rows in [5u32, 1100, 8200] {
        layernorm_alone_at(&gpu, &mut op, rows);
    }
}

/// `op` over `rows` rows against the f64 LayerNorm, then refusing a y of the wrong width.
fn layernorm_alone_at(gpu: &runtime::Gpu, op: &mut runtime::ops::layernorm::LayerNorm, rows: u32) {
    use attn_dsl::Scalar;
    use runtime::Tensor;
    use runtime::ops::layernorm::NormArgs;
    use runtime::verify::random;
    let hidden = 96u32;
    let (h, eps) = (hidden as usize, 1e-5f32);
    let x: Vec<f32> = random((rows * hidden) as usize, 3)
        .iter()
        .map(|v| 3.0 * v + 1.0)
        .collect();
    let (gamma, beta) = (random(h, 4), random(h, 5));
    let up = |shape: &[u32], d: &[f32]| Tensor::from_f32(gpu, shape, Scalar::F32, d).unwrap();
    let (xt, gt, bt) = (
        up(&[rows, hidden], &x),
        up(&[hidden], &gamma),
        up(&[hidden], &beta),
    );
    let yt = Tensor::zeros(gpu, &[rows, hidden], Scalar::F32).unwrap();
    let mut args = NormArgs {
        x: &xt,
        gamma: &gt,
        beta: &bt,
        y: &yt,
        eps,
    };
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    op.record(gpu, &mut enc, &args, None).unwrap();
    gpu.queue.submit([enc.finish()]);
    let y = yt.to_f32(gpu).block_on().unwrap();
    for (row, (xr, yr)) in x.chunks(h).zip(y.chunks(h)).enumerate() {
        let xr: Vec<f64> = xr.iter().map(|v| f64::from(*v)).collect();
        let mean = xr.iter().sum::<f64>() / h as f64;
        let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / h as f64;
        let rstd = 1.0 / (var + f64::from(eps)).sqrt();
        for i in 0..h {
            let want = (xr[i] - mean) * rstd * f64::from(gamma[i]) + f64::from(beta[i]);
            let err = (f64::from(yr[i]) - want).abs();
            assert!(
                err < 1e-5 * (1.0 + want.abs()),
                "{rows} rows, row {row} col {i}: {} against {want}",
                yr[i]
            );
        }
    }
    let narrow = Tensor::zeros(gpu, &[rows, hidden - 4], Scalar::F32).unwrap();
    args.y = &narrow;
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    let e = op.record(gpu, &mut enc, &args, None);
    assert!(
        matches!(e, Err(Error::Input(InputError::Tensor(_)))),
        "{e:?}"
    );
}

/// The rule holds on every seed, not on most: with its parts added plainly the Linear
/// went over the bound on 0.5-2.5% of seeds (among these 48, f32 weights at 1 row, seed
/// 7101), as two sums of the same accuracy now and then differ by twice; with the
/// rounding errors carried it stays under it on each.
#[test]
fn a_linear_meets_the_rule_on_every_seed_of_a_sweep() {
    use attn_dsl::Dtype;
    use runtime::ops::linear::{Linear, LinearSpec};
    let gpu = gpu();
    for weights in [Dtype::F32, Dtype::Bf16] {
        let spec = LinearSpec {
            bias: true,
            ..LinearSpec::new(200, 37, weights)
        };
        let mut op = Linear::new(&gpu, spec).unwrap();
        for seed in 7100..7148 {
            for rows in [1, 16] {
                let v = linear_verdict(&gpu, &mut op, rows, seed);
                assert!(v.pass(), "{weights:?} rows {rows} seed {seed}: {v:?}");
            }
        }
    }
}

/// A layer with its weights held in bf16 runs its forward at any rows (the LayerNorm pass
/// and the Linear reading them as held) and refuses its backward with a typed error.
#[test]
fn half_precision_weights_are_for_the_forward() {
    use attn_dsl::{Dtype, Scalar};
    use runtime::Tensor;
    use runtime::ops::layernorm::{LayerNormArgs, LayerNormCall, LayerNormGrads, Saved};
    let gpu = gpu();
    let (rows, hidden, out) = (20, 8, 12);
    let spec = LayerNormSpec {
        weights: Dtype::Bf16,
        ..LayerNormSpec::new(rows, hidden, out)
    };
    let mut layer = LayerNormLinear::new(&gpu, spec).unwrap();
    let t = |shape: &[u32], s| Tensor::zeros(&gpu, shape, s).unwrap();
    let f = Scalar::F32;
    let (x, gamma, beta, b) = (
        t(&[rows, hidden], f),
        t(&[hidden], f),
        t(&[hidden], f),
        t(&[out], f),
    );
    let w = t(&[out, hidden], Scalar::Bf16);
    let (y, mean, rstd) = (t(&[rows, out], f), t(&[rows], f), t(&[rows], f));
    let args = LayerNormArgs {
        x: &x,
        gamma: &gamma,
        beta: &beta,
        w: &w,
        b: &b,
        eps: 1e-5,
    };
    let saved = Saved {
        mean: &mean,
        rstd: &rstd,
    };
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    let forward = LayerNormCall::Forward { args, y: &y, saved };
    layer.record(&gpu, &mut enc, &forward).unwrap();
    let (dx, dw) = (t(&[rows, hidden], f), t(&[out, hidden], f));
    let grads = LayerNormGrads {
        dx: &dx,
        dgamma: &gamma,
        dbeta: &beta,
        dw: &dw,
        db: &b,
    };
    let backward = LayerNormCall::Backward {
        args,
        saved,
        dy: &y,
        grads,
    };
    let e = layer.record(&gpu, &mut enc, &backward);
    assert!(
        matches!(e, Err(Error::Input(InputError::Unsupported { .. }))),
        "{e:?}"
    );
    gpu.queue.submit([enc.finish()]);
}
