//! The flash forward: a workgroup owns a tile of query rows, stages K and V a block of keys
//! at a time in workgroup memory with coalesced vec4 loads, and each invocation keeps its
//! scores and output rows in registers (named, fully unrolled, so that no driver has to
//! guess whether a private array may live in registers). The softmax runs online per row.
//!
//! Key blocks wholly outside every row's visible range are never visited (causal blocks
//! above the diagonal, blocks before the document start); blocks that some row of the tile
//! sees only in part are masked element by element.

use super::numerics::Helper;
use super::writer::{Fragment, Wgsl};
use std::fmt::Write;

use super::index::{Row, Rows, and_within, within};
use super::numerics::dot_loop;
use crate::layout::tiling::Tiling;
use crate::spec::KernelSpec;

/// One generated register name per (row, column) of an invocation's block.
pub(super) fn regs(rows: u32, cols: u32) -> impl Iterator<Item = (u32, u32)> {
    (0..rows).flat_map(move |i| (0..cols).map(move |n| (i, n)))
}

pub(super) fn constants(out: &mut Wgsl, t: &Tiling) {
    let _ = write!(
        out,
        "// Flash tiling: BR query rows per workgroup, BC keys per staged block; row groups of\n\
         // TX invocations, TM rows each.\n\
         const BR: u32 = {}u;\nconst BC: u32 = {}u;\nconst TM: u32 = {}u;\nconst TX: u32 = {}u;\n\
         const D4: u32 = {}u;\n\
         // Padded strides: a vec4 per staged row and a float per P row spread rows over banks.\n\
         const ROW4: u32 = {}u;\nconst PSTRIDE: u32 = {}u;\n\n",
        t.br,
        t.bc,
        t.tm,
        t.tx,
        t.d4,
        t.row4,
        t.bc + 1
    );
}

pub(super) fn workgroup_memory(out: &mut Wgsl, t: &Tiling) {
    let _ = write!(
        out,
        r#"var<workgroup> sh_q: array<vec4<f32>, {q}>;
// K, then V, of the current key block.
var<workgroup> sh_kv: array<vec4<f32>, {kv}>;
var<workgroup> sh_p: array<f32, {p}>;
// One slot per (row, invocation of its group) for the row reductions.
var<workgroup> sh_red: array<f32, {red}>;
// The tile's keys: x..y holds every visible key; z..w is visible to every row.
var<workgroup> sh_range: vec4<u32>;

"#,
        q = t.br * t.row4,
        kv = t.bc * t.row4,
        p = t.br * (t.bc + 1),
        red = t.br * t.tx,
    );
    if t.subgroups {
        out.push_str(
            "// Nonzero when some row group is not inside one subgroup: reduce through sh_red.\n\
             var<workgroup> sh_subgroups_off: atomic<u32>;\n\n",
        );
    }
}

/// Staging loops, the tile's key range and the row reductions of the forward.
pub(super) fn helpers(out: &mut Wgsl, spec: &KernelSpec, t: &Tiling) {
    stage(out, spec, "stage_q", Rows::Q, "sh_q", "query_at");
    fetch(out, spec, "k", Rows::K, "key_at");
    fetch(out, spec, "v", Rows::V, "value_at");
    put(out, "kv", "BC", "sh_kv");
    tile_key_range(out, spec);
    out.push_str(ROW_REDUCTIONS);
    if t.subgroups {
        subgroup_reductions(out, t.tx);
    }
}

/// Butterflies over the `tx` invocations of a row group, and the test that they may run:
/// the row group must sit in one subgroup at consecutive invocation ids. Vulkan does not
/// promise that layout, and subgroup sizes run from 4 to 128, so each workgroup checks.
fn subgroup_reductions(out: &mut Wgsl, tx: u32) {
    let _ = write!(
        out,
        "fn subgroups_cover_row_groups(tid: u32, sg_size: u32, sg_id: u32) -> bool {{\n    \
         return sg_size >= TX && WG % sg_size == 0u && sg_id == tid % sg_size;\n}}\n\n"
    );
    type Combine = fn(&str) -> String;
    let ops: [(&str, Combine); 2] = [
        ("group_max", |x| format!("max(y, {x})")),
        ("group_sum", |x| format!("y + {x}")),
    ];
    for (name, op) in ops {
        let _ = write!(out, "fn {name}(x: f32) -> f32 {{\n    var y = x;\n");
        let mut mask = 1;
        while mask < tx {
            let shuffled = format!("subgroupShuffleXor(y, {mask}u)");
            let _ = writeln!(out, "    y = {};", op(&shuffled));
            mask *= 2;
        }
        out.push_str("    return y;\n}\n\n");
    }
}

