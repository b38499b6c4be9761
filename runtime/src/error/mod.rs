//! Every refusal of the runtime, in the layer below all others but the kernels: the
//! device's, the tensors', the KV cache's and the tuning table's errors are defined here and
//! re-exported where they are raised, so that every layer, the device's included, returns
//! the one [`Error`] without importing a layer above it.

mod cache;
mod device;
mod tensor;
mod tuning;

use thiserror::Error;

pub use cache::CacheError;
pub use device::{DeviceError, OutOfRange};
pub use tensor::TensorError;
pub use tuning::TuningError;

/// Everything the runtime can refuse or fail at. Bad input is always an [`InputError`],
/// found before any GPU work is submitted.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// Input that does not fit the kernel or the adapter, found before any GPU work.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The device refused or lacks something: no adapter, a limit, a lost device.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A kernel that needs a feature the adapter does not have.
    #[error(
        "kernel `{kernel}` needs a feature that {adapter} lacks (SUBGROUP for `subgroups = true`, \
         SHADER_FLOAT32_ATOMIC for an f32 scatter, SHADER_F16 for `dtype: f16`, \
         EXPERIMENTAL_COOPERATIVE_MATRIX with f16 16x16x16 products and subgroups of 32 for \
         `matrix = coop16`); use a configuration without it (bf16 needs no feature)"
    )]
    Feature {
        /// The kernel's name.
        kernel: String,
        /// The adapter, as `Gpu::describe` gives it.
        adapter: String,
    },
    /// A kernel that could not be compiled or turned into a pipeline.
    #[error("creating the pipeline of kernel `{kernel}` failed: {message}")]
    Pipeline {
        /// The kernel's name.
        kernel: String,
        /// What the compiler or wgpu reported.
        message: String,
    },
    /// A kernel whose ABI names a binding the op does not provide.
    #[error(
        "kernel `{kernel}` has a binding `{binding}` that this operation does not provide; its ABI does not fit the op"
    )]
    Binding {
        /// The kernel's name.
        kernel: String,
        /// The binding the op lacks.
        binding: String,
    },
    /// Mapping a buffer to read results back failed; the message is wgpu's.
    #[error("reading results back from the GPU failed: {0}")]
    Readback(String),
    /// A tuning table that cannot be read or picks what `check` does not cover.
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
    /// A kernel's user-written modifiers that cannot run as given (their tensors, their gradients).
    #[error("kernel `{kernel}`: {message}")]
    Flex {
        /// The kernel's name.
        kernel: String,
        /// What is wrong and what to change.
        message: String,
    },
    /// A kernel of another op than the one it was given to.
    #[error(
        "kernel `{kernel}` runs op {actual}, not {wanted}; pass a kernel built with `op: {wanted}`"
    )]
    WrongOp {
        /// The kernel's name.
        kernel: String,
        /// The op it runs.
        actual: &'static str,
        /// The op it was given to.
        wanted: &'static str,
    },
    /// A dimension of 0.
    #[error("{name} is 0; every dimension must be at least 1")]
    ZeroDim {
        /// The dimension's name.
        name: &'static str,
    },
    /// A head_dim other than the kernel's.
    #[error(
        "head_dim {given} does not match kernel `{kernel}`, which is specialized for head_dim {kernel_head_dim}; use a kernel built with `head_dim: {given}`"
    )]
    HeadDim {
        /// The kernel's name.
        kernel: String,
        /// The head_dim it was built for.
        kernel_head_dim: u32,
        /// The input's head_dim.
        given: u32,
    },
    /// V rows of another width than the kernel's head_dim_v.
    #[error(
        "V's rows are {given} wide, but kernel `{kernel}` is specialized for head_dim_v {kernel_head_dim_v}; use a kernel built with `head_dim_v: {given}` (or a V as wide as that)"
    )]
    HeadDimV {
        /// The kernel's name.
        kernel: String,
        /// The width of V rows it was built for.
        kernel_head_dim_v: u32,
        /// The width of the input's V rows.
        given: u32,
    },
    /// Query heads that the KV heads do not divide evenly.
    #[error(
        "n_heads {n_heads} is not a multiple of n_kv_heads {n_kv_heads}; GQA needs each KV head to serve the same number of query heads"
    )]
    HeadsNotDivisible {
        /// Query heads.
        n_heads: u32,
        /// K and V heads.
        n_kv_heads: u32,
    },
    /// Query heads per KV head other than the ratio the kernel was built for.
    #[error(
        "kernel `{kernel}` is specialized for {ratio} query heads per KV head, but n_heads / n_kv_heads is {given}"
    )]
    GqaRatio {
        /// The kernel's name.
        kernel: String,
        /// Query heads per KV head it was built for.
        ratio: u32,
        /// The input's n_heads / n_kv_heads.
        given: u32,
    },
    /// A host slice whose length is not the one the dims give it.
    #[error("`{name}` has {got} elements but the dims need {expected} ({layout})")]
    Length {
        /// The slice's name.
        name: &'static str,
        /// Elements the dims give it.
        expected: u64,
        /// Elements it has.
        got: u64,
        /// Its layout, the product that gives `expected`.
        layout: String,
    },
    /// Document ids given to a kernel built without the document mask.
    #[error(
        "kernel `{kernel}` was built without the document mask, so it cannot take `seg`; use a kernel with `masks: [.., document]`"
    )]
    SegWithoutDocumentMask {
        /// The kernel's name.
        kernel: String,
    },
    /// A document id out of order or out of range.
    #[error("seg[{index}] = {value} is invalid: {reason}")]
    Seg {
        /// Its index in `seg`, over the whole batch.
        index: usize,
        /// The id.
        value: u32,
        /// What the id breaks.
        reason: &'static str,
    },
    /// A cache_len past the rows the KV cache holds.
    #[error("cache_len {cache_len} is more than the {capacity} rows the KV cache holds")]
    CacheTooShort {
        /// Keys asked for.
        cache_len: u32,
        /// Rows the cache holds.
        capacity: u64,
    },
    /// A split-K slice length the split kernel cannot run.
    #[error(
        "slice_len {slice_len} for split-K decode must be a multiple of the kernel's key tile \
         {key_tile}, from {key_tile} to {max}"
    )]
    SliceLen {
        /// Keys per slice asked for.
        slice_len: u32,
        /// The split kernel's key tile, which slice_len must be a multiple of.
        key_tile: u32,
        /// The longest slice allowed.
        max: u32,
    },
    /// A cache of another layout or element type than the kernel reads.
    #[error("kernel `{kernel}` reads a {reads} KV cache, and this decode gave a {given} one")]
    CacheLayout {
        /// The kernel's name.
        kernel: String,
        /// What it reads: `paged` or `contiguous`, `fp8` or not.
        reads: &'static str,
        /// What the decode gave, in the same words.
        given: &'static str,
    },
    /// A paged cache or block table that does not fit the dims; the message says which.
    #[error("paged KV cache: {0}")]
    Pages(String),
    /// Query rows per sequence that the call cannot take; the message says why.
    #[error("query rows: {0}")]
    QueryRows(String),
    /// A user-written modifier read outside a tensor's declared shape, reported by a
    /// kernel built with `Gpu::report_modifier_reads` (the read gave 0).
    #[error(
        "kernel `{}` read `{}` at {:?}, outside its declared shape (the read gave 0); \
         bound the index in the modifier or declare the tensor larger",
        .0.kernel, .0.tensor, .0.index
    )]
    ModifierRead(OutOfRange),
    /// A softmax scale that is not finite.
    #[error("scale {0} is not a finite number")]
    Scale(f32),
    /// A Linear's output parts that do not cut its columns.
    #[error(
        "a Linear's parts {parts:?} must be widths of at least 1 that add up to its out \
         ({out}), any unused ones 0 at the end"
    )]
    LinearParts {
        /// The parts asked for.
        parts: [u32; 3],
        /// The Linear's output width.
        out: u32,
    },
    /// A combination of input and op that does not run.
    #[error("{what} needs {needs}")]
    Unsupported {
        /// What was asked for.
        what: &'static str,
        /// What it needs.
        needs: &'static str,
    },
    /// A deterministic backward asked of a schedule that adds by atomics.
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
        /// The schedule asked for.
        schedule: String,
        /// The kernel that adds by atomics.
        kernel: String,
        /// The output it adds into.
        output: String,
    },
    /// A backward schedule that the device or the added kernels do not run.
    #[error(
        "backward schedule `{schedule}` does not run here for head_dim {head_dim}; this \
         device runs: {available}"
    )]
    Schedule {
        /// The schedule asked for.
        schedule: String,
        /// The problem's head_dim.
        head_dim: u32,
        /// The schedules that do run here.
        available: String,
    },
    /// A modifier value the kernel has no mask for, or a mask with no value given.
    #[error(
        "kernel `{kernel}` was built {}`{word}` in its masks, but the input {}; build the \
         kernel with the masks the input needs",
        if *built { "with " } else { "without " },
        if *built { "gives no value for it" } else { "gives one" }
    )]
    Modifier {
        /// The kernel's name.
        kernel: String,
        /// The mask's word in `masks: [..]`.
        word: &'static str,
        /// Whether the kernel was built with that mask.
        built: bool,
    },
    /// A bias of the other layout than the kernel's: per head or shared by the heads.
    #[error(
        "kernel `{kernel}` takes the other bias layout: `bias` is [batch, n_heads, seq, seq], \
         `shared_bias` [batch, 1, seq, seq]"
    )]
    BiasHeads {
        /// The kernel's name.
        kernel: String,
    },
    /// A value out of its range (a probability, epsilon, a window).
    #[error("{what} is {value}; it must be {needs}")]
    BadValue {
        /// What the value is.
        what: &'static str,
        /// The value given.
        value: f64,
        /// The range it must be in.
        needs: &'static str,
    },
    /// A LayerNorm + Linear input of other widths than its kernels were built for.
    #[error(
        "{what} {given} does not match `{kernel}`, whose kernels were built for {what} {built}; \
         build a LayerNormLinear for {given}"
    )]
    RowLayer {
        /// The kernels' name.
        kernel: String,
        /// The width: `hidden` or `out`.
        what: &'static str,
        /// The width the kernels were built for.
        built: u32,
        /// The input's width.
        given: u32,
    },
    /// A device tensor that does not fit the op.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// A change the KV cache refused.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// A size over a limit of the adapter or of the kernels' indexing.
    #[error("{what} is {value}, over the adapter's limit of {limit}")]
    OverLimit {
        /// What was counted.
        what: &'static str,
        /// Its count.
        value: u64,
        /// The most allowed.
        limit: u64,
    },
}
