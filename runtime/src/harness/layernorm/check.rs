//! The `check` rows of the fused LayerNorm + Linear: the forward and each backward
//! schedule on one shape, judged by [`LnJudge`].

use attn_dsl::Matrix;
use attn_dsl::row_layer::RowSums;
use pollster::FutureExt as BlockOn;

use crate::device::Gpu;
use crate::error::Error;
use crate::ops::layernorm::{LayerNormLinear, LayerNormSpec};
use crate::ops::layernorm::{layernorm_linear, layernorm_linear_backward};
use crate::verify::compare::Verdict;

use crate::verify::layernorm::judge::{LnCase, LnJudge};

/// The seed's shape, its widths over several row tiles, a real layer's widths on fewer rows and at a decode step's two, (a CPU adapter and the f64
/// reference take minutes at [8, 1024, 768]; `big` adds that shape).
pub fn cases(big: bool) -> Vec<LnCase> {
    let mut cases = vec![
        LnCase {
            batch: 4,
            seq: 4,
            hidden: 8,
            out: 16,
        },
        // More rows than one backward tile, the last tile partial.
        LnCase {
            batch: 3,
            seq: 23,
            hidden: 8,
            out: 16,
        },
        LnCase {
            batch: 2,
            seq: 37,
            hidden: 768,
            out: 3072,
        },
        // A decode step's two rows: the few-rows forward (the LayerNorm pass, then a
        // Linear that reads each weight once).
        LnCase {
            batch: 2,
            seq: 1,
            hidden: 768,
            out: 3072,
        },
    ];
    if big {
        cases.push(LnCase {
            batch: 8,
            seq: 1024,
            hidden: 768,
            out: 3072,
        });
    }
    cases
}

/// One line of the report.
pub struct LnRow {
    pub label: String,
    pub case: LnCase,
    pub verdicts: Vec<(&'static str, Verdict)>,
}

impl LnRow {
    pub fn pass(&self) -> bool {
        self.verdicts.iter().all(|(_, v)| v.pass())
    }
}

/// The forward row and one row per backward schedule, with scalar products and, where
/// the adapter has them, on tensor cores (`+tc`).
pub fn run(gpu: &Gpu, c: LnCase, seed: u64) -> Result<Vec<LnRow>, Error> {
    let mut rows = run_products(gpu, c, seed, Matrix::Scalar)?;
    if gpu.has_coop16() {
        rows.extend(run_products(gpu, c, seed, Matrix::Coop16)?);
    }
    Ok(rows)
}

fn run_products(gpu: &Gpu, c: LnCase, seed: u64, matrix: Matrix) -> Result<Vec<LnRow>, Error> {
    let mut judge = LnJudge::for_products(c, seed, matrix);
    let layer = |sums| {
        let spec = LayerNormSpec {
            sums: Some(sums),
            matrix,
            ..LayerNormSpec::new(c.rows(), c.hidden, c.out)
        };
        LayerNormLinear::new(gpu, spec)
    };
    // On tensor cores the row sums are always the reduce's: one backward.
    let layers = match matrix {
        Matrix::Scalar => vec![layer(RowSums::Atomic)?, layer(RowSums::TwoPass)?],
        Matrix::Coop16 => vec![layer(RowSums::TwoPass)?],
    };
    let tc = match matrix {
        Matrix::Scalar => "",
        Matrix::Coop16 => "+tc",
    };
    // The forward is one kernel whatever the schedule: judged once, and its statistics
    // saved for every backward.
    let saved = layernorm_linear(gpu, &layers[0], &judge.input()).block_on()?;
    let mut rows = vec![LnRow {
        label: format!("layernorm_linear{tc}"),
        case: c,
        verdicts: judge.forward(&saved),
    }];
    for layer in &layers {
        let got =
            layernorm_linear_backward(gpu, layer, &judge.input(), &saved, judge.dy()).block_on()?;
        rows.push(LnRow {
            label: format!(
                "layernorm_linear_backward{tc} ({})",
                schedule_name(layer.sums())
            ),
            case: c,
            verdicts: judge.backward(&saved, &got),
        });
    }
    Ok(rows)
}

pub fn schedule_name(sums: RowSums) -> &'static str {
    crate::plan::tuning::row_sums_name(sums)
}

