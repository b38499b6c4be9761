//! Conversions between f32 tensors and the half-precision dtypes on the device: f32
//! activations into an f16 or bf16 cache or kernel (rounded to nearest even), and their
//! outputs back to f32.

use attn_dsl::{Dtype, KernelSpec, Masks, Op, Scalar};

use super::grid;
use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::dispatch::record::{Dispatch, Pipeline};
use crate::dispatch::recorder::Record;
use crate::error::{Error, InputError};
use crate::modifiers::expect;
use crate::tensor::{Tensor, TensorError};

/// Conversions to and from one dtype; each kernel compiled on its first use.
pub struct Convert {
    dtype: Dtype,
    to: Option<Pipeline>,
    from: Option<Pipeline>,
}

/// One conversion: `src` and `dst` of one shape (a multiple of 4 elements), one of them
/// f32 and the other the op's dtype; the direction follows from which is which.
#[derive(Clone, Copy, Debug)]
pub struct ConvertArgs<'a> {
    /// The tensor read.
    pub src: &'a Tensor,
    /// The tensor written, of `src`'s shape in the other element type.
    pub dst: &'a Tensor,
}

impl Convert {
    /// Conversions between f32 and `dtype` (f16 or bf16); f16 needs SHADER_F16.
    pub fn new(gpu: &Gpu, dtype: Dtype) -> Result<Convert, Error> {
        if dtype == Dtype::F32 {
            return Err(InputError::Unsupported {
                what: "a conversion from f32 to f32",
                needs: "f16 or bf16",
            }
            .into());
        }
        if !gpu.supports_dtype(dtype) {
            return Err(crate::device::DeviceError::MissingFeature {
                kernel: "attention_to_dtype (f16)".into(),
                feature: "SHADER_F16",
            }
            .into());
        }
        Ok(Convert {
            dtype,
            to: None,
            from: None,
        })
    }

    /// Records `dst = src`: rounded to the dtype (to nearest even) when `src` is f32,
    /// widened to f32 when `dst` is.
    pub fn record(
        &mut self,
        gpu: &Gpu,
        encoder: &mut impl Record,
        args: &ConvertArgs,
    ) -> Result<(), Error> {
        encoder.recorder(|rec| {
            let ConvertArgs { src, dst } = *args;
            let to_dtype = src.scalar() == Scalar::F32;
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
            if src.is_empty() {
                // Nothing to convert, and a binding of no elements is smaller than a vec4.
                return Ok(());
            }
            let (op, slot) = match to_dtype {
                true => (Op::ToDtype, &mut self.to),
                false => (Op::FromDtype, &mut self.from),
            };
            if slot.is_none() {
                let spec = KernelSpec {
                    dtype: self.dtype,
                    ..KernelSpec::standard(
                        &format!("attention_{}", op.name()),
                        op,
                        4,
                        Masks::default(),
                    )
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
            pipeline.record(gpu, rec, &dispatch, g)
        })
    }
}
