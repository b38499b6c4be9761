//! The backward in every schedule, on this machine's adapter, against the f64 reference,
//! against each other, and the reference itself against finite differences.

use runtime::harness::cases::documents;
use runtime::ops::backward::BackwardSpec;
use runtime::ops::backward::DEFAULT_SCRATCH_BUDGET;
use runtime::plan::tuning::backward_candidates;
use runtime::verify::compare::{judge_backward, max_abs_error};
use runtime::verify::random;
use runtime::verify::reference::{self, Problem, cast};
use runtime::{Backward, BackwardInput, ForwardInput, Gpu, Heads, Kernel, Schedule, kernels};
use runtime::{BlockOn, Dtype};

fn gpu() -> Gpu {
    Gpu::new(kernels::FAMILY.iter().copied())
        .block_on()
        .unwrap_or_else(|e| panic!("{e}"))
}

struct Data {
    heads: Heads,
    seq: u32,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_o: Vec<f32>,
    seg: Vec<u32>,
    o: Vec<f32>,
    lse: Vec<f32>,
}

impl Data {
    /// Random inputs and the GPU forward's O and LSE.
    fn new(gpu: &Gpu, heads: Heads, seq: u32, docs: u32, seed: u64) -> Data {
        let (s, nh, nkv, d) = (
            seq as usize,
            heads.n_heads as usize,
            heads.n_kv_heads as usize,
            heads.head_dim as usize,
        );
        let (q, k, v) = (
            random(s * nh * d, seed),
            random(s * nkv * d, seed + 1),
            random(s * nkv * d, seed + 2),
        );
        let d_o = random(s * nh * d, seed + 3);
        let seg = documents(seq, docs);
        let abi = if d == 64 {
            &kernels::attention_forward::ABI
        } else {
            &kernels::attention_forward_d128::ABI
        };
        let fwd = Kernel::new(gpu, abi).block_on().unwrap();
        let input = ForwardInput {
            batch: 1,
            seq_len: seq,
            heads,
            q: &q,
            k: &k,
            v: &v,
            seg: Some(&seg),
            scale: None,
            mods: Default::default(),
        };
        let out = runtime::forward(gpu, &fwd, &input).block_on().unwrap();
        Data {
            heads,
            seq,
            q,
            k,
            v,
            d_o,
            seg,
            o: out.o,
            lse: out.lse,
        }
    }

    fn input(&self) -> BackwardInput<'_> {
        BackwardInput {
            batch: 1,
            seq_len: self.seq,
            heads: self.heads,
            q: &self.q,
            k: &self.k,
            v: &self.v,
            o: &self.o,
            lse: &self.lse,
            d_o: &self.d_o,
            seg: Some(&self.seg),
            scale: None,
            mods: Default::default(),
        }
    }

    fn problem(&self) -> Problem<'_> {
        Problem {
            batch: 1,
            n_q: self.seq as usize,
            n_k: self.seq as usize,
            n_heads: self.heads.n_heads as usize,
            n_kv_heads: self.heads.n_kv_heads as usize,
            head_dim: self.heads.head_dim as usize,
            scale: f64::from(self.heads.default_scale()),
            causal: true,
            seg: Some(&self.seg),
            ..Default::default()
        }
    }
}

#[test]
fn every_schedule_matches_the_reference_and_the_others() {
    let gpu = gpu();
    let mut backward = Backward::from_kernels(&gpu, &kernels::BACKWARD).unwrap();
    let shapes = [
        (
            Heads {
                n_heads: 6,
                n_kv_heads: 2,
                head_dim: 64,
                head_dim_v: 64,
            },
            45,
            3,
        ),
        (
            Heads {
                n_heads: 4,
                n_kv_heads: 1,
                head_dim: 128,
                head_dim_v: 128,
            },
            9,
            1,
        ),
    ];
    for (heads, seq, docs) in shapes {
        let data = Data::new(&gpu, heads, seq, docs, 11);
        let mut results = Vec::new();
        for schedule in backward.schedules((heads.head_dim, heads.head_dim), Dtype::F32) {
            let (g, ran) = backward
                .run(&gpu, &data.input(), Some(schedule), Dtype::F32)
                .block_on()
                .unwrap();
            assert_eq!(ran, schedule);
            let verdicts = judge_backward(
                &data.problem(),
                [&data.q, &data.k, &data.v, &data.d_o],
                (&data.o, &data.lse),
                [&g.dq, &g.dk, &g.dv],
                [&g.dbias, &g.dsinks],
                &g.dflex,
            );
            assert!(
                verdicts.iter().all(|(_, v)| v.pass()),
                "{schedule} seq={seq}: {verdicts:?}"
            );
            results.push((schedule, g));
        }
        let (first, base) = &results[0];
        for (schedule, g) in &results[1..] {
            for (name, a, b) in [
                ("dq", &g.dq, &base.dq),
                ("dk", &g.dk, &base.dk),
                ("dv", &g.dv, &base.dv),
            ] {
                let diff = max_abs_error(a, &cast::<f64>(b));
                assert!(
                    diff < 1e-5,
                    "{schedule} and {first} differ on {name} by {diff}"
                );
            }
        }
    }
}

