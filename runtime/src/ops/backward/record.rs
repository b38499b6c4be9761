//! The backward on device tensors, in any schedule, recorded into the caller's encoder:
//! dQ, dK, dV (and dBias) of a forward's Q, K, V, O, LSE and the upstream dO. The op's
//! scratch (the packed LSE and D, the split schedule's P and dS, the streaming schedule's
//! dK/dV lanes) is its own, grown on demand and reused.

use attn_dsl::{Dtype, KernelSpec, Masks, Op, Scalar};

use super::{Backward, Schedule, needs_prep};
use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::dispatch::record::{Dispatch, Pipeline};
use crate::dispatch::recorder::{Record, Recorder};
use crate::error::{Error, InputError};
use crate::modifiers::DeviceModifiers;
use crate::ops::row_max::RowMaxima;
use crate::ops::{attention_shape, expect_all, grid, helper};
use crate::shape::{Heads, sequence_dims, validate_heads, validate_scale};
use crate::tensor::{Tensor, TensorError, elements};

/// One call's tensors, laid out as the forward's: Q `[batch, seq, n_heads, head_dim]`, K
/// `[batch, seq, n_kv_heads, head_dim]`, V `[batch, seq, n_kv_heads, head_dim_v]`, O and dO
/// `[batch, seq, n_heads, head_dim_v]` in the backward's dtype; LSE `[batch, seq, n_heads]`
/// and the gradients in f32 (dQ like Q, dK like K, dV like V).
#[derive(Clone, Copy, Debug)]
pub struct BackwardArgs<'a> {
    /// The forward's queries.
    pub q: &'a Tensor,
    /// The forward's keys.
    pub k: &'a Tensor,
    /// The forward's values.
    pub v: &'a Tensor,
    /// The forward's output.
    pub o: &'a Tensor,
    /// The forward's log-sum-exp.
    pub lse: &'a Tensor,
    /// The gradient of the loss with respect to O.
    pub d_o: &'a Tensor,
    /// dQ, written (or added into).
    pub dq: &'a Tensor,
    /// dK, written (or added into).
    pub dk: &'a Tensor,
    /// dV, written (or added into).
    pub dv: &'a Tensor,
    /// dBias, in the bias's layout, with a bias.
    pub dbias: Option<&'a Tensor>,
    /// dSinks `[n_heads]` f32, with sinks (summed over the batch and rows by the
    /// `sink_grad` kernel after the schedule's, so owned: no atomics).
    pub dsinks: Option<&'a Tensor>,
    /// The gradients of the modifier tensors declared `grad`, by gradient name
    /// (`d<name>`, e.g. `drel_bias`), each f32 in its tensor's shape; empty without any.
    pub flex_grads: &'a [(&'a str, &'a Tensor)],
    /// As the forward's: `[2, batch, seq]` u32, or one document per sequence.
    pub seg: Option<&'a Tensor>,
    /// The forward's scale; defaults to `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// The forward's modifier values (the same dropout seed and offset regenerate its mask).
    pub mods: DeviceModifiers<'a>,
    /// Add into the gradients (micro-steps); `false` overwrites them (cleared first, so
    /// their buffers need COPY_DST).
    pub accumulate: bool,
}

/// Most lanes of a modifier tensor's compensated sums: the atomics on one element spread
/// over as many addresses (a T5 table's few hundred elements take every pair's add).
pub const FLEX_LANES: u64 = 64;

/// Bytes the lanes of one modifier tensor's gradient may take.
pub const FLEX_SCRATCH: u64 = 16 << 20;

/// The backward's scratch, each grown to the largest call.
#[derive(Default)]
pub struct Scratch {
    /// LSE and D, `[2, batch, seq, n_heads]`.
    stats: Option<Tensor>,
    /// The split schedule's P and dS, `[2, batch, seq, n_heads, seq]`.
    p_ds: Option<Tensor>,
    /// The streaming schedule's dK/dV lanes, `[lanes, batch, seq, n_kv_heads, head_dim +
    /// head_dim_v]`: each lane dK's rows, then dV's.
    dkv: Option<Tensor>,
    /// dSinks' sums per block of rows, `[2, n_heads, n_blocks]` (hi, lo).
    sink_parts: Option<Tensor>,
    /// The `seg` of whole sequences, for a call without one.
    whole: Option<Tensor>,
    /// The kernel that sums the lanes into dK and dV.
    lanes: Option<Pipeline>,
    /// Per modifier tensor's gradient, in order: its compensated sums `[lanes, 2, len]`.
    flex_pairs: Vec<Option<Tensor>>,
    /// The kernel that adds a compensated sum into its gradient.
    fold: Option<Pipeline>,
    /// With bf16 operands on tensor cores: each row's largest magnitude of Q, K, V, O and
    /// dO.
    row_max: RowMaxima,
}

