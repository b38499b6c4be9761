//! The run-time values of the masks and score modifiers a kernel was built with (its
//! `masks` words): the sliding window, ALiBi slopes, an additive bias, the soft cap,
//! dropout, sinks and user-written modifiers with their tensors. One struct for the
//! forward, the decode, the backward and the references; its validation, its upload and
//! what dispatch binds from it live beside it.

mod bind;
mod block_mask;
mod dropout;
mod upload;
mod validate;

pub use block_mask::BlockMaskStates;
pub use dropout::{Dropout, philox4x32_10};
pub use upload::Uploaded;
pub(crate) use upload::u32_words;
pub(crate) use validate::{expect, scalar_name};

use attn_dsl::flex::FlexRef;
use attn_dsl::{BiasHeads, Masks, Modifier};

use crate::tensor::Tensor;

/// An additive bias, `[batch, n_heads, seq, seq]` (per head) or `[batch, 1, seq, seq]`
/// (shared by the heads); batch 1 for a 3-D tensor. Its values are a host slice
/// ([`Bias`]) or a device [`Tensor`] of that shape ([`DeviceBias`]).
#[derive(Debug)]
pub struct BiasOf<'a, T: ?Sized> {
    /// The bias, added to each score before the softmax.
    pub values: &'a T,
    /// Whether it has a slice per head or one the heads share; the kernel's `bias` or
    /// `shared_bias` word must match.
    pub heads: BiasHeads,
}

impl<T: ?Sized> Clone for BiasOf<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: ?Sized> Copy for BiasOf<'_, T> {}

/// A bias given as a host slice.
pub type Bias<'a> = BiasOf<'a, [f32]>;
/// A bias given as a device tensor.
pub type DeviceBias<'a> = BiasOf<'a, Tensor>;

/// A kernel's user-written modifiers (`score_mod`, `mask_mod`; a description's, or
/// [`attn_dsl::flex::Flex::intern`]ed) and the tensors they read, by declared name: host
/// slices of f32 values (a `u32` tensor's values whole numbers) or device tensors of the
/// declared element type and shape.
pub struct FlexOf<'a, T: ?Sized + Values> {
    /// The modifiers, which must be the ones the kernel was built with.
    pub modifiers: FlexRef,
    /// A value for each declared tensor, by its declared name.
    pub tensors: &'a [(&'a str, &'a T)],
    /// The block mask of these modifiers over the call's shape, for kernels built to read
    /// one ([`attn_dsl::flex::Flex::block_mask`]); others ignore it.
    pub block_mask: Option<&'a T::BlockMask>,
}

/// What modifier values are held as, host slices (`[f32]`) or device tensors, and what a
/// block mask is beside them: its states on the device, nothing on the host (the host-slice
/// calls make their own), so that host values stay `Sync` where device handles are not.
pub trait Values {
    /// The block mask a kernel reading one takes with these values.
    type BlockMask: ?Sized;
}

impl Values for [f32] {
    type BlockMask = std::convert::Infallible;
}

impl Values for Tensor {
    type BlockMask = BlockMaskStates;
}

impl<T: ?Sized + Values> Clone for FlexOf<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: ?Sized + Values> Copy for FlexOf<'_, T> {}

impl<T: ?Sized + Values + std::fmt::Debug> std::fmt::Debug for FlexOf<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlexOf")
            .field("modifiers", &self.modifiers)
            .field("tensors", &self.tensors)
            .field("block_mask", &self.block_mask.is_some())
            .finish()
    }
}

impl<'a, T: ?Sized + Values> FlexOf<'a, T> {
    /// The values given for tensor `name`.
    pub fn tensor(&self, name: &str) -> Option<&'a T> {
        self.tensors
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| *t)
    }
}

/// The values of the modifiers a kernel was built with; `None` for those it was not. The
/// ALiBi slopes and the bias are host slices ([`Modifiers`], the host-slice API) or device
/// tensors ([`DeviceModifiers`], the recording API).
#[derive(Debug)]
pub struct ModifiersOf<'a, T: ?Sized + Values> {
    /// Keys within this many positions of the query (`masks: [window]`).
    pub window: Option<u32>,
    /// ALiBi slopes, one per query head (`alibi`).
    pub alibi: Option<&'a T>,
    /// `bias` or `shared_bias`.
    pub bias: Option<BiasOf<'a, T>>,
    /// The soft cap (`softcap`), positive.
    pub softcap: Option<f32>,
    /// `dropout`.
    pub dropout: Option<Dropout>,
    /// Attention sinks (`sinks`): one logit per query head, joined to every row's softmax
    /// denominator.
    pub sinks: Option<&'a T>,
    /// User-written modifiers (`score_mod`, `mask_mod`) and their tensors.
    pub flex: Option<FlexOf<'a, T>>,
}

impl<T: ?Sized + Values> Clone for ModifiersOf<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: ?Sized + Values> Copy for ModifiersOf<'_, T> {}

/// Modifier values for the host-slice API.
pub type Modifiers<'a> = ModifiersOf<'a, [f32]>;
/// Modifier values for the recording API: slopes and bias on the device.
pub type DeviceModifiers<'a> = ModifiersOf<'a, Tensor>;

impl<T: ?Sized + Values> Default for ModifiersOf<'_, T> {
    fn default() -> Self {
        ModifiersOf {
            window: None,
            alibi: None,
            bias: None,
            softcap: None,
            dropout: None,
            sinks: None,
            flex: None,
        }
    }
}

impl<'a, T: ?Sized + Values> ModifiersOf<'a, T> {
    /// The values of a kernel built with user-written modifiers (`masks`: its
    /// `ABI.masks`, or the masks it was compiled from): the tensors they read by name.
    pub fn with_flex(masks: Masks, tensors: &'a [(&'a str, &'a T)]) -> Self {
        ModifiersOf {
            flex: masks.flex.map(|modifiers| FlexOf {
                modifiers,
                tensors,
                block_mask: None,
            }),
            ..ModifiersOf::default()
        }
    }
}

impl<T: ?Sized + Values> ModifiersOf<'_, T> {
    /// The kernels' masks for these modifiers, with the causal and document masks.
    pub fn masks(&self, causal: bool, document: bool) -> Masks {
        let masks = Modifier::ALL
            .into_iter()
            .filter(|m| self.gives(*m))
            .fold(Masks::new(causal, document), Masks::with);
        Masks {
            flex: self.flex.map(|f| f.modifiers),
            ..masks
        }
    }

    /// Whether these values include one for `m` (never for the words that take none).
    fn gives(&self, m: Modifier) -> bool {
        let bias = |heads| self.bias.is_some_and(|b| b.heads == heads);
        match m {
            Modifier::Causal | Modifier::Document => false,
            Modifier::Window => self.window.is_some(),
            Modifier::Alibi => self.alibi.is_some(),
            Modifier::Bias => bias(BiasHeads::PerHead),
            Modifier::SharedBias => bias(BiasHeads::Shared),
            Modifier::Softcap => self.softcap.is_some(),
            Modifier::Dropout => self.dropout.is_some(),
            Modifier::Sinks => self.sinks.is_some(),
        }
    }
}
