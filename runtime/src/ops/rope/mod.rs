//! RoPE on a device tensor, in place: row `s` of sequence `b` rotated at position
//! `positions[b] + s`, the positions on the device (a KV cache's lengths, in a decode
//! loop), so that a step's uniforms never change.

// The host-slice convenience: host data checked, uploaded, run, read back.
mod host;
pub use host::*;

use attn_dsl::{Dtype, KernelSpec, Masks, Op, Scalar};

use super::grid;
use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::dispatch::record::{Dispatch, Pipeline};
use crate::dispatch::recorder::Record;
use crate::error::{Error, InputError};
use crate::modifiers::expect;
use crate::tensor::Tensor;

/// One call: `x` is `[batch, seq, heads, head_dim]` in the spec's dtype (Q with n_heads,
/// K with n_kv_heads), `positions` `[batch]` u32; `base` is the frequency base (10000 in
/// most models).
#[derive(Clone, Copy, Debug)]
pub struct RopeArgs<'a> {
    /// The rows, rotated in place.
    pub x: &'a Tensor,
    /// Each sequence's position of its row 0: row s of sequence b is at `positions[b] + s`.
    pub positions: &'a Tensor,
    /// The frequency base.
    pub base: f32,
}

/// Which rotation a RoPE op applies to rows of `head_dim` (even) held in `dtype`: by the
/// angle, or (`backward`) by minus the angle, the rotation's backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeSpec {
    /// The width of the rows rotated, in pairs.
    pub head_dim: u32,
    /// Whether it rotates by minus the angle, the rotation's backward.
    pub backward: bool,
    /// The rows' element type: f32, f16 (SHADER_F16) or bf16 (a head_dim that is a
    /// multiple of 4). Each pair is rotated in f32 and rounded once into it.
    pub dtype: Dtype,
}

impl RopeSpec {
    /// The rotation of f32 rows `head_dim` wide.
    pub fn new(head_dim: u32) -> RopeSpec {
        RopeSpec {
            head_dim,
            backward: false,
            dtype: Dtype::F32,
        }
    }

    /// Its backward: the rotation by minus the angle.
    pub fn backward(head_dim: u32) -> RopeSpec {
        RopeSpec {
            backward: true,
            ..RopeSpec::new(head_dim)
        }
    }
}

/// RoPE (or its backward) for one head_dim.
pub struct Rope {
    abi: attn_dsl::KernelAbi,
    pipeline: Option<Pipeline>,
    /// The frequency table of the last base.
    inv_freq: Option<(f32, Tensor)>,
}

impl Rope {
    /// The family's RoPE kernel for `spec`, checked against `gpu`; its pipeline is created
    /// on the first call.
    pub fn new(gpu: &Gpu, spec: RopeSpec) -> Result<Rope, Error> {
        let RopeSpec {
            head_dim,
            backward,
            dtype,
        } = spec;
        let (op, base) = match backward {
            false => (Op::Rope, "rope"),
            true => (Op::RopeBackward, "rope_backward"),
        };
        let name = match dtype {
            Dtype::F32 => crate::plan::kernels::family_name(base, head_dim),
            _ => crate::plan::kernels::family_name(&format!("{base}_{}", dtype.name()), head_dim),
        };
        let spec = KernelSpec {
            workgroup_size: head_dim.next_power_of_two().clamp(32, 256),
            dtype,
            ..KernelSpec::standard(&name, op, head_dim, Masks::default())
        };
        let abi = attn_dsl::compile(&spec).map_err(|e| Error::Pipeline {
            kernel: spec.name.clone(),
            message: e.to_string(),
        })?;
        gpu.require(&abi)?;
        Ok(Rope {
            abi,
            pipeline: None,
            inv_freq: None,
        })
    }

    /// A RoPE op running `kernel` (`op: rope` or `rope_backward`).
    pub fn from_kernel(kernel: &Kernel) -> Result<Rope, Error> {
        if !matches!(kernel.abi().op, Op::Rope | Op::RopeBackward) {
            return Err(InputError::WrongOp {
                kernel: kernel.name().to_string(),
                actual: kernel.abi().op.name(),
                wanted: "rope",
            }
            .into());
        }
        Ok(Rope {
            abi: kernel.abi().clone(),
            pipeline: Some(Pipeline::new(kernel.clone())),
            inv_freq: None,
        })
    }

    /// Records the rotation of `args.x`, in place.
    pub fn record(
        &mut self,
        gpu: &Gpu,
        encoder: &mut impl Record,
        args: &RopeArgs,
    ) -> Result<(), Error> {
        encoder.recorder(|rec| {
            let shape = self.rows_of(args.x, "x")?;
            self.record_rows(gpu, rec, args, (args.x, shape, [0, 0]))
        })
    }

