//! Host modifier values uploaded once as device tensors, for the host-slice calls.

use attn_dsl::Scalar;
use attn_dsl::flex::{FlexRef, Ty};

use super::{BiasOf, BlockMaskStates, DeviceModifiers, FlexOf, Modifiers, ModifiersOf};
use crate::device::Gpu;
use crate::tensor::Tensor;

/// The device tensors of a host [`Modifiers`], uploaded once.
pub struct Uploaded {
    alibi: Option<Tensor>,
    bias: Option<Tensor>,
    sinks: Option<Tensor>,
    flex: Vec<(String, Tensor)>,
    /// The modifiers' block mask, where they ask for one.
    block_mask: Option<BlockMaskStates>,
    /// The modifiers and the sequences uploaded for, which a block mask is made for.
    made_for: (Option<FlexRef>, u32),
}

impl Uploaded {
    /// The user-written modifiers' tensors by name, for [`Uploaded::view`].
    pub fn flex_tensors(&self) -> Vec<(&str, &Tensor)> {
        self.flex.iter().map(|(n, t)| (n.as_str(), t)).collect()
    }

    /// The modifiers that ask for a block mask ([`attn_dsl::flex::Flex::block_mask`]),
    /// and the sequences uploaded for: what a block mask for them is made of.
    pub fn block_mask_wanted(&self) -> Option<(FlexRef, u32)> {
        let (flex, batch) = self.made_for;
        flex.filter(|f| f.parsed().block_mask).map(|f| (f, batch))
    }

    /// Gives [`Uploaded::view`] the block mask of these modifiers.
    pub fn set_block_mask(&mut self, states: BlockMaskStates) {
        self.block_mask = Some(states);
    }

    /// `mods` with its slices replaced by these tensors (`flex`: [`Uploaded::flex_tensors`]).
    pub fn view<'a>(
        &'a self,
        mods: &Modifiers<'_>,
        flex: &'a [(&'a str, &'a Tensor)],
    ) -> DeviceModifiers<'a> {
        ModifiersOf {
            window: mods.window,
            alibi: self.alibi.as_ref(),
            bias: mods.bias.zip(self.bias.as_ref()).map(|(b, values)| BiasOf {
                values,
                heads: b.heads,
            }),
            softcap: mods.softcap,
            dropout: mods.dropout,
            sinks: self.sinks.as_ref(),
            flex: mods.flex.map(|f| FlexOf {
                modifiers: f.modifiers,
                tensors: flex,
                block_mask: self.block_mask.as_ref(),
            }),
        }
    }
}

impl<'a> Modifiers<'a> {
    /// The slopes, the sinks and the bias as device tensors (`[n_heads]`, and the bias's
    /// 4-D layout for `q_rows` query rows of `batch` sequences), and the modifiers' tensors
    /// with their `seq` dimensions over `positions` (a forward's rows, a decode's capacity).
    pub fn upload(
        &self,
        gpu: &Gpu,
        batch: u32,
        (q_rows, positions): (u32, u32),
    ) -> Result<Uploaded, crate::error::Error> {
        let per_head = |a: Option<&[f32]>| {
            a.map(|a| Tensor::from_f32(gpu, &[a.len() as u32], Scalar::F32, a))
                .transpose()
        };
        let (alibi, sinks) = (per_head(self.alibi)?, per_head(self.sinks)?);
        let bias = self
            .bias
            .map(|b| {
                let heads = (b.values.len() as u64
                    / (u64::from(batch) * u64::from(q_rows).pow(2)).max(1))
                    as u32;
                Tensor::from_f32(gpu, &[batch, heads, q_rows, q_rows], Scalar::F32, b.values)
            })
            .transpose()?;
        let flex = match self.flex {
            Some(f) => upload_flex(gpu, f, batch, positions)?,
            None => Vec::new(),
        };
        Ok(Uploaded {
            alibi,
            bias,
            sinks,
            flex,
            block_mask: None,
            made_for: (self.flex.map(|f| f.modifiers), batch),
        })
    }
}

/// Each declared tensor of `f` on the device, in its element type and shape (heads from
/// the values' length: the host slices are checked against the dims before any upload).
fn upload_flex(
    gpu: &Gpu,
    f: FlexOf<'_, [f32]>,
    batch: u32,
    positions: u32,
) -> Result<Vec<(String, Tensor)>, crate::error::Error> {
    let flex = f.modifiers.get();
    let mut out = Vec::new();
    for t in &flex.tensors {
        let Some(values) = f.tensor(&t.name) else {
            continue;
        };
        let shape = flat_shape(t, values.len() as u64, batch, positions);
        let tensor = match t.ty {
            Ty::F32 => Tensor::from_f32(gpu, &shape, Scalar::F32, values)?,
            _ => Tensor::from_u32(gpu, &shape, &u32_words(values))?,
        };
        out.push((t.name.clone(), tensor));
    }
    Ok(out)
}

/// A `u32` tensor's host values (whole numbers, checked by `validate`) as its words.
pub(crate) fn u32_words(values: &[f32]) -> Vec<u32> {
    values.iter().map(|&x| x as u32).collect()
}

/// The declared shape of `t`, its head count read off `len` (the host API takes no
/// n_heads here; the length was checked against it).
fn flat_shape(t: &attn_dsl::flex::TensorDecl, len: u64, batch: u32, seq: u32) -> Vec<u32> {
    let others = t.len(batch, 1, seq).max(1);
    let heads = (len / others) as u32;
    t.shape(batch, heads, seq)
}
