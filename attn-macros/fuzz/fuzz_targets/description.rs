//! Fuzzes the description parser: arbitrary text through the macro's own `parse` and
//! `lower` (compiled here as plain modules, without the proc-macro shell) and on into
//! attn-dsl's checks, emitter and naga. Any input may be refused; none may panic.
//!
//! Run: `cargo install cargo-fuzz`, then from attn-macros/: `cargo +nightly fuzz run description`.

#![no_main]

// Only the parsing half of these modules is used here; the rest serves the macro.
#[allow(dead_code)]
#[path = "../../src/lower.rs"]
mod lower;
#[allow(dead_code)]
#[path = "../../src/parse.rs"]
mod parse;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(tokens) = text.parse::<proc_macro2::TokenStream>() else { return };
    let Ok(description) = syn::parse2::<parse::Description>(tokens) else { return };
    let Ok(lowered) = lower::lower(&description) else { return };
    let _ = attn_dsl::compile(&lowered.spec);
});
