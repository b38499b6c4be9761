//! The runtime in a browser: the seeds' layer (12 query heads over 4 KV heads, head_dim 64,
//! causal) through the forward and every backward schedule the adapter runs, and the fused
//! LayerNorm + Linear's forward and backward, each judged against the runtime's CPU
//! reference, computed in the same wasm module, by the pass rule of `check` (error at most
//! 2× the f32 baseline's, plus 1e-6).
//!
//! Everything but the page itself (`page.rs`, wasm only) is target-independent, so a native
//! test runs the same rows on lavapipe.

use attn_dsl::Masks;
use attn_dsl::row_layer::RowSums;
use attn_dsl::{Dtype, Scalar};
use runtime::ops::cache::{CacheLayout, CacheSpec, KvCache};
use runtime::ops::decode::{Decode, DecodeArgs, DecodeSpec};
use runtime::ops::forward::{Forward, ForwardArgs, ForwardSpec};
use runtime::ops::layernorm::{LayerNormLinear, LayerNormSpec};
use runtime::ops::layernorm::{layernorm_linear, layernorm_linear_backward};
use runtime::plan::kernels::AttentionSpec;
use runtime::plan::tuning;
use runtime::verify::compare::{Verdict, judge};
use runtime::verify::layernorm::judge::{LnCase, LnJudge};
use runtime::verify::random;
use runtime::verify::reference::{self, Problem, cast};
use runtime::{
    Backward, BackwardInput, Error, ForwardInput, ForwardOutput, Gpu, Gradients, Heads, Kernel,
    Schedule, Tensor, kernels,
};
use serde::Serialize;
use web_time::Instant;

#[cfg(target_arch = "wasm32")]
mod page;

/// The seeds' production layer.
pub const HEADS: Heads = Heads {
    n_heads: 12,
    n_kv_heads: 4,
    head_dim: 64,
    head_dim_v: 64,
};

/// Small enough that SwiftShader, the CPU adapter of a headless Chromium, runs the page in
/// well under a minute.
pub const DEFAULT_SEQ: u32 = 128;

/// The page's `?seq=` is refused above this: the references run on one thread.
pub const MAX_SEQ: u32 = 1024;

const SEED: u64 = 7;

/// The LayerNorm + Linear rows' shape: two row tiles of the backward (so both schedules sum
/// over tiles), and an `out` that is not a whole number of the kernels' 64-wide tiles.
pub const LAYERNORM: LnCase = LnCase {
    batch: 1,
    seq: 128,
    hidden: 64,
    out: 96,
};

/// One line of the table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    pub kernel: String,
    pub shape: String,
    /// The output nearest its bound (or furthest over it).
    pub output: &'static str,
    pub error: f64,
    pub bound: f64,
    pub pass: bool,
    /// Wall-clock ms of one run after a warm-up run: upload, dispatch and readback.
    pub ms: f64,
}

impl Row {
    fn new(kernel: String, shape: String, verdicts: &[(&'static str, Verdict)], ms: f64) -> Row {
        let worst = verdicts
            .iter()
            .max_by(|a, b| a.1.ratio().total_cmp(&b.1.ratio()));
        let (output, verdict) = worst.copied().unwrap_or((
            "none",
            Verdict {
                error: f64::INFINITY,
                bound: 0.0,
            },
        ));
        Row {
            kernel,
            shape,
            output,
            error: verdict.error,
            bound: verdict.bound,
            pass: !verdicts.is_empty() && verdicts.iter().all(|(_, v)| v.pass()),
            ms,
        }
    }
}

/// What the page shows and publishes as `window.attnReport` for the browser test.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub adapter: Option<String>,
    pub rows: Vec<Row>,
    /// Why the page could not run every row (no WebGPU, no adapter, a runtime error).
    pub error: Option<String>,
}

impl Report {
    pub fn passed(&self) -> usize {
        self.rows.iter().filter(|r| r.pass).count()
    }

