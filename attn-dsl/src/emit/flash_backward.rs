//! The tiled recompute split (schedule (d)) in the flash layout of [`super::flash`]:
//!
//! - `backward_q` (s-major): a workgroup owns a tile of query rows with their Q and dO
//!   staged; per staged block of K and V it recomputes P = exp(S − LSE), dP = dO·Vᵀ and
//!   dS = scale·P·(dP − D) in registers, and accumulates dQ += dS·K. No row reductions:
//!   the forward's LSE fixes the softmax.
//! - `backward_kv` (j-major): a workgroup owns a tile of key rows with their K and V staged;
//!   for each query head of its KV head and each staged block of Q and dO (with LSE and D)
//!   it recomputes Pᵀ and dSᵀ and accumulates dV += Pᵀ·dO and dK += dSᵀ·Q.
//!
//! Both own their outputs (no atomics, no scratch) and add into them, as every backward
//! kernel does: the host zeroes the gradients for a fresh pass.

use super::flash::{
    accumulate, carried, fetch, guarded, per_vec4, put, regs, stage, tile_key_range,
};
use super::index::{Row, Rows};
use super::numerics::{Helper, dot_loop};
use super::tiles::{KeyLoop, Pair, visibility};
use super::writer::{Fragment, Template, Wgsl, concat, lines, uint};
use super::{backward, index};
use crate::layout::tiling::Tiling;
use crate::spec::KernelSpec;

fn head_rows(out: &mut Wgsl, names: &[&str], rows: u32, t: &Tiling) {
    let size = rows * t.row4;
    out.put(lines(names.iter().map(|name| {
        format!("var<workgroup> {name}: array<vec4<f32>, {size}>;")
    })));
}

/// Head indexing, the masks, the packed `stats` offsets both halves read, and the loads of
/// Q, K, V and dO in the dtype.
pub(super) fn helpers(out: &mut Wgsl, spec: &KernelSpec) {
    index::kv_head(out, spec);
    index::row_indexing(out, spec);
    index::masks(out, spec);
    backward::packing(out, spec);
    super::dtype::loads(
        out,
        spec,
        &[
            ("query_at", "q"),
            ("key_at", "k"),
            ("value_at", "v"),
            ("grad_out_at", "d_o"),
        ],
    );
}

/// The query-major half's dS tile and key range.
const Q_MEMORY: Template = Template {
    name: "flash_backward_q_memory",
    needs: &[],
    text: r#"var<workgroup> sh_ds: array<f32, $tile>;
var<workgroup> sh_range: vec4<u32>;

"#,
};

/// The streaming schedule's P tile beside dS.
const Q_MEMORY_P: Template = Template {
    name: "backward_q_memory_p",
    needs: &[],
    text: r#"// P of the block, for dV.
var<workgroup> sh_p: array<f32, $tile>;

"#,
};

pub(super) fn backward_q(out: &mut Wgsl, spec: &KernelSpec, t: &Tiling) {
    super::flash::constants(out, t);
    head_rows(out, &["sh_q", "sh_do"], t.br, t);
    head_rows(out, &["sh_k", "sh_v"], t.bc, t);
    let tile = Fragment::from((t.br * (t.bc + 1)).to_string());
    out.put(Q_MEMORY.fill([("tile", tile.clone())]));
    let scatter_kv = spec.write_mode("dkv").is_some();
    if scatter_kv {
        out.put(Q_MEMORY_P.fill([("tile", tile)]));
    }
    helpers(out, spec);
    if scatter_kv {
        super::scatter::atomic_add(out, spec, "dkv");
    }
    stage(out, spec, "stage_q", Rows::Q, "sh_q", "query_at");
    stage(out, spec, "stage_do", Rows::O, "sh_do", "grad_out_at");
    for (name, of, src, dst) in [
        ("k", Rows::K, "key_at", "sh_k"),
        ("v", Rows::V, "value_at", "sh_v"),
    ] {
        fetch(out, spec, name, of, src);
        put(out, name, "BC", dst);
    }
    tile_key_range(out, spec);
    let lp = KeyLoop::of(spec, true);
    q_body(out, spec, t, &lp, scatter_kv);
    super::flash::entry(out, spec, t, "flash_backward_q");
}

