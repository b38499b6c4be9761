//! GPU time of a sequence of dispatches, from timestamp queries written at the start and
//! end of each compute pass (never wall clock around submit).

use crate::error::{Error, InputError};
use crate::gpu::Gpu;
use crate::kernel::Kernel;

/// One dispatch: a kernel, its buffers by binding name, and its grid.
pub struct Step<'a> {
    pub kernel: &'a Kernel,
    pub bound: Vec<(&'a str, &'a wgpu::Buffer)>,
    pub grid: [u32; 3],
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    pub median_ms: f64,
    pub min_ms: f64,
    pub runs: usize,
}

/// Runs `steps` `warmup` times untimed, then `runs` times timed; each run's time is from
/// the first pass's start to the last pass's end.
pub fn time(gpu: &Gpu, steps: &[Step], warmup: usize, runs: usize) -> Result<Timing, Error> {
    if !gpu.has_timestamps() {
        return Err(InputError::Unsupported {
            what: "GPU timing",
            needs: "an adapter with TIMESTAMP_QUERY",
        }
        .into());
    }
    let count = 2 * steps.len() as u32;
    let queries = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
        label: Some("bench"),
        ty: wgpu::QueryType::Timestamp,
        count,
    });
    let resolved = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("timestamps"),
        size: u64::from(count) * 8,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let period_ns = f64::from(gpu.queue.get_timestamp_period());
    let mut times = Vec::with_capacity(runs);
    for run in 0..warmup + runs {
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        for (i, step) in steps.iter().enumerate() {
            let writes = wgpu::ComputePassTimestampWrites {
                query_set: &queries,
                beginning_of_pass_write_index: Some(2 * i as u32),
                end_of_pass_write_index: Some(2 * i as u32 + 1),
            };
            step.kernel
                .record_timed(gpu, &mut encoder, &step.bound, step.grid, Some(writes))?;
        }
        encoder.resolve_query_set(&queries, 0..count, &resolved, 0);
        gpu.queue.submit([encoder.finish()]);
        let ticks = crate::buffers::read::<u64>(gpu, &resolved, count as usize)?;
        if run >= warmup {
            let span = ticks[count as usize - 1].saturating_sub(ticks[0]);
            times.push(span as f64 * period_ns / 1e6);
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(Timing {
        median_ms: times[times.len() / 2],
        min_ms: times[0],
        runs,
    })
}
