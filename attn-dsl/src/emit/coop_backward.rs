//! The tiled recompute backward (schedule (d)) on cooperative matrices: the five products
//! of the flash backward as 16x16x16 products of f16 operands into f32 accumulators, in
//! the two halves of [`super::flash_backward`]:
//!
//! - `backward_q` (s-major) owns BR query rows: per block of BC keys, S = Q·Kᵀ and
//!   dP = dO·Vᵀ, then dS = scale·P·(dP − D) with P = exp(S − LSE) elementwise, then
//!   dQ += dS·K.
//! - `backward_kv` (j-major) owns BR key rows: per block of BC query rows of each query
//!   head of its KV head (K and V loaded once for the group), Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ,
//!   then Pᵀ and dSᵀ, then dV += Pᵀ·dO and dK += dSᵀ·Q.
//!
//! Each subgroup holds its 16 owned rows of both operand tensors as A fragments for the
//! whole pass (staged once through workgroup memory, which the blocks then reuse). P and
//! dS are rounded to f16 as the products' operands, as FlashAttention does; S and dP stay
//! f32 in workgroup memory for the elementwise step. The gradients are summed in the
//! accumulators over every block and added into the f32 outputs once, at the end.

use super::writer::{Fragment, Template, Wgsl};
use std::fmt::Write;

use super::coop::{self, A, C, CoopTiling, FRAG, Phases};
use super::coop_scale;
use super::index::{self, Row, Rows};
use crate::spec::{KernelSpec, Op, WriteMode};

/// The half's names: its body, the owned and streamed (fetch name, tensor, index)
/// triples, the row and head of an owned row, and the accumulators with their outputs.
struct Half {
    body: &'static str,
    /// The two owned operands, and for the dQ half O, for D.
    own: &'static [(&'static str, &'static str, Rows)],
    streamed: [(&'static str, &'static str, Rows); 2],
    /// (accumulator, output tensor, weights in workgroup memory, their fragments' tag,
    /// the staged tensor they multiply: 0 the block's first, 1 its second)
    sums: &'static [(&'static str, &'static str, &'static str, &'static str, u32)],
}

const Q_HALF: Half = Half {
    body: "coop_backward_q",
    own: &[
        ("q", "q", Rows::Q),
        ("do", "d_o", Rows::O),
        ("o", "o", Rows::O),
    ],
    streamed: [("k", "k", Rows::K), ("v", "v", Rows::V)],
    sums: &[("dq", "dq", "sh_ds", "ds", 0)],
};

const KV_HALF: Half = Half {
    body: "coop_backward_kv",
    own: &[("k", "k", Rows::K), ("v", "v", Rows::V)],
    streamed: [("q", "q", Rows::Q), ("do", "d_o", Rows::O)],
    sums: &[("dv", "dv", "sh_p", "p", 1), ("dk", "dk", "sh_ds", "ds", 0)],
};

/// Whether an accumulator's output has V's rows (dV) rather than Q's and K's (dQ, dK).
fn v_rows(output: &str) -> bool {
    output == "dv"
}

/// Whether the key-major half adds dK and dV by atomics: then each workgroup serves one
/// query head (the grid walks query heads, not KV heads), so a small problem spreads over
/// `n_heads / n_kv_heads` times the workgroups, at the price of loading K and V per query
/// head.
fn scatters(spec: &KernelSpec) -> bool {
    spec.op == Op::BackwardKv && spec.write_mode("dk") == Some(WriteMode::AtomicScatter)
}

