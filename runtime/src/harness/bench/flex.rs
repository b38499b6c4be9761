//! The user-written modifiers against the built-in ones: the
//! forward through the recording API with the planner's kernel, each built-in mask or
//! score modifier beside the library modifier that writes it, and a sparse mask (a
//! sliding window with sink tokens) beside the dense and causal forwards, whose time
//! should follow the tiles it visits.

use attn_dsl::flex::library;
use attn_dsl::flex::{Dim, Flex, Ty};
use attn_dsl::{Dtype, Masks, Scalar};

use crate::device::Gpu;
use crate::error::Error;
use crate::modifiers::{DeviceModifiers, FlexOf};
use crate::ops::backward::BackwardSpec;
use crate::ops::decode::{CacheView, Decode, DecodeArgs, DecodeSpec};
use crate::ops::forward::{Forward, ForwardArgs, ForwardSpec};
use crate::shape::Heads;
use crate::tensor::Tensor;
use crate::timing;

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

/// The variants of a forward at `seq`, or with `decode` of one decode row at a cache of
/// `seq` rows (whose last row every key precedes: its causal words are no mask).
fn variants(seq: u32, window: u32, decode: bool) -> Vec<Variant> {
    let n = f64::from(seq);
    let w = f64::from(window.min(seq));
    let sinks = 4.0;
    let (causal_frac, window_frac, sink_frac) = match decode {
        false => {
            let window_frac = (w * n - w * (w - 1.0) / 2.0) / (n * n);
            let sink_frac = window_frac + sinks * (n - w).max(0.0) / (n * n);
            ((n + 1.0) / (2.0 * n), window_frac, sink_frac)
        }
        true => (1.0, w / n, (w + sinks.min((n - w).max(0.0))) / n),
    };
    let flex = |mask, score: Option<attn_dsl::flex::Expr>, tensors| Masks {
        flex: Some(
            Flex {
                score_mod: score,
                mask_mod: mask,
                tensors,
                ..Flex::default()
            }
            .intern(),
        ),
        ..Masks::default()
    };
    let built = |causal: bool, window: bool| Masks {
        window,
        ..Masks::new(causal && !decode, false)
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
    let mut all = vec![
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
                causal: !decode,
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
    ];
    // In a decode the causal word is no mask: a variant that is then another's is dropped.
    let mut seen = Vec::new();
    all.retain(|v| {
        let key = (v.masks, v.window, v.softcap.map(f32::to_bits), v.alibi);
        let new = !seen.contains(&key);
        seen.push(key);
        new
    });
    all
}

impl Variant {
    /// The values of its modifiers: the window, the cap, and `slopes` (one named tensor,
    /// `[heads]`) for ALiBi, built in or as a `score_mod`.
    fn modifiers<'a>(&self, slopes: &'a [(&'a str, &'a Tensor); 1]) -> DeviceModifiers<'a> {
        let tensors: &[(&str, &Tensor)] = match self.masks.flex {
            Some(f) if !f.parsed().tensors.is_empty() => slopes,
            _ => &[],
        };
        DeviceModifiers {
            window: self.window,
            softcap: self.softcap,
            alibi: self.alibi.then_some(slopes[0].1),
            flex: self.masks.flex.map(|modifiers| FlexOf {
                modifiers,
                tensors,
                block_mask: None,
            }),
            ..DeviceModifiers::default()
        }
    }
}

/// ALiBi's slopes of `h`'s heads, 2^(-8i/heads).
fn slopes(gpu: &Gpu, h: Heads) -> Result<Tensor, Error> {
    let values: Vec<f32> = (0..h.n_heads)
        .map(|i| (-8.0 * (i + 1) as f32 / h.n_heads as f32).exp2())
        .collect();
    Tensor::from_f32(gpu, &[h.n_heads], Scalar::F32, &values)
}

