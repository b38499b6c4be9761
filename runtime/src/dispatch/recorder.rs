//! Recording into the caller's encoder with dispatches sharing one compute pass.
//!
//! Each dispatch of a compute pass is its own usage scope: wgpu places a barrier between two
//! dispatches of one pass wherever the second touches what the first wrote, as it does
//! between passes, so a pass boundary orders nothing more. What a pass costs is time: on the
//! CPU, where wgpu validates, tracks and encodes each one on its own when the encoder
//! finishes (about 8 µs a pass on a 2-core VM over lavapipe, against 3 µs a dispatch within
//! one pass), and on the GPU (a decode step of five dispatches took 0.036 ms in one pass
//! against 0.055 in five on an H200, 2026-11-29).

/// An encoder with a compute pass kept open across dispatches: every op's dispatches go
/// into it until a command outside a compute pass (a buffer clear or copy) or the end of the
/// recorder closes it. An op given a `wgpu::CommandEncoder` records its own dispatches
/// into one pass; given a `Recorder`, into the recorder's, so a step of several ops (RoPE,
/// the cache's append, decode) can be one pass.
pub struct Recorder<'e> {
    encoder: &'e mut wgpu::CommandEncoder,
    pass: Option<wgpu::ComputePass<'static>>,
}

impl<'e> Recorder<'e> {
    /// Records into `encoder`; the pass it opens ends when the recorder is dropped.
    pub fn new(encoder: &'e mut wgpu::CommandEncoder) -> Recorder<'e> {
        Recorder {
            encoder,
            pass: None,
        }
    }

    /// The open compute pass, opened now (labelled `label`) if none is.
    pub(crate) fn pass(&mut self, label: &str) -> &mut wgpu::ComputePass<'static> {
        let encoder = &mut *self.encoder;
        self.pass.get_or_insert_with(|| {
            let desc = wgpu::ComputePassDescriptor {
                label: Some(label),
                timestamp_writes: None,
            };
            encoder.begin_compute_pass(&desc).forget_lifetime()
        })
    }

    /// The encoder, the open pass ended: for commands that cannot be recorded in a
    /// compute pass.
    pub fn encoder(&mut self) -> &mut wgpu::CommandEncoder {
        self.pass = None;
        self.encoder
    }
}

/// Where an op records: a `wgpu::CommandEncoder` (the op's dispatches in one pass of their
/// own) or a [`Recorder`] (in the recorder's pass, shared with the ops before and after).
pub trait Record {
    /// Runs `f` with a recorder over this encoder.
    fn recorder<R>(&mut self, f: impl FnOnce(&mut Recorder<'_>) -> R) -> R;
}

impl Record for wgpu::CommandEncoder {
    fn recorder<R>(&mut self, f: impl FnOnce(&mut Recorder<'_>) -> R) -> R {
        f(&mut Recorder::new(self))
    }
}

impl Record for Recorder<'_> {
    fn recorder<R>(&mut self, f: impl FnOnce(&mut Recorder<'_>) -> R) -> R {
        f(self)
    }
}
