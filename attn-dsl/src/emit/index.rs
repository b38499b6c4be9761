//! Index helpers and mask predicates shared by every op that pairs query rows with key
//! rows. One definition of "query `s` sees key `j`" serves both majors, so the s-major and
//! j-major kernels of one backward can never disagree about the mask.

use std::fmt::Write;

use crate::spec::{Gqa, KernelSpec};

pub(super) fn kv_head(out: &mut String, spec: &KernelSpec) {
    let _ = writeln!(
        out,
        "// GQA: query heads h share KV head h / (n_heads / n_kv_heads)."
    );
    let _ = writeln!(
        out,
        "fn q_per_kv() -> u32 {{\n    return {};\n}}\n",
        match spec.gqa {
            Gqa::Any => "dims.n_heads / dims.n_kv_heads".to_string(),
            Gqa::Ratio(r) => format!("{r}u"),
        }
    );
    out.push_str("fn kv_head(h: u32) -> u32 {\n    return h / q_per_kv();\n}\n\n");
}

/// Row-major `[row, head, d]` and `[j, kv_head, d]` offsets.
pub(super) fn row_indexing(out: &mut String) {
    out.push_str(
        r#"fn q_index(row: u32, h: u32) -> u32 {
    return (row * dims.n_heads + h) * HEAD_DIM;
}

fn kv_index(j: u32, kv_h: u32) -> u32 {
    return (j * dims.n_kv_heads + kv_h) * HEAD_DIM;
}

"#,
    );
}

/// `key_range(s)`: the keys query `s` may see, `[start, end)`; `key_visible(s, j)`: the
/// test within it; `query_range(j)` and `visible(s, j)`: the same mask seen from a key.
pub(super) fn masks(out: &mut String, spec: &KernelSpec) {
    let (causal, document) = (spec.masks.causal, spec.masks.document);
    let start = if document { "seg[row]" } else { "0u" };
    let end = if causal { "row + 1u" } else { "dims.seq_len" };
    // With causal on, [seg[s], s] is exactly the row's document; without it, keys past the
    // document's end are cut by comparing document starts.
    let within = if document && !causal {
        "seg[j] == seg[row]"
    } else {
        "true"
    };
    let q_start = match (causal, document) {
        (true, _) => "col",
        (false, true) => "seg[col]",
        (false, false) => "0u",
    };
    let _ = write!(
        out,
        r#"fn key_range(row: u32) -> vec2<u32> {{
    return vec2<u32>({start}, {end});
}}

fn key_visible(row: u32, j: u32) -> bool {{
    return {within};
}}

fn visible(row: u32, j: u32) -> bool {{
    let range = key_range(row);
    return j >= range.x && j < range.y && key_visible(row, j);
}}

fn query_range(col: u32) -> vec2<u32> {{
    return vec2<u32>({q_start}, dims.seq_len);
}}

"#
    );
}
