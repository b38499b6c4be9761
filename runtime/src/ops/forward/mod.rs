//! The forward on device tensors: O and LSE of Q, K, V, recorded into the caller's
//! encoder. A [`Forward`] built from a [`ForwardSpec`] picks the flash configuration per
//! problem (the adapter's tuning table, tensor cores where the dtype and the adapter allow)
//! and compiles each configuration on the first call that needs it; one built from a
//! kernel runs that kernel.

// The host-slice convenience: host data checked, uploaded, run, read back.
mod host;
pub use host::*;

use attn_dsl::{FlashConfig, KernelAbi, Op};

use super::row_max::RowMaxima;
use super::{attention_shape, expect_all, grid};
use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::dispatch::record::{Dispatch, Pipeline};
use crate::dispatch::recorder::Record;
use crate::error::{Error, InputError};
use crate::modifiers::DeviceModifiers;
use crate::plan::kernels;
pub use crate::plan::kernels::AttentionSpec;
use crate::plan::tuning::{self, Table};
use crate::shape::{Heads, expect_op, sequence_dims, validate_heads, validate_scale};
use crate::tensor::{Tensor, TensorError};

/// What a planned forward computes: the attention's widths, masks and dtype.
pub type ForwardSpec = AttentionSpec;

/// The flash forward of `spec` under `config`, compiled now.
fn compile(spec: &ForwardSpec, config: FlashConfig) -> Result<KernelAbi, Error> {
    kernels::flash_forward(*spec, config).map_err(|e| Error::Pipeline {
        kernel: format!("forward d{} {}", spec.head_dim, config.label()),
        message: e.to_string(),
    })
}

/// One call's tensors: Q `[batch, seq, n_heads, head_dim]`, K `[batch, seq, n_kv_heads,
/// head_dim]`, V `[batch, seq, n_kv_heads, head_dim_v]`, O `[batch, seq, n_heads,
/// head_dim_v]` (all in the kernel's dtype), LSE `[batch, seq, n_heads]` f32.
#[derive(Clone, Copy, Debug)]
pub struct ForwardArgs<'a> {
    /// The queries.
    pub q: &'a Tensor,
    /// The keys.
    pub k: &'a Tensor,
    /// The values.
    pub v: &'a Tensor,
    /// The output, written.
    pub o: &'a Tensor,
    /// Each row's log-sum-exp, written (`+inf` for a row with no visible key).
    pub lse: &'a Tensor,
    /// Each row's document start and end, `[2, batch, seq]` u32 (see
    /// [`crate::ops::forward::documents`]); `None` is one document per sequence. Only for
    /// kernels built with the document mask.
    pub seg: Option<&'a Tensor>,
    /// Defaults to `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// The values of the kernel's score modifiers and masks.
    pub mods: DeviceModifiers<'a>,
}

impl<'a> ForwardArgs<'a> {
    /// The tensors, with one document per sequence, the default scale and no modifiers.
    pub fn new(
        q: &'a Tensor,
        k: &'a Tensor,
        v: &'a Tensor,
        o: &'a Tensor,
        lse: &'a Tensor,
    ) -> ForwardArgs<'a> {
        ForwardArgs {
            q,
            k,
            v,
            o,
            lse,
            seg: None,
            scale: None,
            mods: DeviceModifiers::default(),
        }
    }

    /// Q, K, V, O and LSE, by the names the kernels bind them at.
    fn io(&self) -> [(&'static str, &'a Tensor); 5] {
        [
            ("q", self.q),
            ("k", self.k),
            ("v", self.v),
            ("o", self.o),
            ("lse", self.lse),
        ]
    }
}

enum Kernels {
    /// Configurations planned per problem, compiled on first use.
    Planned {
        spec: ForwardSpec,
        table: Table,
        plans: Vec<((u32, u32, u32), FlashConfig)>,
        compiled: Vec<(FlashConfig, Pipeline)>,
    },
    Fixed(Pipeline),
}

