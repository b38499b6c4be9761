//! The `row_scale` pass: each row's largest magnitude of the operands of a bf16 kernel on
//! tensor cores, which scales every row into f16 by a power of two (see attn-dsl's
//! `coop_scale`).

use attn_dsl::{Dtype, KernelSpec, Masks, Op, Scalar};

use super::{grid, helper, scratch};
use crate::device::Gpu;
use crate::dispatch::record::{Dispatch, Pipeline};
use crate::error::Error;
use crate::tensor::Tensor;

/// The maxima (`[parts, batch, seq, n_heads]` u32, f32 bits) and the pass that finds them.
#[derive(Default)]
pub(crate) struct RowMaxima {
    held: Option<Tensor>,
    pass: Option<Pipeline>,
}

impl RowMaxima {
    /// Records the maxima of each of `operands` (part i of the returned scratch; a tensor
    /// with KV heads fills the first `batch · seq · n_kv_heads` words of its part), for a
    /// problem of `rows` = [batch, seq, n_heads].
    pub(crate) fn record(
        &mut self,
        gpu: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        operands: &[&Tensor],
        rows: [u32; 3],
    ) -> Result<Tensor, Error> {
        let parts = operands.len() as u32;
        let held = scratch(
            &mut self.held,
            gpu,
            &[parts, rows[0], rows[1], rows[2]],
            Scalar::U32,
        )?;
        let spec = KernelSpec {
            dtype: Dtype::Bf16,
            ..KernelSpec::standard("attention_row_scale", Op::RowScale, 4, Masks::default())
        };
        let pipeline = helper(gpu, &mut self.pass, spec)?;
        let part = rows.iter().product::<u32>();
        for (at, t) in operands.iter().enumerate() {
            let width = *t.shape().last().expect("checked: rank 4");
            let mut d = Dispatch::new(vec![("src", *t), ("dst", &held)]);
            d.dims = vec![
                ("rows", (t.len() / u64::from(width)) as u32),
                ("width4", width / 4),
                ("at", at as u32 * part),
            ];
            let g = grid(pipeline.abi(), &d.dims);
            pipeline.record(gpu, encoder, &d, g)?;
        }
        Ok(held)
    }
}
