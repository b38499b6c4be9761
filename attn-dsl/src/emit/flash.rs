//! The flash forward: a workgroup owns a tile of query rows, stages K and V a block of keys
//! at a time in workgroup memory with coalesced vec4 loads, and each invocation keeps its
//! scores and output rows in registers (named, fully unrolled, so that no driver has to
//! guess whether a private array may live in registers). The softmax runs online per row.
//!
//! Key blocks wholly outside every row's visible range are never visited (causal blocks
//! above the diagonal, blocks before the document start); blocks that some row of the tile
//! sees only in part are masked element by element.

use super::index::{Row, Rows, and_within, within};
use super::numerics::{Helper, dot_loop};
use super::tiles::{KeyLoop, Pair, visibility};
use super::writer::{Fragment, Template, Wgsl, concat, lines, uint};
use crate::layout::tiling::Tiling;
use crate::spec::KernelSpec;

/// One generated register name per (row, column) of an invocation's block.
pub(super) fn regs(rows: u32, cols: u32) -> impl Iterator<Item = (u32, u32)> {
    (0..rows).flat_map(move |i| (0..cols).map(move |n| (i, n)))
}

/// Statements run only where a condition holds.
const IF: Template = Template {
    name: "if",
    needs: &[],
    text: r#"if ($cond) {
    $code
}
"#,
};

/// `code`, run only where `cond` holds, where there is a condition.
pub(super) fn guarded(cond: Option<String>, code: Fragment) -> Fragment {
    match cond {
        Some(cond) => IF.fill([("cond", cond.into()), ("code", code)]),
        None => code,
    }
}

/// The tiling's sizes, and the padded strides of the staged rows and of P.
const CONSTANTS: Template = Template {
    name: "flash_constants",
    needs: &[],
    text: r#"// Flash tiling: BR query rows per workgroup, BC keys per staged block; row groups of
// TX invocations, TM rows each.
const BR: u32 = $br;
const BC: u32 = $bc;
const TM: u32 = $tm;
const TX: u32 = $tx;
const D4: u32 = $d4;
// Padded strides: a vec4 per staged row and a float per P row spread rows over banks.
const ROW4: u32 = $row4;
const PSTRIDE: u32 = $pstride;

"#,
};

pub(super) fn constants(out: &mut Wgsl, t: &Tiling) {
    out.put(CONSTANTS.fill([
        ("br", uint(t.br)),
        ("bc", uint(t.bc)),
        ("tm", uint(t.tm)),
        ("tx", uint(t.tx)),
        ("d4", uint(t.d4)),
        ("row4", uint(t.row4)),
        ("pstride", uint(t.bc + 1)),
    ]));
}

/// The forward's workgroup memory: the staged Q rows and K or V block, P, the row
/// reductions' slots and the tile's key range.
const WORKGROUP_MEMORY: Template = Template {
    name: "flash_workgroup_memory",
    needs: &[],
    text: r#"var<workgroup> sh_q: array<vec4<f32>, $q>;
// K, then V, of the current key block.
var<workgroup> sh_kv: array<vec4<f32>, $kv>;
var<workgroup> sh_p: array<f32, $p>;
// One slot per (row, invocation of its group) for the row reductions.
var<workgroup> sh_red: array<f32, $red>;
// The tile's keys: x..y holds every visible key; z..w is visible to every row.
var<workgroup> sh_range: vec4<u32>;

"#,
};

/// The switch from the subgroup reductions to `sh_red`, set by any invocation whose row
/// group the subgroups do not cover.
const SUBGROUPS_OFF: Template = Template {
    name: "subgroups_off",
    needs: &[],
    text: r#"// Nonzero when some row group is not inside one subgroup: reduce through sh_red.
var<workgroup> sh_subgroups_off: atomic<u32>;

"#,
};

pub(super) fn workgroup_memory(out: &mut Wgsl, t: &Tiling) {
    out.put(WORKGROUP_MEMORY.fill([
        ("q", (t.br * t.row4).to_string().into()),
        ("kv", (t.bc * t.row4).to_string().into()),
        ("p", (t.br * (t.bc + 1)).to_string().into()),
        ("red", (t.br * t.tx).to_string().into()),
    ]));
    if t.subgroups {
        out.put(SUBGROUPS_OFF.plain());
    }
}