/// The forward op: its kernel (planned per problem, or fixed), recorded into the caller's
/// encoder by [`Forward::record`].
pub struct Forward {
    kernels: Kernels,
    /// One document per sequence, for kernels with the document mask called without `seg`.
    whole: Option<Tensor>,
    /// With bf16 operands on tensor cores: each row's largest magnitude of Q, K and V.
    row_max: RowMaxima,
}

impl Forward {
    /// A forward that plans its kernel per problem; nothing is compiled yet, but the spec
    /// is checked (a head_dim without a configuration, masks the op cannot take).
    pub fn new(gpu: &Gpu, spec: ForwardSpec) -> Result<Forward, Error> {
        let spec = ForwardSpec {
            masks: gpu.masks(spec.masks),
            ..spec
        };
        let config = tuning::forward_candidates(spec.width())
            .first()
            .copied()
            .ok_or(InputError::Unsupported {
                what: "the flash forward at this head_dim",
                needs: "a head_dim that is a multiple of 4, from 4 to 256",
            })?;
        compile(&spec, config)?;
        Ok(Forward {
            kernels: Kernels::Planned {
                spec,
                table: Table::for_gpu(gpu)?,
                plans: Vec::new(),
                compiled: Vec::new(),
            },
            whole: None,
            row_max: RowMaxima::default(),
        })
    }

    /// A forward that runs `kernel` (a user's `attention_kernel!` with `op: forward`).
    pub fn from_kernel(kernel: &Kernel) -> Result<Forward, Error> {
        expect_op(kernel.abi(), Op::Forward)?;
        Ok(Forward {
            kernels: Kernels::Fixed(Pipeline::new(kernel.clone())),
            whole: None,
            row_max: RowMaxima::default(),
        })
    }

    /// The kernel a problem of this shape runs, compiled now if it was not yet.
    pub fn kernel_for(
        &mut self,
        gpu: &Gpu,
        batch: u32,
        seq_len: u32,
        heads: Heads,
    ) -> Result<&Kernel, Error> {
        Ok(self.pipeline(gpu, batch, seq_len, heads)?.kernel())
    }

    /// Compiles the kernel a problem of this shape runs, awaiting the device's report:
    /// in a browser, where `record` cannot wait for it, call this first.
    pub async fn prepare(
        &mut self,
        gpu: &Gpu,
        batch: u32,
        seq_len: u32,
        heads: Heads,
    ) -> Result<(), Error> {
        if let Some(abi) = self.uncompiled(gpu, batch, seq_len, heads)? {
            let kernel = Kernel::new(gpu, &abi).await?;
            self.hold(kernel, batch, seq_len, heads);
        }
        Ok(())
    }

    /// Checks `args` as [`Forward::record`] would (compiling its kernel), recording
    /// nothing.
    pub fn check(&mut self, gpu: &Gpu, args: &ForwardArgs) -> Result<(), Error> {
        let (batch, seq, heads) = attention_shape(args.q, args.k, args.v)?;
        let seg = self.seg(gpu, args.seg, batch, seq);
        let pipeline = self.pipeline(gpu, batch, seq, heads)?;
        check(pipeline.abi(), args, batch, seq, heads, seg.as_ref())?;
        let mut given = args.io().to_vec();
        given.extend(args.seg.map(|t| ("seg", t)));
        given.extend(args.mods.tensors());
        let written = ["o", "lse"];
        crate::dispatch::record::check_given(gpu, &[pipeline.abi()], &given, &written)?;
        Ok(())
    }

