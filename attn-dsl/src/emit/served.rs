//! The queries a split-K decode workgroup serves, for both split passes and the reduce.
//!
//! A sequence adds `rows` query rows (one for a decode step, several to continue a cache:
//! a chat's next turn, a prompt's next chunk, speculative drafts); their K and V are already
//! the last `rows` rows of its cache, so row r sits at position `len - rows + r` and sees
//! the keys up to itself. The rows are packed in Q and O (sequence b's from row
//! `q_starts[b]`, FlashInfer's `qo_indptr`) and laid out densely in the partials, query
//! `r · n_heads + h` of `dims.n_rows · n_heads`. A workgroup serves `TILE` query slots of
//! one KV head, slot `r · q_per_kv() + i` being row r's i-th head of the group, one per
//! vec4 component.

use super::writer::{Fragment, Template};

use crate::spec::KernelSpec;

/// The sequence's rows and the served slots: `sh_seq`, `row_keys`, `Served` and `served`.
pub(super) fn helpers(spec: &KernelSpec) -> Fragment {
    let start = if spec.masks.window {
        "select(0u, pos + 1u - dims.window, pos + 1u > dims.window)"
    } else {
        "0u"
    };
    let (start, end) = super::index::decode_bounds(spec, start, "pos + 1u", "pos");
    let keys_var = match reaches_fixed_end(spec) {
        true => Fragment::from("var<workgroup> sh_keys: array<vec4<u32>, 2>;\n"),
        false => Fragment::default(),
    };
    HELPERS.fill([
        ("keys_var", keys_var),
        ("start", Fragment::from(start)),
        ("end", Fragment::from(end)),
    ])
}

const HELPERS: Template = Template {
    name: "served",
    needs: &[],
    text: r#"// This sequence's cache length, rows added and first packed row of Q and O.
var<workgroup> sh_seq: vec4<u32>;
$keys_var

// The cache slot of this sequence.
fn cache_slot() -> u32 {
    return dims.slot0 + batch;
}

// Keys in this sequence's cache.
fn cache_len() -> u32 {
    return seq_lens[cache_slot()];
}

// The sequence's (cache length, rows added, first row in Q and O), for thread 0 to share.
fn sequence() -> vec4<u32> {
    let start = q_starts[batch];
    return vec4<u32>(cache_len(), q_starts[batch + 1u] - start, start, 0u);
}

// Keys [x, y) the query at position pos sees: the cache's start or its window's, to
// itself.
fn row_keys(pos: u32) -> vec2<u32> {
    return vec2<u32>($start, $end);
}

// The queries a workgroup serves, one per component: their index among the partials'
// queries (row · n_heads + head), head and position; n of them are real.
struct Served {
    q: vec4<u32>,
    h: vec4<u32>,
    pos: vec4<u32>,
    n: u32,
}

// Slots slot0.. of KV head kv_h (slot r · q_per_kv() + i: row r, head kv_h · q_per_kv()
// + i) for a sequence `seq`; slots past its rows repeat its last, and are not real.
fn served(kv_h: u32, slot0: u32, seq: vec4<u32>) -> Served {
    var s: Served;
    let slots = seq.y * q_per_kv();
    s.n = select(0u, min(TILE, slots - slot0), slot0 < slots);
    for (var i = 0u; i < TILE; i = i + 1u) {
        let slot = min(slot0 + i, max(slots, 1u) - 1u);
        let r = slot / q_per_kv();
        s.h[i] = kv_h * q_per_kv() + slot % q_per_kv();
        s.q[i] = r * dims.n_heads + s.h[i];
        s.pos[i] = select(0u, seq.x + r - seq.y, seq.x + r >= seq.y);
    }
    return s;
}

"#,
};

