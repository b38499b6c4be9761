//! Cascade attention: many sequences whose caches begin with one shared prefix (a system
//! prompt, a few-shot preamble, the branches of a beam or of parallel sampling) decode
//! with the prefix's K and V read once for all of them, as FlashInfer's cascade does.
//!
//! A decode step is two attentions merged: every sequence's query over the prefix, as one
//! call whose rows are the batch's queries (the prefix's keys staged once per tile of
//! queries, on tensor cores where the dtype has them), and each query over its own
//! suffix, a split-K decode; [`super::merge::Merge`] joins the two by their log-sum-exps
//! and the sinks there, once. The parts see no positions, so the masks that move with a
//! query's position (window, ALiBi, a `mask_mod`) are refused: such a cache is read as one
//! paged cache whose block tables share the prefix's pages.

use attn_dsl::{Masks, Scalar};

use super::decode::{CacheView, Decode, DecodeArgs, DecodeSpec, QueryRows};
use super::grow;
use super::merge::{Merge, MergeArgs, MergeSpec};
use crate::device::Gpu;
use crate::dispatch::recorder::{Record, Recorder};
use crate::error::{Error, InputError};
use crate::modifiers::{DeviceModifiers, expect};
use crate::tensor::{Tensor, element_bytes};

/// One cascade step: `q` `[batch, n_heads, head_dim]`, one query per sequence, over the
/// shared `prefix` (the cache view's one slot, `prefix.slot0`) and each sequence's own
/// `suffix` (slots `suffix.slot0..+batch`, the rows after the prefix, the query's own row
/// last, appended before the step as for a decode), into `o` `[batch, n_heads, head_dim_v]` and, where given, `lse` `[batch,
/// n_heads]` f32. `mods` holds the soft cap and the sinks the spec was built with.
#[derive(Clone, Copy, Debug)]
pub struct CascadeArgs<'a> {
    /// One query row per sequence.
    pub q: &'a Tensor,
    /// The shared prefix: one slot of at least `batch` rows.
    pub prefix: CacheView<'a>,
    /// Each sequence's rows after the prefix.
    pub suffix: CacheView<'a>,
    /// The output, written.
    pub o: &'a Tensor,
    /// Each query's log-sum-exp over prefix and suffix (and sinks), written where given.
    pub lse: Option<&'a Tensor>,
    /// The softmax scale; `None` is 1/√head_dim.
    pub scale: Option<f32>,
    /// The soft cap and sinks of the spec.
    pub mods: DeviceModifiers<'a>,
}

/// The parts' outputs and log-sum-exps, stacked prefix first as the merge reads them, and
/// the suffix's own (its decode writes whole tensors, copied into the stack).
#[derive(Default)]
struct Parts {
    o: Option<Tensor>,
    lse: Option<Tensor>,
    o_suffix: Option<Tensor>,
    lse_suffix: Option<Tensor>,
    lse_out: Option<Tensor>,
}

/// Cascade decode for one spec: the prefix's pass, the suffixes' decode and their merge.
pub struct Cascade {
    spec: DecodeSpec,
    prefix: Decode,
    suffix: Decode,
    merge: Merge,
    parts: Parts,
}

impl Cascade {
    /// The kernels of `spec` (softcap and sinks are the masks a cascade takes; the cache
    /// contiguous or paged, in the queries' dtype or, under f16 queries on tensor cores,
    /// fp8), checked against this device now.
    pub fn new(gpu: &Gpu, spec: DecodeSpec) -> Result<Cascade, Error> {
        let m = spec.masks;
        if m.window || m.alibi || m.flex.is_some() || m.causal || m.document {
            return Err(InputError::Unsupported {
                what: "a cascade with masks that move with a query's position (window, alibi, \
                       a mask_mod or score_mod)",
                needs: "softcap and sinks only; read such caches as one paged cache whose \
                        block tables share the prefix's pages",
            }
            .into());
        }
        // The parts carry no sinks: the merge joins them once.
        let parts = DecodeSpec {
            masks: Masks { sinks: false, ..m },
            ..spec
        };
        let merge = MergeSpec {
            sinks: m.sinks,
            ..MergeSpec::new(spec.head_dim_v, spec.dtype)
        };
        let mut prefix = Decode::new(gpu, parts)?;
        if !prefix.serves_shared(gpu) {
            return Err(InputError::Unsupported {
                what: "a cascade whose prefix cannot run on the forward's tiles (an fp8 cache \
                       without tensor cores or under queries other than f16, or a head_dim \
                       they do not take)",
                needs: "a cache in the queries' dtype, or an fp8 cache under f16 queries on a \
                        device with cooperative matrices",
            }
            .into());
        }
        Ok(Cascade {
            spec,
            prefix,
            suffix: Decode::new(gpu, parts)?,
            merge: Merge::new(gpu, merge)?,
            parts: Parts::default(),
        })
    }

    /// The spec the cascade was built with.
    pub fn spec(&self) -> DecodeSpec {
        self.spec
    }

