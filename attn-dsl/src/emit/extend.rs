//! A continued cache's chunk (`op: extend`) on the forward's schedule: a query row is its
//! position in the sequence (the masks, ranges and modifiers see positions), stored at
//! `row - first_row` of its sequence's new rows in Q and O; keys are the cache's rows of the
//! sequence's slot, through the block table when paged.
//!
//! With `partials` written instead of O and LSE, the cache is cut into `n_slices` key
//! slices of `slice_len` keys (the grid's third axis is sequence × slice): each workgroup
//! walks its slice only and flushes each row's unnormalized output and (m, l) in split-K
//! decode's record layout, so the decode's reduce merges them (and joins the sinks). A
//! short chunk then fills the GPU as a decode step does, instead of one workgroup per
//! query tile walking the whole cache.

use super::writer::{Fragment, Template, Wgsl, uint};
use crate::spec::{KernelSpec, Op};

/// Whether `spec` is a continued cache's kernel that cuts the keys into slices.
pub(super) fn sliced(spec: &KernelSpec) -> bool {
    spec.op == Op::Extend && spec.write_mode("partials").is_some()
}

/// A row's key range `[start, end)` kept within the workgroup's slice (never ending before
/// it starts, so the range stays monotone in the row).
pub(super) fn clip(start: &str, end: &str) -> (String, String) {
    let start = format!("max({start}, slice_lo)");
    let end = format!("max({start}, min({end}, slice_hi))");
    (start, end)
}

/// The sequence's slot, rows and (sliced) key slice, set by the entry point's
/// `continue_rows()`, and the index functions of Q, K, V, O and the row statistics.
pub(super) fn indexing(out: &mut Wgsl, spec: &KernelSpec) {
    let (qk, v) = match spec.split_dims() {
        true => ("QK_DIM", "V_DIM"),
        false => ("HEAD_DIM", "HEAD_DIM"),
    };
    let (slice_vars, slice_set, slice_range, o_index) = match sliced(spec) {
        true => (
            SLICE_VARS.plain(),
            SLICE_SET.plain(),
            SLICE_RANGE.plain(),
            Fragment::from("return part_base(row, h);"),
        ),
        false => (
            Fragment::default(),
            Fragment::default(),
            Fragment::default(),
            Fragment::from(format!(
                "return ((q_row0 + row - first_row) * dims.n_heads + h) * {v};"
            )),
        ),
    };
    // Sequence b's rows: from q_starts where each has its own count.
    let rows = match spec.grid.ragged {
        true => "q_row0 = q_starts[batch];\nlet n_new = q_starts[batch + 1u] - q_row0;",
        false => "q_row0 = batch * dims.seq_len;\nlet n_new = dims.seq_len;",
    };
    out.put(INDEXING.fill([
        ("rows", Fragment::from(rows)),
        ("slice_vars", slice_vars),
        ("slice_set", slice_set),
        ("slice_range", slice_range),
        ("cache_row", super::cache::cache_row(spec)),
        ("o_index", o_index),
        ("qk", Fragment::from(qk)),
        ("v", Fragment::from(v)),
    ]));
    if sliced(spec) {
        part_base(out, spec);
    }
    if spec.grid.pack_heads {
        out.put(PACKED_HEADS.plain());
    }
}

