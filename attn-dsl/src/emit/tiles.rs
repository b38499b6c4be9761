//! Block sparsity from the description's `mask_mod`, decided in the kernel: interval
//! arithmetic over the mask bounds what it can be for every (query, key) pair of a tile,
//! so a query-major kernel's key loop steps from one tile that may hold a visible key to
//! the next, and tiles that cannot are never loaded. The test is conservative (whatever
//! the arithmetic cannot bound, a tensor read or a float, may be visible): a skipped tile
//! is one where no pair can be visible. Where the modifiers ask for a block mask made on
//! the device, the answers are narrowed by its blocks (`block_tile`). It reads only the
//! tile's bounds, the head and the sequence (`wg_b`, read once through workgroup memory),
//! which are the same for the whole workgroup, so the loops keep their barriers in uniform
//! control flow.

use super::writer::{Fragment, Template, Wgsl, lines, uint};
use crate::flex::{BinOp, Expr, Func, Kind, Lit};

/// An integer's bounds as two WGSL expressions (inclusive), or unknown.
#[derive(Clone)]
enum Iv {
    Int(String, String),
    /// Whether the value may be true, and whether it may be false.
    Bool(String, String),
    Unknown,
}

struct Lower {
    /// The bindings made so far, one statement each.
    lines: Vec<String>,
    next: usize,
}

impl Lower {
    /// Binds `lo` and `hi` to fresh names.
    fn int(&mut self, lo: String, hi: String) -> Iv {
        let n = self.next;
        self.next += 1;
        self.lines.push(format!("let lo{n} = {lo};"));
        self.lines.push(format!("let hi{n} = {hi};"));
        Iv::Int(format!("lo{n}"), format!("hi{n}"))
    }

    fn bool(&mut self, t: String, f: String) -> Iv {
        let n = self.next;
        self.next += 1;
        self.lines.push(format!("let t{n} = {t};"));
        self.lines.push(format!("let f{n} = {f};"));
        Iv::Bool(format!("t{n}"), format!("f{n}"))
    }

    fn node<S>(&mut self, e: &Expr<S>) -> Iv {
        match &e.kind {
            Kind::Lit(Lit::Int(c)) => Iv::Int(format!("i32({c})"), format!("i32({c})")),
            Kind::Lit(Lit::Bool(x)) => Iv::Bool(x.to_string(), (!x).to_string()),
            Kind::Lit(Lit::Float(_)) => Iv::Unknown,
            Kind::Var(v) => match v.as_str() {
                "q" => Iv::Int("q_lo".into(), "q_hi".into()),
                "k" => Iv::Int("k_lo".into(), "k_hi".into()),
                "h" => Iv::Int("hh".into(), "hh".into()),
                // The sequence is a private variable, which the uniformity analysis does
                // not follow: left unbounded.
                _ => Iv::Unknown,
            },
            Kind::Neg(a) => match self.node(a) {
                Iv::Int(lo, hi) => self.int(format!("-{hi}"), format!("-{lo}")),
                _ => Iv::Unknown,
            },
            Kind::Not(a) => match self.node(a) {
                Iv::Bool(t, f) => Iv::Bool(f, t),
                _ => maybe(),
            },
            Kind::Bin(op, l, r) => {
                let (l, r) = (self.node(l), self.node(r));
                self.binary(*op, l, r)
            }
            Kind::Call(func, args) => {
                let args: Vec<Iv> = args.iter().map(|a| self.node(a)).collect();
                self.call(*func, args)
            }
            // i32 and u32 positions are the same small numbers; floats are not followed.
            Kind::Cast(a, ty) => match (self.node(a), ty) {
                (iv @ Iv::Int(..), crate::flex::Ty::I32 | crate::flex::Ty::U32) => iv,
                (iv @ Iv::Bool(..), crate::flex::Ty::Bool) => iv,
                _ => Iv::Unknown,
            },
            Kind::Index(..) => Iv::Unknown,
            Kind::Let(..) => unreachable!("lets are inlined first"),
        }
    }

