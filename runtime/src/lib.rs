//! The wgpu runtime for attn-dsl kernels: adapter choice, pipelines created from any
//! kernel's ABI, validated forward and decode dispatch, CPU references and the checks that
//! prove the kernels right on whatever adapter the machine has.
//!
//! The API is async where it waits on the GPU (`Gpu::new`, `Kernel::new`, an op's
//! `prepare`, readbacks such as `Tensor::to_f32` and the host-slice calls `forward`,
//! `Backward::run`, ...), and synchronous everywhere else: recording never waits.
//! Natively, [`block_on`] (or the [`BlockOn`] method `.block_on()`) runs any of them; in a
//! browser (`wasm32-unknown-unknown` on its WebGPU) they are awaited. The case matrix, GPU
//! timing, `.npy` files and the binaries are native only.

pub mod attention;
pub mod backward;
#[cfg(not(target_arch = "wasm32"))]
pub mod bench;
pub mod buffers;
#[cfg(not(target_arch = "wasm32"))]
pub mod cases;
pub mod compare;
pub mod decode;
pub mod device;
mod error;
pub mod kernel;
pub mod kernels;
pub mod layernorm;
pub mod modifiers;
#[cfg(not(target_arch = "wasm32"))]
pub mod npy;
pub mod ops;
mod record;
pub mod reference;
pub mod rope;
pub mod tensor;
#[cfg(not(target_arch = "wasm32"))]
pub mod timing;
pub mod tuning;

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
pub use modifiers::{Bias, DeviceBias, DeviceModifiers, Dropout, Modifiers};
pub use rope::{RopeInput, rope};
pub use tensor::{Tensor, TensorError};
