//! The LayerNorm + Linear's harness: its check rows (judged by
//! [`crate::verify::layernorm::judge`]), its benchmark and the unfused baseline it is timed
//! against.

#[cfg(not(target_arch = "wasm32"))]
pub mod baseline;
#[cfg(not(target_arch = "wasm32"))]
pub mod bench;
#[cfg(not(target_arch = "wasm32"))]
pub mod check;
