//! What dispatch binds and sets from the modifier values: their tensors by binding name,
//! the `dims` and `params` fields they fill.

use super::{DeviceModifiers, ModifiersOf, Values};
use crate::tensor::Tensor;

impl<'a> DeviceModifiers<'a> {
    /// The modifiers' tensors by binding name.
    pub(crate) fn tensors(&self) -> impl Iterator<Item = (&'a str, &'a Tensor)> + use<'a> {
        let flex = self.flex.map_or(&[][..], |f| f.tensors);
        let blocks = self.flex.and_then(|f| f.block_mask).map(|m| m.tensor());
        [
            ("alibi", self.alibi),
            ("bias", self.bias.map(|b| b.values)),
            ("sinks", self.sinks),
            ("block_mask", blocks),
        ]
        .into_iter()
        .filter_map(|(n, t)| t.map(|t| (n, t)))
        .chain(flex.iter().copied())
    }
}

impl<T: ?Sized + Values> ModifiersOf<'_, T> {
    /// The `dims` fields these modifiers set.
    pub(crate) fn dims(&self) -> [(&'static str, u32); 5] {
        let d = self.dropout;
        [
            ("window", self.window.unwrap_or(0)),
            ("seed_lo", d.map_or(0, |d| d.seed as u32)),
            ("seed_hi", d.map_or(0, |d| (d.seed >> 32) as u32)),
            ("rng_offset", d.map_or(0, |d| d.offset)),
            ("drop_threshold", d.map_or(0, |d| d.threshold())),
        ]
    }

    /// The `params` fields these modifiers set.
    pub(crate) fn params(&self) -> [(&'static str, f32); 2] {
        [
            ("softcap", self.softcap.unwrap_or(0.0)),
            (
                "dropout_scale",
                self.dropout.map_or(1.0, |d| d.keep_scale()),
            ),
        ]
    }
}
