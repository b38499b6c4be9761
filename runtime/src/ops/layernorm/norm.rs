//! A LayerNorm alone on device tensors: `y = x̂·γ + β` of each row, for inference. An
//! engine normalizes once and then projects the rows several ways (a fused projection of
//! Q, K and V is one [`Linear`](crate::ops::linear::Linear) cut into parts), where a
//! [`LayerNormLinear`](super::LayerNormLinear) per projection would normalize each time.

use attn_dsl::row_layer::norm_rows;
use attn_dsl::{Dtype, Scalar};

use super::Saved;
use crate::device::Gpu;
use crate::dispatch::record::{ByTile, Dispatch};
use crate::dispatch::recorder::Record;
use crate::error::Error;
use crate::modifiers::expect;
use crate::ops::grid;
use crate::tensor::Tensor;

/// One call: x `[rows, hidden]`, γ and β `[hidden]`, y `[rows, hidden]` (written), all
/// f32; `eps` is added to each row's variance.
#[derive(Clone, Copy, Debug)]
pub struct NormArgs<'a> {
    /// The rows.
    pub x: &'a Tensor,
    /// The scale γ.
    pub gamma: &'a Tensor,
    /// The shift β.
    pub beta: &'a Tensor,
    /// The normalized rows, written.
    pub y: &'a Tensor,
    /// LayerNorm's epsilon.
    pub eps: f32,
}

/// The LayerNorm of rows `hidden` wide (a multiple of 4), one dispatch a call, its rows
/// per workgroup planned from the call's rows ([`norm_rows`]): one row on all of a
/// workgroup's lanes at decode's few rows, up to [`NORM_ROWS`] where there are many.
///
/// [`NORM_ROWS`]: attn_dsl::row_layer::NORM_ROWS
pub struct LayerNorm {
    hidden: u32,
    /// The kernel of each rows-per-workgroup the planner has used.
    pipelines: ByTile,
    /// The statistics where the caller keeps none, grown to the most rows called.
    stats: Option<[Tensor; 2]>,
}

impl LayerNorm {
    /// The `layernorm_rows` kernels for rows `hidden` wide, checked against `gpu` with the
    /// one-row kernel; the others compile on the first call that plans them.
    pub fn new(gpu: &Gpu, hidden: u32) -> Result<LayerNorm, Error> {
        let mut pipelines = ByTile::default();
        pipelines.get(1, || super::compiled(gpu, spec(hidden, 1)))?;
        Ok(LayerNorm {
            hidden,
            pipelines,
            stats: None,
        })
    }

    /// Records `y = x̂·γ + β`, every tensor checked first; each row's mean and 1/std go to
    /// `saved` where given (a backward's), else to the op's own scratch.
    pub fn record(
        &mut self,
        gpu: &Gpu,
        encoder: &mut impl Record,
        args: &NormArgs,
        saved: Option<Saved>,
    ) -> Result<(), Error> {
        let rows = args.x.shape().first().copied().unwrap_or(0);
        crate::shape::nonzero("rows", rows)?;
        let (h, f) = (self.hidden, Scalar::F32);
        expect(args.x, "x", &[rows, h], f, "[rows, hidden]")?;
        expect(args.gamma, "gamma", &[h], f, "[hidden]")?;
        expect(args.beta, "beta", &[h], f, "[hidden]")?;
        expect(args.y, "y", &[rows, h], f, "[rows, hidden]")?;
        let own;
        let saved = match saved {
            Some(s) => s,
            None => {
                own = self.stats(gpu, rows)?;
                Saved {
                    mean: &own[0],
                    rstd: &own[1],
                }
            }
        };
        let mut d = Dispatch::new(vec![
            ("x", args.x),
            ("gamma", args.gamma),
            ("beta", args.beta),
            ("xn", args.y),
            ("mean", saved.mean),
            ("rstd", saved.rstd),
        ]);
        d.dims = vec![("rows", rows), ("hidden", h)];
        d.params = vec![("eps", args.eps)];
        let tile = norm_rows(rows);
        let pipeline = self
            .pipelines
            .get(tile, || super::compiled(gpu, spec(h, tile)))?;
        let g = grid(pipeline.abi(), &d.dims);
        encoder.recorder(|rec| pipeline.record(gpu, rec, &d, g))
    }

    /// Views `[rows]` of the op's own statistics, grown where they are shorter.
    fn stats(&mut self, gpu: &Gpu, rows: u32) -> Result<[Tensor; 2], Error> {
        if self
            .stats
            .as_ref()
            .is_none_or(|s| s[0].len() < u64::from(rows))
        {
            let zeros = || Tensor::zeros(gpu, &[rows], Scalar::F32);
            self.stats = Some([zeros()?, zeros()?]);
        }
        let [mean, rstd] = self.stats.as_ref().expect("grown above");
        Ok([mean.view(&[rows])?, rstd.view(&[rows])?])
    }
}

/// The f32 LayerNorm pass of `tile` rows per workgroup.
fn spec(hidden: u32, tile: u32) -> attn_dsl::KernelSpec {
    let name = format!("layernorm_rows_f32_t{tile}");
    attn_dsl::row_layer::rows_spec(&name, hidden, Dtype::F32, tile)
}
