//! The wgpu runtime for attn-dsl kernels, a library an engine embeds: on the caller's
//! device or one it picks, tensors on the device, every op recorded into the caller's
//! command encoder (forward, backward in every schedule, decode against a KV cache on the
//! device, RoPE, LayerNorm + Linear), kernels compiled on first use and kept in a pipeline
//! cache; host-slice calls on top for tests and tools.
//!
//! The API is async where it waits on the GPU (`Gpu::new`, `Kernel::new`, an op's
//! `prepare`, readbacks such as `Tensor::to_f32` and the host-slice calls `forward`,
//! `Backward::run`, ...), and synchronous everywhere else: recording never waits.
//! Natively, [`block_on`] (or the [`BlockOn`] method `.block_on()`) runs any of them; in a
//! browser (`wasm32-unknown-unknown` on its WebGPU) they are awaited. The case matrix, GPU
//! timing, `.npy` files and the binaries are native only.

// The layers, each built on those above it:
// - `device`: the context (the caller's wgpu device or one picked), its uniform and
//   pipeline caches, what each kernel needs of it;
// - `tensor`, `shape`, `modifiers`: device tensors, the problem's shape, modifier values,
//   and the checks every entry point makes on them;
// - `dispatch`: a compiled kernel and the recording of one dispatch (tensors bound by name,
//   bind groups reused);
// - `plan`: which configuration and schedule run, from the adapter's tuning table;
// - `ops`: the recording API (forward, backward, decode, the KV cache, RoPE, LayerNorm +
//   Linear, conversions) and `backward` (the schedules and their planner);
// - `host`: the host-slice conveniences over the ops (upload, record, submit, read back);
// - `kernels`: the default family of `attention_kernel!` descriptions.
// The harness of the binaries and tests (case matrix, references, the pass rule, bench,
// .npy files) is `harness`, hidden from the documentation: it is not the library.

pub mod backward;
pub mod device;
pub mod dispatch;
mod error;
pub mod fp8;
pub mod host;
pub mod kernels;
pub mod layernorm;
pub mod modifiers;
pub mod ops;
pub mod plan;
pub mod shape;
pub mod tensor;
#[cfg(not(target_arch = "wasm32"))]
pub mod timing;

#[doc(hidden)]
pub mod harness;

// Paths the modules had before they moved to their layers.
pub use dispatch::kernel;
#[cfg(not(target_arch = "wasm32"))]
#[doc(hidden)]
pub use harness::{bench, cases, continued, kv_fp8, npy};
#[doc(hidden)]
pub use harness::{compare, reference};
pub use host::{attention, buffers, decode, rope};
pub use plan::tuning;

/// Runs a future to completion on this thread: the one blocking shim over the async API
/// (native only; a browser awaits).
#[cfg(not(target_arch = "wasm32"))]
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    pollster::block_on(future)
}

/// `.block_on()` on any future: [`block_on`] as a method, for chains such as
/// `Gpu::new([]).block_on()?` (native only).
#[cfg(not(target_arch = "wasm32"))]
pub use pollster::FutureExt as BlockOn;

pub use attention::{DecodeInput, ForwardInput, ForwardOutput, Heads, decode, forward};
pub use attn_dsl::{Dtype, Scalar};
pub use backward::{Backward, BackwardInput, Gradients, Schedule};
pub use decode::{DecodePath, Decoder, SplitDecode};
pub use device::{DeviceError, Gpu};
pub use error::{Error, InputError};
pub use kernel::Kernel;
pub use modifiers::{Bias, DeviceBias, DeviceModifiers, Dropout, FlexOf, Modifiers};
pub use rope::{RopeInput, rope};
pub use tensor::{Tensor, TensorError};
