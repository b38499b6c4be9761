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

#![warn(missing_docs)]

// The layers, each built on those before it (`tests/suite/layers.rs` fails on an import that
// points the other way):
// - `fp8`, `kernels`: fp8 encodings and the default family of `attention_kernel!`
//   descriptions, which need nothing of the runtime;
// - `error`: every refusal, the device's included, so that every layer above returns the
//   one `Error`;
// - `device`: the context (the caller's wgpu device or one picked), its uniform and
//   pipeline caches, what each kernel needs of it;
// - `tensor`, `shape`: device tensors and their readback, the problem's shape, and the
//   checks every entry point makes on them;
// - `modifiers`: the modifier values callers pass and their checks;
// - `dispatch`: a compiled kernel and the recording of one dispatch (tensors bound by name,
//   bind groups reused), dispatches sharing a compute pass (`Recorder`);
// - `plan`, `timing`: which configuration and schedule run, from the adapter's tuning
//   table; GPU timestamps;
// - `ops`: the recording API, one module per op (forward, backward with its schedules and
//   planner, decode, the KV cache, RoPE, LayerNorm + Linear, conversions), each holding its
//   spec, its object, its recording and its host-slice convenience (upload, record,
//   submit, read back);
// - `verify`: the CPU references (f64, and the f32 baseline), the pass rule and the inputs'
//   generator, for checking the kernels' outputs;
// - `harness`: the binaries' and tests' case matrix, bench and .npy files, hidden from the
//   documentation: it is not the library.
// The crate root re-exports the public paths.

pub mod device;
pub mod dispatch;
mod error;
pub mod fp8;
pub mod kernels;
pub mod modifiers;
pub mod ops;
pub mod plan;
pub mod shape;
pub mod tensor;
#[cfg(not(target_arch = "wasm32"))]
pub mod timing;

#[cfg(feature = "harness")]
#[doc(hidden)]
pub mod harness;
#[cfg(feature = "harness")]
pub mod verify;

#[cfg(not(target_arch = "wasm32"))]
pub use device::block_on;

/// `.block_on()` on any future: [`block_on`] as a method, for chains such as
/// `Gpu::new([]).block_on()?` (native only).
#[cfg(not(target_arch = "wasm32"))]
pub use pollster::FutureExt as BlockOn;

pub use attn_dsl::{Dtype, Scalar};
pub use device::{DeviceError, Gpu};
pub use dispatch::kernel::Kernel;
pub use error::{Error, InputError};
pub use modifiers::{Bias, DeviceBias, DeviceModifiers, Dropout, FlexOf, Modifiers};
pub use ops::backward::{Backward, Schedule};
pub use ops::backward::{BackwardInput, Gradients};
pub use ops::decode::{DecodeInput, DecodePath, Decoder, SplitDecode, decode};
pub use ops::forward::{ForwardInput, ForwardOutput, forward};
pub use ops::rope::{RopeInput, rope};
pub use shape::Heads;
pub use tensor::{Tensor, TensorError};
