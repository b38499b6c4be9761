//! Tensors on the device: a typed view (byte offset, shape, element type) of a wgpu buffer,
//! the caller's own or one the runtime made. Nothing is copied to wrap a buffer; every op
//! checks the views it is given (shape, element type, size, usage, alignment) before it
//! records anything.

use attn_dsl::Scalar;
use half::{bf16, f16};
use wgpu::util::DeviceExt;

pub mod buffers;
pub mod readback;

use crate::device::Gpu;
use crate::error::Error;

pub use crate::error::TensorError;

/// A tensor on the device: `shape` elements of `scalar`, row-major, from byte `offset` of
/// `buffer`. Cloning shares the buffer.
#[derive(Clone, Debug)]
pub struct Tensor {
    buffer: wgpu::Buffer,
    /// The device the buffer belongs to (made there, or found there by [`Tensor::wrap`]):
    /// every binding compares it with the op's, since wgpu panics on a foreign buffer.
    device: wgpu::Device,
    /// The token of the [`Gpu`] it was made or wrapped by.
    origin: u64,
    offset: u64,
    shape: Vec<u32>,
    scalar: Scalar,
}

/// Bytes of one element (bf16 and f16: 2).
pub fn element_bytes(scalar: Scalar) -> u64 {
    match scalar {
        Scalar::F32 | Scalar::U32 => 4,
        Scalar::F16 | Scalar::Bf16 => 2,
        Scalar::E4m3 | Scalar::E5m2 => 1,
    }
}

/// The usages the runtime gives the buffers it creates: storage for the kernels, copies
/// for uploads, readbacks and clears.
pub const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

impl Tensor {
    /// A view of the caller's `buffer` (no copy), checked against the device: in bounds,
    /// STORAGE usage, `offset` aligned for a storage binding, and (natively) a buffer of
    /// `gpu`'s device.
    pub fn wrap(
        gpu: &Gpu,
        buffer: &wgpu::Buffer,
        offset: u64,
        shape: &[u32],
        scalar: Scalar,
    ) -> Result<Tensor, Error> {
        let tensor = Tensor {
            buffer: buffer.clone(),
            device: gpu.device.clone(),
            origin: gpu.token(),
            offset,
            shape: shape.to_vec(),
            scalar,
        };
        tensor.check_binding(gpu, "tensor")?;
        #[cfg(not(target_arch = "wasm32"))]
        probe_device(gpu, &tensor)?;
        Ok(tensor)
    }

