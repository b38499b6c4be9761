//! The case matrix that `check` and the tests run: each case is a shape and mask set, run
//! on the GPU and judged against the f64 reference by the pass rule, as one or more rows.

use attn_dsl::{FlashConfig, KernelAbi, Masks, Op};
use rand::{Rng, SeedableRng, rngs::StdRng};

use crate::attention::{self, DecodeInput, ForwardInput, Heads};
use crate::backward::{Backward, BackwardInput, Gradients, Schedule};
use crate::compare::{Verdict, judge, judge_attention, judge_backward, max_abs_error};
use crate::error::Error;
use crate::gpu::Gpu;
use crate::kernel::Kernel;
use crate::kernels::{BackwardKernels, ROPE};
use crate::reference::{self, Problem, cast};
use crate::rope::{self, RopeInput};
use crate::tuning;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Causal forward over `seq` rows split into `docs` documents.
    Forward { seq: u32, docs: u32 },
    /// Decode against `cache_len` rows of a cache that holds `capacity` rows.
    Decode { cache_len: u32, capacity: u32 },
    /// Causal backward over `seq` rows in `docs` documents, every schedule.
    Backward { seq: u32, docs: u32 },
    /// RoPE on a Q-shaped tensor, forward and back.
    Rope { seq: u32, pos_offset: u32 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Case {
    pub heads: Heads,
    pub shape: Shape,
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
        format!(
            "{rows} h={} kv={} d={}",
            h.n_heads, h.n_kv_heads, h.head_dim
        )
    }

    pub fn mask_label(&self) -> String {
        match self.shape {
            Shape::Forward { docs: 1, .. } | Shape::Backward { docs: 1, .. } => "causal".into(),
            Shape::Forward { docs, .. } | Shape::Backward { docs, .. } => {
                format!("causal+{docs}docs")
            }
            Shape::Decode { .. } | Shape::Rope { .. } => "none".into(),
        }
    }
}

/// The default matrix: seq 1, 7, 64, 300; GQA ratios 1, 3, 4; head_dim 64 and 128; causal
/// alone and with 3 documents; decode caches of 1, 7 and 300 rows; the backward in every
/// schedule over the same shapes plus one over the check's streaming threshold; RoPE; and
/// the seeds' production layer.
pub fn default_matrix() -> Vec<Case> {
    let head_sets = [(2, 2), (6, 2), (8, 2)];
    let mut cases = Vec::new();
    for head_dim in [64, 128] {
        for (n_heads, n_kv_heads) in head_sets {
            let heads = Heads {
                n_heads,
                n_kv_heads,
                head_dim,
            };
            for seq in [1, 7, 64, 300] {
                for docs in [1, 3].into_iter().filter(|&d| d <= seq) {
                    cases.push(Case {
                        heads,
                        shape: Shape::Forward { seq, docs },
                    });
                }
            }
            for (cache_len, capacity) in [(1, 1), (7, 7), (300, 320)] {
                cases.push(Case {
                    heads,
                    shape: Shape::Decode {
                        cache_len,
                        capacity,
                    },
                });
            }
        }
        for (i, (n_heads, n_kv_heads)) in head_sets.into_iter().enumerate() {
            let heads = Heads {
                n_heads,
                n_kv_heads,
                head_dim,
            };
            for seq in [1, 7, 64, 300] {
                // Documents alternate so both layouts meet every GQA ratio across head_dims.
                let docs = if (i + head_dim as usize / 64).is_multiple_of(2) {
                    1
                } else {
                    3
                }
                .min(seq);
                cases.push(Case {
                    heads,
                    shape: Shape::Backward { seq, docs },
                });
            }
        }
        let heads = Heads {
            n_heads: 4,
            n_kv_heads: 4,
            head_dim,
        };
        cases.push(Case {
            heads,
            shape: Shape::Rope {
                seq: 300,
                pos_offset: 0,
            },
        });
        cases.push(Case {
            heads,
            shape: Shape::Rope {
                seq: 7,
                pos_offset: 4093,
            },
        });
    }
    let over = Heads {
        n_heads: 4,
        n_kv_heads: 1,
        head_dim: 64,
    };
    cases.push(Case {
        heads: over,
        shape: Shape::Backward { seq: 400, docs: 3 },
    });
    let seeds_layer = Heads {
        n_heads: 12,
        n_kv_heads: 4,
        head_dim: 64,
    };
    cases.push(Case {
        heads: seeds_layer,
        shape: Shape::Forward { seq: 512, docs: 2 },
    });
    cases.push(Case {
        heads: seeds_layer,
        shape: Shape::Decode {
            cache_len: 512,
            capacity: 512,
        },
    });
    cases.push(Case {
        heads: seeds_layer,
        shape: Shape::Backward { seq: 128, docs: 2 },
    });
    cases
}

