//! The runtime is layered, one way (the list in `src/lib.rs` says what each layer holds):
//! fp8 and the kernel descriptions ← the device ← the errors ← tensors and shapes ← the
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
    ("device", 1),
    ("error", 2),
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