    /// Failed rows, plus one for an error that stopped the page.
    pub fn failed(&self) -> usize {
        self.rows.len() - self.passed() + usize::from(self.error.is_some())
    }
}

/// The layer's inputs and the references every row is judged against, computed once.
struct Layer {
    seq: u32,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_o: Vec<f32>,
    /// O and LSE of the f64 reference in f32: the backward's saved tensors, so that each
    /// schedule is judged on its own, as `check` does.
    o: Vec<f32>,
    lse: Vec<f32>,
    forward64: reference::Attention<f64>,
    forward32: reference::Attention<f32>,
    backward64: reference::Gradients<f64>,
    backward32: reference::Gradients<f32>,
}

impl Layer {
    fn new(seq: u32) -> Layer {
        let rows = seq * HEADS.n_heads * HEADS.head_dim;
        let kv_rows = seq * HEADS.n_kv_heads * HEADS.head_dim;
        let [q, d_o] = [SEED, SEED + 3].map(|s| random(rows as usize, s));
        let [k, v] = [SEED + 1, SEED + 2].map(|s| random(kv_rows as usize, s));
        let p = problem(seq);
        let [q64, k64, v64, d_o64] = [&q, &k, &v, &d_o].map(|x| cast::<f64>(x));
        let forward64 = reference::attention(&p, &q64, &k64, &v64);
        let forward32 = reference::attention(&p, &q, &k, &v);
        let o: Vec<f32> = forward64.o.iter().map(|x| *x as f32).collect();
        let lse: Vec<f32> = forward64.lse.iter().map(|x| *x as f32).collect();
        let backward64 = reference::attention_backward(&p, [&q64, &k64, &v64, &d_o64], None);
        // The f32 baseline of the kernels' formula: P from the saved LSE, D from the saved O.
        let backward32 = reference::attention_backward(&p, [&q, &k, &v, &d_o], Some((&o, &lse)));
        Layer {
            seq,
            q,
            k,
            v,
            d_o,
            o,
            lse,
            forward64,
            forward32,
            backward64,
            backward32,
        }
    }

    fn shape(&self) -> String {
        format!(
            "seq {}, {}/{} heads, d {}, causal",
            self.seq, HEADS.n_heads, HEADS.n_kv_heads, HEADS.head_dim
        )
    }

    fn forward_input(&self) -> ForwardInput<'_> {
        ForwardInput {
            batch: 1,
            seq_len: self.seq,
            heads: HEADS,
            q: &self.q,
            k: &self.k,
            v: &self.v,
            seg: None,
            scale: None,
            mods: Default::default(),
        }
    }

    fn backward_input(&self) -> BackwardInput<'_> {
        BackwardInput {
            batch: 1,
            seq_len: self.seq,
            heads: HEADS,
            q: &self.q,
            k: &self.k,
            v: &self.v,
            o: &self.o,
            lse: &self.lse,
            d_o: &self.d_o,
            seg: None,
            scale: None,
            mods: Default::default(),
        }
    }

    fn judge_forward(&self, out: &ForwardOutput) -> [(&'static str, Verdict); 2] {
        let (r64, r32) = (&self.forward64, &self.forward32);
        [
            ("o", judge(&out.o, &r64.o, &r32.o)),
            ("lse", judge(&out.lse, &r64.lse, &r32.lse)),
        ]
    }

    fn judge_backward(&self, g: &Gradients) -> [(&'static str, Verdict); 3] {
        let (r64, r32) = (&self.backward64, &self.backward32);
        [
            ("dq", judge(&g.dq, &r64.dq, &r32.dq)),
            ("dk", judge(&g.dk, &r64.dk, &r32.dk)),
            ("dv", judge(&g.dv, &r64.dv, &r32.dv)),
        ]
    }
}

fn problem(seq: u32) -> Problem<'static> {
    Problem {
        batch: 1,
        n_q: seq as usize,
        n_k: seq as usize,
        n_heads: HEADS.n_heads as usize,
        n_kv_heads: HEADS.n_kv_heads as usize,
        head_dim: HEADS.head_dim as usize,
        scale: f64::from(HEADS.default_scale()),
        causal: true,
        ..Problem::default()
    }
}

/// Every row on `gpu` at `seq` rows: the per-row forward, each flash forward that fits the
/// device, then each backward schedule the device runs; `on_row` sees each row as it is
/// judged (the page draws it).
pub async fn run_layer(
    gpu: &Gpu,
    seq: u32,
    mut on_row: impl FnMut(&Row),
) -> Result<Vec<Row>, Error> {
    let layer = Layer::new(seq);
    let mut backward = Backward::from_kernels(gpu, &kernels::BACKWARD[..1])?;
    let mut rows = Vec::new();
    for (label, kernel) in forward_kernels(gpu, &backward.table).await? {
        let row = forward_row(gpu, &layer, label, &kernel).await?;
        on_row(&row);
        rows.push(row);
    }
    let planned = backward.plan(gpu, 1, seq, HEADS, Dtype::F32);
    for schedule in backward.schedules((HEADS.head_dim, HEADS.head_dim), Dtype::F32) {
        let row = backward_row(gpu, &layer, &mut backward, schedule, planned).await?;
        on_row(&row);
        rows.push(row);
    }
    for row in layernorm_rows(gpu).await? {
        on_row(&row);
        rows.push(row);
    }
    if seq > 1 {
        let row = decode_loop_row(gpu, &layer, (seq - 1).min(DECODE_STEPS)).await?;
        on_row(&row);
        rows.push(row);
    }
    Ok(rows)
}

