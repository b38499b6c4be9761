//! The example's kernels, forward and backward, against its CPU code: what a user of
//! `score_mod` / `mask_mod` checks first.

use std::process::{Command, Output};

fn example(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flex-modifiers"))
        .args(args)
        .output()
        .expect("the example runs")
}

#[test]
fn both_kernels_match_the_cpu() {
    let run = example(&["33"]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "the example's GPU results are off its CPU code: {stdout}"
    );
    // Per case and output: the error, the bound and a verdict.
    for case in ["t5_prefix_lm", "capped_window_sinks"] {
        assert!(stdout.contains(&format!("  {case}: pass")), "{stdout}");
    }
    assert!(stdout.contains("  drel_bias max abs error "), "{stdout}");
    assert_eq!(stdout.matches(", bound 1e-4: pass").count(), 11, "{stdout}");
}

#[test]
fn an_error_past_the_bound_is_a_failing_verdict() {
    let (lines, pass) = flex_modifiers::verdict(&[("o", 1e-6), ("dq", 3e-3)]);
    assert!(!pass);
    assert!(lines[0].ends_with("bound 1e-4: pass"), "{lines:?}");
    assert!(
        lines[1].contains("dq        max abs error 3.00e-3, bound 1e-4: FAIL"),
        "{lines:?}"
    );
    let (_, pass) = flex_modifiers::verdict(&[("o", f32::NAN)]);
    assert!(!pass, "a NaN error is no pass");
    let gpu = flex_modifiers::Results {
        o: vec![0.0, f32::NAN],
        ..Default::default()
    };
    let cpu = flex_modifiers::Results {
        o: vec![0.0, 1.0],
        ..Default::default()
    };
    let errors = flex_modifiers::max_errors(&gpu, &cpu);
    assert_eq!(errors[0], ("o", f32::INFINITY), "a NaN output is no match");
}

#[test]
fn a_bad_sequence_length_is_refused_naming_it() {
    for bad in ["0", "abc", "100000"] {
        let run = example(&[bad]);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(&format!("SEQ `{bad}`: give a sequence length")),
            "{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