/// A tensor of `shape` holding random values (of the check's generator, from `seed`).
fn random(gpu: &Gpu, shape: &[u32], scalar: Scalar, seed: u64) -> Result<Tensor, Error> {
    let n = shape.iter().map(|&d| d as usize).product();
    Tensor::from_f32(gpu, shape, scalar, &crate::verify::random(n, seed))
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
    let data = |shape: &[u32], seed| random(gpu, shape, Scalar::from(dtype), seed);
    let (q, k, v) = (data(&q_shape, 1)?, data(&kv_shape, 2)?, data(&kv_shape, 3)?);
    let o = Tensor::zeros(gpu, &q_shape, Scalar::from(dtype))?;
    let lse = Tensor::zeros(gpu, &[1, seq, h.n_heads], Scalar::F32)?;
    let slopes = slopes(gpu, h)?;
    let flex_slopes = [("slopes", &slopes)];
    let mut rows = Vec::new();
    for variant in variants(seq, window, false) {
        let spec = ForwardSpec {
            head_dim: h.head_dim,
            head_dim_v: h.head_dim,
            masks: variant.masks,
            dtype,
        };
        let mut forward = Forward::new(gpu, spec)?;
        let args = ForwardArgs {
            mods: variant.modifiers(&flex_slopes),
            ..ForwardArgs::new(&q, &k, &v, &o, &lse)
        };
        let (t, ()) =
            timing::time_recorded(gpu, warmup, runs, |enc| forward.record(gpu, enc, &args))?;
        rows.push(FlexRow {
            what: variant.what,
            ms: t.median_ms,
            visible: variant.visible,
        });
    }
    Ok(rows)
}

/// Every variant's decode (split-K, the planner's slicing) of one row per head against a
/// contiguous cache of `cache_len` rows (batch 1, `h`), in `dtype`: a sparse mask's time
/// should follow the slices and tiles it visits.
pub fn decode(
    gpu: &Gpu,
    h: Heads,
    cache_len: u32,
    window: u32,
    dtype: Dtype,
    (warmup, runs): (usize, usize),
) -> Result<Vec<FlexRow>, Error> {
    let scalar = Scalar::from(dtype);
    let kv_shape = [1, cache_len, h.n_kv_heads, h.head_dim];
    let q_shape = [1, h.n_heads, h.head_dim];
    let (q, k, v) = (
        random(gpu, &q_shape, scalar, 1)?,
        random(gpu, &kv_shape, scalar, 2)?,
        random(gpu, &kv_shape, scalar, 3)?,
    );
    let o = Tensor::zeros(gpu, &q_shape, scalar)?;
    let seq_lens = Tensor::from_u32(gpu, &[1], &[cache_len])?;
    let slopes = slopes(gpu, h)?;
    let flex_slopes = [("slopes", &slopes)];
    let mut rows = Vec::new();
    for variant in variants(cache_len, window, true) {
        let mut decode = Decode::new(
            gpu,
            DecodeSpec {
                masks: variant.masks,
                ..DecodeSpec::new(h.head_dim, h.head_dim, dtype)
            },
        )?;
        let args = DecodeArgs {
            rows: Default::default(),
            q: &q,
            cache: CacheView {
                slot0: 0,
                k: &k,
                v: &v,
                seq_lens: &seq_lens,
                max_len: cache_len,
                block_table: None,
                scales: None,
            },
            o: &o,
            scale: None,
            mods: variant.modifiers(&flex_slopes),
            slice_len: None,
        };
        let (t, _) =
            timing::time_recorded(gpu, warmup, runs, |enc| decode.record(gpu, enc, &args))?;
        rows.push(FlexRow {
            what: variant.what,
            ms: t.median_ms,
            visible: variant.visible,
        });
    }
    Ok(rows)
}

