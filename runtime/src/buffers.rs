//! Upload and readback.

use bytemuck::Pod;
use wgpu::util::DeviceExt;

use crate::error::Error;
use crate::gpu::Gpu;

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
        size: (len * size_of::<T>()).max(4) as u64,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

pub fn uniform(gpu: &Gpu, label: &str, bytes: &[u8]) -> wgpu::Buffer {
    gpu.device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: bytes,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        })
}

/// Copies the first `len` elements of `buffer` back to the host, waiting for the GPU.
pub fn read<T: Pod>(gpu: &Gpu, buffer: &wgpu::Buffer, len: usize) -> Result<Vec<T>, Error> {
    read_many(gpu, &[(buffer, len)]).map(|mut v| v.remove(0))
}

/// Reads several buffers with one submission and one wait.
pub fn read_many<T: Pod>(
    gpu: &Gpu,
    buffers: &[(&wgpu::Buffer, usize)],
) -> Result<Vec<Vec<T>>, Error> {
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    let staging: Vec<_> = buffers
        .iter()
        .map(|(buffer, len)| {
            let size = ((len * size_of::<T>()) as u64).max(4);
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
    let (tx, rx) = std::sync::mpsc::channel();
    for (i, s) in staging.iter().enumerate() {
        let tx = tx.clone();
        s.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send((i, r));
        });
    }
    drop(tx);
    gpu.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| Error::Readback(e.to_string()))?;
    for (_, result) in rx.iter() {
        result.map_err(|e| Error::Readback(e.to_string()))?;
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
