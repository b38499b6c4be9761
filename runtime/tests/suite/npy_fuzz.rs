//! The `.npy` reader under malformed files, with a fixed budget so CI runs it: headers
//! built from the format's own vocabulary (versions, header lengths, `descr`, `fortran_order`,
//! shapes with huge, negative, nested and non-integer dims), then mutated byte by byte, with
//! data of any length. Every file may be refused; none may panic or allocate what it does
//! not hold (a refusal names the file).

use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use runtime::harness::npy;

const DESCRS: &[&str] = &[
    "'<f4'", "'<f2'", "'<u2'", "'<u4'", "'<i4'", "'|u1'", "'>f4'", "'<f8'", "'<c8'", "'x'", "3", "",
];
const ORDERS: &[&str] = &["False", "True", "0", "'no'", ""];
const DIMS: &[&str] = &[
    "0",
    "1",
    "2",
    "3",
    "7",
    "65536",
    "4294967296",
    "9223372036854775808",
    "18446744073709551617",
    "-1",
    "1e9",
    "x",
    "(2, 3)",
    "2L",
    "",
];

/// A header dictionary from pieces of the vocabulary.
fn header() -> impl Strategy<Value = String> {
    (
        prop::sample::select(DESCRS),
        prop::sample::select(ORDERS),
        prop::collection::vec(prop::sample::select(DIMS), 0..5),
        any::<bool>(),
    )
        .prop_map(|(descr, order, dims, trailing)| {
            let comma = if trailing || dims.len() == 1 { "," } else { "" };
            format!(
                "{{'descr': {descr}, 'fortran_order': {order}, 'shape': ({}{comma}), }}",
                dims.join(", ")
            )
        })
}

/// Edits of a header: a byte replaced, removed or inserted at a position.
fn mutate(text: &str, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    let mut bytes = text.as_bytes().to_vec();
    for (at, kind, byte) in edits {
        let at = at % (bytes.len() + 1);
        match kind % 4 {
            0 if at < bytes.len() => bytes[at] = *byte,
            1 if at < bytes.len() => {
                bytes.remove(at);
            }
            2 => bytes.insert(at, *byte),
            _ => {}
        }
    }
    bytes
}

/// The file: magic, a version, a declared header length (right, or any), the header padded
/// with spaces and a newline as numpy pads it, then `data` bytes.
fn file(version: u8, declared: Option<u32>, header: &[u8], data: usize) -> Vec<u8> {
    let mut out = b"\x93NUMPY".to_vec();
    out.push(version);
    out.push(0);
    let mut h = header.to_vec();
    while !(h.len() + 11).is_multiple_of(64) {
        h.push(b' ');
    }
    h.push(b'\n');
    let len = declared.unwrap_or(h.len() as u32);
    match version {
        1 => out.extend((len as u16).to_le_bytes()),
        _ => out.extend(len.to_le_bytes()),
    }
    out.extend(h);
    out.extend((0..data).map(|i| i as u8));
    out
}

fn read_all(path: &Path) {
    let _ = npy::read_f32(path, &[1, 2, 3, 4]);
    let _ = npy::read_float(path, &[1, 2, 3, 4, 5]);
    let _ = npy::read_indices(path);
}

proptest! {
    #![proptest_config(Config {
        cases: 2048,
        rng_seed: RngSeed::Fixed(47),
        failure_persistence: None,
        ..Config::default()
    })]

    /// No malformed file makes a reader panic.
    #[test]
    fn malformed_npy_files_are_refused_not_panicked_on(
        header in header(),
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..3),
        version in prop::sample::select(vec![1u8, 2, 3, 9]),
        declared in prop::option::weighted(0.2, any::<u32>()),
        data in 0usize..96,
    ) {
        let dir = std::env::temp_dir().join(format!("npy-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.npy");
        std::fs::write(&path, file(version, declared, &mutate(&header, &edits), data)).unwrap();
        read_all(&path);
    }
}
