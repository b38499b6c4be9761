//! The score modifiers and dropout, written once for every op that pairs queries with
//! keys. Every schedule computes a score as `score(row, h, j, q·k)` (`scored` in the
//! backward, with the slope that turns the gradient with respect to the score into one
//! with respect to the pre-cap score, the bias's gradient), and multiplies P by `dropped(row, h, j, p)` where it meets V
//! or dO: so a forward, a decode and every backward schedule agree on the modified scores
//! and regenerate the same dropout mask whatever their tile order.

use super::flash::guarded;
use super::numerics::Helper;
use super::writer::{Fragment, Template, Wgsl, lines};
use crate::flex::Flex;
use crate::spec::{BiasHeads, KernelSpec, Op, WriteMode};

/// `bias_index(row, h, j)`: the element of the bias tensor a score adds.
const BIAS_INDEX: Template = Template {
    name: "bias_index",
    needs: &[],
    text: r#"// bias is [batch, $heads, seq, seq].
fn bias_index(row: u32, h: u32, j: u32) -> u32 {
    return (($slice) * dims.seq_len + row) * dims.seq_len + j;
}

"#,
};

/// The soft cap: cap·tanh(y/cap), and its slope 1 - tanh²(y/cap).
const SOFTCAP: Template = Template {
    name: "softcap",
    needs: &[Helper::Tanh],
    text: r#"let t = tanh_f32(x / params.softcap);
var s = vec2<f32>(params.softcap * t.x, t.y);
"#,
};

/// `pre_score`: the built-in modifiers, ahead of a score_mod.
const PRE_SCORE: Template = Template {
    name: "pre_score",
    needs: &[],
    text: r#"// The score before the description's score_mod, and its slope with respect to the
// pre-cap score.
fn pre_score(row: u32, h: u32, j: u32, dot: f32) -> vec2<f32> {
    $score
    $slope
    return s;
}

"#,
};

/// The user's score_mod and the chain rule through it.
const SCORE_MOD: &str =
    "s = vec2<f32>(score_mod(s.x, row, h, j), d_score_mod(s.x, row, h, j) * s.y);\n";

/// [`SCORE_MOD`], in a kernel that reports the reads of its modifiers out of range: only
/// the pairs it shows report.
const REPORTED_SCORE_MOD: Template = Template {
    name: "reported_score_mod",
    needs: &[],
    text: r#"flex_seen = row < $end && visible(row, h, j);
$score_mod
flex_seen = true;
"#,
};

/// `scored`, `score` and `score_grad`: every schedule's modified score and its slope.
const SCORED: Template = Template {
    name: "scored",
    needs: &[],
    text: r#"// The score of query `row` (head h) against key j from the raw dot product q·k (scaled,
// then biased, then capped), and its slope with respect to the pre-cap score, by which
// a gradient with respect to the score becomes one with respect to the bias.
fn scored(row: u32, h: u32, j: u32, dot: f32) -> vec2<f32> {
    $score
    $slope
    $score_mod
    return s;
}

fn score(row: u32, h: u32, j: u32, dot: f32) -> f32 {
    return scored(row, h, j, dot).x;
}

// The gradient with respect to the pre-cap score (the bias's), from `g`, that with
// respect to the score of `scored`.
fn score_grad(s: vec2<f32>, g: f32) -> f32 {
    return s.y * g;
}

"#,
};

/// `score`, `score_grad`, `dropped` and what they need, for `spec`'s masks. `visible`:
/// the kernel defines `visible(row, h, j)` and scores pairs it hides (whole tiles), so
/// modifiers that report their reads ([`crate::flex::Flex::report_reads`]) report only
/// those of the pairs it shows.
pub(super) fn helpers(out: &mut Wgsl, spec: &KernelSpec, visible: bool) {
    let m = spec.masks;
    let mut score = builtin_score(out, spec);
    let mut slope = match m.softcap {
        true => SOFTCAP.plain(),
        false => Fragment::from("var s = vec2<f32>(x, 1.0);\n"),
    };
    let flex = spec.flex();
    let mut user = Fragment::default();
    if let Some(flex) = &flex {
        super::flex::functions(out, flex, spec);
        if flex.score_mod.is_some() {
            // The user's modifier last, and the chain rule through it; what it is given is
            // `pre_score`, where a tensor's gradient reads its slope.
            out.put(PRE_SCORE.fill([("score", score), ("slope", slope)]));
            (score, slope) = (
                Fragment::default(),
                Fragment::from("var s = pre_score(row, h, j, dot);\n"),
            );
            user = score_mod(spec, flex, visible);
        }
    }
    out.put(SCORED.fill([("score", score), ("slope", slope), ("score_mod", user)]));
    dropout(out, m.dropout);
    if let Some(mode) = spec.write_mode("dbias") {
        dbias_store(out, spec, mode);
    }
    if matches!(spec.op, Op::BackwardQ | Op::BackwardKv) {
        score_grads(out, spec, flex.as_ref());
    }
}

/// The score up to its cap: scaled (a chunk over an fp8 cache's widened keys also by its KV
/// head's `kv_unit`), then biased (`bias_index` into `out`, where the kernel has a bias),
/// then ALiBi's term.
fn builtin_score(out: &mut Wgsl, spec: &KernelSpec) -> Fragment {
    let m = spec.masks;
    let scale = match (spec.op, spec.kv_fp8) {
        (Op::Extend, Some(_)) => "(params.scale * kv_unit(kv_head(h)))",
        _ => "params.scale",
    };
    let mut score = vec![format!("var x = dot * {scale};")];
    if let Some(heads) = m.bias {
        let (heads, slice) = match heads {
            BiasHeads::PerHead => ("n_heads", "batch * dims.n_heads + h"),
            BiasHeads::Shared => ("1", "batch"),
        };
        out.put(BIAS_INDEX.fill([("heads", heads.into()), ("slice", slice.into())]));
        score.push("x = x + bias[bias_index(row, h, j)];".to_string());
    }
    if m.alibi {
        // The per-row decode's one query sits after the cache's last row; split-K decode's
        // queries pass their positions as `row`.
        let pos = match spec.op {
            Op::Decode => "cache_len() - 1u",
            _ => "row",
        };
        // Positions below 2^24 convert exactly, and so does their difference.
        score.push(format!("x = fma(alibi[h], f32(j) - f32({pos}), x);"));
    }
    lines(score)
}

