//! Uniform buffers by content. An op's `dims` and `params` depend on the problem's shape,
//! not on the call: a decode loop, a training step or a layer stack records the same few
//! contents over and over. Each content gets one buffer, written once at creation and
//! never again, so a command recorded with it reads the values it was recorded with,
//! whatever is recorded before the submit; the least recently used are dropped past
//! [`CAPACITY`] (wgpu keeps a buffer alive while a command that uses it is pending).

use wgpu::util::DeviceExt;

/// Distinct contents kept: far more than one model's shapes produce.
pub const CAPACITY: usize = 256;

#[derive(Default)]
pub struct UniformCache {
    /// Most recently used last.
    entries: Vec<(Vec<u8>, wgpu::Buffer)>,
    created: u64,
}

impl UniformCache {
    pub fn get_or_create(&mut self, device: &wgpu::Device, bytes: &[u8]) -> wgpu::Buffer {
        if let Some(i) = self.entries.iter().rposition(|(b, _)| b == bytes) {
            let entry = self.entries.remove(i);
            let buffer = entry.1.clone();
            self.entries.push(entry);
            return buffer;
        }
        if self.entries.len() >= CAPACITY {
            self.entries.remove(0);
        }
        let buffer = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("attn uniforms"),
            contents: bytes,
            usage: wgpu::BufferUsages::UNIFORM,
        });
        self.created += 1;
        self.entries.push((bytes.to_vec(), buffer.clone()));
        buffer
    }

    /// Buffers created so far: flat in a steady state.
    pub fn created(&self) -> u64 {
        self.created
    }
}
