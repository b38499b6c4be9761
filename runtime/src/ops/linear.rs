//! A Linear at decode's row counts on device tensors: `y = x·Wᵀ (+ b)`, an engine's Q, K,
//! V and O projections of a few rows. Each weight is read once for every row, so the op
//! runs at the rate W streams from memory (`linear_rows`); W may be held in f16 or bf16,
//! half the bytes of f32.
//!
//! The planner picks the kernel from the row count: one for 1, 2, 4, 8 or 16 rows per
//! workgroup (the smallest that holds the call's rows, so that a single row keeps one
//! sum per column and lane), and past 16 rows more workgroups of 16, each reading W again.

use attn_dsl::{Dtype, KernelAbi, Scalar};

use super::grid;
use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::dispatch::record::{Dispatch, Pipeline};
use crate::dispatch::recorder::Record;
use crate::error::Error;
use crate::modifiers::expect;
use crate::tensor::Tensor;

/// The most rows one workgroup holds; more rows take more workgroups.
pub use attn_dsl::layout::rows::LINEAR_MAX_ROWS;

/// A Linear's widths and the dtype its weights are held in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearSpec {
    /// The reduction's width (x's rows, W's rows); a multiple of 4.
    pub hidden: u32,
    /// The output's width: y's columns, one row of W each.
    pub out: u32,
    /// W's element type: f32, f16 (SHADER_F16) or bf16.
    pub weights: Dtype,
    /// Whether the op adds a bias per output column.
    pub bias: bool,
}

/// One call: x `[rows, hidden]` f32, W `[out, hidden]` in the spec's weights dtype (the
/// Linear's weight as PyTorch lays it out), b `[out]` f32 where the spec has a bias, y
/// `[rows, out]` f32 (overwritten).
#[derive(Clone, Copy, Debug)]
pub struct LinearArgs<'a> {
    /// The input rows.
    pub x: &'a Tensor,
    /// The weight.
    pub w: &'a Tensor,
    /// The bias, given exactly where the spec has one.
    pub b: Option<&'a Tensor>,
    /// The output, written.
    pub y: &'a Tensor,
}

/// A Linear at a few rows, recorded into the caller's encoder.
pub struct Linear {
    spec: LinearSpec,
    /// The kernel for each row count the planner has used, by rows per workgroup.
    kernels: Vec<(u32, Pipeline)>,
}

impl Linear {
    /// Checks `spec` against the device (f16 weights need SHADER_F16) and compiles the
    /// single-row kernel; the others compile on the first call that needs them.
    pub fn new(gpu: &Gpu, spec: LinearSpec) -> Result<Linear, Error> {
        let abi = compile(&spec, 1)?;
        gpu.require(&abi)?;
        Ok(Linear {
            spec,
            kernels: Vec::new(),
        })
    }

    /// The widths and weight dtype it was built for.
    pub fn spec(&self) -> LinearSpec {
        self.spec
    }

    /// The rows per workgroup the planner gives a call of `rows` rows.
    pub fn rows_per_workgroup(rows: u32) -> u32 {
        rows.clamp(1, LINEAR_MAX_ROWS).next_power_of_two()
    }

    /// Records `y = x·Wᵀ (+ b)`, every tensor checked first.
    pub fn record(
        &mut self,
        gpu: &Gpu,
        encoder: &mut impl Record,
        args: &LinearArgs,
    ) -> Result<(), Error> {
        encoder.recorder(|rec| {
            let s = self.spec;
            let rows = args.x.shape().first().copied().unwrap_or(0);
            crate::shape::nonzero("rows", rows)?;
            let f = Scalar::F32;
            expect(args.x, "x", &[rows, s.hidden], f, "[rows, hidden]")?;
            expect(
                args.w,
                "w",
                &[s.out, s.hidden],
                Scalar::from(s.weights),
                "[out, hidden]",
            )?;
            expect(args.y, "y", &[rows, s.out], f, "[rows, out]")?;
            let mut tensors = vec![("x", args.x), ("w", args.w), ("y", args.y)];
            match (s.bias, args.b) {
                (true, Some(b)) => {
                    expect(b, "b", &[s.out], f, "[out]")?;
                    tensors.push(("bias", b));
                }
                (true, None) => {
                    return Err(crate::error::InputError::Unsupported {
                        what: "this Linear",
                        needs: "its bias, `b` (the spec says it has one)",
                    }
                    .into());
                }
                (false, Some(_)) => {
                    return Err(crate::error::InputError::Unsupported {
                        what: "a bias",
                        needs: "a Linear built with `bias: true`",
                    }
                    .into());
                }
                (false, None) => {}
            }
            let per = Linear::rows_per_workgroup(rows);
            let at = match self.kernels.iter().position(|(r, _)| *r == per) {
                Some(at) => at,
                None => {
                    let kernel = Kernel::now(gpu, &compile(&s, per)?)?;
                    self.kernels.push((per, Pipeline::new(kernel)));
                    self.kernels.len() - 1
                }
            };
            let mut d = Dispatch::new(tensors);
            d.dims = vec![("rows", rows), ("hidden", s.hidden), ("out", s.out)];
            let pipeline = &mut self.kernels[at].1;
            let g = grid(pipeline.abi(), &d.dims);
            pipeline.record(gpu, rec, &d, g)
        })
    }
}

/// The `linear_rows` kernel of `spec` for `rows` rows per workgroup.
fn compile(spec: &LinearSpec, rows: u32) -> Result<KernelAbi, Error> {
    let name = format!(
        "linear_rows_{}x{}_{}_r{rows}",
        spec.hidden,
        spec.out,
        spec.weights.name()
    );
    let k = attn_dsl::row_layer::linear_rows(
        &name,
        [spec.hidden, spec.out],
        rows,
        spec.weights,
        spec.bias,
    );
    attn_dsl::compile(&k).map_err(|e| Error::Pipeline {
        kernel: name,
        message: e.to_string(),
    })
}