/// Staging loops, the tile's key range and the row reductions of the forward.
pub(super) fn helpers(out: &mut Wgsl, spec: &KernelSpec, t: &Tiling) {
    stage(out, spec, "stage_q", Rows::Q, "sh_q", "query_at");
    fetch(out, spec, "k", Rows::K, "key_at");
    fetch(out, spec, "v", Rows::V, "value_at");
    put(out, "kv", "BC", "sh_kv");
    tile_key_range(out, spec);
    out.put(ROW_REDUCTIONS.plain());
    if t.subgroups {
        subgroup_reductions(out, t.tx);
    }
}

/// Whether the subgroups cover the row groups: each row group inside one subgroup, at
/// consecutive invocation ids.
const SUBGROUPS_COVER: Template = Template {
    name: "subgroups_cover_row_groups",
    needs: &[],
    text: r#"fn subgroups_cover_row_groups(tid: u32, sg_size: u32, sg_id: u32) -> bool {
    return sg_size >= TX && WG % sg_size == 0u && sg_id == tid % sg_size;
}

"#,
};

/// A reduction over a row group by butterfly: one shuffle per halving of TX.
const GROUP_REDUCE: Template = Template {
    name: "group_reduce",
    needs: &[],
    text: r#"fn $name(x: f32) -> f32 {
    var y = x;
    $butterfly
    return y;
}

"#,
};

/// Butterflies over the `tx` invocations of a row group, and the test that they may run:
/// the row group must sit in one subgroup at consecutive invocation ids. Vulkan does not
/// promise that layout, and subgroup sizes run from 4 to 128, so each workgroup checks.
fn subgroup_reductions(out: &mut Wgsl, tx: u32) {
    out.put(SUBGROUPS_COVER.plain());
    type Combine = fn(&str) -> String;
    let ops: [(&str, Combine); 2] = [
        ("group_max", |x| format!("max(y, {x})")),
        ("group_sum", |x| format!("y + {x}")),
    ];
    for (name, op) in ops {
        let masks = std::iter::successors(Some(1), |m| Some(m * 2)).take_while(|m| *m < tx);
        let butterfly = masks.map(|mask| {
            let shuffled = format!("subgroupShuffleXor(y, {mask}u)");
            format!("y = {};", op(&shuffled))
        });
        out.put(GROUP_REDUCE.fill([("name", name.into()), ("butterfly", lines(butterfly))]));
    }
}

/// No keys for a tile whose first row is at or past `$end`.
const TILE_PAST: Template = Template {
    name: "tile_past",
    needs: &[],
    text: r#"if (row0 >= $end) {
    return vec4<u32>(0u);
}
"#,
};

/// `tile_key_range(row0)` from the key ranges of the tile's first and last rows (`$past`:
/// none for a tile past the rows).
const TILE_KEY_RANGE: Template = Template {
    name: "tile_key_range",
    needs: &[],
    text: r#"// key_range is monotone in the row (document starts and ends never decrease, causal
// ends grow), so the first and last rows of the tile bound every row's range.
fn tile_key_range(row0: u32) -> vec4<u32> {
    $past
    let first = key_range($first);
    let last = key_range($last);
    return $range;
}

"#,
};

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
    // A ragged chunk's tiles past a sequence's rows see no keys.
    let past = match spec.grid.ragged {
        true => TILE_PAST.fill([("end", Fragment::from(end))]),
        false => Fragment::default(),
    };
    out.put(TILE_KEY_RANGE.fill([
        ("past", past),
        ("first", first.into()),
        ("last", last.into()),
        ("range", ret.into()),
    ]));
}

/// The row reductions through `sh_red`: each row's TX slots, in order.
const ROW_REDUCTIONS: Template = Template {
    name: "row_reductions",
    needs: &[],
    text: r#"fn row_max(r: u32) -> f32 {
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

"#,
};

