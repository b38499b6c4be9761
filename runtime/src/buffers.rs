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
#[cfg(not(target_arch = "wasm32"))]
pub fn read<T: Pod>(gpu: &Gpu, buffer: &wgpu::Buffer, len: usize) -> Result<Vec<T>, Error> {
    read_many(gpu, &[(buffer, len)]).map(|mut v| v.remove(0))
}

/// Reads several buffers with one submission and one wait.
#[cfg(not(target_arch = "wasm32"))]
pub fn read_many<T: Pod>(
    gpu: &Gpu,
    buffers: &[(&wgpu::Buffer, usize)],
) -> Result<Vec<Vec<T>>, Error> {
    pollster::block_on(read_many_async(gpu, buffers))
}

/// [`read`] for an async caller (the browser, where the GPU's answer is a promise).
pub async fn read_async<T: Pod>(
    gpu: &Gpu,
    buffer: &wgpu::Buffer,
    len: usize,
) -> Result<Vec<T>, Error> {
    read_many_async(gpu, &[(buffer, len)])
        .await
        .map(|mut v| v.remove(0))
}

/// [`read_many`] for an async caller. Natively it blocks in `poll` until the maps are
/// done (the futures are then ready); in a browser `poll` does nothing and the maps
/// resolve from the event loop while this future waits.
pub async fn read_many_async<T: Pod>(
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
