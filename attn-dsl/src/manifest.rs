//! The machine-readable manifest of a kernel family, for readers and non-Rust hosts
//! (a JavaScript WebGPU app binds buffers by reading it).

use serde::Serialize;

use crate::plan::KernelAbi;

#[derive(Serialize)]
struct Manifest<'a> {
    /// Bumped when the manifest's shape changes.
    format: u32,
    kernels: Vec<Entry<'a>>,
}

#[derive(Serialize)]
struct Entry<'a> {
    wgsl_file: String,
    #[serde(flatten)]
    abi: &'a KernelAbi,
}

/// Pretty JSON for `kernels`, each pointing at its `<name>.wgsl` file.
pub fn manifest_json(kernels: &[&KernelAbi]) -> String {
    let manifest = Manifest {
        format: 1,
        kernels: kernels
            .iter()
            .map(|abi| Entry {
                wgsl_file: format!("{}.wgsl", abi.name),
                abi,
            })
            .collect(),
    };
    let mut json = serde_json::to_string_pretty(&manifest).expect("manifest serializes");
    json.push('\n');
    json
}