/// The entry's first statements: the sequence and the served slots (`seq`, `kv_h`, `sv`),
/// and the keys the served queries see together, [first, hi) within slice `lo..`; the
/// sequence shared with the block mask's tile test where `spec` reads one.
pub(super) fn prologue(spec: &KernelSpec) -> Fragment {
    let shared_keys = match reaches_fixed_end(spec) {
        true => SHARED_KEYS.plain(),
        false => Fragment::default(),
    };
    PROLOGUE.fill([
        ("shared_keys", shared_keys),
        ("share_batch", super::tiles::share_batch(spec)),
    ])
}

/// Whether `row_keys` reads a mask_mod's end fixed per sequence (`mask_reach_{i}`, which may
/// read `batch` and tensors: not uniform to WGSL's analysis).
fn reaches_fixed_end(spec: &KernelSpec) -> bool {
    !super::index::mask_bounds(spec).reaches.is_empty()
}

/// The served queries' keys made workgroup-uniform through `sh_keys`, where `row_keys`
/// reads a fixed end (the loops' bounds come from them; every invocation computed the same).
const SHARED_KEYS: Template = Template {
    name: "served_shared_keys",
    needs: &[],
    text: r#"if (tid == 0u) {
    sh_keys = array<vec4<u32>, 2>(ks, ke);
}
let keys = workgroupUniformLoad(&sh_keys);
ks = keys[0];
ke = keys[1];
"#,
};

/// [`prologue`]'s statements.
const PROLOGUE: Template = Template {
    name: "served_prologue",
    needs: &[],
    text: r#"batch = wg.z;
let slice = wg.x;
// Workgroup y serves TILE query slots of KV head kv_h.
let groups_per_kv = (dims.n_rows * q_per_kv() + TILE - 1u) / TILE;
let kv_h = wg.y / groups_per_kv;
// The sequence as workgroup-uniform values: the loops below are bounded by them (a
// storage read is not uniform to WGSL's analysis).
if (tid == 0u) {
    sh_seq = sequence();
}
let seq = workgroupUniformLoad(&sh_seq);
let len = seq.x;
q_row0 = seq.z;
let sv = served(kv_h, (wg.y % groups_per_kv) * TILE, seq);
let n_here = sv.n;
let lo = slice * dims.slice_len;
// Each served query's keys; the first and last of them bound the workgroup's (a
// sequence's rows see ever later keys). A slice past them is empty. None lies past the
// cache: a sequence holding fewer rows than it brings (a free slot's one row) sees none.
var ks = vec4<u32>(0u);
var ke = vec4<u32>(0u);
for (var i = 0u; i < TILE; i = i + 1u) {
    let r = row_keys(sv.pos[i]);
    ks[i] = r.x;
    ke[i] = select(r.x, min(r.y, len), i < n_here);
}
$shared_keys
let last = max(n_here, 1u) - 1u;
let hi = max(lo, min(lo + dims.slice_len, ke[last]));
let first = max(lo, ks[0]);
$share_batch
"#,
};

/// The vec4 components that hold the served queries' values, query i in component i.
pub(super) const COMPONENTS: [&str; 4] = ["x", "y", "z", "w"];

/// The WGSL test that served query `i` (component `c`) sees key `j`.
fn sees(i: usize, c: &str, j: &str) -> String {
    format!(
        "{i}u < n_here && {j} >= ks.{c} && {j} < ke.{c} && key_visible(sv.pos.{c}, sv.h.{c}, {j})"
    )
}

/// Served query `i`'s score of key `j` from its dot product (component `i` of the vec4
/// `dot`) into component `i` of `x`, where it sees the key.
pub(super) fn score_head(i: usize, x: &str, j: &str, dot: &str) -> Fragment {
    let c = COMPONENTS[i];
    SCORE_HEAD.fill([
        ("sees", Fragment::from(sees(i, c, j))),
        ("x", Fragment::from(x)),
        ("c", Fragment::from(c)),
        ("j", Fragment::from(j)),
        ("dot", Fragment::from(dot)),
    ])
}

const SCORE_HEAD: Template = Template {
    name: "score_head",
    needs: &[],
    text: r#"if ($sees) {
    $x.$c = score(sv.pos.$c, sv.h.$c, $j, $dot.$c);
}
"#,
};
