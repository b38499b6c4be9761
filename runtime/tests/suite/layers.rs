//! The runtime is layered, one way (the list in `src/lib.rs` says what each layer holds):
//! fp8 and the kernel descriptions ← the errors ← the device ← tensors and shapes ← the
//! modifier values ← dispatch ← the planner and GPU timing ← the ops (each with its
//! host-slice call) ← the references and the pass rule ← the harness, with `lib.rs` on top. This test
//! reads every library source file's `crate::` paths and fails on one that points to a
//! module of the same or a higher layer, or to a path the crate root re-exports (which
//! would hide where it leads), so a new cycle cannot creep in.

#[path = "../../../attn-dsl/tests/common/crate_paths.rs"]
mod crate_paths;

use std::collections::BTreeMap;
use std::path::Path;

use crate_paths::{files, module_of, uses};

/// Each top-level module and its layer; a module may use modules of lower layers only.
const LAYERS: &[(&str, u32)] = &[
    ("fp8", 0),
    ("kernels", 0),
    ("error", 1),
    ("device", 2),
    ("tensor", 3),
    ("shape", 3),
    ("modifiers", 4),
    ("dispatch", 5),
    ("plan", 6),
    ("timing", 6),
    ("ops", 7),
    ("verify", 8),
    ("harness", 9),
];

#[test]
fn every_module_uses_only_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let layer: BTreeMap<&str, u32> = LAYERS.iter().copied().collect();
    let mut violations = Vec::new();
    for file in &all {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        let own = *layer
            .get(module.as_str())
            .unwrap_or_else(|| panic!("module `{module}` has no layer in LAYERS; add it"));
        let rel = file.strip_prefix(&src).unwrap().display().to_string();
        let text = std::fs::read_to_string(file).unwrap();
        for used in uses(&text) {
            if used == module {
                continue;
            }
            match layer.get(used.as_str()) {
                Some(&theirs) if theirs >= own => violations.push(format!(
                    "{rel}: `{module}` (layer {own}) uses `{used}` (layer {theirs})"
                )),
                Some(_) => {}
                None => violations.push(format!(
                    "{rel}: uses crate::{used}, a re-export of the crate root; name the \
                     module it lives in"
                )),
            }
        }
    }
    assert!(
        violations.is_empty(),
        "layering violations:\n{}",
        violations.join("\n")
    );
}

/// The library's public functions that return a `Result` return `Error`, the one type a
/// caller matches, but for the host-only checks that return the `InputError` inside it and
/// the builders of kernel descriptions (`kernels.rs`, `plan/kernels.rs`), which compile
/// attn-dsl specs and return attn-dsl's error as `attn_dsl::compile` does. The harness is
/// the tools', not the library.
#[test]
fn every_public_function_returns_the_one_error_type() {
    const CHECKS: &[&str] = &["validate_forward", "validate_decode", "validate_seg"];
    const DESCRIPTIONS: &[&str] = &["kernels.rs", "plan/kernels.rs"];
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut others = Vec::new();
    for file in &all {
        let rel = file.strip_prefix(&src).unwrap().display().to_string();
        if rel.starts_with("harness") || rel.starts_with("bin") {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        for (name, error) in public_results(&text) {
            let allowed = error == "Error"
                || (error == "InputError" && CHECKS.contains(&name))
                || (error == "DslError" && DESCRIPTIONS.contains(&rel.as_str()));
            if !allowed {
                others.push(format!("{rel}: `{name}` returns `{error}`"));
            }
        }
    }
    assert!(
        others.is_empty(),
        "public functions that do not return runtime::Error:\n{}",
        others.join("\n")
    );
}

/// Each `pub fn` (or `pub async fn`) of `text` that returns `Result<_, E>`: its name and E's
/// last path segment.
fn public_results(text: &str) -> Vec<(&str, &str)> {
    let mut found = Vec::new();
    for (at, _) in text.match_indices("pub ") {
        let rest = text[at + 4..].trim_start_matches("async ");
        let Some(rest) = rest.strip_prefix("fn ") else {
            continue;
        };
        let name_end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'));
        let name = &rest[..name_end.unwrap_or(rest.len())];
        let signature = &rest[..rest.find(['{', ';']).unwrap_or(rest.len())];
        let Some(result) = signature.split("-> ").nth(1) else {
            continue;
        };
        let Some(args) = result.trim().strip_prefix("Result<") else {
            continue;
        };
        found.push((name, error_type(args)));
    }
    found
}

/// The error type's last path segment in `args`, the text after `Result<`: what follows
/// its last comma outside brackets and parentheses (`Error` where there is none, as in
/// `anyhow::Result<T>` or an alias).
fn error_type(args: &str) -> &str {
    let mut depth = 0i32;
    let mut comma = None;
    for (i, c) in args.char_indices() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' | ')' | ']' if depth == 0 => break,
            '>' | ')' | ']' => depth -= 1,
            ',' if depth == 0 => comma = Some(i),
            _ => {}
        }
    }
    let Some(comma) = comma else {
        return "Error";
    };
    let rest = &args[comma + 1..];
    let error = rest[..rest.find('>').unwrap_or(rest.len())].trim();
    error.rsplit("::").next().unwrap_or(error)
}
