//! `generated/` holds the emitted WGSL of the default family and its manifest. This test
//! fails when they are stale and says how to refresh them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use runtime::kernels::FAMILY;

const REFRESH: &str = "UPDATE_GENERATED=1 cargo test -p runtime --test generated";

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../generated")
}

fn expected() -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = FAMILY
        .iter()
        .map(|abi| (format!("{}.wgsl", abi.name), abi.wgsl.to_string()))
        .collect();
    files.push((
        "manifest.json".into(),
        attn_dsl::manifest::manifest_json(&FAMILY),
    ));
    files
}

#[test]
fn generated_files_are_fresh() {
    let dir = dir();
    let expected = expected();
    if std::env::var_os("UPDATE_GENERATED").is_some() {
        for (name, text) in &expected {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }
    let mut stale: Vec<String> = expected
        .iter()
        .filter(|(name, text)| std::fs::read_to_string(dir.join(name)).ok().as_ref() != Some(text))
        .map(|(name, _)| name.clone())
        .collect();
    let known: BTreeSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".wgsl") && !known.contains(name.as_str()) {
            stale.push(format!(
                "{name} (no kernel of the family has this name; delete it)"
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "generated/ is stale: {}\nrefresh with: {REFRESH}",
        stale.join(", ")
    );
}

#[test]
fn manifest_lists_every_binding_with_group_index_name_type_and_access() {
    let manifest: serde_json::Value =
        serde_json::from_str(&attn_dsl::manifest::manifest_json(&FAMILY)).unwrap();
    let forward = &manifest["kernels"][0];
    assert_eq!(forward["name"], "attention_forward");
    assert_eq!(forward["entry_point"], "attention_forward");
    assert_eq!(forward["workgroup_size"], serde_json::json!([256, 1, 1]));
    let seg = &forward["bindings"][7];
    assert_eq!(
        (seg["group"].as_u64(), seg["binding"].as_u64()),
        (Some(0), Some(7))
    );
    assert_eq!(
        (
            seg["name"].as_str(),
            seg["wgsl_type"].as_str(),
            seg["access"].as_str()
        ),
        (Some("seg"), Some("array<u32>"), Some("read"))
    );
}

/// Every kernel of the default family targets `webgpu` and fits WebGPU's default limits,
/// so `generated/` runs in any browser.
#[test]
fn default_family_fits_webgpu_default_limits() {
    let limits = attn_dsl::Limits::WEBGPU;
    for abi in FAMILY {
        assert_eq!(abi.target, attn_dsl::Target::Webgpu, "{}", abi.name);
        assert!(
            abi.storage_buffers() as u32 <= limits.storage_buffers_per_stage,
            "{}",
            abi.name
        );
        assert!(
            abi.uniform_buffers() as u32 <= limits.uniform_buffers_per_stage,
            "{}",
            abi.name
        );
        assert!(
            abi.workgroup_storage_bytes <= limits.workgroup_storage_bytes,
            "{}",
            abi.name
        );
        assert!(
            abi.workgroup_size.iter().product::<u32>() <= limits.invocations_per_workgroup,
            "{}",
            abi.name
        );
    }
}
