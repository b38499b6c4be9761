//! GPU time of a sequence of dispatches, from timestamp queries written at the start and
//! end of each compute pass (never wall clock around submit).

use crate::device::Gpu;
use crate::error::{Error, InputError};
use pollster::FutureExt as BlockOn;

pub use crate::dispatch::kernel::Step;

/// GPU time of a sequence of dispatches, over the timed runs of [`time`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    /// The median run, in milliseconds.
    pub median_ms: f64,
    /// The fastest run, in milliseconds.
    pub min_ms: f64,
    /// Runs timed.
    pub runs: usize,
}

/// Runs `steps` `warmup` times untimed (at least once: that run's time sizes the
/// spin-up), then for about `SPIN_UP_MS` of GPU time back to back, then `runs` times
/// timed; each run's time is from the first pass's start to the last pass's end.
///
/// An attempt whose median is over `UNSTEADY` times its fastest run is made again (at
/// most twice more) and the one with the lowest median kept: on an H100 the first rows timed after a batch
/// of pipelines was created ran 3-4x slow in most of their runs, and those runs alone.
pub fn time(gpu: &Gpu, steps: &[Step], warmup: usize, runs: usize) -> Result<Timing, Error> {
    let mut best = time_once(gpu, steps, warmup, runs)?;
    for _ in 0..2 {
        if best.median_ms <= UNSTEADY * best.min_ms {
            break;
        }
        let again = time_once(gpu, steps, warmup, runs)?;
        if again.median_ms < best.median_ms {
            best = again;
        }
    }
    Ok(best)
}

/// The median-to-minimum ratio past which [`time`] times a row again.
const UNSTEADY: f64 = 1.5;

fn time_once(gpu: &Gpu, steps: &[Step], warmup: usize, runs: usize) -> Result<Timing, Error> {
    let count = 2 * steps.len() as u32;
    let (queries, resolved) = query_set(gpu, count)?;
    let period_ns = f64::from(gpu.queue.get_timestamp_period());
    let mut times = Vec::with_capacity(runs);
    for run in 0..warmup.max(1) + runs {
        if run == warmup.max(1) {
            let run_ms = times.last().copied().unwrap_or(0.0);
            spin_up(gpu, run_ms, &mut |enc| {
                for step in steps {
                    step.kernel
                        .record_timed(gpu, enc, &step.bound, step.grid, None)?;
                }
                Ok(())
            })?;
            times.clear();
        }
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
        let ticks =
            crate::tensor::readback::read::<u64>(gpu, &resolved, count as usize).block_on()?;
        let span = ticks[count as usize - 1].saturating_sub(ticks[0]);
        times.push(span as f64 * period_ns / 1e6);
    }
    mark_timed();
    Ok(summarize(times, runs))
}

/// GPU time the steps run back to back before the timed runs.
const SPIN_UP_MS: f64 = 200.0;

/// How long after the last pipeline was created a row's timed runs start, at least (the
/// spin-up lasts that much longer): on an H100 the first row timed after a batch of
/// pipelines was created measured 4-5x slow in every one of its runs (a forward of 1.02
/// ms at 5.04, the seeds' backward of 0.134 ms at 0.650), and rows timed later did not; a
/// 1 s spin-up before the first row of a process removed it there.
const SETTLE_MS: f64 = 1000.0;

/// How long the host may keep the GPU idle between rows (preparing the next row's
/// buffers) before the next row settles as after a pipeline's creation: on an H200 a
/// decode row timed after its 0.5 GB cache was made on the host (seconds) ran 3.8x slow
/// in every run after a 200 ms spin-up (1.319 against 0.349 ms timed again right after,
/// 2026-11-30).
const IDLE_MS: f64 = 100.0;

/// When the last row's timed runs ended.
static LAST_TIMED: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);

fn mark_timed() {
    if let Ok(mut t) = LAST_TIMED.lock() {
        *t = Some(std::time::Instant::now());
    }
}

/// Milliseconds since the last row's timed runs ended (infinite before the first).
fn since_last_timed_ms() -> f64 {
    LAST_TIMED
        .lock()
        .ok()
        .and_then(|t| t.map(|t| t.elapsed().as_secs_f64() * 1e3))
        .unwrap_or(f64::INFINITY)
}

/// Keeps the GPU busy with what `record` records for about [`SPIN_UP_MS`] (`run_ms` is one
/// run's time), and until [`SETTLE_MS`] after the last pipeline's creation (for all of it
/// where the last row ended over [`IDLE_MS`] ago), so that a row starts on a busy GPU
/// rather than one that idled while pipelines compiled or the host made buffers.
fn spin_up(
    gpu: &Gpu,
    run_ms: f64,
    record: &mut dyn FnMut(&mut wgpu::CommandEncoder) -> Result<(), Error>,
) -> Result<(), Error> {
    let since = crate::device::since_last_pipeline_ms();
    let settle = match since_last_timed_ms() > IDLE_MS {
        true => SETTLE_MS,
        false => SETTLE_MS - since,
    };
    let spin_ms = SPIN_UP_MS.max(settle);
    let repeats = (spin_ms / run_ms.max(1e-3)).ceil().min(50_000.0) as usize;
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    for _ in 0..repeats {
        record(&mut encoder)?;
    }
    gpu.queue.submit([encoder.finish()]);
    Ok(())
}

