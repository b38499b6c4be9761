//! Upload and readback.

use attn_dsl::Scalar;
use bytemuck::Pod;
use half::{bf16, f16};
use wgpu::util::DeviceExt;

use crate::device::Gpu;
use crate::error::Error;

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
        Scalar::F32 | Scalar::U32 => storage(gpu, label, data),
    }
}

/// A zero-filled output of `len` elements of `scalar`.
pub fn output_as(gpu: &Gpu, label: &str, len: usize, scalar: Scalar) -> wgpu::Buffer {
    match scalar {
        Scalar::F16 => output::<u16>(gpu, label, len.next_multiple_of(4)),
        Scalar::Bf16 => output::<u16>(gpu, label, len),
        Scalar::F32 | Scalar::U32 => output::<f32>(gpu, label, len),
    }
}

/// Reads `len` elements of `scalar` back, widened to f32.
pub async fn read_as(
    gpu: &Gpu,
    buffer: &wgpu::Buffer,
    len: usize,
    scalar: Scalar,
) -> Result<Vec<f32>, Error> {
    let widen = |bits: Vec<u16>, f: fn(u16) -> f32| bits.into_iter().map(f).collect();
    match scalar {
        Scalar::F16 => Ok(widen(read::<u16>(gpu, buffer, len).await?, |b| {
            f16::from_bits(b).to_f32()
        })),
        Scalar::Bf16 => Ok(widen(read::<u16>(gpu, buffer, len).await?, |b| {
            bf16::from_bits(b).to_f32()
        })),
        Scalar::F32 | Scalar::U32 => read::<f32>(gpu, buffer, len).await,
    }
}

pub fn uniform(gpu: &Gpu, label: &str, bytes: &[u8]) -> wgpu::Buffer {
    gpu.device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: bytes,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        })
}

/// Copies the first `len` elements of `buffer` back to the host once the GPU has run
/// everything submitted so far.
pub async fn read<T: Pod>(gpu: &Gpu, buffer: &wgpu::Buffer, len: usize) -> Result<Vec<T>, Error> {
    read_many(gpu, &[(buffer, len)])
        .await
        .map(|mut v| v.remove(0))
}

/// `size` bytes of `buffer` from byte `offset` (both multiples of 4), after the GPU has
/// run everything submitted so far.
pub async fn read_range(
    gpu: &Gpu,
    buffer: &wgpu::Buffer,
    offset: u64,
    size: u64,
) -> Result<Vec<u8>, Error> {
    if !buffer.usage().contains(wgpu::BufferUsages::COPY_SRC) {
        return Err(crate::tensor::TensorError::Usage {
            name: "the tensor read back".into(),
            missing: "COPY_SRC",
            has: format!("{:?}", buffer.usage()),
        }
        .into());
    }
    let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("readback"),
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    encoder.copy_buffer_to_buffer(buffer, offset, &staging, 0, size);
    gpu.queue.submit([encoder.finish()]);
    map_read(gpu, &staging).await
}

/// The contents of a MAP_READ buffer once the GPU has written it.
async fn map_read(gpu: &Gpu, staging: &wgpu::Buffer) -> Result<Vec<u8>, Error> {
    let (tx, rx) = futures_channel::oneshot::channel();
    staging.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = tx.send(r);
    });
    gpu.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| Error::Readback(e.to_string()))?;
    rx.await
        .map_err(|_| Error::Readback("the device dropped a buffer map".into()))?
        .map_err(|e| Error::Readback(e.to_string()))?;
    let view = staging
        .get_mapped_range(..)
        .map_err(|e| Error::Readback(e.to_string()))?;
    let out = view.to_vec();
    drop(view);
    staging.unmap();
    Ok(out)
}

/// Reads several buffers with one submission and one wait. Natively it blocks in `poll`
/// until the maps are done (the futures are then ready); in a browser `poll` does nothing
/// and the maps resolve from the event loop while this future waits.
pub async fn read_many<T: Pod>(
    gpu: &Gpu,
    buffers: &[(&wgpu::Buffer, usize)],
) -> Result<Vec<Vec<T>>, Error> {
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    let staging: Vec<_> = buffers
        .iter()
        .map(|(buffer, len)| {
            let size = ((len * size_of::<T>()).next_multiple_of(4) as u64).max(4);
            let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            encoder.copy_buffer_to_buffer(buffer, 0, &staging, 0, size);
            staging
        })
        .collect();
    gpu.queue.submit([encoder.finish()]);
    let mapped: Vec<_> = staging
        .iter()
        .map(|s| {
            let (tx, rx) = futures_channel::oneshot::channel();
            s.map_async(wgpu::MapMode::Read, .., move |r| {
                let _ = tx.send(r);
            });
            rx
        })
        .collect();
    gpu.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| Error::Readback(e.to_string()))?;
    for rx in mapped {
        rx.await
            .map_err(|_| Error::Readback("the device dropped a buffer map".into()))?
            .map_err(|e| Error::Readback(e.to_string()))?;
    }
    staging
        .iter()
        .zip(buffers)
        .map(|(s, (_, len))| {
            let view = s
                .get_mapped_range(..)
                .map_err(|e| Error::Readback(e.to_string()))?;
            let out = bytemuck::cast_slice::<u8, T>(&view)[..*len].to_vec();
            drop(view);
            s.unmap();
            Ok(out)
        })
        .collect()
}
