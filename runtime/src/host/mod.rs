//! The host-slice conveniences: host data checked, uploaded, run through the recording
//! ops, read back. For tests, `check`, `attn` and quick experiments; an engine records the
//! ops on its own tensors instead.

pub mod attention;
pub mod backward;
pub mod buffers;
pub mod decode;
pub mod layernorm;
pub mod rope;
