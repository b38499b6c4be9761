//! The pass rule (docs/accuracy.md): a GPU result passes when its max abs error against the
//! f64 reference is at most twice that of a plain f32 CPU implementation, plus 1e-6.

use attn_dsl::Scalar;

use crate::verify::reference::{self, Problem};

/// How one output compares with the reference.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    /// max |gpu − ref64|
    pub error: f64,
    /// 2 · max |cpu32 − ref64| + 1e-6
    pub bound: f64,
}

impl Verdict {
    /// Whether the error is within the bound.
    pub fn pass(&self) -> bool {
        self.error <= self.bound
    }

    /// Error as a fraction of the bound (> 1 fails).
    pub fn ratio(&self) -> f64 {
        self.error / self.bound
    }
}

/// Judges a GPU attention result (O, and LSE when the kernel saves it) against the f64
/// reference and the f32 baseline of the same problem.
pub fn judge_attention(
    problem: &Problem,
    inputs: [&[f32]; 3],
    o: &[f32],
    lse: Option<&[f32]>,
) -> Vec<(&'static str, Verdict)> {
    let [q, k, v] = inputs.map(reference::cast::<f64>);
    let r64 = reference::attention(problem, &q, &k, &v);
    let [q, k, v] = inputs.map(reference::cast::<f32>);
    let r32 = reference::attention(problem, &q, &k, &v);
    let mut verdicts = vec![("o", judge(o, &r64.o, &r32.o))];
    if let Some(lse) = lse {
        verdicts.push(("lse", judge(lse, &r64.lse, &r32.lse)));
    }
    verdicts
}

/// Judges GPU gradients (dQ, dK, dV) against the exact f64 reference backward, with the
/// bound from an f32 baseline of the kernels' formula: P from the saved LSE and
/// D = rowsum(dO ∘ O), from the same f32 `saved = (o, lse)` the kernels were given.
pub fn judge_backward(
    problem: &Problem,
    inputs: [&[f32]; 4],
    saved: (&[f32], &[f32]),
    got: [&[f32]; 3],
    [got_dbias, got_dsinks]: [&[f32]; 2],
    got_flex: &[(String, Vec<f32>)],
) -> Vec<(&'static str, Verdict)> {
    let [q, k, v_, d_o] = inputs.map(reference::cast::<f64>);
    let r64 = reference::attention_backward(problem, [&q, &k, &v_, &d_o], None);
    let r32 = reference::attention_backward(problem, inputs, Some(saved));
    let mut verdicts = vec![
        ("dq", judge(got[0], &r64.dq, &r32.dq)),
        ("dk", judge(got[1], &r64.dk, &r32.dk)),
        ("dv", judge(got[2], &r64.dv, &r32.dv)),
    ];
    if problem.mods.bias.is_some() {
        verdicts.push(("dbias", judge(got_dbias, &r64.dbias, &r32.dbias)));
    }
    verdicts.extend(flex_verdicts(got_flex, &r64.dflex, &r32.dflex, judge));
    if problem.mods.sinks.is_some() {
        let v = judge(got_dsinks, &r64.dsinks, &r32.dsinks);
        let inputs = [&q[..], &k, &v_, &d_o];
        verdicts.push((
            "dsinks",
            over_saved_floor(v, problem, inputs, saved, &r64.dsinks),
        ));
    }
    verdicts
}

/// `v` with its bound raised to twice dSinks' floor. A head's dSinks sums one term per row, e^(sink − LSE)·D, built from the
/// saved O and LSE, whose rounding every implementation reads, and from a sink weight that
/// any f32 kernel holds rounded (its exp within an ulp, 2^-23 of each term): per head, the
/// error of exact arithmetic on the saved tensors plus an ulp of every term. With a
/// handful of values (one per head) the f32 baseline's own errors can cancel that shared
/// part by chance and leave twice its error under what any f32 kernel reaches.
fn over_saved_floor(
    v: Verdict,
    problem: &Problem,
    inputs: [&[f64]; 4],
    (o, lse): (&[f32], &[f32]),
    exact: &[f64],
) -> Verdict {
    let (o, lse) = (reference::cast::<f64>(o), reference::cast::<f64>(lse));
    let from_saved = reference::attention_backward(problem, inputs, Some((&o, &lse)));
    let floor = from_saved
        .dsinks
        .iter()
        .zip(&from_saved.dsinks_terms)
        .zip(exact)
        .map(|((a, terms), b)| (a - b).abs() + terms * f64::from(f32::EPSILON))
        .fold(0.0, f64::max);
    Verdict {
        bound: v.bound.max(2.0 * floor + 1e-6),
        ..v
    }
}