    /// Records the rotation of `args.x` (Q) and of `k`, in place and in one dispatch: `k`
    /// `[batch, seq, kv_heads, head_dim]` must lie after Q in Q's buffer, a whole number of
    /// head rows from Q's start, as [`Linear::parts`](crate::ops::linear::Linear::parts)
    /// gives a fused projection's Q and K (with its rows padded or not); each sequence's
    /// rows of both from its position on.
    pub fn record_pair(
        &mut self,
        gpu: &Gpu,
        encoder: &mut impl Record,
        args: &RopeArgs,
        k: &Tensor,
    ) -> Result<(), Error> {
        encoder.recorder(|rec| {
            let [batch, seq, heads, head_dim] = self.rows_of(args.x, "x")?;
            let [_, _, kv_heads, _] = self.rows_of(k, "k")?;
            let want = [batch, seq, kv_heads, head_dim];
            expect(
                k,
                "k",
                &want,
                self.scalar(),
                "[batch, seq, kv_heads, head_dim] as Q's",
            )?;
            let refused = || InputError::Unsupported {
                what: "RoPE of Q and K in one dispatch",
                needs: "K's rows after Q's in one buffer, a whole number of head rows from \
                        Q's start (as `Linear::parts` gives a fused projection's); rotate \
                        them apart otherwise",
            };
            let (both, at) = args.x.through(k).ok_or_else(refused)?;
            let rows = at / u64::from(head_dim);
            let second_at = u32::try_from(rows)
                .ok()
                .filter(|_| at.is_multiple_of(u64::from(head_dim)))
                .ok_or_else(refused)?;
            let shape = [batch, seq, heads + kv_heads, head_dim];
            self.record_rows(gpu, rec, args, (&both, shape, [kv_heads, second_at]))
        })
    }

    /// The `[batch, seq, heads, head_dim]` of `x`, checked against the kernel.
    fn rows_of(&self, x: &Tensor, name: &str) -> Result<[u32; 4], Error> {
        let shape = super::rank4(x, name, "[batch, seq, heads, head_dim]")?;
        let [batch, seq, heads, head_dim] = shape;
        for (name, value) in [("batch", batch), ("seq_len", seq), ("heads", heads)] {
            crate::shape::nonzero(name, value)?;
        }
        if head_dim != self.abi.head_dim {
            return Err(InputError::HeadDim {
                kernel: self.abi.name.to_string(),
                kernel_head_dim: self.abi.head_dim,
                given: head_dim,
            }
            .into());
        }
        expect(
            x,
            name,
            x.shape(),
            self.scalar(),
            "[batch, seq, heads, head_dim]",
        )?;
        Ok(shape)
    }

    /// The element type of the rows the kernel rotates.
    fn scalar(&self) -> Scalar {
        self.abi.binding("x").map_or(Scalar::F32, |b| b.scalar)
    }

    /// Records the rotation of `x`'s `heads` heads a token, of which the last `second[0]`
    /// lie in a second tensor `second[1]` head rows from x's start.
    fn record_rows(
        &mut self,
        gpu: &Gpu,
        rec: &mut crate::dispatch::recorder::Recorder,
        args: &RopeArgs,
        (x, [batch, seq, heads, head_dim], second): (&Tensor, [u32; 4], [u32; 2]),
    ) -> Result<(), Error> {
        if !(args.base.is_finite() && args.base > 0.0) {
            return Err(InputError::Scale(args.base).into());
        }
        expect(
            args.positions,
            "positions",
            &[batch],
            Scalar::U32,
            "[batch]",
        )?;
        if self.inv_freq.as_ref().is_none_or(|(b, _)| *b != args.base) {
            let table = inv_freq(args.base, head_dim);
            let t = Tensor::from_f32(gpu, &[table.len() as u32], Scalar::F32, &table)?;
            self.inv_freq = Some((args.base, t));
        }
        if self.pipeline.is_none() {
            self.pipeline = Some(Pipeline::new(Kernel::now(gpu, &self.abi)?));
        }
        let inv_freq = &self.inv_freq.as_ref().expect("made above").1;
        let pipeline = self.pipeline.as_mut().expect("made above");
        let mut d = Dispatch::new(vec![
            ("x", x),
            ("inv_freq", inv_freq),
            ("positions", args.positions),
        ]);
        d.dims = vec![
            ("seq_len", seq),
            ("n_heads", heads),
            ("n_kv_heads", second[0]),
            ("head_dim", head_dim),
            ("batch", batch),
            ("second_at", second[1]),
        ];
        let g = grid(pipeline.abi(), &d.dims);
        pipeline.record(gpu, rec, &d, g)
    }
}

/// `base^(-2i/head_dim)` for each pair, in f64.
pub fn inv_freq_exact(base: f32, head_dim: u32) -> Vec<f64> {
    (0..head_dim / 2)
        .map(|i| f64::from(base).powf(-2.0 * f64::from(i) / f64::from(head_dim)))
        .collect()
}

/// [`inv_freq_exact`] rounded once to f32: the table the kernel reads.
pub fn inv_freq(base: f32, head_dim: u32) -> Vec<f32> {
    inv_freq_exact(base, head_dim)
        .iter()
        .map(|x| *x as f32)
        .collect()
}
