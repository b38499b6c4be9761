//! attn-dsl is layered, one way: the modifier language (`flex`) ← the IR (`spec`, its op signatures, contracts) ← the errors
//! ← the layout rules ← the binding plan ← the checks and the emitter (which never meet) ←
//! naga validation ←
//! the manifest, with `lib.rs` and the `row_layer` facade on top. This test reads every
//! source file's `crate::` paths and fails on an edge that points up (or sideways between
//! modules not allowed to meet), so a new cycle cannot creep in.

#[path = "../common/crate_paths.rs"]
mod crate_paths;

use std::collections::BTreeMap;
use std::path::Path;

use crate_paths::{files, module_of, uses};

/// Each top-level module and its layer; a module may use modules of lower layers only.
const LAYERS: &[(&str, u32)] = &[
    ("flex", 0),
    ("spec", 1),
    ("signature", 2),
    ("contract", 2),
    ("error", 3),
    ("implied", 3),
    ("layout", 4),
    ("plan", 5),
    ("check", 6),
    ("emit", 6),
    ("validate", 7),
    ("manifest", 7),
    ("row_layer", 8),
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
        let text = std::fs::read_to_string(file).unwrap();
        for used in uses(&text) {
            if used == module {
                continue;
            }
            // Re-exported items of the crate root (`crate::compile`, `crate::Dtype`, ...).
            let Some(&theirs) = layer.get(used.as_str()) else {
                if used.chars().next().is_some_and(|c| c.is_lowercase()) {
                    violations.push(format!(
                        "{}: uses crate::{used} (lib.rs, the top)",
                        file.display()
                    ));
                }
                continue;
            };
            if theirs >= own {
                violations.push(format!(
                    "{}: `{module}` (layer {own}) uses `{used}` (layer {theirs})",
                    file.strip_prefix(&src).unwrap().display()
                ));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "layering violations:\n{}",
        violations.join("\n")
    );
}

/// WGSL is built from `Template`s and `Fragment`s: no emitter edits text it already wrote
/// (`.replace(` on a kernel's text substitutes blindly, in comments and names alike). The
/// writer itself is the one place that fills holes.
#[test]
fn no_emitter_rewrites_its_text() {
    let emit = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/emit");
    let mut all = Vec::new();
    files(&emit, &mut all);
    let offenders: Vec<String> = all
        .iter()
        .filter(|f| !f.ends_with("writer.rs"))
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            let name = f.strip_prefix(&emit).unwrap().display().to_string();
            text.lines()
                .enumerate()
                .filter(|(_, l)| l.contains(".replace("))
                .map(|(i, _)| format!("{name}:{}", i + 1))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "`.replace(` in the emitter (fill a Template instead): {}",
        offenders.join(", ")
    );
}

/// Kernel text lives in `Template`s: no emitter writes WGSL with `write!`, and a
/// `format!` builds at most one line (an expression, a statement), so every kernel's
/// structure is readable as WGSL in one place and each hole is filled by name.
#[test]
fn no_emitter_formats_more_than_a_line() {
    let emit = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/emit");
    let mut all = Vec::new();
    files(&emit, &mut all);
    let mut offenders = Vec::new();
    for f in &all {
        let whole = std::fs::read_to_string(f).unwrap();
        // A unit test's own WGSL is not a kernel.
        let text = whole.split("#[cfg(test)]").next().unwrap();
        let name = f.strip_prefix(&emit).unwrap().display().to_string();
        let line_of = |at: usize| text[..at].lines().count().max(1);
        for mac in ["write!(", "writeln!("] {
            for (at, _) in text.match_indices(mac) {
                offenders.push(format!("{name}:{} `{mac}`", line_of(at)));
            }
        }
        for (at, _) in text.match_indices("format!(") {
            let literal = first_literal(&text[at + "format!(".len()..]);
            if literal.is_some_and(|l| l.contains('\n') || l.contains("\\n")) {
                offenders.push(format!(
                    "{name}:{} a `format!` of several lines",
                    line_of(at)
                ));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "WGSL built by hand in the emitter (put it in a Template): {}",
        offenders.join(", ")
    );
}

/// The string literal that opens `rest` (after whitespace), plain or raw.
fn first_literal(rest: &str) -> Option<&str> {
    let rest = rest.trim_start();
    if let Some(raw) = rest.strip_prefix("r#\"") {
        return raw.find("\"#").map(|end| &raw[..end]);
    }
    let body = rest.strip_prefix('"')?;
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        match (escaped, c) {
            (false, '\\') => escaped = true,
            (false, '"') => return Some(&body[..i]),
            _ => escaped = false,
        }
    }
    None
}