/// `tile_key_range(row0)`: x..y holds every key a row of the tile sees, z..w the keys every
/// row of it sees (empty when the rows' ranges do not overlap).
pub(super) fn tile_key_range(out: &mut Wgsl, spec: &KernelSpec) {
    let end = super::index::tile_rows_end(spec);
    let first = super::index::row_at(spec, "row0", "0u").0;
    let last = super::index::row_at(spec, &format!("min(row0 + BR, {end}) - 1u"), "0u").0;
    let range = "vec4<u32>(first.x, last.y, last.x, first.y)";
    // Narrowed to the keys the block mask shows from the tile's query blocks.
    let ret = match spec.reads_block_mask() {
        true => format!("block_range({range}, {first}, {last}, 0u)"),
        false => range.to_string(),
    };
    let _ = write!(
        out,
        r#"// key_range is monotone in the row (document starts and ends never decrease, causal
// ends grow), so the first and last rows of the tile bound every row's range.
fn tile_key_range(row0: u32) -> vec4<u32> {{
    let first = key_range({first});
    let last = key_range({last});
    return {ret};
}}

"#,
    );
}

const ROW_REDUCTIONS: &str = r#"fn row_max(r: u32) -> f32 {
    var x = sh_red[r * TX];
    for (var i = 1u; i < TX; i = i + 1u) {
        x = max(x, sh_red[r * TX + i]);
    }
    return x;
}

fn row_sum(r: u32) -> f32 {
    var x = sh_red[r * TX];
    for (var i = 1u; i < TX; i = i + 1u) {
        x = x + sh_red[r * TX + i];
    }
    return x;
}

"#;

/// `fetch_{name}(r0, h, e)`: vec4 `e` of the block of `rows` rows from r0 (zeros past the
/// sequence), loaded into registers a phase ahead of its use so that its latency hides
/// behind the products; `put_{name}(e, x)` stores it into `dst`.
pub(super) fn fetch(out: &mut Wgsl, spec: &KernelSpec, name: &str, of: Rows, src: &str) {
    let _ = write!(
        out,
        r#"fn fetch_{name}(r0: u32, h: u32, e: u32) -> vec4<f32> {{
    let r = r0 + e / D4;
    let c4 = e % D4;
    var x = vec4<f32>(0.0);
    if ({cond}) {{
        let i = {index} + c4 * 4u;
        x = {};
    }}
    return x;
}}

"#,
        vec4_at(src),
        cond = and_within(
            spec,
            &format!("e < BC * D4 && r < {}", super::index::rows_end(spec)),
            of.row(),
            "c4 * 4u"
        ),
        index = of.index("r", "h"),
    );
}

/// The vec4 at flat index `i` of `src`: an array, or an accessor function (`key_at`,
/// whose vec4 form `key4_at` loads in the tensor's dtype).
fn vec4_at(src: &str) -> String {
    if let Some(stem) = src.strip_suffix("_at") {
        return format!("{stem}4_at(i)");
    }
    let read = |k: u32| match src.ends_with("_at") {
        true => format!("{src}(i + {k}u)"),
        false => format!("{src}[i + {k}u]"),
    };
    format!(
        "vec4<f32>({}, {}, {}, {})",
        read(0),
        read(1),
        read(2),
        read(3)
    )
}

/// `put_{name}(e, x)`: stores a fetched vec4 `e` of a block of `rows` rows into `dst`.
pub(super) fn put(out: &mut Wgsl, name: &str, rows: &str, dst: &str) {
    let _ = write!(
        out,
        r#"fn put_{name}(e: u32, x: vec4<f32>) {{
    if (e < {rows} * D4) {{
        {dst}[(e / D4) * ROW4 + e % D4] = x;
    }}
}}

"#
    );
}

/// How many vec4s of a `rows`-row block each invocation carries.
pub(super) fn carried(t: &Tiling, rows: u32) -> u32 {
    (rows * t.d4).div_ceil(t.groups * t.tx)
}

/// One statement per carried vec4 `i`, each on its own line at indent `ind`.
pub(super) fn per_vec4(n: u32, ind: &str, stmt: impl Fn(u32) -> String) -> String {
    (0..n).map(|i| format!("{ind}{}\n", stmt(i))).collect()
}