/// The query-major half's body: per staged block of K and V, with the next block's loads
/// in flight, S and dP, then P and dS in registers, dS (and P, streaming) into workgroup
/// memory, dQ += dS·K, and the streaming schedule's scatter of dK and dV.
const Q_BODY: Template = Template {
    name: "flash_backward_q",
    needs: &[],
    text: r#"fn flash_backward_q(tile: u32, h: u32, tid: u32) {
    let kv_h = kv_head(h);
    let g = tid / TX;
    let tx = tid % TX;
    let row0 = tile * BR;
    if (tid == 0u) {
        sh_range = tile_key_range(row0);
    }
    stage_q(row0, h, tid);
    stage_do(row0, h, tid);
    $rows
    let range = workgroupUniformLoad(&sh_range);
    let kt_end = (range.y + BC - 1u) / BC;
    $pre
    $carried
    $fetch_first
    $loop_head
        let j0 = kt * BC;
        // The previous block is done with sh_k and sh_ds.
        workgroupBarrier();
        $puts
        workgroupBarrier();
        // The next block's loads are in flight during this one's products.
        if ($has_next) {
            $fetch_next
        }
        $products
        $keys
        $p_ds
        workgroupBarrier();
        // As in the forward: only blocks some row sees in part need the guard on dS == 0.
        if (range.z <= j0 && j0 + BC <= range.w) {
            $dq
        } else {
            $dq_guarded
        }
        $scatter_dkv
        $flush
    }
}

"#,
};

/// Query row `i`'s state: its row, the keys it sees, its LSE and D, its dQ accumulators.
const Q_ROW: Template = Template {
    name: "backward_q_row",
    needs: &[],
    text: r#"let row_$i = row0 + g * TM + ${i}u;
var lo_$i = 0u;
var hi_$i = 0u;
var lse_$i = 0.0;
var delta_$i = 0.0;
if (row_$i < dims.seq_len) {
    let range = key_range(row_$i);
    lo_$i = range.x;
    hi_$i = range.y;
    lse_$i = stats[stats_part(0u, row_$i, h)];
    delta_$i = stats[stats_part(1u, row_$i, h)];
}
$acc
"#,
};

fn q_body(out: &mut Wgsl, spec: &KernelSpec, t: &Tiling, lp: &KeyLoop, scatter_kv: bool) {
    let (tm, dn) = (t.tm, t.dn);
    let loads = q_prefetch(t, lp);
    let products = products(
        t,
        ("sh_q", "sh_do", &|i| format!("(g * TM + {i}u)")),
        ("sh_k", "sh_v", &|n| format!("(tx + {n}u * TX)")),
    );
    let keys = (0..t.tn).map(|n| format!("let j_{n} = j0 + tx + {n}u * TX;"));
    let dq = [("dq", "sh_ds", "sh_k")];
    let scatter_dkv = match scatter_kv {
        true => SCATTER_DKV.fill([
            ("lanes", uint(crate::DKV_LANES)),
            ("adds", scatter_dkv_adds(spec)),
        ]),
        false => Fragment::default(),
    };
    let flush = flush(
        (spec, t),
        FLUSH_KEYS,
        "kt + 1u - range.x / BC",
        lp.steps,
        "row",
        &[("dq", &|i| format!("q_index(row_{i}, h)"), Row::Qk)],
    );
    out.put(Q_BODY.fill([
        ("rows", concat((0..tm).map(|i| q_row(i, dn)))),
        ("pre", lp.pre.clone()),
        ("carried", loads.carried),
        ("fetch_first", loads.first),
        ("loop_head", lp.head.clone()),
        ("puts", loads.puts),
        ("has_next", lp.has_next.into()),
        ("fetch_next", loads.next),
        ("products", products),
        ("keys", lines(keys)),
        ("p_ds", q_p_ds(t, lp.full_tiles, scatter_kv)),
        ("dq", accumulate(tm, dn, &dq, false, false)),
        ("dq_guarded", accumulate(tm, dn, &dq, true, false)),
        ("scatter_dkv", scatter_dkv),
        ("flush", flush),
    ]));
}

/// [`Q_ROW`] of register row `i`, with `dn` accumulators.
fn q_row(i: u32, dn: u32) -> Fragment {
    Q_ROW.fill([
        ("i", i.to_string().into()),
        (
            "acc",
            lines((0..dn).map(|n| format!("var dq_{i}_{n} = vec4<f32>(0.0);"))),
        ),
    ])
}

/// The registers that carry a block ahead of its use: their declarations, the first
/// block's loads, their stores into workgroup memory and the next block's loads.
struct Prefetch {
    carried: Fragment,
    first: Fragment,
    puts: Fragment,
    next: Fragment,
}

/// Each invocation carries its share of the next K and V block in registers.
fn q_prefetch(t: &Tiling, lp: &KeyLoop) -> Prefetch {
    let pf = carried(t, t.bc);
    let fetch = |r0: &str| {
        per_vec4(pf, |i| {
            [
                format!("pk_{i} = fetch_k({r0}, kv_h, tid + {i}u * WG);"),
                format!("pv_{i} = fetch_v({r0}, kv_h, tid + {i}u * WG);"),
            ]
        })
    };
    Prefetch {
        carried: per_vec4(pf, |i| {
            [
                format!("var pk_{i} = vec4<f32>(0.0);"),
                format!("var pv_{i} = vec4<f32>(0.0);"),
            ]
        }),
        first: fetch(lp.first),
        puts: per_vec4(pf, |i| {
            [
                format!("put_k(tid + {i}u * WG, pk_{i});"),
                format!("put_v(tid + {i}u * WG, pv_{i});"),
            ]
        }),
        next: fetch(lp.next),
    }
}

