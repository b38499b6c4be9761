//! The page's rows on this machine's adapter (lavapipe in CI), through the same async code
//! the browser runs.

use attn_web::{HEADS, run_layer};
use runtime::BlockOn;
use runtime::{Gpu, kernels};

#[test]
fn every_row_of_the_page_passes_natively() {
    let gpu = Gpu::new(kernels::FAMILY.iter().copied())
        .block_on()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut seen = 0;
    let rows = pollster::block_on(run_layer(&gpu, 33, |_| seen += 1)).unwrap();
    assert_eq!(seen, rows.len());
    let failed: Vec<_> = rows.iter().filter(|r| !r.pass).collect();
    assert!(failed.is_empty(), "{failed:#?}");
    let kernels: Vec<&str> = rows.iter().map(|r| r.kernel.as_str()).collect();
    for want in ["attention_forward", "backward split", "backward recompute"] {
        assert!(kernels.contains(&want), "{want} not in {kernels:?}");
    }
    assert!(kernels.iter().any(|k| k.starts_with("forward flash")));
    assert!(kernels.iter().any(|k| k.starts_with("backward tiled")));
    assert!(
        kernels.iter().any(|k| k.starts_with("decode loop")),
        "the decode loop on a device cache: {kernels:?}"
    );
    assert_eq!(
        rows.iter()
            .filter(|r| r.kernel.ends_with("(planned)"))
            .count(),
        2,
        "one planned forward and one planned backward: {kernels:?}"
    );
    let (layernorm, attention): (Vec<_>, Vec<_>) =
        rows.iter().partition(|r| r.kernel.starts_with("layernorm"));
    assert!(
        attention
            .iter()
            .all(|r| r.shape == "seq 33, 12/4 heads, d 64, causal")
    );
    let layernorm: Vec<(&str, &str)> = layernorm
        .iter()
        .map(|r| (r.kernel.as_str(), r.shape.as_str()))
        .collect();
    let shape = "[1, 128, 64] -> 96";
    assert_eq!(
        layernorm,
        [
            ("layernorm_linear", shape),
            ("layernorm_linear_backward (atomic)", shape),
            ("layernorm_linear_backward (two-pass)", shape),
        ]
    );
    assert_eq!((HEADS.n_heads, HEADS.n_kv_heads), (12, 4));
}