    fn binary(&mut self, op: BinOp, l: Iv, r: Iv) -> Iv {
        use BinOp::*;
        match (op, l, r) {
            (And, Iv::Bool(t1, f1), Iv::Bool(t2, f2)) => {
                self.bool(format!("{t1} && {t2}"), format!("{f1} || {f2}"))
            }
            (Or, Iv::Bool(t1, f1), Iv::Bool(t2, f2)) => {
                self.bool(format!("{t1} || {t2}"), format!("{f1} && {f2}"))
            }
            // One side unknown: the known side still decides one way.
            (And, Iv::Bool(t, _), _) | (And, _, Iv::Bool(t, _)) => self.bool(t, "true".into()),
            (Or, Iv::Bool(_, f), _) | (Or, _, Iv::Bool(_, f)) => self.bool("true".into(), f),
            (Add, Iv::Int(a, b), Iv::Int(c, d)) => {
                self.int(format!("{a} + {c}"), format!("{b} + {d}"))
            }
            (Sub, Iv::Int(a, b), Iv::Int(c, d)) => {
                self.int(format!("{a} - {d}"), format!("{b} - {c}"))
            }
            (Mul, Iv::Int(a, b), Iv::Int(c, d)) => {
                let p = [(&a, &c), (&a, &d), (&b, &c), (&b, &d)].map(|(x, y)| format!("{x} * {y}"));
                let fold =
                    |f: &str| format!("{f}({f}({}, {}), {f}({}, {}))", p[0], p[1], p[2], p[3]);
                self.int(fold("min"), fold("max"))
            }
            // Truncating division by a constant is monotone in the dividend.
            (Div, Iv::Int(a, b), Iv::Int(c, d)) if c == d && c != "i32(0)" => {
                let positive = !c.contains('-');
                match positive {
                    true => self.int(format!("{a} / {c}"), format!("{b} / {c}")),
                    false => self.int(format!("{b} / {c}"), format!("{a} / {c}")),
                }
            }
            (op, Iv::Int(a, b), Iv::Int(c, d)) if op.compares() => {
                let (t, f) = match op {
                    Lt => (format!("{a} < {d}"), format!("{b} >= {c}")),
                    Le => (format!("{a} <= {d}"), format!("{b} > {c}")),
                    Gt => (format!("{b} > {c}"), format!("{a} <= {d}")),
                    Ge => (format!("{b} >= {c}"), format!("{a} < {d}")),
                    Eq | Ne => {
                        let overlap = format!("{a} <= {d} && {c} <= {b}");
                        let single = format!("!({a} == {b} && {c} == {d} && {a} == {c})");
                        match op {
                            Eq => (overlap, single),
                            _ => (single, overlap),
                        }
                    }
                    _ => unreachable!("a comparison"),
                };
                self.bool(t, f)
            }
            (op, _, _) if op.compares() || op.logical() => maybe(),
            _ => Iv::Unknown,
        }
    }

    fn call(&mut self, func: Func, args: Vec<Iv>) -> Iv {
        match (func, args.as_slice()) {
            (Func::Min | Func::Max, [Iv::Int(a, b), Iv::Int(c, d)]) => {
                let f = func.name();
                self.int(format!("{f}({a}, {c})"), format!("{f}({b}, {d})"))
            }
            (Func::Clamp, [Iv::Int(a, b), Iv::Int(c, d), Iv::Int(e, g)]) => self.int(
                format!("min(max({a}, {c}), {e})"),
                format!("min(max({b}, {d}), {g})"),
            ),
            (Func::Abs, [Iv::Int(a, b)]) => self.int(
                format!("select(select(0, -{b}, {b} < 0), {a}, {a} >= 0)"),
                format!("max(abs({a}), abs({b}))"),
            ),
            (Func::Select, [_, Iv::Int(a, b), Iv::Int(c, d)]) => {
                self.int(format!("min({a}, {c})"), format!("max({b}, {d})"))
            }
            (Func::Select, [_, Iv::Bool(t1, f1), Iv::Bool(t2, f2)]) => {
                self.bool(format!("{t1} || {t2}"), format!("{f1} || {f2}"))
            }
            (Func::Select, [_, _, _]) if matches!(args[1], Iv::Bool(..)) => maybe(),
            _ => Iv::Unknown,
        }
    }
}

fn maybe() -> Iv {
    Iv::Bool("true".into(), "true".into())
}