/// A vec4 of a block of BC rows, zeros past the sequence or the row.
const FETCH: Template = Template {
    name: "fetch",
    needs: &[],
    text: r#"fn fetch_$name(r0: u32, h: u32, e: u32) -> vec4<f32> {
    let r = r0 + e / D4;
    let c4 = e % D4;
    var x = vec4<f32>(0.0);
    if ($cond) {
        let i = $index + c4 * 4u;
        x = $load;
    }
    return x;
}

"#,
};

/// `fetch_{name}(r0, h, e)`: vec4 `e` of the block of `rows` rows from r0 (zeros past the
/// sequence), loaded into registers a phase ahead of its use so that its latency hides
/// behind the products; `put_{name}(e, x)` stores it into `dst`.
pub(super) fn fetch(out: &mut Wgsl, spec: &KernelSpec, name: &str, of: Rows, src: &str) {
    let end = super::index::rows_end(spec);
    let cond = format!("e < BC * D4 && r < {end}");
    out.put(FETCH.fill([
        ("name", name.into()),
        ("cond", and_within(spec, &cond, of.row(), "c4 * 4u").into()),
        ("index", of.index("r", "h").into()),
        ("load", vec4_at(src).into()),
    ]));
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

/// A fetched vec4 into its staged row.
const PUT: Template = Template {
    name: "put",
    needs: &[],
    text: r#"fn put_$name(e: u32, x: vec4<f32>) {
    if (e < $rows * D4) {
        $dst[(e / D4) * ROW4 + e % D4] = x;
    }
}

"#,
};

/// `put_{name}(e, x)`: stores a fetched vec4 `e` of a block of `rows` rows into `dst`.
pub(super) fn put(out: &mut Wgsl, name: &str, rows: &str, dst: &str) {
    out.put(PUT.fill([
        ("name", name.into()),
        ("rows", rows.into()),
        ("dst", dst.into()),
    ]));
}

/// How many vec4s of a `rows`-row block each invocation carries.
pub(super) fn carried(t: &Tiling, rows: u32) -> u32 {
    (rows * t.d4).div_ceil(t.groups * t.tx)
}

/// The statements `stmts(i)` of each carried vec4 `i`, one line each.
pub(super) fn per_vec4<L: IntoIterator<Item = String>>(
    n: u32,
    stmts: impl Fn(u32) -> L,
) -> Fragment {
    lines((0..n).flat_map(stmts))
}

/// BR rows into workgroup memory, a vec4 per invocation per step.
const STAGE: Template = Template {
    name: "stage",
    needs: &[],
    text: r#"fn $name(r0: u32, h: u32, tid: u32) {
    for (var e = tid; e < BR * D4; e = e + WG) {
        let r = r0 + e / D4;
        let c4 = e % D4;
        var x = vec4<f32>(0.0);
        if ($cond) {
            let i = $index + c4 * 4u;
            x = $load;
        }
        $dst[(e / D4) * ROW4 + c4] = x;
    }
}

"#,
};

/// `name(r0, h, tid)`: `rows` rows from r0 (zeros past the sequence) into `dst`, one vec4 per
/// invocation per step, consecutive invocations on consecutive addresses.
pub(super) fn stage(out: &mut Wgsl, spec: &KernelSpec, name: &str, of: Rows, dst: &str, src: &str) {
    let cond = format!("r < {}", super::index::rows_end(spec));
    out.put(STAGE.fill([
        ("name", name.into()),
        ("cond", and_within(spec, &cond, of.row(), "c4 * 4u").into()),
        ("index", of.index("r", "h").into()),
        ("load", vec4_at(src).into()),
        ("dst", dst.into()),
    ]));
}