/// P and dS of each pair of the invocation's block (zero where hidden), dS (and, streaming,
/// P) into workgroup memory, the mask's tests as [`visibility`] places them.
fn q_p_ds(t: &Tiling, full_tiles: bool, scatter_kv: bool) -> Fragment {
    let pairs: Vec<(u32, u32)> = regs(t.tm, t.tn).collect();
    let tested: Vec<Pair> = pairs
        .iter()
        .map(|&(i, n)| super::flash::pair(i, n))
        .collect();
    let p_ds = |p: usize| {
        let (i, n) = pairs[p];
        let p = format!(
            "sh_p[(g * TM + {i}u) * PSTRIDE + tx + {n}u * TX] = select(0.0, dropped(row_{i}, h, j_{n}, p_{i}_{n}), v_{i}_{n});"
        );
        [
            format!("let x_{i}_{n} = scored(row_{i}, h, j_{n}, s_{i}_{n});"),
            format!("let p_{i}_{n} = exp_f32(x_{i}_{n}.x - lse_{i});"),
            format!(
                "let g_{i}_{n} = score_grads(row_{i}, h, j_{n}, s_{i}_{n}, x_{i}_{n}, p_{i}_{n} * (dropped(row_{i}, h, j_{n}, dp_{i}_{n}) - delta_{i}), v_{i}_{n});"
            ),
            format!(
                "sh_ds[(g * TM + {i}u) * PSTRIDE + tx + {n}u * TX] = params.scale * g_{i}_{n};"
            ),
        ]
        .into_iter()
        .chain(scatter_kv.then_some(p))
        .collect()
    };
    // P is exponentiated.
    let text = visibility(&tested, "h", full_tiles, |_| Vec::new(), p_ds).text;
    Fragment::new(text, &[Helper::Exp])
}

/// The key-major half's P and dS tiles, the staged query rows' (LSE, D) and the key range.
const KV_MEMORY: Template = Template {
    name: "flash_backward_kv_memory",
    needs: &[],
    text: r#"var<workgroup> sh_p: array<f32, $tile>;
var<workgroup> sh_ds: array<f32, $tile>;
// (LSE, D) of each staged query row.
var<workgroup> sh_stats: array<vec2<f32>, $bc>;
var<workgroup> sh_range: vec4<u32>;

"#,
};

pub(super) fn backward_kv(out: &mut Wgsl, spec: &KernelSpec, t: &Tiling) {
    super::flash::constants(out, t);
    head_rows(out, &["sh_k", "sh_v"], t.br, t);
    head_rows(out, &["sh_q", "sh_do"], t.bc, t);
    out.put(KV_MEMORY.fill([
        ("tile", (t.br * (t.bc + 1)).to_string().into()),
        ("bc", t.bc.to_string().into()),
    ]));
    helpers(out, spec);
    stage(out, spec, "stage_k", Rows::K, "sh_k", "key_at");
    stage(out, spec, "stage_v", Rows::V, "sh_v", "value_at");
    for (name, of, src, dst) in [
        ("q", Rows::Q, "query_at", "sh_q"),
        ("do", Rows::O, "grad_out_at", "sh_do"),
    ] {
        fetch(out, spec, name, of, src);
        put(out, name, "BC", dst);
    }
    query_tiles(out, spec);
    let scatter = spec.write_mode("dq").is_some();
    if scatter {
        super::scatter::atomic_add(out, spec, "dq");
    }
    kv_body(out, spec, t, scatter);
    super::flash::entry(out, spec, t, "flash_backward_kv");
}

/// `tile_query_range(col0)` from the query ranges of the tile's first and last keys.
const TILE_QUERY_RANGE: Template = Template {
    name: "tile_query_range",
    needs: &[],
    text: r#"// query_range is monotone in the key (document starts and ends never decrease, causal
// starts grow), so the first and last keys of the tile bound the queries that see any key
// of it, and those in [last.x, first.y) see all of them.
fn tile_query_range(col0: u32) -> vec4<u32> {
    let first = query_range(col0);
    let last = query_range(min(col0 + BR, dims.seq_len) - 1u);
    return $range;
}

"#,
};

