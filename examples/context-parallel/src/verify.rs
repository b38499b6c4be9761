//! The results judged by `check`'s rule against the f64 reference: each output's error at
//! most twice that of the baseline a framework would compute plus 1e-6 (of the output's
//! scale in half precision). The split's baseline is a framework's context-parallel
//! forward: each key chunk's part in f32 (P rounded to the dtype in half precision), its
//! O stored in the dtype, the parts merged in f32 and O rounded once more. Its backward is
//! judged as any backward is, from the O and LSE it was given; the one-GPU results beside
//! it by the plain rule.

use attn_dsl::{Dtype, Scalar};
use runtime::tensor::buffers::{round_to, rounded};
use runtime::verify::compare::{self, Verdict, judge};
use runtime::verify::reference::{self, Problem};

use crate::plan::Plan;

/// One run's outputs, read back: O, LSE, and (with the backward) dQ, dK, dV in sequence
/// order.
#[derive(Clone, Debug, Default)]
pub struct Outputs {
    pub o: Vec<f32>,
    pub lse: Vec<f32>,
    pub dq: Vec<f32>,
    pub dk: Vec<f32>,
    pub dv: Vec<f32>,
}

/// The inputs as the devices hold them (rounded to the dtype), in sequence order.
pub struct Inputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub d_o: &'a [f32],
}

/// Which query rows are judged: all of them (dK and dV too), or a few (dK and dV against
/// the one-GPU backward's instead: their reference needs every row).
#[derive(Clone, Debug)]
pub enum Rows {
    All,
    Some(Vec<usize>),
}

/// The verdicts: `o`, `lse` (and `dq`, `dk`, `dv` with a backward) of the split, then of
/// one GPU, each named `split o`, `one o`, ...
pub fn verdicts(
    p: &Problem,
    plan: &Plan,
    dtype: Dtype,
    x: &Inputs,
    rows: &Rows,
    split: &Outputs,
    one: &Outputs,
) -> Vec<(String, Verdict)> {
    let mut all = Vec::new();
    let backward = !split.dq.is_empty();
    let picked: Vec<usize> = match rows {
        Rows::All => vec![0],
        Rows::Some(r) => r.clone(),
    };
    let mut per_row: Vec<Vec<(String, Verdict)>> = Vec::new();
    for &row in &picked {
        let (rp, sel) = match rows {
            Rows::All => (*p, Select::all(p)),
            Rows::Some(_) => (
                Problem {
                    n_q: 1,
                    q_pos: row,
                    ..*p
                },
                Select::row(p, row),
            ),
        };
        let xi = [sel.q(x.q), x.k, x.v, sel.o(x.d_o)];
        let mut v = forward(&rp, plan, dtype, xi, &sel.outputs(split), "split");
        v.extend(forward(&rp, plan, dtype, xi, &sel.outputs(one), "one"));
        if backward {
            for (who, out) in [("split", split), ("one", one)] {
                let got = sel.outputs(out);
                let judged = gradients(&rp, dtype, xi, &got);
                let keep = |n: &str| matches!(rows, Rows::All) || n == "dq";
                v.extend(
                    judged
                        .into_iter()
                        .filter(|(n, _)| keep(n))
                        .map(|(n, v)| (format!("{who} {n}"), v)),
                );
            }
        }
        per_row.push(v);
    }
    // The worst row of each output.
    for v in per_row {
        for (name, verdict) in v {
            match all
                .iter_mut()
                .find(|(n, _): &&mut (String, Verdict)| *n == name)
            {
                Some((_, w)) if w.ratio() < verdict.ratio() => *w = verdict,
                Some(_) => {}
                None => all.push((name, verdict)),
            }
        }
    }
    all
}

/// The rows of one judged problem within the whole one's tensors.
struct Select {
    row: usize,
    rows: usize,
    q_width: usize,
    o_width: usize,
    heads: usize,
}

impl Select {
    fn all(p: &Problem) -> Select {
        Select {
            row: 0,
            rows: p.n_q,
            q_width: p.n_heads * p.head_dim,
            o_width: p.n_heads * p.dv(),
            heads: p.n_heads,
        }
    }