/// The flash forward's body. `$loop_head` opens the loop over key blocks (a [`KeyLoop`]'s
/// head, which may skip blocks), closed here. Each invocation carries its share of one K
/// or V block in registers (`pf_`): the next block's K loads are in flight during P·V, V's
/// during the scores. After the last block, a barrier: the last block's reads of sh_red
/// are done before the shares of l overwrite it.
const FLASH_FORWARD: Template = Template {
    name: "flash_forward",
    needs: &[],
    text: r#"fn flash_forward(tile: u32, h: u32, tid: u32$params) {
    let kv_h = kv_head(h);
    let g = tid / TX;
    let tx = tid % TX;
    let row0 = $origin;
    if (tid == 0u) {
        sh_range = tile_key_range(row0);
        $reset
    }
    stage_q(row0, h, tid);
    $rows
    let range = workgroupUniformLoad(&sh_range);
    $subgroups_check
    let kt_end = (range.y + BC - 1u) / BC;
    $pre
    $carried
    $fetch_first
    $loop_head
        let j0 = kt * BC;
        // The previous block is done with sh_kv, sh_p and sh_red.
        workgroupBarrier();
        $put_k
        workgroupBarrier();
        // V's loads are in flight while the scores are computed.
        $fetch_v
        $scores
        $softmax
        $put_v
        workgroupBarrier();
        // The next block's K loads are in flight during P·V.
        if ($has_next) {
            $fetch_next
        }
        // A block every row sees in full has p == 0 only by underflow, so it needs no
        // guard; elsewhere masked keys must not multiply V (0 · inf is NaN).
        if (range.z <= j0 && j0 + BC <= range.w) {
            $pv
        } else {
            $pv_guarded
        }
    }
    workgroupBarrier();
    $shares
    $sum_shares
    $store_rows
}

"#,
};

/// Where the subgroups do not cover the row groups, the workgroup's reductions go through
/// `sh_red`.
const SUBGROUPS_CHECK: Template = Template {
    name: "subgroups_check",
    needs: &[],
    text: r#"if (!subgroups_cover_row_groups(tid, sg_size, sg_id)) {
    atomicStore(&sh_subgroups_off, 1u);
}
let use_sg = workgroupUniformLoad(&sh_subgroups_off) == 0u;
"#,
};

pub(super) fn forward_body(out: &mut Wgsl, spec: &KernelSpec, t: &Tiling) {
    let (params, reset, check) = match t.subgroups {
        true => (
            ", sg_size: u32, sg_id: u32",
            "atomicStore(&sh_subgroups_off, 0u);",
            SUBGROUPS_CHECK.plain(),
        ),
        false => ("", "", Fragment::default()),
    };
    // Each invocation carries its share of one K or V block in registers.
    let pf = carried(t, t.bc);
    let put_kv = per_vec4(pf, |i| [format!("put_kv(tid + {i}u * WG, pf_{i});")]);
    let fetch = |what: &str, r0: &str| {
        per_vec4(pf, |i| {
            [format!(
                "pf_{i} = fetch_{what}({r0}, kv_h, tid + {i}u * WG);"
            )]
        })
    };
    let lp = KeyLoop::of(spec, true);
    let end = super::index::rows_end(spec);
    let pv = [("acc", "sh_p", "sh_kv")];
    out.put(FLASH_FORWARD.fill([
        ("params", params.into()),
        ("origin", super::index::tile_origin(spec).into()),
        ("reset", reset.into()),
        ("rows", concat((0..t.tm).map(|i| row_state(i, end, t.dn)))),
        ("subgroups_check", check),
        ("pre", lp.pre.clone()),
        (
            "carried",
            per_vec4(pf, |i| [format!("var pf_{i} = vec4<f32>(0.0);")]),
        ),
        ("fetch_first", fetch("k", lp.first)),
        ("loop_head", lp.head.clone()),
        ("put_k", put_kv.clone()),
        ("fetch_v", fetch("v", "j0")),
        ("scores", scores(t, lp.full_tiles)),
        ("softmax", softmax(t)),
        ("put_v", put_kv),
        ("has_next", lp.has_next.into()),
        ("fetch_next", fetch("k", lp.next)),
        ("pv", accumulate(t.tm, t.dn, &pv, false, false)),
        ("pv_guarded", accumulate(t.tm, t.dn, &pv, true, false)),
        (
            "shares",
            lines((0..t.tm).map(|i| format!("var lt_{i} = l_{i} + lc_{i};"))),
        ),
        ("sum_shares", reduce_rows(t, "lt", "group_sum", "row_sum")),
        (
            "store_rows",
            concat((0..t.tm).map(|i| store_row(spec, t, i))),
        ),
    ]));
}

