//! The case matrix that `check` and the tests run: each case is a shape and mask set, run
//! on the GPU and judged against the f64 reference by the pass rule, as one or more rows.

use crate::modifiers::FlexOf;
use crate::ops::backward::BackwardSpec;
use crate::plan::kernels::AttentionSpec;
use attn_dsl::flex::Dim;
use attn_dsl::{
    BiasHeads, Cache, Dtype, FlashConfig, Fp8, KernelAbi, KernelSpec, Masks, Modifier, Op, Scalar,
};
use pollster::FutureExt as BlockOn;

use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::error::Error;
use crate::harness::kv_fp8;
use crate::kernels::{BackwardKernels, ROPE};
use crate::modifiers::{Bias, Dropout, Modifiers};
use crate::ops::backward::{Backward, Schedule};
use crate::ops::backward::{BackwardInput, Gradients};
use crate::ops::cache::CacheLayout;
use crate::ops::decode::DecodeInput;
use crate::ops::decode::{Combine, SplitLayout};
use crate::ops::decode::{DecodePath, Pages, Slicing, SplitDecode};
use crate::ops::extend::CHUNK_ROWS;
use crate::ops::forward::ForwardInput;
use crate::ops::rope::{self, RopeInput};
use crate::plan::tuning;
use crate::shape::Heads;
use crate::verify::compare::{
    Verdict, judge, judge_attention, judge_backward, judge_half_attention, judge_half_backward,
    max_abs_error,
};
use crate::verify::random;
use crate::verify::reference::{self, Problem, cast};

/// How a case's rows split into documents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Docs {
    /// This many documents of near-equal length.
    Even(u32),
    /// Sequences of these lengths packed along seq (FlashAttention's varlen batch); the
    /// case's `seq` is their sum.
    Packed(&'static [u32]),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Forward over `seq` rows split into `docs`, causal or not.
    Forward { seq: u32, docs: Docs, causal: bool },
    /// Decode against `cache_len` rows of a cache that holds `capacity` rows.
    Decode { cache_len: u32, capacity: u32 },
    /// Backward over `seq` rows split into `docs`, causal or not, every schedule.
    Backward { seq: u32, docs: Docs, causal: bool },
    /// RoPE on a Q-shaped tensor, forward and back.
    Rope { seq: u32, pos_offset: u32 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Case {
    pub heads: Heads,
    /// Independent sequences, the grid's batch axis.
    pub batch: u32,
    pub shape: Shape,
    /// The score modifiers the case's kernels are built with; their values come from the
    /// seed.
    pub mods: ModCase,
}

/// Which modifiers a case turns on, with the values that are not data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModCase {
    pub window: Option<u32>,
    /// ALiBi with the usual slopes, 2^(-8(h+1)/n_heads).
    pub alibi: bool,
    /// A random bias of these heads.
    pub bias: Option<BiasHeads>,
    pub softcap: Option<u32>,
    /// Dropout probability in percent.
    pub dropout_percent: Option<u32>,
    /// Attention sinks, one logit per head from the seed.
    pub sinks: bool,
    /// A user-written modifier: the name of an `attn_dsl::flex::library` example, its
    /// tensors' values from the seed.
    pub flex: Option<&'static str>,
}

impl ModCase {
    fn label(&self) -> String {
        let words: Vec<String> = Modifier::ALL
            .into_iter()
            .filter_map(|m| self.word(m))
            .chain(self.flex.map(|f| format!("flex:{f}")))
            .collect();
        words.join("+")
    }

    /// The example's modifiers, if the case has one.
    pub fn flex(&self) -> Option<attn_dsl::flex::FlexRef> {
        let name = self.flex?;
        let example = attn_dsl::flex::library::examples()
            .into_iter()
            .find(|e| e.name == name)
            .unwrap_or_else(|| panic!("no flex example `{name}`"));
        Some(example.flex.intern())
    }

    /// `m`'s part of the label, with its value, when the case turns it on (the causal and
    /// document masks belong to the case's shape).
    fn word(&self, m: Modifier) -> Option<String> {
        let on = |on: bool| on.then(|| m.word().to_string());
        match m {
            Modifier::Causal | Modifier::Document => None,
            Modifier::Window => self.window.map(|w| format!("window{w}")),
            Modifier::Alibi => on(self.alibi),
            Modifier::Bias => on(self.bias == Some(BiasHeads::PerHead)),
            Modifier::SharedBias => on(self.bias == Some(BiasHeads::Shared)),
            Modifier::Softcap => self.softcap.map(|c| format!("softcap{c}")),
            Modifier::Dropout => self.dropout_percent.map(|p| format!("dropout{p}%")),
            Modifier::Sinks => on(self.sinks),
        }
    }

    /// The masks of a kernel that runs this case, with the shape's causal and document masks.
    pub fn masks(&self, causal: bool, document: bool) -> Masks {
        let masks = Modifier::ALL
            .into_iter()
            .filter(|m| self.word(*m).is_some())
            .fold(Masks::new(causal, document), Masks::with);
        Masks {
            flex: self.flex(),
            ..masks
        }
    }
}

/// A case's modifier values, generated from its seed and owned while it runs.
struct ModData {
    case: ModCase,
    slopes: Vec<f32>,
    bias: Vec<f32>,
    sinks: Vec<f32>,
    /// The example's tensors by name (kept for the process: `Modifiers` borrows the pairs).
    flex: &'static [(&'static str, &'static [f32])],
    seed: u64,
}

impl ModData {
    /// Values for `batch` sequences of `q_rows` query rows (the bias's rows) over
    /// `positions` (the modifiers' tensors' `seq`: a forward's rows, a decode's capacity).
    fn new(
        case: ModCase,
        h: Heads,
        batch: u32,
        (seq, positions): (u32, u32),
        seed: u64,
    ) -> ModData {
        let n = h.n_heads;
        let slopes = match case.alibi {
            true => (0..n)
                .map(|i| (-8.0 * (i + 1) as f32 / n as f32).exp2())
                .collect(),
            false => Vec::new(),
        };
        let heads = match case.bias {
            Some(BiasHeads::PerHead) => n,
            Some(BiasHeads::Shared) => 1,
            None => 0,
        };
        let bias_len = (batch * heads * seq * seq) as usize;
        // Logits about the scores' size, so that the sink takes a real share of each row.
        let sinks = random(n as usize, seed + 11)
            .into_iter()
            .map(|x| 2.0 * x + 0.5)
            .collect();
        ModData {
            case,
            slopes,
            bias: random(bias_len, seed + 7),
            sinks,
            flex: flex_values(case, h, batch, positions, seed),
            seed,
        }
    }

    fn mods(&self) -> Modifiers<'_> {
        let c = self.case;
        Modifiers {
            window: c.window,
            alibi: c.alibi.then_some(&self.slopes[..]),
            bias: c.bias.map(|heads| Bias {
                values: &self.bias[..],
                heads,
            }),
            softcap: c.softcap.map(|x| x as f32),
            dropout: c.dropout_percent.map(|p| Dropout {
                p: p as f32 / 100.0,
                seed: self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                offset: 3,
            }),
            sinks: c.sinks.then_some(&self.sinks[..]),
            flex: c.flex().map(|modifiers| FlexOf {
                modifiers,
                tensors: self.flex,
                block_mask: None,
            }),
        }
    }
}

/// Values for each tensor the case's modifier declares: f32 values of a tenth of the
/// inputs' range (a bias or a slope), u32 positions within the sequence.
fn flex_values(
    case: ModCase,
    h: Heads,
    batch: u32,
    seq: u32,
    seed: u64,
) -> &'static [(&'static str, &'static [f32])] {
    let Some(flex) = case.flex() else {
        return &[];
    };
    let pairs: Vec<(&'static str, &'static [f32])> = flex
        .parsed()
        .tensors
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let len = t.len(batch, h.n_heads, seq) as usize;
            let raw = random(len, seed + 31 + i as u64);
            let positions = raw.iter().map(|x| ((x + 2.0) / 4.0 * seq as f32).floor());
            let values: Vec<f32> = match t.ty {
                attn_dsl::flex::Ty::F32 => raw.iter().map(|x| 0.1 * x).collect(),
                _ if t.dims.last() == Some(&Dim::Seq) => document_ids(positions.collect(), seq),
                _ => positions.collect(),
            };
            (t.name.as_str(), &*Box::leak(values.into_boxed_slice()))
        })
        .collect();
    Box::leak(pairs.into_boxed_slice())
}

/// Ids that never decrease along each row of `seq` positions (documents of random lengths,
/// about four a row), from random positions.
fn document_ids(mut positions: Vec<f32>, seq: u32) -> Vec<f32> {
    let run = (seq as f32 / 4.0).max(1.0);
    for row in positions.chunks_mut(seq.max(1) as usize) {
        row.sort_by(f32::total_cmp);
        for x in row.iter_mut() {
            *x = (*x / run).floor();
        }
    }
    positions
}

impl Case {
    pub fn kind(&self) -> &'static str {
        match self.shape {
            Shape::Forward { .. } => "forward",
            Shape::Decode { .. } => "decode",
            Shape::Backward { .. } => "backward",
            Shape::Rope { .. } => "rope",
        }
    }

    pub fn shape_label(&self) -> String {
        let h = self.heads;
        let rows = match self.shape {
            Shape::Forward { seq, .. } | Shape::Backward { seq, .. } => format!("seq={seq}"),
            Shape::Decode {
                cache_len,
                capacity,
            } => format!("cache={cache_len}/{capacity}"),
            Shape::Rope { seq, pos_offset } => format!("seq={seq}+{pos_offset}"),
        };
        let batch = match self.batch {
            1 => String::new(),
            b => format!(" b={b}"),
        };
        let d = match h.head_dim_v == h.head_dim {
            true => h.head_dim.to_string(),
            false => format!("{}/{}", h.head_dim, h.head_dim_v),
        };
        format!("{rows}{batch} h={} kv={} d={d}", h.n_heads, h.n_kv_heads)
    }

    /// The modifiers this case exercises: its own, the causal mask where its shape is
    /// causal and the document mask where its rows split into several documents.
    pub fn masks(&self) -> Masks {
        match self.shape {
            Shape::Forward { docs, causal, .. } | Shape::Backward { docs, causal, .. } => {
                self.mods.masks(causal, docs != Docs::Even(1))
            }
            Shape::Decode { .. } | Shape::Rope { .. } => self.mods.masks(false, false),
        }
    }

    pub fn mask_label(&self) -> String {
        let mods = self.mods.label();
        let (docs, causal) = match self.shape {
            Shape::Forward { docs, causal, .. } | Shape::Backward { docs, causal, .. } => {
                (docs, causal)
            }
            Shape::Decode { .. } if !mods.is_empty() => return mods,
            Shape::Decode { .. } | Shape::Rope { .. } => return "none".into(),
        };
        let base = self.base_mask_label(docs, causal);
        match (base.as_str(), mods.is_empty()) {
            (_, true) => base,
            ("none", false) => mods,
            (_, false) => format!("{base}+{mods}"),
        }
    }

    fn base_mask_label(&self, docs: Docs, causal: bool) -> String {
        let docs = match docs {
            Docs::Even(1) => None,
            Docs::Even(n) => Some(format!("{n}docs")),
            Docs::Packed(lengths) => Some(format!("packed {}", join(lengths, "+"))),
        };
        match (causal, docs) {
            (true, None) => "causal".into(),
            (true, Some(d)) => format!("causal+{d}"),
            (false, Some(d)) => d,
            (false, None) => "none".into(),
        }
    }
}

