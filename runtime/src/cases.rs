//! The case matrix that `check` and the tests run: each case is a shape and mask set,
//! run on the GPU and judged against the f64 reference by the pass rule.

use std::time::{Duration, Instant};

use attn_dsl::{KernelAbi, Op};
use rand::{Rng, SeedableRng, rngs::StdRng};

use crate::attention::{self, DecodeInput, ForwardInput, Heads};
use crate::compare::{Verdict, judge_attention};
use crate::error::Error;
use crate::gpu::Gpu;
use crate::kernel::Kernel;
use crate::reference::Problem;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Causal forward over `seq` rows split into `docs` documents.
    Forward { seq: u32, docs: u32 },
    /// Decode against `cache_len` rows of a cache that holds `capacity` rows.
    Decode { cache_len: u32, capacity: u32 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Case {
    pub heads: Heads,
    pub shape: Shape,
}

impl Case {
    pub fn op(&self) -> Op {
        match self.shape {
            Shape::Forward { .. } => Op::Forward,
            Shape::Decode { .. } => Op::Decode,
        }
    }

    pub fn shape_label(&self) -> String {
        let h = self.heads;
        let rows = match self.shape {
            Shape::Forward { seq, .. } => format!("seq={seq}"),
            Shape::Decode {
                cache_len,
                capacity,
            } => format!("cache={cache_len}/{capacity}"),
        };
        format!(
            "{rows} h={} kv={} d={}",
            h.n_heads, h.n_kv_heads, h.head_dim
        )
    }

    pub fn mask_label(&self) -> String {
        match self.shape {
            Shape::Forward { docs: 1, .. } => "causal".into(),
            Shape::Forward { docs, .. } => format!("causal+{docs}docs"),
            Shape::Decode { .. } => "none".into(),
        }
    }
}

/// The default matrix: seq 1, 7, 64, 300; GQA ratios 1, 3, 4; head_dim 64 and 128; causal
/// alone and with 3 documents; decode caches of 1, 7 and 300 rows; the seeds' layer.
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
    }
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
    cases
}

/// The kernels a matrix runs, compiled once.
pub struct Family {
    kernels: Vec<Kernel>,
}

impl Family {
    pub fn new<'a>(
        gpu: &Gpu,
        abis: impl IntoIterator<Item = &'a KernelAbi>,
    ) -> Result<Family, Error> {
        let kernels = abis
            .into_iter()
            .map(|abi| Kernel::new(gpu, abi))
            .collect::<Result<_, _>>()?;
        Ok(Family { kernels })
    }

    /// The kernel of `op` specialized for `head_dim`.
    pub fn find(&self, op: Op, head_dim: u32) -> Option<&Kernel> {
        self.kernels
            .iter()
            .find(|k| k.abi().op == op && k.abi().head_dim == head_dim)
    }
}

pub struct CaseResult {
    pub case: Case,
    pub kernel: String,
    /// (output name, verdict) for each output.
    pub verdicts: Vec<(&'static str, Verdict)>,
    pub gpu_time: Duration,
}

impl CaseResult {
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

pub fn run_case(gpu: &Gpu, family: &Family, case: &Case, seed: u64) -> Result<CaseResult, Error> {
    let h = case.heads;
    let kernel = family
        .find(case.op(), h.head_dim)
        .ok_or_else(|| Error::Binding {
            kernel: format!("{} d{}", case.op().name(), h.head_dim),
            binding: "(no kernel of this op and head_dim in the family)".into(),
        })?;
    let started = Instant::now();
    let verdicts = match case.shape {
        Shape::Forward { seq, docs } => run_forward(gpu, kernel, h, seq, docs, seed)?,
        Shape::Decode {
            cache_len,
            capacity,
        } => run_decode(gpu, kernel, h, cache_len, capacity, seed)?,
    };
    Ok(CaseResult {
        case: *case,
        kernel: kernel.name().to_string(),
        verdicts,
        gpu_time: started.elapsed(),
    })
}

fn run_forward(
    gpu: &Gpu,
    kernel: &Kernel,
    h: Heads,
    seq: u32,
    docs: u32,
    seed: u64,
) -> Result<Vec<(&'static str, Verdict)>, Error> {
    let (s, nh, nkv, d) = (
        seq as usize,
        h.n_heads as usize,
        h.n_kv_heads as usize,
        h.head_dim as usize,
    );
    let q = random(s * nh * d, seed);
    let k = random(s * nkv * d, seed + 1);
    let v = random(s * nkv * d, seed + 2);
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
    let problem = Problem {
        n_q: s,
        n_k: s,
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: d,
        scale: f64::from(h.default_scale()),
        causal: true,
        seg: Some(&seg),
    };
    Ok(judge_attention(
        &problem,
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
    let (nh, nkv, d) = (
        h.n_heads as usize,
        h.n_kv_heads as usize,
        h.head_dim as usize,
    );
    let q = random(nh * d, seed);
    let k = random(capacity as usize * nkv * d, seed + 1);
    let v = random(capacity as usize * nkv * d, seed + 2);
    let input = DecodeInput {
        cache_len,
        heads: h,
        q: &q,
        k_cache: &k,
        v_cache: &v,
        scale: None,
    };
    let o = attention::decode(gpu, kernel, &input)?;
    let problem = Problem {
        n_q: 1,
        n_k: cache_len as usize,
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: d,
        scale: f64::from(h.default_scale()),
        causal: false,
        seg: None,
    };
    Ok(judge_attention(&problem, [&q, &k, &v], &o, None))
}