/// Register row `i`'s state: its query row, the keys it sees, its running max m, its share
/// of l with the share's rounding error lc, and its accumulators.
const ROW_STATE: Template = Template {
    name: "row_state",
    needs: &[],
    text: r#"let row_$i = row0 + g * TM + ${i}u;
var lo_$i = 0u;
var hi_$i = 0u;
if (row_$i < $end) {
    let range = key_range(row_$i);
    lo_$i = range.x;
    hi_$i = range.y;
}
var m_$i = NEG_BIG;
var l_$i = 0.0;
var lc_$i = 0.0;
$acc
"#,
};

/// [`ROW_STATE`] of register row `i`, with `dn` accumulators.
fn row_state(i: u32, end: &str, dn: u32) -> Fragment {
    ROW_STATE.fill([
        ("i", i.to_string().into()),
        ("end", end.into()),
        (
            "acc",
            lines((0..dn).map(|n| format!("var acc_{i}_{n} = vec4<f32>(0.0);"))),
        ),
    ])
}

/// S = Q·Kᵀ for the invocation's block, then the mask and the score's modifiers.
fn scores(t: &Tiling, full_tiles: bool) -> Fragment {
    let (tm, tn) = (t.tm, t.tn);
    let q = (0..tm).map(|i| format!("let q_{i} = sh_q[(g * TM + {i}u) * ROW4 + d4];"));
    let k = (0..tn).map(|n| format!("let k_{n} = sh_kv[(tx + {n}u * TX) * ROW4 + d4];"));
    // Four chains per score, one per vec4 component (the order of numerics::dot).
    let fma = regs(tm, tn).map(|(i, n)| format!("s_{i}_{n}_b = fma(q_{i}, k_{n}, s_{i}_{n}_b);"));
    let body = lines(q.chain(k).chain(fma));
    let accs: Vec<String> = regs(tm, tn).map(|(i, n)| format!("s_{i}_{n}")).collect();
    let sums = regs(tm, tn).map(|(i, n)| format!("var s_{i}_{n} = hsum(s_{i}_{n}_4);"));
    let keys = (0..tn).map(|n| format!("let j_{n} = j0 + tx + {n}u * TX;"));
    let pairs: Vec<(u32, u32)> = regs(tm, tn).collect();
    let tested: Vec<Pair> = pairs.iter().map(|&(i, n)| pair(i, n)).collect();
    let select = |p: usize| {
        let (i, n) = pairs[p];
        vec![format!(
            "s_{i}_{n} = select(NEG_BIG, score(row_{i}, h, j_{n}, s_{i}_{n}), v_{i}_{n});"
        )]
    };
    let masked = visibility(&tested, "h", full_tiles, |_| Vec::new(), select);
    let products = dot_loop(t.d4, &accs, "d4", &body.text);
    let sums = Fragment::new(lines(sums).text, &[Helper::Hsum]);
    concat([products, sums, lines(keys), masked])
}

/// Register pair (`i`, `n`): query row `row_i` against key `j_n`, inside row i's key range.
pub(super) fn pair(i: u32, n: u32) -> Pair {
    Pair {
        v: format!("v_{i}_{n}"),
        range: format!("j_{n} >= lo_{i} && j_{n} < hi_{i}"),
        row: format!("row_{i}"),
        j: format!("j_{n}"),
    }
}

/// Register row `i`'s step of the online softmax: the new max, P against it, and the
/// rescale of l and O.
const SOFTMAX_ROW: Template = Template {
    name: "softmax_row",
    needs: &[Helper::Exp],
    text: r#"let mn_$i = max(m_$i, rm_$i);
let c_$i = exp_f32(m_$i - mn_$i);
m_$i = mn_$i;
$weights
$row_sum
$rescale
"#,
};

