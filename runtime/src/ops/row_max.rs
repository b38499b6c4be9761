//! The `row_scale` pass: each row's largest magnitude of the operands of a bf16 kernel on
//! tensor cores, which scales every row into f16 by a power of two (see attn-dsl's
//! `coop_scale`).

use attn_dsl::{Dtype, KernelSpec, Masks, Op, Scalar};

use super::{grid, helper, scratch};
use crate::device::Gpu;
use crate::dispatch::record::{Dispatch, Pipeline};
use crate::dispatch::recorder::Recorder;
use crate::error::Error;
use crate::tensor::Tensor;

/// The pass over bf16 rows.
pub(crate) fn spec() -> KernelSpec {
    KernelSpec {
        dtype: Dtype::Bf16,
        ..KernelSpec::standard("attention_row_scale", Op::RowScale, 4, Masks::default())
    }
}

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
        rec: &mut Recorder,
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
        let pipeline = helper(gpu, &mut self.pass, spec())?;
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
            pipeline.record(gpu, rec, &d, g)?;
        }
        Ok(held)
    }
}

#[cfg(test)]
mod tests {
    use super::RowMaxima;
    use crate::device::Gpu;
    use crate::tensor::Tensor;
    use attn_dsl::Scalar;
    use half::bf16;
    use pollster::FutureExt as BlockOn;

    /// Each row's largest magnitude (of the bf16 values), as f32 bits, in its part: Q's
    /// rows by query head, K's by KV head in the first words of theirs, at widths of more
    /// vec4s than the pass's lanes per row (160: 40, not a multiple of them) and fewer (48);
    /// an all-zero row as 0 and a row whose largest magnitude is negative by its magnitude.
    #[test]
    fn each_row_gets_its_largest_magnitude() {
        let gpu = Gpu::new(crate::kernels::FAMILY.iter().copied())
            .block_on()
            .unwrap_or_else(|e| panic!("{e}"));
        let (batch, seq, heads, kv_heads) = (2u32, 5u32, 3u32, 1u32);
        let values = |rows: u32, width: u32, seed: u32| -> Vec<f32> {
            (0..rows * width)
                .map(|i| {
                    let (row, c) = (i / width, i % width);
                    match row % 4 {
                        0 => 0.0,
                        1 if c == width / 2 => -3.0e9,
                        _ => ((i * 7919 + seed) % 1000) as f32 / 1000.0 - 0.5,
                    }
                })
                .collect()
        };
        let q = values(batch * seq * heads, 160, 1);
        let k = values(batch * seq * kv_heads, 48, 2);
        let tensor = |shape: &[u32], data: &[f32]| {
            Tensor::from_f32(&gpu, shape, Scalar::Bf16, data).unwrap_or_else(|e| panic!("{e}"))
        };
        let (qt, kt) = (
            tensor(&[batch, seq, heads, 160], &q),
            tensor(&[batch, seq, kv_heads, 48], &k),
        );
        let mut maxima = RowMaxima::default();
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        let held = maxima
            .record(
                &gpu,
                &mut crate::dispatch::Recorder::new(&mut encoder),
                &[&qt, &kt],
                [batch, seq, heads],
            )
            .unwrap_or_else(|e| panic!("{e}"));
        gpu.queue.submit([encoder.finish()]);
        let got = crate::device::block_on(held.to_u32(&gpu)).unwrap_or_else(|e| panic!("{e}"));
        let part = (batch * seq * heads) as usize;
        assert_eq!(got.len(), 2 * part);
        for (at, (data, width)) in [(&q, 160), (&k, 48)].into_iter().enumerate() {
            for (row, x) in data.chunks(width).enumerate() {
                let want = x
                    .iter()
                    .map(|v| bf16::from_f32(*v).to_f32().abs())
                    .fold(0.0f32, f32::max);
                assert_eq!(got[at * part + row], want.to_bits(), "part {at} row {row}");
            }
        }
    }
}