fn join(xs: &[u32], sep: &str) -> String {
    xs.iter().map(u32::to_string).collect::<Vec<_>>().join(sep)
}

/// Packed lengths of the matrix: one row, a short and a long sequence, mixed.
const PACKED: &[u32] = &[1, 7, 300];

/// The default matrix: seq 1, 7, 64, 300; GQA ratios 1, 3, 4; head_dim 64 and 128; causal
/// alone and with 3 documents; decode caches of 1, 7 and 300 rows; the backward in every
/// schedule over the same shapes plus one over the check's streaming threshold; RoPE; the
/// seeds' production layer; head_dim 32, 80, 96 and 256 in every op, 144 and 224 in the
/// forward; batch 3; and packed
/// sequences of 1, 7 and 300 rows, causal and not.
pub fn default_matrix() -> Vec<Case> {
    let head_sets = [(2, 2), (6, 2), (8, 2)];
    let mut cases = Vec::new();
    let mut push = |heads: Heads, batch: u32, shape: Shape| {
        cases.push(Case {
            heads,
            batch,
            shape,
            mods: ModCase::default(),
        })
    };
    let heads = |n_heads, n_kv_heads, head_dim| Heads {
        n_heads,
        n_kv_heads,
        head_dim,
        head_dim_v: head_dim,
    };
    for head_dim in [64, 128] {
        for (n_heads, n_kv_heads) in head_sets {
            let h = heads(n_heads, n_kv_heads, head_dim);
            for seq in [1, 7, 64, 300] {
                for docs in [1, 3].into_iter().filter(|&d| d <= seq) {
                    let docs = Docs::Even(docs);
                    push(
                        h,
                        1,
                        Shape::Forward {
                            seq,
                            docs,
                            causal: true,
                        },
                    );
                }
            }
            // 4099: many slices, the last one short, for split-K decode.
            for (cache_len, capacity) in [(1, 1), (7, 7), (300, 320), (4099, 4100)] {
                push(
                    h,
                    1,
                    Shape::Decode {
                        cache_len,
                        capacity,
                    },
                );
            }
        }
        for (i, (n_heads, n_kv_heads)) in head_sets.into_iter().enumerate() {
            for seq in [1, 7, 64, 300] {
                // Documents alternate so both layouts meet every GQA ratio across head_dims.
                let docs = if (i + head_dim as usize / 64).is_multiple_of(2) {
                    1
                } else {
                    3
                }
                .min(seq);
                let shape = Shape::Backward {
                    seq,
                    docs: Docs::Even(docs),
                    causal: true,
                };
                push(heads(n_heads, n_kv_heads, head_dim), 1, shape);
            }
        }
        for (seq, pos_offset) in [(300, 0), (7, 4093)] {
            push(heads(4, 4, head_dim), 1, Shape::Rope { seq, pos_offset });
        }
    }
    // Split-K decode with 8 query heads per KV head (two head groups per workgroup row)
    // over a batch, many slices the last of them short: 1027 rows in the quick matrix (a
    // quarter of the time on a CPU adapter), 4099 in the whole one.
    for (cache_len, capacity) in [(1027, 1028), (4099, 4100)] {
        push(
            heads(16, 2, 64),
            2,
            Shape::Decode {
                cache_len,
                capacity,
            },
        );
    }
    // Rows of two widths, d=qk/v: MLA's 192/128 (DeepSeek-V2/V3), and V wider or narrower
    // than Q and K. The forward's schedules (per row, flash, tensor cores in half precision),
    // the decode's (per row, split-K contiguous and paged, half precision, fp8 caches filled
    // by the append) and the backward's per-row schedules.
    for (head_dim, head_dim_v) in [(192, 128), (64, 128), (128, 64)] {
        let h = Heads {
            head_dim_v,
            ..heads(6, 2, head_dim)
        };
        for (seq, docs) in [(7, 1), (300, 3)] {
            let docs = Docs::Even(docs);
            push(
                h,
                1,
                Shape::Forward {
                    seq,
                    docs,
                    causal: true,
                },
            );
        }
        push(
            h,
            2,
            Shape::Decode {
                cache_len: 300,
                capacity: 320,
            },
        );
        push(
            h,
            1,
            Shape::Backward {
                seq: 64,
                docs: Docs::Even(2),
                causal: true,
            },
        );
    }
    // Two widths whose wider is 64, where every backward schedule's tilings fit WebGPU's
    // defaults (the streaming schedule's dK and dV lanes included).
    for (head_dim, head_dim_v) in [(64, 32), (32, 64)] {
        let h = Heads {
            head_dim_v,
            ..heads(6, 2, head_dim)
        };
        let shape = Shape::Backward {
            seq: 64,
            docs: Docs::Even(2),
            causal: true,
        };
        push(h, 1, shape);
    }
    // Head_dims with no hand-written kernel: every op through the configurations by rule.
    // At 28 (7 vec4 columns) and 80 (20) most layouts pad the rows to a multiple of the
    // invocations per row; at 28 the padded backward layouts fit any adapter.
    for head_dim in [28, 32, 80, 96, 256] {
        let h = heads(6, 2, head_dim);
        let docs = Docs::Even(3);
        push(
            h,
            1,
            Shape::Forward {
                seq: 7,
                docs: Docs::Even(1),
                causal: true,
            },
        );
        push(
            h,
            1,
            Shape::Forward {
                seq: 300,
                docs,
                causal: true,
            },
        );
        push(
            h,
            1,
            Shape::Decode {
                cache_len: 300,
                capacity: 320,
            },
        );
        push(
            h,
            1,
            Shape::Backward {
                seq: 64,
                docs,
                causal: true,
            },
        );
        push(
            h,
            1,
            Shape::Rope {
                seq: 7,
                pos_offset: 5,
            },
        );
    }
    // Head_dims where the tensor-core forward's 128-row tile stages V over K (its K and V
    // side by side do not fit 48 KiB): that tile among every configuration `check` runs.
    for head_dim in [144, 224] {
        let shape = Shape::Forward {
            seq: 300,
            docs: Docs::Even(3),
            causal: true,
        };
        push(heads(6, 2, head_dim), 1, shape);
    }
    // The batch axis, each sequence with its own documents.
    let h = heads(6, 2, 64);
    push(
        h,
        3,
        Shape::Forward {
            seq: 64,
            docs: Docs::Even(2),
            causal: true,
        },
    );
    push(
        h,
        3,
        Shape::Decode {
            cache_len: 7,
            capacity: 9,
        },
    );
    push(
        h,
        3,
        Shape::Backward {
            seq: 64,
            docs: Docs::Even(2),
            causal: true,
        },
    );
    push(
        h,
        3,
        Shape::Rope {
            seq: 7,
            pos_offset: 2,
        },
    );
    // Packed variable-length sequences, causal and not, alone and in a batch.
    let seq = PACKED.iter().sum();
    let docs = Docs::Packed(PACKED);
    for causal in [true, false] {
        push(h, 1, Shape::Forward { seq, docs, causal });
        push(h, 1, Shape::Backward { seq, docs, causal });
    }
    push(
        h,
        2,
        Shape::Forward {
            seq,
            docs,
            causal: true,
        },
    );
    let over = heads(4, 1, 64);
    push(
        over,
        1,
        Shape::Backward {
            seq: 400,
            docs: Docs::Even(3),
            causal: true,
        },
    );
    let seeds_layer = heads(12, 4, 64);
    let docs = Docs::Even(2);
    push(
        seeds_layer,
        1,
        Shape::Forward {
            seq: 512,
            docs,
            causal: true,
        },
    );
    push(
        seeds_layer,
        1,
        Shape::Decode {
            cache_len: 512,
            capacity: 512,
        },
    );
    push(
        seeds_layer,
        1,
        Shape::Backward {
            seq: 128,
            docs,
            causal: true,
        },
    );
    cases.extend(modifier_cases());
    cases.extend(flex_cases());
    cases
}

/// `check --full`'s matrix: the default one and cases whose grids only a GPU answers in
/// seconds (minutes on a CPU adapter, so the test suite's run of the default matrix leaves
/// them out): grids whose heads and sequences split into chunks for the tensor-core
/// kernels' longest-first order (48 streams of 8 tiles of 64 rows: chunks of 32 and 16).
pub fn full_matrix() -> Vec<Case> {
    let mut cases = default_matrix();
    let heads = Heads {
        n_heads: 16,
        n_kv_heads: 4,
        head_dim: 64,
        head_dim_v: 64,
    };
    let (seq, docs, causal) = (512, Docs::Even(1), true);
    for shape in [
        Shape::Forward { seq, docs, causal },
        Shape::Backward { seq, docs, causal },
    ] {
        cases.push(Case {
            heads,
            batch: 3,
            shape,
            mods: ModCase::default(),
        });
    }
    cases
}

/// The quick matrix `check` runs by default: cases of the default matrix chosen so that
/// every op, every backward schedule (each backward case runs them all), both dtypes'
/// half-precision rows, every modifier, both cache layouts, head_dims by hand (64, 128)
/// and by rule (80), GQA, a batch and packed sequences each run at least once, at sizes
/// that a CPU adapter answers in about a minute.
pub const QUICK: &[(&str, &str, &str)] = &[
    ("forward", "seq=1 h=2 kv=2 d=64", "causal"),
    ("forward", "seq=64 h=6 kv=2 d=64", "causal+3docs"),
    ("forward", "seq=300 h=8 kv=2 d=128", "causal"),
    ("forward", "seq=7 h=6 kv=2 d=80", "causal"),
    ("forward", "seq=300 h=6 kv=2 d=192/128", "causal+3docs"),
    ("forward", "seq=64 b=3 h=6 kv=2 d=64", "causal+2docs"),
    ("forward", "seq=308 h=6 kv=2 d=64", "packed 1+7+300"),
    ("decode", "cache=300/320 h=6 kv=2 d=64", "none"),
    ("decode", "cache=1027/1028 b=2 h=16 kv=2 d=64", "none"),
    ("decode", "cache=300/320 b=2 h=6 kv=2 d=192/128", "none"),
    (
        "decode",
        "cache=300/320 h=6 kv=2 d=64",
        "window5+alibi+softcap2+sinks",
    ),
    ("backward", "seq=64 h=6 kv=2 d=64", "causal"),
    ("backward", "seq=7 h=8 kv=2 d=128", "causal"),
    ("backward", "seq=64 b=3 h=6 kv=2 d=64", "causal+2docs"),
    ("rope", "seq=7+4093 h=4 kv=4 d=64", "none"),
    (
        "forward",
        "seq=64 h=6 kv=2 d=64",
        "causal+2docs+window24+alibi+bias+dropout10%",
    ),
    (
        "backward",
        "seq=64 h=6 kv=2 d=64",
        "causal+2docs+window24+alibi+bias+dropout10%",
    ),
    ("backward", "seq=64 h=6 kv=2 d=64", "causal+2docs+softcap2"),
    ("forward", "seq=64 h=6 kv=2 d=64", "causal+2docs+sinks"),
    ("backward", "seq=64 h=6 kv=2 d=64", "causal+2docs+sinks"),
    (
        "forward",
        "seq=64 h=6 kv=2 d=128",
        "2docs+window24+alibi+shared_bias+dropout10%",
    ),
    ("forward", "seq=64 h=6 kv=2 d=64", "flex:t5-bias"),
    ("backward", "seq=64 h=6 kv=2 d=64", "flex:t5-bias"),
    ("decode", "cache=300/320 h=6 kv=2 d=64", "flex:t5-bias"),
    ("forward", "seq=64 b=2 h=6 kv=2 d=64", "flex:prefix-lm"),
    ("backward", "seq=64 h=6 kv=2 d=64", "flex:window-sinks"),
    ("decode", "cache=300/320 h=6 kv=2 d=64", "flex:window-sinks"),
    ("backward", "seq=64 h=6 kv=2 d=64", "flex:sliding-window"),
    ("backward", "seq=64 h=6 kv=2 d=64", "flex:softcap-alibi"),
    ("forward", "seq=64 h=6 kv=2 d=64", "flex:block-diagonal"),
    ("forward", "seq=64 b=2 h=6 kv=2 d=64", "flex:documents"),
    ("backward", "seq=64 b=2 h=6 kv=2 d=64", "flex:documents"),
];

