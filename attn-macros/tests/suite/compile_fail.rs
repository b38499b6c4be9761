//! Descriptions that must not compile, each with its reviewed message in `ui/*.stderr`.
//! Refresh after a deliberate message change with `TRYBUILD=overwrite cargo test -p
//! attn-macros --test suite compile_fail`, then review the diff.

#[test]
fn bad_descriptions_fail_to_compile_with_their_message() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
