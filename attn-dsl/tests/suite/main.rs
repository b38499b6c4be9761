//! attn-dsl's integration tests, one module per subject, in one binary (one link of
//! naga). Run one subject with `cargo test -p attn-dsl --test suite compile`.

mod cache;
mod compile;
mod decode_split;
mod extend;
mod layers;
mod row_layer;
