//! A device tensor that does not fit the op it is given to.

use thiserror::Error;

/// Why a tensor does not fit where it was given.
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum TensorError {
    #[error("`{name}` holds {got} elements; this op needs {want}")]
    Dtype {
        name: String,
        got: &'static str,
        want: &'static str,
    },
    #[error("`{name}` has shape {got:?}; this op needs {rank} dims, {layout}")]
    Rank {
        name: String,
        got: Vec<u32>,
        rank: usize,
        layout: &'static str,
    },
    #[error("`{name}` has shape {got:?}; this op needs {want:?} ({layout})")]
    Shape {
        name: String,
        got: Vec<u32>,
        want: Vec<u32>,
        layout: &'static str,
    },
    #[error(
        "`{name}`: {bytes} bytes from byte offset {offset} run past the end of its buffer of \
         {size} bytes"
    )]
    OutOfBounds {
        name: String,
        offset: u64,
        bytes: u64,
        size: u64,
    },
    #[error(
        "`{name}`'s buffer lacks usage {missing} (it has {has}); create the buffer with \
         BufferUsages::{missing}"
    )]
    Usage {
        name: String,
        missing: &'static str,
        has: String,
    },
    #[error(
        "`{name}` starts at byte offset {offset}, which is not a multiple of the device's \
         min_storage_buffer_offset_alignment ({align}); place it at an aligned offset"
    )]
    Alignment {
        name: String,
        offset: u64,
        align: u64,
    },
    #[error(
        "`{name}` is {bytes} bytes, over the device's max_storage_buffer_binding_size \
         ({limit}); split the problem"
    )]
    TooLarge {
        name: String,
        bytes: u64,
        limit: u64,
    },
    #[error(
        "`{name}` of shape {shape:?} needs {bytes} bytes, over the device's max_buffer_size \
         ({limit}); use a smaller shape or split the problem"
    )]
    Buffer {
        name: String,
        shape: Vec<u32>,
        bytes: u128,
        limit: u64,
    },
    #[error(
        "`{name}` and `{other}` lie in one buffer, and this op writes `{name}`: a dispatch \
         cannot read and write one buffer through two bindings; give `{name}` a buffer of \
         its own"
    )]
    Aliased { name: String, other: String },
    #[error("`{name}`'s buffer belongs to another device: {message}")]
    Device { name: String, message: String },
    #[error("`{name}` has {got} values for a shape of {want} elements")]
    Data { name: String, got: usize, want: u64 },
}
