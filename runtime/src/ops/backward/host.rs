//! The backward of host data: checked, uploaded, recorded through [`Backward::record`],
//! the gradients read back.

use attn_dsl::{Dtype, KernelAbi};

use crate::device::Gpu;
use crate::error::{Error, InputError};
use crate::modifiers::Modifiers;
use crate::ops::backward::{Backward, Schedule};
use crate::ops::forward::{self as attention, ForwardInput};
use crate::shape::Heads;
use crate::shape::length;
use crate::tensor::Tensor;

/// The backward's inputs: the forward's Q, K, V, its saved O and LSE, and the upstream
/// gradient dO, laid out as for the forward (`[batch, seq, heads, head_dim]`).
#[derive(Clone, Copy, Debug)]
pub struct BackwardInput<'a> {
    /// Sequences of `seq_len` rows each.
    pub batch: u32,
    /// Rows of each sequence, queries and keys alike.
    pub seq_len: u32,
    /// Query and KV heads and their widths.
    pub heads: Heads,
    /// The forward's queries, `[batch, seq, n_heads, head_dim]`.
    pub q: &'a [f32],
    /// The forward's keys, `[batch, seq, n_kv_heads, head_dim]`.
    pub k: &'a [f32],
    /// The forward's values, `[batch, seq, n_kv_heads, head_dim_v]`.
    pub v: &'a [f32],
    /// The forward's output, `[batch, seq, n_heads, head_dim_v]`.
    pub o: &'a [f32],
    /// The forward's log-sum-exp, `[batch, seq, n_heads]`.
    pub lse: &'a [f32],
    /// The gradient of the loss with respect to O, in O's layout.
    pub d_o: &'a [f32],
    /// The forward's document starts, as [`ForwardInput::seg`] takes them.
    pub seg: Option<&'a [u32]>,
    /// The forward's scale; defaults to `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// The forward's modifier values (the same dropout seed and offset regenerate its mask).
    pub mods: Modifiers<'a>,
}

/// dQ `[batch, seq, n_heads, d]`, dK and dV `[batch, seq, n_kv_heads, d]`, with a bias
/// dBias in the bias's layout, with sinks dSinks `[n_heads]` (each empty without), and
/// the gradient of each modifier tensor declared `grad`, by gradient name (`drel_bias`), in
/// its tensor's layout.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gradients {
    /// dQ, in Q's layout.
    pub dq: Vec<f32>,
    /// dK, in K's layout.
    pub dk: Vec<f32>,
    /// dV, in V's layout.
    pub dv: Vec<f32>,
    /// dBias, in the bias's layout; empty without a bias.
    pub dbias: Vec<f32>,
    /// dSinks, `[n_heads]`; empty without sinks.
    pub dsinks: Vec<f32>,
    /// Each `grad` modifier tensor's gradient, by gradient name; see [`Gradients::flex`].
    pub dflex: Vec<(String, Vec<f32>)>,
}

impl Gradients {
    /// The gradient `name` of a modifier tensor (`drel_bias`), if there is one.
    pub fn flex(&self, name: &str) -> Option<&[f32]> {
        self.dflex
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, g)| &g[..])
    }
}

/// Zeros for the gradient of each tensor `mods`' score modifier declares `grad`.
fn flex_zeros(mods: &Modifiers) -> Vec<(String, Vec<f32>)> {
    let Some(f) = mods.flex else {
        return Vec::new();
    };
    f.modifiers
        .get()
        .tensors
        .iter()
        .filter_map(|t| {
            Some((
                t.grad_name()?,
                vec![0.0; f.tensor(&t.name).map_or(0, <[f32]>::len)],
            ))
        })
        .collect()
}

