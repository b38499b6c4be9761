//! How many workgroups of 256 invocations the adapter runs at once: the count the
//! planner's workgroup targets scale by ([`crate::plan::calibration`]).
//!
//! Each workgroup of the probe spends its time waiting: one invocation in 32 follows a
//! chain of dependent loads through a small table, so a workgroup's time is load latency,
//! not issue rate. Workgroups that run at once overlap entirely; the time of a dispatch
//! steps up only once it has more workgroups than the adapter holds at once.

use crate::device::Gpu;
use crate::error::Error;
use crate::timing;

/// Entries of the chained table: 4 KiB, in every cache.
const TABLE: u32 = 1024;

/// Loads each chain follows.
const STEPS: u32 = 4096;

/// The most workgroups the probe tries (far past any GPU's: 8 per SM of 512 SMs).
pub const MAX_PROBED: u32 = 4096;

/// A dispatch counts as one wave while its time stays under this multiple of one
/// workgroup's.
const ONE_WAVE: f64 = 1.5;

/// The probe's WGSL, its table's size and chain length written in.
fn probe_wgsl() -> String {
    format!(
        r#"
@group(0) @binding(0) var<storage, read_write> chain: array<u32>;

@compute @workgroup_size(256)
fn probe(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {{
    if (tid % 32u != 0u) {{
        return;
    }}
    var i = (wg.x * 8u + tid / 32u) % {TABLE}u;
    for (var n = 0u; n < {STEPS}u; n = n + 1u) {{
        i = chain[i];
    }}
    // Never true (the table holds indices): keeps the chain's result live.
    if (i == 0xffffffffu) {{
        chain[0] = i;
    }}
}}
"#
    )
}

/// Workgroups of 256 invocations `gpu` runs at once, measured.
pub fn resident_workgroups(gpu: &Gpu) -> Result<u32, Error> {
    let wgsl = probe_wgsl();
    let module = gpu
        .device
        .create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("resident probe"),
            source: wgpu::ShaderSource::Wgsl(wgsl.into()),
        });
    let pipeline = gpu
        .device
        .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("resident probe"),
            layout: None,
            module: &module,
            entry_point: Some("probe"),
            compilation_options: Default::default(),
            cache: None,
        });
    // A cycle through every entry with a stride of 97 (prime to the table's size).
    let chain: Vec<u32> = (0..TABLE).map(|i| (i + 97) % TABLE).collect();
    let table = crate::tensor::buffers::storage(gpu, "resident probe chain", &chain);
    let group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("resident probe"),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[wgpu::BindGroupEntry {
            binding: 0,
            resource: table.as_entire_binding(),
        }],
    });
    let time = |n: u32| -> Result<f64, Error> {
        let t = timing::time_encoded(gpu, 2, 5, |encoder| {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &group, &[]);
            pass.dispatch_workgroups(n, 1, 1);
        })?;
        Ok(t.median_ms)
    };
    knee(time, MAX_PROBED)
}

/// The largest workgroup count up to `max` whose dispatch takes one wave's time (under
/// `ONE_WAVE` times one workgroup's), by `time(n)`: doubling until a count takes longer,
/// then bisecting between the last count that did not and that one.
pub fn knee(mut time: impl FnMut(u32) -> Result<f64, Error>, max: u32) -> Result<u32, Error> {
    let one = time(1)?;
    let fits = |t: f64| t < ONE_WAVE * one;
    let mut low = 1;
    let mut high = None;
    while low < max {
        let n = (low * 2).min(max);
        if fits(time(n)?) {
            low = n;
        } else {
            high = Some(n);
            break;
        }
    }
    let Some(mut high) = high else {
        return Ok(low);
    };
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if fits(time(mid)?) {
            low = mid;
        } else {
            high = mid;
        }
    }
    Ok(low)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_knee_is_the_last_count_of_one_wave() {
        for resident in [1, 2, 37, 1056, 4095] {
            let waves = |n: u32| Ok(f64::from(n.div_ceil(resident)));
            assert_eq!(knee(waves, MAX_PROBED).unwrap(), resident, "{resident}");
        }
        // Every count fits: the most probed.
        assert_eq!(knee(|_| Ok(1.0), MAX_PROBED).unwrap(), MAX_PROBED);
    }
}
