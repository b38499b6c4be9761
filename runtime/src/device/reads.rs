//! The debug switch for user-written modifiers' reads ([`super::Gpu::report_modifier_reads`]):
//! kernels built with it record the first read outside a tensor's shape of everything
//! submitted since the last look, into one small buffer of the device, with the kernel's
//! code; the kernels that bind it are remembered by code, so the report names them.

use std::sync::Mutex;

use attn_dsl::KernelAbi;
use attn_dsl::flex::FlexRef;

use crate::error::OutOfRange;

/// Words of the report: the kernel's code (0: no read out of range), the tensor's place
/// among the modifiers' tensors, the read's rank and up to four indices.
pub(crate) const REPORT_WORDS: u64 = 7;

/// The report buffer and the kernels that write it.
pub(crate) struct ReadReport {
    pub buffer: wgpu::Buffer,
    kernels: Mutex<Vec<(u32, String, FlexRef)>>,
}

impl ReadReport {
    pub fn new(device: &wgpu::Device) -> ReadReport {
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("flex_reads"),
            size: 4 * REPORT_WORDS,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        ReadReport {
            buffer,
            kernels: Mutex::new(Vec::new()),
        }
    }

    /// The buffer `abi` binds as `flex_reads`, the kernel remembered by its code.
    pub fn bind(&self, abi: &KernelAbi) -> &wgpu::Buffer {
        let code = attn_dsl::emit::flex::kernel_code(&abi.name);
        let mut kernels = self.kernels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(flex) = abi.masks.flex
            && !kernels.iter().any(|(c, _, _)| *c == code)
        {
            kernels.push((code, abi.name.to_string(), flex));
        }
        &self.buffer
    }

    /// The read the report's `words` hold, `None` where none was out of range.
    pub fn decode(&self, words: &[u32]) -> Option<OutOfRange> {
        let (code, tensor, rank) = (words[0], words[1] as usize, words[2] as usize);
        if code == 0 {
            return None;
        }
        let kernels = self.kernels.lock().unwrap_or_else(|e| e.into_inner());
        let known = kernels.iter().find(|(c, _, _)| *c == code);
        let (kernel, tensor) = match known {
            Some((_, name, flex)) => {
                let t = flex.parsed().tensors.get(tensor).map(|t| t.name.clone());
                (name.clone(), t.unwrap_or_else(|| format!("#{tensor}")))
            }
            None => (format!("kernel {code:#x}"), format!("#{tensor}")),
        };
        let index = words[3..3 + rank.min(4)]
            .iter()
            .map(|w| *w as i32)
            .collect();
        Some(OutOfRange {
            kernel,
            tensor,
            index,
        })
    }
}
