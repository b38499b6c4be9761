//! The work over several devices: each device's blocks, the routes that carry their
//! results to device 0, the merge and the sum there. A step runs whole (the transfers
//! overlapping the blocks: a route is carried while its source computes the next block) or
//! one phase alone, for the phase model.

use std::time::Instant;

use anyhow::Result;
use runtime::ops::merge::{Merge, MergeArgs, MergeSpec};
use runtime::ops::sum::{Sum, SumArgs};
use runtime::{Gpu, Scalar, Tensor};

use crate::plan::Plan;
use crate::shard::{Shard, part, rows};
use crate::transfer::{self, Route};
use crate::wait;

/// The devices' shares and what joins them.
pub struct Split {
    pub shards: Vec<Shard>,
    plan: Plan,
    /// Device 0's parts of each query chunk's O and LSE, stacked by key chunk:
    /// `[seen, 1, chunk, n_heads, ..]`.
    stacks: Vec<(Tensor, Tensor)>,
    /// Each query chunk's rows of device 0's O and LSE, which its merge writes.
    merged_rows: Vec<(Tensor, Tensor)>,
    merge: Merge,
    sum: Sum,
    /// The other devices' partial dQ, `[devices − 1, 1, seq, n_heads, head_dim]` f32.
    dq_parts: Option<Tensor>,
    /// Per other device, per block: its O and LSE to device 0's stacks.
    parts: Vec<Vec<Route>>,
    /// Per other device: the merged O and LSE from device 0.
    merged: Vec<Route>,
    /// Per other device, per query chunk it has blocks of: the index of the chunk's last
    /// block and the route of its rows of dQ to device 0.
    dq: Vec<Vec<(usize, Route)>>,
}

/// A step whole, or one of its phases alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Whole,
    Compute,
    Transfer,
    Combine,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

impl Split {
    /// Device 0's stacks and the other devices' block outputs, then the shards, their
    /// routes, the merge and the sum.
    pub fn new(
        gpus: Vec<Gpu>,
        plan: Plan,
        spec: (attn_dsl::Dtype, runtime::Heads),
        tensors: Vec<crate::shard::Tensors>,
    ) -> Result<Split> {
        let (dtype, h) = spec;
        let data = Scalar::from(dtype);
        let (m, n) = (plan.chunk, plan.chunk * plan.chunks() as u32);
        let g0 = &gpus[0];
        let mut stacks = Vec::new();
        for c in 0..plan.chunks() {
            let seen = plan.seen(c) as u32;
            stacks.push((
                Tensor::zeros(g0, &[seen, 1, m, h.n_heads, h.head_dim], data)?,
                Tensor::zeros(g0, &[seen, 1, m, h.n_heads], Scalar::F32)?,
            ));
        }
        let mut shards = Vec::new();
        let mut locals = Vec::new();
        for (d, (gpu, t)) in gpus.into_iter().zip(tensors).enumerate() {
            let blocks = plan.blocks(d);
            let count = blocks.len() as u32;
            let outputs = match d {
                0 => blocks
                    .iter()
                    .map(|b| {
                        let (o, lse) = &stacks[b.query];
                        Ok((part(&gpu, o, b.key)?, part(&gpu, lse, b.key)?))
                    })
                    .collect::<Result<Vec<_>>>()?,
                _ => {
                    let o = Tensor::zeros(&gpu, &[count, 1, m, h.n_heads, h.head_dim], data)?;
                    let lse = Tensor::zeros(&gpu, &[count, 1, m, h.n_heads], Scalar::F32)?;
                    (0..blocks.len())
                        .map(|i| Ok((part(&gpu, &o, i)?, part(&gpu, &lse, i)?)))
                        .collect::<Result<Vec<_>>>()?
                }
            };
            locals.push(outputs.clone());
            shards.push(Shard::new(gpu, d, &plan, spec, t, outputs)?);
        }
        let g0 = &shards[0].gpu;
        let dq_parts = (plan.devices > 1)
            .then(|| {
                let shape = [plan.devices as u32 - 1, 1, n, h.n_heads, h.head_dim];
                Tensor::zeros(g0, &shape, Scalar::F32)
            })
            .transpose()?;
        let lead = &shards[0].t;
        let merged_rows = (0..plan.chunks() as u32)
            .map(|c| Ok((rows(g0, &lead.o, c * m, m)?, rows(g0, &lead.lse, c * m, m)?)))
            .collect::<Result<Vec<_>>>()?;
        let mut split = Split {
            merged_rows,
            merge: Merge::new(g0, MergeSpec::new(h.head_dim, dtype))?,
            sum: Sum::new(),
            dq_parts,
            shards,
            plan,
            stacks,
            parts: Vec::new(),
            merged: Vec::new(),
            dq: Vec::new(),
        };
        split.routes(&locals)?;
        Ok(split)
    }

