//! What the fuzz target (`fuzz/`) checks, on the stable toolchain and with a fixed budget
//! so CI runs it: text built from the DSL's own vocabulary, and arbitrary strings, go
//! through parse → lower → compile; any may be refused, none may panic.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

/// The whole path the macro takes, minus token output.
fn describe(text: &str) {
    let Ok(tokens) = text.parse::<proc_macro2::TokenStream>() else {
        return;
    };
    let Ok(description) = syn::parse2::<crate::parse::Description>(tokens) else {
        return;
    };
    let Ok(lowered) = crate::lower::lower(&description) else {
        return;
    };
    let _ = attn_dsl::compile(&lowered.spec);
}

/// Values and punctuation; the keys come from the parser's own list.
const VALUES: &[&str] = &[
    "forward",
    "decode",
    "backward_prep",
    "backward_q",
    "backward_kv",
    "rope",
    "rope_backward",
    "s_major",
    "j_major",
    "head_major",
    "tile",
    "any",
    "causal",
    "document",
    "none",
    "webgpu",
    "native",
    "storage_buffers",
    "workgroup_storage",
    "invocations",
    "f32",
    "scratch",
    "recompute",
    "owned",
    "atomic",
    "o",
    "lse",
    "dq",
    "p_ds",
    "dkv",
    "dk",
    "dv",
    "x",
    "stats",
    "0",
    "1",
    "2",
    "3",
    "4",
    "16",
    "32",
    "64",
    "65",
    "128",
    "256",
    "512",
    "4294967295",
    "99999999999",
    ":",
    ",",
    "=",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "pub",
    "k",
];

fn words() -> Vec<&'static str> {
    crate::parse::KEYS.iter().chain(VALUES).copied().collect()
}

fn soup() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(words()), 0..40)
        .prop_map(|words| format!("pub kernel {{ {} }}", words.join(" ")))
}

/// A valid description with one entry's value swapped for another word.
fn near_miss() -> impl Strategy<Value = String> {
    (0usize..5, prop::sample::select(words())).prop_map(|(slot, word)| {
        let mut values = [
            "forward",
            "s_major(tile = 1)",
            "64",
            "[causal, document]",
            "{ o: owned, lse: owned }",
        ];
        values[slot] = word;
        format!(
            "pub k {{ op: {}, grid: {}, head_dim: {}, masks: {}, writes: {} }}",
            values[0], values[1], values[2], values[3], values[4]
        )
    })
}

proptest! {
    #![proptest_config(Config { cases: 256, rng_seed: RngSeed::Fixed(4), failure_persistence: None, ..Config::default() })]

    #[test]
    fn vocabulary_soup_never_panics(text in soup()) {
        describe(&text);
    }

    #[test]
    fn near_misses_never_panic(text in near_miss()) {
        describe(&text);
    }

    #[test]
    fn arbitrary_text_never_panics(text in ".{0,200}") {
        describe(&text);
    }
}
