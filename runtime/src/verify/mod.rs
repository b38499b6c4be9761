//! Checking the kernels' outputs against an independent CPU reference, as `check` and the
//! tests do: [`reference`](mod@reference) computes attention, its backward and RoPE in f64
//! (the truth) and in f32 with pairwise sums (the baseline a framework reaches), [`compare`]
//! holds the pass rule that judges an output between the two, [`layernorm`] does both for
//! the fused LayerNorm + Linear, and [`random`] draws the inputs `check` draws.
//!
//! ```no_run
//! use runtime::verify::{compare::judge_attention, random, reference::Problem};
//! # fn kernel_forward(q: &[f32], k: &[f32], v: &[f32]) -> (Vec<f32>, Vec<f32>) { todo!() }
//! let (seq, heads, d) = (64, 4, 32);
//! let [q, k, v] = [1, 2, 3].map(|seed| random(seq * heads * d, seed));
//! let (o, lse) = kernel_forward(&q, &k, &v); // the kernel's O and LSE, read back
//! let problem = Problem {
//!     batch: 1,
//!     n_q: seq,
//!     n_k: seq,
//!     n_heads: heads,
//!     n_kv_heads: heads,
//!     head_dim: d,
//!     scale: 1.0 / (d as f64).sqrt(),
//!     causal: true,
//!     ..Problem::default()
//! };
//! for (output, verdict) in judge_attention(&problem, [&q, &k, &v], &o, Some(&lse)) {
//!     assert!(verdict.pass(), "{output}: {verdict:?}");
//! }
//! ```

use rand::{Rng, SeedableRng, rngs::StdRng};

pub mod compare;
pub mod layernorm;
pub mod reference;

/// Uniform values in [-2, 2), reproducible from `seed`: the inputs `check` draws. The
/// generator needs no OS entropy, so a browser build draws the same numbers.
pub fn random(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(-2.0f32..2.0)).collect()
}
