//! Index helpers and mask predicates shared by every op that pairs query rows with key
//! rows. One definition of "query `s` sees key `j`" serves both majors, so the s-major and
//! j-major kernels of one backward can never disagree about the mask.

use super::writer::{Fragment, Template, Wgsl};

use crate::flex::bounds::{KeyBounds, key_bounds};
use crate::spec::{Gqa, KernelSpec, Op};

pub(super) fn kv_head(out: &mut Wgsl, spec: &KernelSpec) {
    let q_per_kv = match spec.gqa {
        Gqa::Any => "dims.n_heads / dims.n_kv_heads".to_string(),
        Gqa::Ratio(r) => format!("{r}u"),
    };
    out.put(KV_HEAD.fill([("q_per_kv", Fragment::from(q_per_kv))]));
}

/// GQA's head map: `$q_per_kv` query heads share each KV head.
const KV_HEAD: Template = Template {
    name: "kv_head",
    needs: &[],
    text: r#"// GQA: query heads h share KV head h / (n_heads / n_kv_heads).
fn q_per_kv() -> u32 {
    return $q_per_kv;
}

fn kv_head(h: u32) -> u32 {
    return h / q_per_kv();
}

"#,
};

/// Row-major `[b, row, head, d]` and `[b, j, kv_head, d]` offsets (for decode, the query is
/// `[b, head, d]` and the cache `[b, capacity, kv_head, d]`), and the `[b, row, head]` offset
/// of a row's statistics. `batch` is the sequence the workgroup works on. Q and K rows
/// (`q_index`, `kv_index`) are `head_dim` wide, O and V rows (`o_index`, `v_index`)
/// `head_dim_v` wide.
pub(super) fn row_indexing(out: &mut Wgsl, spec: &KernelSpec) {
    if spec.op == Op::Extend {
        return super::extend::indexing(out, spec);
    }
    let (q_rows, kv_rows) = match spec.op {
        Op::Decode => ("1u", "dims.capacity"),
        _ => ("dims.seq_len", "dims.seq_len"),
    };
    let (qk, v) = match spec.split_dims() {
        true => ("QK_DIM", "V_DIM"),
        false => ("HEAD_DIM", "HEAD_DIM"),
    };
    out.put(ROW_INDEXING.fill([
        ("q_rows", Fragment::from(q_rows)),
        ("kv_rows", Fragment::from(kv_rows)),
        ("qk", Fragment::from(qk)),
        ("v", Fragment::from(v)),
    ]));
}

/// [`row_indexing`]'s functions: `$q_rows` query rows and `$kv_rows` key rows a sequence,
/// rows `$qk` (Q, K) and `$v` (V, O) wide.
const ROW_INDEXING: Template = Template {
    name: "row_indexing",
    needs: &[],
    text: r#"fn q_index(row: u32, h: u32) -> u32 {
    return ((batch * $q_rows + row) * dims.n_heads + h) * $qk;
}

fn kv_index(j: u32, kv_h: u32) -> u32 {
    return ((batch * $kv_rows + j) * dims.n_kv_heads + kv_h) * $qk;
}

fn o_index(row: u32, h: u32) -> u32 {
    return ((batch * $q_rows + row) * dims.n_heads + h) * $v;
}

fn v_index(j: u32, kv_h: u32) -> u32 {
    return ((batch * $kv_rows + j) * dims.n_kv_heads + kv_h) * $v;
}

fn row_index(row: u32, h: u32) -> u32 {
    return (batch * $q_rows + row) * dims.n_heads + h;
}

"#,
};

/// The end of the rows a forward-like kernel walks, as positions: the sequence's length,
/// or a continued cache's length with its new rows.
pub(super) fn rows_end(spec: &KernelSpec) -> &'static str {
    match spec.op {
        Op::Extend => "kv_len",
        _ => "dims.seq_len",
    }
}

/// The first row of a query tile: the position tile · BR, after a continued cache's rows;
/// with packed heads, the pair tile · BR after the cached rows' pairs.
pub(super) fn tile_origin(spec: &KernelSpec) -> &'static str {
    match spec.op {
        Op::Extend if spec.grid.pack_heads => "first_row * q_per_kv() + tile * BR",
        Op::Extend => "first_row + tile * BR",
        _ => "tile * BR",
    }
}

/// The end of the rows a query tile holds: [`rows_end`], or with packed heads the pairs
/// before it.
pub(super) fn tile_rows_end(spec: &KernelSpec) -> &'static str {
    match spec.grid.pack_heads {
        true => "kv_len * q_per_kv()",
        false => rows_end(spec),
    }
}

/// The position of a tile's `row`, and its query head given the workgroup's `h` (with
/// packed heads, the group's first): the row and `h` themselves unless heads are packed.
pub(super) fn row_at(spec: &KernelSpec, row: &str, h: &str) -> (String, String) {
    match spec.grid.pack_heads {
        true => (format!("row_pos({row})"), format!("row_head({row}, {h})")),
        false => (row.to_string(), h.to_string()),
    }
}