/// The online-softmax step: row maxes across the group, P, the rescale of l and O.
fn softmax(t: &Tiling) -> Fragment {
    let (tm, tn, dn) = (t.tm, t.tn, t.dn);
    let row_maxes = (0..tm).map(|i| {
        let row_max = (1..tn).fold(format!("s_{i}_0"), |acc, n| {
            format!("max({acc}, s_{i}_{n})")
        });
        format!("var rm_{i} = {row_max};")
    });
    // The barrier also ends every read of K before stage_v overwrites it.
    let reduce = reduce_rows(t, "rm", "group_max", "row_max");
    let rows = (0..tm).map(|i| {
        let weights = (0..tn).flat_map(|n| {
            [
                format!("let p_{i}_{n} = select(0.0, exp_f32(s_{i}_{n} - mn_{i}), v_{i}_{n});"),
                format!(
                    "sh_p[(g * TM + {i}u) * PSTRIDE + tx + {n}u * TX] = dropped(row_{i}, h, j_{n}, p_{i}_{n});"
                ),
            ]
        });
        let block: Vec<String> = (0..tn).map(|n| format!("p_{i}_{n}")).collect();
        SOFTMAX_ROW.fill([
            ("i", i.to_string().into()),
            ("weights", lines(weights)),
            // Each invocation keeps its share of l; the shares are summed once, at the end.
            (
                "row_sum",
                row_sum(&format!("_{i}"), &format!("c_{i}"), &block.join(" + ")),
            ),
            (
                "rescale",
                lines((0..dn).map(|n| format!("acc_{i}_{n} = acc_{i}_{n} * c_{i};"))),
            ),
        ])
    });
    concat([lines(row_maxes), reduce].into_iter().chain(rows))
}

/// A row's share of l rescaled and joined by a block's weights, the join's rounding error
/// kept in lc.
const ROW_SUM_STEP: Template = Template {
    name: "row_sum_step",
    needs: &[Helper::TwoSumErr4],
    text: r#"let ps$r = $block;
let lr$r = l$r * $c;
l$r = lr$r + ps$r;
lc$r = fma(lc$r, $c, two_sum_err4(vec4<f32>(lr$r), vec4<f32>(ps$r), vec4<f32>(l$r)).x);
"#,
};

/// A row's share of l rescaled by `c` and joined by a block's weights `block`, with the
/// rounding error of the join kept in `lc` (rescaled with l; the rescale's own rounding,
/// in the few blocks where the row's max moves, is not kept): an invocation adds one block
/// after another, as many as the keys over the block width (2048 at 128k keys), and their
/// plain sum drifted to 2.6x the bound of a framework's blocked sum on the LSE of a
/// 128k-row causal forward (H200, 2026-11-30). `suffix` names the row's variables.
pub(super) fn row_sum(suffix: &str, c: &str, block: &str) -> Fragment {
    ROW_SUM_STEP.fill([
        ("r", suffix.into()),
        ("c", c.into()),
        ("block", block.into()),
    ])
}

/// Row reductions through `sh_red`: every share stored, one barrier, each row's summed.
const REDUCE_ROWS: Template = Template {
    name: "reduce_rows",
    needs: &[],
    text: r#"$stores
workgroupBarrier();
$loads
"#,
};

/// [`REDUCE_ROWS`], or by subgroup butterflies where the subgroups cover the row groups;
/// one barrier on either path.
const REDUCE_ROWS_SUBGROUPS: Template = Template {
    name: "reduce_rows_subgroups",
    needs: &[],
    text: r#"if (use_sg) {
    $shuffles
} else {
    $stores
}
workgroupBarrier();
if (!use_sg) {
    $loads
}
"#,
};

