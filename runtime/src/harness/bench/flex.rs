//! The user-written modifiers against the built-in ones (issue 28, items 4 and 5): the
//! forward through the recording API with the planner's kernel, each built-in mask or
//! score modifier beside the library modifier that writes it, and a sparse mask (a
//! sliding window with sink tokens) beside the dense and causal forwards, whose time
//! should follow the tiles it visits.

use attn_dsl::flex::library;
use attn_dsl::flex::{Dim, Flex, Ty};
use attn_dsl::{Dtype, Masks, Scalar};

use crate::attention::Heads;
use crate::error::Error;
use crate::modifiers::{DeviceModifiers, FlexOf};
use crate::ops::forward::{Forward, ForwardArgs, ForwardSpec};
use crate::tensor::Tensor;
use crate::{Gpu, timing};

/// One forward timed: what it runs, its median GPU time, and the fraction of the (query,
/// key) pairs its mask keeps.
pub struct FlexRow {
    pub what: String,
    pub ms: f64,
    pub visible: f64,
}

/// A forward's masks and modifier values, by what they say.
struct Variant {
    what: String,
    masks: Masks,
    window: Option<u32>,
    softcap: Option<f32>,
    alibi: bool,
    visible: f64,
}

fn variants(seq: u32, window: u32) -> Vec<Variant> {
    let n = f64::from(seq);
    let causal_frac = (n + 1.0) / (2.0 * n);
    let w = f64::from(window.min(seq));
    let window_frac = (w * n - w * (w - 1.0) / 2.0) / (n * n);
    let sinks = 4.0;
    let sink_frac = window_frac + sinks * (n - w).max(0.0) / (n * n);
    let flex = |mask, score: Option<attn_dsl::flex::Expr>, tensors| Masks {
        flex: Some(
            Flex {
                score_mod: score,
                mask_mod: mask,
                tensors,
            }
            .intern(),
        ),
        ..Masks::default()
    };
    let built = |causal, window: bool| Masks {
        window,
        ..Masks::new(causal, false)
    };
    let slopes = vec![library::tensor("slopes", &[Dim::Heads], Ty::F32)];
    let plain = |what: &str, masks, visible| Variant {
        what: what.into(),
        masks,
        window: None,
        softcap: None,
        alibi: false,
        visible,
    };
    vec![
        plain("dense (no mask)", Masks::default(), 1.0),
        plain("causal, built-in", built(true, false), causal_frac),
        plain(
            "causal, mask_mod k <= q",
            flex(Some(library::causal()), None, vec![]),
            causal_frac,
        ),
        // Both: the built-in word's key range with the modifier's per-pair test and tile
        // loop, to tell the two costs apart.
        plain(
            "causal built-in + mask_mod k <= q",
            Masks {
                causal: true,
                ..flex(Some(library::causal()), None, vec![])
            },
            causal_frac,
        ),
        Variant {
            window: Some(window),
            ..plain(
                &format!("window {window}, built-in"),
                built(true, true),
                window_frac,
            )
        },
        plain(
            &format!("window {window}, mask_mod"),
            flex(
                Some(library::sliding_window(i64::from(window))),
                None,
                vec![],
            ),
            window_frac,
        ),
        plain(
            &format!("window {window} + 4 sinks, mask_mod"),
            flex(
                Some(library::window_with_sinks(i64::from(window), 4)),
                None,
                vec![],
            ),
            sink_frac,
        ),
        Variant {
            softcap: Some(30.0),
            ..plain(
                "causal + softcap 30, built-in",
                Masks {
                    softcap: true,
                    ..built(true, false)
                },
                causal_frac,
            )
        },
        plain(
            "causal + softcap 30, score_mod",
            flex(
                Some(library::causal()),
                Some(library::softcap(30.0)),
                vec![],
            ),
            causal_frac,
        ),
        Variant {
            alibi: true,
            ..plain(
                "causal + ALiBi, built-in",
                Masks {
                    alibi: true,
                    ..built(true, false)
                },
                causal_frac,
            )
        },
        plain(
            "causal + ALiBi, score_mod",
            flex(
                Some(library::causal()),
                Some(library::alibi("slopes")),
                slopes,
            ),
            causal_frac,
        ),
    ]
}

/// Every variant's forward at `seq` (batch 1, `h`), in `dtype`.
pub fn flex(
    gpu: &Gpu,
    h: Heads,
    seq: u32,
    window: u32,
    dtype: Dtype,
    (warmup, runs): (usize, usize),
) -> Result<Vec<FlexRow>, Error> {
    let q_shape = [1, seq, h.n_heads, h.head_dim];
    let kv_shape = [1, seq, h.n_kv_heads, h.head_dim];
    let data = |shape: &[u32], seed| {
        let n = shape.iter().map(|&d| d as usize).product();
        Tensor::from_f32(
            gpu,
            shape,
            Scalar::from(dtype),
            &crate::cases::random(n, seed),
        )
    };
    let (q, k, v) = (data(&q_shape, 1)?, data(&kv_shape, 2)?, data(&kv_shape, 3)?);
    let o = Tensor::zeros(gpu, &q_shape, Scalar::from(dtype));
    let lse = Tensor::zeros(gpu, &[1, seq, h.n_heads], Scalar::F32);
    let slope_values: Vec<f32> = (0..h.n_heads)
        .map(|i| (-8.0 * (i + 1) as f32 / h.n_heads as f32).exp2())
        .collect();
    let slopes = Tensor::from_f32(gpu, &[h.n_heads], Scalar::F32, &slope_values)?;
    let flex_slopes = [("slopes", &slopes)];
    let mut rows = Vec::new();
    for variant in variants(seq, window) {
        let spec = ForwardSpec {
            head_dim: h.head_dim,
            masks: variant.masks,
            dtype,
        };
        let mut forward = Forward::new(gpu, spec)?;
        let tensors: &[(&str, &Tensor)] = match variant.masks.flex {
            Some(f) if !f.parsed().tensors.is_empty() => &flex_slopes,
            _ => &[],
        };
        let mods = DeviceModifiers {
            window: variant.window,
            softcap: variant.softcap,
            alibi: variant.alibi.then_some(&slopes),
            flex: variant
                .masks
                .flex
                .map(|modifiers| FlexOf { modifiers, tensors }),
            ..DeviceModifiers::default()
        };
        let args = ForwardArgs {
            mods,
            ..ForwardArgs::new(&q, &k, &v, &o, &lse)
        };
        // Compiled before timing.
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        forward.record(gpu, &mut encoder, &args)?;
        gpu.queue.submit([encoder.finish()]);
        let mut failed = None;
        let t = timing::time_encoded(gpu, warmup, runs, |enc| {
            if let Err(e) = forward.record(gpu, enc, &args) {
                failed = Some(e);
            }
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        rows.push(FlexRow {
            what: variant.what,
            ms: t.median_ms,
            visible: variant.visible,
        });
    }
    Ok(rows)
}
