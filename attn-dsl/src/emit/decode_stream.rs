//! The streamed split pass of split-K decode (`grid: slice_major(flash)`): the slice's keys
//! stream through key groups that each keep an online softmax in registers, so a key's
//! loads, products and softmax wait at no barrier and a slice's length is not bounded by
//! workgroup memory.
//!
//! A workgroup serves query slots of one KV head (the components of a vec4, as in the
//! staged pass: [`super::served`]). Its invocations form `GROUPS` key groups of `LANES`; in each step group g
//! takes keys `t0 + u·GROUPS + g` for u < KEYS, each lane loading words `lane`,
//! `lane + LANES`, .. of the keys' K and V rows (the next step's words in flight while
//! this step's are used). A key's dot products are summed over its group by a butterfly
//! (the same bits in every lane), then the group's running max m, sum l and unnormalized
//! output (each lane its own V columns) move on. After the slice the groups' states meet
//! once in workgroup memory and flush as the staged pass's partials do, so the reduce
//! pass is the same.

use super::numerics::Helper;
use super::writer::{Fragment, Template, Wgsl};
use std::fmt::Write;

use crate::layout::decode::{Stream, stream_word_type};
use crate::spec::KernelSpec;

const COMPONENTS: [&str; 4] = ["x", "y", "z", "w"];

/// The pass's constants after the widths.
pub(super) fn constants(out: &mut Wgsl, spec: &KernelSpec, s: &Stream) {
    let _ = write!(
        out,
        "// Query heads per workgroup, one per vec4 component.\nconst TILE: u32 = {tile}u;\n\
         // Lanes per key, key groups, keys a group takes per step, keys per step.\n\
         const LANES: u32 = {lanes}u;\nconst GROUPS: u32 = WG / LANES;\n\
         const KEYS: u32 = {keys}u;\nconst STEP: u32 = GROUPS * KEYS;\n\
         // Words ({word} elements) of a K row and of a V row, and the vec4s of a word.\n\
         const K_WORDS: u32 = {kw}u;\nconst V_WORDS: u32 = {vw}u;\nconst QUADS: u32 = {quads}u;\n\
         // Slots of the exchange buffer.\nconst EXCHANGE: u32 = {exchange}u;\n",
        tile = spec.grid.tile,
        lanes = s.lanes,
        keys = s.keys,
        word = s.word,
        kw = s.k_words,
        vw = s.v_words,
        quads = s.quads(),
        exchange = s.exchange(spec),
    );
}

/// The pass: the cache's words, the group sums, the entry.
pub(super) fn split(out: &mut Wgsl, spec: &KernelSpec, s: &Stream) {
    out.put(super::decode_split::partials());
    super::index::kv_head(out, spec);
    out.put(super::served::helpers(spec));
    super::index::key_visible(out, spec);
    let sparse = super::tiles::sparse(spec);
    if sparse {
        super::decode_split::next_tile(out, spec);
    }
    super::scores::helpers(out, spec, false);
    let ragged = s.k_per_lane * s.lanes != s.k_words || s.v_per_lane * s.lanes != s.v_words;
    out.put(words(spec, s.word, ragged));
    out.put(group_sum(
        spec.grid.flash.is_some_and(|f| f.subgroups),
        s.lanes,
    ));
    out.put(entry(spec, s, sparse));
}

