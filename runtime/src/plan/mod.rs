//! Which configuration and schedule run on this adapter: the candidates `check` proves
//! right and the tuning table `bench --tune` writes.

pub mod calibration;
pub mod decode;
pub mod kernels;
pub mod tuning;