/// The cases of [`QUICK`], in the default matrix's order.
pub fn quick_matrix() -> Vec<Case> {
    default_matrix()
        .into_iter()
        .filter(|c| {
            QUICK.iter().any(|(k, s, m)| {
                (c.kind(), c.shape_label(), c.mask_label()) == (*k, s.to_string(), m.to_string())
            })
        })
        .collect()
}

/// Each user-written example of `attn_dsl::flex::library` (its own masks, no built-in
/// ones), forward, backward and decode, at head_dim 64 with GQA 3.
fn flex_cases() -> Vec<Case> {
    let heads = Heads {
        n_heads: 6,
        n_kv_heads: 2,
        head_dim: 64,
        head_dim_v: 64,
    };
    let mut cases = Vec::new();
    for example in attn_dsl::flex::library::examples() {
        let mods = ModCase {
            flex: Some(example.name),
            ..ModCase::default()
        };
        let shapes = [
            Shape::Forward {
                seq: 64,
                docs: Docs::Even(1),
                causal: false,
            },
            Shape::Backward {
                seq: 64,
                docs: Docs::Even(1),
                causal: false,
            },
            Shape::Decode {
                cache_len: 300,
                capacity: 320,
            },
        ];
        // A long sequence where the key loops skip most tiles (by a block mask for the
        // documents, whose ids differ between two sequences), or where prefix-LM's keys
        // reach past the diagonal by whole tiles.
        let long = matches!(
            example.name,
            "window-sinks" | "sliding-window" | "documents" | "prefix-lm"
        )
        .then_some(Shape::Backward {
            seq: 300,
            docs: Docs::Even(1),
            causal: false,
        });
        // A tensor per sequence (document ids, prefix lengths) differs between two.
        let by_sequence = example
            .flex
            .tensors
            .iter()
            .any(|t| t.dims.contains(&Dim::Seq) || t.dims.contains(&Dim::Batch));
        for shape in shapes.into_iter().chain(long) {
            cases.push(Case {
                heads,
                batch: if by_sequence { 2 } else { 1 },
                shape,
                mods,
            });
        }
    }
    cases
}

/// Each score modifier alone (causal, with documents, GQA 3), then all at once, causal
/// and not, at head_dims 64 and 128, forward and backward; decode with those it takes.
fn modifier_cases() -> Vec<Case> {
    let alone = [
        ModCase {
            window: Some(16),
            ..ModCase::default()
        },
        ModCase {
            alibi: true,
            ..ModCase::default()
        },
        ModCase {
            bias: Some(BiasHeads::PerHead),
            ..ModCase::default()
        },
        ModCase {
            bias: Some(BiasHeads::Shared),
            ..ModCase::default()
        },
        ModCase {
            softcap: Some(2),
            ..ModCase::default()
        },
        ModCase {
            dropout_percent: Some(20),
            ..ModCase::default()
        },
        ModCase {
            sinks: true,
            ..ModCase::default()
        },
    ];
    let all = |bias| ModCase {
        window: Some(24),
        alibi: true,
        bias: Some(bias),
        // With the soft cap too, dBias of head_dim 128 reached 1.19x the bound on one seed
        // of 8 on lavapipe (flat P exposes the rounding of dP − D: the dot products and
        // lavapipe's unfused fma in exp); the cap is covered alone with causal, documents
        // and GQA.
        softcap: None,
        dropout_percent: Some(10),
        sinks: false,
        flex: None,
    };
    let mut cases = Vec::new();
    for head_dim in [64, 128] {
        let heads = Heads {
            n_heads: 6,
            n_kv_heads: 2,
            head_dim,
            head_dim_v: head_dim,
        };
        let mut push = |shape, mods| {
            cases.push(Case {
                heads,
                batch: 1,
                shape,
                mods,
            })
        };
        let docs = Docs::Even(2);
        let combos = alone.iter().map(|m| (*m, true)).chain([
            (all(BiasHeads::PerHead), true),
            (all(BiasHeads::Shared), false),
        ]);
        for (mods, causal) in combos {
            push(
                Shape::Forward {
                    seq: 64,
                    docs,
                    causal,
                },
                mods,
            );
            push(
                Shape::Backward {
                    seq: 64,
                    docs,
                    causal,
                },
                mods,
            );
        }
        let long = ModCase {
            window: Some(40),
            ..ModCase::default()
        };
        push(
            Shape::Backward {
                seq: 200,
                docs: Docs::Even(1),
                causal: false,
            },
            long,
        );
        let decode = ModCase {
            window: Some(5),
            alibi: true,
            softcap: Some(2),
            sinks: true,
            ..ModCase::default()
        };
        push(
            Shape::Decode {
                cache_len: 300,
                capacity: 320,
            },
            decode,
        );
    }
    // The modifiers of a backward and a decode with V rows narrower than K's (MLA's widths).
    let mla = Heads {
        n_heads: 6,
        n_kv_heads: 2,
        head_dim: 192,
        head_dim_v: 128,
    };
    cases.push(Case {
        heads: mla,
        batch: 1,
        shape: Shape::Backward {
            seq: 64,
            docs: Docs::Even(2),
            causal: true,
        },
        mods: ModCase {
            sinks: true,
            ..all(BiasHeads::PerHead)
        },
    });
    cases.push(Case {
        heads: Heads {
            n_heads: 6,
            n_kv_heads: 2,
            head_dim: 192,
            head_dim_v: 128,
        },
        batch: 1,
        shape: Shape::Decode {
            cache_len: 300,
            capacity: 320,
        },
        mods: ModCase {
            window: Some(5),
            alibi: true,
            softcap: Some(2),
            sinks: true,
            ..ModCase::default()
        },
    });
    cases
}

/// The masks a forward or backward case's kernels are built with.
fn masks(causal: bool) -> Masks {
    Masks::new(causal, true)
}

/// What a split-K decode is compiled for: (head_dim, head_dim_v), masks, cache, dtype.
type SplitKey = ((u32, u32), Masks, Cache, Dtype, (SplitLayout, Combine));

/// The flash forward candidates of one head_dim and mask set, compiled.
type FlashSet = Vec<(FlashConfig, Kernel)>;

/// Half-precision forwards of one head_dim and mask set: (row label, kernel).
type HalfSet = Vec<(String, Kernel)>;

/// Everything a matrix runs: the family's kernels, and those of other head_dims and masks
/// compiled from the same descriptions when a case first needs them.
pub struct Runner {
    /// Per-row forward and decode kernels.
    per_row: Vec<Kernel>,
    /// Every flash forward candidate this device holds, by head_dim and masks.
    flash: Vec<((u32, u32), Masks, FlashSet)>,
    half: Vec<((u32, u32), Masks, HalfSet)>,
    rope: Vec<(Kernel, Kernel)>,
    /// Split-K decode kernels, by (head_dim, head_dim_v) and masks, made when a case first
    /// needs them.
    split: Vec<(SplitKey, SplitDecode)>,
    /// The causal backward (with documents), every head_dim compiled so far.
    pub backward: Backward,
    /// The backwards of other masks (non-causal, score modifiers), made when a case needs
    /// one.
    others: Vec<(Masks, Backward)>,
    /// The merges of attention states the forward cases' merge rows run.
    merges: crate::harness::merged::Merges,
}