/// Judges a half-precision forward or decode (`inputs` already rounded to the kernel's dtype, as the
/// kernel read them) by the rule for half precision: the f64 reference on the same
/// inputs; the baseline what a framework gives in that dtype (f32 arithmetic on the half
/// inputs, the softmax's weights exp(score − max) rounded to the dtype before an
/// f32-accumulated P·V, as FlashAttention does, O rounded to the dtype; LSE kept in f32); pass at twice the baseline's error plus 1e-6 of the
/// output's scale. (The tensor-core kernels round P to f16 as frameworks do; before them
/// the baseline kept P in f32, a bound they cannot meet by construction.)
pub fn judge_half_attention(
    problem: &Problem,
    inputs: [&[f32]; 3],
    o: &[f32],
    lse: Option<&[f32]>,
    dtype: Scalar,
) -> Vec<(&'static str, Verdict)> {
    let [q, k, v] = inputs.map(reference::cast::<f64>);
    let r64 = reference::attention(problem, &q, &k, &v);
    let [q, k, v] = inputs.map(reference::cast::<f32>);
    let round = |x: f32| crate::tensor::buffers::round_to(x, dtype);
    let r32 = reference::attention_rounding_p(problem, &q, &k, &v, &round);
    let framework_o = crate::tensor::buffers::rounded(&r32.o, dtype);
    let scale = r64.o.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let scaled = |v: Verdict| Verdict {
        bound: v.bound - 1e-6 + 1e-6 * scale.max(1.0),
        ..v
    };
    let mut verdicts = vec![("o", scaled(judge(o, &r64.o, &framework_o)))];
    verdicts.extend(lse.map(|lse| ("lse", judge(lse, &r64.lse, &r32.lse))));
    verdicts
}

/// Judges a half-precision backward (`inputs` Q, K, V, dO and the saved O already rounded
/// to the kernels' dtype) by the rule for half precision: the f64 reference on the same
/// inputs; the baseline what FlashAttention gives in that dtype (f32 arithmetic on the
/// half inputs, P and dS rounded to the dtype as the products' operands, every gradient,
/// dBias included, returned in the dtype; dSinks in f32, see below); pass at twice the baseline's error
/// plus 1e-6 of each gradient's scale (at least 1e-6, the f32 rule's floor). The kernels
/// return f32 gradients.
pub fn judge_half_backward(
    problem: &Problem,
    inputs: [&[f32]; 4],
    saved: (&[f32], &[f32]),
    got: [&[f32]; 3],
    [got_dbias, got_dsinks]: [&[f32]; 2],
    got_flex: &[(String, Vec<f32>)],
    dtype: Scalar,
) -> Vec<(&'static str, Verdict)> {
    let [q, k, v_, d_o] = inputs.map(reference::cast::<f64>);
    let r64 = reference::attention_backward(problem, [&q, &k, &v_, &d_o], None);
    let round = |x: f32| crate::tensor::buffers::round_to(x, dtype);
    let r32 = reference::attention_backward_rounding(problem, inputs, Some(saved), &round);
    let verdict = |got: &[f32], exact: &[f64], framework: &[f32]| {
        let scale = exact.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let v = judge(got, exact, framework);
        Verdict {
            bound: v.bound - 1e-6 + 1e-6 * scale.max(1.0),
            ..v
        }
    };
    let half = |g: &[f32]| crate::tensor::buffers::rounded(g, dtype);
    let mut verdicts = vec![
        ("dq", verdict(got[0], &r64.dq, &half(&r32.dq))),
        ("dk", verdict(got[1], &r64.dk, &half(&r32.dk))),
        ("dv", verdict(got[2], &r64.dv, &half(&r32.dv))),
    ];
    if problem.mods.bias.is_some() {
        verdicts.push(("dbias", verdict(got_dbias, &r64.dbias, &half(&r32.dbias))));
    }
    // A modifier tensor's gradient, like dBias, is returned in the dtype by a framework.
    let halved: Vec<(String, Vec<f32>)> = r32
        .dflex
        .iter()
        .map(|(n, g)| (n.clone(), half(g)))
        .collect();
    verdicts.extend(flex_verdicts(got_flex, &r64.dflex, &halved, verdict));
    // dSinks is one sum per head over every row, accumulated in f32 by a fused kernel (and
    // by ours): the framework's f32 sum is the baseline. Rounded to the dtype, the few
    // elements' rounding can land nearer the exact value by chance and leave a bound below
    // the error that the f32 sum and every schedule share (D from the saved, rounded O).
    if problem.mods.sinks.is_some() {
        let v = verdict(got_dsinks, &r64.dsinks, &r32.dsinks);
        let inputs = [&q[..], &k, &v_, &d_o];
        verdicts.push((
            "dsinks",
            over_saved_floor(v, problem, inputs, saved, &r64.dsinks),
        ));
    }
    verdicts
}

