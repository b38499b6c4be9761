//! The same work on one device: the forward and backward over the whole sequence, what
//! the split is timed against.

use std::time::Instant;

use anyhow::Result;
use attn_dsl::{Masks, Scalar};
use runtime::ops::backward::{BackwardArgs, BackwardSpec};
use runtime::ops::forward::{Forward, ForwardArgs, ForwardSpec};
use runtime::{Backward, Gpu, Tensor};

use crate::split::submit;
use crate::{Config, Host, wait};

/// The sequence's tensors and ops on one device.
pub struct Whole {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub d_o: Tensor,
    pub o: Tensor,
    pub lse: Tensor,
    pub dq: Tensor,
    pub dk: Tensor,
    pub dv: Tensor,
    forward: Forward,
    backward: Backward,
}

impl Whole {
    pub fn new(gpu: &Gpu, c: &Config, host: &Host) -> Result<Whole> {
        let h = c.heads;
        let data = Scalar::from(c.dtype);
        let (qs, ks) = (
            [1, c.seq, h.n_heads, h.head_dim],
            [1, c.seq, h.n_kv_heads, h.head_dim],
        );
        let up = |shape: &[u32], x: &[f32]| Tensor::from_f32(gpu, shape, data, x);
        let zeros = |shape: &[u32], s| Tensor::zeros(gpu, shape, s);
        let masks = Masks::new(c.causal, false);
        Ok(Whole {
            q: up(&qs, &host.q)?,
            k: up(&ks, &host.k)?,
            v: up(&ks, &host.v)?,
            d_o: up(&qs, &host.d_o)?,
            o: zeros(&qs, data)?,
            lse: zeros(&qs[..3], Scalar::F32)?,
            dq: zeros(&qs, Scalar::F32)?,
            dk: zeros(&ks, Scalar::F32)?,
            dv: zeros(&ks, Scalar::F32)?,
            forward: Forward::new(gpu, ForwardSpec::new(h.head_dim, masks, c.dtype))?,
            backward: Backward::new(gpu, BackwardSpec::new(h.head_dim, masks, c.dtype))?,
        })
    }

    /// The forward, waited for: wall ms.
    pub fn forward(&mut self, gpu: &Gpu) -> Result<f64> {
        let t = Instant::now();
        submit(&gpu.device, &gpu.queue, |enc| {
            let args = ForwardArgs::new(&self.q, &self.k, &self.v, &self.o, &self.lse);
            Ok(self.forward.record(gpu, enc, &args)?)
        })?;
        wait(gpu)?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    }

    /// The backward from the forward's O and LSE, waited for: wall ms.
    pub fn backward(&mut self, gpu: &Gpu) -> Result<f64> {
        let t = Instant::now();
        submit(&gpu.device, &gpu.queue, |enc| {
            let args = BackwardArgs {
                q: &self.q,
                k: &self.k,
                v: &self.v,
                o: &self.o,
                lse: &self.lse,
                d_o: &self.d_o,
                dq: &self.dq,
                dk: &self.dk,
                dv: &self.dv,
                dbias: None,
                dsinks: None,
                flex_grads: &[],
                seg: None,
                scale: None,
                mods: Default::default(),
                accumulate: false,
            };
            self.backward.record(gpu, enc, &args, None)?;
            Ok(())
        })?;
        wait(gpu)?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    }
}
