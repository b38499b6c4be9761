//! The runtime's integration tests, one module per subject, in one binary: each test
//! binary links wgpu and naga, so one link where there were fourteen, and the tests run on
//! all cores at once. Run one subject with `cargo test -p runtime --test suite device_api`.

mod backward;
mod bad_input;
mod bench;
mod block_mask;
mod block_mask_props;
mod cache_model;
mod cascade;
mod decode_split;
mod device_api;
mod doc_links;
mod flag_fuzz;
mod flex_bounds;
mod flex_grads;
mod generated;
mod gpu_kernels;
mod layernorm;
mod layers;
mod long_rows;
mod merge;
mod non_finite;
mod npy_fuzz;
mod parity_tool;
mod properties;
mod sum;
mod tool_refusals;
