//! Reading a crate's sources for the modules they name through `crate::`: the one reader of
//! the layer tests of attn-dsl and of the runtime (`tests/suite/layers.rs` in each).

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
pub fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file under `src` belongs to (`None` for lib.rs and the
/// binaries, which use the crate by its name).
pub fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_string_lossy();
    match first.as_ref() {
        "lib.rs" | "bin" => None,
        f => Some(f.trim_end_matches(".rs").to_string()),
    }
}

/// Top-level names a source text reaches through `crate::`, in both forms (`crate::a::b`
/// and `crate::{a, b}`); comments (doc links name paths without importing them) and test
/// modules (a test may drive a whole kernel or op) left out.
pub fn uses(text: &str) -> Vec<String> {
    let text = text.split("#[cfg(test)]").next().unwrap_or(text);
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            out.extend(inner.split(',').map(|p| head(p.trim())));
        } else {
            out.push(head(rest));
        }
    }
    out.retain(|m| !m.is_empty());
    out
}

fn head(path: &str) -> String {
    path.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

#[test]
fn the_reader_sees_paths_in_both_forms() {
    let text = "use crate::{spec::Op, layout::rows};\nlet x = crate::emit::emit(a);\n\
                /// [`crate::error`]\n#[cfg(test)]\nuse crate::manifest;";
    assert_eq!(uses(text), ["spec", "layout", "emit"]);
}
