//! The LayerNorm + Linear descriptions of docs/layernorm-linear.md expand: ABI, bindings and grid as described.

use attn_macros::attention_kernel;

// The backward in its atomic schedule (the runtime's family holds the two-pass one): two
// kernels, each within WebGPU's default 8 storage buffers.
attention_kernel! {
    pub layernorm_linear_backward_atomic {
        op: layernorm_linear_backward,
        grid: r_major(tile = 16),
        hidden: 768,
        out: 3072,
        writes: { dx: owned, dgamma: atomic, dbeta: atomic },
    }
}

attention_kernel! {
    pub layernorm_linear_weight_grad_atomic {
        op: layernorm_linear_weight_grad,
        grid: r_major(tile = 16),
        hidden: 768,
        out: 3072,
        writes: { dw: atomic, db: atomic },
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
fn the_backward_is_two_portable_kernels_with_their_own_grids() {
    use layernorm_linear_backward_atomic as a;
    use layernorm_linear_weight_grad_atomic as b;
    assert_eq!(a::HEAD_DIM, 768);
    assert_eq!(b::ABI.out_dim, 3072);
    for abi in [&a::ABI, &b::ABI] {
        assert_eq!(abi.target, attn_dsl::Target::Webgpu, "{}", abi.name);
    }
    assert_eq!(a::ABI.storage_buffers(), 7);
    assert_eq!(b::ABI.storage_buffers(), 8);
    assert!(a::ABI.binding("mean").is_none());
    let dw = b::ABI.binding("dw").unwrap();
    assert_eq!(dw.layout.as_ref(), [attn_dsl::Axis::N, attn_dsl::Axis::K]);
    assert!(dw.wgsl_type.contains("atomic"));
    // 74 rows in tiles of 16: one dx block (of up to 64 rows) per tile, then one dγβ
    // workgroup per 64 columns (12); the weight gradient's 64×64 tiles of dW: 48 · 12.
    let dims = a::Dims {
        rows: 74,
        hidden: 768,
        out: 3072,
        n_tiles: 5,
        n_blocks: 5,
        ..Default::default()
    };
    assert_eq!(a::dispatch_grid(&dims), [5, 1 + 12, 1]);
    let dims = b::Dims {
        rows: 74,
        hidden: 768,
        out: 3072,
        n_tiles: 5,
        n_blocks: 5,
        ..Default::default()
    };
    assert_eq!(b::dispatch_grid(&dims), [5, 48 * 12, 1]);
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
