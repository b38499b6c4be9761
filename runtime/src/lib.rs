//! The wgpu runtime for attn-dsl kernels: adapter choice, pipelines created from any
//! kernel's ABI, validated forward and decode dispatch, CPU references and the checks that
//! prove the kernels right on whatever adapter the machine has.

pub mod attention;
pub mod backward;
pub mod bench;
pub mod buffers;
pub mod cases;
pub mod compare;
mod error;
pub mod gpu;
pub mod kernel;
pub mod kernels;
pub mod modifiers;
pub mod npy;
pub mod reference;
pub mod rope;
pub mod timing;
pub mod tuning;

pub use attention::{DecodeInput, ForwardInput, ForwardOutput, Heads, decode, forward};
pub use backward::{Backward, BackwardInput, Gradients, Schedule};
pub use error::{Error, InputError};
pub use gpu::{DeviceError, Gpu};
pub use kernel::Kernel;
pub use modifiers::{Bias, Dropout, Modifiers};
pub use rope::{RopeInput, rope};