pub(super) fn kernel(out: &mut Wgsl, spec: &KernelSpec, t: &CoopTiling, keep: Phases) {
    let kv = spec.op == Op::BackwardKv;
    let half = if kv { &KV_HALF } else { &Q_HALF };
    let scattered = scatters(spec);
    constants(out, t);
    workgroup_memory(out, t, kv);
    super::flash_backward::helpers(out, spec);
    if scattered {
        for (_, output, ..) in half.sums {
            super::scatter::atomic_add(out, spec, output);
        }
    }
    let (own_rows, block_rows) = ("BR", "BC");
    if t.scaled {
        coop_scale::row_bits(out);
        coop_scale::note_scales(out, false);
        coop_scale::reference_constants(out);
    }
    for &(name, tensor, of) in half.own {
        coop::block_fetch(out, spec, t, (name, tensor, of, own_rows), false);
    }
    for &(name, tensor, of) in &half.streamed {
        coop::block_fetch(out, spec, t, (name, tensor, of, block_rows), true);
    }
    coop::put(out);
    for (i, (name, ..)) in half.own.iter().enumerate() {
        coop::stage_rows(out, &format!("stage_own{i}"), "BR", &[(name, "0u")]);
    }
    match kv {
        true => super::flash_backward::query_tiles(out, spec),
        false => super::flash::tile_key_range(out, spec),
    }
    let mut b = String::new();
    prologue(&mut b, t, half, kv, scattered);
    match kv {
        true => {
            b.push_str(super::tiles::share_batch(spec));
            kv_loop(&mut b, t, scattered, super::tiles::sparse(spec))
        }
        false => q_loop(&mut b, t, &super::tiles::KeyLoop::of(spec, true)),
    }
    let mut elementwise = match (kv, t.scaled) {
        (true, false) => KV_ELEMENTWISE.plain(),
        (false, false) => Q_ELEMENTWISE.plain(),
        (_, true) => Fragment {
            text: scaled_elementwise(t, half, kv),
            needs: super::writer::Needs::NONE,
        },
    };
    if !keep.softmax {
        elementwise = Fragment {
            text: String::new(),
            needs: super::writer::Needs::NONE,
        };
    }
    products(&mut b, t, half, &elementwise.text, keep);
    if t.scaled {
        for (acc, ..) in half.sums {
            coop_scale::final_factor(&mut b, acc);
        }
    }
    finish(&mut b, (spec, t), half, kv, scattered);
    out.put(Fragment {
        text: b,
        needs: elementwise.needs,
    });
    coop::entry(out, spec, half.body);
}

fn constants(out: &mut Wgsl, t: &CoopTiling) {
    let (ks, ss, ps) = t.strides();
    let (rows, lanes, keys) = coop::softmax_layout(t);
    let _ = write!(
        out,
        "// Cooperative-matrix tiling: BR owned rows per workgroup, {FRAG} per subgroup; BC rows\n\
         // per staged block; row strides KS (staged f16 rows), SS (S and dP, f32), PS (P and\n\
         // dS, f16).\n\
         const BR: u32 = {}u;\nconst BC: u32 = {}u;\n\
         // Row groups of 16 owned rows, and subgroups per row group.\n\
         const NRG: u32 = {}u;\nconst SPLIT: u32 = {}u;\n\
         const KS: u32 = {ks}u;\nconst SS: u32 = {ss}u;\nconst PS: u32 = {ps}u;\n\
         // The elementwise step: rows per subgroup, invocations per row, columns each\n\
         // (interleaved, so that the row's invocations read consecutive words).\n\
         const EROWS: u32 = {rows}u;\nconst ELANES: u32 = {lanes}u;\nconst ECOLS: u32 = {keys}u;\n\
         // P = 2^((s − LSE)·LOG2E) by the hardware's exp2: P and dS are rounded to f16\n\
         // (2^-11) before their products, far above its error.\nconst LOG2E: f32 = 1.442695041;\n\n",
        t.br,
        t.bc,
        t.br / FRAG,
        t.split,
    );
}

fn workgroup_memory(out: &mut Wgsl, t: &CoopTiling, kv: bool) {
    let (ks, ss, ps) = t.strides();
    let _ = write!(
        out,
        "// Each owned tensor (rows 0..BR) in turn until its fragments are loaded; then each\n\
         // block's two tensors, from rows 0 and BC.\n\
         var<workgroup> sh_kv: array<vec4<f16>, {}>;\n\
         var<workgroup> sh_s: array<f32, {}>;\nvar<workgroup> sh_dp: array<f32, {}>;\n\
         var<workgroup> sh_ds: array<f16, {}>;\nvar<workgroup> sh_range: vec4<u32>;\n",
        t.backward_staged_rows() * ks / 4,
        t.br * ss,
        t.br * ss,
        t.br * ps,
    );
    if kv {
        let _ = write!(
            out,
            "var<workgroup> sh_p: array<f16, {}>;\n\
             // (LSE, D) of each staged query row.\nvar<workgroup> sh_stats: array<vec2<f32>, BC>;\n",
            t.br * ps
        );
    }
    if t.scaled {
        let accs: &[&str] = match kv {
            true => &["dv", "dk"],
            false => &["dq"],
        };
        coop_scale::reference_memory(out, accs);
    }
    out.push('\n');
}