/// `name(r0, h, tid)`: `rows` rows from r0 (zeros past the sequence) into `dst`, one vec4 per
/// invocation per step, consecutive invocations on consecutive addresses.
pub(super) fn stage(out: &mut Wgsl, spec: &KernelSpec, name: &str, of: Rows, dst: &str, src: &str) {
    let _ = write!(
        out,
        r#"fn {name}(r0: u32, h: u32, tid: u32) {{
    for (var e = tid; e < BR * D4; e = e + WG) {{
        let r = r0 + e / D4;
        let c4 = e % D4;
        var x = vec4<f32>(0.0);
        if ({cond}) {{
            let i = {index} + c4 * 4u;
            x = {};
        }}
        {dst}[(e / D4) * ROW4 + c4] = x;
    }}
}}

"#,
        vec4_at(src),
        cond = and_within(
            spec,
            &format!("r < {}", super::index::rows_end(spec)),
            of.row(),
            "c4 * 4u"
        ),
        index = of.index("r", "h"),
    );
}

pub(super) fn forward_body(out: &mut Wgsl, spec: &KernelSpec, t: &Tiling) {
    let end = super::index::rows_end(spec);
    let (tm, tn, dn) = (t.tm, t.tn, t.dn);
    let mut b = String::new();
    let (params, reset) = match t.subgroups {
        true => (
            ", sg_size: u32, sg_id: u32",
            "\n        atomicStore(&sh_subgroups_off, 0u);",
        ),
        false => ("", ""),
    };
    let _ = write!(
        b,
        "fn flash_forward(tile: u32, h: u32, tid: u32{params}) {{\n    let kv_h = kv_head(h);\n    \
         let g = tid / TX;\n    let tx = tid % TX;\n    let row0 = {origin};\n    \
         if (tid == 0u) {{\n        sh_range = tile_key_range(row0);{reset}\n    }}\n    \
         stage_q(row0, h, tid);\n",
        origin = super::index::tile_origin(spec),
    );
    for i in 0..tm {
        let _ = write!(
            b,
            "    let row_{i} = row0 + g * TM + {i}u;\n    var lo_{i} = 0u;\n    var hi_{i} = 0u;\n    \
             if (row_{i} < {end}) {{\n        let range = key_range(row_{i});\n        \
             lo_{i} = range.x;\n        hi_{i} = range.y;\n    }}\n    var m_{i} = NEG_BIG;\n    \
             var l_{i} = 0.0;\n    var lc_{i} = 0.0;\n"
        );
        for n in 0..dn {
            let _ = writeln!(b, "    var acc_{i}_{n} = vec4<f32>(0.0);");
        }
    }
    b.push_str("    let range = workgroupUniformLoad(&sh_range);\n");
    if t.subgroups {
        b.push_str(
            "    if (!subgroups_cover_row_groups(tid, sg_size, sg_id)) {\n        \
             atomicStore(&sh_subgroups_off, 1u);\n    }\n    \
             let use_sg = workgroupUniformLoad(&sh_subgroups_off) == 0u;\n",
        );
    }
    // Each invocation carries its share of one K or V block in registers.
    let pf = carried(t, t.bc);
    let put_kv = per_vec4(pf, "        ", |i| {
        format!("put_kv(tid + {i}u * WG, pf_{i});")
    });
    let fetch = |what: &str, r0: &str, ind: &str| {
        per_vec4(pf, ind, |i| {
            format!("pf_{i} = fetch_{what}({r0}, kv_h, tid + {i}u * WG);")
        })
    };
    let lp = super::tiles::KeyLoop::of(spec, true);
    let _ = write!(
        b,
        "    let kt_end = (range.y + BC - 1u) / BC;\n{}{}{}",
        &lp.pre,
        per_vec4(pf, "    ", |i| format!("var pf_{i} = vec4<f32>(0.0);")),
        fetch("k", lp.first, "    ")
    );
    let _ = write!(
        b,
        "    {}        \
         let j0 = kt * BC;\n        \
         // The previous block is done with sh_kv, sh_p and sh_red.\n        \
         workgroupBarrier();\n{put_kv}        workgroupBarrier();\n        \
         // V's loads are in flight while the scores are computed.\n{}",
        lp.head,
        fetch("v", "j0", "        "),
    );
    scores(&mut b, tm, tn, t.d4, lp.full);
    softmax(&mut b, t);
    let _ = write!(
        b,
        "{put_kv}        workgroupBarrier();\n        \
         // The next block's K loads are in flight during P·V.\n        \
         if ({}) {{\n{}        }}\n",
        lp.has_next,
        fetch("k", lp.next, "            "),
    );
    b.push_str(
        "        // A block every row sees in full has p == 0 only by underflow, so it needs no\n        \
         // guard; elsewhere masked keys must not multiply V (0 · inf is NaN).\n        \
         if (range.z <= j0 && j0 + BC <= range.w) {\n",
    );
    accumulate(&mut b, tm, dn, &[("acc", "sh_p", "sh_kv")], false, false);
    b.push_str("        } else {\n");
    accumulate(&mut b, tm, dn, &[("acc", "sh_p", "sh_kv")], true, false);
    b.push_str("        }\n    }\n");
    finish(&mut b, spec, t);
    // `scores` sums with hsum, `softmax` exponentiates and compensates l.
    out.put(Fragment::new(
        b,
        &[Helper::Hsum, Helper::Exp, Helper::TwoSumErr4],
    ));
}

