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

use super::numerics::Helper;
use super::writer::{Fragment, Template, Wgsl};
use std::fmt::Write;

use super::flash::{accumulate, carried, fetch, per_vec4, put, regs, stage, tile_key_range};
use super::index::{Row, Rows};
use super::numerics::dot_loop;
use super::{backward, index};
use crate::layout::tiling::Tiling;
use crate::spec::KernelSpec;

fn head_rows(out: &mut Wgsl, names: &[&str], rows: u32, t: &Tiling) {
    for name in names {
        let _ = writeln!(
            out,
            "var<workgroup> {name}: array<vec4<f32>, {}>;",
            rows * t.row4
        );
    }
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

pub(super) fn backward_q(out: &mut Wgsl, spec: &KernelSpec, t: &Tiling) {
    super::flash::constants(out, t);
    head_rows(out, &["sh_q", "sh_do"], t.br, t);
    head_rows(out, &["sh_k", "sh_v"], t.bc, t);
    let tile = t.br * (t.bc + 1);
    let _ = write!(
        out,
        "var<workgroup> sh_ds: array<f32, {tile}>;\nvar<workgroup> sh_range: vec4<u32>;\n\n"
    );
    let scatter_kv = spec.write_mode("dkv").is_some();
    if scatter_kv {
        let _ = write!(
            out,
            "// P of the block, for dV.\nvar<workgroup> sh_p: array<f32, {tile}>;\n\n"
        );
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
    let lp = super::tiles::KeyLoop::of(spec, true);
    q_body(out, spec, t, &lp, scatter_kv);
    super::flash::entry(out, spec, t, "flash_backward_q");
}

fn q_body(
    out: &mut Wgsl,
    spec: &KernelSpec,
    t: &Tiling,
    lp: &super::tiles::KeyLoop,
    scatter_kv: bool,
) {
    let (tm, tn, dn) = (t.tm, t.tn, t.dn);
    let mut b = String::from(
        "fn flash_backward_q(tile: u32, h: u32, tid: u32) {\n    let kv_h = kv_head(h);\n    \
         let g = tid / TX;\n    let tx = tid % TX;\n    let row0 = tile * BR;\n    \
         if (tid == 0u) {\n        sh_range = tile_key_range(row0);\n    }\n    \
         stage_q(row0, h, tid);\n    stage_do(row0, h, tid);\n",
    );
    for i in 0..tm {
        let _ = write!(
            b,
            "    let row_{i} = row0 + g * TM + {i}u;\n    var lo_{i} = 0u;\n    var hi_{i} = 0u;\n    \
             var lse_{i} = 0.0;\n    var delta_{i} = 0.0;\n    if (row_{i} < dims.seq_len) {{\n        \
             let range = key_range(row_{i});\n        lo_{i} = range.x;\n        hi_{i} = range.y;\n        \
             lse_{i} = stats[stats_part(0u, row_{i}, h)];\n        \
             delta_{i} = stats[stats_part(1u, row_{i}, h)];\n    }}\n"
        );
        for n in 0..dn {
            let _ = writeln!(b, "    var dq_{i}_{n} = vec4<f32>(0.0);");
        }
    }
    // Each invocation carries its share of the next K and V block in registers.
    let pf = carried(t, t.bc);
    let fetch = |r0: &str, ind: &str| {
        per_vec4(pf, ind, |i| {
            format!(
                "pk_{i} = fetch_k({r0}, kv_h, tid + {i}u * WG);\n{ind}\
                 pv_{i} = fetch_v({r0}, kv_h, tid + {i}u * WG);"
            )
        })
    };
    let _ = write!(
        b,
        "    let range = workgroupUniformLoad(&sh_range);\n    \
         let kt_end = (range.y + BC - 1u) / BC;\n{}{}{}    \
         {}        \
         let j0 = kt * BC;\n        \
         // The previous block is done with sh_k and sh_ds.\n        workgroupBarrier();\n{}        \
         workgroupBarrier();\n        \
         // The next block's loads are in flight during this one's products.\n        \
         if ({}) {{\n{}        }}\n",
        &lp.pre,
        per_vec4(pf, "    ", |i| format!(
            "var pk_{i} = vec4<f32>(0.0);\n    var pv_{i} = vec4<f32>(0.0);"
        )),
        fetch(lp.first, "    "),
        lp.head,
        per_vec4(pf, "        ", |i| format!(
            "put_k(tid + {i}u * WG, pk_{i});\n        put_v(tid + {i}u * WG, pv_{i});"
        )),
        lp.has_next,
        fetch(lp.next, "            "),
    );
    products(
        &mut b,
        t,
        ("sh_q", "sh_do", &|i| format!("(g * TM + {i}u)")),
        ("sh_k", "sh_v", &|n| format!("(tx + {n}u * TX)")),
    );
    for n in 0..tn {
        let _ = writeln!(b, "        let j_{n} = j0 + tx + {n}u * TX;");
    }
    for (i, n) in regs(tm, tn) {
        let _ = write!(
            b,
            "        let v_{i}_{n} = j_{n} >= lo_{i} && j_{n} < hi_{i} && {}key_visible(row_{i}, h, j_{n}){};\n        \
             let x_{i}_{n} = scored(row_{i}, h, j_{n}, s_{i}_{n});\n        \
             let p_{i}_{n} = exp_f32(x_{i}_{n}.x - lse_{i});\n        \
             let g_{i}_{n} = score_grads(row_{i}, h, j_{n}, s_{i}_{n}, x_{i}_{n}, p_{i}_{n} * (dropped(row_{i}, h, j_{n}, dp_{i}_{n}) - delta_{i}), v_{i}_{n});\n        \
             sh_ds[(g * TM + {i}u) * PSTRIDE + tx + {n}u * TX] = params.scale * g_{i}_{n};\n",
            lp.full.0, lp.full.1,
        );
        if scatter_kv {
            let _ = writeln!(
                b,
                "        sh_p[(g * TM + {i}u) * PSTRIDE + tx + {n}u * TX] = select(0.0, dropped(row_{i}, h, j_{n}, p_{i}_{n}), v_{i}_{n});"
            );
        }
    }
    b.push_str(
        "        workgroupBarrier();\n        \
         // As in the forward: only blocks some row sees in part need the guard on dS == 0.\n        \
         if (range.z <= j0 && j0 + BC <= range.w) {\n",
    );
    accumulate(&mut b, tm, dn, &[("dq", "sh_ds", "sh_k")], false, false);
    b.push_str("        } else {\n");
    accumulate(&mut b, tm, dn, &[("dq", "sh_ds", "sh_k")], true, false);
    b.push_str("        }\n");
    if scatter_kv {
        let _ = writeln!(b, "        const DKV_LANES: u32 = {}u;", crate::DKV_LANES);
        b.push_str(&SCATTER_DKV.fill([("adds", scatter_dkv_adds(spec))]).text);
    }
    flush(
        &mut b,
        (spec, t),
        FLUSH_KEYS,
        "kt + 1u - range.x / BC",
        lp.steps,
        "row",
        &[("dq", &|i| format!("q_index(row_{i}, h)"), Row::Qk)],
    );
    b.push_str("    }\n}\n\n");
    // `products` sums with hsum, P is exponentiated, `flush` compensates with TwoSum.
    out.put(Fragment::new(
        b,
        &[Helper::Hsum, Helper::Exp, Helper::TwoSumErr4],
    ));
}

pub(super) fn backward_kv(out: &mut Wgsl, spec: &KernelSpec, t: &Tiling) {
    super::flash::constants(out, t);
    head_rows(out, &["sh_k", "sh_v"], t.br, t);
    head_rows(out, &["sh_q", "sh_do"], t.bc, t);
    let _ = write!(
        out,
        "var<workgroup> sh_p: array<f32, {tile}>;\nvar<workgroup> sh_ds: array<f32, {tile}>;\n\
         // (LSE, D) of each staged query row.\nvar<workgroup> sh_stats: array<vec2<f32>, {}>;\n\
         var<workgroup> sh_range: vec4<u32>;\n\n",
        t.bc,
        tile = t.br * (t.bc + 1)
    );
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
    let _ = write!(
        out,
        "// query_range is monotone in the key (document starts and ends never decrease, causal\n\
         // starts grow), so the first and last keys of the tile bound the queries that see any key\n\
         // of it, and those in [last.x, first.y) see all of them.\n\
         fn tile_query_range(col0: u32) -> vec4<u32> {{\n    \
         let first = query_range(col0);\n    \
         let last = query_range(min(col0 + BR, dims.seq_len) - 1u);\n    \
         return {ret};\n}}\n\n"
    );
    out.push_str(STATS);
    if super::tiles::sparse(spec) {
        super::tiles::block_functions(out);
    }
}

const STATS: &str = r#"fn fetch_stats(s0: u32, h: u32, e: u32) -> vec2<f32> {
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

"#;

fn kv_body(out: &mut Wgsl, spec: &KernelSpec, t: &Tiling, scatter_dq: bool) {
    let sparse = super::tiles::sparse(spec);
    let (tm, tn, dn) = (t.tm, t.tn, t.dn);
    let mut b = String::from(
        "fn flash_backward_kv(tile: u32, kv_h: u32, tid: u32) {\n    let g = tid / TX;\n    \
         let tx = tid % TX;\n    let col0 = tile * BR;\n    \
         if (tid == 0u) {\n        sh_range = tile_query_range(col0);\n    }\n    \
         stage_k(col0, kv_h, tid);\n    stage_v(col0, kv_h, tid);\n",
    );
    b.push_str(super::tiles::share_batch(spec));
    for i in 0..tm {
        let _ = writeln!(b, "    let col_{i} = col0 + g * TM + {i}u;");
        for n in 0..dn {
            let _ = writeln!(
                b,
                "    var dk_{i}_{n} = vec4<f32>(0.0);\n    var dv_{i}_{n} = vec4<f32>(0.0);"
            );
        }
    }
    // Each invocation carries its share of the next block of Q, dO and (LSE, D).
    let (pf, ps) = (carried(t, t.bc), t.bc.div_ceil(t.groups * t.tx));
    let fetch = |ind: &str| {
        let rows = per_vec4(pf, ind, |i| {
            format!(
                "pq_{i} = fetch_q(next_s0, next_h, tid + {i}u * WG);\n{ind}\
                 pd_{i} = fetch_do(next_s0, next_h, tid + {i}u * WG);"
            )
        });
        let stats = per_vec4(ps, ind, |i| {
            format!("ps_{i} = fetch_stats(next_s0, next_h, tid + {i}u * WG);")
        });
        rows + &stats
    };
    let _ = write!(
        b,
        "    let range = workgroupUniformLoad(&sh_range);\n    let group = q_per_kv();\n    \
         let first = range.x / BC;\n    let blocks = (range.y + BC - 1u) / BC - first;\n{}{}{}",
        per_vec4(pf, "    ", |i| format!(
            "var pq_{i} = vec4<f32>(0.0);\n    var pd_{i} = vec4<f32>(0.0);"
        )),
        per_vec4(ps, "    ", |i| format!("var ps_{i} = vec2<f32>(0.0);")),
        query_blocks_ahead(
            sparse,
            "kv_h * group",
            &fetch("    "),
            "sh_q, sh_do, sh_p and sh_ds",
            &(per_vec4(pf, "        ", |i| format!(
                "put_q(tid + {i}u * WG, pq_{i});\n        put_do(tid + {i}u * WG, pd_{i});"
            )) + &per_vec4(ps, "        ", |i| format!(
                "put_stats(tid + {i}u * WG, ps_{i});"
            ))),
            &fetch("            "),
        ),
    );
    products(
        &mut b,
        t,
        ("sh_k", "sh_v", &|i| format!("(g * TM + {i}u)")),
        ("sh_q", "sh_do", &|n| format!("(tx + {n}u * TX)")),
    );
    for n in 0..tn {
        let _ = writeln!(
            b,
            "        let q_{n} = s0 + tx + {n}u * TX;\n        let st_{n} = sh_stats[tx + {n}u * TX];"
        );
    }
    for (i, n) in regs(tm, tn) {
        let _ = write!(
            b,
            "        let v_{i}_{n} = q_{n} < dims.seq_len && col_{i} < dims.seq_len && visible(q_{n}, h, col_{i});\n        \
             let x_{i}_{n} = scored(q_{n}, h, col_{i}, s_{i}_{n});\n        \
             let p_{i}_{n} = select(0.0, exp_f32(x_{i}_{n}.x - st_{n}.x), v_{i}_{n});\n        \
             let g_{i}_{n} = score_grads(q_{n}, h, col_{i}, s_{i}_{n}, x_{i}_{n}, p_{i}_{n} * (dropped(q_{n}, h, col_{i}, dp_{i}_{n}) - st_{n}.y), v_{i}_{n});\n        \
             sh_p[(g * TM + {i}u) * PSTRIDE + tx + {n}u * TX] = dropped(q_{n}, h, col_{i}, p_{i}_{n});\n        \
             sh_ds[(g * TM + {i}u) * PSTRIDE + tx + {n}u * TX] = params.scale * g_{i}_{n};\n"
        );
    }
    b.push_str("        workgroupBarrier();\n        if (range.z <= s0 && s0 + BC <= range.w) {\n");
    let pairs = [("dv", "sh_p", "sh_do"), ("dk", "sh_ds", "sh_q")];
    accumulate(&mut b, tm, dn, &pairs, false, true);
    b.push_str("        } else {\n");
    accumulate(&mut b, tm, dn, &pairs, true, true);
    b.push_str("        }\n");
    if scatter_dq {
        let cond = "s < dims.seq_len && any(acc != vec4<f32>(0.0))";
        let fill = index::and_within(spec, cond, Row::Qk, "c4 * 4u");
        b.push_str(&SCATTER_DQ.fill([("cond", fill.into())]).text);
    }
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
        &mut b,
        (spec, t),
        FLUSH_ROWS,
        "it + 1u",
        steps,
        "col",
        &[
            ("dk", &|i| format!("kv_index(col_{i}, kv_h)"), Row::Qk),
            ("dv", &|i| format!("{v_index}(col_{i}, kv_h)"), Row::V),
        ],
    );
    b.push_str("    }\n}\n\n");
    // `products` sums with hsum, P is exponentiated, `flush` compensates with TwoSum.
    out.put(Fragment::new(
        b,
        &[Helper::Hsum, Helper::Exp, Helper::TwoSumErr4],
    ));
}

/// The key-major loop head over every block of queries that sees the tile (`first` and
/// `blocks` of them) and every query head of the KV head, with the next block's loads in
/// flight: `first_fetch` loads the first block into the carried registers, `puts` stores
/// them, `fetch` loads the next; `done_with` names the workgroup memory a block uses.
/// `h0` is the first query head the workgroup walks (`group` of them from there).
pub(super) fn query_blocks_ahead(
    sparse: bool,
    h0: &str,
    first_fetch: &str,
    done_with: &str,
    puts: &str,
    fetch: &str,
) -> String {
    if sparse {
        return sparse_blocks_ahead(h0, first_fetch, done_with, puts, fetch);
    }
    format!(
        "    var next_h = {h0};\n    var next_s0 = (first + blocks - 1u) * BC;\n{first_fetch}    \
         // Every block of queries that sees the tile, last first, and within a block every\n    \
         // query head of this KV head: under a causal or document mask a key's weights\n    \
         // shrink with the query's distance, so the small terms are added while the sums\n    \
         // are small (summed the other way, the error grew with the sequence).\n    \
         for (var it = 0u; it < group * blocks; it = it + 1u) {{\n        \
         let h = next_h;\n        let s0 = next_s0;\n        \
         // The previous block is done with {done_with}.\n        \
         workgroupBarrier();\n{puts}        workgroupBarrier();\n        \
         // The next block's loads are in flight during this one's products.\n        \
         if (it + 1u < group * blocks) {{\n            \
         next_h = {h0} + (it + 1u) % group;\n            \
         next_s0 = (first + blocks - 1u - (it + 1u) / group) * BC;\n{fetch}        }}\n"
    )
}

/// [`query_blocks_ahead`] over only the blocks (and heads) whose tile the mask may show:
/// `next_block` steps past those where no pair can be visible, and the prefetch fetches the
/// next one visited; `it_next` is the step after `it`.
fn sparse_blocks_ahead(
    h0: &str,
    first_fetch: &str,
    done_with: &str,
    puts: &str,
    fetch: &str,
) -> String {
    format!(
        "    let it_end = group * blocks;\n    \
         let col_last = min(col0 + BR, dims.seq_len) - 1u;\n    \
         var it_next = next_block(0u, it_end, col0, col_last, {h0}, group, first, blocks, wg_b);\n    \
         var next_h = {h0} + it_next % group;\n    \
         var next_s0 = (first + blocks - 1u - it_next / group) * BC;\n{first_fetch}    \
         // Every block of queries that may see the tile, last first (see query_blocks_ahead).\n    \
         for (var it = it_next; it < it_end; it = it_next) {{\n        \
         let h = next_h;\n        let s0 = next_s0;\n        \
         it_next = next_block(it + 1u, it_end, col0, col_last, {h0}, group, first, blocks, wg_b);\n        \
         // The previous block is done with {done_with}.\n        \
         workgroupBarrier();\n{puts}        workgroupBarrier();\n        \
         // The next block's loads are in flight during this one's products.\n        \
         if (it_next < it_end) {{\n            \
         next_h = {h0} + it_next % group;\n            \
         next_s0 = (first + blocks - 1u - it_next / group) * BC;\n{fetch}        }}\n"
    )
}

/// An output a flush adds into: its name, the flat index of register row `i`'s row in it,
/// and the width of its rows.
type Output<'a> = (&'a str, &'a dyn Fn(u32) -> String, Row);

/// Every `every` rows of the other axis (step `done` of `steps`, BC rows a step), and
/// after the last, each invocation adds its register accumulators of `outputs` into its
/// rows (`{row}_i`) of the outputs, compensated.
fn flush(
    b: &mut String,
    (spec, t): (&KernelSpec, &Tiling),
    every: u32,
    done: &str,
    steps: &str,
    row: &str,
    outputs: &[Output],
) {
    let _ = writeln!(
        b,
        "        // Every {every} rows summed, and after the last, the registers' partial sums \
         are added\n        // into the output, their rounding error carried into the next \
         partial (a compensated sum).\n        \
         if (({done}) % {}u == 0u || {done} == {steps}) {{",
        every.div_ceil(t.bc)
    );
    for i in 0..t.tm {
        let bases: Vec<String> = outputs.iter().map(|o| (o.1)(i)).collect();
        // Rows of one width share their offset (dK and dV of a key row).
        let shared = bases.iter().all(|x| *x == bases[0]);
        let _ = writeln!(b, "            if ({row}_{i} < dims.seq_len) {{");
        if shared {
            let _ = writeln!(b, "                let base = {};", bases[0]);
        }
        for ((name, _, width), at) in outputs.iter().zip(&bases) {
            let base = match shared {
                true => "base".to_string(),
                false => {
                    let _ = writeln!(b, "                let base_{name} = {at};");
                    format!("base_{name}")
                }
            };
            flush_add(b, (spec, t), (name, *width), i, &base);
        }
        b.push_str("            }\n");
    }
    b.push_str("        }\n");
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
    b: &mut String,
    (spec, tiling): (&KernelSpec, &Tiling),
    (t, width): (&str, Row),
    i: u32,
    base: &str,
) {
    let ind = "                ";
    for n in 0..tiling.dn {
        let mut lines = vec![
            format!("let {t}at_{n} = {base} + (tx + {n}u * TX) * 4u;"),
            format!(
                "let {t}old_{n} = vec4<f32>({t}[{t}at_{n}], {t}[{t}at_{n} + 1u], {t}[{t}at_{n} + 2u], {t}[{t}at_{n} + 3u]);"
            ),
            format!("let {t}new_{n} = {t}old_{n} + {t}_{i}_{n};"),
            format!("{t}_{i}_{n} = two_sum_err4({t}old_{n}, {t}_{i}_{n}, {t}new_{n});"),
        ];
        for (k, c) in ["x", "y", "z", "w"].iter().enumerate() {
            lines.push(format!("{t}[{t}at_{n} + {k}u] = {t}new_{n}.{c};"));
        }
        let guarded = match index::within(spec, width, &format!("(tx + {n}u * TX) * 4u")) {
            None => tiling.guarded(n, &lines.join(&format!("\n{ind}")), ind),
            Some(c) => {
                let cond = match tiling.column_guard(n) {
                    Some(g) => format!("{g} && {c}"),
                    None => c,
                };
                format!(
                    "if ({cond}) {{\n{ind}    {}\n{ind}}}",
                    lines.join(&format!("\n{ind}    "))
                )
            }
        };
        let _ = writeln!(b, "{ind}{guarded}");
    }
}

/// Schedule (c): dQ += dS·K for the staged queries, added into `dq` by atomics. Each
/// invocation takes (query, vec4 column) pairs, so a warp reads one dS entry (broadcast)
/// and consecutive rows of K.
const SCATTER_DQ: Template = Template {
    name: "scatter_dq",
    needs: &[],
    text: r#"        for (var e = tid; e < BC * D4; e = e + WG) {
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
/// Each invocation takes (key, vec4 column) pairs, as in [`SCATTER_DQ`].
const SCATTER_DKV: Template = Template {
    name: "scatter_dkv",
    needs: &[],
    text: r#"        for (var e = tid; e < BC * D4; e = e + WG) {
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

/// The adds of [`SCATTER_DKV`]: gk into dK's row and gv into dV's, of the tile's lane.
fn scatter_dkv_adds(spec: &KernelSpec) -> Fragment {
    let adds = |at: &str, g: &str| -> String {
        ["x", "y", "z", "w"]
            .iter()
            .enumerate()
            .map(|(k, c)| match k {
                0 => format!("add_dkv({at}, {g}.{c});\n"),
                _ => format!("add_dkv({at} + {k}u, {g}.{c});\n"),
            })
            .collect()
    };
    if !spec.split_dims() {
        return format!(
            "// dK is part 0 of the tile's lane of dkv, dV part 1.\n\
             let at = (tile % DKV_LANES) * 2u * dkv_part1() + kv_index(j, kv_h) + c4 * 4u;\n\
             let dv_at = dkv_part1() + at;\n{}{}",
            adds("at", "gk"),
            adds("dv_at", "gv")
        )
        .into();
    }
    // Each within its own row: dK's QK_DIM columns, dV's V_DIM.
    let guarded = |row, line: String| match index::within(spec, row, "c4 * 4u") {
        Some(c) => format!("if ({c}) {{\n{}}}\n", indent(&line)),
        None => line,
    };
    let k = format!(
        "let at = lane0 + kv_index(j, kv_h) + c4 * 4u;\n{}",
        adds("at", "gk")
    );
    let v = format!(
        "let dv_at = lane0 + dkv_part1() + v_index(j, kv_h) + c4 * 4u;\n{}",
        adds("dv_at", "gv")
    );
    format!(
        "// dK is part 0 of the tile's lane of dkv (rows QK_DIM wide), dV part 1 (V_DIM).\n\
         let lane0 = (tile % DKV_LANES) * dkv_lane();\n{}{}",
        guarded(Row::Qk, k),
        guarded(Row::V, v)
    )
    .into()
}

fn indent(lines: &str) -> String {
    lines.lines().map(|l| format!("    {l}\n")).collect()
}

/// A tensor read by `products`: its two arrays and the index of register `i`'s row in them.
type Operand<'a> = (&'a str, &'a str, &'a dyn Fn(u32) -> String);

/// `s = a·bᵀ` and `dp = a2·b2ᵀ` over head_dim for the invocation's block: `own` rows
/// against `staged` columns.
fn products(b: &mut String, t: &Tiling, own: Operand, staged: Operand) {
    let (tm, tn) = (t.tm, t.tn);
    let mut body = String::new();
    for i in 0..tm {
        let at = (own.2)(i);
        let _ = writeln!(
            body,
            "let a_{i} = {}[{at} * ROW4 + d4];\nlet a2_{i} = {}[{at} * ROW4 + d4];",
            own.0, own.1
        );
    }
    for n in 0..tn {
        let at = (staged.2)(n);
        let _ = writeln!(
            body,
            "let b_{n} = {}[{at} * ROW4 + d4];\nlet b2_{n} = {}[{at} * ROW4 + d4];",
            staged.0, staged.1
        );
    }
    // Four chains per product, one per vec4 component: the order of numerics::dot, in
    // which backward_prep sums D, so that dP − D cancels exactly where a row attends to
    // one key.
    for (i, n) in regs(tm, tn) {
        let _ = writeln!(
            body,
            "s_{i}_{n}_b = fma(a_{i}, b_{n}, s_{i}_{n}_b);\ndp_{i}_{n}_b = fma(a2_{i}, b2_{n}, dp_{i}_{n}_b);"
        );
    }
    let accs: Vec<String> = regs(tm, tn)
        .flat_map(|(i, n)| [format!("s_{i}_{n}"), format!("dp_{i}_{n}")])
        .collect();
    b.push_str(&dot_loop(t.d4, &accs, "d4", &body, "        "));
    for (i, n) in regs(tm, tn) {
        let _ = writeln!(
            b,
            "        let s_{i}_{n} = hsum(s_{i}_{n}_4);\n        let dp_{i}_{n} = hsum(dp_{i}_{n}_4);"
        );
    }
}