/// `mask_tile(q0, q1, k0, k1, h, b)`: whether some pair of the tile (bounds inclusive) may
/// be visible (x) and whether some may be hidden (y); and
/// `next_key_tile(t0, end, q0, q1, h, bc, b)`: the first key tile from `t0` (of `bc` keys)
/// before `end` that may hold a visible key, or `end`, with whether it holds only visible
/// ones (so a loop tests each tile once, a tile ahead).
///
/// A kernel that reads a block mask ([`crate::KernelSpec::reads_block_mask`]) narrows both
/// answers by the blocks the tile covers (`block_tile`); `seq` is the positions' extent,
/// which sets the mask's blocks a side.
pub(super) fn functions<S: Clone>(
    out: &mut Wgsl,
    mask: &Expr<S>,
    spec: &crate::KernelSpec,
    seq: &str,
) {
    let mut l = Lower {
        lines: Vec::new(),
        next: 0,
    };
    let reads = spec.reads_block_mask();
    let blocks = match reads {
        true => " & block_tile(q0, q1, k0, k1, h, b)",
        false => "",
    };
    let (t, f) = match l.node(&mask.inlined()) {
        Iv::Bool(t, f) => (t, f),
        _ => ("true".into(), "true".into()),
    };
    out.put(MASK_TILE.fill([
        ("bounds", lines(l.lines)),
        ("t", Fragment::from(t)),
        ("f", Fragment::from(f)),
        ("blocks", Fragment::from(blocks)),
    ]));
    if reads {
        block_tile(out, mask, seq, block_spans(spec));
    }
}

/// The most mask blocks a run of `len` positions covers: starting at a multiple of `len`
/// (`aligned`) where `len` divides the block or the block divides `len`, else from any
/// position.
fn blocks_spanned(len: u32, aligned: bool) -> u32 {
    let side = crate::flex::MASK_BLOCK;
    match aligned {
        true if side.is_multiple_of(len) => 1,
        true if len.is_multiple_of(side) => len / side,
        _ => (len + side - 2) / side + 1,
    }
}

/// The most blocks of queries and of keys one of `spec`'s tile tests covers, where its
/// tiles fix them: a query-major loop's tile of `tile` rows (at multiples of `tile` but in
/// a continued cache, whose positions follow the cached rows, or with packed heads) against
/// `inner` keys at multiples of `inner`; a key-major loop's `inner` queries against its
/// `tile` keys. `None` for the split-K decode, whose tests span a slice's served queries.
fn block_spans(spec: &crate::KernelSpec) -> Option<(u32, u32)> {
    use crate::Op;
    let (tile, inner) = (spec.grid.tile, spec.grid.flash?.inner);
    match spec.op {
        Op::Forward | Op::BackwardQ => {
            let aligned = !spec.grid.pack_heads;
            Some((blocks_spanned(tile, aligned), blocks_spanned(inner, true)))
        }
        Op::Extend => Some((blocks_spanned(tile, false), blocks_spanned(inner, true))),
        Op::BackwardKv => Some((blocks_spanned(inner, true), blocks_spanned(tile, true))),
        _ => None,
    }
}

/// `mask_tile(q0, q1, k0, k1, h, b)` from the mask's bounds (`$bounds`, binding `$t` and
/// `$f`), and the key loop's step to the next tile that may show a key.
const MASK_TILE: Template = Template {
    name: "mask_tile",
    needs: &[],
    text: r#"// Whether the mask may be true (x) and may be false (y) somewhere on a tile of queries
// [q0, q1] and keys [k0, k1], by interval arithmetic over mask_mod.
fn mask_tile(q0: u32, q1: u32, k0: u32, k1: u32, h: u32, b: u32) -> vec2<bool> {
    let q_lo = i32(q0);
    let q_hi = i32(q1);
    let k_lo = i32(k0);
    let k_hi = i32(k1);
    let hh = i32(h);
    $bounds
    return vec2<bool>($t, $f)$blocks;
}

// The first tile from t0 before `end` that may show a key, or `end`; and (y = 1)
// whether it shows every pair, from the same test.
fn next_key_tile(t0: u32, end: u32, q0: u32, q1: u32, h: u32, bc: u32, b: u32) -> vec2<u32> {
    for (var t = t0; t < end; t = t + 1u) {
        let m = mask_tile(q0, q1, t * bc, t * bc + bc - 1u, h, b);
        if (m.x) {
            return vec2<u32>(t, select(0u, 1u, !m.y));
        }
    }
    return vec2<u32>(end, 0u);
}

"#,
};