/// The Linear at a few rows ([`crate::ops::linear::Linear`], an engine's projections) as
/// the planner runs it, weights in f32 and each half dtype the adapter has, with a bias: at
/// every row count it tells apart and past one workgroup's, on a layer's widths, on odd
/// ones and on a projection's reduction (4096). Rows from 8 on hold one row past f16's
/// range and one far below its normals. Then a fused projection's: y cut into three narrow
/// parts, its rows padded so that each part binds ([`Linear::part_rows`]).
///
/// [`Linear::part_rows`]: crate::ops::linear::Linear::part_rows
pub fn linear_rows(gpu: &Gpu, seed: u64) -> Result<Vec<LnRow>, Error> {
    let mut out = Vec::new();
    let weights = [attn_dsl::Dtype::F32].into_iter().chain(gpu.half_dtypes());
    let whole = |w: u32| [w, 0, 0];
    // 4096 wide: each lane's chain of steps is 32 long, where its sums carry their
    // rounding errors.
    let layers = [(200, whole(37)), (768, whole(3072)), (4096, whole(96))];
    let fused = (200, [20, 12, 12]);
    let f32s = [attn_dsl::Dtype::F32; 2];
    let plain = weights.flat_map(|w| layers.into_iter().chain([fused]).map(move |l| (w, l, f32s)));
    // x and y in each half dtype (Q, K and V written in a cache's dtype), and x alone (an
    // attention output read as written).
    let halves = gpu.half_dtypes().into_iter().flat_map(|h| {
        [(h, (200, whole(38)), [h; 2]), (h, fused, [h; 2])]
            .into_iter()
            .chain([(h, (4096, whole(96)), [h, attn_dsl::Dtype::F32])])
    });
    for (dtype, (hidden, parts), io) in plain.chain(halves) {
        for rows in [1, 3, 8, 16, 21] {
            let case = LnCase {
                batch: 1,
                seq: rows,
                hidden,
                out: parts.iter().sum(),
            };
            let seed = seed + u64::from(rows);
            let verdict = linear_verdict(gpu, case, (dtype, parts, io), seed)?;
            let cut = if parts[1] > 0 { " in parts" } else { "" };
            let rows_in = match io {
                [attn_dsl::Dtype::F32, attn_dsl::Dtype::F32] => String::new(),
                [x, attn_dsl::Dtype::F32] => format!(", x {}", x.name()),
                [x, y] if x == y => format!(", x and y {}", x.name()),
                [x, y] => format!(", x {}, y {}", x.name(), y.name()),
            };
            out.push(LnRow {
                label: format!("linear{cut}, {} weights{rows_in}", dtype.name()),
                case,
                verdicts: vec![("y", verdict)],
            });
        }
    }
    Ok(out)
}

/// y `[rows, out]` row by row from a cut y of `y_rows` rows a part.
fn uncut(y: &[f32], parts: [u32; 3], [rows, y_rows]: [usize; 2]) -> Vec<f32> {
    let out: usize = parts.iter().map(|w| *w as usize).sum();
    let mut whole = vec![0.0; rows * out];
    let (mut start, mut at) = (0, 0);
    for width in parts.map(|w| w as usize).into_iter().filter(|w| *w > 0) {
        for r in 0..rows {
            let row = &y[at + r * width..][..width];
            whole[r * out + start..][..width].copy_from_slice(row);
        }
        (start, at) = (start + width, at + y_rows * width);
    }
    whole
}