    /// Records the forward of `args` into `encoder`: O and LSE overwritten.
    pub fn record(
        &mut self,
        gpu: &Gpu,
        encoder: &mut impl Record,
        args: &ForwardArgs,
    ) -> Result<(), Error> {
        encoder.recorder(|rec| {
            let (batch, seq, heads) = attention_shape(args.q, args.k, args.v)?;
            let seg = self.seg(gpu, args.seg, batch, seq);
            let scaled = {
                let abi = self.pipeline(gpu, batch, seq, heads)?.abi();
                check(abi, args, batch, seq, heads, seg.as_ref())?;
                abi.binding("row_max").is_some()
            };
            let row_max = match scaled {
                true => {
                    let rows = [batch, seq, heads.n_heads];
                    let operands = [args.q, args.k, args.v];
                    Some(self.row_max.record(gpu, rec, &operands, rows)?)
                }
                false => None,
            };
            let pipeline = self.pipeline(gpu, batch, seq, heads)?;
            let abi = pipeline.abi();
            let mut tensors = args.io().to_vec();
            tensors.extend(row_max.as_ref().map(|t| ("row_max", t)));
            tensors.extend(
                seg.as_ref()
                    .filter(|_| abi.masks.document)
                    .map(|s| ("seg", s)),
            );
            tensors.extend(args.mods.tensors());
            let mut d = Dispatch::new(tensors);
            d.dims = sequence_dims(batch, seq, heads).to_vec();
            d.dims.extend(args.mods.dims());
            d.params = vec![("scale", args.scale.unwrap_or(heads.default_scale()))];
            d.params.extend(args.mods.params());
            let g = grid(abi, &d.dims);
            pipeline.record(gpu, rec, &d, g)
        })
    }

    /// The `seg` to bind: the caller's, or one document per sequence.
    fn seg(&mut self, gpu: &Gpu, given: Option<&Tensor>, batch: u32, seq: u32) -> Option<Tensor> {
        if let Some(s) = given {
            return Some(s.clone());
        }
        crate::ops::whole_sequences(&mut self.whole, gpu, batch, seq).ok()
    }

    /// The ABI a shape runs when its pipeline is not compiled yet.
    fn uncompiled(
        &mut self,
        gpu: &Gpu,
        batch: u32,
        seq: u32,
        heads: Heads,
    ) -> Result<Option<KernelAbi>, Error> {
        let config = match &self.kernels {
            Kernels::Fixed(_) => return Ok(None),
            Kernels::Planned { .. } => plan(&mut self.kernels, gpu, batch, seq, heads)?,
        };
        let Kernels::Planned { spec, compiled, .. } = &self.kernels else {
            return Ok(None);
        };
        if compiled.iter().any(|(c, _)| *c == config) {
            return Ok(None);
        }
        Ok(Some(compile(spec, config)?))
    }

    fn hold(&mut self, kernel: Kernel, batch: u32, seq: u32, heads: Heads) {
        let key = (batch, seq, heads.n_heads);
        if let Kernels::Planned {
            plans, compiled, ..
        } = &mut self.kernels
            && let Some((_, config)) = plans.iter().find(|(k, _)| *k == key)
        {
            compiled.push((*config, Pipeline::new(kernel)));
        }
    }

    fn pipeline(
        &mut self,
        gpu: &Gpu,
        batch: u32,
        seq: u32,
        heads: Heads,
    ) -> Result<&mut Pipeline, Error> {
        if let Some(abi) = self.uncompiled(gpu, batch, seq, heads)? {
            let kernel = Kernel::now(gpu, &abi)?;
            self.hold(kernel, batch, seq, heads);
        }
        match &mut self.kernels {
            Kernels::Fixed(p) => Ok(p),
            Kernels::Planned {
                plans, compiled, ..
            } => {
                let key = (batch, seq, heads.n_heads);
                let config = plans
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, c)| *c)
                    .expect("planned above");
                Ok(compiled
                    .iter_mut()
                    .find(|(c, _)| *c == config)
                    .map(|(_, p)| p)
                    .expect("compiled above"))
            }
        }
    }
}

