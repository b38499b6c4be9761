//! Why a device cannot be had or cannot run a kernel, and what a kernel built with the
//! modifier-read report found: defined below the device layer so that every public call
//! returns one error type, [`super::Error`].

use thiserror::Error;

#[cfg(not(target_arch = "wasm32"))]
const INSTALL_HINT: &str = "install a Vulkan driver: on Debian or Ubuntu, \
    `apt-get install -y mesa-vulkan-drivers` gives the CPU adapter (lavapipe)";
#[cfg(target_arch = "wasm32")]
const INSTALL_HINT: &str = "this browser offers no WebGPU adapter (Chromium: \
    `--enable-unsafe-webgpu`, or a build with WebGPU on by default)";

/// Why no device could run the kernels: none found, or one without a limit or feature they
/// need.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// No adapter on the backends asked for.
    #[error("no GPU or CPU adapter found for backends {backends}; {INSTALL_HINT}")]
    NoAdapter {
        /// The backends searched.
        backends: String,
    },
    /// An adapter that offers less of a limit than the kernels need.
    #[error("adapter `{adapter}` offers {what} = {offered}, but the kernels need {needed}")]
    Limit {
        /// The adapter's name.
        adapter: String,
        /// The limit, as `wgpu::Limits` names it.
        what: &'static str,
        /// What the kernels need.
        needed: u64,
        /// What the adapter offers.
        offered: u64,
    },
    /// The adapter refused the device the runtime asked for.
    #[error("adapter `{adapter}` refused the device request")]
    Request {
        /// The adapter's name.
        adapter: String,
        /// wgpu's reason.
        source: wgpu::RequestDeviceError,
    },
    /// A caller's device created with less of a limit than a kernel needs.
    #[error(
        "the device was created with {what} = {has}, but kernel `{kernel}` needs {needed}; \
         request at least {needed} in DeviceDescriptor::required_limits"
    )]
    DeviceLimit {
        /// The kernel's name.
        kernel: String,
        /// The limit, as `wgpu::Limits` names it.
        what: &'static str,
        /// What the kernel needs.
        needed: u64,
        /// What the device was created with.
        has: u64,
    },
    /// A caller's device created without a feature a kernel needs.
    #[error(
        "kernel `{kernel}` needs the {feature} feature, which the device was created without; \
         add it to DeviceDescriptor::required_features where the adapter has it, or use a \
         kernel without it"
    )]
    MissingFeature {
        /// The kernel's name.
        kernel: String,
        /// The feature, as `wgpu::Features` names it.
        feature: &'static str,
    },
}

/// A read outside a tensor's shape, as a kernel reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutOfRange {
    /// The kernel that read.
    pub kernel: String,
    /// The tensor it read.
    pub tensor: String,
    /// The indices, one per dimension.
    pub index: Vec<i32>,
}