impl Runner {
    pub fn new<'a>(
        gpu: &Gpu,
        attention: impl IntoIterator<Item = &'a KernelAbi>,
        backward: &[BackwardKernels],
    ) -> Result<Runner, Error> {
        let per_row = attention
            .into_iter()
            .filter(|abi| matches!(abi.op, Op::Forward | Op::Decode) && abi.grid.flash.is_none())
            .map(|abi| Kernel::now(gpu, abi))
            .collect::<Result<_, _>>()?;
        let rope = ROPE
            .iter()
            .map(|(f, b)| Ok((Kernel::now(gpu, f)?, Kernel::now(gpu, b)?)))
            .collect::<Result<_, Error>>()?;
        Ok(Runner {
            per_row,
            flash: Vec::new(),
            half: Vec::new(),
            rope,
            split: Vec::new(),
            backward: Backward::from_kernels(gpu, backward)?,
            others: Vec::new(),
            merges: Default::default(),
        })
    }

    /// Split-K decode for the heads' widths and `masks` in `dtype`: the family's, else
    /// compiled from its descriptions, in the layout the device plans.
    fn split(
        &mut self,
        gpu: &Gpu,
        h: Heads,
        masks: Masks,
        (cache, dtype): (Cache, Dtype),
    ) -> Result<&SplitDecode, Error> {
        let planned = SplitLayout::PLANNED;
        let passes = (planned, Combine::planned(gpu, planned));
        self.split_in(gpu, h, masks, (cache, dtype), passes)
    }

    /// [`Runner::split`] in `layout`, its slices combined as `combine` says.
    fn split_in(
        &mut self,
        gpu: &Gpu,
        h: Heads,
        masks: Masks,
        (cache, dtype): (Cache, Dtype),
        (layout, combine): (SplitLayout, Combine),
    ) -> Result<&SplitDecode, Error> {
        let dims = (h.head_dim, h.head_dim_v);
        let key = (dims, masks, cache, dtype, (layout, combine));
        let at = match self.split.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                let spec = crate::ops::decode::DecodeSpec {
                    masks,
                    cache,
                    ..crate::ops::decode::DecodeSpec::new(dims.0, dims.1, dtype)
                };
                let planned = (SplitLayout::PLANNED, Combine::planned(gpu, layout));
                let kernels = match (layout, combine) == planned {
                    true => SplitDecode::for_spec(gpu, &spec)?,
                    false => SplitDecode::with_passes(gpu, &spec, layout, combine)?,
                };
                self.split.push((key, kernels));
                self.split.len() - 1
            }
        };
        Ok(&self.split[at].1)
    }

    /// The per-row kernel of `op` for `head_dim` and `masks`: the family's, else compiled
    /// from the family's description.
    fn per_row(
        &mut self,
        gpu: &Gpu,
        op: Op,
        (head_dim, head_dim_v): (u32, u32),
        masks: Masks,
    ) -> Result<&Kernel, Error> {
        let found = |k: &Kernel| {
            let abi = k.abi();
            abi.op == op
                && abi.head_dim == head_dim
                && abi.head_dim_v() == head_dim_v
                && abi.masks == masks
        };
        if !self.per_row.iter().any(found) {
            let base = match op {
                Op::Decode => "attention_decode",
                _ => "attention_forward",
            };
            let spec = KernelSpec::standard(
                &crate::plan::kernels::family_name(base, head_dim),
                op,
                head_dim,
                masks,
            )
            .with_head_dim_v(head_dim_v);
            self.per_row.push(Kernel::now(gpu, &compile(&spec)?)?);
        }
        Ok(self
            .per_row
            .iter()
            .find(|k| found(k))
            .expect("just compiled"))
    }

    /// The flash forward candidates of `head_dim` and `masks` that fit the device.
    fn flash(
        &mut self,
        gpu: &Gpu,
        dims: (u32, u32),
        masks: Masks,
    ) -> Result<&[(FlashConfig, Kernel)], Error> {
        let at = match self
            .flash
            .iter()
            .position(|(d, m, _)| *d == dims && *m == masks)
        {
            Some(at) => at,
            None => {
                self.flash
                    .push((dims, masks, flash_kernels(gpu, dims, masks)?));
                self.flash.len() - 1
            }
        };
        Ok(&self.flash[at].2)
    }

    /// The forward in f16 (where the device has SHADER_F16) and bf16: per row (f16) and
    /// flash candidate 0 and the planned configuration, each that fits the device, and in
    /// f16 every cooperative-matrix configuration where the device has them.
    fn half(&mut self, gpu: &Gpu, dims: (u32, u32), masks: Masks) -> Result<&HalfSet, Error> {
        if let Some(at) = self
            .half
            .iter()
            .position(|(d, m, _)| *d == dims && *m == masks)
        {
            return Ok(&self.half[at].2);
        }
        let (head_dim, width) = (dims.0, dims.0.max(dims.1));
        let mut set = Vec::new();
        for dtype in gpu.half_dtypes() {
            let planned = self.backward.table.forward(gpu, width, dtype);
            let mut configs = vec![tuning::forward_candidates(width)[0]];
            configs.extend(planned.filter(|p| *p != configs[0]));
            if gpu.coop16_for(dtype, Op::Forward, width) {
                let coop = tuning::coop_candidates(gpu, width, dtype);
                configs.extend(coop.into_iter().filter(|c| Some(*c) != planned));
            }
            let name = crate::plan::kernels::family_name("attention_forward", head_dim);
            if dtype == Dtype::F16 {
                let spec = KernelSpec {
                    dtype,
                    ..KernelSpec::standard(&name, Op::Forward, head_dim, masks)
                }
                .with_head_dim_v(dims.1);
                set.push((
                    format!("forward {}", dtype.name()),
                    Kernel::now(gpu, &compile(&spec)?)?,
                ));
            }
            for config in &configs {
                let abi = crate::plan::kernels::flash_forward(
                    AttentionSpec::new(dims.0, masks, dtype).with_head_dim_v(dims.1),
                    *config,
                )
                .map_err(|e| Error::Pipeline {
                    kernel: format!("forward flash {} {}", config.label(), dtype.name()),
                    message: e.to_string(),
                })?;
                if tuning::fits(gpu, &abi) {
                    let mut label = format!("forward flash {} {}", config.label(), dtype.name());
                    if planned == Some(*config) {
                        label += " (planned)";
                    }
                    set.push((label, Kernel::now(gpu, &abi)?));
                }
            }
        }
        self.half.push((dims, masks, set));
        Ok(&self.half.last().expect("just pushed").2)
    }

    /// RoPE forward and backward for `head_dim`.
    fn rope(&mut self, gpu: &Gpu, head_dim: u32) -> Result<&(Kernel, Kernel), Error> {
        let found = |(f, _): &(Kernel, Kernel)| f.abi().head_dim == head_dim;
        if !self.rope.iter().any(found) {
            let spec = |base: &str, op| KernelSpec {
                workgroup_size: head_dim.next_power_of_two().max(32),
                ..KernelSpec::standard(
                    &crate::plan::kernels::family_name(base, head_dim),
                    op,
                    head_dim,
                    Masks::default(),
                )
            };
            let fwd = compile(&spec("rope", Op::Rope))?;
            let bwd = compile(&spec("rope_backward", Op::RopeBackward))?;
            self.rope
                .push((Kernel::now(gpu, &fwd)?, Kernel::now(gpu, &bwd)?));
        }
        Ok(self.rope.iter().find(|p| found(p)).expect("just compiled"))
    }

    /// The backward for `masks`, holding `head_dim`'s kernels.
    pub fn backward_for(
        &mut self,
        gpu: &Gpu,
        dims: (u32, u32),
        masks: Masks,
    ) -> Result<&mut Backward, Error> {
        let standard = masks == self::masks(true);
        if !standard && !self.others.iter().any(|(m, _)| *m == masks) {
            let mut b = Backward::from_kernels(gpu, &[])?;
            b.scratch_budget = self.backward.scratch_budget;
            b.table = self.backward.table.clone();
            self.others.push((masks, b));
        }
        let backward = match standard {
            true => &mut self.backward,
            false => {
                let at = self.others.iter().position(|(m, _)| *m == masks);
                &mut self.others[at.expect("made above")].1
            }
        };
        if backward.schedules(dims, Dtype::F32).is_empty() {
            let set = BackwardKernels::compile(dims, masks).map_err(|e| Error::Pipeline {
                kernel: format!("backward d{}/{}", dims.0, dims.1),
                message: e.to_string(),
            })?;
            backward.add_kernels(gpu, &set)?;
        }
        Ok(backward)
    }
}

fn compile(spec: &KernelSpec) -> Result<KernelAbi, Error> {
    attn_dsl::compile(spec).map_err(|e| Error::Pipeline {
        kernel: spec.name.clone(),
        message: e.to_string(),
    })
}

/// The flash forward candidates of `head_dim` under `masks` that fit the device.
fn flash_kernels(
    gpu: &Gpu,
    dims: (u32, u32),
    masks: Masks,
) -> Result<Vec<(FlashConfig, Kernel)>, Error> {
    let mut out = Vec::new();
    for config in tuning::forward_candidates(dims.0.max(dims.1)) {
        let abi = crate::plan::kernels::flash_forward(
            AttentionSpec::new(dims.0, masks, Dtype::F32).with_head_dim_v(dims.1),
            config,
        )
        .map_err(|e| Error::Pipeline {
            kernel: format!("flash d{} {}", dims.0, config.label()),
            message: e.to_string(),
        })?;
        if tuning::fits(gpu, &abi) {
            out.push((config, Kernel::now(gpu, &abi)?));
        }
    }
    Ok(out)
}

