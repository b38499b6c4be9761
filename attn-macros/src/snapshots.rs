//! Snapshots of every kernel the workspace declares: the WGSL and the pretty-printed Rust
//! that `attention_kernel!` expands to. The descriptions are read from the sources that
//! compile them, so each snapshot is exactly what those crates build.
//! Review changes with `cargo insta review`.

use std::path::{Path, PathBuf};

use proc_macro2::TokenStream;

/// Source files whose `attention_kernel!` invocations are snapshotted.
const SOURCES: &[&str] = &[
    "runtime/src/kernels.rs",
    "examples/custom-head-dim/src/lib.rs",
    // User-written score and mask modifiers.
    "examples/flex-modifiers/src/lib.rs",
    // The fused LayerNorm + Linear, described in a test rather than the default family.
    "attn-macros/tests/suite/row_layer.rs",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn invocations(file: &Path) -> Vec<TokenStream> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    parsed
        .items
        .into_iter()
        .filter_map(|item| match item {
            syn::Item::Macro(m) if m.mac.path.is_ident("attention_kernel") => Some(m.mac.tokens),
            _ => None,
        })
        .collect()
}

/// The WGSL literal is elided from the Rust snapshot: it has a snapshot of its own, and
/// one escaped line would hide every other change in a diff.
fn elide_wgsl(rust: &str) -> String {
    const START: &str = "pub const WGSL: &str = \"";
    let Some(at) = rust.find(START) else {
        return rust.to_string();
    };
    let body = at + START.len();
    let end = body + rust[body..].find("\";").expect("the WGSL literal ends");
    format!(
        "{}<elided: see the .wgsl snapshot>{}",
        &rust[..body],
        &rust[end..]
    )
}

#[test]
fn every_declared_kernel_matches_its_snapshots() {
    let mut count = 0;
    for source in SOURCES {
        let descriptions = invocations(&workspace().join(source))
            .into_iter()
            .flat_map(|tokens| {
                let d: crate::parse::Description = syn::parse2(tokens).unwrap();
                d.per_head_dim().unwrap()
            });
        for description in descriptions {
            let lowered = crate::lower::lower(&description).unwrap();
            let abi = attn_dsl::compile(&lowered.spec).unwrap();
            let expanded = crate::expand_one(&description).unwrap();
            let file: syn::File = syn::parse2(expanded).expect("the expansion is a Rust file");
            let rust = elide_wgsl(&prettyplease::unparse(&file));
            let name = description.name.to_string();
            insta::with_settings!({
                snapshot_path => "../../snapshots",
                prepend_module_to_snapshot => false,
                input_file => *source,
            }, {
                insta::assert_snapshot!(format!("{name}.wgsl"), abi.wgsl.as_ref());
                insta::assert_snapshot!(format!("{name}.rs"), rust);
            });
            count += 1;
        }
    }
    assert!(
        count >= 5,
        "expected the runtime's 4 kernels and the example's; found {count}"
    );
}
