//! One device's share: every query (and dO), its two key chunks, the ops that attend them,
//! and the views each block reads and writes. Views are made once: a step records into
//! them and creates nothing.

use anyhow::Result;
use attn_dsl::{Dtype, Masks};
use runtime::dispatch::Recorder;
use runtime::ops::backward::{BackwardArgs, BackwardSpec};
use runtime::ops::forward::{Forward, ForwardArgs, ForwardSpec};
use runtime::tensor::element_bytes;
use runtime::{Backward, Gpu, Heads, Tensor};

use crate::plan::{Block, Plan};

/// `shape`'s elements of `t` from element `start` on, as a tensor of its own (no copy).
pub fn slice(gpu: &Gpu, t: &Tensor, start: u64, shape: &[u32]) -> Result<Tensor> {
    let at = t.offset() + start * element_bytes(t.scalar());
    Ok(Tensor::wrap(gpu, t.buffer(), at, shape, t.scalar())?)
}

/// Rows `first..first + rows` of `t`, a `[1, seq, ..]` tensor.
pub fn rows(gpu: &Gpu, t: &Tensor, first: u32, rows: u32) -> Result<Tensor> {
    let row_shape = &t.shape()[2..];
    let row: u64 = row_shape.iter().map(|x| u64::from(*x)).product();
    let shape: Vec<u32> = [&[1, rows][..], row_shape].concat();
    slice(gpu, t, u64::from(first) * row, &shape)
}

/// Part `p` of a stack `[parts, 1, seq, ..]`, shaped `[1, seq, ..]`.
pub fn part(gpu: &Gpu, stack: &Tensor, p: usize) -> Result<Tensor> {
    let shape = &stack.shape()[1..];
    let len: u64 = shape.iter().map(|x| u64::from(*x)).product();
    slice(gpu, stack, p as u64 * len, shape)
}

/// What one block reads and writes.
struct Views {
    block: Block,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    /// The block's part of O and LSE: written by its forward.
    o_part: Tensor,
    lse_part: Tensor,
    /// The merged O and LSE of its queries, and their dO: read by its backward.
    o: Tensor,
    lse: Tensor,
    d_o: Tensor,
    dq: Tensor,
    dk: Tensor,
    dv: Tensor,
}

/// The tensors a device holds for one sequence.
pub struct Tensors {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub d_o: Tensor,
    /// The merged O and LSE (the backward's input).
    pub o: Tensor,
    pub lse: Tensor,
    /// Its partial dQ, and dK and dV of its two key chunks, f32.
    pub dq: Tensor,
    pub dk: Tensor,
    pub dv: Tensor,
}

/// A device's share of the work.
pub struct Shard {
    pub gpu: Gpu,
    pub device: usize,
    pub t: Tensors,
    views: Vec<Views>,
    /// Whole blocks' ops, then the diagonal's (causal) where the plan is causal.
    forward: Vec<Forward>,
    backward: Vec<Backward>,
}

/// The ops attending whole blocks, then diagonal ones.
fn masks(plan: &Plan) -> Vec<Masks> {
    let mut m = vec![Masks::new(false, false)];
    if plan.causal {
        m.push(Masks::new(true, false));
    }
    m
}

impl Shard {
    /// Device `device`'s share; `tensors` hold its inputs, and block `i` (of
    /// [`Plan::blocks`]) writes its O and LSE into `outputs[i]` (`[1, chunk, n_heads, ..]`).
    pub fn new(
        gpu: Gpu,
        device: usize,
        plan: &Plan,
        spec: (Dtype, Heads),
        t: Tensors,
        outputs: Vec<(Tensor, Tensor)>,
    ) -> Result<Shard> {
        let (dtype, heads) = spec;
        let m = plan.chunk;
        let mut views = Vec::new();
        for (block, (o_part, lse_part)) in plan.blocks(device).into_iter().zip(outputs) {
            let (qr, kr) = (block.query as u32 * m, block.slot as u32 * m);
            views.push(Views {
                block,
                q: rows(&gpu, &t.q, qr, m)?,
                k: rows(&gpu, &t.k, kr, m)?,
                v: rows(&gpu, &t.v, kr, m)?,
                o_part,
                lse_part,
                o: rows(&gpu, &t.o, qr, m)?,
                lse: rows(&gpu, &t.lse, qr, m)?,
                d_o: rows(&gpu, &t.d_o, qr, m)?,
                dq: rows(&gpu, &t.dq, qr, m)?,
                dk: rows(&gpu, &t.dk, kr, m)?,
                dv: rows(&gpu, &t.dv, kr, m)?,
            });
        }
        let spec = |masks| ForwardSpec::new(heads.head_dim, masks, dtype);
        let forward = masks(plan)
            .into_iter()
            .map(|mk| Forward::new(&gpu, spec(mk)))
            .collect::<Result<_, _>>()?;
        let backward = masks(plan)
            .into_iter()
            .map(|mk| Backward::new(&gpu, BackwardSpec::new(heads.head_dim, mk, dtype)))
            .collect::<Result<_, _>>()?;
        Ok(Shard {
            gpu,
            device,
            t,
            views,
            forward,
            backward,
        })
    }

    /// Its blocks, in the order they are recorded.
    pub fn blocks(&self) -> impl Iterator<Item = &Block> {
        self.views.iter().map(|v| &v.block)
    }

    /// Records the forward of blocks `range`: their parts of O and LSE.
    pub fn record_forward(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        range: std::ops::Range<usize>,
    ) -> Result<()> {
        let mut rec = Recorder::new(encoder);
        for v in &self.views[range] {
            let args = ForwardArgs::new(&v.q, &v.k, &v.v, &v.o_part, &v.lse_part);
            let op = &mut self.forward[usize::from(v.block.diagonal)];
            op.record(&self.gpu, &mut rec, &args)?;
        }
        Ok(())
    }

    /// Records the clearing of dQ, dK and dV, which the blocks' backward add into.
    pub fn record_clear(&self, encoder: &mut wgpu::CommandEncoder) {
        for g in [&self.t.dq, &self.t.dk, &self.t.dv] {
            encoder.clear_buffer(g.buffer(), g.offset(), Some(g.bytes()));
        }
    }

    /// Records the backward of blocks `range` from the merged O and LSE: their queries'
    /// share of dQ and their keys' dK and dV, added in.
    pub fn record_backward(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        range: std::ops::Range<usize>,
    ) -> Result<()> {
        let mut rec = Recorder::new(encoder);
        for v in &self.views[range] {
            let args = BackwardArgs {
                q: &v.q,
                k: &v.k,
                v: &v.v,
                o: &v.o,
                lse: &v.lse,
                d_o: &v.d_o,
                dq: &v.dq,
                dk: &v.dk,
                dv: &v.dv,
                dbias: None,
                dsinks: None,
                flex_grads: &[],
                seg: None,
                scale: None,
                mods: Default::default(),
                accumulate: true,
            };
            let op = &mut self.backward[usize::from(v.block.diagonal)];
            op.record(&self.gpu, &mut rec, &args, None)?;
        }
        Ok(())
    }
}
