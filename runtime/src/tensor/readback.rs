//! Reading device buffers back to the host: the one place the runtime waits for the GPU's
//! results (natively it blocks in `poll`; in a browser the map resolves from the event
//! loop while the future waits).

use attn_dsl::Scalar;
use bytemuck::Pod;
use half::{bf16, f16};

use crate::device::Gpu;
use crate::error::{Error, TensorError};

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
        Scalar::E4m3 | Scalar::E5m2 => {
            let f = scalar.fp8().expect("an fp8 scalar");
            let words = read::<u32>(gpu, buffer, len.div_ceil(4)).await?;
            let bytes: &[u8] = bytemuck::cast_slice(&words);
            Ok(bytes[..len]
                .iter()
                .map(|&b| crate::fp8::to_f32(f, b))
                .collect())
        }
    }
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
    readable(buffer, offset, size)?;
    if !offset.is_multiple_of(4) || !size.is_multiple_of(4) {
        return Err(Error::Readback(format!(
            "a range of {size} bytes from byte {offset}: copies take both in multiples of 4"
        )));
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

/// `bytes` from `offset` of `buffer` within it, and the buffer copyable: wgpu panics on a
/// copy that is not.
fn readable(buffer: &wgpu::Buffer, offset: u64, bytes: u64) -> Result<(), TensorError> {
    if !buffer.usage().contains(wgpu::BufferUsages::COPY_SRC) {
        return Err(TensorError::Usage {
            name: "the tensor read back".into(),
            missing: "COPY_SRC",
            has: format!("{:?}", buffer.usage()),
        });
    }
    let size = buffer.size();
    if offset.checked_add(bytes).is_none_or(|end| end > size) {
        return Err(TensorError::OutOfBounds {
            name: "the range read back".into(),
            offset,
            bytes,
            size,
        });
    }
    Ok(())
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
    for (buffer, len) in buffers {
        let bytes = (*len as u64).saturating_mul(size_of::<T>() as u64);
        readable(buffer, 0, bytes)?;
    }
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    let staging: Vec<_> = buffers
        .iter()
        .map(|(buffer, len)| {
            let bytes = (len * size_of::<T>()) as u64;
            // Whole words copied (as far as the buffer has them), and a staging buffer of
            // whole elements of T.
            let copied = bytes.next_multiple_of(4).min(buffer.size() & !3);
            let size = bytes.next_multiple_of(8).max(8);
            let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            encoder.copy_buffer_to_buffer(buffer, 0, &staging, 0, copied);
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

impl Gpu {
    /// With [`Gpu::report_modifier_reads`]: after everything submitted so far has run, the
    /// first read outside a tensor's declared shape among the kernels' user-written
    /// modifiers since the last call, as [`crate::InputError::ModifierRead`]; the report is
    /// cleared. `Ok` where no read was out of range, or where the switch is off.
    pub async fn modifier_reads(&self) -> Result<(), Error> {
        let Some(report) = self.read_report() else {
            return Ok(());
        };
        let bytes = 4 * crate::device::REPORT_WORDS;
        let words = read_range(self, &report.buffer, 0, bytes).await?;
        self.queue
            .write_buffer(&report.buffer, 0, &vec![0u8; bytes as usize]);
        let words: Vec<u32> = bytemuck::cast_slice(&words).to_vec();
        match report.decode(&words) {
            Some(read) => Err(crate::error::InputError::ModifierRead(read).into()),
            None => Ok(()),
        }
    }
}
