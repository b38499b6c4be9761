//! Attention states merged: a running (max m, sum l, output) to which a part of max
//! `m_s`, sum `l_s` and output `x` (unnormalized: Σ e^(s − m_s)·v over its keys) joins.
//! The decode's reduce merges its slices' partials with it, and the merge op the
//! normalized outputs of whole attentions (a part of log-sum-exp L and output O is one of
//! max L, sum 1 and output O).

use super::numerics::Helper;
use super::writer::Template;

/// `State`, `state_empty()` and `merge_state(..)`.
pub(super) const STATES: Template = Template {
    name: "states",
    needs: &[Helper::Exp],
    text: r#"// A running softmax state over the parts merged so far.
struct State {
    m: f32,
    l: f32,
    acc: vec4<f32>,
}

fn state_empty() -> State {
    return State(NEG_BIG, 0.0, vec4<f32>(0.0));
}

// `s` with a part of max m_s, sum l_s and output x joined: each side rescaled to the larger
// max, so neither exponential overflows. A part of max NEG_BIG (no key) weighs nothing
// once a real part has joined.
fn merge_state(s: State, m_s: f32, l_s: f32, x: vec4<f32>) -> State {
    let m = max(s.m, m_s);
    let keep = exp_f32(s.m - m);
    let w = exp_f32(m_s - m);
    return State(m, fma(keep, s.l, w * l_s), fma(vec4<f32>(keep), s.acc, w * x));
}

"#,
};