/// The backward of a T5 relative bias under a causal mask, the
/// planner's schedule at `seq` (batch 1, `h`), in `dtype`: the built-in causal word alone,
/// the bias table fixed, and the table learnable (`grad`: every dS also added into
/// `drel_bias` by compensated atomics, then folded).
pub fn t5_backward(
    gpu: &Gpu,
    h: Heads,
    seq: u32,
    dtype: Dtype,
    (warmup, runs): (usize, usize),
) -> Result<Vec<FlexRow>, Error> {
    let q_shape = [1, seq, h.n_heads, h.head_dim];
    let kv_shape = [1, seq, h.n_kv_heads, h.head_dim];
    let scalar = Scalar::from(dtype);
    let data = |shape: &[u32], seed| random(gpu, shape, scalar, seed);
    let (q, k, v) = (data(&q_shape, 1)?, data(&kv_shape, 2)?, data(&kv_shape, 3)?);
    let (o, lse) = (
        Tensor::zeros(gpu, &q_shape, scalar)?,
        Tensor::zeros(gpu, &[1, seq, h.n_heads], Scalar::F32)?,
    );
    let r = 31;
    let table: Vec<f32> = crate::verify::random((h.n_heads * (2 * r + 1)) as usize, 5);
    let rel_bias = Tensor::from_f32(gpu, &[h.n_heads, 2 * r + 1], Scalar::F32, &table)?;
    let drel_bias = Tensor::zeros(gpu, &[h.n_heads, 2 * r + 1], Scalar::F32)?;
    let t5 = |learnable: bool| {
        let mut flex = library::preset(&format!("t5-bias:{r}")).expect("a preset");
        flex.tensors[0].grad = learnable;
        Masks {
            flex: Some(flex.intern()),
            ..Masks::default()
        }
    };
    let variants = [
        ("causal, built-in", Masks::new(true, false)),
        ("causal + T5 bias, table fixed", t5(false)),
        ("causal + T5 bias, table learnable", t5(true)),
    ];
    let flex_tensors = [("rel_bias", &rel_bias)];
    let flex_grads = [("drel_bias", &drel_bias)];
    let mut rows = Vec::new();
    for (what, masks) in variants {
        let flex = masks.flex.map(|modifiers| FlexOf {
            modifiers,
            tensors: &flex_tensors[..],
            block_mask: None,
        });
        let mods = DeviceModifiers {
            flex,
            ..DeviceModifiers::default()
        };
        // The forward's O and LSE, so that P is what training sees.
        let case = Case {
            gpu,
            h,
            dtype,
            masks,
            mods,
            seg: None,
            qkv: [&q, &k, &v],
            out: Outputs { o: &o, lse: &lse },
        };
        case.run_forward()?;
        let learnable = masks.flex.is_some_and(|f| f.parsed().tensors[0].grad);
        let grads = if learnable { &flex_grads[..] } else { &[] };
        let (ms, ran) = case.backward(grads, (warmup, runs))?;
        rows.push(FlexRow {
            what: format!("{what} ({ran})"),
            ms,
            visible: (f64::from(seq) + 1.0) / (2.0 * f64::from(seq)),
        });
    }
    Ok(rows)
}

/// One forward of [`block_masks`]: its masks, the values its modifiers read, the seg of the
/// built-in document word, and whether it reads a block mask made on the device.
struct MaskedForward<'a> {
    what: &'static str,
    masks: Masks,
    tensors: &'a [(&'a str, &'a Tensor)],
    seg: Option<&'a Tensor>,
    visible: f64,
}