/// One line of the report: what ran, and how each output compares.
pub struct Row {
    pub case: Case,
    pub label: String,
    pub verdicts: Vec<(&'static str, Verdict)>,
}

impl Row {
    pub fn pass(&self) -> bool {
        self.verdicts.iter().all(|(_, v)| v.pass())
    }
}

/// `seg` for `seq` rows in `docs` documents of near-equal length.
pub fn documents(seq: u32, docs: u32) -> Vec<u32> {
    let docs = docs.clamp(1, seq.max(1));
    (0..seq).map(|s| doc_start(s, seq, docs)).collect()
}

fn doc_start(s: u32, seq: u32, docs: u32) -> u32 {
    let doc = s * docs / seq;
    // The smallest row whose document index is `doc`.
    (doc * seq).div_ceil(docs)
}

/// `seg` of every sequence of the batch, `[batch, seq]`: each differs (one more even
/// document, or the packed lengths rotated), so a kernel that reads another sequence's
/// documents fails.
fn batch_documents(batch: u32, seq: u32, docs: Docs) -> Vec<u32> {
    (0..batch)
        .flat_map(|b| match docs {
            Docs::Even(n) => documents(seq, n + b),
            Docs::Packed(lengths) => {
                let mut l = lengths.to_vec();
                l.rotate_left(b as usize % lengths.len());
                crate::shape::seg_from_lengths(&l).expect("the cases' lengths fit a u32")
            }
        })
        .collect()
}

pub fn run_case(gpu: &Gpu, runner: &mut Runner, case: &Case, seed: u64) -> Result<Vec<Row>, Error> {
    let (h, batch) = (case.heads, case.batch);
    let row = |label: &str, verdicts| Row {
        case: *case,
        label: label.to_string(),
        verdicts,
    };
    Ok(match case.shape {
        Shape::Forward { seq, docs, causal } => {
            let job = Job {
                h,
                batch,
                seq,
                seg: batch_documents(batch, seq, docs),
                causal,
                mods: ModData::new(case.mods, h, batch, (seq, seq), seed),
            };
            let masks = job.masks();
            let dims = (h.head_dim, h.head_dim_v);
            let kernel = runner.per_row(gpu, Op::Forward, dims, masks)?;
            let mut rows = vec![row(kernel.name(), job.forward(gpu, kernel, seed, false)?)];
            let planned = runner.backward.table.forward(gpu, h.width(), Dtype::F32);
            for (config, kernel) in runner.flash(gpu, dims, masks)? {
                let mut label = format!("forward flash {}", config.label());
                if planned == Some(*config) {
                    label += " (planned)";
                }
                rows.push(row(&label, job.forward(gpu, kernel, seed, false)?));
            }
            // Half precision on the plain cases of one batch, with sinks alone (which
            // change how each schedule finishes a row, the tensor-core ones included), and
            // with a user-written modifier at any batch (the tensor-core kernels apply it
            // too, and a modifier's tensors per sequence differ between sequences).
            let sinks = ModCase {
                sinks: true,
                ..ModCase::default()
            };
            let flex_alone = ModCase {
                flex: case.mods.flex,
                ..ModCase::default()
            };
            let half = match case.mods.flex {
                Some(_) => case.mods == flex_alone,
                None => (case.mods == ModCase::default() || case.mods == sinks) && batch == 1,
            };
            if half {
                for (label, kernel) in runner.half(gpu, dims, masks)? {
                    rows.push(row(label, job.forward(gpu, kernel, seed, false)?));
                    // bf16's range, past f16's: what its tensor-core path scales by rows.
                    if kernel.abi().scalar("o") == attn_dsl::Scalar::Bf16 && seq >= 64 {
                        let verdicts = job.forward(gpu, kernel, seed, true)?;
                        rows.push(row(&format!("{label}, rows 1e-20..1e20 and 0"), verdicts));
                    }
                }
            }
            // The forward's attention states split along the keys and merged on the device.
            let mut dtypes = vec![Dtype::F32];
            if half {
                dtypes.extend(gpu.half_dtypes());
            }
            let [q, k, v, _] = qkv(h, batch * seq, seed);
            let merged = crate::harness::merged::rows(
                gpu,
                &mut runner.merges,
                &job.problem(),
                [&q, &k, &v],
                &dtypes,
            )?;
            rows.extend(
                merged
                    .into_iter()
                    .map(|(label, verdicts)| row(&label, verdicts)),
            );
            rows
        }
        Shape::Decode {
            cache_len,
            capacity,
        } => {
            let mods = ModData::new(case.mods, h, batch, (1, capacity), seed);
            let masks = mods.mods().masks(false, false);
            let shape = (batch, cache_len, capacity);
            let split = runner.split(gpu, h, masks, (Cache::Contiguous, Dtype::F32))?;
            let plain_planned = split_plan(split, h, batch, cache_len) == DecodePath::Plain;
            let kernel = runner.per_row(gpu, Op::Decode, (h.head_dim, h.head_dim_v), masks)?;
            let verdicts = run_decode(gpu, Decoder::Plain(kernel), h, shape, &mods, seed)?;
            let mut rows = vec![row(&planned(kernel.name(), plain_planned), verdicts)];
            let split = runner.split(gpu, h, masks, (Cache::Contiguous, Dtype::F32))?;
            // The rule's slicing, then the longest slice the kernel holds.
            for slice_len in [None, Some(split.max_slice())] {
                let decoder = Decoder::Split(split, slice_len);
                let verdicts = run_decode(gpu, decoder, h, shape, &mods, seed)?;
                let label = decoder.label(cache_len, h, batch);
                rows.push(row(
                    &planned(&label, !plain_planned && slice_len.is_none()),
                    verdicts,
                ));
            }
            // The streamed split pass, where the device has subgroups.
            if gpu.has_subgroups() {
                let layout = (SplitLayout::Streamed, Combine::ReducePass);
                let other =
                    runner.split_in(gpu, h, masks, (Cache::Contiguous, Dtype::F32), layout)?;
                let decoder = Decoder::Split(other, None);
                let verdicts = run_decode(gpu, decoder, h, shape, &mods, seed)?;
                rows.push(row(&decoder.label(cache_len, h, batch), verdicts));
            }
            // A paged cache: pages of 16 keys (vLLM's default) and of 7, which no key tile
            // or slice lines up with, shuffled through the pool.
            let paged = runner.split(gpu, h, masks, (Cache::Paged, Dtype::F32))?;
            for page_size in [16, 7] {
                let decoder = Decoder::Paged(paged, page_size);
                // A paged cache's positions are its pages' rows.
                let positions = capacity.div_ceil(page_size) * page_size;
                let mods = ModData::new(case.mods, h, batch, (1, positions), seed);
                let verdicts = run_decode(gpu, decoder, h, shape, &mods, seed)?;
                rows.push(row(&decoder.label(cache_len, h, batch), verdicts));
            }
            // The cache, the query and O in half precision: the rule's slicing, then the
            // longest slice the kernel holds (laid out for the device's workgroup memory, so
            // longer than the f32 kernels' above, and what the rule takes on a large GPU).
            for dtype in gpu.half_dtypes() {
                let half = runner.split(gpu, h, masks, (Cache::Contiguous, dtype))?;
                for slice_len in [None, Some(half.max_slice())] {
                    let decoder = Decoder::Split(half, slice_len);
                    let verdicts = run_decode(gpu, decoder, h, shape, &mods, seed)?;
                    rows.push(row(&decoder.label(cache_len, h, batch), verdicts));
                }
            }
            // The staged pass combining its slices in place (what the planner takes on grids
            // of one wave), in slices of one key tile: as many slices as the cache allows.
            if Combine::planned(gpu, SplitLayout::Staged) != Combine::ReducePass {
                let in_place = (SplitLayout::Staged, Combine::InPlace);
                let dtypes = std::iter::once(Dtype::F32).chain(gpu.half_dtypes());
                let caches = dtypes
                    .map(|d| (Cache::Contiguous, d))
                    .chain([(Cache::Paged, Dtype::F32)]);
                for cache in caches.collect::<Vec<_>>() {
                    let split = runner.split_in(gpu, h, masks, cache, in_place)?;
                    let decoder = match cache.0 {
                        Cache::Contiguous => Decoder::Split(split, Some(split.key_tile())),
                        Cache::Paged => Decoder::Paged(split, 16),
                    };
                    let positions = capacity.div_ceil(16) * 16;
                    let mods = ModData::new(case.mods, h, batch, (1, positions), seed);
                    let verdicts = run_decode(gpu, decoder, h, shape, &mods, seed)?;
                    rows.push(row(&decoder.label(cache_len, h, batch), verdicts));
                }
            }
            // The cache in 8-bit floats, filled by appends (the kernel quantizes) and decoded
            // as a user runs it: both formats, a paged pool, half-precision queries.
            let paged = CacheLayout::Paged {
                page_size: 16,
                n_pages: batch * capacity.div_ceil(16),
                pages_per_seq: capacity.div_ceil(16),
            };
            let contiguous = CacheLayout::Contiguous { capacity };
            let mut fp8_runs = vec![
                (Fp8::E4m3, contiguous, Dtype::F32),
                (Fp8::E5m2, contiguous, Dtype::F32),
                (Fp8::E4m3, paged, Dtype::F32),
            ];
            fp8_runs.extend(
                gpu.half_dtypes()
                    .into_iter()
                    .map(|d| (Fp8::E4m3, contiguous, d)),
            );
            for (fp8, layout, dtype) in fp8_runs {
                let (label, verdicts) =
                    run_fp8_decode(gpu, (fp8, layout, dtype), h, shape, &mods, seed)?;
                rows.push(row(&label, verdicts));
            }
            // The cache continued: each sequence's next rows appended and attended over its
            // whole cache, judged as the last rows of one causal forward over it.
            for (label, verdicts) in continued_rows(gpu, case.mods, h, (batch, cache_len), seed)? {
                rows.push(row(&label, verdicts));
            }
            for (label, verdicts) in cascade_rows(gpu, &mods, h, cache_len, seed)? {
                rows.push(row(&label, verdicts));
            }
            rows
        }
        Shape::Backward { seq, docs, causal } => {
            let job = Job {
                h,
                batch,
                seq,
                seg: batch_documents(batch, seq, docs),
                causal,
                mods: ModData::new(case.mods, h, batch, (seq, seq), seed),
            };
            job.backward(gpu, runner, case, seed)?
        }
        Shape::Rope { seq, pos_offset } => {
            let pair = runner.rope(gpu, h.head_dim)?;
            let verdicts = run_rope(gpu, pair, h, batch, seq, pos_offset, seed)?;
            let mut rows = vec![row("rope, rope_backward", verdicts)];
            // bf16 rotates two pairs a word: a head_dim that is a multiple of 4.
            let halves = gpu.half_dtypes().into_iter();
            for dtype in halves.filter(|d| *d != Dtype::Bf16 || h.head_dim.is_multiple_of(4)) {
                let x = run_half_rope(gpu, dtype, h, (batch, seq, pos_offset), seed)?;
                rows.push(row(&format!("rope {}", dtype.name()), vec![("x", x)]));
            }
            rows
        }
    })
}

fn problem(
    h: Heads,
    batch: u32,
    [n_q, n_k]: [u32; 2],
    causal: bool,
    seg: Option<&[u32]>,
) -> Problem<'_> {
    Problem {
        batch: batch as usize,
        n_q: n_q as usize,
        n_k: n_k as usize,
        n_heads: h.n_heads as usize,
        n_kv_heads: h.n_kv_heads as usize,
        head_dim: h.head_dim as usize,
        head_dim_v: h.head_dim_v as usize,
        scale: f64::from(h.default_scale()),
        causal,
        seg,
        ..Problem::default()
    }
}

/// Row magnitudes for Q, K and V, cycling row by row (a row is head_dim values of one
/// position and head): rows of 1e-20 beside rows of 1e20 and all-zero rows in Q and in V,
/// bf16's range past f16's. K's rows are small where Q's are large, so that the scores
/// stay near 1: with scores of 1e18 every LSE is its max score to an ulp, and the rule
/// would compare two roundings of 1e18 (the scalar bf16 path's reached 1.5 of the bound).
const RANGES: [[f32; 5]; 3] = [
    [1.0, 1e-20, 1e20, 0.0, 1e-3],
    [1e-20, 1e-20, 0.0, 1e-20, 1e-30],
    [1.0, 1e20, 1e-20, 0.0, 1e5],
];

/// The chunk whose rows span [`RANGES`]: a bf16 chunk takes each cached row's scale from
/// the row as it fetches it.
const RANGED_CHUNK: &str = " chunk rows 1e-20..1e20 and 0";

/// Row magnitudes for Q, K, V and dO in the backward, as [`RANGES`] for the forward: each
/// tensor spans 20 decades or more with an all-zero row, past f16's range, while every
/// score stays near 1 (Q's largest rows meet K's, 1e-15 at most) and no gradient leaves
/// f32 (dK = dS·Q, with dP = dO·V, reaches 1e31), and each gradient's largest element is
/// 1 or more, so that the rule's floor of 1e-6 judges none of them trivially.
const BACKWARD_RANGES: [[f32; 5]; 4] = [
    [1.0, 1e-20, 1e15, 0.0, 1e-3],
    [1e-15, 1e-20, 0.0, 1e-15, 1e-30],
    [1.0, 1e15, 1e-20, 0.0, 1e5],
    [1.0, 1e-20, 0.0, 1e-5, 1e-10],
];

/// Each row of `width` values of `x` times its factor, cycling row by row.
fn scale_rows(x: &mut [f32], factors: &[f32], width: u32) {
    for (i, row) in x.chunks_mut(width as usize).enumerate() {
        row.iter_mut()
            .for_each(|e| *e *= factors[i % factors.len()]);
    }
}

/// Random Q, K, V (and dO) for `rows` rows.
fn qkv(h: Heads, rows: u32, seed: u64) -> [Vec<f32>; 4] {
    let q_len = (rows * h.n_heads * h.head_dim) as usize;
    let kv_len = (rows * h.n_kv_heads * h.head_dim) as usize;
    let v_len = (rows * h.n_kv_heads * h.head_dim_v) as usize;
    let o_len = (rows * h.n_heads * h.head_dim_v) as usize;
    [
        random(q_len, seed),
        random(kv_len, seed + 1),
        random(v_len, seed + 2),
        random(o_len, seed + 3),
    ]
}

/// A forward or backward case's problem: `batch` sequences of `seq` rows in documents.
struct Job {
    h: Heads,
    batch: u32,
    seq: u32,
    seg: Vec<u32>,
    causal: bool,
    mods: ModData,
}

