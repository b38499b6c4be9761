//! The harness of `check`, `bench`, `attn` and the tests: the case matrix, the CPU
//! references (f64, and the framework-grade f32 baseline), the pass rule, the benchmarks
//! and `.npy` files. Public so the binaries, the tests and the examples reach it; hidden
//! from the documentation because it is not the library.

#[cfg(not(target_arch = "wasm32"))]
pub mod bench;
#[cfg(not(target_arch = "wasm32"))]
pub mod cases;
pub mod compare;
#[cfg(not(target_arch = "wasm32"))]
pub mod continued;
pub mod inputs;
#[cfg(not(target_arch = "wasm32"))]
pub mod kv_fp8;
pub mod layernorm;
#[cfg(not(target_arch = "wasm32"))]
pub mod merged;
#[cfg(not(target_arch = "wasm32"))]
pub mod npy;
pub mod reference;