/// The fused LayerNorm + Linear at [`LAYERNORM`]: the forward, then the backward (its two
/// kernels, and the reduce under two-pass) under each row-sum schedule, judged by `check`'s
/// judge and labelled as `check` labels them.
async fn layernorm_rows(gpu: &Gpu) -> Result<Vec<Row>, Error> {
    let c = LAYERNORM;
    let mut judge = LnJudge::new(c, SEED);
    let layer = |sums| {
        let spec = LayerNormSpec {
            sums: Some(sums),
            ..LayerNormSpec::new(c.rows(), c.hidden, c.out)
        };
        LayerNormLinear::new(gpu, spec)
    };
    let layers = [layer(RowSums::Atomic)?, layer(RowSums::TwoPass)?];
    // The forward is one kernel whatever the schedule: timed and judged once, and its
    // statistics saved for every backward.
    let (saved, ms) = {
        let input = judge.input();
        warm_then_time(|| layernorm_linear(gpu, &layers[0], &input)).await?
    };
    let verdicts = judge.forward(&saved);
    let mut rows = vec![Row::new(
        "layernorm_linear".into(),
        c.label(),
        &verdicts,
        ms,
    )];
    for layer in &layers {
        let (grads, ms) = {
            let input = judge.input();
            let run = || layernorm_linear_backward(gpu, layer, &input, &saved, judge.dy());
            warm_then_time(run).await?
        };
        let label = format!(
            "layernorm_linear_backward ({})",
            tuning::row_sums_name(layer.sums())
        );
        let verdicts = judge.backward(&saved, &grads);
        rows.push(Row::new(label, c.label(), &verdicts, ms));
    }
    Ok(rows)
}

/// What `run` returns, and the wall-clock ms of that call, made after a warm-up call.
async fn warm_then_time<T, F>(run: impl Fn() -> F) -> Result<(T, f64), Error>
where
    F: Future<Output = Result<T, Error>>,
{
    run().await?;
    let start = Instant::now();
    let out = run().await?;
    Ok((out, start.elapsed().as_secs_f64() * 1e3))
}

/// Tokens the page's decode loop generates.
pub const DECODE_STEPS: u32 = 16;

/// The layer as a decode loop on the page's device: the first rows prefilled into a KV
/// cache on the device (the prompt's forward and its append), then each later row appended
/// and decoded against the cache, one step at a time. Row s of the result is the
/// forward's row s, judged as the forward is.
async fn decode_loop_row(gpu: &Gpu, layer: &Layer, steps: u32) -> Result<Row, Error> {
    let h = HEADS;
    let prompt = layer.seq - steps;
    let f = Scalar::F32;
    let q_row = (h.n_heads * h.head_dim) as usize;
    let kv_row = (h.n_kv_heads * h.head_dim) as usize;
    let rows = |data: &[f32], width: usize, from: u32, n: u32, heads: u32| {
        let slice = &data[from as usize * width..][..n as usize * width];
        Tensor::from_f32(gpu, &[1, n, heads, h.head_dim], f, slice)
    };
    let mut cache = KvCache::new(
        gpu,
        CacheSpec {
            slots: 1,
            n_kv_heads: h.n_kv_heads,
            head_dim: h.head_dim,
            head_dim_v: h.head_dim_v,
            dtype: Dtype::F32,
            layout: CacheLayout::Contiguous {
                capacity: layer.seq,
            },
            kv_fp8: None,
        },
    )?;
    let spec = ForwardSpec {
        head_dim: h.head_dim,
        head_dim_v: h.head_dim,
        masks: Masks::new(true, false),
        dtype: Dtype::F32,
    };
    let mut forward = Forward::new(gpu, spec)?;
    forward.prepare(gpu, 1, prompt, h).await?;
    let mut decode = Decode::new(gpu, DecodeSpec::new(h.head_dim, h.head_dim_v, Dtype::F32))?;
    decode.prepare(gpu).await?;
    let q = rows(&layer.q, q_row, 0, prompt, h.n_heads)?;
    let k = rows(&layer.k, kv_row, 0, prompt, h.n_kv_heads)?;
    let v = rows(&layer.v, kv_row, 0, prompt, h.n_kv_heads)?;
    let o = Tensor::zeros(gpu, q.shape(), f)?;
    let lse = Tensor::zeros(gpu, &[1, prompt, h.n_heads], f)?;
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    cache.open(&mut enc, 0)?;
    let args = ForwardArgs::new(&q, &k, &v, &o, &lse);
    cache.prefill(gpu, &mut enc, &mut forward, 0, &args)?;
    gpu.queue.submit([enc.finish()]);
    let mut out = o.to_f32(gpu).await?;
    let o_step = Tensor::zeros(gpu, &[1, h.n_heads, h.head_dim], f)?;
    let start = Instant::now();
    for t in prompt..layer.seq {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        let (k, v) = (
            rows(&layer.k, kv_row, t, 1, h.n_kv_heads)?,
            rows(&layer.v, kv_row, t, 1, h.n_kv_heads)?,
        );
        cache.append(gpu, &mut enc, 0, &k, &v)?;
        let q = rows(&layer.q, q_row, t, 1, h.n_heads)?.reshape(&[1, h.n_heads, h.head_dim])?;
        let args = DecodeArgs {
            rows: Default::default(),
            q: &q,
            cache: cache.view(),
            o: &o_step,
            scale: None,
            mods: Default::default(),
            slice_len: None,
        };
        decode.record(gpu, &mut enc, &args)?;
        gpu.queue.submit([enc.finish()]);
        out.extend(o_step.to_f32(gpu).await?);
    }
    let ms = start.elapsed().as_secs_f64() * 1e3 / f64::from(steps);
    let (r64, r32) = (&layer.forward64, &layer.forward32);
    Ok(Row::new(
        format!("decode loop: prefill {prompt}, then {steps} steps (KV cache on the device)"),
        layer.shape(),
        &[("o", judge(&out, &r64.o, &r32.o))],
        ms,
    ))
}