/// `block_tile(q0, q1, k0, k1, h, b)`: whether some block of the device's block mask that the
/// tile covers shows a pair (x) and whether some hides one (y). Where the mask reads `b`,
/// the sequence is the workgroup's, read as a uniform value from `sh_batch` (the kernel
/// stores `batch` there before its first tile test: a private variable is not uniform to
/// WGSL's analysis), a vec4 so that every workgroup variable stays a multiple of 16 bytes
/// (the cooperative-matrix areas' boundaries depend on it).
///
/// Where `spans` bounds the blocks a test covers (queries, keys), the test reads each of
/// them once, in straight-line code: on an H200 a tile loop whose test stepped through the
/// blocks in loops ran the prefix-LM forward at 16384 rows 8% slower (docs/flex.md).
fn block_tile<S: Clone>(out: &mut Wgsl, mask: &Expr<S>, seq: &str, spans: Option<(u32, u32)>) {
    let mask = mask.inlined();
    let pick = |var: &str, value: &str, none: &str| match mask.mentions(var) {
        true => Fragment::from(value),
        false => Fragment::from(none),
    };
    let (h, heads) = (pick("h", "h", "0u"), pick("h", "dims.n_heads", "1u"));
    let first_mask = match mask.mentions("b") {
        true => Fragment::from(format!("batch * {}", heads.text)),
        false => Fragment::from("0u"),
    };
    out.put(BLOCK_TILE.fill([
        ("empty", uint(crate::flex::BLOCK_EMPTY)),
        ("full", uint(crate::flex::BLOCK_FULL)),
        ("side", uint(crate::flex::MASK_BLOCK)),
        (
            "shared",
            pick("b", "var<workgroup> sh_batch: vec4<u32>;\n\n", ""),
        ),
        ("seq", Fragment::from(seq)),
        ("b", pick("b", "b", "0u")),
        ("heads", heads),
        ("h", h),
        ("first_mask", first_mask),
        (
            "states",
            spans.map_or_else(|| BLOCK_LOOPS.plain(), block_reads),
        ),
    ]));
}

/// The states of `qs` by `ks` blocks from the tile's first, each index held to the tile's
/// last block (a tile of fewer blocks reads some twice): whether any shows a pair and
/// whether any hides one.
fn block_reads((qs, ks): (u32, u32)) -> Fragment {
    let reads = (0..qs).flat_map(|i| {
        (0..ks).map(move |j| {
            format!(
                "let s_{i}_{j} = block_mask[(base + min(qb + {i}u, q_end)) * (n + 4u) + min(kb + {j}u, k_end)];"
            )
        })
    });
    let states: Vec<String> = (0..qs)
        .flat_map(|i| (0..ks).map(move |j| format!("s_{i}_{j}")))
        .collect();
    let any = |op: &str, state: &str| {
        let terms: Vec<String> = states
            .iter()
            .map(|s| format!("({s} {op} {state})"))
            .collect();
        terms.join(" | ")
    };
    BLOCK_READS.fill([
        ("reads", lines(reads)),
        ("shown", Fragment::from(any("!=", "BLOCK_EMPTY"))),
        ("hidden", Fragment::from(any("!=", "BLOCK_FULL"))),
    ])
}

/// [`block_reads`]' statements, branch-free (`&` and `|` do not short-circuit): a tile
/// that starts past the mask's last block reads that block and shows nothing.
const BLOCK_READS: Template = Template {
    name: "block_reads",
    needs: &[],
    text: r#"let qb = q0 / MASK_BLOCK;
let kb = k0 / MASK_BLOCK;
let inside = (qb <= q_end) & (kb <= k_end);
$reads
return vec2<bool>(inside & ($shown), inside & ($hidden));
"#,
};

/// A test over any number of blocks: each block of the tile in turn.
const BLOCK_LOOPS: Template = Template {
    name: "block_loops",
    needs: &[],
    text: r#"var seen = vec2<bool>(false, false);
for (var qb = q0 / MASK_BLOCK; qb <= q_end; qb = qb + 1u) {
    for (var kb = k0 / MASK_BLOCK; kb <= k_end; kb = kb + 1u) {
        let state = block_mask[(base + qb) * (n + 4u) + kb];
        seen = seen | vec2<bool>(state != BLOCK_EMPTY, state != BLOCK_FULL);
    }
}
return seen;
"#,
};