/// `tile_query_range(col0)`, the queries that see a key tile (`.xy`) and those that see
/// all of it (`.zw`); `fetch_stats`/`put_stats`: (LSE, D) of a block of BC query rows;
/// with a mask_mod, `next_block` (see [`super::tiles::block_functions`]).
pub(super) fn query_tiles(out: &mut Wgsl, spec: &KernelSpec) {
    let range = "vec4<u32>(first.x, last.y, last.x, first.y)";
    // Narrowed to the queries the block mask shows from the tile's key blocks.
    let ret = match spec.reads_block_mask() {
        true => format!("block_range({range}, col0, min(col0 + BR, dims.seq_len) - 1u, 2u)"),
        false => range.to_string(),
    };
    out.put(TILE_QUERY_RANGE.fill([("range", ret.into())]));
    out.put(STATS.plain());
    if super::tiles::sparse(spec) {
        super::tiles::block_functions(out);
    }
}

/// (LSE, D) of a block of BC query rows, fetched a phase ahead and put into `sh_stats`.
const STATS: Template = Template {
    name: "stats",
    needs: &[],
    text: r#"fn fetch_stats(s0: u32, h: u32, e: u32) -> vec2<f32> {
    let s = s0 + e;
    var x = vec2<f32>(0.0);
    if (e < BC && s < dims.seq_len) {
        x = vec2<f32>(stats[stats_part(0u, s, h)], stats[stats_part(1u, s, h)]);
    }
    return x;
}

fn put_stats(e: u32, x: vec2<f32>) {
    if (e < BC) {
        sh_stats[e] = x;
    }
}

"#,
};

/// The key-major half's body: for each block of queries that sees the tile and each query
/// head (see [`blocks_ahead`]), Sᵀ and dPᵀ, then P and dS in registers and into
/// workgroup memory, dV += Pᵀ·dO and dK += dSᵀ·Q, and schedule (c)'s scatter of dQ.
const KV_BODY: Template = Template {
    name: "flash_backward_kv",
    needs: &[],
    text: r#"fn flash_backward_kv(tile: u32, kv_h: u32, tid: u32) {
    let g = tid / TX;
    let tx = tid % TX;
    let col0 = tile * BR;
    if (tid == 0u) {
        sh_range = tile_query_range(col0);
    }
    stage_k(col0, kv_h, tid);
    stage_v(col0, kv_h, tid);
    $share_batch
    $cols
    let range = workgroupUniformLoad(&sh_range);
    let group = q_per_kv();
    let first = range.x / BC;
    let blocks = (range.y + BC - 1u) / BC - first;
    $carried
    $loop_head
        $products
        $p_ds
        workgroupBarrier();
        if (range.z <= s0 && s0 + BC <= range.w) {
            $dkv
        } else {
            $dkv_guarded
        }
        $scatter_dq
        $flush
    }
}

"#,
};

fn kv_body(out: &mut Wgsl, spec: &KernelSpec, t: &Tiling, scatter_dq: bool) {
    let sparse = super::tiles::sparse(spec);
    let (tm, dn) = (t.tm, t.dn);
    let loads = kv_prefetch(t);
    let loop_head = blocks_ahead(
        sparse,
        "kv_h * group",
        (loads.first, "sh_q, sh_do, sh_p and sh_ds"),
        loads.puts,
        loads.next,
    );
    let products = products(
        t,
        ("sh_k", "sh_v", &|i| format!("(g * TM + {i}u)")),
        ("sh_q", "sh_do", &|n| format!("(tx + {n}u * TX)")),
    );
    let pairs = [("dv", "sh_p", "sh_do"), ("dk", "sh_ds", "sh_q")];
    let scatter_dq = match scatter_dq {
        true => {
            let cond = "s < dims.seq_len && any(acc != vec4<f32>(0.0))";
            let fill = index::and_within(spec, cond, Row::Qk, "c4 * 4u");
            SCATTER_DQ.fill([("cond", fill.into())])
        }
        false => Fragment::default(),
    };
    out.put(KV_BODY.fill([
        ("share_batch", super::tiles::share_batch(spec)),
        ("cols", kv_cols(t)),
        ("carried", loads.carried),
        ("loop_head", loop_head),
        ("products", products),
        ("p_ds", kv_p_ds(t, sparse)),
        ("dkv", accumulate(tm, dn, &pairs, false, true)),
        ("dkv_guarded", accumulate(tm, dn, &pairs, true, true)),
        ("scatter_dq", scatter_dq),
        ("flush", kv_flush(spec, t, sparse)),
    ]));
}

/// Each register row's key row and its dK and dV accumulators.
fn kv_cols(t: &Tiling) -> Fragment {
    let cols = (0..t.tm).flat_map(|i| {
        let acc = (0..t.dn).flat_map(move |n| {
            [
                format!("var dk_{i}_{n} = vec4<f32>(0.0);"),
                format!("var dv_{i}_{n} = vec4<f32>(0.0);"),
            ]
        });
        std::iter::once(format!("let col_{i} = col0 + g * TM + {i}u;")).chain(acc)
    });
    lines(cols)
}