/// The family's per-row forward and the flash forward candidates that fit the device,
/// labelled as `check` labels them.
async fn forward_kernels(gpu: &Gpu, table: &tuning::Table) -> Result<Vec<(String, Kernel)>, Error> {
    let per_row = Kernel::new(gpu, &kernels::attention_forward::ABI).await?;
    let mut out = vec![(per_row.name().to_string(), per_row)];
    let planned = table.forward(gpu, HEADS.head_dim, Dtype::F32);
    for config in tuning::forward_candidates(HEADS.head_dim) {
        let abi = runtime::plan::kernels::flash_forward(
            AttentionSpec::new(HEADS.head_dim, Masks::new(true, true), Dtype::F32),
            config,
        )
        .map_err(|e| Error::Pipeline {
            kernel: format!("flash forward {}", config.label()),
            message: e.to_string(),
        })?;
        if tuning::fits(gpu, &abi) {
            let mut label = format!("forward flash {}", config.label());
            if planned == Some(config) {
                label += " (planned)";
            }
            out.push((label, Kernel::new(gpu, &abi).await?));
        }
    }
    Ok(out)
}

async fn forward_row(
    gpu: &Gpu,
    layer: &Layer,
    label: String,
    kernel: &Kernel,
) -> Result<Row, Error> {
    let input = layer.forward_input();
    runtime::forward(gpu, kernel, &input).await?;
    let start = Instant::now();
    let out = runtime::forward(gpu, kernel, &input).await?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    Ok(Row::new(
        label,
        layer.shape(),
        &layer.judge_forward(&out),
        ms,
    ))
}

async fn backward_row(
    gpu: &Gpu,
    layer: &Layer,
    backward: &mut Backward,
    schedule: Schedule,
    planned: Schedule,
) -> Result<Row, Error> {
    let input = layer.backward_input();
    backward
        .run(gpu, &input, Some(schedule), Dtype::F32)
        .await?;
    let start = Instant::now();
    let (grads, _) = backward
        .run(gpu, &input, Some(schedule), Dtype::F32)
        .await?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let mut label = format!("backward {schedule}");
    if schedule == planned {
        label += " (planned)";
    }
    Ok(Row::new(
        label,
        layer.shape(),
        &layer.judge_backward(&grads),
        ms,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_reports_its_worst_output_and_fails_if_any_does() {
        let v = |error, bound| Verdict { error, bound };
        let row = Row::new(
            "k".into(),
            "s".into(),
            &[
                ("dq", v(1.0, 4.0)),
                ("dk", v(3.0, 2.0)),
                ("dv", v(1.0, 2.0)),
            ],
            1.5,
        );
        assert_eq!((row.output, row.error, row.bound), ("dk", 3.0, 2.0));
        assert!(!row.pass);
        let empty = Row::new("k".into(), "s".into(), &[], 0.0);
        assert!(!empty.pass);
    }

    #[test]
    fn an_error_counts_as_a_failure() {
        let report = Report {
            error: Some("no adapter".into()),
            ..Report::default()
        };
        assert_eq!((report.passed(), report.failed()), (0, 1));
    }
}
