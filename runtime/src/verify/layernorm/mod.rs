//! The fused LayerNorm + Linear's CPU reference ([`reference`](mod@reference), f64 and the
//! f32 baseline) and the judge of its outputs ([`judge`]) by the pass rule.

pub mod judge;
pub mod reference;
