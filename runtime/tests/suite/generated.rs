//! `generated/` holds the emitted WGSL of the default family and its manifest. This test
//! fails when they are stale and says how to refresh them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use runtime::kernels::FAMILY;

const REFRESH: &str = "UPDATE_GENERATED=1 cargo test -p runtime --test suite generated";

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

/// The library's user-written modifier examples (`attn_dsl::flex::library`) in the flash
/// forward, both flash backward halves, the per-row forward and the split-K decode: checked by Tint in CI
/// (the key loops that skip tiles must keep their barriers in uniform control flow).
fn flex_expected() -> Vec<(String, String)> {
    use attn_dsl::{KernelSpec, Masks, Op, configs};
    let mut abis = Vec::new();
    for ex in attn_dsl::flex::library::examples() {
        let masks = Masks {
            flex: Some(ex.flex.intern()),
            ..Masks::default()
        };
        let n = ex.name.replace('-', "_");
        let flash = |suffix: &str, op, c| {
            KernelSpec::flash(&format!("flex_{n}_{suffix}"), op, 64, masks, c)
        };
        let mut kv = flash("backward_kv", Op::BackwardKv, configs::backward(64)[0]);
        kv.fit_target();
        // The dQ half writes the gradients of the tensors declared `grad`.
        let mut q = flash("backward_q", Op::BackwardQ, configs::backward(64)[0]);
        q.writes.extend(masks.score_grad_writes());
        q.fit_target();
        // Split-K decode as the runtime builds it: four query heads per workgroup.
        let decode =
            runtime::ops::decode::split_spec(&format!("flex_{n}_decode_split"), 64, masks, 4);
        let specs = [
            flash("forward", Op::Forward, configs::forward(64)[0]),
            q,
            kv,
            KernelSpec::standard(&format!("flex_{n}_forward_rows"), Op::Forward, 64, masks),
            decode,
        ];
        for spec in specs {
            abis.push(attn_dsl::compile(&spec).unwrap_or_else(|e| panic!("{}: {e}", spec.name)));
        }
    }
    let mut files: Vec<(String, String)> = abis
        .iter()
        .map(|abi| (format!("{}.wgsl", abi.name), abi.wgsl.to_string()))
        .collect();
    let refs: Vec<&attn_dsl::KernelAbi> = abis.iter().collect();
    files.push((
        "manifest.json".into(),
        attn_dsl::manifest::manifest_json(&refs),
    ));
    files
}

#[test]
fn generated_files_are_fresh() {
    check_fresh(&dir(), &expected());
}

#[test]
fn generated_flex_files_are_fresh() {
    let dir = dir().join("flex");
    std::fs::create_dir_all(&dir).unwrap();
    check_fresh(&dir, &flex_expected());
}

fn check_fresh(dir: &Path, expected: &[(String, String)]) {
    if std::env::var_os("UPDATE_GENERATED").is_some() {
        for (name, text) in expected {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }
    let mut stale: Vec<String> = expected
        .iter()
        .filter(|(name, text)| std::fs::read_to_string(dir.join(name)).ok().as_ref() != Some(text))
        .map(|(name, _)| name.clone())
        .collect();
    let known: BTreeSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    for entry in std::fs::read_dir(dir).unwrap() {
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
