//! A block mask's states on the device, with the modifiers and shape they were made for.

use attn_dsl::flex::FlexRef;

use crate::tensor::Tensor;

/// A block mask's states on the device with what they were made for
/// (`runtime::ops::block_mask::BlockMask` makes them): the kernels built to read a block
/// mask take them in `mods.flex.block_mask`.
pub struct BlockMaskStates {
    pub(crate) flex: FlexRef,
    pub(crate) batch: u32,
    pub(crate) n_heads: u32,
    pub(crate) positions: u32,
    pub(crate) states: Tensor,
}

impl BlockMaskStates {
    /// `[batch or 1, heads or 1, blocks, blocks + 4]`: a sequence (head) axis only where
    /// the mask reads `b` (`h`) ([`attn_dsl::flex::Flex::block_mask_shape`]).
    pub fn shape(&self) -> [u32; 4] {
        let s = self.states.shape();
        [s[0], s[1], s[2], s[3]]
    }

    /// Each query block's row of states ([`attn_dsl::flex::BLOCK_EMPTY`], `_PARTIAL`,
    /// `_FULL`) and its ranges, row-major in [`BlockMaskStates::shape`]: what the kernels
    /// read.
    pub fn tensor(&self) -> &Tensor {
        &self.states
    }

    /// The modifiers it was made from, with the block mask asked for: what the kernels
    /// that read it are built with.
    pub fn modifiers(&self) -> FlexRef {
        self.flex
    }

    /// Whether a kernel with `flex` over `positions` positions of `batch` sequences of
    /// `n_heads` heads reads these states: the same mask_mod and tensors, the same shape.
    pub(super) fn fits(&self, flex: FlexRef, batch: u32, n_heads: u32, positions: u32) -> bool {
        let (mine, theirs) = (self.flex.parsed(), flex.parsed());
        mine.mask_mod == theirs.mask_mod
            && mine.tensors == theirs.tensors
            && theirs.block_mask_shape(batch, n_heads, positions) == Some(self.shape())
            && positions == self.positions
    }
}