/// Each invocation carries its share of the next block of Q, dO and (LSE, D).
fn kv_prefetch(t: &Tiling) -> Prefetch {
    let (pf, ps) = (carried(t, t.bc), t.bc.div_ceil(t.groups * t.tx));
    let fetch = || {
        let rows = per_vec4(pf, |i| {
            [
                format!("pq_{i} = fetch_q(next_s0, next_h, tid + {i}u * WG);"),
                format!("pd_{i} = fetch_do(next_s0, next_h, tid + {i}u * WG);"),
            ]
        });
        let stats = per_vec4(ps, |i| {
            [format!(
                "ps_{i} = fetch_stats(next_s0, next_h, tid + {i}u * WG);"
            )]
        });
        rows.then(stats)
    };
    let carried = per_vec4(pf, |i| {
        [
            format!("var pq_{i} = vec4<f32>(0.0);"),
            format!("var pd_{i} = vec4<f32>(0.0);"),
        ]
    });
    let puts = per_vec4(pf, |i| {
        [
            format!("put_q(tid + {i}u * WG, pq_{i});"),
            format!("put_do(tid + {i}u * WG, pd_{i});"),
        ]
    });
    Prefetch {
        carried: carried.then(per_vec4(ps, |i| [format!("var ps_{i} = vec2<f32>(0.0);")])),
        first: fetch(),
        puts: puts.then(per_vec4(ps, |i| {
            [format!("put_stats(tid + {i}u * WG, ps_{i});")]
        })),
        next: fetch(),
    }
}

/// The staged queries and their (LSE, D), then Pᵀ and dSᵀ of each pair of the invocation's
/// block (zero where hidden; stepping by the mask's blocks, the mask asked only in blocks
/// not full) into workgroup memory.
fn kv_p_ds(t: &Tiling, sparse: bool) -> Fragment {
    let queries = (0..t.tn).flat_map(|n| {
        [
            format!("let q_{n} = s0 + tx + {n}u * TX;"),
            format!("let st_{n} = sh_stats[tx + {n}u * TX];"),
        ]
    });
    let p_ds = regs(t.tm, t.tn).flat_map(|(i, n)| {
        [
            format!(
                "let v_{i}_{n} = q_{n} < dims.seq_len && col_{i} < dims.seq_len && {};",
                super::tiles::key_major_visible(sparse, &format!("q_{n}"), &format!("col_{i}"))
            ),
            format!("let x_{i}_{n} = scored(q_{n}, h, col_{i}, s_{i}_{n});"),
            format!("let p_{i}_{n} = select(0.0, exp_f32(x_{i}_{n}.x - st_{n}.x), v_{i}_{n});"),
            format!(
                "let g_{i}_{n} = score_grads(q_{n}, h, col_{i}, s_{i}_{n}, x_{i}_{n}, p_{i}_{n} * (dropped(q_{n}, h, col_{i}, dp_{i}_{n}) - st_{n}.y), v_{i}_{n});"
            ),
            format!(
                "sh_p[(g * TM + {i}u) * PSTRIDE + tx + {n}u * TX] = dropped(q_{n}, h, col_{i}, p_{i}_{n});"
            ),
            format!(
                "sh_ds[(g * TM + {i}u) * PSTRIDE + tx + {n}u * TX] = params.scale * g_{i}_{n};"
            ),
        ]
    });
    // P is exponentiated.
    Fragment::new(lines(queries.chain(p_ds)).text, &[Helper::Exp])
}

/// The key-major half's flush of dK and dV into their rows.
fn kv_flush(spec: &KernelSpec, t: &Tiling, sparse: bool) -> Fragment {
    // Skipping blocks, the last one visited is the last step.
    let steps = match sparse {
        true => "select(group * blocks, it + 1u, it_next >= group * blocks)",
        false => "group * blocks",
    };
    let v_index = match spec.split_dims() {
        true => "v_index",
        false => "kv_index",
    };
    flush(
        (spec, t),
        FLUSH_ROWS,
        "it + 1u",
        steps,
        "col",
        &[
            ("dk", &|i| format!("kv_index(col_{i}, kv_h)"), Row::Qk),
            ("dv", &|i| format!("{v_index}(col_{i}, kv_h)"), Row::V),
        ],
    )
}