/// Which of attention's two row widths a tensor has.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Row {
    /// Q, K and their gradients: `head_dim`.
    Qk,
    /// V, O, dO and dV: `head_dim_v`.
    V,
}

/// The test that column `c` (a WGSL expression, the first of a vec4 where `c` steps by 4)
/// lies within a `row` of its tensor; `None` where that row fills the kernel's width.
pub(super) fn within(spec: &KernelSpec, row: Row, c: &str) -> Option<String> {
    let dim = match row {
        Row::Qk => spec.head_dim,
        Row::V => spec.v_dim(),
    };
    (spec.split_dims() && dim < spec.width()).then(|| match row {
        Row::Qk => format!("{c} < QK_DIM"),
        Row::V => format!("{c} < V_DIM"),
    })
}

/// The rows a staging loop reads, by the index function of their tensor.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Rows {
    Q,
    K,
    V,
    /// O and dO.
    O,
}

impl Rows {
    /// The flat index of row `r` of head `h` (a KV head for K and V).
    pub(super) fn index(self, r: &str, h: &str) -> String {
        let f = match self {
            Rows::Q => "q_index",
            Rows::K => "kv_index",
            Rows::V => "v_index",
            Rows::O => "o_index",
        };
        format!("{f}({r}, {h})")
    }

    pub(super) fn row(self) -> Row {
        match self {
            Rows::Q | Rows::K => Row::Qk,
            Rows::V | Rows::O => Row::V,
        }
    }
}

/// `cond && (c within row)`, or `cond` where the row fills the kernel's width.
pub(super) fn and_within(spec: &KernelSpec, cond: &str, row: Row, c: &str) -> String {
    match within(spec, row, c) {
        Some(w) => format!("{cond} && {w}"),
        None => cond.to_string(),
    }
}

/// `key_range(s)`: the keys query `s` may see, `[start, end)`; `key_visible(s, h, j)`: the
/// test within it; `query_range(j)` and `visible(s, h, j)`: the same mask seen from a key.
/// With documents, `seg` holds each row's document start and end, so both ranges are
/// exact and tiles outside a document are never visited, causal or not.
pub(super) fn masks(out: &mut Wgsl, spec: &KernelSpec) {
    // A continued cache's new rows (`op: extend` with causal) see every cached key and are
    // causal among themselves; without causal, each sees the whole cache (a cascade's
    // queries over their shared prefix).
    let causal = spec.masks.causal;
    let document = spec.masks.document;
    if document {
        out.put(DOCUMENTS.plain());
    }
    let window = spec.masks.window;
    let doc_or = |doc: &'static str, none: &'static str| if document { doc } else { none };
    let mut start = doc_or("doc_start(row)", "0u").to_string();
    let mut end = if causal {
        "row + 1u".to_string()
    } else {
        doc_or("doc_end(row)", rows_end(spec)).to_string()
    };
    let mut q_start = match causal {
        true => "col".to_string(),
        false => doc_or("doc_start(col)", "0u").to_string(),
    };
    let mut q_end = doc_or("doc_end(col)", rows_end(spec)).to_string();
    if window {
        // Keys (s - W, s] with causal, (s - W, s + W) without: both ends move with the
        // row, so the ranges stay monotone and tiles outside every window are skipped.
        start = format!("max({start}, window_back(row))");
        q_end = format!("min({q_end}, col + dims.window)");
        if !causal {
            end = format!("min({end}, row + dims.window)");
            q_start = format!("max({q_start}, window_back(col))");
        }
        out.put(WINDOW_BACK.plain());
    }
    if super::extend::sliced(spec) {
        (start, end) = super::extend::clip(&start, &end);
    }
    let b = mask_bounds(spec);
    let key = bounded(&start, &end, &starts(&b, "row"), &ends(&b, "row"));
    let query = bounded(&q_start, &q_end, &first_queries(&b), &last_queries(&b));
    out.put(RANGES.fill([("key", key), ("query", query)]));
    key_visible(out, spec);
    super::scores::helpers(out, spec, true);
}

/// Each row's document, `[start, end)`, from `seg`.
const DOCUMENTS: Template = Template {
    name: "documents",
    needs: &[],
    text: r#"fn doc_start(row: u32) -> u32 {
    return seg[batch * dims.seq_len + row];
}

fn doc_end(row: u32) -> u32 {
    return seg[(dims.batch + batch) * dims.seq_len + row];
}

"#,
};

const WINDOW_BACK: Template = Template {
    name: "window_back",
    needs: &[],
    text: r#"// The first position within the window of `row`: row + 1 - W, or 0.
fn window_back(row: u32) -> u32 {
    return select(0u, row + 1u - dims.window, row + 1u > dims.window);
}

"#,
};

/// The mask seen from a query (`$key`: its keys) and from a key (`$query`: its queries).
const RANGES: Template = Template {
    name: "ranges",
    needs: &[],
    text: r#"fn key_range(row: u32) -> vec2<u32> {
    $key
}

fn visible(row: u32, h: u32, j: u32) -> bool {
    let range = key_range(row);
    return j >= range.x && j < range.y && key_visible(row, h, j);
}

