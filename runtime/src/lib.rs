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
mod error;
pub mod gpu;
pub mod kernel;
pub mod kernels;
pub mod layernorm;
pub mod modifiers;
#[cfg(not(target_arch = "wasm32"))]
pub mod npy;
pub mod reference;
pub mod rope;
#[cfg(not(target_arch = "wasm32"))]
pub mod timing;
pub mod tuning;

pub use attention::{DecodeInput, ForwardInput, ForwardOutput, Heads, decode_async, forward_async};
#[cfg(not(target_arch = "wasm32"))]
pub use attention::{decode, forward};
pub use backward::{Backward, BackwardInput, Gradients, Schedule};
pub use decode::{DecodePath, Decoder, SplitDecode};
pub use error::{Error, InputError};
pub use gpu::{DeviceError, Gpu};
pub use kernel::Kernel;
pub use modifiers::{Bias, Dropout, Modifiers};
#[cfg(not(target_arch = "wasm32"))]
pub use rope::rope;
pub use rope::{RopeInput, rope_async};