/// Reduces each row's `{var}_{i}` over its row group in place, with one workgroup barrier
/// on either path: by subgroup butterfly (`group`) where the subgroups allow, else through
/// `sh_red` (`shared`).
fn reduce_rows(t: &Tiling, var: &str, group: &str, shared: &str) -> Fragment {
    let stores =
        lines((0..t.tm).map(|i| format!("sh_red[(g * TM + {i}u) * TX + tx] = {var}_{i};")));
    let loads = lines((0..t.tm).map(|i| format!("{var}_{i} = {shared}(g * TM + {i}u);")));
    if !t.subgroups {
        return REDUCE_ROWS.fill([("stores", stores), ("loads", loads)]);
    }
    let shuffles = lines((0..t.tm).map(|i| format!("{var}_{i} = {group}({var}_{i});")));
    REDUCE_ROWS_SUBGROUPS.fill([("shuffles", shuffles), ("stores", stores), ("loads", loads)])
}

/// The staged block's rows weighted into the accumulators, one staged row `c` at a time;
/// key-major, into partials of the block that are then added to the accumulators.
const ACCUMULATE: Template = Template {
    name: "accumulate",
    needs: &[],
    text: r#"$partials
for (var cc = 0u; cc < BC; cc = cc + 1u) {
    let c = $c;
    $products
}
$add_partials
"#,
};

/// `acc += w · rows` over the staged block, for each (acc, weights, rows) triple: the
/// weights are the invocation's own rows of a P-shaped tile, the rows head_dim-wide.
/// Guarded, a zero weight skips the update (a masked entry must not multiply inf).
/// Key-major (sums over query rows, whose weights decay with distance under a causal
/// mask), the staged rows are taken last first into a partial of the block alone, which
/// is then added to `acc`: a blocked sum, whose error grows with the block and the number
/// of blocks rather than with every row since the last flush (an H100 measured the
/// unblocked sum over 32-row blocks at 1.3x the pass bound).
pub(super) fn accumulate(
    tm: u32,
    dn: u32,
    triples: &[(&str, &str, &str)],
    guarded: bool,
    key_major: bool,
) -> Fragment {
    let target = |acc: &str| match key_major {
        true => format!("{acc}b"),
        false => acc.to_string(),
    };
    let each_reg = |f: &dyn Fn(&str, u32, u32) -> String| -> Fragment {
        match key_major {
            true => lines(
                triples
                    .iter()
                    .flat_map(|(acc, _, _)| regs(tm, dn).map(|(i, n)| f(acc, i, n))),
            ),
            false => Fragment::default(),
        }
    };
    let products = triples.iter().map(|(acc, w, rows)| {
        let sum = target(acc);
        let staged =
            (0..dn).map(|n| format!("let {acc}r_{n} = {rows}[c * ROW4 + tx + {n}u * TX];"));
        let per_row = (0..tm).map(|i| {
            let weight = lines([format!(
                "let {acc}w_{i} = {w}[(g * TM + {i}u) * PSTRIDE + c];"
            )]);
            let update = lines((0..dn).map(|n| {
                format!("{sum}_{i}_{n} = fma(vec4<f32>({acc}w_{i}), {acc}r_{n}, {sum}_{i}_{n});")
            }));
            let cond = guarded.then(|| format!("{acc}w_{i} != 0.0"));
            weight.then(self::guarded(cond, update))
        });
        concat(std::iter::once(lines(staged)).chain(per_row))
    });
    ACCUMULATE.fill([
        (
            "partials",
            each_reg(&|acc, i, n| format!("var {acc}b_{i}_{n} = vec4<f32>(0.0);")),
        ),
        ("c", if key_major { "BC - 1u - cc" } else { "cc" }.into()),
        ("products", concat(products)),
        (
            "add_partials",
            each_reg(&|acc, i, n| format!("{acc}_{i}_{n} = {acc}_{i}_{n} + {acc}b_{i}_{n};")),
        ),
    ])
}

/// Register row `i`'s output: O = acc / l (with the sink joined to l where the kernel has
/// sinks) and the LSE, within the sequence.
const STORE_ROW: Template = Template {
    name: "store_row",
    needs: &[],
    text: r#"if (row_$i < $end) {
    $join
    $inv
    let base = o_index(row_$i, h);
    $stores
    if (tx == 0u) {
        store_lse(row_$i, h, m_$i, lt_$i);
    }
}
"#,
};

