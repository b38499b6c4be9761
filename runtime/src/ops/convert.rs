//! Conversions between f32 tensors and the half-precision dtypes on the device: f32
//! activations into an f16 or bf16 cache or kernel (rounded to nearest even), and their
//! outputs back to f32.

use attn_dsl::{Dtype, KernelSpec, Masks, Op, Scalar};

use super::grid;
use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::dispatch::record::{Dispatch, Pipeline};
use crate::error::Error;
use crate::modifiers::expect;
use crate::tensor::{Tensor, TensorError};

/// Conversions to and from one dtype; each kernel compiled on its first use.
pub struct Convert {
    dtype: Dtype,
    to: Option<Pipeline>,
    from: Option<Pipeline>,
}

impl Convert {
    pub fn new(dtype: Dtype) -> Convert {
        Convert {
            dtype,
            to: None,
            from: None,
        }
    }

    /// Records `dst = src` rounded to the dtype: `src` f32, `dst` the dtype, one shape
    /// (a multiple of 4 elements).
    pub fn record_to(
        &mut self,
        gpu: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        src: &Tensor,
        dst: &Tensor,
    ) -> Result<(), Error> {
        self.record(gpu, encoder, src, dst, true)
    }

    /// Records `dst = src` widened to f32.
    pub fn record_from(
        &mut self,
        gpu: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        src: &Tensor,
        dst: &Tensor,
    ) -> Result<(), Error> {
        self.record(gpu, encoder, src, dst, false)
    }

    fn record(
        &mut self,
        gpu: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        src: &Tensor,
        dst: &Tensor,
        to_dtype: bool,
    ) -> Result<(), Error> {
        let data = Scalar::from(self.dtype);
        let (s, d) = match to_dtype {
            true => (Scalar::F32, data),
            false => (data, Scalar::F32),
        };
        expect(src, "src", src.shape(), s, "any shape")?;
        expect(dst, "dst", src.shape(), d, "src's shape")?;
        if !src.len().is_multiple_of(4) {
            return Err(TensorError::Data {
                name: "src".into(),
                got: src.len() as usize,
                want: src.len().next_multiple_of(4),
            }
            .into());
        }
        let (op, slot) = match to_dtype {
            true => (Op::ToDtype, &mut self.to),
            false => (Op::FromDtype, &mut self.from),
        };
        if slot.is_none() {
            let spec = KernelSpec {
                dtype: self.dtype,
                ..KernelSpec::standard(&format!("attention_{}", op.name()), op, 4, Masks::default())
            };
            let abi = attn_dsl::compile(&spec).map_err(|e| Error::Pipeline {
                kernel: spec.name.clone(),
                message: e.to_string(),
            })?;
            *slot = Some(Pipeline::new(Kernel::now(gpu, &abi)?));
        }
        let pipeline = slot.as_mut().expect("made above");
        let mut dispatch = Dispatch::new(vec![("src", src), ("dst", dst)]);
        dispatch.dims = vec![("len4", (src.len() / 4) as u32)];
        let g = grid(pipeline.abi(), &dispatch.dims);
        pipeline.record(gpu, encoder, &dispatch, g)
    }
}