/// The owned rows' fragments, the accumulators, the elementwise step's row and the block
/// range, up to the block loop.
fn prologue(b: &mut String, t: &CoopTiling, half: &Half, kv: bool, scattered: bool) {
    let (head, row0) = match kv {
        true => ("kv_h", "col0"),
        false => ("h", "row0"),
    };
    let (param, kv_head) = match scattered {
        true => ("qh", "    let kv_h = kv_head(qh);\n"),
        false => (head, ""),
    };
    let _ = write!(
        b,
        "fn {}(tile: u32, {param}: u32, tid: u32, sg: u32, lane: u32) {{\n{kv_head}    \
         let {row0} = tile * BR;\n    \
         // The subgroup's 16 owned rows (row group) and its half of their products, if split.\n    \
         let rg = sg % NRG;\n    let part = sg / NRG;\n    \
         if (tid == 0u) {{\n        sh_range = {}({row0});\n    }}\n",
        half.body,
        if kv {
            "tile_query_range"
        } else {
            "tile_key_range"
        },
    );
    // The first owned tensor is Q or K (S's operand), the second dO or V (dP's).
    for (i, (tag, frags)) in [("oa", t.qk_frags), ("ob", t.v_frags)]
        .into_iter()
        .enumerate()
    {
        let _ = writeln!(
            b,
            "    workgroupBarrier();\n    stage_own{i}({row0}, {head}, tid);\n    workgroupBarrier();"
        );
        for k in 0..frags {
            let _ = writeln!(
                b,
                "    let {tag}_{k} = coopLoadT<{A}>({}, {});",
                coop::staged(&format!("rg * {FRAG}u * KS + {}u", k * FRAG)),
                coop::staged_stride("KS")
            );
        }
    }
    if !kv {
        tensor_core_delta(b, t);
    }
    for (acc, output, ..) in half.sums {
        for n in 0..t.sum_frags(v_rows(output)) / t.split {
            let _ = writeln!(b, "    var {acc}_{n} = {C}();");
        }
    }
    let _ = write!(
        b,
        "    // The elementwise step's row of the tile and its first column.\n    \
         let r = sg * EROWS + lane / ELANES;\n    let c0 = lane % ELANES;\n    \
         let range = workgroupUniformLoad(&sh_range);\n"
    );
    if t.scaled {
        scaled_prologue(b, half, kv);
    }
}

/// With bf16 operands: the row each invocation rescales and stores, each accumulator's
/// reference, and the exponents of the elementwise step's own row (Q, dO and O of a query
/// row; K and V of a key row).
fn scaled_prologue(b: &mut String, half: &Half, kv: bool) {
    b.push_str("    let pr = rg * 16u + lane / 2u;\n");
    for (acc, ..) in half.sums {
        let _ = writeln!(b, "    var ref_{acc} = REF_LOW;");
    }
    b.push_str(match kv {
        false => {
            "    let qe = shift_of(q_bits(0u, row0 + r, h));\n    \
             let oe = shift_of(q_bits(4u, row0 + r, h));\n    \
             let ooe = shift_of(q_bits(3u, row0 + r, h));\n"
        }
        true => {
            "    let ke = shift_of(kv_bits(1u, col0 + r, kv_h));\n    \
             let ve = shift_of(kv_bits(2u, col0 + r, kv_h));\n"
        }
    });
}

/// D = rowsum(dO ∘ O) of the row group's rows, as the diagonal of dO·Oᵀ on the tensor
/// cores, into the diagonal of the row group's 16x16 corner of sh_s: summed as dP = dO·Vᵀ
/// is, so that dP − D is exactly 0 where O equals the one key's V a row attends to (the
/// prep's D, summed otherwise, left dK off by rounding where it should be 0).
fn tensor_core_delta(b: &mut String, t: &CoopTiling) {
    // Cooperative operations need workgroup-uniform control flow, so both subgroups of a
    // split row group compute D, each into its own 16 columns.
    let _ = writeln!(
        b,
        "    workgroupBarrier();\n    stage_own2(row0, h, tid);\n    workgroupBarrier();"
    );
    let rows = |k: u32| coop::staged(&format!("rg * {FRAG}u * KS + {}u", k * FRAG));
    let sum = coop::chained_product(b, (t.v_frags, &|k| format!("ob_{k}")), &rows, "dd", "    ");
    let _ = writeln!(
        b,
        "    coopStoreT({sum}, &sh_s[rg * {FRAG}u * SS + part * {FRAG}u], SS);\n    workgroupBarrier();"
    );
}