/// `block_tile` and `block_range`: the device's block mask read for a tile's test and for
/// its range.
const BLOCK_TILE: Template = Template {
    name: "block_tile",
    needs: &[],
    text: r#"// The block mask's states, as `op: block_mask` writes them.
const BLOCK_EMPTY: u32 = $empty;
const BLOCK_FULL: u32 = $full;
const MASK_BLOCK: u32 = $side;

$shared
fn block_tile(q0: u32, q1: u32, k0: u32, k1: u32, h: u32, b: u32) -> vec2<bool> {
    let n = ($seq + MASK_BLOCK - 1u) / MASK_BLOCK;
    let base = ($b * $heads + $h) * n;
    let q_end = min(q1 / MASK_BLOCK, n - 1u);
    let k_end = min(k1 / MASK_BLOCK, n - 1u);
    $states
}

// A tile's range (x..y) narrowed to the blocks the block mask shows from its positions
// p0..p1: word 0 after a block row's states holds the keys its queries see (n - first block,
// last block + 1; 0, 0 for none), word 2 the queries that see its keys. Called by one
// invocation (it reads `batch`); every head where the mask reads `h`.
fn block_range(r: vec4<u32>, p0: u32, p1: u32, word: u32) -> vec4<u32> {
    let n = ($seq + MASK_BLOCK - 1u) / MASK_BLOCK;
    var lo = n;
    var hi = 0u;
    let m0 = $first_mask;
    for (var m = m0; m < m0 + $heads; m = m + 1u) {
        for (var p = p0 / MASK_BLOCK; p <= min(p1 / MASK_BLOCK, n - 1u); p = p + 1u) {
            let at = (m * n + p) * (n + 4u) + n + word;
            lo = min(lo, n - block_mask[at]);
            hi = max(hi, block_mask[at + 1u]);
        }
    }
    let x = max(r.x, lo * MASK_BLOCK);
    return vec4<u32>(x, max(x, min(r.y, hi * MASK_BLOCK)), r.z, r.w);
}

"#,
};

/// The statements that give a kernel's tile tests the workgroup's sequence as a uniform
/// value, `wg_b`, before its first test (a private variable is not uniform to WGSL's
/// analysis): read once through workgroup memory where the block mask has a sequence axis,
/// 0 where the tests do not read it; empty where `spec` tests no tiles.
pub(super) fn share_batch(spec: &crate::KernelSpec) -> Fragment {
    let by_sequence = spec
        .flex()
        .and_then(|f| f.mask_mod)
        .is_some_and(|m| m.inlined().mentions("b"));
    match (sparse(spec), spec.reads_block_mask() && by_sequence) {
        (false, _) => Fragment::default(),
        (true, false) => Fragment::from("let wg_b = 0u;\n"),
        (true, true) => SHARE_BATCH.plain(),
    }
}

/// [`share_batch`] where the block mask has a sequence axis.
const SHARE_BATCH: Template = Template {
    name: "share_batch",
    needs: &[],
    text: r#"if (tid == 0u) {
    sh_batch = vec4<u32>(batch);
}
let wg_b = workgroupUniformLoad(&sh_batch).x;
"#,
};

/// Whether `spec`'s loops may skip tiles: it has a mask_mod to bound that its key ranges
/// do not already hold exactly (those loops visit only the range's tiles).
pub(super) fn sparse(spec: &crate::KernelSpec) -> bool {
    spec.tests_mask_pairs()
}

/// `next_block(it0, end, k0, k1, h0, group, first, blocks, b)`: a key-major kernel's first
/// step from `it0` (steps walk query blocks of BC rows from the last, `group` heads from `h0` each)
/// before `end` whose block may see a key of [k0, k1], or `end`, and (y = 1) whether the
/// mask shows every pair of that block; `shown(q, h, k, full)`, a pair's visibility in a
/// block known full or not, the mask asked only where it is not.
pub(super) fn block_functions(out: &mut Wgsl) {
    out.put(NEXT_BLOCK.plain());
}

