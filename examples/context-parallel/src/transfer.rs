//! Tensors carried between devices. wgpu devices share no memory, so bytes go through the
//! host: the source copies its tensors into a staging buffer it can map for reading, the
//! host copies that into a staging buffer the destination maps for writing, and the
//! destination copies it into its tensors. The staging buffers are made once per route;
//! the host's copy runs on several threads (one thread copies a few GB/s; the PCIe link
//! carries more).

use anyhow::{Result, anyhow};
use runtime::{Gpu, Tensor};

/// Tensors moved from one device to another, each source to its destination.
pub struct Route {
    pub from: usize,
    pub to: usize,
    items: Vec<(Tensor, Tensor, u64)>,
    read: wgpu::Buffer,
    write: wgpu::Buffer,
}

impl Route {
    /// A route for `items` (source on device `from`, destination of the same bytes on
    /// device `to`).
    pub fn new(gpus: &[&Gpu], from: usize, to: usize, items: Vec<(Tensor, Tensor)>) -> Route {
        let mut at = 0;
        let items: Vec<(Tensor, Tensor, u64)> = items
            .into_iter()
            .map(|(s, d)| {
                let placed = (s, d, at);
                at += placed.0.bytes().next_multiple_of(wgpu::MAP_ALIGNMENT);
                placed
            })
            .collect();
        let staging = |gpu: &Gpu, usage| {
            gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("transfer staging"),
                size: at.max(wgpu::MAP_ALIGNMENT),
                usage,
                mapped_at_creation: false,
            })
        };
        use wgpu::BufferUsages as U;
        Route {
            from,
            to,
            read: staging(gpus[from], U::MAP_READ | U::COPY_DST),
            write: staging(gpus[to], U::MAP_WRITE | U::COPY_SRC),
            items,
        }
    }

    /// Bytes the route carries.
    pub fn bytes(&self) -> u64 {
        self.items.iter().map(|(s, _, _)| s.bytes()).sum()
    }
}

fn wait(gpu: &Gpu) -> Result<()> {
    gpu.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| anyhow!("waiting for {}: {e}", gpu.describe()))?;
    Ok(())
}

/// Carries every route, all in step (the sources copy out together, the destinations copy
/// in together), and waits for the destinations; returns the bytes carried.
pub fn carry(gpus: &[&Gpu], routes: &[Route]) -> Result<u64> {
    for r in routes {
        let gpu = gpus[r.from];
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for (src, _, at) in &r.items {
            enc.copy_buffer_to_buffer(src.buffer(), src.offset(), &r.read, *at, src.bytes());
        }
        gpu.queue.submit([enc.finish()]);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    for r in routes {
        for (buffer, mode) in [
            (&r.read, wgpu::MapMode::Read),
            (&r.write, wgpu::MapMode::Write),
        ] {
            let tx = tx.clone();
            buffer.map_async(mode, .., move |res| {
                let _ = tx.send(res);
            });
        }
    }
    drop(tx);
    for r in routes {
        wait(gpus[r.from])?;
        wait(gpus[r.to])?;
    }
    for res in rx.iter() {
        res.map_err(|e| anyhow!("mapping a staging buffer: {e}"))?;
    }
    for r in routes {
        copy_mapped(r)?;
    }
    for r in routes {
        let gpu = gpus[r.to];
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for (_, dst, at) in &r.items {
            enc.copy_buffer_to_buffer(&r.write, *at, dst.buffer(), dst.offset(), dst.bytes());
        }
        gpu.queue.submit([enc.finish()]);
    }
    for r in routes {
        wait(gpus[r.to])?;
    }
    Ok(routes.iter().map(Route::bytes).sum())
}

/// The read staging's bytes into the write staging's; both unmapped after.
fn copy_mapped(r: &Route) -> Result<()> {
    {
        let src = r.read.get_mapped_range(..).map_err(|e| anyhow!("{e}"))?;
        let mut dst = r
            .write
            .get_mapped_range_mut(..)
            .map_err(|e| anyhow!("{e}"))?;
        dst.copy_from_slice(&src);
    }
    r.read.unmap();
    r.write.unmap();
    Ok(())
}