/// Masks that read a tensor (prefix-LM with a `prefix` of `seq / 16` rows, whose keys are
/// a range ending at `max(q + 1, prefix[b])`; documents of `seq / 8` rows given as ids,
/// tested per pair and with a block mask made on the device, and the block mask's own time)
/// beside the built-in masks they extend (causal; the `document` word): the forward at
/// `seq` (batch 1, `h`) in `dtype`, and with `backward` the planner's backward of each.
pub fn block_masks(
    gpu: &Gpu,
    h: Heads,
    seq: u32,
    dtype: Dtype,
    backward: bool,
    (warmup, runs): (usize, usize),
) -> Result<BlockMaskRows, Error> {
    let q_shape = [1, seq, h.n_heads, h.head_dim];
    let kv_shape = [1, seq, h.n_kv_heads, h.head_dim];
    let data = |shape: &[u32], seed| random(gpu, shape, Scalar::from(dtype), seed);
    let (q, k, v) = (data(&q_shape, 1)?, data(&kv_shape, 2)?, data(&kv_shape, 3)?);
    let o = Tensor::zeros(gpu, &q_shape, Scalar::from(dtype))?;
    let lse = Tensor::zeros(gpu, &[1, seq, h.n_heads], Scalar::F32)?;
    let (prefix_len, doc_len) = ((seq / 16).max(1), (seq / 8).max(1));
    let prefix = Tensor::from_u32(gpu, &[1], &[prefix_len])?;
    let ids: Vec<u32> = (0..seq).map(|s| s / doc_len).collect();
    let doc = Tensor::from_u32(gpu, &[1, seq], &ids)?;
    let starts: Vec<u32> = (0..seq).map(|s| s / doc_len * doc_len).collect();
    let seg = crate::ops::forward::documents(gpu, &starts, 1, seq)?;
    let (n, p, d) = (f64::from(seq), f64::from(prefix_len), f64::from(doc_len));
    let causal_frac = (n + 1.0) / (2.0 * n);
    let prefix_frac = causal_frac + p * (p - 1.0) / 2.0 / (n * n);
    let doc_frac = (n / d) * d * (d + 1.0) / 2.0 / (n * n);
    let prefix_lm = library::preset("prefix-lm").expect("a preset").intern();
    let documents = library::preset("documents").expect("a preset").intern();
    let with = |f: attn_dsl::flex::FlexRef| Masks {
        flex: Some(f),
        ..Masks::default()
    };
    let plain = |f: attn_dsl::flex::FlexRef| {
        with(
            Flex {
                block_mask: false,
                ..f.get()
            }
            .intern(),
        )
    };
    let prefix_t = [("prefix", &prefix)];
    let doc_t = [("doc", &doc)];
    let forwards = [
        MaskedForward {
            what: "causal, built-in",
            masks: Masks::new(true, false),
            tensors: &[],
            seg: None,
            visible: causal_frac,
        },
        MaskedForward {
            what: "prefix-LM, mask_mod, a key range to prefix[b]",
            masks: plain(prefix_lm),
            tensors: &prefix_t,
            seg: None,
            visible: prefix_frac,
        },
        MaskedForward {
            what: "documents, built-in (causal + document)",
            masks: Masks::new(true, true),
            tensors: &[],
            seg: Some(&seg),
            visible: doc_frac,
        },
        MaskedForward {
            what: "documents, mask_mod over ids, per pair",
            masks: plain(documents),
            tensors: &doc_t,
            seg: None,
            visible: doc_frac,
        },
        MaskedForward {
            what: "documents, mask_mod over ids, block mask",
            masks: with(documents),
            tensors: &doc_t,
            seg: None,
            visible: doc_frac,
        },
    ];
    let mut rows = BlockMaskRows::default();
    let out = Outputs { o: &o, lse: &lse };
    for f in forwards {
        let flex = f.masks.flex.filter(|x| x.parsed().block_mask);
        let mut made = None;
        if let Some(flex) = flex {
            let mut mask = crate::ops::block_mask::BlockMask::new(gpu, flex, 1, h.n_heads, seq)?;
            let (t, ()) =
                timing::time_recorded(gpu, warmup, runs, |enc| mask.record(gpu, enc, f.tensors))?;
            rows.forward.push(FlexRow {
                what: "  its block mask, made on the device".to_string(),
                ms: t.median_ms,
                visible: f.visible,
            });
            made = Some(mask);
        }
        let mods = DeviceModifiers {
            flex: f.masks.flex.map(|modifiers| FlexOf {
                modifiers,
                tensors: f.tensors,
                block_mask: made.as_ref().map(|m| m.states()),
            }),
            ..DeviceModifiers::default()
        };
        let case = Case {
            gpu,
            h,
            dtype,
            masks: f.masks,
            mods,
            seg: f.seg,
            qkv: [&q, &k, &v],
            out,
        };
        let ms = case.forward((warmup, runs))?;
        let row = |ms| FlexRow {
            what: f.what.to_string(),
            ms,
            visible: f.visible,
        };
        // The forward's row before its mask's.
        let at = rows.forward.len() - usize::from(made.is_some());
        rows.forward.insert(at, row(ms));
        if backward {
            let (ms, ran) = case.backward(&[], (warmup, runs))?;
            rows.backward.push(FlexRow {
                what: format!("{} ({ran})", f.what),
                ..row(ms)
            });
        }
    }
    Ok(rows)
}