#[test]
fn gradients_accumulate_across_micro_steps() {
    let gpu = gpu();
    let mut backward = Backward::from_kernels(&gpu, &kernels::BACKWARD).unwrap();
    let data = Data::new(
        &gpu,
        Heads {
            n_heads: 2,
            n_kv_heads: 2,
            head_dim: 64,
            head_dim_v: 64,
        },
        12,
        1,
        3,
    );
    for schedule in backward.schedules((64, 64), Dtype::F32) {
        let (once, _) = backward
            .run(&gpu, &data.input(), Some(schedule), Dtype::F32)
            .block_on()
            .unwrap();
        let (twice, _) = backward
            .accumulate(
                &gpu,
                &data.input(),
                Some(schedule),
                once.clone(),
                Dtype::F32,
            )
            .block_on()
            .unwrap();
        for (a, b) in [
            (&twice.dq, &once.dq),
            (&twice.dk, &once.dk),
            (&twice.dv, &once.dv),
        ] {
            let doubled: Vec<f64> = b.iter().map(|x| 2.0 * f64::from(*x)).collect();
            assert!(
                max_abs_error(a, &doubled) < 1e-5,
                "{schedule}: += does not add up"
            );
        }
    }
}

#[test]
fn scratch_is_reused_and_grown_only_when_needed() {
    let gpu = gpu();
    let mut backward = Backward::from_kernels(&gpu, &kernels::BACKWARD).unwrap();
    let heads = Heads {
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 64,
        head_dim_v: 64,
    };
    let big = Data::new(&gpu, heads, 20, 1, 5);
    let small = Data::new(&gpu, heads, 10, 2, 6);
    backward
        .run(&gpu, &big.input(), Some(Schedule::Split), Dtype::F32)
        .block_on()
        .unwrap();
    let held = backward.scratch_held();
    assert_eq!(held, Schedule::Split.scratch_bytes(1, 20, 2));
    backward
        .run(&gpu, &small.input(), Some(Schedule::Split), Dtype::F32)
        .block_on()
        .unwrap();
    assert_eq!(
        backward.scratch_held(),
        held,
        "a smaller call reuses the scratch"
    );
    backward
        .run(
            &gpu,
            &small.input(),
            Some(Schedule::RecomputeSplit),
            Dtype::F32,
        )
        .block_on()
        .unwrap();
    assert_eq!(backward.scratch_held(), held);
}