/// S = Q·Kᵀ for the invocation's block, then the mask and the score's modifiers.
fn scores(b: &mut String, tm: u32, tn: u32, d4: u32, full: (&str, &str)) {
    let (full, close) = full;
    let mut body = String::new();
    for i in 0..tm {
        let _ = writeln!(body, "let q_{i} = sh_q[(g * TM + {i}u) * ROW4 + d4];");
    }
    for n in 0..tn {
        let _ = writeln!(body, "let k_{n} = sh_kv[(tx + {n}u * TX) * ROW4 + d4];");
    }
    // Four chains per score, one per vec4 component (the order of numerics::dot).
    for (i, n) in regs(tm, tn) {
        let _ = writeln!(body, "s_{i}_{n}_b = fma(q_{i}, k_{n}, s_{i}_{n}_b);");
    }
    let accs: Vec<String> = regs(tm, tn).map(|(i, n)| format!("s_{i}_{n}")).collect();
    b.push_str(&dot_loop(d4, &accs, "d4", &body, "        "));
    for (i, n) in regs(tm, tn) {
        let _ = writeln!(b, "        var s_{i}_{n} = hsum(s_{i}_{n}_4);");
    }
    for n in 0..tn {
        let _ = writeln!(b, "        let j_{n} = j0 + tx + {n}u * TX;");
    }
    for (i, n) in regs(tm, tn) {
        let _ = writeln!(
            b,
            "        let v_{i}_{n} = j_{n} >= lo_{i} && j_{n} < hi_{i} && {full}key_visible(row_{i}, h, j_{n}){close};\n        \
             s_{i}_{n} = select(NEG_BIG, score(row_{i}, h, j_{n}, s_{i}_{n}), v_{i}_{n});"
        );
    }
}

/// The online-softmax step: row maxes across the group, P, the rescale of l and O.
fn softmax(b: &mut String, t: &Tiling) {
    let (tm, tn, dn) = (t.tm, t.tn, t.dn);
    for i in 0..tm {
        let row_max = (1..tn).fold(format!("s_{i}_0"), |acc, n| {
            format!("max({acc}, s_{i}_{n})")
        });
        let _ = writeln!(b, "        var rm_{i} = {row_max};");
    }
    // The barrier also ends every read of K before stage_v overwrites it.
    reduce_rows(b, t, "rm", "group_max", "row_max", "        ");
    for i in 0..tm {
        let _ = writeln!(
            b,
            "        let mn_{i} = max(m_{i}, rm_{i});\n        \
             let c_{i} = exp_f32(m_{i} - mn_{i});\n        m_{i} = mn_{i};"
        );
        let mut sum = String::new();
        for n in 0..tn {
            let _ = writeln!(
                b,
                "        let p_{i}_{n} = select(0.0, exp_f32(s_{i}_{n} - mn_{i}), v_{i}_{n});\n        \
                 sh_p[(g * TM + {i}u) * PSTRIDE + tx + {n}u * TX] = dropped(row_{i}, h, j_{n}, p_{i}_{n});"
            );
            sum += &format!(" + p_{i}_{n}");
        }
        // Each invocation keeps its share of l; the shares are summed once, at the end.
        let _ = writeln!(
            b,
            "{}",
            row_sum_step(&format!("_{i}"), &format!("c_{i}"), &sum[3..])
        );
        for n in 0..dn {
            let _ = writeln!(b, "        acc_{i}_{n} = acc_{i}_{n} * c_{i};");
        }
    }
}

