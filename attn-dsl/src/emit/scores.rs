//! The score modifiers and dropout, written once for every op that pairs queries with
//! keys. Every schedule computes a score as `score(row, h, j, q·k)` (`scored` in the
//! backward, with the slope that turns the gradient with respect to the score into one
//! with respect to the pre-cap score, the bias's gradient), and multiplies P by `dropped(row, h, j, p)` where it meets V
//! or dO: so a forward, a decode and every backward schedule agree on the modified scores
//! and regenerate the same dropout mask whatever their tile order.

use super::numerics::Helper;
use super::writer::Wgsl;
use std::fmt::Write;

use crate::spec::{BiasHeads, KernelSpec, Op, WriteMode};

/// `score`, `score_grad`, `dropped` and what they need, for `spec`'s masks. `visible`:
/// the kernel defines `visible(row, h, j)` and scores pairs it hides (whole tiles), so
/// modifiers that report their reads ([`crate::flex::Flex::report_reads`]) report only
/// those of the pairs it shows.
pub(super) fn helpers(out: &mut Wgsl, spec: &KernelSpec, visible: bool) {
    let m = spec.masks;
    // The per-row decode's one query sits after the cache's last row; split-K decode's
    // queries pass their positions as `row`.
    let pos = if spec.op == Op::Decode {
        "cache_len() - 1u"
    } else {
        "row"
    };
    let mut score = String::from("    var x = dot * params.scale;\n");
    if let Some(heads) = m.bias {
        let slice = match heads {
            BiasHeads::PerHead => "batch * dims.n_heads + h",
            BiasHeads::Shared => "batch",
        };
        let _ = write!(
            out,
            "// bias is [batch, {}, seq, seq].\nfn bias_index(row: u32, h: u32, j: u32) -> u32 {{\n    \
             return (({slice}) * dims.seq_len + row) * dims.seq_len + j;\n}}\n\n",
            match heads {
                BiasHeads::PerHead => "n_heads",
                BiasHeads::Shared => "1",
            }
        );
        score.push_str("    x = x + bias[bias_index(row, h, j)];\n");
    }
    if m.alibi {
        // Positions below 2^24 convert exactly, and so does their difference.
        let _ = writeln!(score, "    x = fma(alibi[h], f32(j) - f32({pos}), x);");
    }
    let mut slope = if m.softcap {
        out.need(&[Helper::Tanh]);
        // cap·tanh(y/cap), and its slope 1 - tanh²(y/cap).
        "    let t = tanh_f32(x / params.softcap);\n    \
         var s = vec2<f32>(params.softcap * t.x, t.y);\n"
            .to_string()
    } else {
        "    var s = vec2<f32>(x, 1.0);\n".to_string()
    };
    let flex = spec.flex();
    let mut user = String::new();
    if let Some(flex) = &flex {
        super::flex::functions(out, flex, spec);
        if flex.score_mod.is_some() {
            // The user's modifier last, and the chain rule through it; what it is given is
            // `pre_score`, where a tensor's gradient reads its slope.
            let _ = write!(
                out,
                "// The score before the description's score_mod, and its slope with respect to the\n\
                 // pre-cap score.\nfn pre_score(row: u32, h: u32, j: u32, dot: f32) -> vec2<f32> {{\n\
                 {score}{slope}    return s;\n}}\n\n"
            );
            (score, slope) = (
                String::new(),
                "    var s = pre_score(row, h, j, dot);\n".to_string(),
            );
            user = "    s = vec2<f32>(score_mod(s.x, row, h, j), d_score_mod(s.x, row, h, j) * s.y);\n"
                .to_string();
            if flex.report_reads && visible {
                // A tile's rows past the last are scored too.
                let end = super::index::rows_end(spec);
                user = format!(
                    "    flex_seen = row < {end} && visible(row, h, j);\n{user}    flex_seen = true;\n"
                );
            }
        }
    }
    slope.push_str(&user);
    slope.push_str("    return s;\n");
    let _ = write!(
        out,
        "// The score of query `row` (head h) against key j from the raw dot product q·k (scaled,\n\
         // then biased, then capped), and its slope with respect to the pre-cap score, by which\n\
         // a gradient with respect to the score becomes one with respect to the bias.\n\
         fn scored(row: u32, h: u32, j: u32, dot: f32) -> vec2<f32> {{\n{score}{slope}}}\n\n\
         fn score(row: u32, h: u32, j: u32, dot: f32) -> f32 {{\n    return scored(row, h, j, dot).x;\n}}\n\n\
         // The gradient with respect to the pre-cap score (the bias's), from `g`, that with\n\
         // respect to the score of `scored`.\nfn score_grad(s: vec2<f32>, g: f32) -> f32 {{\n    return s.y * g;\n}}\n\n"
    );
    dropout(out, m.dropout);
    if let Some(mode) = spec.write_mode("dbias") {
        dbias_store(out, spec, mode);
    }
    if matches!(spec.op, Op::BackwardQ | Op::BackwardKv) {
        score_grads(out, spec, flex.as_ref());
    }
}