/// A key-major kernel's visibility of the pair (`q`, `col`) of head `h`: with a mask_mod
/// whose blocks it steps by ([`block_functions`]), the mask asked only in a block the
/// tile test did not find full (`tile_full`).
pub(super) fn key_major_visible(sparse: bool, q: &str, col: &str) -> String {
    match sparse {
        true => format!("shown({q}, h, {col}, tile_full)"),
        false => format!("visible({q}, h, {col})"),
    }
}

const NEXT_BLOCK: Template = Template {
    name: "next_block",
    needs: &[],
    text: r#"fn next_block(it0: u32, end: u32, k0: u32, k1: u32, h0: u32, group: u32, first: u32, blocks: u32, b: u32) -> vec2<u32> {
    for (var it = it0; it < end; it = it + 1u) {
        let s0 = (first + blocks - 1u - it / group) * BC;
        let m = mask_tile(s0, min(s0 + BC, dims.seq_len) - 1u, k0, k1, h0 + it % group, b);
        if (m.x) {
            return vec2<u32>(it, select(0u, 1u, !m.y));
        }
    }
    return vec2<u32>(end, 0u);
}

// Within the row's key range, the mask's test unless the block is full.
fn shown(q: u32, h: u32, k: u32, full: bool) -> bool {
    let range = key_range(q);
    return k >= range.x && k < range.y && (full || key_visible(q, h, k));
}

"#,
};

/// A query-major kernel's loop over key tiles `kt` (of `BC` keys, from the uniform
/// `range`, up to `kt_end`), and how its prefetch names the first and the next tile: every
/// tile in order, or with a mask_mod only those that may hold a visible key.
pub(super) struct KeyLoop {
    /// Statements before the first prefetch.
    pub pre: Fragment,
    /// The first tile's first key.
    pub first: &'static str,
    /// `for (..) {` and the statements that open the body (at the body's indentation
    /// relative to the `for`).
    pub head: Fragment,
    /// Whether a next tile exists, and its first key.
    pub has_next: &'static str,
    pub next: &'static str,
    /// Whether `head` sets `tile_full`: the mask holds for every pair of the tile, whose
    /// pair tests are skipped ([`visibility`]).
    pub full_tiles: bool,
    /// Tiles from the first to the last visited, counted from `range.x / BC`: equal to
    /// `kt + 1u - range.x / BC` on the last one (where a kernel flushes its sums).
    pub steps: &'static str,
}

impl KeyLoop {
    /// `allowed`: whether the kernel's loop may skip tiles (not where state alternates by
    /// the tile's parity).
    pub fn of(spec: &crate::KernelSpec, allowed: bool) -> KeyLoop {
        match allowed && sparse(spec) {
            false => KeyLoop {
                pre: Fragment::default(),
                first: "(range.x / BC) * BC",
                head: Fragment::from("for (var kt = range.x / BC; kt < kt_end; kt = kt + 1u) {\n"),
                has_next: "kt + 1u < kt_end",
                next: "j0 + BC",
                steps: "kt_end - range.x / BC",
                full_tiles: false,
            },
            true => KeyLoop {
                pre: share_batch(spec).then(first_tile(spec)),
                first: "kt_first * BC",
                head: SPARSE_HEAD.fill([("q0", Fragment::from(first_query(spec)))]),
                has_next: "kt_next < kt_end",
                next: "kt_next * BC",
                steps: "select(kt_end - range.x / BC, kt + 1u - range.x / BC, kt_next >= kt_end)",
                full_tiles: true,
            },
        }
    }
}

/// The tile's first query position (with packed heads its rows are a KV head's group of
/// rows; a mask reading `h` is not packed).
fn first_query(spec: &crate::KernelSpec) -> &'static str {
    match spec.grid.pack_heads {
        true => "q_first",
        false => "row0",
    }
}

/// The tile's query positions (a continued cache's end after its cached rows) and the
/// first tile that may show a key.
fn first_tile(spec: &crate::KernelSpec) -> Fragment {
    let bounds = match spec.op {
        crate::Op::Extend if spec.grid.pack_heads => {
            "let q_first = row_pos(row0);\n\
             let q_last = row_pos(min(row0 + BR, kv_len * q_per_kv()) - 1u);\n"
        }
        crate::Op::Extend => "let q_last = min(row0 + BR, kv_len) - 1u;\n",
        _ => "let q_last = min(row0 + BR, dims.seq_len) - 1u;\n",
    };
    SPARSE_PRE.fill([
        ("bounds", Fragment::from(bounds)),
        ("q0", Fragment::from(first_query(spec))),
    ])
}