    /// A new zero-filled tensor of its own buffer; refused where the shape needs more
    /// bytes than the device's max_buffer_size.
    pub fn zeros(gpu: &Gpu, shape: &[u32], scalar: Scalar) -> Result<Tensor, Error> {
        let bytes = buffer_bytes(gpu, shape, scalar)?;
        gpu.count_buffer();
        let buffer = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("attn tensor"),
            size: bytes,
            usage: USAGE,
            mapped_at_creation: false,
        });
        Ok(Tensor {
            buffer,
            device: gpu.device.clone(),
            origin: gpu.token(),
            offset: 0,
            shape: shape.to_vec(),
            scalar,
        })
    }

    /// A new tensor holding `data` (row-major) rounded to `scalar` (to nearest even).
    pub fn from_f32(
        gpu: &Gpu,
        shape: &[u32],
        scalar: Scalar,
        data: &[f32],
    ) -> Result<Tensor, Error> {
        check_data("data", data.len(), shape)?;
        buffer_bytes(gpu, shape, scalar)?;
        let bytes: Vec<u8> = match scalar {
            Scalar::F32 => bytemuck::cast_slice(data).to_vec(),
            Scalar::U32 => data
                .iter()
                .flat_map(|x| (*x as u32).to_le_bytes())
                .collect(),
            Scalar::F16 => data
                .iter()
                .flat_map(|x| f16::from_f32(*x).to_le_bytes())
                .collect(),
            Scalar::Bf16 => data
                .iter()
                .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
                .collect(),
            Scalar::E4m3 | Scalar::E5m2 => {
                let f = scalar.fp8().expect("an fp8 scalar");
                data.iter().map(|&x| crate::fp8::to_bits(f, x)).collect()
            }
        };
        Ok(Tensor::from_bytes(gpu, shape, scalar, &bytes))
    }

    /// A new u32 tensor holding `data` (lengths, positions, block tables).
    pub fn from_u32(gpu: &Gpu, shape: &[u32], data: &[u32]) -> Result<Tensor, Error> {
        check_data("data", data.len(), shape)?;
        buffer_bytes(gpu, shape, Scalar::U32)?;
        Ok(Tensor::from_bytes(
            gpu,
            shape,
            Scalar::U32,
            bytemuck::cast_slice(data),
        ))
    }

    fn from_bytes(gpu: &Gpu, shape: &[u32], scalar: Scalar, bytes: &[u8]) -> Tensor {
        let mut contents = bytes.to_vec();
        contents.resize(padded(bytes.len() as u64) as usize, 0);
        gpu.count_buffer();
        let buffer = gpu
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("attn tensor"),
                contents: &contents,
                usage: USAGE,
            });
        Tensor {
            buffer,
            device: gpu.device.clone(),
            origin: gpu.token(),
            offset: 0,
            shape: shape.to_vec(),
            scalar,
        }
    }

    /// The same bytes seen with another shape of as many elements.
    pub fn reshape(&self, shape: &[u32]) -> Result<Tensor, Error> {
        if elements(shape) != self.len() {
            return Err(TensorError::Shape {
                name: "reshape".into(),
                got: self.shape.clone(),
                want: shape.to_vec(),
                layout: "as many elements",
            }
            .into());
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            ..self.clone()
        })
    }

    /// The first elements of this tensor seen with `shape` (no more than it holds): a
    /// smaller problem in a buffer sized for a larger one.
    pub fn view(&self, shape: &[u32]) -> Result<Tensor, Error> {
        if elements(shape) > self.len() {
            return Err(TensorError::Shape {
                name: "view".into(),
                got: self.shape.clone(),
                want: shape.to_vec(),
                layout: "no more elements than the tensor holds",
            }
            .into());
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            ..self.clone()
        })
    }

    /// The elements from `first` on seen with `shape`: a tensor inside this one's bytes
    /// (a part of a fused projection's output). Ops refuse it where its offset is not
    /// the device's storage offset alignment.
    pub fn slice(&self, first: u64, shape: &[u32]) -> Result<Tensor, Error> {
        if first.saturating_add(elements(shape)) > self.len() {
            return Err(TensorError::Shape {
                name: format!("slice from element {first}"),
                got: self.shape.clone(),
                want: shape.to_vec(),
                layout: "no more elements than the tensor holds past the first",
            }
            .into());
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            offset: self.offset + first * element_bytes(self.scalar),
            ..self.clone()
        })
    }

    /// This tensor through `next` as one flat tensor, and where `next` starts in it (in
    /// elements), where `next` (of the same element type) lies in the same buffer at or
    /// after this one's end.
    pub(crate) fn through(&self, next: &Tensor) -> Option<(Tensor, u64)> {
        let bytes = element_bytes(self.scalar);
        let end = self.offset.checked_add(self.bytes())?;
        let after = self.buffer == next.buffer
            && self.scalar == next.scalar
            && next.offset >= end
            && (next.offset - self.offset).is_multiple_of(bytes);
        let at = (next.offset - self.offset.min(next.offset)) / bytes;
        let len = u32::try_from(at.checked_add(next.len())?).ok()?;
        after.then(|| {
            let both = Tensor {
                shape: vec![len],
                ..self.clone()
            };
            (both, at)
        })
    }

    /// The buffer the tensor lies in, shared with its clones and views.
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// Where the tensor starts in its buffer, in bytes.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Its dimensions, outermost first.
    pub fn shape(&self) -> &[u32] {
        &self.shape
    }

    /// The element type.
    pub fn scalar(&self) -> Scalar {
        self.scalar
    }

    /// Elements in the tensor.
    pub fn len(&self) -> u64 {
        elements(&self.shape)
    }

    /// Whether it has no element (a dimension of 0).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the elements.
    pub fn bytes(&self) -> u64 {
        self.len().saturating_mul(element_bytes(self.scalar))
    }

    /// Bytes a binding of it spans: the elements, rounded up to whole words.
    pub(crate) fn binding_bytes(&self) -> u64 {
        padded(self.bytes())
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn binding(&self) -> wgpu::BufferBinding<'_> {
        wgpu::BufferBinding {
            buffer: &self.buffer,
            offset: self.offset,
            size: wgpu::BufferSize::new(self.binding_bytes()),
        }
    }

    /// Bounds, usage, alignment and size of a storage binding of this tensor on `gpu`.
    pub(crate) fn check_binding(&self, gpu: &Gpu, name: &str) -> Result<(), TensorError> {
        self.check_device(gpu, name)?;
        let size = self.buffer.size();
        let bytes = self.binding_bytes();
        if self.offset.checked_add(bytes).is_none_or(|end| end > size) {
            return Err(TensorError::OutOfBounds {
                name: name.into(),
                offset: self.offset,
                bytes,
                size,
            });
        }
        if !self.buffer.usage().contains(wgpu::BufferUsages::STORAGE) {
            return Err(TensorError::Usage {
                name: name.into(),
                missing: "STORAGE",
                has: format!("{:?}", self.buffer.usage()),
            });
        }
        let align = u64::from(gpu.limits().min_storage_buffer_offset_alignment);
        if !self.offset.is_multiple_of(align) {
            return Err(TensorError::Alignment {
                name: name.into(),
                offset: self.offset,
                align,
            });
        }
        let limit = gpu.limits().max_storage_buffer_binding_size;
        if bytes > limit {
            return Err(TensorError::TooLarge {
                name: name.into(),
                bytes,
                limit,
            });
        }
        Ok(())
    }

    /// Whether the tensor lives on `gpu`'s device (wgpu panics on a buffer of another):
    /// made by this `Gpu`, or on a device wgpu calls equal and that is the same one.
    pub(crate) fn check_device(&self, gpu: &Gpu, name: &str) -> Result<(), TensorError> {
        let same = self.origin == gpu.token()
            || (self.device == gpu.device && one_device(&self.device, &gpu.device));
        match same {
            true => Ok(()),
            false => Err(TensorError::Device {
                name: name.into(),
                message: "it was made on (or wrapped for) another device than this op's \
                          `Gpu`; create it on this one"
                    .into(),
            }),
        }
    }

    /// Whether the buffer can be cleared or copied into (ops that overwrite an output
    /// clear it first).
    pub(crate) fn check_copy_dst(&self, gpu: &Gpu, name: &str) -> Result<(), TensorError> {
        self.check_device(gpu, name)?;
        match self.buffer.usage().contains(wgpu::BufferUsages::COPY_DST) {
            true => Ok(()),
            false => Err(TensorError::Usage {
                name: name.into(),
                missing: "COPY_DST",
                has: format!("{:?}", self.buffer.usage()),
            }),
        }
    }

    /// Records a clear of the tensor's bytes to zero (words past an odd f16 or bf16 count
    /// included: they belong to the binding).
    pub(crate) fn record_clear(&self, encoder: &mut wgpu::CommandEncoder) {
        encoder.clear_buffer(&self.buffer, self.offset, Some(self.binding_bytes()));
    }

    /// The elements, widened to f32 (u32 elements converted), after the GPU has run
    /// everything submitted so far.
    pub async fn to_f32(&self, gpu: &Gpu) -> Result<Vec<f32>, Error> {
        let bytes = self.read_bytes(gpu).await?;
        Ok(match self.scalar {
            Scalar::F32 => bytemuck::pod_collect_to_vec(&bytes),
            Scalar::U32 => words(&bytes).map(|w| w as f32).collect(),
            Scalar::F16 => halves(&bytes).map(|h| f16::from_bits(h).to_f32()).collect(),
            Scalar::Bf16 => halves(&bytes)
                .map(|h| bf16::from_bits(h).to_f32())
                .collect(),
            Scalar::E4m3 | Scalar::E5m2 => {
                let f = self.scalar.fp8().expect("an fp8 scalar");
                bytes.iter().map(|&b| crate::fp8::to_f32(f, b)).collect()
            }
        })
    }

    /// The elements of a u32 tensor.
    pub async fn to_u32(&self, gpu: &Gpu) -> Result<Vec<u32>, Error> {
        let bytes = self.read_bytes(gpu).await?;
        Ok(words(&bytes).collect())
    }

    async fn read_bytes(&self, gpu: &Gpu) -> Result<Vec<u8>, Error> {
        self.check_device(gpu, "the tensor read back")?;
        let mut bytes =
            readback::read_range(gpu, &self.buffer, self.offset, self.binding_bytes()).await?;
        bytes.truncate(self.bytes() as usize);
        Ok(bytes)
    }
}