/// The factor from row `i`'s accumulators to O: `num / l`, 0 for an empty row.
const INV: Template = Template {
    name: "inv",
    needs: &[],
    text: r#"var inv = 0.0;
if (lt_$i != 0.0) {
    inv = $num / lt_$i;
}
"#,
};

/// Stores register row `i`'s O = acc / l and its LSE, from its shares of l summed.
fn store_row(spec: &KernelSpec, t: &Tiling, i: u32) -> Fragment {
    let (m, l) = (format!("m_{i}"), format!("lt_{i}"));
    let (join, num) = match super::sinks::join(spec.masks.sinks, "h", &m, &l, &format!("corr_{i}"))
    {
        Some(join) => (join, format!("corr_{i}")),
        None => (Fragment::default(), "1.0".into()),
    };
    // Key slices leave their outputs unnormalized for the reduce.
    let inv = match super::extend::sliced(spec) {
        true => Fragment::from("let inv = 1.0;"),
        false => INV.fill([("i", i.to_string().into()), ("num", num.into())]),
    };
    let stores = (0..t.dn).map(|n| {
        let c = format!("(tx + {n}u * TX) * 4u");
        let store = lines([format!("store_out4(base + {c}, acc_{i}_{n} * inv);")]);
        guarded(t.column_guard(n), guarded(within(spec, Row::V, &c), store))
    });
    STORE_ROW.fill([
        ("i", i.to_string().into()),
        ("end", super::index::rows_end(spec).into()),
        ("join", join),
        ("inv", inv),
        ("stores", concat(stores)),
    ])
}

/// A flash kernel's entry point: the workgroup's tile and head from the grid mapping.
const ENTRY: Template = Template {
    name: "flash_entry",
    needs: &[],
    text: r#"@compute @workgroup_size(WG)
$signature
    $prologue
    $enter
    $body($tile, $head, tid$args);
    $flush
    $leave
}
"#,
};

/// The entry's signature, without subgroups.
const SIGNATURE: Template = Template {
    name: "flash_entry_signature",
    needs: &[],
    text: r#"fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32$builtin) {
"#,
};

/// The entry's signature, with the subgroup builtins the row reductions take.
const SIGNATURE_SUBGROUPS: Template = Template {
    name: "flash_entry_signature_subgroups",
    needs: &[],
    text: r#"fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32$builtin,
    @builtin(subgroup_size) sg_size: u32, @builtin(subgroup_invocation_id) sg_id: u32) {
"#,
};

/// The entry of a flash kernel: a workgroup runs a tile of a head (or KV head) through
/// `body`. (Running the causal grid's long tiles first was measured on an H100 and made
/// the long causal shape's scalar kernels 10% slower, so their tiles run in grid order,
/// except where `scatters_kv`: the streaming kernel's atomic adds into a key arrive
/// roughly in the order the tiles run, and a key's weights shrink with the query's
/// distance under a causal mask, so the far tiles, with the small partial sums, go first.)
pub(super) fn entry(out: &mut Wgsl, spec: &KernelSpec, t: &Tiling, body: &str) {
    use super::grid_order::{Order, mapping};
    let at = match t.scatters_kv {
        true => mapping(spec, Order::LongestFirst { chunked: false }),
        false => mapping(spec, Order::Grid),
    };
    let (signature, args) = match t.subgroups {
        true => (SIGNATURE_SUBGROUPS, ", sg_size, sg_id"),
        false => (SIGNATURE, ""),
    };
    let signature = signature.fill([
        ("name", spec.name.as_str().into()),
        ("builtin", at.builtin.into()),
    ]);
    out.put(ENTRY.fill([
        ("signature", signature),
        ("prologue", at.prologue),
        ("body", body.into()),
        ("tile", at.tile.into()),
        ("head", at.head.into()),
        ("args", args.into()),
        ("flush", super::flex::flush_call(spec)),
        ("enter", super::residency::enter(spec)),
        ("leave", super::residency::leave(spec)),
    ]));
}
