//! A block mask made on the device, FlexAttention's `create_block_mask`: a description's
//! `mask_mod` (its tensors and `b` included) evaluated over every block of
//! [`attn_dsl::flex::MASK_BLOCK`] query by key positions, each block written as empty,
//! partial or full. Kernels built with [`attn_dsl::flex::Flex::block_mask`] read it beside
//! their own interval arithmetic: they never visit a block the mask hides entirely, and skip
//! the per-pair test in tiles it shows entirely. Made once per mask and shape (again when
//! the mask's tensors change), passed with every call in `mods.flex`.

use attn_dsl::flex::FlexRef;
use attn_dsl::{KernelSpec, Scalar};

use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::dispatch::record::{Dispatch, Pipeline};
use crate::dispatch::recorder::Record;
use crate::error::{Error, InputError};
pub use crate::modifiers::BlockMaskStates;
use crate::modifiers::{DeviceModifiers, FlexOf};
use crate::tensor::Tensor;

/// The block mask of one `mask_mod` over one shape: its states on the device and the kernel
/// that evaluates them.
pub struct BlockMask {
    states: BlockMaskStates,
    pipeline: Pipeline,
}

impl BlockMask {
    /// The block mask of `flex`'s `mask_mod` over `positions` positions (a forward's
    /// sequence length; a decode's or a continued cache's capacity) of `batch` sequences of
    /// `n_heads` query heads: its kernel compiled and its states allocated now, evaluated
    /// by [`BlockMask::record`].
    pub fn new(
        gpu: &Gpu,
        flex: FlexRef,
        batch: u32,
        n_heads: u32,
        positions: u32,
    ) -> Result<BlockMask, Error> {
        for (name, value) in [
            ("batch", batch),
            ("n_heads", n_heads),
            ("positions", positions),
        ] {
            crate::shape::nonzero(name, value)?;
        }
        let flex = flex.with_block_mask();
        let shape = flex
            .parsed()
            .block_mask_shape(batch, n_heads, positions)
            .ok_or(InputError::Unsupported {
                what: "a block mask of modifiers without a mask_mod",
                needs: "a mask_mod (the kernels' own)",
            })?;
        let blocks = u64::from(shape[2]);
        let masks = u64::from(shape[0]) * u64::from(shape[1]);
        if masks > u16::MAX.into() || blocks > u16::MAX.into() {
            return Err(InputError::OverLimit {
                what: "block mask workgroups (a side of blocks, or sequences · heads)",
                value: masks.max(blocks),
                limit: u16::MAX.into(),
            }
            .into());
        }
        let spec = KernelSpec::block_mask("attention_block_mask", flex);
        let abi = attn_dsl::compile(&spec).map_err(|e| Error::Pipeline {
            kernel: spec.name.clone(),
            message: e.to_string(),
        })?;
        Ok(BlockMask {
            states: BlockMaskStates {
                flex,
                batch,
                n_heads,
                positions,
                states: Tensor::zeros(gpu, &shape, Scalar::U32)?,
            },
            pipeline: Pipeline::new(Kernel::now(gpu, &abi)?),
        })
    }

    /// Records the mask's evaluation with its tensors' values (`tensors`, each declared
    /// tensor by name, as the kernels take them); checked first, nothing recorded when
    /// refused.
    pub fn record(
        &mut self,
        gpu: &Gpu,
        encoder: &mut impl Record,
        tensors: &[(&str, &Tensor)],
    ) -> Result<(), Error> {
        encoder.recorder(|rec| {
            let m = &self.states;
            let mods = DeviceModifiers {
                flex: Some(FlexOf {
                    modifiers: m.flex,
                    tensors,
                    block_mask: None,
                }),
                ..DeviceModifiers::default()
            };
            let abi = self.pipeline.abi();
            mods.validate(abi, m.batch, (m.positions, m.positions), m.n_heads)?;
            let [mask_batch, mask_heads, blocks, _] = m.shape();
            let mut d = Dispatch::new(mods.tensors().collect());
            d.tensors.push(("block_mask", &m.states));
            d.dims = vec![
                ("seq_len", m.positions),
                ("n_heads", m.n_heads),
                ("blocks", blocks),
                ("mask_heads", mask_heads),
                ("batch", m.batch),
                ("mask_batch", mask_batch),
            ];
            let g = super::grid(abi, &d.dims);
            // Checked before the clear: a refused call leaves the states it had.
            let checked = self.pipeline.check(gpu, &d, g)?;
            // The ranges are widened by atomics from nothing.
            m.states.record_clear(rec.encoder());
            self.pipeline.record_checked(rec, checked);
            Ok(())
        })
    }

    /// The mask's states, for the kernels that read it (`mods.flex.block_mask`).
    pub fn states(&self) -> &BlockMaskStates {
        &self.states
    }

    /// The states alone, the kernel dropped: a mask evaluated once and kept.
    pub fn into_states(self) -> BlockMaskStates {
        self.states
    }
}

/// Makes, evaluates (a submission of its own) and hands `uploaded` the block mask of
/// modifiers that ask for one, over `positions` positions of `n_heads` heads; nothing for
/// others.
pub(crate) fn make_block_mask(
    gpu: &crate::device::Gpu,
    uploaded: &mut crate::modifiers::Uploaded,
    n_heads: u32,
    positions: u32,
) -> Result<(), crate::error::Error> {
    let Some((flex, batch)) = uploaded.block_mask_wanted() else {
        return Ok(());
    };
    let mut mask = crate::ops::block_mask::BlockMask::new(gpu, flex, batch, n_heads, positions)?;
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    mask.record(gpu, &mut encoder, &uploaded.flex_tensors())?;
    gpu.queue.submit([encoder.finish()]);
    uploaded.set_block_mask(mask.into_states());
    Ok(())
}