/// A verdict per modifier tensor's gradient, by `judge`; a gradient missing from `got`
/// fails.
fn flex_verdicts(
    got: &[(String, Vec<f32>)],
    r64: &[(String, Vec<f64>)],
    r32: &[(String, Vec<f32>)],
    judge: impl Fn(&[f32], &[f64], &[f32]) -> Verdict,
) -> Vec<(&'static str, Verdict)> {
    r64.iter()
        .zip(r32)
        .map(|((name, exact), (_, framework))| {
            let gpu = got
                .iter()
                .find(|(n, _)| n == name)
                .map_or(&[][..], |(_, g)| &g[..]);
            (interned(name), judge(gpu, exact, framework))
        })
        .collect()
}

/// `name` as a `&'static str` (a verdict's name), leaked once per distinct name: a
/// process checks a handful of modifier tensors.
pub fn interned(name: &str) -> &'static str {
    static NAMES: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(n) = names.iter().find(|n| **n == name) {
        return n;
    }
    let leaked: &'static str = Box::leak(name.to_string().into_boxed_str());
    names.push(leaked);
    leaked
}

/// The pass rule on one output: `gpu` passes when its max abs error against the f64
/// `reference` is at most twice that of `cpu32` (the f32 baseline of the same formula),
/// plus 1e-6.
pub fn judge(gpu: &[f32], reference: &[f64], cpu32: &[f32]) -> Verdict {
    let bound = 2.0 * max_abs_error(cpu32, reference) + 1e-6;
    Verdict {
        error: max_abs_error(gpu, reference),
        bound,
    }
}

/// Max abs difference; equal infinities count as 0, a NaN or a length mismatch as +inf.
pub fn max_abs_error(got: &[f32], reference: &[f64]) -> f64 {
    if got.len() != reference.len() {
        return f64::INFINITY;
    }
    got.iter()
        .zip(reference)
        .map(|(&g, &r)| {
            let g = f64::from(g);
            if g == r {
                0.0
            } else if g.is_nan() || r.is_nan() {
                f64::INFINITY
            } else {
                (g - r).abs()
            }
        })
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_and_length_mismatch_fail_and_infinities_match() {
        assert_eq!(max_abs_error(&[f32::NAN], &[0.0]), f64::INFINITY);
        assert_eq!(max_abs_error(&[1.0], &[1.0, 2.0]), f64::INFINITY);
        assert_eq!(max_abs_error(&[f32::INFINITY], &[f64::INFINITY]), 0.0);
        let v = judge(&[1.0 + 3e-6], &[1.0], &[1.0 + 1e-6]);
        assert!(!v.pass(), "{v:?}");
        assert!(judge(&[1.0 + 2e-6], &[1.0], &[1.0 + 1e-6]).pass());
    }
}