/// The query-major loop head: the row's key range and statistics (LSE and D from the
/// tensor cores, packed into `stats` for the key-major half: this half runs without the
/// prep), then per block of keys its K and V staged.
fn q_loop(b: &mut String, t: &CoopTiling, lp: &super::tiles::KeyLoop) {
    // With bf16 operands D = dO'·O' · 2^(oe + ooe).
    let delta = match t.scaled {
        true => "scale2(sh_s[r * SS + r % 16u], oe + ooe)",
        false => "sh_s[r * SS + r % 16u]",
    };
    b.push_str(
        "    let kv_h = kv_head(h);\n    let row = row0 + r;\n    var lo = 0u;\n    var hi = 0u;\n    \
         var row_lse = 0.0;\n    var delta = 0.0;\n    if (row < dims.seq_len) {\n        \
         let keys = key_range(row);\n        lo = keys.x;\n        hi = keys.y;\n        \
         row_lse = lse[row_index(row, h)];\n        delta = ",
    );
    b.push_str(delta);
    b.push_str(
        ";\n        \
         if (c0 == 0u) {\n            stats[stats_part(0u, row, h)] = row_lse;\n            \
         stats[stats_part(1u, row, h)] = delta;\n        }\n    }\n    \
         let kt_end = (range.y + BC - 1u) / BC;\n",
    );
    let tensors = [("k", "0u"), ("v", "BC")];
    b.push_str(&lp.pre);
    if !t.prefetches() {
        let _ = write!(
            b,
            "    {}        let j0 = kt * BC;\n        \
             // The previous block is done with sh_kv, sh_s, sh_dp and sh_ds.\n        \
             workgroupBarrier();\n",
            lp.head
        );
        coop::stage_block(b, t, &tensors, "j0", "kv_h");
        return;
    }
    let fetch = |ind: &str, r0: &str| coop::fetches(t, &tensors, (r0, "kv_h"), ind);
    let _ = write!(
        b,
        "{}    {}        let j0 = kt * BC;\n        \
         // The previous block is done with sh_kv, sh_s, sh_dp and sh_ds.\n        \
         workgroupBarrier();\n{}        workgroupBarrier();\n        \
         // The next block's loads are in flight during this one's products.\n        \
         if ({}) {{\n{}        }}\n",
        fetch("    var ", lp.first),
        lp.head,
        coop::puts(t, &tensors),
        lp.has_next,
        fetch("            ", lp.next),
    );
}

/// The key-major loop head: every block of queries that sees the tile, last first, and
/// within a block every query head of the KV head (the weights of a key shrink with the
/// query's distance under a causal mask, so the small terms are added first), each with
/// its Q, dO and (LSE, D) staged.
fn kv_loop(b: &mut String, t: &CoopTiling, scattered: bool, sparse: bool) {
    // (A scattering workgroup walks its one query head.)
    let (group, h0) = match scattered {
        true => ("1u", "qh"),
        false => ("q_per_kv()", "kv_h * group"),
    };
    let _ = write!(
        b,
        "    let col = col0 + r;\n    let group = {group};\n    let first = range.x / BC;\n    \
         let blocks = (range.y + BC - 1u) / BC - first;\n",
    );
    let tensors = [("q", "0u"), ("do", "BC")];
    if !t.prefetches() {
        // With a mask_mod, only the blocks whose tile it may show.
        let (start, step) = match sparse {
            true => {
                let next = format!(
                    "group * blocks, col0, min(col0 + BR, dims.seq_len) - 1u, {h0}, group, first, blocks, wg_b)"
                );
                (
                    format!("next_block(0u, {next}"),
                    format!("next_block(it + 1u, {next}"),
                )
            }
            false => ("0u".to_string(), "it + 1u".to_string()),
        };
        let _ = write!(
            b,
            "    for (var it = {start}; it < group * blocks; it = {step}) {{\n        \
             let h = {h0} + it % group;\n        \
             let s0 = (first + blocks - 1u - it / group) * BC;\n        \
             // The previous block is done with sh_kv, sh_s, sh_dp, sh_p, sh_ds and sh_stats.\n        \
             workgroupBarrier();\n        \
             for (var e = tid; e < BC; e = e + WG) {{\n            \
             put_stats(e, fetch_stats(s0, h, e));\n        }}\n",
        );
        coop::stage_block(b, t, &tensors, "s0", "h");
        return;
    }
    let stats = t.bc.div_ceil(t.workgroup_size());
    let fetch = |prefix: &str| {
        let mut f = coop::fetches(t, &tensors, ("next_s0", "next_h"), prefix);
        for i in 0..stats {
            let _ = writeln!(
                f,
                "{prefix}ps_{i} = fetch_stats(next_s0, next_h, tid + {i}u * WG);"
            );
        }
        f
    };
    let puts_stats: String = (0..stats)
        .map(|i| format!("        put_stats(tid + {i}u * WG, ps_{i});\n"))
        .collect();
    b.push_str(&super::flash_backward::query_blocks_ahead(
        sparse,
        h0,
        &fetch("    var "),
        "sh_kv, sh_s, sh_dp, sh_p, sh_ds and sh_stats",
        &(puts_stats + &coop::puts(t, &tensors)),
        &fetch("            "),
    ));
}

