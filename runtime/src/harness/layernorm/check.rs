//! The `check` rows of the fused LayerNorm + Linear: the forward and each backward
//! schedule on one shape, judged by [`LnJudge`].

use attn_dsl::Matrix;
use attn_dsl::row_layer::RowSums;
use pollster::FutureExt as BlockOn;

use crate::device::Gpu;
use crate::error::Error;
use crate::host::layernorm::{layernorm_linear, layernorm_linear_backward};
use crate::ops::layernorm::{LayerNormLinear, LayerNormSpec};
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