impl Scratch {
    /// Bytes held (the split schedule's P and dS).
    pub fn held(&self) -> u64 {
        self.p_ds.as_ref().map_or(0, |t| t.bytes())
    }

    fn view(held: &mut Option<Tensor>, gpu: &Gpu, shape: &[u32]) -> Result<Tensor, Error> {
        crate::ops::scratch(held, gpu, shape, Scalar::F32)
    }

    fn lanes(&mut self, gpu: &Gpu) -> Result<&mut Pipeline, Error> {
        let name = "attention_dkv_reduce";
        helper(
            gpu,
            &mut self.lanes,
            KernelSpec::standard(name, Op::DkvReduce, 4, Masks::default()),
        )
    }

    fn fold(&mut self, gpu: &Gpu) -> Result<&mut Pipeline, Error> {
        let name = "attention_grad_fold";
        helper(
            gpu,
            &mut self.fold,
            KernelSpec::standard(name, Op::GradFold, 4, Masks::default()),
        )
    }
}

impl Scratch {
    /// The compensated sums of `grads` (cleared through `rec`, before any dispatch), in order, each with its
    /// lanes: as many as [`FLEX_LANES`] where the scratch stays within [`FLEX_SCRATCH`].
    fn flex_pairs(
        &mut self,
        gpu: &Gpu,
        rec: &mut Recorder,
        grads: &[(&str, &Tensor)],
    ) -> Result<Vec<(Tensor, u32)>, Error> {
        self.flex_pairs
            .resize_with(self.flex_pairs.len().max(grads.len()), || None);
        let pairs = grads
            .iter()
            .zip(&mut self.flex_pairs)
            .map(|((_, g), held)| {
                let len = g.len().max(1);
                let lanes = (FLEX_SCRATCH / (8 * len)).clamp(1, FLEX_LANES) as u32;
                Ok((Scratch::view(held, gpu, &[lanes, 2, len as u32])?, lanes))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        for (p, _) in &pairs {
            p.record_clear(rec.encoder());
        }
        Ok(pairs)
    }
}

impl<'a> BackwardArgs<'a> {
    /// Q, K, V, O, LSE, dO and the three gradients, by the names the kernels bind them at.
    fn io(&self) -> [(&'static str, &'a Tensor); 9] {
        [
            ("q", self.q),
            ("k", self.k),
            ("v", self.v),
            ("o", self.o),
            ("lse", self.lse),
            ("d_o", self.d_o),
            ("dq", self.dq),
            ("dk", self.dk),
            ("dv", self.dv),
        ]
    }
}

/// The caller's tensors against the schedule's kernels before anything is recorded (the
/// gradients are cleared before the first dispatch, which would otherwise check them),
/// each gradient sharing its buffer with no other tensor of the call.
fn check_bindings(
    gpu: &Gpu,
    abis: &[attn_dsl::KernelAbi],
    args: &BackwardArgs,
) -> Result<(), Error> {
    let mut given = args.io().to_vec();
    given.extend(args.dbias.map(|t| ("dbias", t)));
    given.extend(args.dsinks.map(|t| ("dsinks", t)));
    given.extend(args.flex_grads.iter().copied());
    given.extend(args.seg.map(|t| ("seg", t)));
    given.extend(args.mods.tensors());
    let mut written = vec!["dq", "dk", "dv", "dbias", "dsinks"];
    written.extend(args.flex_grads.iter().map(|(n, _)| *n));
    let abis: Vec<&attn_dsl::KernelAbi> = abis.iter().collect();
    Ok(crate::dispatch::record::check_given(
        gpu, &abis, &given, &written,
    )?)
}

/// The dtype a tensor of the forward's holds.
fn dtype_of(t: &Tensor) -> Result<Dtype, TensorError> {
    t.scalar().dtype().ok_or(TensorError::Dtype {
        name: "q".into(),
        got: "u32",
        want: "f32, f16 or bf16",
    })
}

impl Backward {
    /// Records the backward of `args` into `encoder` by `schedule`, or the planner's choice;
    /// returns the schedule recorded. The schedule's pipelines are created on its first
    /// call; the dtype is Q's (half precision needs a [`BackwardSpec`](super::BackwardSpec)
    /// in that dtype first: [`Backward::new`], [`Backward::add`]).
    pub fn record(
        &mut self,
        gpu: &Gpu,
        encoder: &mut impl Record,
        args: &BackwardArgs,
        schedule: Option<Schedule>,
    ) -> Result<Schedule, Error> {
        encoder.recorder(|rec| {
            let (batch, seq, h) = attention_shape(args.q, args.k, args.v)?;
            let dtype = dtype_of(args.q)?;
            let set = self.set_of(h.dims(), dtype)?;
            let (schedule, at) = self.schedule_for(gpu, set, schedule, (batch, seq, h), dtype)?;
            check(
                &self.compiled[set].schedules[at].abis[0],
                args,
                batch,
                seq,
                h,
            )?;
            check_bindings(gpu, &self.compiled[set].schedules[at].abis, args)?;
            if schedule == Schedule::Split {
                let bytes = schedule.scratch_bytes(batch, seq, h.n_heads);
                crate::shape::binding_size(gpu.limits(), bytes)?;
            }
            // Pipelines first: a schedule that does not compile records nothing.
            let c = &mut self.compiled[set];
            let prep_needed = needs_prep(&c.schedules[at].abis.iter().collect::<Vec<_>>());
            if prep_needed && c.prep.is_none() {
                c.prep = Some(Pipeline::new(Kernel::now(gpu, &c.prep_abi)?));
            }
            if c.schedules[at].pipelines.is_none() {
                let compiled = c.schedules[at]
                    .abis
                    .iter()
                    .map(|abi| Ok(Pipeline::new(Kernel::now(gpu, abi)?)))
                    .collect::<Result<Vec<_>, Error>>()?;
                c.schedules[at].pipelines = Some(compiled);
            }
            let packed = c.schedules[at]
                .abis
                .iter()
                .any(|a| a.binding("dkv").is_some());
            if packed {
                self.scratch.lanes(gpu)?;
            }
            if !args.flex_grads.is_empty() {
                self.scratch.fold(gpu)?;
            }
            let rows = [batch, seq, h.n_heads];
            let stats = Scratch::view(
                &mut self.scratch.stats,
                gpu,
                &[2, rows[0], rows[1], rows[2]],
            )?;
            let p_ds = match schedule {
                Schedule::Split => Some(Scratch::view(
                    &mut self.scratch.p_ds,
                    gpu,
                    &[2, batch, seq, h.n_heads, seq],
                )?),
                _ => None,
            };
            let lanes = attn_dsl::DKV_LANES;
            // Each lane holds dK's rows, then dV's, each at its width.
            let dkv = match packed {
                true => Some(Scratch::view(
                    &mut self.scratch.dkv,
                    gpu,
                    &[lanes, batch, seq, h.n_kv_heads, h.head_dim + h.head_dim_v],
                )?),
                false => None,
            };
            let whole;
            let seg = match args.seg {
                Some(s) => s,
                None => {
                    whole = crate::ops::whole_sequences(&mut self.scratch.whole, gpu, batch, seq)?;
                    &whole
                }
            };
            if !args.accumulate {
                for (name, t) in [("dq", args.dq), ("dk", args.dk), ("dv", args.dv)]
                    .into_iter()
                    .chain(args.dbias.map(|t| ("dbias", t)))
                    .chain(args.dsinks.map(|t| ("dsinks", t)))
                    .chain(args.flex_grads.iter().copied())
                {
                    t.check_copy_dst(gpu, name)?;
                }
            }
            // The kernels add a modifier tensor's gradient into a compensated sum, folded into the
            // caller's gradient after them.
            let pairs = self.scratch.flex_pairs(gpu, rec, args.flex_grads)?;
            // Clears before the first dispatch: each ends the recorder's compute pass.
            if !args.accumulate {
                let grads = [args.dq, args.dk, args.dv].into_iter();
                let flex = args.flex_grads.iter().map(|(_, t)| *t);
                for t in grads.chain(args.dbias).chain(args.dsinks).chain(flex) {
                    t.record_clear(rec.encoder());
                }
            }
            if let Some(t) = &dkv {
                t.record_clear(rec.encoder());
            }
            let scaled = binds(&self.compiled[set].schedules[at].abis, "row_max");
            let row_max = match scaled {
                true => {
                    let operands = [args.q, args.k, args.v, args.o, args.d_o];
                    Some(self.scratch.row_max.record(gpu, rec, &operands, rows)?)
                }
                false => None,
            };
            let mut tensors = args.io().to_vec();
            tensors.extend([("seg", seg), ("stats", &stats)]);
            tensors.extend(args.dbias.map(|t| ("dbias", t)));
            tensors.extend(p_ds.as_ref().map(|t| ("p_ds", t)));
            tensors.extend(dkv.as_ref().map(|t| ("dkv", t)));
            tensors.extend(row_max.as_ref().map(|t| ("row_max", t)));
            tensors.extend(args.mods.tensors());
            tensors.extend(
                args.flex_grads
                    .iter()
                    .zip(&pairs)
                    .map(|((n, _), (p, _))| (*n, p)),
            );
            let mut d = Dispatch::new(tensors);
            d.dims = sequence_dims(batch, seq, h).to_vec();
            d.dims.extend(args.mods.dims());
            d.params = vec![("scale", args.scale.unwrap_or(h.default_scale()))];
            d.params.extend(args.mods.params());
            let c = &mut self.compiled[set];
            let prep = c.prep.as_mut().filter(|_| prep_needed);
            let pipelines = c.schedules[at].pipelines.as_mut().expect("compiled above");
            for pipeline in prep.into_iter().chain(pipelines.iter_mut()) {
                let g = grid(pipeline.abi(), &d.dims);
                pipeline.record(gpu, rec, &d, g)?;
            }
            if let Some(dsinks) = args.dsinks {
                let sinks = args.mods.sinks.expect("checked: dsinks comes with sinks");
                let grad = self.compiled[set].sink_grad(gpu)?;
                let blocks = (batch * seq).div_ceil(grad.abi().workgroup_size[0]);
                let parts =
                    Scratch::view(&mut self.scratch.sink_parts, gpu, &[2, h.n_heads, blocks])?;
                // Pass 0 sums each block of rows, pass 1 each head's blocks in order.
                for pass in [0, 1] {
                    let mut s = Dispatch::new(vec![
                        ("o", args.o),
                        ("d_o", args.d_o),
                        ("lse", args.lse),
                        ("sinks", sinks),
                        ("dsinks_part", &parts),
                        ("dsinks", dsinks),
                    ]);
                    s.dims = sequence_dims(batch, seq, h).to_vec();
                    s.dims.extend([("n_slices", blocks), ("sink_pass", pass)]);
                    let g = grid(grad.abi(), &s.dims);
                    grad.record(gpu, rec, &s, g)?;
                }
            }
            for ((_, grad), (pair, lanes)) in args.flex_grads.iter().zip(&pairs) {
                let fold = Dispatch {
                    tensors: vec![("pair", pair), ("grad", grad)],
                    dims: vec![("len", grad.len() as u32), ("parts", 2 * *lanes)],
                    params: Vec::new(),
                };
                let fold_pipeline = self.scratch.fold(gpu)?;
                let g = grid(fold_pipeline.abi(), &fold.dims);
                fold_pipeline.record(gpu, rec, &fold, g)?;
            }
            if let Some(dkv) = &dkv {
                let len4 = |t: &Tensor| (elements(t.shape()) / 4) as u32;
                let reduce = Dispatch {
                    tensors: vec![("dkv", dkv), ("dk", args.dk), ("dv", args.dv)],
                    dims: vec![("len4", len4(args.dk)), ("len4_v", len4(args.dv))],
                    params: Vec::new(),
                };
                let lanes = self.scratch.lanes(gpu)?;
                let g = grid(lanes.abi(), &reduce.dims);
                lanes.record(gpu, rec, &reduce, g)?;
            }
            Ok(schedule)
        })
    }
}

/// Whether any of `abis` binds `name`.
fn binds(abis: &[attn_dsl::KernelAbi], name: &str) -> bool {
    abis.iter().any(|a| a.binding(name).is_some())
}

/// Shapes and dtypes of every tensor, the heads, the scale, the modifiers and `seg`
/// against the schedule's first kernel.
fn check(
    abi: &attn_dsl::KernelAbi,
    args: &BackwardArgs,
    batch: u32,
    seq: u32,
    h: Heads,
) -> Result<(), InputError> {
    validate_heads(abi, h)?;
    validate_scale(args.scale)?;
    let q = vec![batch, seq, h.n_heads, h.head_dim];
    let kv = vec![batch, seq, h.n_kv_heads, h.head_dim];
    let o = vec![batch, seq, h.n_heads, h.head_dim_v];
    let v = vec![batch, seq, h.n_kv_heads, h.head_dim_v];
    let (ql, kvl) = (
        "[batch, seq, n_heads, head_dim]",
        "[batch, seq, n_kv_heads, head_dim]",
    );
    let (ol, vl) = (
        "[batch, seq, n_heads, head_dim_v]",
        "[batch, seq, n_kv_heads, head_dim_v]",
    );
    let data = abi.scalar("q");
    let f32 = Scalar::F32;
    use crate::modifiers::expect;
    expect(args.q, "q", &q, data, ql)?;
    expect(args.k, "k", &kv, data, kvl)?;
    expect(args.v, "v", &v, data, vl)?;
    expect(args.o, "o", &o, data, ol)?;
    expect(args.d_o, "d_o", &o, data, ol)?;
    expect(
        args.lse,
        "lse",
        &[batch, seq, h.n_heads],
        f32,
        "[batch, seq, n_heads]",
    )?;
    expect(args.dq, "dq", &q, f32, ql)?;
    expect(args.dk, "dk", &kv, f32, kvl)?;
    expect(args.dv, "dv", &v, f32, vl)?;
    args.mods.validate(abi, batch, (seq, seq), h.n_heads)?;
    match (args.mods.bias, args.dbias) {
        (Some(b), Some(db)) => expect(db, "dbias", b.values.shape(), f32, "the bias's layout")?,
        (None, Some(_)) => {
            return Err(InputError::Modifier {
                kernel: abi.name.to_string(),
                word: "bias",
                built: abi.masks.bias.is_some(),
            });
        }
        (Some(_), None) => {
            return Err(TensorError::Data {
                name: "dbias".into(),
                got: 0,
                want: elements(args.mods.bias.map(|b| b.values.shape()).unwrap_or(&[])),
            }
            .into());
        }
        (None, None) => {}
    }
    check_flex_grads(abi, args)?;
    match (args.mods.sinks, args.dsinks) {
        (Some(s), Some(ds)) => expect(ds, "dsinks", s.shape(), f32, "[n_heads]")?,
        (None, Some(_)) => {
            return Err(InputError::Modifier {
                kernel: abi.name.to_string(),
                word: "sinks",
                built: abi.masks.sinks,
            });
        }
        (Some(_), None) => {
            return Err(TensorError::Data {
                name: "dsinks".into(),
                got: 0,
                want: u64::from(h.n_heads),
            }
            .into());
        }
        (None, None) => {}
    }
    match args.seg {
        Some(_) if !abi.masks.document => Err(InputError::SegWithoutDocumentMask {
            kernel: abi.name.to_string(),
        }),
        Some(seg) => Ok(expect_all(
            abi,
            &[("seg", seg, vec![2, batch, seq], "[2, batch, seq]")],
        )?),
        None => Ok(()),
    }
}

/// One gradient per tensor the modifiers declare `grad`, in that tensor's shape, f32, and
/// nothing else.
fn check_flex_grads(abi: &attn_dsl::KernelAbi, args: &BackwardArgs) -> Result<(), InputError> {
    let refuse = |message: String| {
        Err(InputError::Flex {
            kernel: abi.name.to_string(),
            message,
        })
    };
    let declared = args.mods.flex.map(|f| (f, f.modifiers.get()));
    let grad_of = |name: &str| {
        let (f, flex) = declared.as_ref()?;
        let t = flex
            .tensors
            .iter()
            .find(|t| t.grad_name().as_deref() == Some(name))?;
        Some((t.name.clone(), f.tensor(&t.name)?))
    };
    for (n, (name, grad)) in args.flex_grads.iter().enumerate() {
        let Some((tensor, values)) = grad_of(name) else {
            return refuse(format!(
                "`{name}` is not the gradient of a tensor the kernel's `tensors` declare `grad`"
            ));
        };
        if args.flex_grads[..n].iter().any(|(m, _)| m == name) {
            return refuse(format!("gradient `{name}` is given twice"));
        }
        crate::modifiers::expect(
            grad,
            name,
            values.shape(),
            Scalar::F32,
            "its tensor's shape, f32",
        )
        .map_err(|e| InputError::Flex {
            kernel: abi.name.to_string(),
            message: format!("the gradient of `{tensor}`: {e}"),
        })?;
    }
    if let Some((_, flex)) = &declared
        && let Some(t) = flex.tensors.iter().find(|t| {
            t.grad_name()
                .is_some_and(|g| !args.flex_grads.iter().any(|(n, _)| *n == g))
        })
    {
        return refuse(format!(
            "tensor `{}` is declared `grad`: pass its gradient `d{}` ({}) in `flex_grads`",
            t.name,
            t.name,
            t.describe()
        ));
    }
    Ok(())
}