#[test]
fn planner_follows_the_table_and_falls_back_to_the_portable_tiled_schedule() {
    let gpu = gpu();
    let mut backward = Backward::from_kernels(&gpu, &kernels::BACKWARD).unwrap();
    let heads = |n_heads, head_dim| Heads {
        n_heads,
        n_kv_heads: n_heads,
        head_dim,
        head_dim_v: head_dim,
    };
    backward.table = Default::default();
    assert_eq!(
        backward.plan(&gpu, 1, 512, heads(12, 64), Dtype::F32),
        Schedule::Tiled(backward_candidates(64)[0]),
        "without a table: the portable tiled configuration"
    );
    assert!(
        backward
            .schedules((64, 64), Dtype::F32)
            .contains(&Schedule::Tiled(backward_candidates(64)[1])),
        "lavapipe holds the 28 KiB candidate"
    );
    backward.table.backward.insert(64, "split".into());
    assert_eq!(
        backward.plan(&gpu, 1, 512, heads(12, 64), Dtype::F32),
        Schedule::Split
    );
    assert_eq!(Schedule::Split.scratch_bytes(1, 512, 12), 25_165_824);
    assert_eq!(
        backward.plan(&gpu, 1, 8192, heads(16, 64), Dtype::F32),
        Schedule::Tiled(backward_candidates(64)[0]),
        "split is never planned past the scratch budget"
    );
    backward.scratch_budget = 1 << 20;
    assert_eq!(
        backward.plan(&gpu, 1, 300, heads(2, 64), Dtype::F32),
        Schedule::Tiled(backward_candidates(64)[0])
    );
    backward.scratch_budget = DEFAULT_SCRATCH_BUDGET;
    assert_eq!(
        backward.plan(&gpu, 1, 300, heads(2, 64), Dtype::F32),
        Schedule::Split
    );
    backward
        .table
        .backward
        .insert(64, "tiled-128x32/8@256".into());
    assert_eq!(
        backward.plan(&gpu, 1, 300, heads(2, 64), Dtype::F32),
        Schedule::Tiled(backward_candidates(64)[0]),
        "a table entry this device cannot run is ignored"
    );
    let streaming = *backward
        .schedules((64, 64), Dtype::F32)
        .iter()
        .find(|s| matches!(s, Schedule::Streaming(_)))
        .expect("lavapipe runs a streaming schedule at head_dim 64");
    backward.table.backward.insert(64, streaming.to_string());
    assert_eq!(
        backward.plan(&gpu, 1, 300, heads(2, 64), Dtype::F32),
        streaming
    );
    assert!(
        !backward
            .schedules((128, 128), Dtype::F32)
            .contains(&Schedule::Streaming(backward_candidates(128)[0])),
        "no streaming on tiles of 8 rows"
    );
}

/// `deterministic` plans only schedules that own every output, repeats them bit for bit,
/// and refuses one that adds by atomics with what to do instead.
#[test]
fn deterministic_backward_owns_its_outputs_and_repeats_bit_for_bit() {
    let gpu = gpu();
    let mut backward = Backward::from_kernels(&gpu, &kernels::BACKWARD).unwrap();
    let heads = Heads {
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 64,
        head_dim_v: 64,
    };
    let data = Data::new(&gpu, heads, 37, 1, 21);
    let streaming = *backward
        .schedules((64, 64), Dtype::F32)
        .iter()
        .find(|s| matches!(s, Schedule::Streaming(_)))
        .expect("lavapipe runs a streaming schedule at head_dim 64");
    backward.table.backward.insert(64, streaming.to_string());
    assert_eq!(backward.plan(&gpu, 1, 37, heads, Dtype::F32), streaming);

    backward.deterministic = true;
    let plan = backward.plan(&gpu, 1, 37, heads, Dtype::F32);
    assert_eq!(plan, Schedule::Tiled(backward_candidates(64)[0]));
    let atomic = |s: &Schedule| {
        matches!(
            s,
            Schedule::Streaming(_) | Schedule::Flash(_) | Schedule::Scattered(_)
        )
    };
    let listed = backward.schedules((64, 64), Dtype::F32);
    assert!(listed.contains(&plan) && listed.contains(&Schedule::RecomputeSplit));
    assert!(!listed.iter().any(atomic), "{listed:?}");
    let bits = |g: &runtime::Gradients| {
        [&g.dq, &g.dk, &g.dv].map(|x| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
    };
    let (first, ran) = backward
        .run(&gpu, &data.input(), None, Dtype::F32)
        .block_on()
        .unwrap();
    let (again, _) = backward
        .run(&gpu, &data.input(), None, Dtype::F32)
        .block_on()
        .unwrap();
    assert_eq!(ran, plan);
    assert!(bits(&first) == bits(&again), "two runs differ");

    let refused = backward
        .run(&gpu, &data.input(), Some(streaming), Dtype::F32)
        .block_on()
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("is not deterministic")
            && refused.contains("by atomics; leave the schedule to the planner"),
        "{refused}"
    );
    backward.deterministic = false;
    assert_eq!(backward.plan(&gpu, 1, 37, heads, Dtype::F32), streaming);
}