    fn gpus(&self) -> Vec<&Gpu> {
        self.shards.iter().map(|s| &s.gpu).collect()
    }

    /// The routes of every other device: `locals[d][i]` is block i's O and LSE there.
    fn routes(&mut self, locals: &[Vec<(Tensor, Tensor)>]) -> Result<()> {
        let gpus = self.gpus();
        let (lead, others) = self.shards.split_first().expect("one device at least");
        let g0 = &lead.gpu;
        let m = self.plan.chunk;
        let (mut parts, mut merged, mut dq) = (Vec::new(), Vec::new(), Vec::new());
        for sh in others {
            let d = sh.device;
            let mut routes = Vec::new();
            for (b, (o, lse)) in sh.blocks().zip(&locals[d]) {
                let (so, sl) = &self.stacks[b.query];
                let items = vec![
                    (o.clone(), part(g0, so, b.key)?),
                    (lse.clone(), part(g0, sl, b.key)?),
                ];
                routes.push(Route::new(&gpus, d, 0, items));
            }
            parts.push(routes);
            let back = vec![
                (lead.t.o.clone(), sh.t.o.clone()),
                (lead.t.lse.clone(), sh.t.lse.clone()),
            ];
            merged.push(Route::new(&gpus, 0, d, back));
            let mut groups = Vec::new();
            if let Some(dq_parts) = &self.dq_parts {
                let to = part(g0, dq_parts, d - 1)?;
                let blocks: Vec<_> = sh.blocks().copied().collect();
                for (i, b) in blocks.iter().enumerate() {
                    if blocks.get(i + 1).is_some_and(|n| n.query == b.query) {
                        continue;
                    }
                    let at = b.query as u32 * m;
                    let item = (rows(&sh.gpu, &sh.t.dq, at, m)?, rows(g0, &to, at, m)?);
                    groups.push((i, Route::new(&gpus, d, 0, vec![item])));
                }
            }
            dq.push(groups);
        }
        (self.parts, self.merged, self.dq) = (parts, merged, dq);
        Ok(())
    }

    /// The forward: every block, the parts to device 0, the merges; wall ms and bytes.
    pub fn forward(&mut self, mode: Mode) -> Result<(f64, u64)> {
        let t = Instant::now();
        let mut bytes = 0;
        match mode {
            Mode::Whole => bytes = self.forward_overlapped()?,
            Mode::Compute => {
                for sh in &mut self.shards {
                    let n = sh.blocks().count();
                    let (device, queue) = (sh.gpu.device.clone(), sh.gpu.queue.clone());
                    submit(&device, &queue, |enc| sh.record_forward(enc, 0..n))?;
                }
            }
            Mode::Transfer => {
                let gpus: Vec<&Gpu> = self.shards.iter().map(|s| &s.gpu).collect();
                for routes in &mut self.parts {
                    bytes += transfer::carry(&gpus, routes)?;
                }
            }
            Mode::Combine => {}
        }
        if matches!(mode, Mode::Whole | Mode::Combine) {
            self.record_merges()?;
        }
        for sh in &self.shards {
            wait(&sh.gpu)?;
        }
        Ok((ms(t), bytes))
    }

    /// Device 0's blocks in one submission; each other device's block by block, each
    /// followed by its copy out, carried while the next computes.
    fn forward_overlapped(&mut self) -> Result<u64> {
        let mut outs = Vec::new();
        for sh in self.shards.iter_mut() {
            let n = sh.blocks().count();
            let (device, queue) = (sh.gpu.device.clone(), sh.gpu.queue.clone());
            let mut mine = Vec::new();
            match sh.device {
                0 => {
                    submit(&device, &queue, |enc| sh.record_forward(enc, 0..n))?;
                }
                d => {
                    for i in 0..n {
                        let route = &self.parts[d - 1][i];
                        mine.push(submit(&device, &queue, |enc| {
                            sh.record_forward(enc, i..i + 1)?;
                            route.record_out(enc);
                            Ok(())
                        })?);
                    }
                }
            }
            outs.push(mine);
        }
        let gpus: Vec<&Gpu> = self.shards.iter().map(|s| &s.gpu).collect();
        let mut bytes = 0;
        let longest = outs.iter().map(Vec::len).max().unwrap_or(0);
        for i in 0..longest {
            for (d, routes) in self.parts.iter_mut().enumerate() {
                if let (Some(r), Some(out)) = (routes.get_mut(i), outs[d + 1].get(i)) {
                    r.land(&gpus, out.clone())?;
                    bytes += r.bytes();
                }
            }
        }
        Ok(bytes)
    }

