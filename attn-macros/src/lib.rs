//! `attention_kernel!`: describe an attention kernel's dataflow; get WGSL validated by naga
//! during expansion, and a module of Rust bindings that match it.
//!
//! ```text
//! attention_kernel! {
//!     /// Causal forward with document masking.
//!     pub attention_forward {
//!         op: forward,
//!         grid: s_major(tile = 1),
//!         head_dim: 64,
//!         masks: [causal, document],
//!         writes: { o: owned, lse: owned },
//!     }
//! }
//! ```
//!
//! (A runnable copy of this lives in `examples/custom-head-dim`.) The generated module refers to `::wgpu`, `::bytemuck` and `::attn_dsl`, so a crate that
//! uses the macro depends on those three.

mod flex;
mod generate;
mod lower;
mod parse;
#[cfg(test)]
mod robustness;
#[cfg(test)]
mod snapshots;

use proc_macro::TokenStream;

/// Expands one kernel description into a module; see the crate docs for the syntax.
#[proc_macro]
pub fn attention_kernel(input: TokenStream) -> TokenStream {
    expand(input.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// The whole expansion, on proc_macro2 types so that tests can drive it.
fn expand(input: proc_macro2::TokenStream) -> syn::Result<proc_macro2::TokenStream> {
    let description: parse::Description = syn::parse2(input)?;
    let mut out = proc_macro2::TokenStream::new();
    for d in description.per_head_dim()? {
        out.extend(expand_one(&d)?);
    }
    Ok(out)
}

/// The module of one description with one head_dim.
fn expand_one(description: &parse::Description) -> syn::Result<proc_macro2::TokenStream> {
    let lowered = lower::lower(description)?;
    let abi = attn_dsl::compile(&lowered.spec).map_err(|e| lowered.error(e))?;
    // What the description implies (an f32 forward's backward, a split pass's reduce) must
    // fit its target too: refused here, not where the runtime first records it.
    if lowered.spec.dtype == attn_dsl::Dtype::F32 {
        for implied in attn_dsl::implied::kernels(&lowered.spec) {
            attn_dsl::compile(&implied).map_err(|e| lowered.implied_error(&implied, e))?;
        }
    }
    // Atomic scatter comes in two variants from one description: the portable
    // compare-exchange loop (`ABI`) and native f32 atomics (`ABI_F32_ATOMIC`).
    let native = if lowered.spec.has_atomics() {
        let spec = attn_dsl::KernelSpec {
            scatter: attn_dsl::Scatter::F32Atomic,
            ..lowered.spec.clone()
        };
        Some(attn_dsl::compile(&spec).map_err(|e| lowered.error(e))?)
    } else {
        None
    };
    let contract = generate::scratch_contract(&lowered, &abi);
    Ok(generate::module(
        description,
        &abi,
        native.as_ref(),
        contract,
    ))
}
