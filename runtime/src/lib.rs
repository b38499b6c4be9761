//! The wgpu runtime for attn-dsl kernels: adapter choice, pipelines created from any
//! kernel's ABI, validated forward and decode dispatch, CPU references and the checks that
//! prove the kernels right on whatever adapter the machine has.
//!
//! The same runtime builds for `wasm32-unknown-unknown` on the browser's WebGPU: there each
//! step that waits on the GPU is async (`Gpu::new_async`, `forward_async`,
//! `Backward::run_async`, ...), and the blocking forms, the case matrix, GPU timing, `.npy`
//! files and the binaries are native only.

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

pub use attention::{DecodeInput, ForwardInput, ForwardOutput, Heads, decode_async, forward_async};
#[cfg(not(target_arch = "wasm32"))]
pub use attention::{decode, forward};
pub use attn_dsl::{Dtype, Scalar};
pub use backward::{Backward, BackwardInput, Gradients, Schedule};
pub use decode::{DecodePath, Decoder, SplitDecode};
pub use device::{DeviceError, Gpu};
pub use error::{Error, InputError};
pub use kernel::Kernel;
pub use modifiers::{Bias, DeviceBias, DeviceModifiers, Dropout, Modifiers};
#[cfg(not(target_arch = "wasm32"))]
pub use rope::rope;
pub use rope::{RopeInput, rope_async};
pub use tensor::{Tensor, TensorError};
