//! Pipelines compiled on a device, kept by their source: ops built again (a fresh
//! `KvCache` or `Decode` per request, a case per test) or ops sharing a kernel compile it
//! once per device, not once per op. A driver compile takes from milliseconds on a GPU to
//! seconds on a CPU adapter, where it is most of a short program's time.

use std::collections::HashMap;
use std::sync::Mutex;

use attn_dsl::KernelAbi;

/// What a kernel compiles to: the bind group layout and the pipeline (both shared handles).
#[derive(Clone)]
pub(crate) struct Compiled {
    pub layout: wgpu::BindGroupLayout,
    pub pipeline: wgpu::ComputePipeline,
}

/// A kernel's source as the driver sees it: the same text, entry point and runtime checks
/// compile to the same pipeline.
#[derive(Hash, PartialEq, Eq)]
struct Key {
    name: String,
    entry_point: String,
    wgsl: String,
    checked: bool,
}

impl Key {
    fn of(abi: &KernelAbi, checked: bool) -> Key {
        Key {
            name: abi.name.to_string(),
            entry_point: abi.entry_point.to_string(),
            wgsl: abi.wgsl.to_string(),
            checked,
        }
    }
}

/// The pipelines a device has compiled and validated.
#[derive(Default)]
pub(crate) struct CompiledPipelines(Mutex<HashMap<Key, Compiled>>);

impl CompiledPipelines {
    pub fn get(&self, abi: &KernelAbi, checked: bool) -> Option<Compiled> {
        let map = self.0.lock().ok()?;
        map.get(&Key::of(abi, checked)).cloned()
    }

    /// Keeps a pipeline that compiled without a validation error: a failed one is not
    /// kept, so asking again reports the error again.
    pub fn insert(&self, abi: &KernelAbi, checked: bool, compiled: Compiled) {
        if let Ok(mut map) = self.0.lock() {
            map.insert(Key::of(abi, checked), compiled);
        }
    }

    pub fn len(&self) -> usize {
        self.0.lock().map_or(0, |m| m.len())
    }
}