/// The row functions of the cache in words of `word` elements, the query's vec4 index, and
/// `fetch_k` / `fetch_v` / `widen_w`; `ragged` where some lane's last word may be past a
/// row (the fetches then test the word too).
pub(super) fn words(spec: &KernelSpec, word: u32, ragged: bool) -> Fragment {
    let raw = stream_word_type(spec, word);
    let widen = match (word / 4, spec.kv_fp8.is_some(), spec.dtype) {
        (1, _, _) => format!(
            "return array<vec4<f32>, 1>({}(x));",
            super::dtype::cache_widen(spec)
        ),
        (_, true, _) => "return array<vec4<f32>, 2>(widen_kv4(x.x), widen_kv4(x.y));".into(),
        (_, false, crate::spec::Dtype::Bf16) => "return array<vec4<f32>, 2>(\n        \
             bitcast<vec4<f32>>(vec4<u32>(x.x << 16u, x.x & 0xffff0000u, x.y << 16u, x.y & 0xffff0000u)),\n        \
             bitcast<vec4<f32>>(vec4<u32>(x.z << 16u, x.z & 0xffff0000u, x.w << 16u, x.w & 0xffff0000u)));"
            .into(),
        _ => "return array<vec4<f32>, 2>(\n        \
              vec4<f32>(unpack2x16float(x.x), unpack2x16float(x.y)),\n        \
              vec4<f32>(unpack2x16float(x.z), unpack2x16float(x.w)));"
            .into(),
    };
    let (k_in, v_in) = match ragged {
        true => (" && w < K_WORDS", " && w < V_WORDS"),
        false => ("", ""),
    };
    WORDS.fill([
        ("k_in", Fragment::from(k_in)),
        ("v_in", Fragment::from(v_in)),
        ("row", Fragment::from(super::decode_split::cache_row(spec))),
        ("qk4", Fragment::from(super::decode_split::qk4(spec))),
        ("raw", Fragment::from(raw)),
        ("widen", Fragment::from(widen)),
    ])
}

const WORDS: Template = Template {
    name: "stream_words",
    needs: &[],
    text: r#"$row
// [row, h, d] in vec4s, of query q (row · n_heads + h) of this sequence's rows.
fn q4_index(q: u32) -> u32 {
    return (q_row0 * dims.n_heads + q) * $qk4;
}

// Word w of key j's K row (of V's), zeros past the slice (or the row): loads in flight stay
// as stored (half the registers in half precision) and widen at use.
fn fetch_k(j: u32, hi: u32, w: u32, kv_h: u32) -> $raw {
    var x = $raw();
    if (j < hi$k_in) {
        x = k_cache[kv_row(j, kv_h) * K_WORDS + w];
    }
    return x;
}

fn fetch_v(j: u32, hi: u32, w: u32, kv_h: u32) -> $raw {
    var x = $raw();
    if (j < hi$v_in) {
        x = v_cache[kv_row(j, kv_h) * V_WORDS + w];
    }
    return x;
}

// A word's elements as vec4s of f32, exactly.
fn widen_w(x: $raw) -> array<vec4<f32>, QUADS> {
    $widen
}

"#,
};

/// `group_sum4(x, tid, use_sg)`: x summed over the invocation's key group, the same bits
/// in every lane (each butterfly step adds the same two values in either lane, and the
/// fallback sums in one order).
fn group_sum(subgroups: bool, lanes: u32) -> Fragment {
    let mut shuffles = String::new();
    let mut mask = 1;
    while mask < lanes {
        let _ = writeln!(shuffles, "y = y + subgroupShuffleXor(y, {mask}u);");
        mask *= 2;
    }
    let fast = match subgroups {
        true => format!(
            "if (use_sg) {{\n    var y = x;\n{}    return y;\n}}\n",
            indent(&shuffles)
        ),
        false => String::new(),
    };
    GROUP_SUM.fill([("fast", Fragment::from(fast))])
}

fn indent(text: &str) -> String {
    let mut out = String::new();
    super::writer::indent_into(&mut out, text, "    ");
    out
}