/// A sparse loop's first tile, found before the loop, and whether it is full.
const SPARSE_PRE: Template = Template {
    name: "sparse_pre",
    needs: &[],
    text: r#"$bounds
let first_tile = next_key_tile(range.x / BC, kt_end, $q0, q_last, h, BC, wg_b);
let kt_first = first_tile.x;
var kt_next = kt_first;
var full_next = first_tile.y != 0u;
"#,
};

/// A sparse loop's head: the tile found by the previous step, and the next one found now.
const SPARSE_HEAD: Template = Template {
    name: "sparse_head",
    needs: &[],
    text: r#"for (var kt = kt_first; kt < kt_end; kt = kt_next) {
    let tile_full = full_next;
    let tile_next = next_key_tile(kt + 1u, kt_end, $q0, q_last, h, BC, wg_b);
    kt_next = tile_next.x;
    full_next = tile_next.y != 0u;
"#,
};

/// A pair of a tile: `v` names its visibility, `range` its key-range test, and the mask is
/// asked at (`row`, `j`).
pub(super) struct Pair {
    pub v: String,
    pub range: String,
    pub row: String,
    pub j: String,
}

/// Statements for `pairs`, each pair's `before`, its visibility and its `after`. Where a
/// loop's tiles may be full (`full_tiles`), the mask is asked about a tile's pairs under one
/// uniform branch, taken only where the tile is not full, which sets one bit per hidden pair
/// (`tile_hid_{word}`); each visibility is then its range test and its bit. A mask that
/// reads tensors loads nothing in a full tile, and nothing but a few words lives across the
/// branch: on an H200 (2026-12-01) the tensor-core forward with a prefix-LM block mask at
/// 16384 rows took 9.64 ms this way against 9.97 with a boolean per pair set under the
/// branch (docs/flex.md).
pub(super) fn visibility(
    pairs: &[Pair],
    h: &str,
    full_tiles: bool,
    before: impl Fn(usize) -> Vec<String>,
    after: impl Fn(usize) -> Vec<String>,
) -> Fragment {
    let test = |p: &Pair| format!("key_visible({}, {h}, {})", p.row, p.j);
    if !full_tiles {
        return lines(pairs.iter().enumerate().flat_map(|(i, p)| {
            let v = format!("let {} = {} && {};", p.v, p.range, test(p));
            before(i).into_iter().chain([v]).chain(after(i))
        }));
    }
    let bit = |i: usize| (i / 32, 1u32 << (i % 32));
    let words: Vec<usize> = (0..pairs.len().div_ceil(32)).collect();
    let hidden = words.iter().map(|w| {
        let bits: Vec<String> = (32 * w..pairs.len().min(32 * w + 32))
            .map(|i| format!("select(0u, {}u, !{})", bit(i).1, test(&pairs[i])))
            .collect();
        format!("tile_hid_{w} = {};", bits.join(" | "))
    });
    let each = pairs.iter().enumerate().flat_map(|(i, p)| {
        let (w, b) = bit(i);
        let v = format!("let {} = {} && (tile_hid_{w} & {b}u) == 0u;", p.v, p.range);
        [v].into_iter().chain(after(i))
    });
    PAIR_TESTS.fill([
        ("before", lines((0..pairs.len()).flat_map(before))),
        (
            "words",
            lines(words.iter().map(|w| format!("var tile_hid_{w} = 0u;"))),
        ),
        ("hidden", lines(hidden)),
        ("each", lines(each)),
    ])
}

/// [`visibility`] in a loop whose tiles may be full.
const PAIR_TESTS: Template = Template {
    name: "pair_tests",
    needs: &[],
    text: r#"$before
$words
if (!tile_full) {
    $hidden
}
$each
"#,
};

#[cfg(test)]
mod tests {
    use super::{Pair, blocks_spanned, visibility};
    use crate::flex::MASK_BLOCK;