impl Job {
    fn problem(&self) -> Problem<'_> {
        Problem {
            mods: self.mods.mods(),
            ..problem(
                self.h,
                self.batch,
                [self.seq; 2],
                self.causal,
                Some(&self.seg),
            )
        }
    }

    fn masks(&self) -> Masks {
        self.mods.mods().masks(self.causal, true)
    }

    /// The forward on random inputs, or with `ranges` on rows scaled by [`RANGES`].
    fn forward(
        &self,
        gpu: &Gpu,
        kernel: &Kernel,
        seed: u64,
        ranges: bool,
    ) -> Result<Vec<(&'static str, Verdict)>, Error> {
        let [mut q, mut k, mut v, _] = qkv(self.h, self.batch * self.seq, seed);
        if ranges {
            let widths = [self.h.head_dim, self.h.head_dim, self.h.head_dim_v];
            for ((x, factors), width) in [&mut q, &mut k, &mut v]
                .into_iter()
                .zip(&RANGES)
                .zip(widths)
            {
                scale_rows(x, factors, width);
            }
        }
        // A half-precision kernel is judged on the inputs it reads: rounded to its dtype.
        let dtype = kernel.abi().scalar("o");
        let [q, k, v] = [q, k, v].map(|x| crate::tensor::buffers::rounded(&x, dtype));
        let input = ForwardInput {
            batch: self.batch,
            seq_len: self.seq,
            heads: self.h,
            q: &q,
            k: &k,
            v: &v,
            seg: Some(&self.seg),
            scale: None,
            mods: self.mods.mods(),
        };
        let out = crate::ops::forward::forward(gpu, kernel, &input).block_on()?;
        if dtype != attn_dsl::Scalar::F32 {
            let p = self.problem();
            return Ok(judge_half_attention(
                &p,
                [&q, &k, &v],
                &out.o,
                Some(&out.lse),
                dtype,
            ));
        }
        Ok(judge_attention(
            &self.problem(),
            [&q, &k, &v],
            &out.o,
            Some(&out.lse),
        ))
    }

    /// One row per schedule the device runs, then one that asserts they agree: the largest
    /// difference between any schedule and the first, against twice the rule's bound.
    fn backward(
        &self,
        gpu: &Gpu,
        runner: &mut Runner,
        case: &Case,
        seed: u64,
    ) -> Result<Vec<Row>, Error> {
        let h = self.h;
        let [q, k, v, d_o] = qkv(h, self.batch * self.seq, seed);
        let p = self.problem();
        // O and LSE from the f64 reference, so the backward is judged on its own.
        let fwd = reference::attention::<f64>(&p, &cast(&q), &cast(&k), &cast(&v));
        let (o, lse): (Vec<f32>, Vec<f32>) = (
            fwd.o.iter().map(|x| *x as f32).collect(),
            fwd.lse.iter().map(|x| *x as f32).collect(),
        );
        let input = BackwardInput {
            batch: self.batch,
            seq_len: self.seq,
            heads: h,
            q: &q,
            k: &k,
            v: &v,
            o: &o,
            lse: &lse,
            d_o: &d_o,
            seg: Some(&self.seg),
            scale: None,
            mods: self.mods.mods(),
        };
        let backward = runner.backward_for(gpu, h.dims(), self.masks())?;
        let planned = backward.plan(gpu, self.batch, self.seq, h, Dtype::F32);
        let mut rows = Vec::new();
        let mut results: Vec<(Schedule, Gradients)> = Vec::new();
        for schedule in backward.schedules(h.dims(), Dtype::F32) {
            let (g, _) = backward
                .run(gpu, &input, Some(schedule), Dtype::F32)
                .block_on()?;
            let verdicts = judge_backward(
                &p,
                [&q, &k, &v, &d_o],
                (&o, &lse),
                [&g.dq, &g.dk, &g.dv],
                [&g.dbias, &g.dsinks],
                &g.dflex,
            );
            let mut label = format!("backward {schedule}");
            if schedule == planned {
                label += " (planned)";
            }
            rows.push(Row {
                case: *case,
                label,
                verdicts,
            });
            results.push((schedule, g));
        }
        rows.push(agreement(case, &rows[0], &results));
        rows.extend(rerun_deterministic(
            gpu,
            backward,
            case,
            &input,
            Dtype::F32,
            &results,
        )?);
        for dtype in gpu.half_dtypes() {
            rows.extend(self.half_backward(gpu, runner, case, &input, dtype, false)?);
            // bf16's range, past f16's: what its tensor-core path scales by rows.
            if dtype == Dtype::Bf16 && self.seq >= 64 {
                rows.extend(self.half_backward(gpu, runner, case, &input, dtype, true)?);
            }
        }
        Ok(rows)
    }

    /// One row per half-precision schedule of `dtype`, judged on the inputs the kernels
    /// read: Q, K, V, dO and O rounded to the dtype; with `ranges`, on rows scaled by
    /// [`BACKWARD_RANGES`] (then without the deterministic rerun).
    fn half_backward(
        &self,
        gpu: &Gpu,
        runner: &mut Runner,
        case: &Case,
        input: &BackwardInput,
        dtype: Dtype,
        ranges: bool,
    ) -> Result<Vec<Row>, Error> {
        let h = self.h;
        let scalar = attn_dsl::Scalar::from(dtype);
        let mut inputs = [input.q, input.k, input.v, input.d_o].map(<[f32]>::to_vec);
        if ranges {
            let factors = &BACKWARD_RANGES;
            let widths = [h.head_dim, h.head_dim, h.head_dim_v, h.head_dim_v];
            for ((x, f), w) in inputs.iter_mut().zip(factors).zip(widths) {
                scale_rows(x, f, w);
            }
        }
        let [q, k, v, d_o] = inputs.map(|x| crate::tensor::buffers::rounded(&x, scalar));
        // The forward a framework saves on these inputs: O in the dtype, LSE in f32.
        let fwd = reference::attention::<f64>(&self.problem(), &cast(&q), &cast(&k), &cast(&v));
        let o: Vec<f32> = fwd
            .o
            .iter()
            .map(|x| crate::tensor::buffers::round_to(*x as f32, scalar))
            .collect();
        let lse: Vec<f32> = fwd.lse.iter().map(|x| *x as f32).collect();
        let input = BackwardInput {
            q: &q,
            k: &k,
            v: &v,
            o: &o,
            lse: &lse,
            d_o: &d_o,
            ..*input
        };
        let backward = runner.backward_for(gpu, h.dims(), self.masks())?;
        if backward.schedules(h.dims(), dtype).is_empty() {
            let spec = BackwardSpec::new(h.head_dim, self.masks(), dtype);
            backward.add(gpu, spec.with_head_dim_v(h.head_dim_v))?;
        }
        let plan = backward.plan(gpu, self.batch, self.seq, h, dtype);
        let mut rows = Vec::new();
        let mut results = Vec::new();
        for schedule in backward.schedules(h.dims(), dtype) {
            let (g, _) = backward
                .run(gpu, &input, Some(schedule), dtype)
                .block_on()?;
            let verdicts = judge_half_backward(
                &self.problem(),
                [&q, &k, &v, &d_o],
                (&o, &lse),
                [&g.dq, &g.dk, &g.dv],
                [&g.dbias, &g.dsinks],
                &g.dflex,
                scalar,
            );
            let mut label = planned(
                &format!("backward {schedule} {}", dtype.name()),
                schedule == plan,
            );
            if ranges {
                label += ", rows 1e-30..1e15 and 0";
            }
            rows.push(Row {
                case: *case,
                label,
                verdicts,
            });
            results.push((schedule, g));
        }
        if !ranges {
            rows.extend(rerun_deterministic(
                gpu, backward, case, &input, dtype, &results,
            )?);
        }
        Ok(rows)
    }
}

/// The deterministic plan (`Backward::deterministic`) run once more: its gradients must
/// equal those of its run among `results` bit for bit (the row's error counts the elements
/// that differ). None where no schedule of the set owns every output (a shared bias).
fn rerun_deterministic(
    gpu: &Gpu,
    backward: &mut Backward,
    case: &Case,
    input: &BackwardInput,
    dtype: Dtype,
    results: &[(Schedule, Gradients)],
) -> Result<Option<Row>, Error> {
    backward.deterministic = true;
    let h = input.heads;
    let plan = backward.plan(gpu, input.batch, input.seq_len, h, dtype);
    // No first run to compare with where the device ran no schedule of this dtype.
    let Some((_, first)) = results.iter().find(|(s, _)| *s == plan) else {
        backward.deterministic = false;
        return Ok(None);
    };
    let again = backward.run(gpu, input, Some(plan), dtype).block_on();
    backward.deterministic = false;
    let again = match again {
        Ok((g, _)) => g,
        Err(Error::Input(crate::error::InputError::NotDeterministic { .. })) => return Ok(None),
        Err(e) => return Err(e),
    };
    let differ = |a: &[f32], b: &[f32]| {
        let n = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits());
        (n.count() + a.len().abs_diff(b.len())) as f64
    };
    let verdicts = ["dq", "dk", "dv", "dbias", "dsinks"]
        .into_iter()
        .filter(|name| !gradient(first, name).is_empty())
        .map(|name| {
            let error = differ(gradient(first, name), gradient(&again, name));
            (name, Verdict { error, bound: 0.5 })
        });
    Ok(Some(Row {
        case: *case,
        label: format!("backward deterministic, run twice, {}", dtype.name()),
        verdicts: verdicts.collect(),
    }))
}

/// Each schedule is within `bound` of the reference, so two may differ by up to twice it
/// (atomic scatter adds in a different order on every run).
fn agreement(case: &Case, first: &Row, results: &[(Schedule, Gradients)]) -> Row {
    let (_, base) = &results[0];
    let agree = first.verdicts.iter().map(|(name, v)| {
        let pick = |g: &Gradients| gradient(g, name).to_vec();
        let error = results[1..]
            .iter()
            .map(|(_, g)| max_abs_error(&pick(g), &cast(&pick(base))))
            .fold(0.0, f64::max);
        (
            *name,
            Verdict {
                error,
                bound: 2.0 * v.bound,
            },
        )
    });
    Row {
        case: *case,
        label: "backward schedules agree".into(),
        verdicts: agree.collect(),
    }
}

/// The gradient a verdict names.
fn gradient<'g>(g: &'g Gradients, name: &str) -> &'g [f32] {
    match name {
        "dq" => &g.dq,
        "dk" => &g.dk,
        "dv" => &g.dv,
        "dbias" => &g.dbias,
        "dsinks" => &g.dsinks,
        flex => g
            .flex(flex)
            .unwrap_or_else(|| unreachable!("no gradient {flex}")),
    }
}

/// The decode a check row runs: the plain kernel, or split-K with a slice length (`None`:
/// the planner's).
#[derive(Clone, Copy)]
enum Decoder<'a> {
    Plain(&'a Kernel),
    Split(&'a SplitDecode, Option<u32>),
    /// Split-K over a paged copy of the cache, pages of this many keys.
    Paged(&'a SplitDecode, u32),
}

/// A paged copy of contiguous caches `[batch, capacity, kv_heads, head_dim]`: the block
/// table `[batch, pages]` and the pools, each sequence's pages placed in reverse order
/// after `spare` unused pages, so that no page sits where a contiguous layout would put it.
pub(crate) fn page_cache(
    h: Heads,
    (batch, capacity): (u32, u32),
    page_size: u32,
    spare: usize,
    caches: [&[f32]; 2],
) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
    let per_seq = capacity.div_ceil(page_size) as usize;
    let n_pages = spare + batch as usize * per_seq;
    let table: Vec<u32> = (0..batch as usize * per_seq)
        .map(|i| (n_pages - 1 - i) as u32)
        .collect();
    let pool = |cache: &[f32], width: u32| {
        let row = (h.n_kv_heads * width) as usize;
        let page = page_size as usize * row;
        let mut pool = vec![0.0f32; n_pages * page];
        for (i, &p) in table.iter().enumerate() {
            let (b, first) = (i / per_seq, (i % per_seq) * page_size as usize);
            let rows = (capacity as usize - first).min(page_size as usize);
            let src = (b * capacity as usize + first) * row;
            let dst = p as usize * page;
            pool[dst..dst + rows * row].copy_from_slice(&cache[src..src + rows * row]);
        }
        pool
    };
    let (k, v) = (pool(caches[0], h.head_dim), pool(caches[1], h.head_dim_v));
    (table, k, v)
}

/// The planner's decode for a shape (its choice depends on the shape only).
fn split_plan(split: &SplitDecode, heads: Heads, batch: u32, cache_len: u32) -> DecodePath {
    let input = DecodeInput {
        batch,
        cache_len,
        heads,
        q: &[],
        k_cache: &[],
        v_cache: &[],
        scale: None,
        mods: Default::default(),
    };
    crate::ops::decode::plan_decode(split, &input)
}

fn planned(label: &str, planned: bool) -> String {
    match planned {
        true => format!("{label} (planned)"),
        false => label.to_string(),
    }
}

impl Decoder<'_> {
    /// The kernel's name, and for split-K its slicing (`n_slices x slice_len`).
    fn label(&self, cache_len: u32, h: Heads, batch: u32) -> String {
        match *self {
            Decoder::Plain(k) => k.name().to_string(),
            Decoder::Paged(s, page_size) => {
                let slicing = s.slicing_of(h, batch, cache_len);
                format!(
                    "{} split {}x{} page={page_size}",
                    s.split_kernel().name(),
                    slicing.n_slices,
                    slicing.slice_len,
                )
            }
            Decoder::Split(s, len) => {
                let slicing = match (len, split_plan(s, h, batch, cache_len)) {
                    (Some(l), _) => Slicing {
                        slice_len: l,
                        n_slices: cache_len.div_ceil(l),
                    },
                    (None, DecodePath::Split(planned)) => planned,
                    (None, DecodePath::Plain) => s.slicing_of(h, batch, cache_len),
                };
                let dtype = match s.reduce_kernel().abi().scalar("o") {
                    attn_dsl::Scalar::F16 => " f16",
                    attn_dsl::Scalar::Bf16 => " bf16",
                    _ => "",
                };
                format!(
                    "{} split {}x{}{dtype}",
                    s.split_kernel().name(),
                    slicing.n_slices,
                    slicing.slice_len,
                )
            }
        }
    }
}

