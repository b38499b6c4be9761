//! The LayerNorm + Linear descriptions of docs/layernorm-linear.md expand: ABI, bindings and grid as described.

use attn_macros::attention_kernel;

attention_kernel! {
    pub layernorm_linear_backward {
        op: layernorm_linear_backward,
        grid: r_major(tile = 16),
        hidden: 768,
        out: 3072,
        target: native(storage_buffers = 12),
        writes: { dx: owned, dgamma: scratch, dbeta: scratch, dw: scratch, db: scratch },
    }
}

attention_kernel! {
    pub layernorm_linear_seed {
        op: layernorm_linear,
        grid: r_major(tile = 4),
        hidden: 8,
        out: 16,
        writes: { y: owned, mean: owned, rstd: owned },
    }
}

#[test]
fn the_backward_binds_partials_per_row_tile_and_spreads_dw_over_grid_rows() {
    use layernorm_linear_backward as k;
    assert_eq!(k::HEAD_DIM, 768);
    assert_eq!(k::ABI.out_dim, 3072);
    let dw = k::ABI.binding("dw").unwrap();
    assert_eq!(
        dw.layout.as_ref(),
        [
            attn_dsl::Axis::RowTile,
            attn_dsl::Axis::N,
            attn_dsl::Axis::K
        ]
    );
    assert_eq!(k::ABI.storage_buffers(), 12);
    // 74 rows in tiles of 16; one dx block (of up to 64 rows) per tile, then one
    // workgroup per 64×64 tile of dW: 48 · 12.
    let grid = k::dispatch_grid(&k::Dims {
        rows: 74,
        hidden: 768,
        out: 3072,
        n_tiles: 5,
        n_blocks: 5,
        ..Default::default()
    });
    assert_eq!(grid, [5, 1 + 48 * 12, 1]);
}

#[test]
fn the_seed_forward_is_portable() {
    use layernorm_linear_seed as k;
    assert_eq!(k::ABI.target, attn_dsl::Target::Webgpu);
    assert_eq!(k::ABI.storage_buffers(), 8);
    assert!(k::WGSL.contains("fn tile_stats"));
}

attention_kernel! {
    pub layernorm_linear_reduce_seed {
        op: layernorm_linear_reduce,
        grid: elementwise,
        hidden: 8,
        out: 16,
        writes: { dgamma: owned, dbeta: owned, dw: owned, db: owned },
    }
}

#[test]
fn the_reduce_owns_every_element_of_the_four_sums() {
    use layernorm_linear_reduce_seed as k;
    assert_eq!(k::ABI.storage_buffers(), 8);
    let grid = k::dispatch_grid(&k::Dims {
        rows: 74,
        hidden: 8,
        out: 16,
        n_tiles: 5,
        n_blocks: 5,
        ..Default::default()
    });
    // dγ, dβ (8 each), dW (8·16) and db (16), 256 per workgroup.
    assert_eq!(grid, [(2 * 8 + 8 * 16 + 16u32).div_ceil(256), 1, 1]);
}
