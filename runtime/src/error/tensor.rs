//! A device tensor that does not fit the op it is given to.

use thiserror::Error;

/// Why a tensor does not fit where it was given.
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum TensorError {
    /// A tensor whose element type is not the one the op binds.
    #[error("`{name}` holds {got} elements; this op needs {want}")]
    Dtype {
        /// The tensor's name in the op.
        name: String,
        /// Its element type.
        got: &'static str,
        /// The element type the op needs.
        want: &'static str,
    },
    /// A tensor with another number of dimensions than the op's layout.
    #[error("`{name}` has shape {got:?}; this op needs {rank} dims, {layout}")]
    Rank {
        /// The tensor's name in the op.
        name: String,
        /// Its shape.
        got: Vec<u32>,
        /// Dimensions the op needs.
        rank: usize,
        /// The op's layout of it, axis by axis.
        layout: &'static str,
    },
    /// A tensor whose shape is not the one the problem's dims give it.
    #[error("`{name}` has shape {got:?}; this op needs {want:?} ({layout})")]
    Shape {
        /// The tensor's name in the op.
        name: String,
        /// Its shape.
        got: Vec<u32>,
        /// The shape the dims give it.
        want: Vec<u32>,
        /// The op's layout of it, axis by axis.
        layout: &'static str,
    },
    /// A tensor that runs past the end of its buffer.
    #[error(
        "`{name}`: {bytes} bytes from byte offset {offset} run past the end of its buffer of \
         {size} bytes"
    )]
    OutOfBounds {
        /// The tensor's name in the op.
        name: String,
        /// Where it starts in its buffer, in bytes.
        offset: u64,
        /// Its size in bytes.
        bytes: u64,
        /// The buffer's size in bytes.
        size: u64,
    },
    /// A tensor whose buffer lacks a usage the op needs of it.
    #[error(
        "`{name}`'s buffer lacks usage {missing} (it has {has}); create the buffer with \
         BufferUsages::{missing}"
    )]
    Usage {
        /// The tensor's name in the op.
        name: String,
        /// The usage needed, as `wgpu::BufferUsages` names it.
        missing: &'static str,
        /// The usages the buffer has.
        has: String,
    },
    /// A tensor at an offset the device cannot bind a storage buffer at.
    #[error(
        "`{name}` starts at byte offset {offset}, which is not a multiple of the device's \
         min_storage_buffer_offset_alignment ({align}); place it at an aligned offset"
    )]
    Alignment {
        /// The tensor's name in the op.
        name: String,
        /// Where it starts in its buffer, in bytes.
        offset: u64,
        /// The device's `min_storage_buffer_offset_alignment`.
        align: u64,
    },
    /// A tensor larger than one storage binding of the device.
    #[error(
        "`{name}` is {bytes} bytes, over the device's max_storage_buffer_binding_size \
         ({limit}); split the problem"
    )]
    TooLarge {
        /// The tensor's name in the op.
        name: String,
        /// Its size in bytes.
        bytes: u64,
        /// The device's `max_storage_buffer_binding_size`.
        limit: u64,
    },
    /// A tensor larger than the device's largest buffer.
    #[error(
        "`{name}` of shape {shape:?} needs {bytes} bytes, over the device's max_buffer_size \
         ({limit}); use a smaller shape or split the problem"
    )]
    Buffer {
        /// The tensor's name.
        name: String,
        /// The shape asked for.
        shape: Vec<u32>,
        /// The bytes that shape needs.
        bytes: u128,
        /// The device's `max_buffer_size`.
        limit: u64,
    },
    /// A written tensor that shares its buffer with another binding of the dispatch.
    #[error(
        "`{name}` and `{other}` lie in one buffer, and this op writes `{name}`: a dispatch \
         cannot read and write one buffer through two bindings; give `{name}` a buffer of \
         its own"
    )]
    Aliased {
        /// The written tensor's name in the op.
        name: String,
        /// The name of the tensor in the same buffer.
        other: String,
    },
    /// A tensor whose buffer belongs to another device than the op's.
    #[error("`{name}`'s buffer belongs to another device: {message}")]
    Device {
        /// The tensor's name in the op.
        name: String,
        /// What wgpu or the check reported.
        message: String,
    },
    /// Tensors whose buffers the device refused to bind, after every check the runtime
    /// makes passed: a buffer the caller destroyed, for one.
    #[error(
        "the device refused to bind the tensors of kernel `{kernel}`: {message}; a buffer that \
         was destroyed cannot be bound, give the op live tensors"
    )]
    Unbindable {
        /// The kernel whose bind group was refused.
        kernel: String,
        /// What wgpu reported.
        message: String,
    },
    /// Host values or a tensor that the op needs and whose count differs from the shape's.
    #[error("`{name}` has {got} values for a shape of {want} elements")]
    Data {
        /// The tensor's name in the op.
        name: String,
        /// Values given (0 where the tensor is missing).
        got: usize,
        /// Elements the shape holds.
        want: u64,
    },
}