fn run_decode(
    gpu: &Gpu,
    decoder: Decoder,
    h: Heads,
    (batch, cache_len, capacity): (u32, u32, u32),
    mods: &ModData,
    seed: u64,
) -> Result<Vec<(&'static str, Verdict)>, Error> {
    let [q, k, v, _] = qkv(h, batch * capacity, seed);
    let q = q[..(batch * h.n_heads * h.head_dim) as usize].to_vec();
    // A half-precision decode is judged on the inputs it reads: rounded to its dtype.
    let dtype = match decoder {
        Decoder::Split(s, _) | Decoder::Paged(s, _) => s.reduce_kernel().abi().scalar("o"),
        Decoder::Plain(k) => k.abi().scalar("o"),
    };
    let [q, k, v] = [q, k, v].map(|x| crate::tensor::buffers::rounded(&x, dtype));
    let input = DecodeInput {
        batch,
        cache_len,
        heads: h,
        q: &q,
        k_cache: &k,
        v_cache: &v,
        scale: None,
        mods: mods.mods(),
    };
    let o = match decoder {
        Decoder::Plain(kernel) => crate::ops::decode::decode(gpu, kernel, &input).block_on()?,
        Decoder::Split(split, slice_len) => split.run(gpu, &input, slice_len).block_on()?,
        Decoder::Paged(split, page_size) => {
            let (table, k_pool, v_pool) = page_cache(h, (batch, capacity), page_size, 2, [&k, &v]);
            let pages = Pages {
                block_table: &table,
                page_size,
            };
            let paged = DecodeInput {
                k_cache: &k_pool,
                v_cache: &v_pool,
                ..input
            };
            split.run_paged(gpu, &paged, &pages, None).block_on()?
        }
    };
    // The reference reads each sequence's first `cache_len` rows, packed.
    let fill = filled(h, capacity, cache_len);
    let (k, v) = (fill(&k, h.head_dim), fill(&v, h.head_dim_v));
    // The modifiers' tensors over positions span the cache's capacity: a paged cache's is
    // its pages' rows.
    let positions = match decoder {
        Decoder::Paged(_, page_size) => capacity.div_ceil(page_size) * page_size,
        _ => capacity,
    };
    let p = Problem {
        mods: mods.mods(),
        q_pos: cache_len as usize - 1,
        positions: positions as usize,
        ..problem(h, batch, [1, cache_len], false, None)
    };
    if dtype != attn_dsl::Scalar::F32 {
        return Ok(judge_half_attention(&p, [&q, &k, &v], &o, None, dtype));
    }
    Ok(judge_attention(&p, [&q, &k, &v], &o, None))
}

/// Each sequence's first `cache_len` rows of a cache of `capacity` rows per sequence,
/// packed, for the reference; `width` is the tensor's row width.
fn filled(h: Heads, capacity: u32, cache_len: u32) -> impl Fn(&[f32], u32) -> Vec<f32> {
    move |x, width| {
        let row = (h.n_kv_heads * width) as usize;
        x.chunks(capacity as usize * row)
            .flat_map(|c| c[..cache_len as usize * row].to_vec())
            .collect()
    }
}

/// A row's label and its outputs' verdicts.
type Labelled = (String, Vec<(&'static str, Verdict)>);

/// Cascades where the case's modifiers allow one (no mask that moves with the position):
/// three sequences over a prefix of `len` rows, their suffixes of 1, len / 7 + 1 and
/// len / 3 + 1 rows, contiguous and paged in f32 and contiguous in each half dtype.
fn cascade_rows(
    gpu: &Gpu,
    mods: &ModData,
    h: Heads,
    len: u32,
    seed: u64,
) -> Result<Vec<Labelled>, Error> {
    use crate::harness::cascaded::{CascadeCase, run};
    let m = mods.mods();
    if m.window.is_some() || m.alibi.is_some() || m.flex.is_some() || len < 3 {
        return Ok(Vec::new());
    }
    let suffixes = [1, len / 7 + 1, len / 3 + 1];
    let mut runs = vec![
        (Dtype::F32, Cache::Contiguous, None),
        (Dtype::F32, Cache::Paged, None),
    ];
    let half = gpu.half_dtypes();
    runs.extend(half.iter().map(|&d| (d, Cache::Contiguous, None)));
    // Over an fp8 cache the prefix's rows need the chunk on tensor cores (f16 queries,
    // widths the tiles take).
    let table = crate::plan::tuning::Table::for_gpu(gpu)?;
    let coop = table.extend(gpu, h.width(), Dtype::F16);
    if half.contains(&Dtype::F16) && coop.is_some_and(|c| c.matrix == attn_dsl::Matrix::Coop16) {
        runs.push((Dtype::F16, Cache::Paged, Some(Fp8::E4m3)));
    }
    let mut rows = Vec::new();
    for (dtype, cache, fp8) in runs {
        let case = CascadeCase {
            heads: h,
            dtype,
            cache,
            fp8,
            prefix: len,
            suffixes: &suffixes,
            mods: m,
        };
        let page = if cache == Cache::Paged {
            " page=16"
        } else {
            ""
        };
        let fp8 = fp8.map_or(String::new(), |f| format!(" {} cache", f.name()));
        let label = format!(
            "cascade 3 over {len}, suffixes {suffixes:?}{page}{fp8} {}",
            dtype.name()
        );
        rows.push((label, run(gpu, &case, seed)?));
    }
    Ok(rows)
}

/// Continued caches of `len` rows: n of them added to a cache of `len - n` (n up to 4) in
/// the planned layout, paged, streamed (with subgroups), in half precision and in an e4m3
/// cache; a ragged batch of two or more, one of them a fresh slot; and where `len` allows,
/// a chunk of [`CHUNK_ROWS`] + 5 rows (the forward's tiles, `ops::extend`; in half
/// precision on tensor cores, a KV head's query heads packed), contiguous, paged, in half
/// precision and over an e4m3 cache with half-precision rows; a ragged chunk of those rows
/// beside a fresh slot's 7 (also over a paged e4m3 cache); and chunks of 8, 69 and 133
/// rows in half precision (on tensor cores, 8 rows of a KV head's three or four query
/// heads fill at most half a 64-row tile: packed into the smaller tiles that keep more
/// workgroups in flight; past a 64-row tile, where an SM holds as many 128-row tiles
/// (head_dim 128): packed into them, and past those unpacked; other head counts and widths
/// take the paths the rule gives them).
/// Each judged as the last rows of one causal forward over its whole length.
fn continued_rows(
    gpu: &Gpu,
    mods: ModCase,
    h: Heads,
    (batch, len): (u32, u32),
    seed: u64,
) -> Result<Vec<Labelled>, Error> {
    use crate::harness::continued::ContinueCase;
    if len < 2 {
        return Ok(Vec::new());
    }
    let n = 4.min(len - 1);
    let uniform_of = |n: u32| (vec![len - n; batch as usize], vec![n; batch as usize]);
    let uniform = uniform_of(n);
    let chunk = CHUNK_ROWS + 5;
    let chunked = uniform_of(chunk.min(len));
    // Chunks on tensor cores of packed rows filling at most half a 64-row tile (smaller
    // tiles), past a 64-row tile per head (packed into 128-row tiles), and past those
    // (unpacked 128-row tiles).
    let tile_rows = [(8, " chunk few"), (69, " chunk wide"), (133, " chunk wide")];
    let by_tile: Vec<_> = tile_rows.map(|(n, _)| uniform_of(n.min(len))).into();
    let ragged_batch = batch.max(2) as usize;
    let ragged: (Vec<u32>, Vec<u32>) = (0..ragged_batch)
        .map(|b| match b % 2 {
            0 => (len - n, n),
            _ => (0, (n % 3) + 1 + u32::from(n == 2)),
        })
        .unzip();
    // A ragged chunk: a chunk's rows over the cache beside a fresh slot's few (tiles past
    // a sequence's rows see no keys).
    let ragged_chunked: (Vec<u32>, Vec<u32>) = (0..ragged_batch)
        .map(|b| match b % 2 {
            0 => (len - chunk.min(len), chunk.min(len)),
            _ => (0, 7.min(len)),
        })
        .unzip();
    let paged = |cap: u32, slots: u32| CacheLayout::Paged {
        page_size: 16,
        n_pages: slots * cap.div_ceil(16),
        pages_per_seq: cap.div_ceil(16),
    };
    let half = gpu.half_dtypes().first().copied();
    type Variant = (
        &'static str,
        Dtype,
        Option<Fp8>,
        bool,
        SplitLayout,
        Option<u32>,
    );
    let planned = SplitLayout::PLANNED;
    let mut variants: Vec<Variant> = vec![
        ("", Dtype::F32, None, false, planned, None),
        (" page=16", Dtype::F32, None, true, planned, None),
        (
            " e4m3 cache",
            Dtype::F32,
            Some(Fp8::E4m3),
            false,
            planned,
            None,
        ),
    ];
    if let Some(d) = half {
        variants.push(("", d, None, false, planned, None));
    }
    if gpu.has_subgroups() {
        variants.push((
            " streamed",
            Dtype::F32,
            None,
            false,
            SplitLayout::Streamed,
            None,
        ));
    }
    let mut out = Vec::new();
    // Chunks as the rule cuts them, in one slice (the kernel that writes O) and cut into
    // slices of 64 keys (merged by the reduce), whatever the adapter's rule would say.
    let (one, sliced) = (Some(u32::MAX), Some(64));
    let f32 = Dtype::F32;
    let mut chunks: Vec<Variant> = vec![
        (" chunk", f32, None, false, planned, None),
        (" chunk one slice", f32, None, false, planned, one),
        (" chunk one slice page=16", f32, None, true, planned, one),
        (" chunk sliced", f32, None, false, planned, sliced),
        (" chunk sliced page=16", f32, None, true, planned, sliced),
    ];
    if let Some(d) = half {
        for (label, paged, slice_len) in [
            (" chunk", false, None),
            (" chunk one slice", false, one),
            (" chunk sliced", false, sliced),
            (" chunk sliced page=16", true, sliced),
        ] {
            chunks.push((label, d, None, paged, planned, slice_len));
        }
        // An e4m3 cache's chunk widens its words into the tiles (on tensor cores; the
        // split-K passes elsewhere, so sliced as the rule says).
        let e4m3 = Some(Fp8::E4m3);
        chunks.push((" chunk e4m3 cache", d, e4m3, false, planned, None));
        chunks.push((" chunk e4m3 cache page=16", d, e4m3, true, planned, None));
    }
    // A bf16 chunk scales each cached row as it fetches it (on tensor cores), whole and
    // cut into slices of a paged cache.
    if half == Some(Dtype::F16) && gpu.supports_dtype(Dtype::Bf16) {
        let bf16 = Dtype::Bf16;
        chunks.push((" chunk", bf16, None, false, planned, None));
        chunks.push((" chunk sliced page=16", bf16, None, true, planned, sliced));
        chunks.push((RANGED_CHUNK, bf16, None, false, planned, None));
    }
    let mut ragged_chunks: Vec<Variant> = vec![
        (" chunk ragged", f32, None, false, planned, None),
        (" chunk ragged one slice", f32, None, false, planned, one),
        (
            " chunk ragged sliced page=16",
            f32,
            None,
            true,
            planned,
            sliced,
        ),
    ];
    if let Some(d) = half {
        ragged_chunks.push((" chunk ragged", d, None, false, planned, None));
        ragged_chunks.push((
            " chunk ragged one slice page=16",
            d,
            None,
            true,
            planned,
            one,
        ));
        let e4m3 = Some(Fp8::E4m3);
        ragged_chunks.push((" chunk ragged e4m3 cache", d, e4m3, true, planned, None));
    }
    let tiled: Vec<(Variant, usize)> = half
        .into_iter()
        .flat_map(|d| {
            (0..tile_rows.len()).map(move |i| ((tile_rows[i].1, d, None, false, planned, None), i))
        })
        .filter(|(_, i)| tile_rows[*i].0 <= len)
        .collect();
    if len < chunk {
        chunks.clear();
        ragged_chunks.clear();
    }
    let runs = variants
        .into_iter()
        .map(|v| (v, &uniform))
        .chain(std::iter::once((
            (" ragged", Dtype::F32, None, true, planned, None),
            &ragged,
        )))
        .chain(chunks.into_iter().map(|v| (v, &chunked)))
        .chain(ragged_chunks.into_iter().map(|v| (v, &ragged_chunked)))
        .chain(tiled.into_iter().map(|(v, i)| (v, &by_tile[i])));
    for ((label, dtype, fp8, is_paged, split, slice_len), (cached, added)) in runs {
        let slots = cached.len() as u32;
        let cap = cached
            .iter()
            .zip(added)
            .map(|(c, a)| c + a)
            .max()
            .unwrap_or(1);
        let layout = match is_paged {
            true => paged(cap, slots),
            false => CacheLayout::Contiguous { capacity: cap },
        };
        let data = ModData::new(mods, h, slots, (1, layout.capacity()), seed);
        let scalar = Scalar::from(dtype);
        let total_len: u32 = cached.iter().zip(added).map(|(c, a)| c + a).sum();
        let total_added: u32 = added.iter().sum();
        let [mut q, mut k, mut v, _] = qkv(h, total_len, seed);
        if label == RANGED_CHUNK {
            for (x, factors) in [&mut q, &mut k, &mut v].into_iter().zip(RANGES) {
                scale_rows(x, &factors, h.head_dim);
            }
        }
        let q = crate::tensor::buffers::rounded(
            &q[..(total_added * h.n_heads * h.head_dim) as usize],
            scalar,
        );
        let [k, v] = [k, v].map(|x| crate::tensor::buffers::rounded(&x, scalar));
        let scales = fp8.map(|f| {
            let v_amax = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let vs = if v_amax > 0.0 { v_amax / f.max() } else { 1.0 };
            (kv_fp8::amax_scales(&k, h, f), vec![vs])
        });
        let case = ContinueCase {
            heads: h,
            dtype,
            fp8: fp8
                .zip(scales.as_ref())
                .map(|(f, (ks, vs))| (f, &ks[..], &vs[..])),
            layout,
            split,
            cached,
            added,
            mods: data.mods(),
            slice_len,
        };
        let run = crate::harness::continued::run(gpu, &case, [&q, &k, &v])?;
        let mut worst: Vec<(&'static str, Verdict)> = Vec::new();
        let (mut q_at, mut kv_at) = (0usize, 0usize);
        for b in 0..slots as usize {
            let (c, a) = (cached[b], added[b]);
            let p = Problem {
                mods: data.mods(),
                q_pos: c as usize,
                batch_index: b,
                positions: layout.capacity() as usize,
                ..problem(h, 1, [a, c + a], true, None)
            };
            let (qn, kn) = ((a * h.n_heads) as usize, ((c + a) * h.n_kv_heads) as usize);
            let qs = &q[q_at * h.head_dim as usize..][..qn * h.head_dim as usize];
            let ks = &run.k[kv_at * h.head_dim as usize..][..kn * h.head_dim as usize];
            let vs = &run.v[kv_at * h.head_dim_v as usize..][..kn * h.head_dim_v as usize];
            let os = &run.o[q_at * h.head_dim_v as usize..][..qn * h.head_dim_v as usize];
            let verdicts = match dtype {
                Dtype::F32 => judge_attention(&p, [qs, ks, vs], os, None),
                _ => judge_half_attention(&p, [qs, ks, vs], os, None, scalar),
            };
            for (name, v) in verdicts {
                match worst.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, w)) if v.ratio() > w.ratio() => *w = v,
                    Some(_) => {}
                    None => worst.push((name, v)),
                }
            }
            q_at += qn;
            kv_at += kn;
        }
        let dtype_label = match dtype {
            Dtype::F32 => String::new(),
            d => format!(" {}", d.name()),
        };
        let rows = match added.iter().all(|&a| a == added[0]) {
            true => format!("n={} cached={}", added[0], cached[0]),
            false => format!("n={added:?} cached={cached:?}"),
        };
        out.push((format!("decode continue {rows}{label}{dtype_label}"), worst));
    }
    Ok(out)
}