fn words(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
}

fn halves(bytes: &[u8]) -> impl Iterator<Item = u16> + '_ {
    bytes
        .chunks_exact(2)
        .map(|h| u16::from_le_bytes([h[0], h[1]]))
}

/// Elements of a shape (1 for a scalar's empty shape), u64::MAX past what a u64 counts.
pub fn elements(shape: &[u32]) -> u64 {
    shape
        .iter()
        .fold(1u64, |n, d| n.saturating_mul(u64::from(*d)))
}

/// Bytes rounded up to whole words, at least one: wgpu binds neither empty ranges nor
/// ranges that end mid-word.
fn padded(bytes: u64) -> u64 {
    bytes.checked_next_multiple_of(4).unwrap_or(u64::MAX).max(4)
}

/// Bytes of a new buffer for `shape` (padded to whole words), refused over the device's
/// max_buffer_size, where wgpu would panic.
fn buffer_bytes(gpu: &Gpu, shape: &[u32], scalar: Scalar) -> Result<u64, TensorError> {
    let bytes = shape
        .iter()
        .fold(u128::from(element_bytes(scalar)), |n, d| {
            n.saturating_mul(u128::from(*d))
        });
    let limit = gpu.limits().max_buffer_size;
    match u64::try_from(bytes) {
        Ok(b) if padded(b) <= limit => Ok(padded(b)),
        _ => Err(TensorError::Buffer {
            name: "tensor".into(),
            shape: shape.to_vec(),
            bytes,
            limit,
        }),
    }
}

