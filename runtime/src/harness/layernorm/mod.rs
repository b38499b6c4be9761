//! The LayerNorm + Linear's harness: its reference, the judge of its outputs, its check
//! rows, its benchmark and the unfused baseline it is timed against.

#[cfg(not(target_arch = "wasm32"))]
pub mod baseline;
#[cfg(not(target_arch = "wasm32"))]
pub mod bench;
#[cfg(not(target_arch = "wasm32"))]
pub mod check;
pub mod judge;
pub mod reference;