/// A row's share of l rescaled by `c` and joined by a block's weights `block`, with the
/// rounding error of the join kept in `lc` (rescaled with l; the rescale's own rounding,
/// in the few blocks where the row's max moves, is not kept): an invocation adds one block
/// after another, as many as the keys over the block width (2048 at 128k keys), and their
/// plain sum drifted to 2.6x the bound of a framework's blocked sum on the LSE of a
/// 128k-row causal forward (H200, 2026-11-30). `suffix` names the row's variables.
pub(super) fn row_sum_step(suffix: &str, c: &str, block: &str) -> String {
    format!(
        "        let ps{suffix} = {block};\n        let lr{suffix} = l{suffix} * {c};\n        \
         l{suffix} = lr{suffix} + ps{suffix};\n        \
         lc{suffix} = fma(lc{suffix}, {c}, two_sum_err4(vec4<f32>(lr{suffix}), vec4<f32>(ps{suffix}), vec4<f32>(l{suffix})).x);"
    )
}

/// Reduces each row's `{var}_{i}` over its row group in place, with one workgroup barrier
/// on either path: by subgroup butterfly (`group`) where the subgroups allow, else through
/// `sh_red` (`shared`).
fn reduce_rows(b: &mut String, t: &Tiling, var: &str, group: &str, shared: &str, ind: &str) {
    let stores: String = (0..t.tm)
        .map(|i| format!("{ind}sh_red[(g * TM + {i}u) * TX + tx] = {var}_{i};\n"))
        .collect();
    let loads: String = (0..t.tm)
        .map(|i| format!("{ind}{var}_{i} = {shared}(g * TM + {i}u);\n"))
        .collect();
    if !t.subgroups {
        let _ = write!(b, "{stores}{ind}workgroupBarrier();\n{loads}");
        return;
    }
    let shuffles: String = (0..t.tm)
        .map(|i| format!("{ind}    {var}_{i} = {group}({var}_{i});\n"))
        .collect();
    let indent = |text: &str| -> String { text.lines().map(|l| format!("    {l}\n")).collect() };
    let _ = write!(
        b,
        "{ind}if (use_sg) {{\n{shuffles}{ind}}} else {{\n{}{ind}}}\n{ind}workgroupBarrier();\n\
         {ind}if (!use_sg) {{\n{}{ind}}}\n",
        indent(&stores),
        indent(&loads)
    );
}

/// `acc += w · rows` over the staged block, for each (acc, weights, rows) triple: the
/// weights are the invocation's own rows of a P-shaped tile, the rows head_dim-wide.
/// Guarded, a zero weight skips the update (a masked entry must not multiply inf).
/// Key-major (sums over query rows, whose weights decay with distance under a causal
/// mask), the staged rows are taken last first into a partial of the block alone, which
/// is then added to `acc`: a blocked sum, whose error grows with the block and the number
/// of blocks rather than with every row since the last flush (an H100 measured the
/// unblocked sum over 32-row blocks at 1.3x the pass bound).
pub(super) fn accumulate(
    b: &mut String,
    tm: u32,
    dn: u32,
    triples: &[(&str, &str, &str)],
    guarded: bool,
    key_major: bool,
) {
    let target = |acc: &str| match key_major {
        true => format!("{acc}b"),
        false => acc.to_string(),
    };
    if key_major {
        for (acc, _, _) in triples {
            for (i, n) in regs(tm, dn) {
                let _ = writeln!(b, "            var {acc}b_{i}_{n} = vec4<f32>(0.0);");
            }
        }
    }
    b.push_str("            for (var cc = 0u; cc < BC; cc = cc + 1u) {\n");
    let c = if key_major { "BC - 1u - cc" } else { "cc" };
    let _ = writeln!(b, "                let c = {c};");
    for (acc, w, rows) in triples {
        let sum = target(acc);
        for n in 0..dn {
            let _ = writeln!(
                b,
                "                let {acc}r_{n} = {rows}[c * ROW4 + tx + {n}u * TX];"
            );
        }
        for i in 0..tm {
            let _ = writeln!(
                b,
                "                let {acc}w_{i} = {w}[(g * TM + {i}u) * PSTRIDE + c];"
            );
            let update: Vec<String> = (0..dn)
                .map(|n| {
                    format!(
                        "{sum}_{i}_{n} = fma(vec4<f32>({acc}w_{i}), {acc}r_{n}, {sum}_{i}_{n});"
                    )
                })
                .collect();
            if guarded {
                let _ = writeln!(
                    b,
                    "                if ({acc}w_{i} != 0.0) {{\n                    {}\n                }}",
                    update.join("\n                    ")
                );
            } else {
                let _ = writeln!(b, "                {}", update.join("\n                "));
            }
        }
    }
    b.push_str("            }\n");
    if key_major {
        for (acc, _, _) in triples {
            for (i, n) in regs(tm, dn) {
                let _ = writeln!(
                    b,
                    "            {acc}_{i}_{n} = {acc}_{i}_{n} + {acc}b_{i}_{n};"
                );
            }
        }
    }
}

