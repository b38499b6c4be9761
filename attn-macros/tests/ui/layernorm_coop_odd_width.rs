attn_macros::attention_kernel! {
    /// The tensor-core GEMMs read rows as vec4: widths that are not multiples of 4 are
    /// refused at the grid's `matrix`, naming the scalar products as the way out.
    pub ln_tc {
        op: layernorm_linear,
        grid: r_major(tile = 64, matrix = coop16),
        hidden: 766,
        out: 3072,
        target: native(workgroup_storage = 46080),
        writes: { y: owned, mean: owned, rstd: owned },
    }
}

fn main() {}
