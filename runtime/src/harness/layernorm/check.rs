//! The `check` rows of the fused LayerNorm + Linear: the forward and each backward
//! schedule on one shape, judged by the pass rule of DESIGN.md §7 against the f64
//! reference, with the pairwise-summed f32 reference as the framework-grade baseline.

use crate::BlockOn;
use attn_dsl::row_layer::RowSums;

use super::reference::{self as lnref, Shape};
use crate::cases::random;
use crate::compare::{Verdict, judge};
use crate::device::Gpu;
use crate::error::Error;
use crate::layernorm::{Input, LayerNormLinear, layernorm_linear, layernorm_linear_backward};
use crate::reference::cast;

/// `[batch, seq, hidden] -> [batch, seq, out]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LnCase {
    pub batch: u32,
    pub seq: u32,
    pub hidden: u32,
    pub out: u32,
}

impl LnCase {
    pub fn label(&self) -> String {
        format!(
            "[{}, {}, {}] -> {}",
            self.batch, self.seq, self.hidden, self.out
        )
    }

    fn rows(&self) -> u32 {
        self.batch * self.seq
    }
}

/// The seed's shape, its widths over several row tiles, and a real layer's widths on fewer rows (a CPU adapter and the f64
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

struct Data {
    x: Vec<f32>,
    gamma: Vec<f32>,
    beta: Vec<f32>,
    w: Vec<f32>,
    b: Vec<f32>,
    dy: Vec<f32>,
}

impl Data {
    /// Uniform inputs; W scaled by 1/√hidden as a layer's initialization is.
    fn random(c: LnCase, seed: u64) -> Data {
        let (rows, hidden, out) = (c.rows() as usize, c.hidden as usize, c.out as usize);
        let scale = 1.0 / (hidden as f32).sqrt();
        Data {
            x: random(rows * hidden, seed),
            gamma: random(hidden, seed + 1),
            beta: random(hidden, seed + 2),
            w: random(out * hidden, seed + 3)
                .iter()
                .map(|v| v * scale)
                .collect(),
            b: random(out, seed + 4),
            dy: random(rows * out, seed + 5),
        }
    }

    fn input(&self, c: LnCase) -> Input<'_> {
        Input {
            rows: c.rows(),
            hidden: c.hidden,
            out: c.out,
            x: &self.x,
            gamma: &self.gamma,
            beta: &self.beta,
            w: &self.w,
            b: &self.b,
            eps: EPS,
        }
    }
}

/// The seed's epsilon.
const EPS: f32 = 1e-5;

/// The forward row and one row per backward schedule.
pub fn run(gpu: &Gpu, c: LnCase, seed: u64) -> Result<Vec<LnRow>, Error> {
    let data = Data::random(c, seed);
    let shape = Shape {
        rows: c.rows() as usize,
        hidden: c.hidden as usize,
        out: c.out as usize,
        eps: f64::from(EPS),
    };
    let p64 = [&data.x, &data.gamma, &data.beta, &data.w, &data.b].map(|v| cast::<f64>(v));
    let p32 = [&data.x, &data.gamma, &data.beta, &data.w, &data.b].map(|v| cast::<f32>(v));
    let r64 = lnref::forward(shape, &p64[0], &p64[1], &p64[2], &p64[3], &p64[4]);
    let r32 = lnref::forward(shape, &p32[0], &p32[1], &p32[2], &p32[3], &p32[4]);
    let dy64 = cast::<f64>(&data.dy);
    let g64 = lnref::backward(shape, [&p64[0], &p64[1], &p64[2], &p64[3], &dy64], None);
    let mut g32 = None;
    let mut rows = Vec::new();
    let mut saved = None;
    for sums in [RowSums::Atomic, RowSums::TwoPass] {
        let layer = LayerNormLinear::new(gpu, c.rows(), c.hidden, c.out, sums)?;
        let fwd = layernorm_linear(gpu, &layer, &data.input(c)).block_on()?;
        if saved.is_none() {
            rows.push(LnRow {
                label: "layernorm_linear".into(),
                case: c,
                verdicts: vec![
                    ("y", judge(&fwd.y, &r64.y, &r32.y)),
                    ("mean", judge(&fwd.mean, &r64.mean, &r32.mean)),
                    ("rstd", judge(&fwd.rstd, &r64.rstd, &r32.rstd)),
                ],
            });
            saved = Some(fwd);
        }
        let saved = saved
            .as_ref()
            .ok_or_else(|| Error::Readback("forward".into()))?;
        let got =
            layernorm_linear_backward(gpu, &layer, &data.input(c), saved, &data.dy).block_on()?;
        // The baseline gets the statistics the kernels got, as a framework's backward does.
        let g32 = g32.get_or_insert_with(|| {
            lnref::backward(
                shape,
                [&data.x, &data.gamma, &data.beta, &data.w, &data.dy],
                Some((&saved.mean, &saved.rstd)),
            )
        });
        rows.push(LnRow {
            label: format!("layernorm_linear_backward ({})", schedule_name(sums)),
            case: c,
            verdicts: vec![
                ("dx", judge(&got.dx, &g64.dx, &g32.dx)),
                ("dgamma", judge(&got.dgamma, &g64.dgamma, &g32.dgamma)),
                ("dbeta", judge(&got.dbeta, &g64.dbeta, &g32.dbeta)),
                ("dw", judge(&got.dw, &g64.dw, &g32.dw)),
                ("db", judge(&got.db, &g64.db, &g32.db)),
            ],
        });
    }
    Ok(rows)
}

pub fn schedule_name(sums: RowSums) -> &'static str {
    crate::plan::tuning::row_sums_name(sums)
}
