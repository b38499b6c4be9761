//! A modifier tensor read past a dimension gives 0, in the kernels as on the host: a
//! local bias table `tbl: [heads, 8]` read at `tbl[h][q - k]` biases the 8 nearest keys
//! and leaves the rest alone (no read of the next head's row, or of what lies past the
//! table), and the forward equals attention with that bias computed here. With the
//! runtime's debug switch the kernels report the first such read.

use attn_dsl::flex::library::{build, tensor};
use attn_dsl::flex::{BinOp, Dim, Flex, Ty};
use attn_dsl::{Dtype, Masks, Scalar};
use runtime::ops::forward::{Forward, ForwardArgs, ForwardSpec};
use runtime::{BlockOn, DeviceModifiers, FlexOf, Gpu, Tensor};

const HEADS: u32 = 2;
const SEQ: u32 = 24;
const D: u32 = 64;
const REACH: u32 = 8;

fn local_bias(reach: u32) -> Flex {
    use build::*;
    let distance = bin(BinOp::Sub, v("q"), v("k"));
    Flex {
        score_mod: Some(bin(
            BinOp::Add,
            v("score"),
            idx("tbl", vec![v("h"), distance]),
        )),
        mask_mod: None,
        tensors: vec![tensor("tbl", &[Dim::Heads, Dim::Const(reach)], Ty::F32)],
        ..Flex::default()
    }
}

/// Causal attention of head h with bias `tbl[h][q - k]` where `q - k` < REACH, else none.
fn host(q: &[f32], k: &[f32], v: &[f32], (tbl, reach): (&[f32], u32)) -> Vec<f32> {
    let d = D as usize;
    let mut o = vec![0.0; q.len()];
    for s in 0..SEQ as usize {
        for h in 0..HEADS as usize {
            let row = |x: &[f32], j: usize| x[(j * HEADS as usize + h) * d..][..d].to_vec();
            let qs = row(q, s);
            let scores: Vec<f64> = (0..=s)
                .map(|j| {
                    let dot: f64 = qs
                        .iter()
                        .zip(row(k, j))
                        .map(|(a, b)| f64::from(a * b))
                        .sum();
                    let bias = match s - j < reach as usize {
                        true => f64::from(tbl[h * reach as usize + s - j]),
                        false => 0.0,
                    };
                    dot / (D as f64).sqrt() + bias
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::MIN, f64::max);
            let p: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
            let l: f64 = p.iter().sum();
            for c in 0..d {
                let acc: f64 = (0..=s).map(|j| p[j] * f64::from(row(v, j)[c])).sum();
                o[(s * HEADS as usize + h) * d + c] = (acc / l) as f32;
            }
        }
    }
    o
}

#[test]
fn a_read_past_a_dimension_gives_zero() {
    let gpu = Gpu::new([]).block_on().unwrap_or_else(|e| panic!("{e}"));
    forward_matches_the_host(&gpu, REACH);
    // Without the switch nothing is reported.
    gpu.modifier_reads().block_on().unwrap();
}

/// With `Gpu::report_modifier_reads` the same forward (the same output) reports its first
/// read past the table as an error naming the kernel, the tensor and the indices, once;
/// a table as long as the sequence is never read past, and reports nothing.
#[test]
fn the_debug_switch_reports_the_first_read_out_of_range() {
    let gpu = Gpu::new([])
        .block_on()
        .unwrap_or_else(|e| panic!("{e}"))
        .report_modifier_reads();
    gpu.modifier_reads().block_on().unwrap();
    forward_matches_the_host(&gpu, REACH);
    let err = gpu.modifier_reads().block_on().unwrap_err();
    let runtime::Error::Input(runtime::InputError::ModifierRead(read)) = &err else {
        panic!("{err}");
    };
    assert_eq!(read.tensor, "tbl", "{err}");
    assert!(read.kernel.contains("forward"), "{err}");
    assert_eq!(read.index.len(), 2, "{err}");
    let [h, at] = [read.index[0], read.index[1]];
    assert!(
        (0..HEADS as i32).contains(&h) && at >= REACH as i32,
        "{err}"
    );
    assert!(
        err.to_string().contains("outside its declared shape"),
        "{err}"
    );
    // Reported once: the report is cleared.
    gpu.modifier_reads().block_on().unwrap();
    forward_matches_the_host(&gpu, SEQ);
    gpu.modifier_reads().block_on().unwrap();
}

/// The forward with `tbl: [heads, reach]` against the host's attention with that bias.
fn forward_matches_the_host(gpu: &Gpu, reach: u32) {
    let shape = [1, SEQ, HEADS, D];
    let data = |n: usize, seed| runtime::verify::random(n, seed);
    let n = (SEQ * HEADS * D) as usize;
    let (q, k, v) = (data(n, 1), data(n, 2), data(n, 3));
    // Large values: a read of the wrong element would move the output far past the bound.
    let tbl: Vec<f32> = data((HEADS * reach) as usize, 4)
        .iter()
        .map(|x| 4.0 * x)
        .collect();
    let t = |x: &[f32], s: &[u32]| Tensor::from_f32(gpu, s, Scalar::F32, x).unwrap();
    let (qt, kt, vt) = (t(&q, &shape), t(&k, &shape), t(&v, &shape));
    let table = t(&tbl, &[HEADS, reach]);
    let o = Tensor::zeros(gpu, &shape, Scalar::F32).unwrap();
    let lse = Tensor::zeros(gpu, &[1, SEQ, HEADS], Scalar::F32).unwrap();
    let flex = local_bias(reach).intern();
    let masks = Masks {
        flex: Some(flex),
        ..Masks::new(true, false)
    };
    let mut forward = Forward::new(gpu, ForwardSpec::new(D, masks, Dtype::F32)).unwrap();
    let tensors = [("tbl", &table)];
    let args = ForwardArgs {
        mods: DeviceModifiers {
            flex: Some(FlexOf {
                modifiers: flex,
                tensors: &tensors,
                block_mask: None,
            }),
            ..DeviceModifiers::default()
        },
        ..ForwardArgs::new(&qt, &kt, &vt, &o, &lse)
    };
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    forward.record(gpu, &mut encoder, &args).unwrap();
    gpu.queue.submit([encoder.finish()]);
    let got = o.to_f32(gpu).block_on().unwrap();
    let want = host(&q, &k, &v, (&tbl, reach));
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(
        worst < 1e-4,
        "the forward differs from the host's by {worst}"
    );
}