/// The key-major loop over every block of queries that sees the tile, last first, and
/// within a block every query head of the KV head, with the next block's loads in flight.
/// It opens the loop; the caller's body closes it.
const BLOCKS_AHEAD: Template = Template {
    name: "blocks_ahead",
    needs: &[],
    text: r#"var next_h = $h0;
var next_s0 = (first + blocks - 1u) * BC;
$first_fetch
// Every block of queries that sees the tile, last first, and within a block every
// query head of this KV head: under a causal or document mask a key's weights
// shrink with the query's distance, so the small terms are added while the sums
// are small (summed the other way, the error grew with the sequence).
for (var it = 0u; it < group * blocks; it = it + 1u) {
    let h = next_h;
    let s0 = next_s0;
    // The previous block is done with $done_with.
    workgroupBarrier();
    $puts
    workgroupBarrier();
    // The next block's loads are in flight during this one's products.
    if (it + 1u < group * blocks) {
        next_h = $h0 + (it + 1u) % group;
        next_s0 = (first + blocks - 1u - (it + 1u) / group) * BC;
        $fetch
    }
"#,
};

/// [`BLOCKS_AHEAD`] over only the blocks (and heads) whose tile the mask may show.
const SPARSE_BLOCKS_AHEAD: Template = Template {
    name: "sparse_blocks_ahead",
    needs: &[],
    text: r#"let it_end = group * blocks;
let col_last = min(col0 + BR, dims.seq_len) - 1u;
let first_block = next_block(0u, it_end, col0, col_last, $h0, group, first, blocks, wg_b);
var it_next = first_block.x;
var full_next = first_block.y != 0u;
var next_h = $h0 + it_next % group;
var next_s0 = (first + blocks - 1u - it_next / group) * BC;
$first_fetch
// Every block of queries that may see the tile, last first.
for (var it = it_next; it < it_end; it = it_next) {
    let h = next_h;
    let s0 = next_s0;
    let tile_full = full_next;
    let block_next = next_block(it + 1u, it_end, col0, col_last, $h0, group, first, blocks, wg_b);
    it_next = block_next.x;
    full_next = block_next.y != 0u;
    // The previous block is done with $done_with.
    workgroupBarrier();
    $puts
    workgroupBarrier();
    // The next block's loads are in flight during this one's products.
    if (it_next < it_end) {
        next_h = $h0 + it_next % group;
        next_s0 = (first + blocks - 1u - it_next / group) * BC;
        $fetch
    }
"#,
};

/// The key-major loop head over every block of queries that sees the tile (`first` and
/// `blocks` of them) and every query head of the KV head, with the next block's loads in
/// flight: `first_fetch` loads the first block into the carried registers, `puts` stores
/// them, `fetch` loads the next; `done_with` names the workgroup memory a block uses.
/// `h0` is the first query head the workgroup walks (`group` of them from there). With a
/// mask_mod ([`SPARSE_BLOCKS_AHEAD`]), `next_block` steps past the blocks where no pair can
/// be visible, and the prefetch fetches the next one visited; `it_next` is the step after
/// `it`.
pub(super) fn blocks_ahead(
    sparse: bool,
    h0: &str,
    (first_fetch, done_with): (Fragment, &str),
    puts: Fragment,
    fetch: Fragment,
) -> Fragment {
    let template = match sparse {
        true => SPARSE_BLOCKS_AHEAD,
        false => BLOCKS_AHEAD,
    };
    template.fill([
        ("h0", h0.into()),
        ("first_fetch", first_fetch),
        ("done_with", done_with.into()),
        ("puts", puts),
        ("fetch", fetch),
    ])
}

/// An output a flush adds into: its name, the flat index of register row `i`'s row in it,
/// and the width of its rows.
type Output<'a> = (&'a str, &'a dyn Fn(u32) -> String, Row);

/// The compensated flush of the register partial sums into the outputs, every few blocks
/// and after the last.
const FLUSH: Template = Template {
    name: "flush",
    needs: &[],
    text: r#"// Every $every rows summed, and after the last, the registers' partial sums are added
// into the output, their rounding error carried into the next partial (a compensated sum).
if (($done) % $period == 0u || $done == $steps) {
    $rows
}
"#,
};

/// Every `every` rows of the other axis (step `done` of `steps`, BC rows a step), and
/// after the last, each invocation adds its register accumulators of `outputs` into its
/// rows (`{row}_i`) of the outputs, compensated.
fn flush(
    (spec, t): (&KernelSpec, &Tiling),
    every: u32,
    done: &str,
    steps: &str,
    row: &str,
    outputs: &[Output],
) -> Fragment {
    let rows = (0..t.tm).map(|i| {
        let bases: Vec<String> = outputs.iter().map(|o| (o.1)(i)).collect();
        // Rows of one width share their offset (dK and dV of a key row).
        let shared = bases.iter().all(|x| *x == bases[0]);
        let mut adds = match shared {
            true => lines([format!("let base = {};", bases[0])]),
            false => Fragment::default(),
        };
        for ((name, _, width), at) in outputs.iter().zip(&bases) {
            let base = match shared {
                true => "base".to_string(),
                false => {
                    adds = adds.then(lines([format!("let base_{name} = {at};")]));
                    format!("base_{name}")
                }
            };
            adds = adds.then(flush_add((spec, t), (name, *width), i, &base));
        }
        guarded(Some(format!("{row}_{i} < dims.seq_len")), adds)
    });
    FLUSH.fill([
        ("every", every.to_string().into()),
        ("done", done.into()),
        ("period", uint(every.div_ceil(t.bc))),
        ("steps", steps.into()),
        ("rows", concat(rows)),
    ])
}

/// Rows a kernel sums in registers before adding the partial sums into its outputs: a
/// partial over a few dozen rows keeps the error of a blocked sum, where one running sum
/// over every row of a long sequence lost accuracy with its length. Each flush waits on a
/// load of the outputs (on an H100, flushing every 64 rows cost the long flash backward
/// 9%, every 128 about 5%). Key-major kernels sum over query rows, whose weights for a key
/// decay with distance under a causal mask, so their partials are kept shorter; a query
/// row's weights over its keys do not decay.
const FLUSH_ROWS: u32 = 128;
const FLUSH_KEYS: u32 = 256;

/// `t[base + columns] += acc` for row `i` of the invocation, compensated: `acc` keeps the
/// rounding error of the add, so that the next flush adds it back. Only columns within the
/// tensor's row are added (a narrower row of two widths ends before the tiling's).
fn flush_add(
    (spec, tiling): (&KernelSpec, &Tiling),
    (t, width): (&str, Row),
    i: u32,
    base: &str,
) -> Fragment {
    let adds = (0..tiling.dn).map(|n| {
        let mut add = vec![
            format!("let {t}at_{n} = {base} + (tx + {n}u * TX) * 4u;"),
            format!(
                "let {t}old_{n} = vec4<f32>({t}[{t}at_{n}], {t}[{t}at_{n} + 1u], {t}[{t}at_{n} + 2u], {t}[{t}at_{n} + 3u]);"
            ),
            format!("let {t}new_{n} = {t}old_{n} + {t}_{i}_{n};"),
            format!("{t}_{i}_{n} = two_sum_err4({t}old_{n}, {t}_{i}_{n}, {t}new_{n});"),
        ];
        for (k, c) in ["x", "y", "z", "w"].iter().enumerate() {
            add.push(format!("{t}[{t}at_{n} + {k}u] = {t}new_{n}.{c};"));
        }
        let within = index::within(spec, width, &format!("(tx + {n}u * TX) * 4u"));
        let cond = match (tiling.column_guard(n), within) {
            (Some(g), Some(c)) => Some(format!("{g} && {c}")),
            (g, c) => g.or(c),
        };
        guarded(cond, lines(add))
    });
    // The flush compensates with TwoSum.
    let adds = concat(adds);
    Fragment::new(adds.text, &[Helper::TwoSumErr4])
}

/// Schedule (c): dQ += dS·K for the staged queries, added into `dq` by atomics. Each
/// invocation takes (query, vec4 column) pairs, so a warp reads one dS entry (broadcast)
/// and consecutive rows of K.
const SCATTER_DQ: Template = Template {
    name: "scatter_dq",
    needs: &[],
    text: r#"for (var e = tid; e < BC * D4; e = e + WG) {
    let qq = e / D4;
    let c4 = e % D4;
    let s = s0 + qq;
    var acc = vec4<f32>(0.0);
    for (var r = 0u; r < BR; r = r + 1u) {
        let w = sh_ds[r * PSTRIDE + qq];
        if (w != 0.0) {
            acc = fma(vec4<f32>(w), sh_k[r * ROW4 + c4], acc);
        }
    }
    if ($cond) {
        let at = q_index(s, h) + c4 * 4u;
        add_dq(at, acc.x);
        add_dq(at + 1u, acc.y);
        add_dq(at + 2u, acc.z);
        add_dq(at + 3u, acc.w);
    }
}
"#,
};

/// Schedule (b): dK += dSᵀ·Q and dV += Pᵀ·dO for the staged keys, summed over the tile's
/// query rows and added into `dkv` by atomics, once per block (not once per product).
/// Each invocation takes (key, vec4 column) pairs, as in [`SCATTER_DQ`]. Query tile `t`
/// adds into lane `t % DKV_LANES` of `dkv` ([`crate::DKV_LANES`]).
const SCATTER_DKV: Template = Template {
    name: "flash_scatter_dkv",
    needs: &[],
    text: r#"const DKV_LANES: u32 = $lanes;
for (var e = tid; e < BC * D4; e = e + WG) {
    let kk = e / D4;
    let c4 = e % D4;
    let j = j0 + kk;
    var gk = vec4<f32>(0.0);
    var gv = vec4<f32>(0.0);
    // The tile's last rows, the farthest from the key, first.
    for (var rr = 0u; rr < BR; rr = rr + 1u) {
        let r = BR - 1u - rr;
        let w = sh_p[r * PSTRIDE + kk];
        let ds = sh_ds[r * PSTRIDE + kk];
        // A dropped P is 0 where dS is not.
        if (w != 0.0 || ds != 0.0) {
            gk = fma(vec4<f32>(ds), sh_q[r * ROW4 + c4], gk);
            gv = fma(vec4<f32>(w), sh_do[r * ROW4 + c4], gv);
        }
    }
    if (j < dims.seq_len && (any(gk != vec4<f32>(0.0)) || any(gv != vec4<f32>(0.0)))) {
        $adds
    }
}
"#,
};

/// The adds of [`SCATTER_DKV`] where dK's and dV's rows are of one width: dV's part
/// follows dK's in the tile's lane.
const DKV_ADDS: Template = Template {
    name: "dkv_adds",
    needs: &[],
    text: r#"// dK is part 0 of the tile's lane of dkv, dV part 1.
let at = (tile % DKV_LANES) * 2u * dkv_part1() + kv_index(j, kv_h) + c4 * 4u;
let dv_at = dkv_part1() + at;
$dk
$dv
"#,
};

/// The adds of [`SCATTER_DKV`] where the rows are of two widths, each row's own.
const DKV_ADDS_TWO_WIDTHS: Template = Template {
    name: "dkv_adds_two_widths",
    needs: &[],
    text: r#"// dK is part 0 of the tile's lane of dkv (rows QK_DIM wide), dV part 1 (V_DIM).
let lane0 = (tile % DKV_LANES) * dkv_lane();
$dk
$dv
"#,
};

/// The adds of [`SCATTER_DKV`]: gk into dK's row and gv into dV's, of the tile's lane.
fn scatter_dkv_adds(spec: &KernelSpec) -> Fragment {
    let adds = |at: &str, g: &str| {
        lines(
            ["x", "y", "z", "w"]
                .iter()
                .enumerate()
                .map(|(k, c)| match k {
                    0 => format!("add_dkv({at}, {g}.{c});"),
                    _ => format!("add_dkv({at} + {k}u, {g}.{c});"),
                }),
        )
    };
    if !spec.split_dims() {
        return DKV_ADDS.fill([("dk", adds("at", "gk")), ("dv", adds("dv_at", "gv"))]);
    }
    // Each within its own row: dK's QK_DIM columns, dV's V_DIM.
    let within = |row| index::within(spec, row, "c4 * 4u");
    let k =
        lines(["let at = lane0 + kv_index(j, kv_h) + c4 * 4u;".to_string()]).then(adds("at", "gk"));
    let v = lines(["let dv_at = lane0 + dkv_part1() + v_index(j, kv_h) + c4 * 4u;".to_string()])
        .then(adds("dv_at", "gv"));
    DKV_ADDS_TWO_WIDTHS.fill([
        ("dk", guarded(within(Row::Qk), k)),
        ("dv", guarded(within(Row::V), v)),
    ])
}

/// A tensor read by `products`: its two arrays and the index of register `i`'s row in them.
type Operand<'a> = (&'a str, &'a str, &'a dyn Fn(u32) -> String);

