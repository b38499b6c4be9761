//! attn-macros' integration tests, one module per subject, in one binary. Run one subject
//! with `cargo test -p attn-macros --test suite row_layer`.

mod block_mask;
mod compile_fail;
mod decode_pair;
mod layernorm_coop;
mod row_layer;