/// Times what `record` encodes between two timestamps (written by empty compute passes,
/// at the bottom of the pipe, so after every earlier command): for commands that are not
/// dispatches, such as buffer copies.
pub fn time_encoded(
    gpu: &Gpu,
    warmup: usize,
    runs: usize,
    mut record: impl FnMut(&mut wgpu::CommandEncoder),
) -> Result<Timing, Error> {
    let spans = Spans::new(gpu, 1).ok_or(InputError::Unsupported {
        what: "GPU timing",
        needs: "an adapter with TIMESTAMP_QUERY",
    })?;
    let once = |record: &mut dyn FnMut(&mut wgpu::CommandEncoder)| -> Result<f64, Error> {
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        spans.mark(&mut encoder, 0, false);
        record(&mut encoder);
        spans.mark(&mut encoder, 0, true);
        gpu.queue.submit([encoder.finish()]);
        Ok(spans.read_ms(gpu)?[0])
    };
    let mut last = 0.0;
    for _ in 0..warmup.max(1) {
        last = once(&mut record)?;
    }
    // As `time` does: an H100 timed one decode at 0.038 ms in one process and 0.120 in
    // the next after a few warm-up runs (its GPU idled while the pipelines compiled).
    spin_up(gpu, last, &mut |enc| {
        record(enc);
        Ok(())
    })?;
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        times.push(once(&mut record)?);
    }
    mark_timed();
    Ok(summarize(times, runs))
}

/// [`time_encoded`] of a recording that can fail (an op's `record`), run once untimed
/// first so that its pipelines compile outside the timing; the first error it gives ends
/// the timing.
pub fn time_recorded<T>(
    gpu: &Gpu,
    warmup: usize,
    runs: usize,
    mut record: impl FnMut(&mut wgpu::CommandEncoder) -> Result<T, Error>,
) -> Result<(Timing, T), Error> {
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    let mut last = record(&mut encoder)?;
    gpu.queue.submit([encoder.finish()]);
    let mut failed = None;
    let t = time_encoded(gpu, warmup, runs, |enc| match record(enc) {
        Ok(x) => last = x,
        Err(e) => failed = failed.take().or(Some(e)),
    })?;
    match failed {
        Some(e) => Err(e),
        None => Ok((t, last)),
    }
}

/// GPU time of spans of recorded commands (a decode step, a training step): a pair of
/// timestamps per span, each written after every command recorded before it (by an empty
/// compute pass's end, at the bottom of the pipe), read once at the end.
pub struct Spans {
    queries: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    spans: u32,
}

impl Spans {
    /// Room for `spans` spans; `None` where the adapter has no timestamps or a query set
    /// would be too large.
    pub fn new(gpu: &Gpu, spans: u32) -> Option<Spans> {
        let count = 2 * spans;
        if count == 0 || count > wgpu::QUERY_SET_MAX_QUERIES {
            return None;
        }
        let (queries, resolved) = query_set(gpu, count).ok()?;
        Some(Spans {
            queries,
            resolved,
            spans,
        })
    }

    /// Records the start (`end: false`) or the end of span `span`.
    pub fn mark(&self, encoder: &mut wgpu::CommandEncoder, span: u32, end: bool) {
        encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("timestamp"),
            timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                query_set: &self.queries,
                beginning_of_pass_write_index: None,
                end_of_pass_write_index: Some(2 * span + u32::from(end)),
            }),
        });
    }

    /// Each span's GPU time in ms, once the GPU has run them all.
    pub fn read_ms(&self, gpu: &Gpu) -> Result<Vec<f64>, Error> {
        Ok(self.read(gpu)?.0)
    }

    /// Each span's GPU time in ms and, for spans recorded one after another, the ms from
    /// each span's end to the next one's start: where steps are submitted back to back, the
    /// time the GPU spends between two submissions.
    pub fn read(&self, gpu: &Gpu) -> Result<(Vec<f64>, Vec<f64>), Error> {
        let count = 2 * self.spans;
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        encoder.resolve_query_set(&self.queries, 0..count, &self.resolved, 0);
        gpu.queue.submit([encoder.finish()]);
        let ticks =
            crate::tensor::readback::read::<u64>(gpu, &self.resolved, count as usize).block_on()?;
        let period_ns = f64::from(gpu.queue.get_timestamp_period());
        let ms = |from: u64, to: u64| to.saturating_sub(from) as f64 * period_ns / 1e6;
        let spans = ticks.chunks(2).map(|t| ms(t[0], t[1])).collect();
        let gaps = ticks[1..]
            .chunks(2)
            .filter(|t| t.len() == 2)
            .map(|t| ms(t[0], t[1]))
            .collect();
        Ok((spans, gaps))
    }
}

/// A query set of `count` timestamps and the buffer they resolve into.
fn query_set(gpu: &Gpu, count: u32) -> Result<(wgpu::QuerySet, wgpu::Buffer), Error> {
    if !gpu.has_timestamps() {
        return Err(InputError::Unsupported {
            what: "GPU timing",
            needs: "an adapter with TIMESTAMP_QUERY",
        }
        .into());
    }
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
    Ok((queries, resolved))
}

fn summarize(mut times: Vec<f64>, runs: usize) -> Timing {
    times.sort_by(f64::total_cmp);
    Timing {
        median_ms: times[times.len() / 2],
        min_ms: times[0],
        runs,
    }
}