/// A decode through an fp8 [`crate::ops::cache::KvCache`] (K's scales per KV head, V's
/// for the whole tensor, from their largest magnitudes), judged on what the cache holds.
fn run_fp8_decode(
    gpu: &Gpu,
    (fp8, layout, dtype): (Fp8, CacheLayout, Dtype),
    h: Heads,
    (batch, cache_len, capacity): (u32, u32, u32),
    mods: &ModData,
    seed: u64,
) -> Result<Labelled, Error> {
    let [q, k, v, _] = qkv(h, batch * capacity, seed);
    let fill = filled(h, capacity, cache_len);
    let scalar = Scalar::from(dtype);
    let q =
        crate::tensor::buffers::rounded(&q[..(batch * h.n_heads * h.head_dim) as usize], scalar);
    let [k, v] = [(&k, h.head_dim), (&v, h.head_dim_v)]
        .map(|(x, width)| crate::tensor::buffers::rounded(&fill(x, width), scalar));
    let k_scales = kv_fp8::amax_scales(&k, h, fp8);
    let v_amax = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let v_scales = [if v_amax > 0.0 {
        v_amax / fp8.max()
    } else {
        1.0
    }];
    let case = kv_fp8::Fp8Case {
        heads: h,
        dtype,
        fp8,
        layout,
        batch,
        len: cache_len,
        prompt: cache_len.saturating_sub(2),
        scales: (&k_scales, &v_scales),
        mods: mods.mods(),
    };
    let run = kv_fp8::decode(gpu, &case, [&q, &k, &v])?;
    let p = Problem {
        positions: layout.capacity() as usize,
        mods: mods.mods(),
        q_pos: cache_len as usize - 1,
        ..problem(h, batch, [1, cache_len], false, None)
    };
    let layout = match layout {
        CacheLayout::Contiguous { .. } => String::new(),
        CacheLayout::Paged { page_size, .. } => format!(" page={page_size}"),
    };
    let half = match dtype {
        Dtype::F32 => String::new(),
        d => format!(" {}", d.name()),
    };
    let kernel = crate::plan::kernels::family_name("attention_decode_split", h.head_dim);
    let v = match h.head_dim_v == h.head_dim {
        true => String::new(),
        false => format!("_v{}", h.head_dim_v),
    };
    let label = format!("{kernel}{v} {} cache{layout}{half}", fp8.name());
    let inputs = [q.as_slice(), &run.k, &run.v];
    let verdicts = match dtype {
        Dtype::F32 => judge_attention(&p, inputs, &run.o, None),
        _ => judge_half_attention(&p, inputs, &run.o, None, scalar),
    };
    Ok((label, verdicts))
}

/// RoPE of rows held in a half `dtype` (the device op, in place) against the f64 rotation
/// of the same values: as accurate as the f32 reference's rotation rounded into the dtype,
/// what a framework rotating in f32 and storing halves gives.
fn run_half_rope(
    gpu: &Gpu,
    dtype: Dtype,
    h: Heads,
    (batch, seq, pos_offset): (u32, u32, u32),
    seed: u64,
) -> Result<Verdict, Error> {
    use crate::ops::rope::{Rope, RopeArgs, RopeSpec};
    use crate::tensor::Tensor;
    let scalar = Scalar::from(dtype);
    let shape = [batch, seq, h.n_heads, h.head_dim];
    let n = shape.iter().map(|v| *v as usize).product();
    let x = crate::tensor::buffers::rounded(&random(n, seed), scalar);
    let spec = RopeSpec {
        dtype,
        ..RopeSpec::new(h.head_dim)
    };
    let mut op = Rope::new(gpu, spec)?;
    let xt = Tensor::from_f32(gpu, &shape, scalar, &x)?;
    let positions = Tensor::from_u32(gpu, &[batch], &vec![pos_offset; batch as usize])?;
    let args = RopeArgs {
        x: &xt,
        positions: &positions,
        base: 10000.0,
    };
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    op.record(gpu, &mut enc, &args)?;
    gpu.queue.submit([enc.finish()]);
    let got = xt.to_f32(gpu).block_on()?;
    let (seq, heads, d) = (seq as usize, h.n_heads as usize, h.head_dim as usize);
    let freqs = rope::inv_freq(10000.0, h.head_dim);
    let exact = rope::inv_freq_exact(10000.0, h.head_dim);
    let r64 = reference::rope(&cast::<f64>(&x), seq, heads, d, pos_offset, &exact, 1.0);
    let r32 = reference::rope(&x, seq, heads, d, pos_offset, &freqs, 1.0);
    Ok(judge(
        &got,
        &r64,
        &crate::tensor::buffers::rounded(&r32, scalar),
    ))
}

/// RoPE against the reference, and backward(forward(x)) against x within 1e-6.
fn run_rope(
    gpu: &Gpu,
    (fwd, bwd): &(Kernel, Kernel),
    h: Heads,
    batch: u32,
    seq: u32,
    pos_offset: u32,
    seed: u64,
) -> Result<Vec<(&'static str, Verdict)>, Error> {
    let x = random((batch * seq * h.n_heads * h.head_dim) as usize, seed);
    let input = RopeInput {
        batch,
        seq_len: seq,
        heads: h.n_heads,
        head_dim: h.head_dim,
        x: &x,
        pos_offset,
        base: 10000.0,
    };
    let rotated = rope::rope(gpu, fwd, &input).block_on()?;
    let back = rope::rope(
        gpu,
        bwd,
        &RopeInput {
            x: &rotated,
            ..input
        },
    )
    .block_on()?;
    let (seq, heads, d) = (seq as usize, h.n_heads as usize, h.head_dim as usize);
    let freqs = rope::inv_freq(10000.0, h.head_dim);
    let exact = rope::inv_freq_exact(10000.0, h.head_dim);
    let r64 = reference::rope(&cast::<f64>(&x), seq, heads, d, pos_offset, &exact, 1.0);
    let r32 = reference::rope(&x, seq, heads, d, pos_offset, &freqs, 1.0);
    let identity = Verdict {
        error: max_abs_error(&back, &cast(&x)),
        bound: 1e-6,
    };
    Ok(vec![
        ("x", judge(&rotated, &r64, &r32)),
        ("identity", identity),
    ])
}
