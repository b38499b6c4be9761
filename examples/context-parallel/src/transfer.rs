//! Tensors carried between devices. wgpu devices share no memory, so bytes go through the
//! host: the source copies its tensors into a staging buffer it maps for reading, the host
//! copies that into a staging buffer the destination keeps mapped for writing, and the
//! destination copies it into its tensors. The staging buffers are made once per route, so
//! a step allocates nothing; a route's copy out is recorded where its source's tensors are
//! final, so that the host carries one route while the source computes the next.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Result, anyhow};
use runtime::{Gpu, Tensor};

/// Tensors moved from one device to another, each source to its destination.
pub struct Route {
    pub from: usize,
    pub to: usize,
    items: Vec<(Tensor, Tensor, u64)>,
    read: wgpu::Buffer,
    write: wgpu::Buffer,
    /// Whether `write` is mapped (it is mapped again as soon as its bytes are copied in).
    writable: Arc<AtomicBool>,
    /// The destination's submission that last read `write`.
    landed: Option<wgpu::SubmissionIndex>,
}

/// Waits for `gpu`'s submission `index` (every submission: `None`) and its callbacks.
pub(crate) fn wait(gpu: &Gpu, index: Option<wgpu::SubmissionIndex>) -> Result<()> {
    let poll = wgpu::PollType::Wait {
        submission_index: index,
        timeout: None,
    };
    gpu.device
        .poll(poll)
        .map_err(|e| anyhow!("waiting for {}: {e}", gpu.describe()))?;
    Ok(())
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
        let staging = |gpu: &Gpu, usage, mapped_at_creation| {
            gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("transfer staging"),
                size: at.max(wgpu::MAP_ALIGNMENT),
                usage,
                mapped_at_creation,
            })
        };
        use wgpu::BufferUsages as U;
        Route {
            from,
            to,
            read: staging(gpus[from], U::MAP_READ | U::COPY_DST, false),
            write: staging(gpus[to], U::MAP_WRITE | U::COPY_SRC, true),
            items,
            writable: Arc::new(AtomicBool::new(true)),
            landed: None,
        }
    }

    /// Bytes the route carries.
    pub fn bytes(&self) -> u64 {
        self.items.iter().map(|(s, _, _)| s.bytes()).sum()
    }

    /// Records the copy of the sources into the read staging, on the source's encoder,
    /// after what makes them.
    pub fn record_out(&self, enc: &mut wgpu::CommandEncoder) {
        for (src, _, at) in &self.items {
            enc.copy_buffer_to_buffer(src.buffer(), src.offset(), &self.read, *at, src.bytes());
        }
    }

    /// Once the source's submission `out` (which holds [`Route::record_out`]) has run:
    /// the bytes through the host into the destination's tensors (submitted, not waited
    /// for).
    pub fn land(&mut self, gpus: &[&Gpu], out: wgpu::SubmissionIndex) -> Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.read.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        wait(gpus[self.from], Some(out))?;
        rx.recv()
            .map_err(|_| anyhow!("a staging buffer's map was dropped"))?
            .map_err(|e| anyhow!("mapping a staging buffer: {e}"))?;
        if !self.writable.load(Ordering::Acquire) {
            wait(gpus[self.to], self.landed.clone())?;
            if !self.writable.load(Ordering::Acquire) {
                return Err(anyhow!(
                    "mapping a staging buffer of {} for writing failed",
                    gpus[self.to].describe()
                ));
            }
        }
        {
            let src = self.read.get_mapped_range(..).map_err(|e| anyhow!("{e}"))?;
            let mut dst = self
                .write
                .get_mapped_range_mut(..)
                .map_err(|e| anyhow!("{e}"))?;
            dst.copy_from_slice(&src);
        }
        self.read.unmap();
        self.write.unmap();
        self.writable.store(false, Ordering::Release);
        let gpu = gpus[self.to];
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for (_, dst, at) in &self.items {
            enc.copy_buffer_to_buffer(&self.write, *at, dst.buffer(), dst.offset(), dst.bytes());
        }
        self.landed = Some(gpu.queue.submit([enc.finish()]));
        let writable = self.writable.clone();
        self.write.map_async(wgpu::MapMode::Write, .., move |r| {
            writable.store(r.is_ok(), Ordering::Release);
        });
        Ok(())
    }
}

/// Carries every route with nothing else running: each source copies out, then each is
/// landed in turn; waits for the destinations. Returns the bytes carried.
pub fn carry(gpus: &[&Gpu], routes: &mut [Route]) -> Result<u64> {
    let mut outs = Vec::new();
    for r in routes.iter() {
        let gpu = gpus[r.from];
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        r.record_out(&mut enc);
        outs.push(gpu.queue.submit([enc.finish()]));
    }
    for (r, out) in routes.iter_mut().zip(outs) {
        r.land(gpus, out)?;
    }
    for r in routes.iter() {
        wait(gpus[r.to], None)?;
    }
    Ok(routes.iter().map(Route::bytes).sum())
}