/// The rows of [`block_masks`]: the forwards and their block masks' own times, and the
/// backwards where asked.
#[derive(Default)]
pub struct BlockMaskRows {
    pub forward: Vec<FlexRow>,
    pub backward: Vec<FlexRow>,
}

/// The forward's O and LSE, which the backward then reads.
#[derive(Clone, Copy)]
struct Outputs<'a> {
    o: &'a Tensor,
    lse: &'a Tensor,
}

/// One masked attention of a bench table: its shape, masks, modifier values and tensors.
#[derive(Clone, Copy)]
struct Case<'a> {
    gpu: &'a Gpu,
    h: Heads,
    dtype: Dtype,
    masks: Masks,
    mods: DeviceModifiers<'a>,
    seg: Option<&'a Tensor>,
    qkv: [&'a Tensor; 3],
    out: Outputs<'a>,
}

impl Case<'_> {
    /// The planner's forward and its arguments.
    fn forward_op(&self) -> Result<(Forward, ForwardArgs<'_>), Error> {
        let spec = ForwardSpec {
            head_dim: self.h.head_dim,
            head_dim_v: self.h.head_dim,
            masks: self.masks,
            dtype: self.dtype,
        };
        let [q, k, v] = self.qkv;
        let args = ForwardArgs {
            seg: self.seg,
            mods: self.mods,
            ..ForwardArgs::new(q, k, v, self.out.o, self.out.lse)
        };
        Ok((Forward::new(self.gpu, spec)?, args))
    }

    /// The forward, recorded `runs` times after `warmup` (its median ms); its O and LSE
    /// are left for the backward.
    fn forward(&self, (warmup, runs): (usize, usize)) -> Result<f64, Error> {
        let (mut forward, args) = self.forward_op()?;
        let gpu = self.gpu;
        let (t, ()) =
            timing::time_recorded(gpu, warmup, runs, |enc| forward.record(gpu, enc, &args))?;
        Ok(t.median_ms)
    }

    /// The forward run once, untimed, for the O and LSE a backward reads.
    fn run_forward(&self) -> Result<(), Error> {
        let (mut forward, args) = self.forward_op()?;
        let mut encoder = self.gpu.device.create_command_encoder(&Default::default());
        forward.record(self.gpu, &mut encoder, &args)?;
        self.gpu.queue.submit([encoder.finish()]);
        Ok(())
    }

    /// The planner's backward over the O and LSE the forward left, the modifiers' tensors
    /// learnable where `flex_grads` names their gradients: its median ms and the schedule
    /// it ran.
    fn backward(
        &self,
        flex_grads: &[(&str, &Tensor)],
        (warmup, runs): (usize, usize),
    ) -> Result<(f64, String), Error> {
        let gpu = self.gpu;
        let [q, k, v] = self.qkv;
        let grad = |s: &[u32]| Tensor::zeros(gpu, s, Scalar::F32);
        let d_o = random(gpu, q.shape(), Scalar::from(self.dtype), 4)?;
        let grads = [grad(q.shape())?, grad(k.shape())?, grad(v.shape())?];
        let spec = BackwardSpec::new(self.h.head_dim, self.masks, self.dtype);
        let mut backward = crate::ops::backward::Backward::new(gpu, spec)?;
        let args = crate::ops::backward::BackwardArgs {
            q,
            k,
            v,
            o: self.out.o,
            lse: self.out.lse,
            d_o: &d_o,
            dq: &grads[0],
            dk: &grads[1],
            dv: &grads[2],
            dbias: None,
            dsinks: None,
            flex_grads,
            seg: self.seg,
            scale: None,
            mods: self.mods,
            accumulate: true,
        };
        let (t, ran) = timing::time_recorded(gpu, warmup, runs, |enc| {
            backward.record(gpu, enc, &args, None)
        })?;
        Ok((t.median_ms, ran.to_string()))
    }
}