fn query_range(col: u32) -> vec2<u32> {
    $query
}

"#,
};

/// The key bounds of the description's `mask_mod` ([`crate::flex::bounds`]): none
/// without one.
pub(super) fn mask_bounds(spec: &KernelSpec) -> KeyBounds {
    spec.flex()
        .and_then(|f| f.mask_mod)
        .map(|m| key_bounds(&m))
        .unwrap_or_default()
}

/// `u32(max(pos + o, 0))`: a bound at offset `o` from a position, clamped at the first.
pub(super) fn at(pos: &str, o: i64) -> String {
    match o {
        0 => format!("u32(max(i32({pos}), 0))"),
        o if o > 0 => format!("u32(max(i32({pos}) + {o}, 0))"),
        o => format!("u32(max(i32({pos}) - {}, 0))", o.unsigned_abs()),
    }
}

/// The first keys the mask's bounds let a query at `pos` see, one per lower bound.
fn starts(b: &KeyBounds, pos: &str) -> Vec<String> {
    b.starts.iter().map(|o| at(pos, *o)).collect()
}

/// The ends of the keys the mask's bounds let a query at `pos` see, one per upper bound:
/// a reach's end is the larger of the query's own and the sequence's fixed one
/// (`mask_reach_{i}`, [`super::flex`]).
fn ends(b: &KeyBounds, pos: &str) -> Vec<String> {
    let own = b.ends.iter().map(|o| at(pos, *o));
    let reaches = b
        .reaches
        .iter()
        .enumerate()
        .map(|(i, r)| format!("max({}, u32(max(mask_reach_{i}(), 0)))", at(pos, r.offset)));
    own.chain(reaches).collect()
}

/// Seen from a key `col`, the first query each upper bound lets see it: every query below
/// a reach's fixed end.
fn first_queries(b: &KeyBounds) -> Vec<String> {
    let own = b.ends.iter().map(|o| at("col", 1 - o));
    let reaches = b.reaches.iter().enumerate().map(|(i, r)| {
        format!(
            "select({}, 0u, i32(col) < mask_reach_{i}())",
            at("col", 1 - r.offset)
        )
    });
    own.chain(reaches).collect()
}

/// Seen from a key `col`, the end of the queries each lower bound lets see it.
fn last_queries(b: &KeyBounds) -> Vec<String> {
    b.starts.iter().map(|o| at("col", 1 - o)).collect()
}

/// The body of a range function: `[start, end)` narrowed by `lows` (starts) and `highs`
/// (ends); never ending before it starts, nor starting past `end`. Without lows or highs
/// the range as it was.
fn bounded(start: &str, end: &str, lows: &[String], highs: &[String]) -> Fragment {
    if lows.is_empty() && highs.is_empty() {
        return Fragment::from(format!("return vec2<u32>({start}, {end});"));
    }
    let s = match lows.is_empty() {
        true => start.to_string(),
        false => format!("min({}, {end})", narrow(start, "max", lows)),
    };
    NARROWED.fill([
        ("s", Fragment::from(s)),
        ("e", Fragment::from(narrow(end, "min", highs))),
    ])
}

/// A range function's body narrowed by the bounds: start `$s`, end `$e`.
const NARROWED: Template = Template {
    name: "narrowed_range",
    needs: &[],
    text: r#"// Narrowed by mask_mod's bounds, which move with the position.
let s = $s;
return vec2<u32>(s, max(s, $e));
"#,
};

/// `base` narrowed by each of `bounds` through `op` (`max` for starts, `min` for ends).
fn narrow(base: &str, op: &str, bounds: &[String]) -> String {
    bounds
        .iter()
        .fold(base.to_string(), |acc, b| format!("{op}({acc}, {b})"))
}

/// A decode row's first key and end, `start` and `len` narrowed by the mask_mod's bounds
/// at the row's position `pos`; the end never before the start.
pub(super) fn decode_bounds(
    spec: &KernelSpec,
    start: &str,
    len: &str,
    pos: &str,
) -> (String, String) {
    let b = mask_bounds(spec);
    let s = narrow(start, "max", &starts(&b, pos));
    let ends = ends(&b, pos);
    let e = narrow(len, "min", &ends);
    match ends.is_empty() {
        true => (s, e),
        false => (s.clone(), format!("max({e}, min({s}, {len}))")),
    }
}

/// `key_visible(row, h, j)`: the test within a row's key range, the description's
/// `mask_mod` where it has one that the range does not already hold.
pub(super) fn key_visible(out: &mut Wgsl, spec: &KernelSpec) {
    let test = if spec.tests_mask_pairs() {
        "mask_mod(row, h, j)"
    } else {
        "true"
    };
    out.put(KEY_VISIBLE.fill([("test", Fragment::from(test))]));
}

const KEY_VISIBLE: Template = Template {
    name: "key_visible",
    needs: &[],
    text: r#"fn key_visible(row: u32, h: u32, j: u32) -> bool {
    return $test;
}

"#,
};