const GROUP_SUM: Template = Template {
    name: "group_sum4",
    needs: &[],
    text: r#"// The exchange buffer: the fallback butterfly's slots, then the groups' outputs when
// they meet.
var<workgroup> sh_x: array<vec4<f32>, EXCHANGE>;
// Each group's running max (0..GROUPS) and sum (GROUPS..).
var<workgroup> sh_ml: array<vec4<f32>, 2u * GROUPS>;
// Nonzero when some key group is not inside one subgroup.
var<workgroup> sh_subgroups_off: atomic<u32>;

// x summed over the LANES invocations of this invocation's key group, the same bits in
// each of them; every invocation reaches the barriers.
fn group_sum4(x: vec4<f32>, tid: u32, use_sg: bool) -> vec4<f32> {
    $fast
    sh_x[tid] = x;
    workgroupBarrier();
    let g0 = tid - tid % LANES;
    var y = sh_x[g0];
    for (var i = 1u; i < LANES; i = i + 1u) {
        y = y + sh_x[g0 + i];
    }
    workgroupBarrier();
    return y;
}

"#,
};

/// The entry point: the query into registers, the key loop, the groups' meeting and the
/// flush.
fn entry(spec: &KernelSpec, s: &Stream, sparse: bool) -> Fragment {
    let heads = spec.grid.tile as usize;
    let subgroups = spec.grid.flash.is_some_and(|f| f.subgroups);
    let each_head = |f: &dyn Fn(usize, &str) -> String| -> String {
        (0..heads).map(|i| f(i, COMPONENTS[i])).collect()
    };
    let keys = 0..s.keys;
    let quads = 0..s.quads();
    let mut b = String::new();
    // The lane's share of each served head's query, in registers.
    for i in 0..heads {
        for w in 0..s.k_per_lane {
            for p in quads.clone() {
                let _ = writeln!(b, "var q{i}_{w}_{p} = vec4<f32>(0.0);");
            }
        }
    }
    let q_scale = match spec.kv_fp8 {
        Some(_) => " * (kv_scales[kv_h] * FP8_UNIT)",
        None => "",
    };
    for w in 0..s.k_per_lane {
        let _ = writeln!(b, "let kw{w} = lane + {w}u * LANES;");
        let _ = writeln!(b, "if (kw{w} < K_WORDS) {{");
        for (i, c) in COMPONENTS.iter().enumerate().take(heads) {
            let _ = writeln!(b, "    if ({i}u < n_here) {{");
            for p in quads.clone() {
                let _ = writeln!(
                    b,
                    "        q{i}_{w}_{p} = widen4(q[q4_index(sv.q.{c}) + kw{w} * QUADS + {p}u]){q_scale};"
                );
            }
            b.push_str("    }\n");
        }
        b.push_str("}\n");
    }
    let q_regs = b;
    let mut b = String::new();
    for i in 0..heads {
        for w in 0..s.v_per_lane {
            for p in quads.clone() {
                let _ = writeln!(b, "var o{i}_{w}_{p} = vec4<f32>(0.0);");
            }
        }
    }
    let o_regs = b;
    let fetch = |prefix: &str, key: &dyn Fn(u32) -> String, decl: &str| -> String {
        let mut b = String::new();
        for u in keys.clone() {
            for w in 0..s.k_per_lane {
                let _ = writeln!(
                    b,
                    "{decl}{prefix}k{u}_{w} = fetch_k({}, hi, lane + {w}u * LANES, kv_h);",
                    key(u)
                );
            }
            for w in 0..s.v_per_lane {
                let _ = writeln!(
                    b,
                    "{decl}{prefix}v{u}_{w} = fetch_v({}, hi, lane + {w}u * LANES, kv_h);",
                    key(u)
                );
            }
        }
        b
    };
    let (first_key, next_key) = match sparse {
        false => ("first", "t0 + STEP"),
        true => ("k_first", "k_next"),
    };
    let first_fetch = fetch("", &|u| format!("{first_key} + {u}u * GROUPS + g"), "var ");
    let next_fetch = fetch("n", &|u| format!("{next_key} + {u}u * GROUPS + g"), "let ");
    // Each key's dot products (the heads in a vec4), summed over the group, then scored.
    let mut scores = String::new();
    for u in keys.clone() {
        for w in 0..s.k_per_lane {
            let _ = writeln!(scores, "let kk{u}_{w} = widen_w(k{u}_{w});");
        }
        let _ = writeln!(scores, "var a{u} = vec4<f32>(0.0);");
        for w in 0..s.k_per_lane {
            for p in quads.clone() {
                let mut dots = vec!["0.0".to_string(); 4];
                for (i, d) in dots.iter_mut().enumerate().take(heads) {
                    *d = format!("dot(q{i}_{w}_{p}, kk{u}_{w}[{p}])");
                }
                let _ = writeln!(scores, "a{u} = a{u} + vec4<f32>({});", dots.join(", "));
            }
        }
        let _ = writeln!(
            scores,
            "let d{u} = group_sum4(a{u}, tid, use_sg);\nlet j{u} = t0 + {u}u * GROUPS + g;\n\
             var x{u} = vec4<f32>(NEG_BIG);\nif (j{u} < hi) {{"
        );
        scores.push_str(&each_head(&|i, c| {
            format!(
                "    if ({}) {{\n        x{u}.{c} = score(sv.pos.{c}, sv.h.{c}, j{u}, d{u}.{c});\n    }}\n",
                super::served::sees(i, c, &format!("j{u}"))
            )
        }));
        scores.push_str("}\n");
    }
    // The step's max, the rescale of what the group holds, the keys' weights and P·V.
    let xs: Vec<String> = keys.clone().map(|u| format!("x{u}")).collect();
    let step_max = xs
        .iter()
        .skip(1)
        .fold(xs[0].clone(), |acc, x| format!("max({acc}, {x})"));
    let mut softmax = format!("let m_new = max(m, {step_max});\nlet corr = exp4(m - m_new);\n");
    for u in keys.clone() {
        let _ = writeln!(
            softmax,
            "let p{u} = select(vec4<f32>(0.0), exp4(x{u} - m_new), x{u} > vec4<f32>(NEG_BIG));"
        );
    }
    let ps: Vec<String> = keys.clone().map(|u| format!("p{u}")).collect();
    let _ = writeln!(softmax, "l = fma(l, corr, {});\nm = m_new;", ps.join(" + "));
    for u in keys.clone() {
        for w in 0..s.v_per_lane {
            let _ = writeln!(softmax, "let vv{u}_{w} = widen_w(v{u}_{w});");
        }
    }
    for (i, c) in COMPONENTS.iter().enumerate().take(heads) {
        for w in 0..s.v_per_lane {
            for p in quads.clone() {
                let mut acc = format!("o{i}_{w}_{p} * corr.{c}");
                for u in keys.clone() {
                    acc = format!("fma(vec4<f32>(p{u}.{c}), vv{u}_{w}[{p}], {acc})");
                }
                let _ = writeln!(softmax, "o{i}_{w}_{p} = {acc};");
            }
        }
    }
    let mut rotate = String::new();
    for u in keys.clone() {
        for w in 0..s.k_per_lane {
            let _ = writeln!(rotate, "k{u}_{w} = nk{u}_{w};");
        }
        for w in 0..s.v_per_lane {
            let _ = writeln!(rotate, "v{u}_{w} = nv{u}_{w};");
        }
    }
    // The groups meet: each head's outputs, weighted to the slice's max, summed in turn.
    let v_scale = match spec.kv_fp8 {
        Some(_) => " * (kv_scales[dims.n_kv_heads + kv_h] * FP8_UNIT)",
        None => "",
    };
    let mut meet = String::new();
    for (i, c) in COMPONENTS.iter().enumerate().take(heads) {
        for w in 0..s.v_per_lane {
            let _ = writeln!(meet, "if (lane + {w}u * LANES < V_WORDS) {{");
            for p in quads.clone() {
                let _ = writeln!(
                    meet,
                    "    sh_x[g * V4 + (lane + {w}u * LANES) * QUADS + {p}u] = o{i}_{w}_{p} * own.{c};"
                );
            }
            meet.push_str("}\n");
        }
        let _ = write!(
            meet,
            "workgroupBarrier();\nif ({i}u < n_here && tid < V4) {{\n    var sum = sh_x[tid];\n    \
             for (var r = 1u; r < GROUPS; r = r + 1u) {{\n        sum = sum + sh_x[r * V4 + tid];\n    }}\n    \
             partials[part_index(slice, sv.q.{c}) + tid] = sum{v_scale};\n    \
             if (tid == 0u) {{\n        \
             partials[part_index(slice, sv.q.{c}) + V4] = vec4<f32>(mm.{c}, ll.{c}, 0.0, 0.0);\n    \
             }}\n}}\nworkgroupBarrier();\n"
        );
    }
    let (loop_pre, loop_head) = match sparse {
        false => (
            String::new(),
            "for (var t0 = first; t0 < hi; t0 = t0 + STEP) {\n".to_string(),
        ),
        true => (
            "let k_first = next_tile(first, hi, STEP, sv, wg_b);\nvar k_next = k_first;\n"
                .to_string(),
            "for (var t0 = k_first; t0 < hi; t0 = k_next) {\n    \
             k_next = next_tile(t0 + STEP, hi, STEP, sv, wg_b);\n"
                .to_string(),
        ),
    };
    let (builtins, sg_check) = match subgroups {
        true => (
            "@builtin(subgroup_size) sg_size: u32,\n@builtin(subgroup_invocation_id) sg_id: u32,\n",
            "// Vulkan does not promise that a subgroup holds consecutive invocations, and sizes\n\
             // run from 4 to 128: where a key group is not inside one, sum through workgroup memory.\n\
             if (sg_size < LANES || WG % sg_size != 0u || sg_id != tid % sg_size) {\n    \
             atomicStore(&sh_subgroups_off, 1u);\n}\n",
        ),
        false => ("", ""),
    };
    ENTRY.fill([
        ("name", Fragment::from(spec.name.as_str())),
        ("builtins", Fragment::from(builtins)),
        ("prologue", Fragment::from(super::served::prologue(spec))),
        ("sg_check", Fragment::from(sg_check)),
        ("q_regs", Fragment::from(q_regs)),
        ("o_regs", Fragment::from(o_regs)),
        ("loop_pre", Fragment::from(loop_pre)),
        ("loop_head", Fragment::from(loop_head)),
        ("first_fetch", Fragment::from(first_fetch)),
        ("next_fetch", Fragment::from(next_fetch)),
        ("scores", Fragment::from(scores)),
        ("softmax", Fragment::from(softmax)),
        ("rotate", Fragment::from(rotate)),
        ("meet", Fragment::from(meet)),
    ])
}