/// The block's two transposed products, the elementwise step and the weighted sums; closes
/// the loop.
fn products(b: &mut String, t: &CoopTiling, half: &Half, elementwise: &str, keep: Phases) {
    coop::key_fragments(b, t);
    if keep.scores {
        coop::transposed_product(
            b,
            t,
            (t.qk_frags, &|k| format!("oa_{k}")),
            "0u",
            "sh_s",
            "sm",
        );
    }
    if keep.grads {
        coop::transposed_product(
            b,
            t,
            (t.v_frags, &|k| format!("ob_{k}")),
            "BC",
            "sh_dp",
            "dm",
        );
    }
    b.push_str("        workgroupBarrier();\n");
    b.push_str(elementwise);
    b.push_str("        workgroupBarrier();\n");
    if t.scaled && keep.softmax {
        let _ = writeln!(
            b,
            "        let moved = workgroupUniformLoad(&{});",
            coop_scale::MOVED
        );
        for (i, (acc, output, ..)) in half.sums.iter().enumerate() {
            let frags = t.sum_frags(v_rows(output)) / t.split;
            let cond = format!("(moved & {}u) != 0u", coop_scale::moved_bit(i));
            coop::rescale_rows(b, frags, (acc, &cond, &format!("sh_c_{acc}")));
        }
        // Cleared after the rescales' barriers, which follow every invocation's load.
        let _ = writeln!(
            b,
            "        if (moved != 0u && tid == 0u) {{\n            atomicStore(&{}, 0u);\n        }}",
            coop_scale::MOVED
        );
    }
    if keep.accumulate {
        for (acc, output, src, tag, which) in half.sums {
            let base = if *which == 0 { "0u" } else { "BC" };
            let frags = t.sum_frags(v_rows(output));
            coop::weighted_sum(b, t, frags, (src, tag), base, acc);
        }
    }
    b.push_str("    }\n");
}

/// P = exp(S − LSE) and dS = scale·P·(dP − D) for the invocation's ECOLS keys of its row.
const Q_ELEMENTWISE: Template = Template {
    name: "q_elementwise",
    needs: &[],
    text: r#"        for (var i = 0u; i < ECOLS; i = i + 1u) {
            let c = c0 + i * ELANES;
            let j = j0 + c;
            let v = j >= lo && j < hi && key_visible(row, h, j);
            let x = scored(row, h, j, sh_s[r * SS + c]);
            let p = exp2((x.x - row_lse) * LOG2E);
            let g = score_grads(row, h, j, sh_s[r * SS + c], x, p * (dropped(row, h, j, sh_dp[r * SS + c]) - delta), v);
            sh_ds[r * PS + c] = f16(params.scale * g);
        }
"#,
};

/// Pᵀ (dropped) and dSᵀ for the invocation's ECOLS queries of its key.
const KV_ELEMENTWISE: Template = Template {
    name: "kv_elementwise",
    needs: &[],
    text: r#"        for (var i = 0u; i < ECOLS; i = i + 1u) {
            let c = c0 + i * ELANES;
            let q = s0 + c;
            let st = sh_stats[c];
            let v = q < dims.seq_len && col < dims.seq_len && visible(q, h, col);
            let x = scored(q, h, col, sh_s[r * SS + c]);
            let p = select(0.0, exp2((x.x - st.x) * LOG2E), v);
            let g = score_grads(q, h, col, sh_s[r * SS + c], x, p * (dropped(q, h, col, sh_dp[r * SS + c]) - st.y), v);
            sh_p[r * PS + c] = f16(dropped(q, h, col, p));
            sh_ds[r * PS + c] = f16(params.scale * g);
        }