/// The f64 reference backward agrees with central differences of L = Σ dO ∘ O, and the
/// GPU agrees with the reference, on a shape small enough to difference every input.
#[test]
fn reference_matches_finite_differences_and_gpu_matches_reference() {
    let gpu = gpu();
    let heads = Heads {
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 64,
        head_dim_v: 64,
    };
    let data = Data::new(&gpu, heads, 4, 2, 9);
    let p = data.problem();
    let [q, k, v, d_o] = [&data.q, &data.k, &data.v, &data.d_o].map(|x| cast::<f64>(x));
    let analytic = reference::attention_backward(&p, [&q, &k, &v, &d_o], None);
    let loss = |q: &[f64], k: &[f64], v: &[f64]| -> f64 {
        reference::attention(&p, q, k, v)
            .o
            .iter()
            .zip(&d_o)
            .map(|(o, g)| o * g)
            .sum()
    };
    let h = 1e-5;
    let mut worst = 0.0f64;
    for which in 0..3 {
        let grad = [&analytic.dq, &analytic.dk, &analytic.dv][which];
        for i in 0..grad.len() {
            let mut inputs = [q.clone(), k.clone(), v.clone()];
            inputs[which][i] += h;
            let up = loss(&inputs[0], &inputs[1], &inputs[2]);
            inputs[which][i] -= 2.0 * h;
            let down = loss(&inputs[0], &inputs[1], &inputs[2]);
            worst = worst.max(((up - down) / (2.0 * h) - grad[i]).abs());
        }
    }
    assert!(
        worst < 1e-8,
        "reference backward is off finite differences by {worst}"
    );
    let mut backward = Backward::from_kernels(&gpu, &kernels::BACKWARD).unwrap();
    let (g, _) = backward
        .run(&gpu, &data.input(), None, Dtype::F32)
        .block_on()
        .unwrap();
    let verdicts = judge_backward(
        &p,
        [&data.q, &data.k, &data.v, &data.d_o],
        (&data.o, &data.lse),
        [&g.dq, &g.dk, &g.dv],
        [&g.dbias, &g.dsinks],
        &g.dflex,
    );
    assert!(verdicts.iter().all(|(_, v)| v.pass()), "{verdicts:?}");
}

#[test]
fn rope_backward_undoes_rope_and_both_match_the_reference() {
    let gpu = gpu();
    for (fwd_abi, bwd_abi) in kernels::ROPE {
        let (fwd, bwd) = (
            Kernel::new(&gpu, fwd_abi).block_on().unwrap(),
            Kernel::new(&gpu, bwd_abi).block_on().unwrap(),
        );
        let (seq, heads, d) = (37u32, 3u32, fwd_abi.head_dim);
        let x = random((seq * heads * d) as usize, 21);
        let input = runtime::RopeInput {
            batch: 1,
            seq_len: seq,
            heads,
            head_dim: d,
            x: &x,
            pos_offset: 5,
            base: 10000.0,
        };
        let rotated = runtime::rope(&gpu, &fwd, &input).block_on().unwrap();
        let back = runtime::rope(
            &gpu,
            &bwd,
            &runtime::RopeInput {
                x: &rotated,
                ..input
            },
        )
        .block_on()
        .unwrap();
        let identity = max_abs_error(&back, &cast::<f64>(&x));
        assert!(
            identity <= 1e-6,
            "d{d}: backward(forward(x)) is off x by {identity}"
        );
        // The reference takes the exact frequencies in f64; the f32 baseline the rounded table.
        let exact = runtime::ops::rope::inv_freq_exact(10000.0, d);
        let r64 = reference::rope(
            &cast::<f64>(&x),
            seq as usize,
            heads as usize,
            d as usize,
            5,
            &exact,
            1.0,
        );
        let r32 = reference::rope(
            &x,
            seq as usize,
            heads as usize,
            d as usize,
            5,
            &runtime::ops::rope::inv_freq(10000.0, d),
            1.0,
        );
        let verdict = runtime::verify::compare::judge(&rotated, &r64, &r32);
        assert!(verdict.pass(), "d{d}: {verdict:?}");
    }
}