    /// A tile's pairs past 32 take a second word of hidden bits, each pair its own bit, and
    /// every mask test sits under the one branch of a tile that is not full.
    #[test]
    fn pair_tests_set_one_bit_per_pair() {
        let pairs: Vec<Pair> = (0..40)
            .map(|i| Pair {
                v: format!("v_{i}"),
                range: format!("r_{i}"),
                row: "row".into(),
                j: format!("j_{i}"),
            })
            .collect();
        let text = visibility(&pairs, "h", true, |_| Vec::new(), |_| Vec::new()).text;
        let (head, rest) = text.split_once("if (!tile_full) {").expect("one branch");
        let (branch, tail) = rest.split_once("\n}\n").expect("the branch closes");
        assert_eq!(head.trim(), "var tile_hid_0 = 0u;\nvar tile_hid_1 = 0u;");
        assert_eq!(branch.matches("key_visible(").count(), 40);
        assert!(branch.contains("select(0u, 2147483648u, !key_visible(row, h, j_31))"));
        assert!(branch.contains("tile_hid_1 = select(0u, 1u, !key_visible(row, h, j_32))"));
        assert!(tail.contains("let v_33 = r_33 && (tile_hid_1 & 2u) == 0u;"));
        assert!(!tail.contains("key_visible("));
    }

    /// Every run of `len` positions (from a multiple of `len` where aligned, from anywhere
    /// else) covers at most `blocks_spanned` mask blocks, and some run covers that many.
    #[test]
    fn blocks_spanned_bounds_every_run() {
        for len in 1..=300u32 {
            for aligned in [true, false] {
                let bound = blocks_spanned(len, aligned);
                let step = if aligned { len } else { 1 };
                let most = (0..8 * MASK_BLOCK)
                    .step_by(step as usize)
                    .map(|s| (s + len - 1) / MASK_BLOCK - s / MASK_BLOCK + 1)
                    .max()
                    .unwrap();
                assert!(
                    most <= bound,
                    "len {len} aligned {aligned}: {most} > {bound}"
                );
                let tight =
                    aligned && (MASK_BLOCK.is_multiple_of(len) || len.is_multiple_of(MASK_BLOCK));
                if tight || !aligned {
                    assert_eq!(most, bound, "len {len} aligned {aligned}");
                }
            }
        }
    }

    /// The flash kernels that read a block mask test a tile by straight-line reads of the
    /// blocks it spans (as many as its tile can: two query blocks for a 128-row tile of 32
    /// keys); the split-K decode, whose tests span its served queries, by loops.
    #[test]
    fn tile_tests_read_the_blocks_their_tiles_span() {
        use crate::{Dtype, KernelSpec, Masks, Op, WriteMode, configs};
        let documents = crate::flex::library::preset("documents").expect("a preset");
        let masks = Masks {
            flex: Some(documents.intern()),
            ..Masks::default()
        };
        let wgsl = |spec: &KernelSpec| crate::compile(spec).expect("compiles").wgsl.to_string();
        let reads = |text: &str| text.matches("= block_mask[(base + min(qb + ").count();
        let bytes = configs::CANDIDATE_WORKGROUP_BYTES;
        let wide = *configs::coop_forward_in(128, bytes, Dtype::F16)
            .iter()
            .find(|c| c.tile == 128 && c.inner == 32)
            .expect("the 128-row tile at head_dim 128");
        let coop = KernelSpec {
            dtype: Dtype::F16,
            ..KernelSpec::flash("f", Op::Forward, 128, masks, wide)
        };
        assert_eq!(reads(&wgsl(&coop)), 2);
        let scalar = configs::forward(64)[0];
        let expected =
            super::blocks_spanned(scalar.tile, true) * super::blocks_spanned(scalar.inner, true);
        let forward = wgsl(&KernelSpec::flash("f", Op::Forward, 64, masks, scalar));
        assert_eq!(reads(&forward), expected as usize);
        for text in [&wgsl(&coop), &forward] {
            assert!(!text.contains("for (var qb"));
        }
        let mut decode = KernelSpec::standard("d", Op::DecodeSplit, 64, masks);
        for (_, mode) in &mut decode.writes {
            *mode = WriteMode::ScratchFlush;
        }
        let decode = wgsl(&decode);
        assert!(decode.contains("for (var qb = q0 / MASK_BLOCK; qb <= q_end; qb = qb + 1u) {"));
        assert_eq!(reads(&decode), 0);
    }
}
