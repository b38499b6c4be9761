//! Partial gradients summed on the device: `into += Σ_p parts[p]`, f32, each element by one
//! invocation in a fixed order with compensated (TwoSum) additions, so the total is the
//! same on every run and keeps double-f32 precision until its one rounding. What a
//! gradient split over devices needs at the end: with one sequence's keys spread over
//! several devices, each device's backward makes a partial dQ for every query, and the
//! partials brought to one device are summed here.

use attn_dsl::{KernelSpec, Masks, Op, Scalar};

use super::{grid, helper};
use crate::device::Gpu;
use crate::dispatch::record::{Dispatch, Pipeline};
use crate::dispatch::recorder::Record;
use crate::error::{Error, InputError};
use crate::modifiers::expect;
use crate::tensor::Tensor;

/// One sum: `parts` `[k, ..into's shape]` f32 added into `into`, f32.
#[derive(Clone, Copy, Debug)]
pub struct SumArgs<'a> {
    /// The partial sums, stacked part-major.
    pub parts: &'a Tensor,
    /// The sum's target, added into (not overwritten).
    pub into: &'a Tensor,
}

/// The sum of stacked f32 parts into a tensor; its kernel compiled on the first call.
#[derive(Default)]
pub struct Sum {
    pipeline: Option<Pipeline>,
}

impl Sum {
    /// A sum op; nothing is compiled until its first call.
    pub fn new() -> Sum {
        Sum::default()
    }

    /// Records `into += Σ_p parts[p]`; both are checked first, and a refused call records
    /// nothing.
    pub fn record(
        &mut self,
        gpu: &Gpu,
        encoder: &mut impl Record,
        args: &SumArgs,
    ) -> Result<(), Error> {
        encoder.recorder(|rec| {
            let SumArgs { parts, into } = *args;
            let Some((&k, shape)) = parts.shape().split_first() else {
                return Err(InputError::Unsupported {
                    what: "parts of rank 0",
                    needs: "parts shaped [k, ..into's shape]",
                }
                .into());
            };
            crate::shape::nonzero("parts", k)?;
            parts.check_device(gpu, "parts")?;
            into.check_device(gpu, "into")?;
            expect(
                into,
                "into",
                shape,
                Scalar::F32,
                "parts' shape after its first dim",
            )?;
            expect(
                parts,
                "parts",
                parts.shape(),
                Scalar::F32,
                "[k, ..into's shape]",
            )?;
            // The kernel walks the parts' k · len elements with a u32 index.
            let len = u32::try_from(into.len())
                .ok()
                .filter(|len| u64::from(*len) * u64::from(k) <= u64::from(u32::MAX))
                .ok_or(InputError::OverLimit {
                    what: "elements of the parts (k · len)",
                    value: into.len() * u64::from(k),
                    limit: u32::MAX.into(),
                })?;
            let spec =
                KernelSpec::standard("attention_grad_fold", Op::GradFold, 4, Masks::default());
            let pipeline = helper(gpu, &mut self.pipeline, spec)?;
            let d = Dispatch {
                tensors: vec![("pair", parts), ("grad", into)],
                dims: vec![("len", len), ("parts", k)],
                params: Vec::new(),
            };
            let g = grid(pipeline.abi(), &d.dims);
            pipeline.record(gpu, rec, &d, g)
        })
    }
}