    /// Each query chunk's parts merged into its rows of device 0's O and LSE.
    fn record_merges(&mut self) -> Result<()> {
        let g0 = &self.shards[0].gpu;
        let mut enc = g0.device.create_command_encoder(&Default::default());
        for ((o_parts, lse_parts), (o, lse)) in self.stacks.iter().zip(&self.merged_rows) {
            let args = MergeArgs {
                o_parts,
                lse_parts,
                o,
                lse,
                sinks: None,
            };
            self.merge.record(g0, &mut enc, &args)?;
        }
        g0.queue.submit([enc.finish()]);
        Ok(())
    }
}

impl Split {
    /// The backward: the merged O and LSE to every device, every block, the partial dQs
    /// to device 0 and their sum there; wall ms and bytes. The broadcast is part of the
    /// whole step and of the transfers alone.
    pub fn backward(&mut self, mode: Mode) -> Result<(f64, u64)> {
        let t = Instant::now();
        let mut bytes = 0;
        if matches!(mode, Mode::Whole | Mode::Transfer) {
            let gpus: Vec<&Gpu> = self.shards.iter().map(|s| &s.gpu).collect();
            bytes += transfer::carry(&gpus, &mut self.merged)?;
        }
        match mode {
            Mode::Whole => bytes += self.backward_overlapped()?,
            Mode::Compute => {
                for sh in &mut self.shards {
                    let n = sh.blocks().count();
                    let (device, queue) = (sh.gpu.device.clone(), sh.gpu.queue.clone());
                    submit(&device, &queue, |enc| {
                        sh.record_clear(enc);
                        sh.record_backward(enc, 0..n)
                    })?;
                }
            }
            Mode::Transfer => {
                let gpus: Vec<&Gpu> = self.shards.iter().map(|s| &s.gpu).collect();
                for groups in &mut self.dq {
                    for (_, r) in groups.iter_mut() {
                        bytes += transfer::carry(&gpus, std::slice::from_mut(r))?;
                    }
                }
            }
            Mode::Combine => {}
        }
        if matches!(mode, Mode::Whole | Mode::Combine) {
            self.record_sum()?;
        }
        for sh in &self.shards {
            wait(&sh.gpu)?;
        }
        Ok((ms(t), bytes))
    }

    /// Device 0's blocks in one submission; each other device's by query chunk, each
    /// chunk's rows of dQ copied out after its last block and carried while the next
    /// chunk computes.
    fn backward_overlapped(&mut self) -> Result<u64> {
        let mut outs: Vec<Vec<wgpu::SubmissionIndex>> = Vec::new();
        for sh in self.shards.iter_mut() {
            let n = sh.blocks().count();
            let (device, queue) = (sh.gpu.device.clone(), sh.gpu.queue.clone());
            let mut mine = Vec::new();
            match sh.device {
                0 => {
                    submit(&device, &queue, |enc| {
                        sh.record_clear(enc);
                        sh.record_backward(enc, 0..n)
                    })?;
                }
                d => {
                    let mut first = 0;
                    for (last, route) in &self.dq[d - 1] {
                        let out = submit(&device, &queue, |enc| {
                            if first == 0 {
                                sh.record_clear(enc);
                            }
                            sh.record_backward(enc, first..last + 1)?;
                            route.record_out(enc);
                            Ok(())
                        })?;
                        mine.push(out);
                        first = last + 1;
                    }
                }
            }
            outs.push(mine);
        }
        let gpus: Vec<&Gpu> = self.shards.iter().map(|s| &s.gpu).collect();
        let mut bytes = 0;
        let longest = outs.iter().map(Vec::len).max().unwrap_or(0);
        for i in 0..longest {
            for (d, groups) in self.dq.iter_mut().enumerate() {
                if let (Some((_, r)), Some(out)) = (groups.get_mut(i), outs[d + 1].get(i)) {
                    r.land(&gpus, out.clone())?;
                    bytes += r.bytes();
                }
            }
        }
        Ok(bytes)
    }

    /// The other devices' partial dQs added into device 0's.
    fn record_sum(&mut self) -> Result<()> {
        let Some(dq_parts) = &self.dq_parts else {
            return Ok(());
        };
        let lead = &self.shards[0];
        let (device, queue) = (lead.gpu.device.clone(), lead.gpu.queue.clone());
        submit(&device, &queue, |enc| {
            let args = SumArgs {
                parts: dq_parts,
                into: &lead.t.dq,
            };
            Ok(self.sum.record(&lead.gpu, enc, &args)?)
        })?;
        Ok(())
    }
}

/// Records `f` into a fresh encoder on `gpu` and submits it.
pub fn submit(
    gpu: &wgpu::Device,
    queue: &wgpu::Queue,
    f: impl FnOnce(&mut wgpu::CommandEncoder) -> Result<()>,
) -> Result<wgpu::SubmissionIndex> {
    let mut enc = gpu.create_command_encoder(&Default::default());
    f(&mut enc)?;
    Ok(queue.submit([enc.finish()]))
}
