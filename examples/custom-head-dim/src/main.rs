//! Runs the example model's forward on random data and prints its error against the f64
//! CPU reference.

use custom_head_dim::{HEADS, Model};
use runtime::verify::compare::judge_attention;
use runtime::verify::random;
use runtime::verify::reference::Problem;

fn main() -> anyhow::Result<()> {
    let model = Model::new()?;
    let seq = 33u32;
    let (nh, nkv, d) = (8, 2, 128);
    let q = random(seq as usize * nh * d, 1);
    let k = random(seq as usize * nkv * d, 2);
    let v = random(seq as usize * nkv * d, 3);
    let out = model.forward(seq, &q, &k, &v)?;
    let p = Problem {
        batch: 1,
        n_q: seq as usize,
        n_k: seq as usize,
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: d,
        scale: f64::from(HEADS.default_scale()),
        causal: true,
        seg: None,
        ..Problem::default()
    };
    let verdicts = judge_attention(&p, [&q, &k, &v], &out.o, Some(&out.lse));
    println!("{}: forward seq={seq} h=8 kv=2 d=128", model.gpu.describe());
    for (name, v) in &verdicts {
        println!(
            "  {name}: max abs error {:.2e} (bound {:.2e}) {}",
            v.error,
            v.bound,
            if v.pass() { "pass" } else { "FAIL" }
        );
    }
    anyhow::ensure!(
        verdicts.iter().all(|(_, v)| v.pass()),
        "the forward is off the reference"
    );
    Ok(())
}
