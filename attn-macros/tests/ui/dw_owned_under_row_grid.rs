// dW = dyᵀ·x̂ sums over every row, and its index [n, k] has no row: under a row grid every
// row tile's workgroup would write the same elements.
attn_macros::attention_kernel! {
    pub racy_layernorm_weight_grad {
        op: layernorm_linear_weight_grad,
        grid: r_major(tile = 16),
        hidden: 8,
        out: 16,
        writes: { dw: owned, db: atomic },
    }
}

fn main() {}