/// The configuration of a planned forward for a shape, decided once per shape.
fn plan(
    kernels: &mut Kernels,
    gpu: &Gpu,
    batch: u32,
    seq: u32,
    heads: Heads,
) -> Result<FlashConfig, Error> {
    let Kernels::Planned {
        spec, table, plans, ..
    } = kernels
    else {
        unreachable!("only planned forwards plan");
    };
    if heads.head_dim != spec.head_dim {
        return Err(InputError::HeadDim {
            kernel: format!("forward d{}", spec.head_dim),
            kernel_head_dim: spec.head_dim,
            given: heads.head_dim,
        }
        .into());
    }
    if heads.head_dim_v != spec.head_dim_v {
        return Err(InputError::HeadDimV {
            kernel: format!("forward d{}", spec.head_dim),
            kernel_head_dim_v: spec.head_dim_v,
            given: heads.head_dim_v,
        }
        .into());
    }
    let key = (batch, seq, heads.n_heads);
    if let Some((_, c)) = plans.iter().find(|(k, _)| *k == key) {
        return Ok(*c);
    }
    let config = table
        .forward_for(gpu, heads, (batch, seq), spec.dtype)
        .ok_or(InputError::Unsupported {
            what: "the flash forward at this head_dim",
            needs: "a head_dim that is a multiple of 4, from 4 to 256",
        })?;
    plans.push((key, config));
    Ok(config)
}

/// Every tensor's shape and dtype, the heads, the scale, the modifiers and `seg` against
/// the kernel.
fn check(
    abi: &KernelAbi,
    args: &ForwardArgs,
    batch: u32,
    seq: u32,
    h: Heads,
    seg: Option<&Tensor>,
) -> Result<(), InputError> {
    validate_heads(abi, h)?;
    validate_scale(args.scale)?;
    let q = vec![batch, seq, h.n_heads, h.head_dim];
    let k = vec![batch, seq, h.n_kv_heads, h.head_dim];
    let v = vec![batch, seq, h.n_kv_heads, h.head_dim_v];
    let o = vec![batch, seq, h.n_heads, h.head_dim_v];
    expect_all(
        abi,
        &[
            ("q", args.q, q, "[batch, seq, n_heads, head_dim]"),
            ("k", args.k, k, "[batch, seq, n_kv_heads, head_dim]"),
            ("v", args.v, v, "[batch, seq, n_kv_heads, head_dim_v]"),
            ("o", args.o, o, "[batch, seq, n_heads, head_dim_v]"),
            (
                "lse",
                args.lse,
                vec![batch, seq, h.n_heads],
                "[batch, seq, n_heads]",
            ),
        ],
    )?;
    args.mods.validate(abi, batch, (seq, seq), h.n_heads)?;
    match (args.seg, abi.masks.document) {
        (Some(_), false) => Err(InputError::SegWithoutDocumentMask {
            kernel: abi.name.to_string(),
        }),
        (_, true) => {
            let seg = seg.ok_or(TensorError::Data {
                name: "seg".into(),
                got: 0,
                want: 2 * u64::from(batch) * u64::from(seq),
            })?;
            expect_all(abi, &[("seg", seg, vec![2, batch, seq], "[2, batch, seq]")])?;
            Ok(())
        }
        (None, false) => Ok(()),
    }
}

/// The `seg` tensor of documents given by their starts (`[batch, seq]`, as
/// [`crate::ForwardInput::seg`]), checked and uploaded with each row's document end.
pub fn documents(gpu: &Gpu, starts: &[u32], batch: u32, seq: u32) -> Result<Tensor, Error> {
    crate::shape::length(
        "seg",
        starts.len(),
        u64::from(batch) * u64::from(seq),
        "batch × seq",
    )?;
    for (b, rows) in starts.chunks(seq.max(1) as usize).enumerate() {
        crate::shape::validate_seg(rows).map_err(|e| match e {
            InputError::Seg {
                index,
                value,
                reason,
            } => InputError::Seg {
                index: b * seq as usize + index,
                value,
                reason,
            },
            other => other,
        })?;
    }
    let ends = crate::shape::seg_with_ends(Some(starts), batch, seq).ok_or(TensorError::Data {
        name: "seg".into(),
        got: starts.len(),
        want: u64::from(batch) * u64::from(seq),
    })?;
    Tensor::from_u32(gpu, &[2, batch, seq], &ends)
}
