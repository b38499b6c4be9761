//! A description that asks for a block mask made on the device: the forward binds it after
//! its tensors and narrows its tile tests by it; a mask whose key ranges are exact has no
//! tile test to narrow, and binds none (prefix-LM's among them: its keys end at the larger
//! of the query's own end and `prefix[b]`).

use attn_macros::attention_kernel;

attention_kernel! {
    pub documents_blocks {
        op: forward,
        grid: s_major(flash),
        head_dim: 64,
        tensors: { doc: [batch, seq] u32 },
        mask_mod: |b, _h, q, k| k <= q && doc[b][q] == doc[b][k],
        block_mask: device,
        writes: { o: owned, lse: owned },
    }
}

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
    let names: Vec<&str> = documents_blocks::ABI
        .bindings
        .iter()
        .map(|b| b.name.as_ref())
        .collect();
    assert_eq!(names[names.len() - 2..], ["doc", "block_mask"]);
    assert!(documents_blocks::WGSL.contains("& block_tile("));
    let flex = documents_blocks::ABI.masks.flex.unwrap().get();
    assert!(flex.block_mask);
    // Prefix-LM's keys are a range that reaches `prefix[b]`, as the window's is a range.
    for abi in [&window_blocks::ABI, &prefix_lm_blocks::ABI] {
        assert!(abi.binding("block_mask").is_none());
    }
    assert!(prefix_lm_blocks::WGSL.contains("fn mask_reach_0() -> i32"));
}
