//! Upload and readback.

use attn_dsl::Scalar;
use bytemuck::Pod;
use half::{bf16, f16};
use wgpu::util::DeviceExt;

pub use super::readback::{read, read_as, read_many, read_range};
use crate::device::Gpu;

/// A storage buffer holding `data`. Empty data still gets 4 bytes: wgpu refuses
/// zero-sized bindings.
pub fn storage<T: Pod>(gpu: &Gpu, label: &str, data: &[T]) -> wgpu::Buffer {
    let bytes: &[u8] = bytemuck::cast_slice(data);
    let padded;
    let contents = if bytes.is_empty() {
        padded = [0u8; 4];
        &padded[..]
    } else {
        bytes
    };
    gpu.device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
        })
}

/// A zero-filled storage buffer of `len` elements of `T`, for outputs.
pub fn output<T: Pod>(gpu: &Gpu, label: &str, len: usize) -> wgpu::Buffer {
    gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: (len * size_of::<T>()).next_multiple_of(4).max(4) as u64,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

/// f32 host data rounded (to nearest even) to a binding's element type and back: what a
/// half-precision kernel reads when given `data`.
pub fn rounded(data: &[f32], scalar: Scalar) -> Vec<f32> {
    data.iter().map(|&x| round_to(x, scalar)).collect()
}

/// `x` rounded (to nearest even) to `scalar` and back.
pub fn round_to(x: f32, scalar: Scalar) -> f32 {
    match scalar {
        Scalar::F16 => f16::from_f32(x).to_f32(),
        Scalar::Bf16 => bf16::from_f32(x).to_f32(),
        Scalar::E4m3 | Scalar::E5m2 => crate::fp8::round(scalar.fp8().expect("fp8"), x),
        Scalar::F32 | Scalar::U32 => x,
    }
}

/// A storage buffer holding f32 host data as a binding of element `scalar` holds it: f32
/// as is, f16 and bf16 rounded to nearest even (bf16 two to a word, element 2i in the low
/// half: the little-endian layout of a `[bf16]`).
pub fn storage_as(gpu: &Gpu, label: &str, data: &[f32], scalar: Scalar) -> wgpu::Buffer {
    match scalar {
        Scalar::F16 => {
            // Whole vec4<f16> elements: a binding's last partial element would be cut off.
            let mut h: Vec<f16> = data.iter().map(|&x| f16::from_f32(x)).collect();
            h.resize(h.len().next_multiple_of(4), f16::ZERO);
            storage(gpu, label, &h)
        }
        Scalar::Bf16 => {
            let h: Vec<bf16> = data.iter().map(|&x| bf16::from_f32(x)).collect();
            storage(gpu, label, &h)
        }
        Scalar::E4m3 | Scalar::E5m2 => {
            let f = scalar.fp8().expect("an fp8 scalar");
            let mut b: Vec<u8> = data.iter().map(|&x| crate::fp8::to_bits(f, x)).collect();
            b.resize(b.len().next_multiple_of(4), 0);
            storage(gpu, label, &b)
        }
        Scalar::F32 | Scalar::U32 => storage(gpu, label, data),
    }
}

/// A zero-filled output of `len` elements of `scalar`.
pub fn output_as(gpu: &Gpu, label: &str, len: usize, scalar: Scalar) -> wgpu::Buffer {
    match scalar {
        Scalar::F16 => output::<u16>(gpu, label, len.next_multiple_of(4)),
        Scalar::Bf16 => output::<u16>(gpu, label, len),
        Scalar::E4m3 | Scalar::E5m2 => output::<u32>(gpu, label, len.div_ceil(4)),
        Scalar::F32 | Scalar::U32 => output::<f32>(gpu, label, len),
    }
}

/// A uniform buffer holding `bytes`, writable later through the queue.
pub fn uniform(gpu: &Gpu, label: &str, bytes: &[u8]) -> wgpu::Buffer {
    gpu.device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: bytes,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        })
}