/// [`indexing`]'s variables and functions: rows `$qk` (Q, K) and `$v` (V, O) wide, a key's
/// cache row by `$cache_row`, an output's offset by `$o_index`, the sequence's rows in Q
/// and O set by `$rows`.
const INDEXING: Template = Template {
    name: "extend_indexing",
    needs: &[],
    text: r#"// The sequence's cache slot, its length with the new rows (keys 0..kv_len), and the
// position of its first new row and that row's index in Q and O; set by the entry point.
var<private> kv_slot: u32;
var<private> kv_len: u32;
var<private> first_row: u32;
var<private> q_row0: u32;
$slice_vars

fn continue_rows() {
    $slice_set
    kv_slot = dims.slot0 + batch;
    kv_len = seq_lens[kv_slot];
    $rows
    first_row = kv_len - min(n_new, kv_len);
    $slice_range
}

fn q_index(row: u32, h: u32) -> u32 {
    return ((q_row0 + row - first_row) * dims.n_heads + h) * $qk;
}

$cache_row

fn key_row(j: u32, kv_h: u32) -> u32 {
    return cache_row(kv_slot, j, kv_h);
}

fn kv_index(j: u32, kv_h: u32) -> u32 {
    return key_row(j, kv_h) * $qk;
}

fn o_index(row: u32, h: u32) -> u32 {
    $o_index
}

fn v_index(j: u32, kv_h: u32) -> u32 {
    return key_row(j, kv_h) * $v;
}

fn row_index(row: u32, h: u32) -> u32 {
    return (q_row0 + row - first_row) * dims.n_heads + h;
}

"#,
};

/// A sliced kernel's key slice, set by `continue_rows()`.
const SLICE_VARS: Template = Template {
    name: "slice_vars",
    needs: &[],
    text: r#"// The workgroup's key slice, keys slice_lo..slice_hi.
var<private> kv_slice: u32;
var<private> slice_lo: u32;
var<private> slice_hi: u32;
"#,
};

/// The slice and the sequence, from the grid's third axis.
const SLICE_SET: Template = Template {
    name: "slice_set",
    needs: &[],
    text: r#"// The grid's third axis is sequence × slice.
kv_slice = batch % dims.n_slices;
batch = batch / dims.n_slices;
"#,
};

/// The slice's keys, once the sequence's length is known.
const SLICE_RANGE: Template = Template {
    name: "slice_range",
    needs: &[],
    text: r#"slice_lo = kv_slice * dims.slice_len;
slice_hi = min(kv_len, slice_lo + dims.slice_len);
"#,
};

const PACKED_HEADS: Template = Template {
    name: "packed_heads",
    needs: &[],
    text: r#"// Packed heads: tile row p is position p / q_per_kv() of query head h + p % q_per_kv(),
// h the first query head of the workgroup's KV head.
fn row_pos(p: u32) -> u32 {
    return p / q_per_kv();
}

fn row_head(p: u32, h: u32) -> u32 {
    return h + p % q_per_kv();
}

"#,
};

/// `part_base(row, h)`: the first f32 of query (row, h)'s record in this slice, laid out
/// as split-K decode's: `[batch, slice, row · n_heads + h]` records of `PART4` vec4s of the
/// unnormalized output, then (m, l, 0, 0).
fn part_base(out: &mut Wgsl, spec: &KernelSpec) {
    out.put(PART_BASE.fill([("part4", uint(spec.v_dim() / 4))]));
}

const PART_BASE: Template = Template {
    name: "part_base",
    needs: &[],
    text: r#"// vec4s of a record's output part.
const PART4: u32 = $part4;

fn part_base(row: u32, h: u32) -> u32 {
    let q = (row - first_row) * dims.n_heads + h;
    let queries = dims.seq_len * dims.n_heads;
    return ((batch * dims.n_slices + kv_slice) * queries + q) * (PART4 + 1u) * 4u;
}

"#,
};

/// The sliced kernel's stores: the output unnormalized into its record (the finish leaves
/// it unscaled), and the row's (m, l) after it, where the forward stores its LSE.
pub(super) fn stores(out: &mut Wgsl) {
    out.put(STORES.plain());
}

const STORES: Template = Template {
    name: "extend_stores",
    needs: &[],
    text: r#"fn store_out(i: u32, x: f32) {
    partials[i >> 2u][i & 3u] = x;
}

fn store_out4(i: u32, x: vec4<f32>) {
    partials[i >> 2u] = x;
}

fn store_lse(row: u32, h: u32, m: f32, l: f32) {
    partials[(part_base(row, h) >> 2u) + PART4] = vec4<f32>(m, l, 0.0, 0.0);
}

"#,
};
