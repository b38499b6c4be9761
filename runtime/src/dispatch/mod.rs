//! A compiled kernel ([`kernel::Kernel`], from any `KernelAbi`) and the recording of one
//! dispatch of it: tensors checked against their bindings and bound by name, uniforms by
//! content, bind groups reused; and the [`Recorder`] whose compute pass the dispatches of
//! several ops share.

pub mod kernel;
pub(crate) mod record;
pub mod recorder;
pub(crate) mod uniforms;

pub use recorder::{Record, Recorder};
