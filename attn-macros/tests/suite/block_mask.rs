//! A description that asks for a block mask made on the device: the forward binds it after
//! its tensors and narrows its tile tests by it; a mask whose key ranges are exact has no
//! tile test to narrow, and binds none.

use attn_macros::attention_kernel;

attention_kernel! {
    pub prefix_lm_blocks {
        op: forward,
        grid: s_major(flash),
        head_dim: 64,
        tensors: { prefix: [batch] u32 },
        mask_mod: |b, _h, q, k| k <= q || k < prefix[b] as i32,
        block_mask: device,
        writes: { o: owned, lse: owned },
    }
}

attention_kernel! {
    pub window_blocks {
        op: forward,
        grid: s_major(flash),
        head_dim: 64,
        mask_mod: |_b, _h, q, k| k <= q && q - k < 64,
        block_mask: device,
        writes: { o: owned, lse: owned },
    }
}

#[test]
fn the_forward_reads_its_block_mask_where_it_tests_tiles() {
    let names: Vec<&str> = prefix_lm_blocks::ABI
        .bindings
        .iter()
        .map(|b| b.name.as_ref())
        .collect();
    assert_eq!(names[names.len() - 2..], ["prefix", "block_mask"]);
    assert!(prefix_lm_blocks::WGSL.contains("& block_tile("));
    let flex = prefix_lm_blocks::ABI.masks.flex.unwrap().get();
    assert!(flex.block_mask);
    assert!(window_blocks::ABI.binding("block_mask").is_none());
}