/// `score_grads(row, h, j, dot, x, gf, v)`: dS with respect to the pre-cap score (zero
/// where the pair is hidden) from `gf`, that with respect to the score `x = scored(..)`;
/// and, where this kernel writes them, the gradients every dS adds to: dBias and the
/// tensors a score modifier declares `grad`. Every backward schedule takes this one step.
fn score_grads(out: &mut Wgsl, spec: &KernelSpec, flex: Option<&crate::flex::Flex>) {
    let mut stores = String::new();
    if spec.write_mode("dbias").is_some() {
        stores.push_str("        store_dbias(row, h, j, g);\n");
    }
    if flex.is_some_and(|f| super::flex::grad_functions(out, spec, f)) {
        stores.push_str("        flex_grads(row, h, j, dot, gf);\n");
    }
    if !stores.is_empty() {
        stores = format!("    if (v) {{\n{stores}    }}\n");
    }
    let _ = write!(
        out,
        "// dS with respect to the pre-cap score, from gf, that with respect to the score x (0 where\n\
         // the pair is hidden); and the gradients every dS adds to, where this kernel writes them.\n\
         fn score_grads(row: u32, h: u32, j: u32, dot: f32, x: vec2<f32>, gf: f32, v: bool) -> f32 {{\n    \
         let g = select(0.0, score_grad(x, gf), v);\n{stores}    return g;\n}}\n\n"
    );
}

/// `dropped(row, h, j, p)`: P after dropout.
fn dropout(out: &mut Wgsl, on: bool) {
    if !on {
        out.push_str("fn dropped(row: u32, h: u32, j: u32, p: f32) -> f32 {\n    return p;\n}\n\n");
        return;
    }
    out.push_str(PHILOX);
    out.push_str(
        r#"// Kept with probability 1 - p (the first Philox word at or over p·2^32, the threshold in
// dims), and then scaled by 1 / (1 - p).
fn dropped(row: u32, h: u32, j: u32, p: f32) -> f32 {
    let ctr = vec4<u32>(j, row, batch * dims.n_heads + h, dims.rng_offset);
    let keep = philox4x32_10(ctr, vec2<u32>(dims.seed_lo, dims.seed_hi)).x >= dims.drop_threshold;
    return select(0.0, p * params.dropout_scale, keep);
}

"#,
    );
}

/// `store_dbias(row, h, j, g)`: `dbias += g`, owned where the grid owns the bias's element
/// (gradients accumulate, as dQ's do), else by atomics (a shared bias sums over heads).
fn dbias_store(out: &mut Wgsl, spec: &KernelSpec, mode: WriteMode) {
    if mode == WriteMode::AtomicScatter {
        super::scatter::atomic_add(out, spec, "dbias");
        out.push_str(
            "fn store_dbias(row: u32, h: u32, j: u32, g: f32) {\n    \
             add_dbias(bias_index(row, h, j), g);\n}\n\n",
        );
    } else {
        out.push_str(
            "fn store_dbias(row: u32, h: u32, j: u32, g: f32) {\n    \
             let i = bias_index(row, h, j);\n    dbias[i] = dbias[i] + g;\n}\n\n",
        );
    }
}

/// Philox-4x32-10 (Salmon et al., Random123), with the 32×32→64-bit products WGSL lacks
/// built from 16-bit halves. `runtime::reference::philox4x32_10` is the same function.
pub const PHILOX: &str = r#"// (high, low) words of a · b.
fn mul_hi_lo(a: u32, b: u32) -> vec2<u32> {
    let al = a & 0xffffu;
    let ah = a >> 16u;
    let bl = b & 0xffffu;
    let bh = b >> 16u;
    let lh = al * bh;
    let hl = ah * bl;
    let mid = ((al * bl) >> 16u) + (lh & 0xffffu) + (hl & 0xffffu);
    return vec2<u32>(ah * bh + (lh >> 16u) + (hl >> 16u) + (mid >> 16u), a * b);
}

fn philox4x32_10(counter: vec4<u32>, key: vec2<u32>) -> vec4<u32> {
    var c = counter;
    var k = key;
    for (var i = 0u; i < 10u; i = i + 1u) {
        let p0 = mul_hi_lo(0xD2511F53u, c.x);
        let p1 = mul_hi_lo(0xCD9E8D57u, c.z);
        c = vec4<u32>(p1.x ^ c.y ^ k.x, p1.y, p0.x ^ c.w ^ k.y, p0.y);
        k = k + vec2<u32>(0x9E3779B9u, 0xBB67AE85u);
    }
    return c;
}

"#;