/// Everything a matrix runs, compiled once.
pub struct Runner {
    kernels: Vec<Kernel>,
    /// Every flash forward candidate this device holds, with its configuration.
    flash: Vec<(FlashConfig, Kernel)>,
    rope: Vec<(Kernel, Kernel)>,
    pub backward: Backward,
}

impl Runner {
    pub fn new<'a>(
        gpu: &Gpu,
        attention: impl IntoIterator<Item = &'a KernelAbi>,
        backward: &[BackwardKernels],
    ) -> Result<Runner, Error> {
        let kernels = attention
            .into_iter()
            .filter(|abi| matches!(abi.op, Op::Forward | Op::Decode))
            .map(|abi| Kernel::new(gpu, abi))
            .collect::<Result<_, _>>()?;
        let flash = flash_kernels(gpu)?;
        let rope = ROPE
            .iter()
            .map(|(f, b)| Ok((Kernel::new(gpu, f)?, Kernel::new(gpu, b)?)))
            .collect::<Result<_, Error>>()?;
        Ok(Runner {
            kernels,
            flash,
            rope,
            backward: Backward::new(gpu, backward)?,
        })
    }

    /// The kernel of `op` specialized for `head_dim`.
    fn find(&self, op: Op, head_dim: u32) -> Result<&Kernel, Error> {
        self.kernels
            .iter()
            .find(|k| k.abi().op == op && k.abi().head_dim == head_dim)
            .ok_or_else(|| Error::Binding {
                kernel: format!("{} d{head_dim}", op.name()),
                binding: "(none in the family)".into(),
            })
    }
}

