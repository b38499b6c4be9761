//! Attention states merged on the device: the outputs and log-sum-exps of attention over
//! parts of the keys (of one query set) into those of attention over all of them, as
//! FlashInfer's `merge_states` and ring attention's combine. Each part is what a forward,
//! a chunk or a decode writes (O normalized over its keys, LSE); the merge is exact up to
//! f32 rounding, whatever the split. A part with no key (LSE ±inf) weighs nothing; sinks
//! join the denominator once, here, so the parts are made without them.

use attn_dsl::{Dtype, KernelSpec, Masks, Op, Scalar};

use super::grid;
use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::dispatch::record::{Dispatch, Pipeline};
use crate::dispatch::recorder::Record;
use crate::error::{Error, InputError};
use crate::modifiers::expect;
use crate::tensor::Tensor;

/// What a merge computes: outputs `head_dim_v` wide in `dtype`, with or without sinks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MergeSpec {
    /// The width of the O rows merged.
    pub head_dim_v: u32,
    /// The element type of the O parts and the merged O.
    pub dtype: Dtype,
    /// A logit per query head joins the merged denominator (the parts carry none).
    pub sinks: bool,
}

impl MergeSpec {
    /// Outputs `head_dim_v` wide in `dtype`, no sinks.
    pub fn new(head_dim_v: u32, dtype: Dtype) -> MergeSpec {
        MergeSpec {
            head_dim_v,
            dtype,
            sinks: false,
        }
    }
}

/// One merge: `o_parts` `[parts, batch, seq, n_heads, head_dim_v]` in the spec's dtype and
/// `lse_parts` `[parts, batch, seq, n_heads]` f32 (each part's O and LSE stacked, as a
/// forward writes them), into `o` `[batch, seq, n_heads, head_dim_v]` and `lse` `[batch,
/// seq, n_heads]`; `sinks` `[n_heads]` f32 with a spec that has them.
#[derive(Clone, Copy, Debug)]
pub struct MergeArgs<'a> {
    /// Each part's output, stacked part-major.
    pub o_parts: &'a Tensor,
    /// Each part's log-sum-exp, stacked as `o_parts`.
    pub lse_parts: &'a Tensor,
    /// The merged output, written.
    pub o: &'a Tensor,
    /// The merged log-sum-exp, written.
    pub lse: &'a Tensor,
    /// The sink logits, given exactly where the spec has sinks.
    pub sinks: Option<&'a Tensor>,
}

/// The merge of attention states for one width and dtype.
pub struct Merge {
    spec: MergeSpec,
    pipeline: Pipeline,
}

impl Merge {
    /// The merge kernel of `spec` (a head_dim_v that is a multiple of 4), compiled for
    /// `gpu` now.
    pub fn new(gpu: &Gpu, spec: MergeSpec) -> Result<Merge, Error> {
        if spec.head_dim_v == 0 || !spec.head_dim_v.is_multiple_of(4) {
            return Err(InputError::Unsupported {
                what: "a merge of outputs whose width is not a multiple of 4",
                needs: "head_dim_v a positive multiple of 4",
            }
            .into());
        }
        let masks = Masks {
            sinks: spec.sinks,
            ..Masks::default()
        };
        let name = crate::plan::kernels::family_name("attention_merge", spec.head_dim_v);
        let kernel = KernelSpec {
            dtype: spec.dtype,
            workgroup_size: 256,
            ..KernelSpec::standard(&name, Op::Merge, spec.head_dim_v, masks)
        };
        let abi = attn_dsl::compile(&kernel).map_err(|e| Error::Pipeline {
            kernel: name.clone(),
            message: e.to_string(),
        })?;
        Ok(Merge {
            spec,
            pipeline: Pipeline::new(Kernel::now(gpu, &abi)?),
        })
    }

    /// Records the merge of `args.o_parts` and `args.lse_parts` into `args.o` and
    /// `args.lse`; every tensor is checked first, and a refused call records nothing.
    pub fn record(
        &mut self,
        gpu: &Gpu,
        encoder: &mut impl Record,
        args: &MergeArgs,
    ) -> Result<(), Error> {
        encoder.recorder(|rec| {
            let [parts, batch, seq, n_heads, width] = super::rank(
                args.o_parts,
                "o_parts",
                "[parts, batch, seq, n_heads, head_dim_v]",
            )?;
            if width != self.spec.head_dim_v {
                return Err(InputError::HeadDimV {
                    kernel: self.pipeline.abi().name.to_string(),
                    kernel_head_dim_v: self.spec.head_dim_v,
                    given: width,
                }
                .into());
            }
            for (name, value) in [
                ("parts", parts),
                ("batch", batch),
                ("seq", seq),
                ("heads", n_heads),
            ] {
                crate::shape::nonzero(name, value)?;
            }
            let data = Scalar::from(self.spec.dtype);
            let rows = [batch, seq, n_heads];
            expect(
                args.lse_parts,
                "lse_parts",
                &[parts, batch, seq, n_heads],
                Scalar::F32,
                "[parts, batch, seq, n_heads]",
            )?;
            expect(
                args.o,
                "o",
                &[batch, seq, n_heads, width],
                data,
                "[batch, seq, n_heads, head_dim_v]",
            )?;
            expect(args.lse, "lse", &rows, Scalar::F32, "[batch, seq, n_heads]")?;
            let mut tensors = vec![
                ("o_parts", args.o_parts),
                ("lse_parts", args.lse_parts),
                ("o", args.o),
                ("lse", args.lse),
            ];
            match (self.spec.sinks, args.sinks) {
                (true, Some(s)) => {
                    expect(s, "sinks", &[n_heads], Scalar::F32, "[n_heads]")?;
                    tensors.push(("sinks", s));
                }
                (false, None) => {}
                (built, _) => {
                    return Err(InputError::Modifier {
                        kernel: self.pipeline.abi().name.to_string(),
                        word: "sinks",
                        built,
                    }
                    .into());
                }
            }
            let queries = batch
                .checked_mul(seq)
                .and_then(|x| x.checked_mul(n_heads))
                .ok_or(InputError::OverLimit {
                    what: "queries (batch · seq · heads)",
                    value: u64::from(batch) * u64::from(seq) * u64::from(n_heads),
                    limit: u32::MAX.into(),
                })?;
            let mut d = Dispatch::new(tensors);
            d.dims = vec![
                ("queries", queries),
                ("n_heads", n_heads),
                ("head_dim", width),
                ("parts", parts),
            ];
            let g = grid(self.pipeline.abi(), &d.dims);
            self.pipeline.record(gpu, rec, &d, g)
        })
    }
}