/// The run-time path (`BackwardKernels::compile`, used by the parity tool) and the macro
/// path (the family's descriptions) emit the same kernels.
#[test]
fn run_time_compiled_backward_matches_the_family() {
    let masks = attn_dsl::Masks::new(true, true);
    for family in &kernels::BACKWARD {
        let compiled = runtime::kernels::BackwardKernels::compile(
            (family.split_q.head_dim, family.split_q.head_dim),
            masks,
        )
        .unwrap();
        let pairs = [
            (&family.split_q, &compiled.split_q),
            (&family.split_kv, &compiled.split_kv),
            (&family.recompute_q, &compiled.recompute_q),
            (&family.recompute_kv, &compiled.recompute_kv),
        ];
        for (a, b) in pairs {
            // Names differ (the family's d128 kernels carry a suffix); nothing else may.
            assert_eq!(
                a.wgsl,
                b.wgsl.replace(b.name.as_ref(), &a.name),
                "{} differs",
                a.name
            );
            assert_eq!(a.bindings, b.bindings, "{} differs", a.name);
        }
    }
}

/// A long causal sequence over a GQA group of 4: every key's dK and dV sum 4 × 512 terms.
/// Accumulated one query row at a time (as the tiled, flash and streaming schedules did),
/// dK and dV were 2-3x over the pass rule's bound here; summed in blocks, last rows first,
/// and flushed with their rounding carried (or scattered with compensated atomics), every
/// schedule stays within it.
#[test]
fn long_rows_keep_blocked_accuracy_in_every_schedule() {
    let gpu = gpu();
    let mut backward = Backward::from_kernels(&gpu, &kernels::BACKWARD).unwrap();
    let heads = Heads {
        n_heads: 8,
        n_kv_heads: 2,
        head_dim: 64,
        head_dim_v: 64,
    };
    let data = Data::new(&gpu, heads, 512, 1, 21);
    let mut ran = Vec::new();
    let first = backward_candidates(64)[0];
    for schedule in backward.schedules((64, 64), Dtype::F32) {
        if matches!(schedule, Schedule::Tiled(c) | Schedule::Streaming(c) | Schedule::Flash(c) if c != first)
        {
            continue; // configuration 0 of each shares its accumulation with the others
        }
        let (g, _) = backward
            .run(&gpu, &data.input(), Some(schedule), Dtype::F32)
            .block_on()
            .unwrap();
        let verdicts = judge_backward(
            &data.problem(),
            [&data.q, &data.k, &data.v, &data.d_o],
            (&data.o, &data.lse),
            [&g.dq, &g.dk, &g.dv],
            [&g.dbias, &g.dsinks],
            &g.dflex,
        );
        for (name, v) in &verdicts {
            assert!(
                v.ratio() < 0.9,
                "{schedule} {name}: error {:e} against bound {:e}",
                v.error,
                v.bound
            );
        }
        ran.push(schedule);
    }
    for wanted in [
        Schedule::Tiled(first),
        Schedule::Streaming(first),
        Schedule::Flash(first),
    ] {
        assert!(ran.contains(&wanted), "{wanted} did not run");
    }
}

/// The half-precision backward needs its spec added first (else a message that says so),
/// plans one of its own schedules, and adding an f32 spec keeps every f32 schedule.
#[test]
fn half_precision_sets_sit_beside_the_f32_ones() {
    use attn_dsl::{Dtype, Masks};
    let gpu = gpu();
    let mut backward = Backward::from_kernels(&gpu, &kernels::BACKWARD).unwrap();
    let heads = Heads {
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 64,
        head_dim_v: 64,
    };
    let data = Data::new(&gpu, heads, 20, 2, 5);
    let missing = backward
        .run(&gpu, &data.input(), None, Dtype::Bf16)
        .block_on()
        .expect_err("no bf16 set yet")
        .to_string();
    assert!(missing.contains("Backward::add"), "{missing}");
    let f32_schedules = backward.schedules((64, 64), Dtype::F32);
    backward
        .add(
            &gpu,
            BackwardSpec::new(64, Masks::new(true, true), Dtype::Bf16),
        )
        .unwrap();
    let half = backward.schedules((64, 64), Dtype::Bf16);
    assert!(!half.is_empty());
    assert_eq!(backward.schedules((64, 64), Dtype::F32), f32_schedules);
    let (grads, ran) = backward
        .run(&gpu, &data.input(), None, Dtype::Bf16)
        .block_on()
        .unwrap();
    assert_eq!(ran, half[0]);
    assert!(grads.dq.iter().chain(&grads.dk).all(|x| x.is_finite()));
    backward
        .add(
            &gpu,
            BackwardSpec::new(64, Masks::new(true, true), Dtype::F32),
        )
        .unwrap();
    assert_eq!(backward.schedules((64, 64), Dtype::F32), f32_schedules);
}