    fn row(p: &Problem, row: usize) -> Select {
        Select {
            row,
            rows: 1,
            ..Select::all(p)
        }
    }

    fn q<'a>(&self, q: &'a [f32]) -> &'a [f32] {
        &q[self.row * self.q_width..][..self.rows * self.q_width]
    }

    fn o<'a>(&self, o: &'a [f32]) -> &'a [f32] {
        &o[self.row * self.o_width..][..self.rows * self.o_width]
    }

    fn outputs(&self, out: &Outputs) -> Outputs {
        let has = !out.dq.is_empty();
        Outputs {
            o: self.o(&out.o).to_vec(),
            lse: out.lse[self.row * self.heads..][..self.rows * self.heads].to_vec(),
            dq: if has {
                self.q(&out.dq).to_vec()
            } else {
                Vec::new()
            },
            dk: out.dk.clone(),
            dv: out.dv.clone(),
        }
    }
}

/// O and LSE of `who` against the reference; the split's baseline merges the key chunks'
/// parts, one GPU's is one pass.
fn forward(
    p: &Problem,
    plan: &Plan,
    dtype: Dtype,
    [q, k, v, _]: [&[f32]; 4],
    got: &Outputs,
    who: &str,
) -> Vec<(String, Verdict)> {
    let scalar = Scalar::from(dtype);
    let round = |x: f32| round_to(x, scalar);
    let [q64, k64, v64] = [q, k, v].map(reference::cast::<f64>);
    let exact = reference::attention(p, &q64, &k64, &v64);
    let base = match who {
        "split" => {
            let m = plan.chunk as usize;
            let (os, ls): (Vec<_>, Vec<_>) = (0..plan.chunks())
                .map(|j| {
                    let part = Problem {
                        keys: Some((j * m, (j + 1) * m)),
                        ..*p
                    };
                    let a = reference::attention_rounding_p(&part, q, k, v, &round);
                    (rounded(&a.o, scalar), a.lse)
                })
                .unzip();
            reference::merge_states(&os, &ls, p.dv(), p.n_heads, None)
        }
        _ => {
            let a = reference::attention_rounding_p(p, q, k, v, &round);
            (a.o, a.lse)
        }
    };
    let scale = exact.o.iter().fold(1.0f64, |m, x| m.max(x.abs()));
    let floor = match dtype {
        Dtype::F32 => 0.0,
        _ => 1e-6 * (scale - 1.0),
    };
    let o = judge(&got.o, &exact.o, &rounded(&base.0, scalar));
    vec![
        (
            format!("{who} o"),
            Verdict {
                bound: o.bound + floor,
                ..o
            },
        ),
        (format!("{who} lse"), judge(&got.lse, &exact.lse, &base.1)),
    ]
}

/// dQ, dK and dV by the backward's rule, from the O and LSE the backward was given.
fn gradients(
    p: &Problem,
    dtype: Dtype,
    inputs: [&[f32]; 4],
    got: &Outputs,
) -> Vec<(&'static str, Verdict)> {
    let saved = (&got.o[..], &got.lse[..]);
    let grads = [&got.dq[..], &got.dk, &got.dv];
    match dtype {
        Dtype::F32 => compare::judge_backward(p, inputs, saved, grads, [&[], &[]], &[]),
        _ => compare::judge_half_backward(
            p,
            inputs,
            saved,
            grads,
            [&[], &[]],
            &[],
            Scalar::from(dtype),
        ),
    }
}

/// The largest difference of `got` from `want` as a fraction of `want`'s largest
/// magnitude.
pub fn relative(got: &[f32], want: &[f32]) -> f64 {
    let scale = want.iter().fold(0.0f64, |m, x| m.max(f64::from(x.abs())));
    let diff = got
        .iter()
        .zip(want)
        .fold(0.0f64, |m, (a, b)| m.max(f64::from((a - b).abs())));
    diff / scale.max(f64::MIN_POSITIVE)
}