fn check_data(name: &str, got: usize, shape: &[u32]) -> Result<(), TensorError> {
    let want = shape
        .iter()
        .try_fold(1u64, |n, d| n.checked_mul(u64::from(*d)));
    match want == Some(got as u64) {
        true => Ok(()),
        false => Err(TensorError::Data {
            name: name.into(),
            got,
            want: want.unwrap_or(u64::MAX),
        }),
    }
}

/// Whether `a` and `b`, equal by wgpu's comparison, are one device. wgpu compares devices
/// by their ids, which the first device of every wgpu Instance shares; but a device's error
/// scopes are its own, so an error raised on `a` reaches a scope pushed on `b` after one on
/// `a` only where they are one.
#[cfg(not(target_arch = "wasm32"))]
fn one_device(a: &wgpu::Device, b: &wgpu::Device) -> bool {
    let outer = a.push_error_scope(wgpu::ErrorFilter::Validation);
    let inner = b.push_error_scope(wgpu::ErrorFilter::Validation);
    // Invalid on every device: a buffer mapped at creation is a whole number of 4 bytes.
    drop(a.create_buffer(&wgpu::BufferDescriptor {
        label: Some("attn device probe"),
        size: 1,
        usage: wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: true,
    }));
    let caught = crate::device::block_on(inner.pop()).is_some();
    drop(crate::device::block_on(outer.pop()));
    caught
}

/// A page's devices come from one WebGPU instance, whose devices wgpu tells apart.
#[cfg(target_arch = "wasm32")]
fn one_device(_: &wgpu::Device, _: &wgpu::Device) -> bool {
    true
}

/// Whether `tensor`'s buffer belongs to `gpu`'s device: a bind group of it, made under an
/// error scope, which on native wgpu reports at once.
#[cfg(not(target_arch = "wasm32"))]
fn probe_device(gpu: &Gpu, tensor: &Tensor) -> Result<(), TensorError> {
    let device = &gpu.device;
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some("attn probe"),
        entries: &[wgpu::BindGroupLayoutEntry {
            binding: 0,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only: true },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        }],
    });
    // wgpu-core resolves the buffer's id in this device's instance: a buffer of another
    // Instance whose id this one does not hold panics there (and one whose id it holds
    // names this instance's buffer instead, which nothing wgpu exposes can tell apart).
    // The device works after the panic, so it is a refusal like the others.
    let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("attn probe"),
            layout: &layout,
            entries: &[wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(tensor.binding()),
            }],
        })
    }));
    let popped = crate::device::block_on(scope.pop());
    match (made, popped) {
        (Err(_), _) => Err(TensorError::Device {
            name: "tensor".into(),
            message: "wgpu found no such buffer in this device's wgpu Instance (a buffer \
                      of another Instance?)"
                .into(),
        }),
        (Ok(_), None) => Ok(()),
        (Ok(_), Some(e)) => Err(TensorError::Device {
            name: "tensor".into(),
            message: e.to_string(),
        }),
    }
}
