//! The uniforms and buffers of a one-off dispatch from host values: `dims` and `params`
//! filled by field name from the kernel's plan, the modifiers' buffers, the checked grid,
//! one submission.

use attn_dsl::{Access, Binding, KernelAbi};

use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::error::{Error, InputError};
use crate::modifiers::Modifiers;
use crate::shape::Heads;
use crate::tensor::buffers;

pub(crate) fn submit(
    gpu: &Gpu,
    kernel: &Kernel,
    bound: &[(&str, &wgpu::Buffer)],
    grid: [u32; 3],
) -> Result<(), Error> {
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    kernel.record(gpu, &mut encoder, bound, grid)?;
    gpu.queue.submit([encoder.finish()]);
    Ok(())
}

/// The `dims` uniform, filled by field name from the kernel's plan (fields not given are 0).
pub(crate) fn uniform_dims(
    gpu: &Gpu,
    abi: &KernelAbi,
    dims: &[(&str, u32)],
) -> Result<wgpu::Buffer, Error> {
    let bytes = fill(uniform_block(abi, "dims")?, |_, field| {
        by_name(dims, field).to_le_bytes()
    });
    Ok(buffers::uniform(gpu, "dims", &bytes))
}

fn by_name(values: &[(&str, u32)], field: &str) -> u32 {
    values
        .iter()
        .find(|(name, _)| *name == field)
        .map_or(0, |(_, v)| *v)
}

fn uniform_block<'a>(abi: &'a KernelAbi, name: &str) -> Result<&'a Binding, Error> {
    abi.binding(name)
        .filter(|b| b.access == Access::Uniform)
        .ok_or_else(|| Error::Binding {
            kernel: abi.name.to_string(),
            binding: name.to_string(),
        })
}

/// The `dims` and `params` uniforms of an attention op: `dims` and the scale (default
/// `1 / sqrt(head_dim)`), with the fields of the modifiers.
pub(crate) fn modified_uniforms(
    gpu: &Gpu,
    abi: &KernelAbi,
    dims: &[(&'static str, u32)],
    scale: Option<f32>,
    h: Heads,
    mods: &Modifiers,
) -> Result<(wgpu::Buffer, wgpu::Buffer), Error> {
    let dims: Vec<_> = dims.iter().copied().chain(mods.dims()).collect();
    let params: Vec<_> = std::iter::once(("scale", scale.unwrap_or(h.default_scale())))
        .chain(mods.params())
        .collect();
    uniforms(gpu, abi, &dims, &params)
}

/// The `dims` and `params` uniforms, filled from the kernel's plan by field name (fields
/// not given are 0).
pub(crate) fn uniforms(
    gpu: &Gpu,
    abi: &KernelAbi,
    dims: &[(&str, u32)],
    params: &[(&str, f32)],
) -> Result<(wgpu::Buffer, wgpu::Buffer), Error> {
    let params_bytes = fill(uniform_block(abi, "params")?, |_, field| {
        let value = params
            .iter()
            .find(|(name, _)| *name == field)
            .map_or(0.0, |(_, v)| *v);
        value.to_le_bytes()
    });
    Ok((
        uniform_dims(gpu, abi, dims)?,
        buffers::uniform(gpu, "params", &params_bytes),
    ))
}

fn fill(b: &Binding, value: impl Fn(usize, &str) -> [u8; 4]) -> Vec<u8> {
    b.fields
        .iter()
        .enumerate()
        .flat_map(|(i, f)| value(i, f))
        .collect()
}

pub(crate) fn checked_grid(
    abi: &KernelAbi,
    limits: &wgpu::Limits,
    dims: &[(&str, u32)],
) -> Result<[u32; 3], InputError> {
    let ordered: Vec<u32> = abi
        .binding("dims")
        .map(|b| b.fields.iter().map(|f| by_name(dims, f)).collect())
        .unwrap_or_default();
    let grid = abi.dispatch_grid(&ordered);
    let limit = limits.max_compute_workgroups_per_dimension;
    match grid.iter().find(|g| **g > limit) {
        Some(&g) => Err(InputError::OverLimit {
            what: "workgroups in one grid dimension",
            value: g.into(),
            limit: limit.into(),
        }),
        None => Ok(grid),
    }
}

impl Modifiers<'_> {
    /// The modifiers' input buffers, by binding name (a placeholder word where absent:
    /// a kernel without the modifier does not bind it), then the user-written modifiers'
    /// tensors in their declared element types.
    pub(crate) fn buffers(&self, gpu: &Gpu) -> Vec<(String, wgpu::Buffer)> {
        let alibi = self.alibi.unwrap_or(&[0.0]);
        let bias = self.bias.map_or(&[0.0][..], |b| b.values);
        let sinks = self.sinks.unwrap_or(&[0.0]);
        let mut out = vec![
            ("alibi".to_string(), buffers::storage(gpu, "alibi", alibi)),
            ("bias".to_string(), buffers::storage(gpu, "bias", bias)),
            ("sinks".to_string(), buffers::storage(gpu, "sinks", sinks)),
        ];
        let Some(flex) = self.flex else { return out };
        for t in &flex.modifiers.parsed().tensors {
            let Some(values) = flex.tensor(&t.name) else {
                continue;
            };
            let buffer = match t.ty {
                attn_dsl::flex::Ty::F32 => buffers::storage(gpu, &t.name, values),
                _ => buffers::storage(gpu, &t.name, &crate::modifiers::u32_words(values)),
            };
            out.push((t.name.clone(), buffer));
        }
        out
    }
}