/// Sums each row's shares of l, then stores O = acc / l and the LSE.
fn finish(b: &mut String, spec: &KernelSpec, t: &Tiling) {
    let end = super::index::rows_end(spec);
    let sinks = spec.masks.sinks;
    let (tm, dn) = (t.tm, t.dn);
    // The last block's reads of sh_red are done before the shares overwrite it.
    b.push_str("    workgroupBarrier();\n");
    for i in 0..tm {
        let _ = writeln!(b, "    var lt_{i} = l_{i} + lc_{i};");
    }
    reduce_rows(b, t, "lt", "group_sum", "row_sum", "    ");
    for i in 0..tm {
        let (m, l) = (format!("m_{i}"), format!("lt_{i}"));
        let (join, num) = match super::sinks::join(sinks, "h", &m, &l, &format!("corr_{i}")) {
            Some(join) => (format!("        {join}"), format!("corr_{i}")),
            None => (String::new(), "1.0".into()),
        };
        // Key slices leave their outputs unnormalized for the reduce.
        let inv = match super::extend::sliced(spec) {
            true => "let inv = 1.0;".to_string(),
            false => format!(
                "var inv = 0.0;\n        if (lt_{i} != 0.0) {{\n            inv = {num} / lt_{i};\n        }}"
            ),
        };
        let _ = write!(
            b,
            "    if (row_{i} < {end}) {{\n{join}        {inv}\n        \
             let base = o_index(row_{i}, h);\n"
        );
        for n in 0..dn {
            let c = format!("(tx + {n}u * TX) * 4u");
            let mut store = format!("store_out4(base + {c}, acc_{i}_{n} * inv);");
            if let Some(within) = within(spec, Row::V, &c) {
                store = format!("if ({within}) {{\n            {store}\n        }}");
            }
            let _ = writeln!(b, "        {}", t.guarded(n, &store, "        "));
        }
        let _ = write!(
            b,
            "        if (tx == 0u) {{\n            store_lse(row_{i}, h, m_{i}, lt_{i});\n        }}\n    }}\n"
        );
    }
    b.push_str("}\n\n");
}

/// The entry of a flash kernel: a workgroup runs a tile of a head (or KV head) through
/// `body`. (Running the causal grid's long tiles first was measured on an H100 and made
/// the long causal shape's scalar kernels 10% slower, so their tiles run in grid order,
/// except where `scatters_kv`: the streaming kernel's atomic adds into a key arrive
/// roughly in the order the tiles run, and a key's weights shrink with the query's
/// distance under a causal mask, so the far tiles, with the small partial sums, go first.)
pub(super) fn entry(out: &mut Wgsl, spec: &KernelSpec, t: &Tiling, body: &str) {
    use super::grid_order::{Order, mapping};
    let (builtins, args) = match t.subgroups {
        true => (
            ",\n    @builtin(subgroup_size) sg_size: u32, @builtin(subgroup_invocation_id) sg_id: u32",
            ", sg_size, sg_id",
        ),
        false => ("", ""),
    };
    let at = match t.scatters_kv {
        true => mapping(spec, Order::LongestFirst { chunked: false }),
        false => mapping(spec, Order::Grid),
    };
    let _ = write!(
        out,
        r#"@compute @workgroup_size(WG)
fn {name}(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32{n}{builtins}) {{{prologue}
    {body}({tile}, {head}, tid{args});{flush}
}}
"#,
        name = spec.name,
        n = at.builtin,
        prologue = at.prologue,
        tile = at.tile,
        head = at.head,
        flush = super::flex::flush_call(spec),
    );
}
