//! A row layer described on tensor cores: `matrix = coop16` on the `r_major` grid, under a
//! native target, lowers to cooperative-matrix GEMMs.

attn_macros::attention_kernel! {
    pub ln_tc {
        op: layernorm_linear,
        grid: r_major(tile = 64, matrix = coop16),
        hidden: 768,
        out: 3072,
        target: native(workgroup_storage = 46080),
        writes: { y: owned, mean: owned, rstd: owned },
    }
}

#[test]
fn a_row_layer_on_tensor_cores_multiplies_with_cooperative_matrices() {
    assert_eq!(ln_tc::ABI.grid.matrix, attn_dsl::Matrix::Coop16);
    assert!(ln_tc::ABI.wgsl.contains("coopMultiplyAdd"));
    assert!(ln_tc::ABI.wgsl.contains("array<vec4<f32>>"));
}