/// `s = a·bᵀ` and `dp = a2·b2ᵀ` over head_dim for the invocation's block: `own` rows
/// against `staged` columns.
fn products(t: &Tiling, own: Operand, staged: Operand) -> Fragment {
    let (tm, tn) = (t.tm, t.tn);
    let a = (0..tm).flat_map(|i| {
        let at = (own.2)(i);
        [
            format!("let a_{i} = {}[{at} * ROW4 + d4];", own.0),
            format!("let a2_{i} = {}[{at} * ROW4 + d4];", own.1),
        ]
    });
    let b = (0..tn).flat_map(|n| {
        let at = (staged.2)(n);
        [
            format!("let b_{n} = {}[{at} * ROW4 + d4];", staged.0),
            format!("let b2_{n} = {}[{at} * ROW4 + d4];", staged.1),
        ]
    });
    // Four chains per product, one per vec4 component: the order of numerics::dot, in
    // which backward_prep sums D, so that dP − D cancels exactly where a row attends to
    // one key.
    let fmas = regs(tm, tn).flat_map(|(i, n)| {
        [
            format!("s_{i}_{n}_b = fma(a_{i}, b_{n}, s_{i}_{n}_b);"),
            format!("dp_{i}_{n}_b = fma(a2_{i}, b2_{n}, dp_{i}_{n}_b);"),
        ]
    });
    let body = lines(a.chain(b).chain(fmas));
    let accs: Vec<String> = regs(tm, tn)
        .flat_map(|(i, n)| [format!("s_{i}_{n}"), format!("dp_{i}_{n}")])
        .collect();
    let sums = regs(tm, tn).flat_map(|(i, n)| {
        [
            format!("let s_{i}_{n} = hsum(s_{i}_{n}_4);"),
            format!("let dp_{i}_{n} = hsum(dp_{i}_{n}_4);"),
        ]
    });
    let products = dot_loop(t.d4, &accs, "d4", &body.text);
    products.then(Fragment::new(lines(sums).text, &[Helper::Hsum]))
}