impl Backward {
    /// Fresh gradients of host data from the kernels of `dtype` (a [`crate::ops::backward::BackwardSpec`] of it
    /// added first: [`Backward::new`], [`Backward::add`]), by `schedule` or the planner's
    /// choice: Q, K, V, O and dO are rounded to it on upload; the gradients come back f32.
    pub async fn run(
        &mut self,
        gpu: &Gpu,
        input: &BackwardInput<'_>,
        schedule: Option<Schedule>,
        dtype: Dtype,
    ) -> Result<(Gradients, Schedule), Error> {
        let zeros = Gradients {
            dq: vec![0.0; input.q.len()],
            dk: vec![0.0; input.k.len()],
            dv: vec![0.0; input.v.len()],
            dbias: vec![0.0; input.mods.bias.map_or(0, |b| b.values.len())],
            dsinks: vec![0.0; input.mods.sinks.map_or(0, <[f32]>::len)],
            dflex: flex_zeros(&input.mods),
        };
        self.accumulate(gpu, input, schedule, zeros, dtype).await
    }

    /// `grads` plus the gradients of `input` ([`Backward::run`]'s): micro-steps add up.
    /// The host data is checked, uploaded, run through [`Backward::record`] and the
    /// gradients read back.
    pub async fn accumulate(
        &mut self,
        gpu: &Gpu,
        input: &BackwardInput<'_>,
        schedule: Option<Schedule>,
        grads: Gradients,
        dtype: Dtype,
    ) -> Result<(Gradients, Schedule), Error> {
        let set = self.validate(gpu, input, &grads, dtype)?;
        let h = input.heads;
        let (b, s) = (input.batch, input.seq_len);
        // Refuse what this device cannot run before uploading anything.
        let (schedule, _) = self.schedule_for(gpu, set, schedule, (b, s, h), dtype)?;
        let data = self.compiled[set].prep_abi.scalar("o");
        let q_shape = [b, s, h.n_heads, h.head_dim];
        let kv_shape = [b, s, h.n_kv_heads, h.head_dim];
        let o_shape = [b, s, h.n_heads, h.head_dim_v];
        let v_shape = [b, s, h.n_kv_heads, h.head_dim_v];
        let up = |shape: &[u32], scalar, data: &[f32]| Tensor::from_f32(gpu, shape, scalar, data);
        let f32 = attn_dsl::Scalar::F32;
        let q = up(&q_shape, data, input.q)?;
        let k = up(&kv_shape, data, input.k)?;
        let v = up(&v_shape, data, input.v)?;
        let o = up(&o_shape, data, input.o)?;
        let d_o = up(&o_shape, data, input.d_o)?;
        let lse = up(&[b, s, h.n_heads], f32, input.lse)?;
        let dq = up(&q_shape, f32, &grads.dq)?;
        let dk = up(&kv_shape, f32, &grads.dk)?;
        let dv = up(&v_shape, f32, &grads.dv)?;
        let mut uploaded = input.mods.upload(gpu, b, (s, s))?;
        crate::ops::block_mask::make_block_mask(gpu, &mut uploaded, h.n_heads, s)?;
        let flex = uploaded.flex_tensors();
        let mods = uploaded.view(&input.mods, &flex);
        let dbias = match mods.bias {
            Some(bias) => Some(up(bias.values.shape(), f32, &grads.dbias)?),
            None => None,
        };
        let dsinks = match mods.sinks {
            Some(sinks) => Some(up(sinks.shape(), f32, &grads.dsinks)?),
            None => None,
        };
        let seg = match input.seg {
            Some(seg) => Some(crate::ops::forward::documents(gpu, seg, b, s)?),
            None => None,
        };
        let dflex = grads
            .dflex
            .iter()
            .map(|(name, g)| {
                let t = mods
                    .flex
                    .and_then(|f| f.tensor(&name[1..]))
                    .expect("validated");
                Ok((name.as_str(), up(t.shape(), f32, g)?))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let flex_grads: Vec<(&str, &Tensor)> = dflex.iter().map(|(n, t)| (*n, t)).collect();
        let args = crate::ops::backward::BackwardArgs {
            q: &q,
            k: &k,
            v: &v,
            o: &o,
            lse: &lse,
            d_o: &d_o,
            dq: &dq,
            dk: &dk,
            dv: &dv,
            dbias: dbias.as_ref(),
            dsinks: dsinks.as_ref(),
            flex_grads: &flex_grads,
            seg: seg.as_ref(),
            scale: input.scale,
            mods,
            accumulate: true,
        };
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        let ran = self.record(gpu, &mut encoder, &args, Some(schedule))?;
        gpu.queue.submit([encoder.finish()]);
        let read = async |t: Option<Tensor>| match t {
            Some(t) => t.to_f32(gpu).await,
            None => Ok(Vec::new()),
        };
        let grads = Gradients {
            dq: dq.to_f32(gpu).await?,
            dk: dk.to_f32(gpu).await?,
            dv: dv.to_f32(gpu).await?,
            dbias: read(dbias).await?,
            dsinks: read(dsinks).await?,
            dflex: Vec::new(),
        };
        let mut grads = grads;
        for (name, t) in dflex {
            grads.dflex.push((name.to_string(), t.to_f32(gpu).await?));
        }
        Ok((grads, ran))
    }

    fn validate(
        &self,
        gpu: &Gpu,
        input: &BackwardInput,
        grads: &Gradients,
        dtype: Dtype,
    ) -> Result<usize, InputError> {
        let h = input.heads;
        let set = self.set_of(h.dims(), dtype)?;
        let abi: &KernelAbi = &self.compiled[set].schedules[0].abis[0];
        let view = ForwardInput {
            batch: input.batch,
            seq_len: input.seq_len,
            heads: h,
            q: input.q,
            k: input.k,
            v: input.v,
            seg: input.seg,
            scale: input.scale,
            mods: input.mods,
        };
        attention::validate_sequence(abi, gpu.limits(), &view)?;
        let dbias_len = input.mods.bias.map_or(0, |b| b.values.len());
        length(
            "dbias",
            grads.dbias.len(),
            dbias_len as u64,
            "the length of bias",
        )?;
        let want = flex_zeros(&input.mods);
        let names = |g: &[(String, Vec<f32>)]| g.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        if names(&grads.dflex) != names(&want) {
            return Err(InputError::Flex {
                kernel: abi.name.to_string(),
                message: format!(
                    "the gradients given ({:?}) are not those of the tensors declared `grad` ({:?})",
                    names(&grads.dflex),
                    names(&want)
                ),
            });
        }
        if let Some(((name, g), (_, w))) = grads
            .dflex
            .iter()
            .zip(&want)
            .find(|((_, g), (_, w))| g.len() != w.len())
        {
            return Err(InputError::Flex {
                kernel: abi.name.to_string(),
                message: format!(
                    "`{name}` has {} values; its tensor has {}",
                    g.len(),
                    w.len()
                ),
            });
        }
        let dsinks_len = input.mods.sinks.map_or(0, <[f32]>::len);
        length(
            "dsinks",
            grads.dsinks.len(),
            dsinks_len as u64,
            "the length of sinks",
        )?;
        let rows = u64::from(input.batch) * u64::from(input.seq_len) * u64::from(h.n_heads);
        let q_len = rows * u64::from(h.head_dim);
        let q_layout = "batch × seq_len × n_heads × head_dim";
        let (o_len, o_layout) = (
            rows * u64::from(h.head_dim_v),
            "batch × seq_len × n_heads × head_dim_v",
        );
        length("o", input.o.len(), o_len, o_layout)?;
        length("d_o", input.d_o.len(), o_len, o_layout)?;
        length("lse", input.lse.len(), rows, "batch × seq_len × n_heads")?;
        length("dq", grads.dq.len(), q_len, q_layout)?;
        length(
            "dk",
            grads.dk.len(),
            input.k.len() as u64,
            "the length of k",
        )?;
        length(
            "dv",
            grads.dv.len(),
            input.v.len() as u64,
            "the length of v",
        )?;
        Ok(set)
    }
}
