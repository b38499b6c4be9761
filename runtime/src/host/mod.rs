//! The host-slice conveniences: host data checked, uploaded, run through the recording
//! ops, read back. For tests, `check`, `attn` and quick experiments; an engine records the
//! ops on its own tensors instead.

pub mod attention;
pub mod backward;
pub mod buffers;
pub mod decode;
pub mod layernorm;
pub mod rope;

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