    /// Records the step: the prefix's pass, the suffixes' decode, the merge. Shapes, the
    /// modifiers and the prefix's length against the batch are checked before anything
    /// is recorded.
    pub fn record(
        &mut self,
        gpu: &Gpu,
        encoder: &mut impl Record,
        args: &CascadeArgs,
    ) -> Result<(), Error> {
        let [batch, n_heads, _] = super::rank(args.q, "q", "[batch, n_heads, head_dim]")?;
        crate::shape::nonzero("batch", batch)?;
        if args.prefix.max_len < batch {
            return Err(InputError::QueryRows(format!(
                "a cascade's prefix of {} rows serves at most as many sequences, not {batch}",
                args.prefix.max_len
            ))
            .into());
        }
        let data = Scalar::from(self.spec.dtype);
        let out_shape = [batch, n_heads, self.spec.head_dim_v];
        expect(
            args.o,
            "o",
            &out_shape,
            data,
            "[batch, n_heads, head_dim_v]",
        )?;
        if let Some(lse) = args.lse {
            expect(
                lse,
                "lse",
                &[batch, n_heads],
                Scalar::F32,
                "[batch, n_heads]",
            )?;
        }
        let parts = self.parts(gpu, (batch, n_heads))?;
        let mods = DeviceModifiers {
            sinks: None,
            ..args.mods
        };
        let part = |cache, o| DecodeArgs {
            q: args.q,
            rows: QueryRows::Each(1),
            cache,
            o,
            scale: args.scale,
            mods,
            slice_len: None,
        };
        let prefix_o = parts.o.view(&out_shape)?;
        let prefix_lse = parts.lse.view(&[batch, n_heads])?;
        let suffix = part(args.suffix, &parts.o_suffix);
        let prefix = DecodeArgs {
            rows: QueryRows::Each(batch),
            ..part(args.prefix, &prefix_o)
        };
        self.suffix.check(gpu, &suffix)?;
        self.prefix.check_shared(gpu, &prefix)?;
        let merged = self.merge_args(args, &parts, (batch, n_heads))?;
        encoder.recorder(|rec| {
            self.prefix.record_shared(gpu, rec, &prefix, &prefix_lse)?;
            self.suffix
                .record_lse(gpu, rec, &suffix, &parts.lse_suffix)?;
            stack(rec, &parts);
            self.merge.record(gpu, rec, &merged.args())
        })
    }

    /// The parts' tensors for `batch` queries of `n_heads` heads, grown as needed.
    fn parts(&mut self, gpu: &Gpu, (batch, n_heads): (u32, u32)) -> Result<Stack, Error> {
        let (dv, data) = (self.spec.head_dim_v, Scalar::from(self.spec.dtype));
        let p = &mut self.parts;
        Ok(Stack {
            o: grow(gpu, &mut p.o, &[2, batch, 1, n_heads, dv], data)?,
            lse: grow(gpu, &mut p.lse, &[2, batch, 1, n_heads], Scalar::F32)?,
            o_suffix: grow(gpu, &mut p.o_suffix, &[batch, n_heads, dv], data)?,
            lse_suffix: grow(gpu, &mut p.lse_suffix, &[batch, n_heads], Scalar::F32)?,
            lse_out: grow(gpu, &mut p.lse_out, &[batch, 1, n_heads], Scalar::F32)?,
        })
    }

    /// The merge's tensors: the stacked parts into the caller's O (and LSE, else scratch).
    fn merge_args<'t>(
        &self,
        args: &CascadeArgs<'t>,
        parts: &Stack,
        (batch, n_heads): (u32, u32),
    ) -> Result<Merged<'t>, Error> {
        let o = args.o.reshape(&[batch, 1, n_heads, self.spec.head_dim_v])?;
        let lse = match args.lse {
            Some(l) => l.reshape(&[batch, 1, n_heads])?,
            None => parts.lse_out.clone(),
        };
        Ok(Merged {
            o_parts: parts.o.clone(),
            lse_parts: parts.lse.clone(),
            o,
            lse,
            sinks: args.mods.sinks,
        })
    }
}

/// One step's scratch views.
struct Stack {
    o: Tensor,
    lse: Tensor,
    o_suffix: Tensor,
    lse_suffix: Tensor,
    lse_out: Tensor,
}

/// The merge's tensors, owned for the step.
struct Merged<'t> {
    o_parts: Tensor,
    lse_parts: Tensor,
    o: Tensor,
    lse: Tensor,
    sinks: Option<&'t Tensor>,
}

impl Merged<'_> {
    fn args(&self) -> MergeArgs<'_> {
        MergeArgs {
            o_parts: &self.o_parts,
            lse_parts: &self.lse_parts,
            o: &self.o,
            lse: &self.lse,
            sinks: self.sinks,
        }
    }
}

/// The suffix's O and LSE copied behind the prefix's in the stacks (part 1).
fn stack(rec: &mut Recorder, parts: &Stack) {
    for (from, to) in [(&parts.o_suffix, &parts.o), (&parts.lse_suffix, &parts.lse)] {
        let bytes = from.len() * element_bytes(from.scalar());
        rec.encoder().copy_buffer_to_buffer(
            from.buffer(),
            from.offset(),
            to.buffer(),
            to.offset() + bytes,
            bytes,
        );
    }
}
