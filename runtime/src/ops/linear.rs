//! A Linear at decode's row counts on device tensors: `y = x·Wᵀ (+ b)`, an engine's Q, K,
//! V and O projections of a few rows. Each weight is read once for every row, so the op
//! runs at the rate W streams from memory (`linear_rows`); W may be held in f16 or bf16,
//! half the bytes of f32.
//!
//! The planner picks the kernel from the row count: one for 1, 2, 4, 8 or 16 rows per
//! workgroup (the smallest that holds the call's rows, so that a single row keeps one
//! sum per column and lane), and past 16 rows more workgroups of 16, each reading W again.
//!
//! A fused projection (an engine's Q, K and V from one W of their rows stacked) is one
//! Linear whose output is cut into parts ([`LinearSpec::parts`]): each part's rows are
//! stored whole before the next part's, so that [`Linear::parts`] hands each back as a
//! tensor of its own for the ops after it, and one dispatch reads all of W.

use attn_dsl::{Dtype, KernelAbi, Scalar};

use super::grid;
use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::dispatch::record::{ByTile, Dispatch};
use crate::dispatch::recorder::Record;
use crate::error::Error;
use crate::modifiers::expect;
use crate::tensor::Tensor;

/// The most rows one workgroup holds; more rows take more workgroups.
pub use attn_dsl::layout::rows::LINEAR_MAX_ROWS;

/// A Linear's widths, the dtype its weights are held in, and those of its x and y.
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
    /// The widths y's columns are cut into, up to three (unused ones 0, at the end), adding
    /// up to `out`: part p's `[rows, parts[p]]` rows follow part p−1's in y. `[out, 0, 0]`
    /// is y row by row.
    pub parts: [u32; 3],
    /// x's element type: f32, f16 (SHADER_F16) or bf16; widened exactly as it is read (an
    /// attention output in its cache's dtype needs no conversion first).
    pub x: Dtype,
    /// y's element type: f32, or each sum (in f32) rounded once into f16 or bf16 as it is
    /// stored (Q, K and V straight into their cache's dtype). A half y is written two
    /// columns a word: each part's width must be even.
    pub y: Dtype,
}

impl LinearSpec {
    /// `y = x·Wᵀ`, W held in `weights`, no bias, y row by row.
    pub fn new(hidden: u32, out: u32, weights: Dtype) -> LinearSpec {
        LinearSpec {
            hidden,
            out,
            weights,
            bias: false,
            parts: [out, 0, 0],
            x: Dtype::F32,
            y: Dtype::F32,
        }
    }

    /// Where each part starts among y's columns, as the kernel's `part1` and `part2`
    /// (0: no such part); refused unless the parts cut `out`.
    fn starts(&self) -> Result<[u32; 2], Error> {
        let [a, b, c] = self.parts;
        let cut = a > 0
            && (b > 0 || c == 0)
            && u64::from(a) + u64::from(b) + u64::from(c) == u64::from(self.out);
        if !cut {
            return Err(crate::error::InputError::LinearParts {
                parts: self.parts,
                out: self.out,
            }
            .into());
        }
        if self.y != Dtype::F32 && self.parts.iter().any(|w| w % 2 == 1) {
            let needs = "parts of even widths (it writes two columns a word), or y in f32";
            return Err(crate::error::InputError::Unsupported {
                what: "a Linear writing f16 or bf16",
                needs,
            }
            .into());
        }
        Ok([if b > 0 { a } else { 0 }, if c > 0 { a + b } else { 0 }])
    }
}

/// One call: x `[rows, hidden]` in the spec's `x` dtype, W `[out, hidden]` in its weights
/// dtype (the Linear's weight as PyTorch lays it out), b `[out]` f32 where the spec has a
/// bias, y `[rows, out]` in its `y` dtype (overwritten; its parts one after another where
/// the spec cuts it, and then y may hold [`Linear::part_rows`]'s rows, the rows past x's
/// untouched).
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
    kernels: ByTile,
}

impl Linear {
    /// Checks `spec` against the device (f16 weights, x or y need SHADER_F16) and its parts
    /// against `out`, and compiles the single-row kernel; the others compile on the first
    /// call that needs them.
    pub fn new(gpu: &Gpu, spec: LinearSpec) -> Result<Linear, Error> {
        spec.starts()?;
        let abi = compile(&spec, 1)?;
        gpu.require(&abi)?;
        Ok(Linear {
            spec,
            kernels: ByTile::default(),
        })
    }

    /// The spec it was built for.
    pub fn spec(&self) -> LinearSpec {
        self.spec
    }

    /// The parts of a call's output `y` (`[rows, out]`, or a copy of it in another
    /// dtype), each `[rows, width]` in y's buffer: a fused projection's Q, K and V for the
    /// ops after it. Where y's buffer cannot bind a part at its offset (the device's
    /// storage offset alignment), the op that is given it refuses it.
    pub fn parts(&self, y: &Tensor) -> Result<Vec<Tensor>, Error> {
        let rows = y.shape().first().copied().unwrap_or(0);
        expect(y, "y", &[rows, self.spec.out], y.scalar(), "[rows, out]")?;
        let mut start = 0u64;
        let mut parts = Vec::new();
        for width in self.spec.parts.into_iter().filter(|w| *w > 0) {
            parts.push(y.slice(start, &[rows, width])?);
            start += u64::from(rows) * u64::from(width);
        }
        Ok(parts)
    }