const ENTRY: Template = Template {
    name: "stream_entry",
    needs: &[Helper::Exp],
    text: r#"@compute @workgroup_size(WG)
fn $name(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
    $builtins
) {
$prologue
    $sg_check
    let use_sg = workgroupUniformLoad(&sh_subgroups_off) == 0u;
    let g = tid / LANES;
    let lane = tid % LANES;
    $q_regs
    $o_regs
    var m = vec4<f32>(NEG_BIG);
    var l = vec4<f32>(0.0);
    $loop_pre
    $first_fetch
    $loop_head
        $next_fetch
        $scores
        $softmax
        $rotate
    }

    // The groups meet: the slice's max and sum, then each head's output weighted to it.
    if (lane == 0u) {
        sh_ml[g] = m;
        sh_ml[GROUPS + g] = l;
    }
    workgroupBarrier();
    var mm = sh_ml[0];
    for (var r = 1u; r < GROUPS; r = r + 1u) {
        mm = max(mm, sh_ml[r]);
    }
    var ll = vec4<f32>(0.0);
    for (var r = 0u; r < GROUPS; r = r + 1u) {
        ll = fma(exp4(sh_ml[r] - mm), sh_ml[GROUPS + r], ll);
    }
    let own = exp4(m - mm);
    $meet
}
"#,
};
