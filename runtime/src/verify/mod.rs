//! Checking the kernels' outputs against an independent CPU reference, as `check` and the
//! tests do: [`reference`](mod@reference) computes attention, its backward and RoPE in f64
//! (the truth) and in f32 with pairwise sums (the baseline a framework reaches), [`compare`]
//! holds the pass rule that judges an output between the two, [`layernorm`] does both for
//! the fused LayerNorm + Linear, and [`random`] draws the inputs `check` draws.
//!
//! ```no_run
//! use runtime::verify::{compare::judge_attention, random, reference::Problem};
//! use runtime::{BlockOn, ForwardInput, Gpu, Heads, Kernel, Modifiers, kernels};
//! # fn main() -> Result<(), runtime::Error> {
//! let (seq, heads, d) = (64u32, 4u32, 64u32);
//! let len = (seq * heads * d) as usize;
//! let [q, k, v] = [1, 2, 3].map(|seed| random(len, seed));
//! // The causal forward of the runtime's family (head_dim 64), on this machine's adapter.
//! let abi = &kernels::attention_forward::ABI;
//! let gpu = Gpu::new([abi]).block_on()?;
//! let kernel = Kernel::new(&gpu, abi).block_on()?;
//! let input = ForwardInput {
//!     batch: 1, seq_len: seq, heads: Heads::new(heads, heads, d),
//!     q: &q, k: &k, v: &v, seg: None, scale: None, mods: Modifiers::default(),
//! };
//! let out = runtime::forward(&gpu, &kernel, &input).block_on()?;
//! let problem = Problem {
//!     batch: 1,
//!     n_q: seq as usize,
//!     n_k: seq as usize,
//!     n_heads: heads as usize,
//!     n_kv_heads: heads as usize,
//!     head_dim: d as usize,
//!     scale: 1.0 / f64::from(d).sqrt(),
//!     causal: true,
//!     ..Problem::default()
//! };
//! for (output, verdict) in judge_attention(&problem, [&q, &k, &v], &out.o, Some(&out.lse)) {
//!     assert!(verdict.pass(), "{output}: {verdict:?}");
//! }
//! # Ok(())
//! # }
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