/// The flash forward candidates of every head_dim the family has, under the check's masks
/// (causal and document), that fit the device.
fn flash_kernels(gpu: &Gpu) -> Result<Vec<(FlashConfig, Kernel)>, Error> {
    let masks = Masks {
        causal: true,
        document: true,
    };
    let mut out = Vec::new();
    for head_dim in [64, 128] {
        for &config in tuning::forward_candidates(head_dim) {
            let abi =
                tuning::flash_forward(head_dim, masks, config).map_err(|e| Error::Pipeline {
                    kernel: format!("flash d{head_dim} {}", config.label()),
                    message: e.to_string(),
                })?;
            if tuning::fits(gpu, &abi) {
                out.push((config, Kernel::new(gpu, &abi)?));
            }
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

/// Uniform values in [-2, 2), reproducible from `seed`.
pub fn random(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(-2.0f32..2.0)).collect()
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

pub fn run_case(gpu: &Gpu, runner: &mut Runner, case: &Case, seed: u64) -> Result<Vec<Row>, Error> {
    let h = case.heads;
    let row = |label: &str, verdicts| Row {
        case: *case,
        label: label.to_string(),
        verdicts,
    };
    Ok(match case.shape {
        Shape::Forward { seq, docs } => {
            let kernel = runner.find(Op::Forward, h.head_dim)?;
            let mut rows = vec![row(
                kernel.name(),
                run_forward(gpu, kernel, h, seq, docs, seed)?,
            )];
            let flash = runner
                .flash
                .iter()
                .filter(|(_, k)| k.abi().head_dim == h.head_dim);
            let planned = runner.backward.table.forward(gpu, h.head_dim);
            for (config, kernel) in flash {
                let mut label = format!("forward flash {}", config.label());
                if planned == Some(*config) {
                    label += " (planned)";
                }
                rows.push(row(&label, run_forward(gpu, kernel, h, seq, docs, seed)?));
            }
            rows
        }
        Shape::Decode {
            cache_len,
            capacity,
        } => {
            let kernel = runner.find(Op::Decode, h.head_dim)?;
            vec![row(
                kernel.name(),
                run_decode(gpu, kernel, h, cache_len, capacity, seed)?,
            )]
        }
        Shape::Backward { seq, docs } => run_backward(gpu, runner, case, seq, docs, seed)?,
        Shape::Rope { seq, pos_offset } => {
            let pair = runner
                .rope
                .iter()
                .find(|(f, _)| f.abi().head_dim == h.head_dim);
            let (fwd, bwd) = pair.ok_or_else(|| Error::Binding {
                kernel: format!("rope d{}", h.head_dim),
                binding: "(none in the family)".into(),
            })?;
            vec![row(
                "rope, rope_backward",
                run_rope(gpu, (fwd, bwd), h, seq, pos_offset, seed)?,
            )]
        }
    })
}

fn problem(h: Heads, n_q: u32, n_k: u32, causal: bool, seg: Option<&[u32]>) -> Problem<'_> {
    Problem {
        n_q: n_q as usize,
        n_k: n_k as usize,
        n_heads: h.n_heads as usize,
        n_kv_heads: h.n_kv_heads as usize,
        head_dim: h.head_dim as usize,
        scale: f64::from(h.default_scale()),
        causal,
        seg,
    }
}

/// Random Q, K, V (and dO) for `seq` rows.
fn qkv(h: Heads, seq: u32, seed: u64) -> [Vec<f32>; 4] {
    let q_len = (seq * h.n_heads * h.head_dim) as usize;
    let kv_len = (seq * h.n_kv_heads * h.head_dim) as usize;
    [
        random(q_len, seed),
        random(kv_len, seed + 1),
        random(kv_len, seed + 2),
        random(q_len, seed + 3),
    ]
}

fn run_forward(
    gpu: &Gpu,
    kernel: &Kernel,
    h: Heads,
    seq: u32,
    docs: u32,
    seed: u64,
) -> Result<Vec<(&'static str, Verdict)>, Error> {
    let [q, k, v, _] = qkv(h, seq, seed);
    let seg = documents(seq, docs);
    let input = ForwardInput {
        seq_len: seq,
        heads: h,
        q: &q,
        k: &k,
        v: &v,
        seg: Some(&seg),
        scale: None,
    };
    let out = attention::forward(gpu, kernel, &input)?;
    Ok(judge_attention(
        &problem(h, seq, seq, true, Some(&seg)),
        [&q, &k, &v],
        &out.o,
        Some(&out.lse),
    ))
}

fn run_decode(
    gpu: &Gpu,
    kernel: &Kernel,
    h: Heads,
    cache_len: u32,
    capacity: u32,
    seed: u64,
) -> Result<Vec<(&'static str, Verdict)>, Error> {
    let [q, k, v, _] = qkv(h, capacity, seed);
    let q = q[..(h.n_heads * h.head_dim) as usize].to_vec();
    let input = DecodeInput {
        cache_len,
        heads: h,
        q: &q,
        k_cache: &k,
        v_cache: &v,
        scale: None,
    };
    let o = attention::decode(gpu, kernel, &input)?;
    Ok(judge_attention(
        &problem(h, 1, cache_len, false, None),
        [&q, &k, &v],
        &o,
        None,
    ))
}

/// One row per schedule the device runs, then one that asserts they agree: the largest
/// difference between any schedule and the first, against twice the rule's bound.
fn run_backward(
    gpu: &Gpu,
    runner: &mut Runner,
    case: &Case,
    seq: u32,
    docs: u32,
    seed: u64,
) -> Result<Vec<Row>, Error> {
    let h = case.heads;
    let [q, k, v, d_o] = qkv(h, seq, seed);
    let seg = documents(seq, docs);
    let p = problem(h, seq, seq, true, Some(&seg));
    // O and LSE from the f64 reference, so the backward is judged on its own.
    let fwd = reference::attention::<f64>(&p, &cast(&q), &cast(&k), &cast(&v));
    let (o, lse): (Vec<f32>, Vec<f32>) = (
        fwd.o.iter().map(|x| *x as f32).collect(),
        fwd.lse.iter().map(|x| *x as f32).collect(),
    );
    let input = BackwardInput {
        seq_len: seq,
        heads: h,
        q: &q,
        k: &k,
        v: &v,
        o: &o,
        lse: &lse,
        d_o: &d_o,
        seg: Some(&seg),
        scale: None,
    };
    let planned = runner.backward.plan(gpu, seq, h);
    let mut rows = Vec::new();
    let mut results: Vec<(Schedule, Gradients)> = Vec::new();
    for schedule in runner.backward.schedules(gpu, h.head_dim) {
        let (g, _) = runner.backward.run(gpu, &input, Some(schedule))?;
        let verdicts = judge_backward(&p, [&q, &k, &v, &d_o], (&o, &lse), [&g.dq, &g.dk, &g.dv]);
        let mut label = format!("backward {schedule}");
        label += &tuning::schedule_detail(schedule, h.head_dim);
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
    // Each schedule is within `bound` of the reference, so two may differ by up to twice it
    // (atomic scatter adds in a different order on every run).
    let bounds: Vec<f64> = rows[0]
        .verdicts
        .iter()
        .map(|(_, v)| 2.0 * v.bound)
        .collect();
    let (_, base) = &results[0];
    let agree = ["dq", "dk", "dv"].into_iter().enumerate().map(|(i, name)| {
        let pick = |g: &Gradients| [&g.dq, &g.dk, &g.dv][i].clone();
        let error = results[1..]
            .iter()
            .map(|(_, g)| max_abs_error(&pick(g), &cast(&pick(base))))
            .fold(0.0, f64::max);
        (
            name,
            Verdict {
                error,
                bound: bounds[i],
            },
        )
    });
    rows.push(Row {
        case: *case,
        label: "backward schedules agree".into(),
        verdicts: agree.collect(),
    });
    Ok(rows)
}

/// RoPE against the reference, and backward(forward(x)) against x within 1e-6.
fn run_rope(
    gpu: &Gpu,
    (fwd, bwd): (&Kernel, &Kernel),
    h: Heads,
    seq: u32,
    pos_offset: u32,
    seed: u64,
) -> Result<Vec<(&'static str, Verdict)>, Error> {
    let x = random((seq * h.n_heads * h.head_dim) as usize, seed);
    let input = RopeInput {
        seq_len: seq,
        heads: h.n_heads,
        head_dim: h.head_dim,
        x: &x,
        pos_offset,
        base: 10000.0,
    };
    let rotated = rope::rope(gpu, fwd, &input)?;
    let back = rope::rope(
        gpu,
        bwd,
        &RopeInput {
            x: &rotated,
            ..input
        },
    )?;
    let (heads, d) = (h.n_heads as usize, h.head_dim as usize);
    let freqs = rope::inv_freq(10000.0, h.head_dim);
    let exact = rope::inv_freq_exact(10000.0, h.head_dim);
    let r64 = reference::rope(&cast::<f64>(&x), heads, d, pos_offset, &exact, 1.0);
    let r32 = reference::rope(&x, heads, d, pos_offset, &freqs, 1.0);
    let identity = Verdict {
        error: max_abs_error(&back, &cast(&x)),
        bound: 1e-6,
    };
    Ok(vec![
        ("x", judge(&rotated, &r64, &r32)),
        ("identity", identity),
    ])
}
