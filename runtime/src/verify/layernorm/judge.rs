//! One LayerNorm + Linear problem, its references, and the judging of a run's outputs by
//! the pass rule ([`crate::verify::compare`]) against the f64 reference, with the
//! pairwise-summed f32 reference as the framework-grade baseline: shared by `check` and the
//! browser page.

use crate::ops::layernorm::{Grads, Input, Output};
use crate::verify::compare::{Verdict, judge};
use crate::verify::layernorm::reference::{self as lnref, Shape};
use crate::verify::random;
use crate::verify::reference::cast;

/// `[batch, seq, hidden] -> [batch, seq, out]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LnCase {
    /// Sequences.
    pub batch: u32,
    /// Rows of each sequence.
    pub seq: u32,
    /// The width of the input rows.
    pub hidden: u32,
    /// The width of the output rows.
    pub out: u32,
}

impl LnCase {
    /// `[batch, seq, hidden] -> out`, for a row's name.
    pub fn label(&self) -> String {
        format!(
            "[{}, {}, {}] -> {}",
            self.batch, self.seq, self.hidden, self.out
        )
    }

    /// Rows in all: `batch · seq`.
    pub fn rows(&self) -> u32 {
        self.batch * self.seq
    }
}

/// The seed's epsilon.
pub const EPS: f32 = 1e-5;

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
}

/// A case's random inputs and the references its outputs are judged against.
pub struct LnJudge {
    case: LnCase,
    shape: Shape,
    data: Data,
    forward64: lnref::Forward<f64>,
    forward32: lnref::Forward<f32>,
    backward64: lnref::Grads<f64>,
    /// The f32 baseline of the backward and the statistics it was computed from.
    backward32: Option<(Vec<f32>, Vec<f32>, lnref::Grads<f32>)>,
    /// What the baseline's products do to their operands: the kernels' own rounding.
    operand: lnref::Operand<f32>,
}

impl LnJudge {
    /// The judge of kernels whose products multiply f32 operands.
    pub fn new(case: LnCase, seed: u64) -> LnJudge {
        LnJudge::for_products(case, seed, attn_dsl::Matrix::Scalar)
    }

    /// The judge of kernels whose products are `matrix`: on cooperative matrices the
    /// baseline rounds each product's operands to f16 as the kernels (and a framework's f16
    /// autocast) do; the f64 reference stays exact.
    pub fn for_products(case: LnCase, seed: u64, matrix: attn_dsl::Matrix) -> LnJudge {
        let operand: lnref::Operand<f32> = match matrix {
            attn_dsl::Matrix::Scalar => lnref::exact,
            attn_dsl::Matrix::Coop16 => |v| half::f16::from_f32(v).to_f32(),
        };
        let data = Data::random(case, seed);
        let shape = Shape {
            rows: case.rows() as usize,
            hidden: case.hidden as usize,
            out: case.out as usize,
            eps: f64::from(EPS),
        };
        let p64 = [&data.x, &data.gamma, &data.beta, &data.w, &data.b].map(|v| cast::<f64>(v));
        let p32 = [&data.x, &data.gamma, &data.beta, &data.w, &data.b].map(|v| cast::<f32>(v));
        let forward64 = lnref::forward(shape, p64.each_ref().map(|v| &v[..]), lnref::exact);
        let forward32 = lnref::forward(shape, p32.each_ref().map(|v| &v[..]), operand);
        let dy64 = cast::<f64>(&data.dy);
        let backward64 = lnref::backward(
            shape,
            [&p64[0], &p64[1], &p64[2], &p64[3], &dy64],
            None,
            lnref::exact,
        );
        LnJudge {
            case,
            shape,
            data,
            forward64,
            forward32,
            backward64,
            backward32: None,
            operand,
        }
    }

    /// The forward's inputs.
    pub fn input(&self) -> Input<'_> {
        let (c, d) = (self.case, &self.data);
        Input {
            rows: c.rows(),
            hidden: c.hidden,
            out: c.out,
            x: &d.x,
            gamma: &d.gamma,
            beta: &d.beta,
            w: &d.w,
            b: &d.b,
            eps: EPS,
        }
    }

    /// The backward's `dy`.
    pub fn dy(&self) -> &[f32] {
        &self.data.dy
    }

    /// The forward's verdicts for a run's `got` (y, and the saved mean and rstd).
    pub fn forward(&self, got: &Output) -> Vec<(&'static str, Verdict)> {
        let (r64, r32) = (&self.forward64, &self.forward32);
        vec![
            ("y", judge(&got.y, &r64.y, &r32.y)),
            ("mean", judge(&got.mean, &r64.mean, &r32.mean)),
            ("rstd", judge(&got.rstd, &r64.rstd, &r32.rstd)),
        ]
    }

    /// The backward's verdicts for a run from `saved`, the forward's output: the baseline
    /// gets the statistics the kernels got, as a framework's backward does.
    pub fn backward(&mut self, saved: &Output, got: &Grads) -> Vec<(&'static str, Verdict)> {
        let fresh = self
            .backward32
            .as_ref()
            .is_some_and(|(mean, rstd, _)| *mean == saved.mean && *rstd == saved.rstd);
        if !fresh {
            let d = &self.data;
            let g = lnref::backward(
                self.shape,
                [&d.x, &d.gamma, &d.beta, &d.w, &d.dy],
                Some((&saved.mean, &saved.rstd)),
                self.operand,
            );
            self.backward32 = Some((saved.mean.clone(), saved.rstd.clone(), g));
        }
        let g32 = &self.backward32.as_ref().expect("computed above").2;
        let g64 = &self.backward64;
        vec![
            ("dx", judge(&got.dx, &g64.dx, &g32.dx)),
            ("dgamma", judge(&got.dgamma, &g64.dgamma, &g32.dgamma)),
            ("dbeta", judge(&got.dbeta, &g64.dbeta, &g32.dbeta)),
            ("dw", judge(&got.dw, &g64.dw, &g32.dw)),
            ("db", judge(&got.db, &g64.db, &g32.db)),
        ]
    }
}