"#,
};

/// The elementwise step with bf16 operands: S and dP (scaled back by their rows' and
/// keys' exponents) as in f16, then each weighted sum's weights with the row scale of the
/// tensor they multiply folded in, held in registers (the step unrolled over the
/// invocation's columns) until each row's reference has moved where it must, then divided
/// by it into f16. (Kept in f32 in sh_s and sh_dp between the two, the step took 1.34 of
/// the bf16 backward's 3.70 ms at seq 4096, d 128 on an H100.)
fn scaled_elementwise(t: &CoopTiling, half: &Half, kv: bool) -> String {
    let (_, lanes, cols) = coop::softmax_layout(t);
    // (accumulator, its weight in the step, where its f16 weights go), in `half.sums`' order
    let (body, weights): (&str, &[(&str, &str, &str)]) = match kv {
        false => (SCALED_Q_WEIGHTS, &[("dq", "w", "sh_ds")]),
        true => (
            SCALED_KV_WEIGHTS,
            &[("dv", "wv", "sh_p"), ("dk", "wk", "sh_ds")],
        ),
    };
    let mut b = String::new();
    for (acc, ..) in weights {
        let _ = writeln!(b, "        var wm_{acc} = 0.0;");
    }
    for i in 0..cols {
        for (acc, ..) in weights {
            let _ = writeln!(b, "        var w_{acc}_{i} = 0.0;");
        }
        let _ = writeln!(b, "        {{\n            let i = {i}u;");
        b.push_str(body);
        for (acc, w, _) in weights {
            let _ = writeln!(
                b,
                "            w_{acc}_{i} = {w};\n            wm_{acc} = max(wm_{acc}, abs({w}));"
            );
        }
        b.push_str("        }\n");
    }
    for (i, (acc, ..)) in half.sums.iter().enumerate() {
        debug_assert_eq!(*acc, weights[i].0);
        coop_scale::move_reference(&mut b, (acc, i), lanes);
    }
    for i in 0..cols {
        for (acc, _, to) in weights {
            let _ = writeln!(
                b,
                "        {to}[r * PS + c0 + {i}u * ELANES] = f16(mulp2(w_{acc}_{i}, -ref_{acc}));"
            );
        }
    }
    b
}

/// dQ's weight `w` = scale·dS_ij·2^k_j of column `i`.
const SCALED_Q_WEIGHTS: &str = r#"            let c = c0 + i * ELANES;
            let j = j0 + c;
            let v = j >= lo && j < hi && key_visible(row, h, j);
            let ke = sh_e[c].x;
            let s = mulp2_sum(sh_s[r * SS + c], qe + ke);
            let x = scored(row, h, j, s);
            let p = exp2((x.x - row_lse) * LOG2E);
            let dp = mulp2_sum(sh_dp[r * SS + c], oe + sh_e[c].y);
            let g = score_grads(row, h, j, s, x, p * (dropped(row, h, j, dp) - delta), v);
            let w = mulp2(params.scale * g, ke);
"#;

/// dV's weight `wv` = P_ij·2^do_i (dropped) and dK's `wk` = scale·dS_ij·2^q_i of column
/// `i`.
const SCALED_KV_WEIGHTS: &str = r#"            let c = c0 + i * ELANES;
            let q = s0 + c;
            let st = sh_stats[c];
            let v = q < dims.seq_len && col < dims.seq_len && visible(q, h, col);
            let qe = sh_e[c].x;
            let oe = sh_e[c].y;
            let s = mulp2_sum(sh_s[r * SS + c], ke + qe);
            let x = scored(q, h, col, s);
            let p = select(0.0, exp2((x.x - st.x) * LOG2E), v);
            let dp = mulp2_sum(sh_dp[r * SS + c], ve + oe);
            let g = score_grads(q, h, col, s, x, p * (dropped(q, h, col, dp) - st.y), v);
            let wv = mulp2(dropped(q, h, col, p), oe);
            let wk = mulp2(params.scale * g, qe);
"#;

