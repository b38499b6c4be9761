//! Every refusal of the runtime, one layer above the device: the tensors', the KV cache's
//! and the tuning table's errors are defined here and re-exported where they are raised,
//! so that every layer can return them without importing a layer above it.

mod cache;
mod tensor;
mod tuning;

use thiserror::Error;

pub use cache::CacheError;
pub use tensor::TensorError;
pub use tuning::TuningError;

/// Everything the runtime can refuse or fail at. Bad input is always an [`InputError`],
/// found before any GPU work is submitted.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Input(#[from] InputError),
    #[error(transparent)]
    Device(#[from] crate::device::DeviceError),
    #[error(
        "kernel `{kernel}` needs a feature that {adapter} lacks (SUBGROUP for `subgroups = true`, \
         SHADER_FLOAT32_ATOMIC for an f32 scatter, SHADER_F16 for `dtype: f16`, \
         EXPERIMENTAL_COOPERATIVE_MATRIX with f16 16x16x16 products and subgroups of 32 for \
         `matrix = coop16`); use a configuration without it (bf16 needs no feature)"
    )]
    Feature { kernel: String, adapter: String },
    #[error("creating the pipeline of kernel `{kernel}` failed: {message}")]
    Pipeline { kernel: String, message: String },
    #[error(
        "kernel `{kernel}` has a binding `{binding}` that this operation does not provide; its ABI does not fit the op"
    )]
    Binding { kernel: String, binding: String },
    #[error("reading results back from the GPU failed: {0}")]
    Readback(String),
    #[error(transparent)]
    Tuning(#[from] TuningError),
}

impl From<CacheError> for Error {
    fn from(e: CacheError) -> Error {
        Error::Input(InputError::Cache(e))
    }
}

impl From<TensorError> for Error {
    fn from(e: TensorError) -> Error {
        Error::Input(InputError::Tensor(e))
    }
}

/// Input that does not fit the kernel or the adapter.
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum InputError {
    #[error("kernel `{kernel}`: {message}")]
    Flex { kernel: String, message: String },
    #[error(
        "kernel `{kernel}` runs op {actual}, not {wanted}; pass a kernel built with `op: {wanted}`"
    )]
    WrongOp {
        kernel: String,
        actual: &'static str,
        wanted: &'static str,
    },
    #[error("{name} is 0; every dimension must be at least 1")]
    ZeroDim { name: &'static str },
    #[error(
        "head_dim {given} does not match kernel `{kernel}`, which is specialized for head_dim {kernel_head_dim}; use a kernel built with `head_dim: {given}`"
    )]
    HeadDim {
        kernel: String,
        kernel_head_dim: u32,
        given: u32,
    },
    #[error(
        "V's rows are {given} wide, but kernel `{kernel}` is specialized for head_dim_v {kernel_head_dim_v}; use a kernel built with `head_dim_v: {given}` (or a V as wide as that)"
    )]
    HeadDimV {
        kernel: String,
        kernel_head_dim_v: u32,
        given: u32,
    },
    #[error(
        "n_heads {n_heads} is not a multiple of n_kv_heads {n_kv_heads}; GQA needs each KV head to serve the same number of query heads"
    )]
    HeadsNotDivisible { n_heads: u32, n_kv_heads: u32 },
    #[error(
        "kernel `{kernel}` is specialized for {ratio} query heads per KV head, but n_heads / n_kv_heads is {given}"
    )]
    GqaRatio {
        kernel: String,
        ratio: u32,
        given: u32,
    },
    #[error("`{name}` has {got} elements but the dims need {expected} ({layout})")]
    Length {
        name: &'static str,
        expected: u64,
        got: u64,
        layout: String,
    },
    #[error(
        "kernel `{kernel}` was built without the document mask, so it cannot take `seg`; use a kernel with `masks: [.., document]`"
    )]
    SegWithoutDocumentMask { kernel: String },
    #[error("seg[{index}] = {value} is invalid: {reason}")]
    Seg {
        index: usize,
        value: u32,
        reason: &'static str,
    },
    #[error("cache_len {cache_len} is more than the {capacity} rows the KV cache holds")]
    CacheTooShort { cache_len: u32, capacity: u64 },
    #[error(
        "slice_len {slice_len} for split-K decode must be a multiple of the kernel's key tile \
         {key_tile}, from {key_tile} to {max}"
    )]
    SliceLen {
        slice_len: u32,
        key_tile: u32,
        max: u32,
    },
    #[error("kernel `{kernel}` reads a {reads} KV cache, and this decode gave a {given} one")]
    CacheLayout {
        kernel: String,
        reads: &'static str,
        given: &'static str,
    },
    #[error("paged KV cache: {0}")]
    Pages(String),
    #[error("query rows: {0}")]
    QueryRows(String),
    #[error("scale {0} is not a finite number")]
    Scale(f32),
    #[error("{what} needs {needs}")]
    Unsupported {
        what: &'static str,
        needs: &'static str,
    },
    #[error(
        "backward schedule `{schedule}` is not deterministic: kernel `{kernel}` adds \
         `{output}` by atomics{}",
        if output == "dbias" {
            "; with a bias shared by the heads every schedule does: pass a bias per head \
             (`bias`) and sum its gradient over the heads, or turn `deterministic` off"
        } else if !matches!(output.as_str(), "dq" | "dk" | "dv" | "dkv") {
            "; every schedule adds the gradient of a modifier tensor declared `grad` by \
             (compensated) atomics: drop `grad`, or turn `deterministic` off"
        } else {
            "; leave the schedule to the planner, which picks one that owns its outputs"
        }
    )]
    NotDeterministic {
        schedule: String,
        kernel: String,
        output: String,
    },
    #[error(
        "backward schedule `{schedule}` does not run here for head_dim {head_dim}; this \
         device runs: {available}"
    )]
    Schedule {
        schedule: String,
        head_dim: u32,
        available: String,
    },
    #[error(
        "kernel `{kernel}` was built {}`{word}` in its masks, but the input {}; build the \
         kernel with the masks the input needs",
        if *built { "with " } else { "without " },
        if *built { "gives no value for it" } else { "gives one" }
    )]
    Modifier {
        kernel: String,
        word: &'static str,
        built: bool,
    },
    #[error(
        "kernel `{kernel}` takes the other bias layout: `bias` is [batch, n_heads, seq, seq], \
         `shared_bias` [batch, 1, seq, seq]"
    )]
    BiasHeads { kernel: String },
    #[error("{what} is {value}; it must be {needs}")]
    BadValue {
        what: &'static str,
        value: f64,
        needs: &'static str,
    },
    #[error(
        "{what} {given} does not match `{kernel}`, whose kernels were built for {what} {built}; \
         build a LayerNormLinear for {given}"
    )]
    RowLayer {
        kernel: String,
        what: &'static str,
        built: u32,
        given: u32,
    },
    #[error(transparent)]
    Tensor(#[from] TensorError),
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("{what} is {value}, over the adapter's limit of {limit}")]
    OverLimit {
        what: &'static str,
        value: u64,
        limit: u64,
    },
}
