//! The example's kernels, forward and backward, against its CPU code: what a user of
//! `score_mod` / `mask_mod` checks first.

#[test]
fn both_kernels_match_the_cpu() {
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_flex-modifiers"))
        .arg("33")
        .status()
        .expect("the example runs");
    assert!(
        status.success(),
        "the example's GPU results are off its CPU code"
    );
}
