//! The harness of `check`, `bench`, `attn` and the tests: the case matrix, the benchmarks
//! and `.npy` files. Public so the binaries and the tests reach it; hidden from the
//! documentation because it is not the library (the references and the pass rule it judges
//! by are [`crate::verify`]).

#[cfg(not(target_arch = "wasm32"))]
pub mod bench;
#[cfg(not(target_arch = "wasm32"))]
pub mod cascaded;
#[cfg(not(target_arch = "wasm32"))]
pub mod cases;
#[cfg(not(target_arch = "wasm32"))]
pub mod continued;
#[cfg(not(target_arch = "wasm32"))]
pub mod kv_fp8;
pub mod layernorm;
#[cfg(not(target_arch = "wasm32"))]
pub mod merged;
#[cfg(not(target_arch = "wasm32"))]
pub mod npy;