/// One call of `case`'s rows judged against the f64 reference and a pairwise f32 sum (the
/// weights as held, rounded to `dtype`; x as held in `io[0]`; the sum rounded into `io[1]`
/// where y is written in it), y cut into `parts`: the worse of the rows of ordinary range
/// together and each row of extreme range alone (where x is not f16, whose range is
/// narrower).
fn linear_verdict(
    gpu: &Gpu,
    case: LnCase,
    (dtype, parts, io): (attn_dsl::Dtype, [u32; 3], [attn_dsl::Dtype; 2]),
    seed: u64,
) -> Result<Verdict, Error> {
    use attn_dsl::Scalar;
    let (rows, h) = (case.rows() as usize, case.hidden as usize);
    let extremes = rows >= 8 && io[0] != attn_dsl::Dtype::F16;
    let mut x = crate::verify::random(rows * h, seed);
    if extremes {
        x[h..2 * h].iter_mut().for_each(|v| *v *= 3e6);
        x[2 * h..3 * h].iter_mut().for_each(|v| *v *= 1e-9);
    }
    let x = crate::tensor::buffers::rounded(&x, Scalar::from(io[0]));
    let w = crate::tensor::buffers::rounded(
        &crate::verify::random(case.out as usize * h, seed + 1),
        Scalar::from(dtype),
    );
    let b = crate::verify::random(case.out as usize, seed + 2);
    let y = linear_run(gpu, case, (dtype, parts, io), [&x, &w, &b])?;
    let r64 = crate::verify::reference::linear::<f64>(&x, &w, Some(&b), h);
    let r32 = crate::tensor::buffers::rounded(
        &crate::verify::reference::linear::<f32>(&x, &w, Some(&b), h),
        Scalar::from(io[1]),
    );
    // The rows of extreme range each alone, the others together: no row sets the bound
    // of rows of another scale.
    let groups: Vec<Vec<usize>> = match extremes {
        true => vec![
            vec![1],
            vec![2],
            (0..rows).filter(|r| *r > 2 || *r == 0).collect(),
        ],
        false => vec![(0..rows).collect()],
    };
    let o = case.out as usize;
    let judged = groups.iter().map(|g| {
        let pick = |v: &[f64]| -> Vec<f64> {
            g.iter()
                .flat_map(|r| v[r * o..(r + 1) * o].to_vec())
                .collect()
        };
        let narrow = |v: Vec<f64>| -> Vec<f32> { v.iter().map(|v| *v as f32).collect() };
        let wide = |v: &[f32]| -> Vec<f64> { v.iter().map(|v| f64::from(*v)).collect() };
        let (got, base) = (narrow(pick(&wide(&y))), narrow(pick(&wide(&r32))));
        crate::verify::compare::judge(&got, &pick(&r64), &base)
    });
    Ok(judged
        .max_by(|a, b| a.ratio().total_cmp(&b.ratio()))
        .expect("a call has rows"))
}

/// y `[rows, out]` of one call of `case`'s Linear (`dtype` weights, x and y in `io`, y cut
/// into `parts`) on x, W and b as given (each exact in the dtype it is held in).
fn linear_run(
    gpu: &Gpu,
    case: LnCase,
    (dtype, parts, io): (attn_dsl::Dtype, [u32; 3], [attn_dsl::Dtype; 2]),
    [x, w, b]: [&[f32]; 3],
) -> Result<Vec<f32>, Error> {
    use crate::ops::linear::{Linear, LinearArgs, LinearSpec};
    use crate::tensor::Tensor;
    use attn_dsl::Scalar;
    let spec = LinearSpec {
        bias: true,
        parts,
        x: io[0],
        y: io[1],
        ..LinearSpec::new(case.hidden, case.out, dtype)
    };
    let mut op = Linear::new(gpu, spec)?;
    let y_rows = op.part_rows(gpu, case.rows(), io[1]);
    let xt = Tensor::from_f32(gpu, &[case.rows(), case.hidden], Scalar::from(io[0]), x)?;
    let wt = Tensor::from_f32(gpu, &[case.out, case.hidden], Scalar::from(dtype), w)?;
    let bt = Tensor::from_f32(gpu, &[case.out], Scalar::F32, b)?;
    let yt = Tensor::zeros(gpu, &[y_rows, case.out], Scalar::from(io[1]))?;
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    let args = LinearArgs {
        x: &xt,
        w: &wt,
        b: Some(&bt),
        y: &yt,
    };
    op.record(gpu, &mut enc, &args)?;
    gpu.queue.submit([enc.finish()]);
    let y = yt.to_f32(gpu).block_on()?;
    Ok(uncut(&y, parts, [case.rows() as usize, y_rows as usize]))
}