/// The user's score_mod and the chain rule through it, on `pre_score`'s result; where the
/// kernel reports the modifiers' reads, only the pairs it shows report.
fn score_mod(spec: &KernelSpec, flex: &Flex, visible: bool) -> Fragment {
    if !(flex.report_reads && visible) {
        return SCORE_MOD.into();
    }
    // A tile's rows past the last are scored too.
    REPORTED_SCORE_MOD.fill([
        ("end", super::index::rows_end(spec).into()),
        ("score_mod", SCORE_MOD.into()),
    ])
}

/// `score_grads`: dS with respect to the pre-cap score, and the gradients every dS adds to.
const SCORE_GRADS: Template = Template {
    name: "score_grads",
    needs: &[],
    text: r#"// dS with respect to the pre-cap score, from gf, that with respect to the score x (0 where
// the pair is hidden); and the gradients every dS adds to, where this kernel writes them.
fn score_grads(row: u32, h: u32, j: u32, dot: f32, x: vec2<f32>, gf: f32, v: bool) -> f32 {
    let g = select(0.0, score_grad(x, gf), v);
    $stores
    return g;
}

"#,
};

/// `score_grads(row, h, j, dot, x, gf, v)`: dS with respect to the pre-cap score (zero
/// where the pair is hidden) from `gf`, that with respect to the score `x = scored(..)`;
/// and, where this kernel writes them, the gradients every dS adds to: dBias and the
/// tensors a score modifier declares `grad`. Every backward schedule takes this one step.
fn score_grads(out: &mut Wgsl, spec: &KernelSpec, flex: Option<&Flex>) {
    let mut stores = Vec::new();
    if spec.write_mode("dbias").is_some() {
        stores.push("store_dbias(row, h, j, g);".to_string());
    }
    if flex.is_some_and(|f| super::flex::grad_functions(out, spec, f)) {
        stores.push("flex_grads(row, h, j, dot, gf);".to_string());
    }
    let stores = match stores.is_empty() {
        true => Fragment::default(),
        false => guarded(Some("v".into()), lines(stores)),
    };
    out.put(SCORE_GRADS.fill([("stores", stores)]));
}

/// P unchanged, without dropout.
const NO_DROPOUT: Template = Template {
    name: "no_dropout",
    needs: &[],
    text: r#"fn dropped(row: u32, h: u32, j: u32, p: f32) -> f32 {
    return p;
}

"#,
};

/// P after dropout, from the pair's Philox word.
const DROPOUT: Template = Template {
    name: "dropout",
    needs: &[],
    text: r#"// Kept with probability 1 - p (the first Philox word at or over p·2^32, the threshold in
// dims), and then scaled by 1 / (1 - p).
fn dropped(row: u32, h: u32, j: u32, p: f32) -> f32 {
    let ctr = vec4<u32>(j, row, batch * dims.n_heads + h, dims.rng_offset);
    let keep = philox4x32_10(ctr, vec2<u32>(dims.seed_lo, dims.seed_hi)).x >= dims.drop_threshold;
    return select(0.0, p * params.dropout_scale, keep);
}

"#,
};

/// `dropped(row, h, j, p)`: P after dropout.
fn dropout(out: &mut Wgsl, on: bool) {
    if !on {
        out.put(NO_DROPOUT.plain());
        return;
    }
    out.put(PHILOX_4X32_10.plain());
    out.put(DROPOUT.plain());
}

/// `store_dbias` by atomics, for a bias shared by heads.
const STORE_DBIAS_ATOMIC: Template = Template {
    name: "store_dbias_atomic",
    needs: &[],
    text: r#"fn store_dbias(row: u32, h: u32, j: u32, g: f32) {
    add_dbias(bias_index(row, h, j), g);
}

"#,
};

/// `store_dbias` into an element the workgroup owns.
const STORE_DBIAS_OWNED: Template = Template {
    name: "store_dbias_owned",
    needs: &[],
    text: r#"fn store_dbias(row: u32, h: u32, j: u32, g: f32) {
    let i = bias_index(row, h, j);
    dbias[i] = dbias[i] + g;
}

"#,
};

/// `store_dbias(row, h, j, g)`: `dbias += g`, owned where the grid owns the bias's element
/// (gradients accumulate, as dQ's do), else by atomics (a shared bias sums over heads).
fn dbias_store(out: &mut Wgsl, spec: &KernelSpec, mode: WriteMode) {
    if mode == WriteMode::AtomicScatter {
        super::scatter::atomic_add(out, spec, "dbias");
        out.put(STORE_DBIAS_ATOMIC.plain());
    } else {
        out.put(STORE_DBIAS_OWNED.plain());
    }
}

/// Philox-4x32-10 (Salmon et al., Random123), with the 32×32→64-bit products WGSL lacks
/// built from 16-bit halves. `runtime::reference::philox4x32_10` is the same function.
const PHILOX_4X32_10: Template = Template {
    name: "philox4x32_10",
    needs: &[],
    text: r#"// (high, low) words of a · b.
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

"#,
};

/// [`PHILOX_4X32_10`]'s WGSL.
pub const PHILOX: &str = PHILOX_4X32_10.text;