/// Each accumulator into its output through the subgroup's 16x16 corner of sh_s, a
/// fragment at a time, added to what the output holds.
fn finish(
    b: &mut String,
    (spec, t): (&KernelSpec, &CoopTiling),
    half: &Half,
    kv: bool,
    scattered: bool,
) {
    let (row0, index) = match kv {
        true => ("col0", "kv_index(out_row, kv_h)"),
        false => ("row0", "q_index(out_row, h)"),
    };
    if !t.scaled {
        let _ = writeln!(b, "    let pr = rg * {FRAG}u + lane / 2u;");
    }
    let _ = write!(
        b,
        "    let out_row = {row0} + pr;\n    \
         let base = {index};\n    let c8 = (lane % 2u) * 8u;\n    \
         let x = pr * SS + part * 16u + c8;\n"
    );
    // dV's rows have their own width and offsets where the widths differ.
    let split_v = spec.split_dims() && half.sums.iter().any(|(_, o, ..)| v_rows(o));
    if split_v {
        b.push_str("    let base_v = v_index(out_row, kv_h);\n");
    }
    for (acc, output, ..) in half.sums {
        let row = match v_rows(output) {
            true => Row::V,
            false => Row::Qk,
        };
        let mine = t.sum_frags(row == Row::V) / t.split;
        let base = if split_v && row == Row::V {
            "base_v"
        } else {
            "base"
        };
        // With bf16 operands each row's accumulators are 2^-ref of its gradient.
        let value = match t.scaled {
            true => format!("sh_s[x + e] * sh_c_{acc}[pr]"),
            false => "sh_s[x + e]".to_string(),
        };
        let add = match scattered {
            true => format!("add_{output}(at + e, {value});"),
            false => format!("{output}[at + e] = {output}[at + e] + {value};"),
        };
        for n in 0..mine {
            // A fragment past the end of its tensor's row (the width's fragments summed
            // where the split cannot share the row's evenly) is not stored.
            let first = format!("(part * {mine}u + {n}u) * {FRAG}u");
            let stored = index::and_within(spec, "out_row < dims.seq_len", row, &first);
            let _ = write!(
                b,
                "    workgroupBarrier();\n    \
                 coopStoreT({acc}_{n}, &sh_s[rg * {FRAG}u * SS + part * 16u], SS);\n    \
                 workgroupBarrier();\n    if ({stored}) {{\n        \
                 let at = {base} + {first} + c8;\n        \
                 for (var e = 0u; e < 8u; e = e + 1u) {{\n            \
                 {add}\n        }}\n    }}\n"
            );
        }
    }
    b.push_str("}\n\n");
}

#[cfg(test)]
mod tests {
    use crate::{Dtype, KernelSpec, Masks, Op, Scatter, WriteMode};

    /// The bf16 halves compile (naga validates them) in every configuration, owning dK and
    /// dV or adding them by atomics, and bind the row maxima; f16's bind none.
    #[test]
    fn bf16_halves_compile_with_their_row_scales() {
        let bytes = crate::configs::CANDIDATE_WORKGROUP_BYTES;
        for head_dim in [64, 128] {
            for config in crate::configs::coop_backward_in(head_dim, bytes, Dtype::Bf16) {
                let halves = [
                    (Op::BackwardQ, vec![], None),
                    (Op::BackwardKv, vec![WriteMode::Owned; 2], None),
                    (
                        Op::BackwardKv,
                        vec![WriteMode::AtomicScatter; 2],
                        Some(Scatter::F32Atomic),
                    ),
                ];
                for (op, modes, scatter) in halves {
                    for dtype in [Dtype::Bf16, Dtype::F16] {
                        let mut spec = KernelSpec {
                            dtype,
                            ..KernelSpec::flash("b", op, head_dim, Masks::new(true, false), config)
                        };
                        if op == Op::BackwardKv {
                            spec.writes = ["dk", "dv"]
                                .into_iter()
                                .zip(modes.iter().copied())
                                .map(|(n, m)| (n.into(), m))
                                .collect();
                        }
                        if let Some(s) = scatter {
                            spec.scatter = s;
                        }
                        spec.fit_target();
                        let abi = crate::compile(&spec)
                            .unwrap_or_else(|e| panic!("{op:?} d{head_dim} {config:?}: {e}"));
                        assert_eq!(
                            abi.binding("row_max").is_some(),
                            dtype == Dtype::Bf16,
                            "{op:?} {dtype:?}"
                        );
                    }
                }
            }
        }
    }
}
