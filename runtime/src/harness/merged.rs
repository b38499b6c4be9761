//! Attention states merged on the device, for `check`: a problem's keys split into parts,
//! each part's O and LSE from the f64 reference stored as a kernel stores them (O in the
//! dtype, LSE in f32), merged by [`Merge`] and judged against attention over all the keys.
//! The bound comes from the same merge done on the host in f32 from the same stored parts.

use attn_dsl::{Dtype, Scalar};
use pollster::FutureExt as BlockOn;

use crate::device::Gpu;
use crate::error::Error;
use crate::modifiers::Modifiers;
use crate::ops::merge::{Merge, MergeArgs, MergeSpec};
use crate::tensor::Tensor;
use crate::tensor::buffers::rounded;
use crate::verify::compare::{Verdict, judge};
use crate::verify::reference::{self, Attention, Problem};

/// The splits tried on `keys` keys: after the first key, at a third, at the half, before
/// the last key, and in three parts at the thirds (each cut strictly inside, duplicates
/// dropped). Causal rows before a cut see no key of the later part: an empty part.
pub fn splits(keys: usize) -> Vec<Vec<usize>> {
    let mut all: Vec<Vec<usize>> = [
        vec![1],
        vec![keys / 3],
        vec![keys / 2],
        vec![keys.saturating_sub(1)],
        vec![keys / 3, 2 * keys / 3],
    ]
    .into_iter()
    .filter(|cuts| cuts.iter().all(|&c| c > 0 && c < keys) && cuts.windows(2).all(|w| w[0] < w[1]))
    .collect();
    all.dedup();
    all
}

/// The merges a case needs, compiled once each.
#[derive(Default)]
pub struct Merges {
    compiled: Vec<(MergeSpec, Merge)>,
}

impl Merges {
    fn get(&mut self, gpu: &Gpu, spec: MergeSpec) -> Result<&mut Merge, Error> {
        let at = match self.compiled.iter().position(|(s, _)| *s == spec) {
            Some(at) => at,
            None => {
                self.compiled.push((spec, Merge::new(gpu, spec)?));
                self.compiled.len() - 1
            }
        };
        Ok(&mut self.compiled[at].1)
    }
}

/// Rows of verdicts, each with its label.
type Rows = Vec<(String, Vec<(&'static str, Verdict)>)>;

/// One row per split of [`splits`] and dtype: `p`'s keys cut there, each part attended
/// without the sinks (f64, on `inputs` Q, K, V), the parts merged on the device with the
/// sinks `p` has; verdicts for O and LSE against `p` over all keys.
pub fn rows(
    gpu: &Gpu,
    merges: &mut Merges,
    p: &Problem,
    inputs: [&[f32]; 3],
    dtypes: &[Dtype],
) -> Result<Rows, Error> {
    // The merge reads and writes rows of whole vec4s.
    if !p.dv().is_multiple_of(4) {
        return Ok(Vec::new());
    }
    let [q, k, v] = inputs.map(reference::cast::<f64>);
    let whole = reference::attention(p, &q, &k, &v);
    let mut rows = Vec::new();
    for cuts in splits(p.n_k) {
        let mut bounds = vec![0];
        bounds.extend(&cuts);
        bounds.push(p.n_k);
        let parts: Vec<Attention<f64>> = bounds
            .windows(2)
            .map(|w| {
                let part = Problem {
                    keys: Some((w[0], w[1])),
                    mods: Modifiers {
                        sinks: None,
                        ..p.mods
                    },
                    ..*p
                };
                reference::attention(&part, &q, &k, &v)
            })
            .collect();
        for &dtype in dtypes {
            let verdicts = merged(gpu, merges, p, &parts, &whole, dtype)?;
            let label = format!("merge {} parts at {cuts:?}, {}", parts.len(), dtype.name());
            rows.push((label, verdicts));
        }
    }
    Ok(rows)
}

/// The parts stored in `dtype` (O) and f32 (LSE), merged on the device and on the host,
/// judged against `whole`.
fn merged(
    gpu: &Gpu,
    merges: &mut Merges,
    p: &Problem,
    parts: &[Attention<f64>],
    whole: &Attention<f64>,
    dtype: Dtype,
) -> Result<Vec<(&'static str, Verdict)>, Error> {
    let scalar = Scalar::from(dtype);
    let narrow = |x: &[f64]| x.iter().map(|v| *v as f32).collect::<Vec<f32>>();
    let o_parts: Vec<Vec<f32>> = parts
        .iter()
        .map(|a| rounded(&narrow(&a.o), scalar))
        .collect();
    let lse_parts: Vec<Vec<f32>> = parts.iter().map(|a| narrow(&a.lse)).collect();
    let (b, n, h, d) = (p.batch, p.n_q, p.n_heads, p.dv());
    let shape = [b, n, h, d].map(|x| x as u32);
    let stacked = |parts: &[Vec<f32>]| parts.concat();
    let count = parts.len() as u32;
    let o_in = Tensor::from_f32(
        gpu,
        &[&[count][..], &shape].concat(),
        scalar,
        &stacked(&o_parts),
    )?;
    let lse_in = Tensor::from_f32(
        gpu,
        &[count, shape[0], shape[1], shape[2]],
        Scalar::F32,
        &stacked(&lse_parts),
    )?;
    let o = Tensor::zeros(gpu, &shape, scalar)?;
    let lse = Tensor::zeros(gpu, &shape[..3], Scalar::F32)?;
    let sinks = p
        .mods
        .sinks
        .map(|s| Tensor::from_f32(gpu, &[h as u32], Scalar::F32, s))
        .transpose()?;
    let spec = MergeSpec {
        sinks: sinks.is_some(),
        ..MergeSpec::new(d as u32, dtype)
    };
    let merge = merges.get(gpu, spec)?;
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    let args = MergeArgs {
        o_parts: &o_in,
        lse_parts: &lse_in,
        o: &o,
        lse: &lse,
        sinks: sinks.as_ref(),
    };
    merge.record(gpu, &mut encoder, &args)?;
    gpu.queue.submit([encoder.finish()]);
    let (got_o, got_lse) = (o.to_f32(gpu).block_on()?, lse.to_f32(gpu).block_on()?);
    let (host_o, host_lse) = reference::merge_states(&o_parts, &lse_parts, d, h, p.mods.sinks);
    Ok(vec![
        ("o", judge(&got_o, &whole.o, &rounded(&host_o, scalar))),
        ("lse", judge(&got_lse, &whole.lse, &host_lse)),
    ])
}