    /// The rows a cut y should hold for a call of `rows` rows so that each of its parts
    /// starts at an offset the device can bind in `dtype` (y's or a copy's element type): a
    /// few rows of narrow parts (Q, K and V of a small model at a decode step) put the
    /// second part at a few hundred bytes. `rows` itself where it already binds; a count
    /// that binds in a dtype binds in every wider one.
    pub fn part_rows(&self, gpu: &Gpu, rows: u32, dtype: Dtype) -> u32 {
        let align = u64::from(gpu.limits().min_storage_buffer_offset_alignment).max(1);
        let [a, b, _] = self.spec.parts.map(u64::from);
        let step = [a, a + b]
            .into_iter()
            .filter(|start| *start > 0 && *start < u64::from(self.spec.out))
            .map(|start| align / gcd(align, start * u64::from(dtype.bytes())))
            .max()
            .unwrap_or(1);
        let padded = u64::from(rows).div_ceil(step) * step;
        u32::try_from(padded).unwrap_or(rows)
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
            let (tensors, [rows, y_rows]) = self.checked(gpu, args)?;
            let per = Linear::rows_per_workgroup(rows);
            let pipeline = self
                .kernels
                .get(per, || Kernel::now(gpu, &compile(&s, per)?))?;
            let [part1, part2] = s.starts()?;
            let mut d = Dispatch::new(tensors);
            d.dims = vec![
                ("rows", rows),
                ("hidden", s.hidden),
                ("out", s.out),
                ("part1", part1),
                ("part2", part2),
                ("y_rows", y_rows),
            ];
            let g = grid(pipeline.abi(), &d.dims);
            pipeline.record(gpu, rec, &d, g)
        })
    }

    /// A call's tensors, each checked, and its rows and y's rows.
    fn checked<'a>(
        &self,
        gpu: &Gpu,
        args: &LinearArgs<'a>,
    ) -> Result<(Bound<'a>, [u32; 2]), Error> {
        let s = self.spec;
        let rows = args.x.shape().first().copied().unwrap_or(0);
        crate::shape::nonzero("rows", rows)?;
        let f = Scalar::F32;
        expect(args.x, "x", &[rows, s.hidden], s.x.into(), "[rows, hidden]")?;
        let w_dtype = Scalar::from(s.weights);
        expect(args.w, "w", &[s.out, s.hidden], w_dtype, "[out, hidden]")?;
        // A cut y holds the call's rows or the padded count of `part_rows` (in a 2- or
        // 4-byte dtype): any other count would move the parts where a caller who split a
        // view of y would not look for them.
        let given = args.y.shape().first().copied().unwrap_or(0);
        let padded = [Dtype::F16, Dtype::F32].map(|d| self.part_rows(gpu, rows, d));
        let y_rows = match s.parts[1] > 0 && padded.contains(&given) {
            true => given,
            false => rows,
        };
        let layout = "[rows, out], or `part_rows` rows where y is cut into parts";
        expect(args.y, "y", &[y_rows, s.out], s.y.into(), layout)?;
        let mut tensors = vec![("x", args.x), ("w", args.w), ("y", args.y)];
        let refused = |what, needs| crate::error::InputError::Unsupported { what, needs };
        match (s.bias, args.b) {
            (true, Some(b)) => {
                expect(b, "b", &[s.out], f, "[out]")?;
                tensors.push(("bias", b));
            }
            (true, None) => {
                let needs = "its bias, `b` (the spec says it has one)";
                return Err(refused("this Linear", needs).into());
            }
            (false, Some(_)) => {
                let needs = "a Linear built with `bias: true`";
                return Err(refused("a bias", needs).into());
            }
            (false, None) => {}
        }
        Ok((tensors, [rows, y_rows]))
    }
}

/// A call's tensors by binding name.
type Bound<'a> = Vec<(&'static str, &'a Tensor)>;

/// The `linear_rows` kernel of `spec` for `rows` rows per workgroup.
fn compile(spec: &LinearSpec, rows: u32) -> Result<KernelAbi, Error> {
    let io = |what: &str, d: Dtype| match d {
        Dtype::F32 => String::new(),
        d => format!("_{what}{}", d.name()),
    };
    let name = format!(
        "linear_rows_{}x{}_{}{}{}_r{rows}",
        spec.hidden,
        spec.out,
        spec.weights.name(),
        io("x", spec.x),
        io("y", spec.y),
    );
    let k = attn_dsl::row_layer::linear_rows(
        &name,
        [spec.hidden, spec.out],
        rows,
        spec.weights,
        spec.bias,
        [spec.x, spec.y],
    );
    attn_dsl::compile(&k).map_err(|e| Error::Pipeline {
        kernel: name,
        message: e.to_string(),
    })
}

/// The greatest common divisor of `a` and `b`.
fn gcd(a: u64, b: u64) -> u64 {
    match b {
        0 => a,
        _ => gcd(b, a % b),
    }
}
