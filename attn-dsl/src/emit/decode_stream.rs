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
use super::served::COMPONENTS;
use super::writer::{Fragment, Template, Wgsl, concat, lines, uint};

use crate::layout::decode::{Stream, stream_word_type};
use crate::spec::KernelSpec;

/// The pass's constants after the widths.
pub(super) fn constants(spec: &KernelSpec, s: &Stream) -> Fragment {
    CONSTANTS.fill([
        ("tile", uint(spec.grid.tile)),
        ("lanes", uint(s.lanes)),
        ("keys", uint(s.keys)),
        ("word", Fragment::from(s.word.to_string())),
        ("k_words", uint(s.k_words)),
        ("v_words", uint(s.v_words)),
        ("quads", uint(s.quads())),
        ("exchange", uint(s.exchange(spec))),
    ])
}

const CONSTANTS: Template = Template {
    name: "stream_constants",
    needs: &[],
    text: r#"// Query heads per workgroup, one per vec4 component.
const TILE: u32 = $tile;
// Lanes per key, key groups, keys a group takes per step, keys per step.
const LANES: u32 = $lanes;
const GROUPS: u32 = WG / LANES;
const KEYS: u32 = $keys;
const STEP: u32 = GROUPS * KEYS;
// Words ($word elements) of a K row and of a V row, and the vec4s of a word.
const K_WORDS: u32 = $k_words;
const V_WORDS: u32 = $v_words;
const QUADS: u32 = $quads;
// Slots of the exchange buffer.
const EXCHANGE: u32 = $exchange;
"#,
};

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
    out.put(words(spec, s.word, ragged, true));
    out.put(group_sum(spec.grid.subgroups, s.lanes));
    out.put(entry(spec, s, sparse));
}

/// The row functions of the cache in words of `word` elements, the query's vec4 index, and
/// `fetch_k` / `fetch_v` / `widen_w`; `ragged` where some lane's last word may be past a
/// row (the fetches then test the word too). The words are read where `loads`, else (a
/// phase-cut timing) made from their index.
pub(super) fn words(spec: &KernelSpec, word: u32, ragged: bool, loads: bool) -> Fragment {
    let raw = stream_word_type(spec, word);
    let load = |cache: &str, words: &str| match (loads, raw) {
        (true, _) => format!("x = {cache}[kv_row(j, kv_h) * {words} + w];"),
        (false, "vec4<f32>") => "x = vec4<f32>(f32((j ^ w) & 15u));".to_string(),
        (false, "vec4<f16>") => "x = vec4<f16>(f16((j ^ w) & 15u));".to_string(),
        (false, _) => format!("x = {raw}((j ^ w) & 0x0f0f0f0fu);"),
    };
    let widen = match (word / 4, spec.kv_fp8.is_some(), spec.dtype) {
        (1, _, _) => Fragment::from(format!(
            "return array<vec4<f32>, 1>({}(x));",
            super::dtype::cache_widen(spec)
        )),
        (_, true, _) => {
            Fragment::from("return array<vec4<f32>, 2>(widen_kv4(x.x), widen_kv4(x.y));")
        }
        (_, false, crate::spec::Dtype::Bf16) => WIDEN_BF16.plain(),
        _ => WIDEN_F16.plain(),
    };
    let (k_in, v_in) = match ragged {
        true => (" && w < K_WORDS", " && w < V_WORDS"),
        false => ("", ""),
    };
    WORDS.fill([
        ("k_in", Fragment::from(k_in)),
        ("v_in", Fragment::from(v_in)),
        ("row", super::decode_split::kv_row(spec)),
        ("qk4", Fragment::from(super::decode_split::qk4(spec))),
        ("raw", Fragment::from(raw)),
        ("k_load", Fragment::from(load("k_cache", "K_WORDS"))),
        ("v_load", Fragment::from(load("v_cache", "V_WORDS"))),
        ("widen", widen),
    ])
}

/// A word of eight bf16 (four u32) as two vec4s: each half the upper bits of an f32.
const WIDEN_BF16: Template = Template {
    name: "widen_bf16",
    needs: &[],
    text: r#"return array<vec4<f32>, 2>(
        bitcast<vec4<f32>>(vec4<u32>(x.x << 16u, x.x & 0xffff0000u, x.y << 16u, x.y & 0xffff0000u)),
        bitcast<vec4<f32>>(vec4<u32>(x.z << 16u, x.z & 0xffff0000u, x.w << 16u, x.w & 0xffff0000u)));
"#,
};

/// A word of eight f16 (four u32) as two vec4s.
const WIDEN_F16: Template = Template {
    name: "widen_f16",
    needs: &[],
    text: r#"return array<vec4<f32>, 2>(
        vec4<f32>(unpack2x16float(x.x), unpack2x16float(x.y)),
        vec4<f32>(unpack2x16float(x.z), unpack2x16float(x.w)));
"#,
};

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
        $k_load
    }
    return x;
}

fn fetch_v(j: u32, hi: u32, w: u32, kv_h: u32) -> $raw {
    var x = $raw();
    if (j < hi$v_in) {
        $v_load
    }
    return x;
}

// A word's elements as vec4s of f32, exactly.
fn widen_w(x: $raw) -> array<vec4<f32>, QUADS> {
    $widen
}

"#,
};

/// The streamed pass's exchange buffers and its `group_sum4` through `sh_x`.
fn group_sum(subgroups: bool, lanes: u32) -> Fragment {
    GROUP_SUM.fill([
        ("flag", Fragment::from(SUBGROUP_FLAG)),
        ("group_sum4", group_sum_fn("sh_x", subgroups, lanes)),
    ])
}

/// The flag [`SUBGROUP_CHECK`] raises, which a split pass's `use_sg` reads.
pub(super) const SUBGROUP_FLAG: &str =
    "// Nonzero when some key's invocations are not inside one subgroup.
var<workgroup> sh_subgroups_off: atomic<u32>;

";

/// `group_sum4(x, tid, use_sg)`: x summed over the LANES invocations that share a key, the
/// same bits in every lane (each butterfly step adds the same two values in either lane,
/// and the fallback, through workgroup memory `buffer`, sums in one order).
pub(super) fn group_sum_fn(buffer: &str, subgroups: bool, lanes: u32) -> Fragment {
    let fast = match subgroups {
        true => {
            let masks = std::iter::successors(Some(1), |m| Some(m * 2)).take_while(|m| *m < lanes);
            GROUP_SUM_FAST.fill([(
                "shuffles",
                lines(masks.map(|mask| format!("y = y + subgroupShuffleXor(y, {mask}u);"))),
            )])
        }
        false => Fragment::default(),
    };
    GROUP_SUM_FN.fill([("fast", fast), ("buf", Fragment::from(buffer))])
}

/// The butterfly over the key group's lanes within a subgroup, where every key group is
/// inside one (`use_sg`).
const GROUP_SUM_FAST: Template = Template {
    name: "group_sum4_subgroups",
    needs: &[],
    text: r#"if (use_sg) {
    var y = x;
    $shuffles
    return y;
}
"#,
};

const GROUP_SUM: Template = Template {
    name: "group_sum4",
    needs: &[],
    text: r#"// The exchange buffer: the fallback butterfly's slots, then the groups' outputs when
// they meet.
var<workgroup> sh_x: array<vec4<f32>, EXCHANGE>;
// Each group's running max (0..GROUPS) and sum (GROUPS..).
var<workgroup> sh_ml: array<vec4<f32>, 2u * GROUPS>;
$flag
$group_sum4
"#,
};

/// [`group_sum_fn`]'s function.
const GROUP_SUM_FN: Template = Template {
    name: "group_sum4_fn",
    needs: &[],
    text: r#"// x summed over the LANES invocations of this invocation's key group, the same bits in
// each of them; every invocation reaches the barriers.
fn group_sum4(x: vec4<f32>, tid: u32, use_sg: bool) -> vec4<f32> {
    $fast
    $buf[tid] = x;
    workgroupBarrier();
    let g0 = tid - tid % LANES;
    var y = $buf[g0];
    for (var i = 1u; i < LANES; i = i + 1u) {
        y = y + $buf[g0 + i];
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
    let regs = move |words: u32| {
        (0..heads)
            .flat_map(move |i| (0..words).flat_map(move |w| (0..s.quads()).map(move |p| (i, w, p))))
    };
    let super::decode_split::KeySteps {
        pre: loop_pre,
        head: loop_head,
        first: first_key,
        next: next_key,
    } = super::decode_split::key_steps("STEP", sparse);
    let rotate = (0..s.keys).flat_map(|u| {
        let k = (0..s.k_per_lane).map(move |w| format!("k{u}_{w} = nk{u}_{w};"));
        k.chain((0..s.v_per_lane).map(move |w| format!("v{u}_{w} = nv{u}_{w};")))
    });
    let (builtins, sg_check) = match spec.grid.subgroups {
        true => (SUBGROUP_BUILTINS.plain(), SUBGROUP_CHECK.plain()),
        false => (Fragment::default(), Fragment::default()),
    };
    ENTRY.fill([
        ("name", Fragment::from(spec.name.as_str())),
        ("builtins", builtins),
        ("prologue", super::served::prologue(spec)),
        ("sg_check", sg_check),
        ("q_regs", query_registers(spec, s)),
        (
            "o_regs",
            lines(
                regs(s.v_per_lane).map(|(i, w, p)| format!("var o{i}_{w}_{p} = vec4<f32>(0.0);")),
            ),
        ),
        ("loop_pre", loop_pre),
        ("loop_head", loop_head),
        ("first_fetch", fetches(s, "", first_key, "var ")),
        ("next_fetch", fetches(s, "n", &next_key, "let ")),
        ("scores", scores(spec, s)),
        ("softmax", softmax(spec, s)),
        ("rotate", lines(rotate)),
        ("meet", meet(spec, s)),
    ])
}

/// The entry's parameters for the subgroup butterfly.
const SUBGROUP_BUILTINS: Template = Template {
    name: "subgroup_builtins",
    needs: &[],
    text: r#"@builtin(subgroup_size) sg_size: u32,
@builtin(subgroup_invocation_id) sg_id: u32,
"#,
};

/// Where the subgroups do not hold the key groups, the butterfly through workgroup memory.
pub(super) const SUBGROUP_CHECK: Template = Template {
    name: "subgroup_check",
    needs: &[],
    text: r#"// Vulkan does not promise that a subgroup holds consecutive invocations, and sizes
// run from 4 to 128: where a key's invocations are not inside one, sum through workgroup
// memory.
if (sg_size < LANES || WG % sg_size != 0u || sg_id != tid % sg_size) {
    atomicStore(&sh_subgroups_off, 1u);
}
"#,
};

/// The lane's share of each served head's query, in registers.
fn query_registers(spec: &KernelSpec, s: &Stream) -> Fragment {
    let heads = spec.grid.tile as usize;
    let quads = s.quads();
    let decls = (0..heads).flat_map(|i| {
        (0..s.k_per_lane).flat_map(move |w| {
            (0..quads).map(move |p| format!("var q{i}_{w}_{p} = vec4<f32>(0.0);"))
        })
    });
    let q_scale = match spec.kv_fp8 {
        Some(_) => " * (kv_scales[kv_h] * FP8_UNIT)",
        None => "",
    };
    let words = (0..s.k_per_lane).map(|w| {
        let heads = COMPONENTS.iter().enumerate().take(heads).map(|(i, c)| {
            let loads = (0..quads).map(|p| {
                format!(
                    "q{i}_{w}_{p} = widen4(q[q4_index(sv.q.{c}) + kw{w} * QUADS + {p}u]){q_scale};"
                )
            });
            QUERY_HEAD.fill([
                ("i", Fragment::from(i.to_string())),
                ("loads", lines(loads)),
            ])
        });
        QUERY_WORD.fill([
            ("w", Fragment::from(w.to_string())),
            ("heads", concat(heads)),
        ])
    });
    words.fold(lines(decls), Fragment::then)
}
/// Word `$w` of the lane's share of the query, for each served head.
const QUERY_WORD: Template = Template {
    name: "stream_query_word",
    needs: &[],
    text: r#"let kw$w = lane + ${w}u * LANES;
if (kw$w < K_WORDS) {
    $heads
}
"#,
};

/// A served head's vec4s of a query word, where the head is real (`$i`: its slot).
const QUERY_HEAD: Template = Template {
    name: "stream_query_head",
    needs: &[],
    text: r#"if (${i}u < n_here) {
    $loads
}
"#,
};

/// The step's fetches of each key's K and V words into `{prefix}k{u}_{w}` /
/// `{prefix}v{u}_{w}`, key u being `{first} + u·GROUPS + g`; `decl` declares them.
fn fetches(s: &Stream, prefix: &str, first: &str, decl: &str) -> Fragment {
    lines((0..s.keys).flat_map(|u| {
        let key = format!("{first} + {u}u * GROUPS + g");
        let k = (0..s.k_per_lane).map({
            let key = key.clone();
            move |w| {
                format!("{decl}{prefix}k{u}_{w} = fetch_k({key}, hi, lane + {w}u * LANES, kv_h);")
            }
        });
        let v = (0..s.v_per_lane).map(move |w| {
            format!("{decl}{prefix}v{u}_{w} = fetch_v({key}, hi, lane + {w}u * LANES, kv_h);")
        });
        k.chain(v).collect::<Vec<_>>()
    }))
}

/// Each key's dot products (the heads in a vec4), summed over the group, then scored.
fn scores(spec: &KernelSpec, s: &Stream) -> Fragment {
    let heads = spec.grid.tile as usize;
    (0..s.keys)
        .map(|u| {
            let widen = (0..s.k_per_lane).map(|w| format!("let kk{u}_{w} = widen_w(k{u}_{w});"));
            let dots = (0..s.k_per_lane).flat_map(|w| {
                (0..s.quads()).map(move |p| {
                    let mut dots = vec!["0.0".to_string(); 4];
                    for (i, d) in dots.iter_mut().enumerate().take(heads) {
                        *d = format!("dot(q{i}_{w}_{p}, kk{u}_{w}[{p}])");
                    }
                    format!("a{u} = a{u} + vec4<f32>({});", dots.join(", "))
                })
            });
            let score_heads = (0..heads).map(|i| {
                super::served::score_head(i, &format!("x{u}"), &format!("j{u}"), &format!("d{u}"))
            });
            SCORE_KEY.fill([
                ("u", Fragment::from(u.to_string())),
                ("widen", lines(widen)),
                ("dots", lines(dots)),
                ("heads", concat(score_heads)),
            ])
        })
        .fold(Fragment::default(), Fragment::then)
}

/// Key `$u` of the step: its dot products with each served head's query,
/// summed over the group, and its scores `x$u` (NEG_BIG past the slice).
const SCORE_KEY: Template = Template {
    name: "stream_score_key",
    needs: &[],
    text: r#"$widen
var a$u = vec4<f32>(0.0);
$dots
let d$u = group_sum4(a$u, tid, use_sg);
let j$u = t0 + ${u}u * GROUPS + g;
var x$u = vec4<f32>(NEG_BIG);
if (j$u < hi) {
    $heads
}
"#,
};

/// The step's max, the rescale of what the group holds, the keys' weights and P·V.
fn softmax(spec: &KernelSpec, s: &Stream) -> Fragment {
    let keys = 0..s.keys;
    let xs: Vec<String> = keys.clone().map(|u| format!("x{u}")).collect();
    let step_max = xs
        .iter()
        .skip(1)
        .fold(xs[0].clone(), |acc, x| format!("max({acc}, {x})"));
    let weights = keys.clone().map(|u| {
        format!("let p{u} = select(vec4<f32>(0.0), exp4(x{u} - m_new), x{u} > vec4<f32>(NEG_BIG));")
    });
    let ps: Vec<String> = keys.clone().map(|u| format!("p{u}")).collect();
    let widen = keys.clone().flat_map(|u| {
        (0..s.v_per_lane).map(move |w| format!("let vv{u}_{w} = widen_w(v{u}_{w});"))
    });
    let heads = COMPONENTS.iter().enumerate().take(spec.grid.tile as usize);
    let pv = heads.flat_map(|(i, c)| {
        let keys = keys.clone();
        (0..s.v_per_lane).flat_map(move |w| {
            let keys = keys.clone();
            (0..s.quads()).map(move |p| {
                let acc = keys
                    .clone()
                    .fold(format!("o{i}_{w}_{p} * corr.{c}"), |acc, u| {
                        format!("fma(vec4<f32>(p{u}.{c}), vv{u}_{w}[{p}], {acc})")
                    });
                format!("o{i}_{w}_{p} = {acc};")
            })
        })
    });
    SOFTMAX.fill([
        ("step_max", Fragment::from(step_max)),
        ("weights", lines(weights)),
        ("sum", Fragment::from(ps.join(" + "))),
        ("widen", lines(widen)),
        ("pv", lines(pv)),
    ])
}

/// The online softmax's step: the running max and sum move on, the held outputs rescale
/// by `corr` and take the step's keys' P·V.
const SOFTMAX: Template = Template {
    name: "stream_softmax",
    needs: &[Helper::Exp],
    text: r#"let m_new = max(m, $step_max);
let corr = exp4(m - m_new);
$weights
l = fma(l, corr, $sum);
m = m_new;
$widen
$pv
"#,
};

/// The groups meet: each head's outputs, weighted to the slice's max, summed in turn.
fn meet(spec: &KernelSpec, s: &Stream) -> Fragment {
    let v_scale = match spec.kv_fp8 {
        Some(_) => " * (kv_scales[dims.n_kv_heads + kv_h] * FP8_UNIT)",
        None => "",
    };
    let heads = COMPONENTS.iter().enumerate().take(spec.grid.tile as usize);
    heads
        .map(|(i, c)| {
            let words = (0..s.v_per_lane).map(|w| {
                let stores = (0..s.quads()).map(|p| {
                    format!(
                        "sh_x[g * V4 + (lane + {w}u * LANES) * QUADS + {p}u] = o{i}_{w}_{p} * own.{c};"
                    )
                });
                MEET_WORD.fill([
                    ("w", Fragment::from(w.to_string())),
                    ("stores", lines(stores)),
                ])
            });
            MEET_HEAD.fill([
                ("words", concat(words)),
                ("i", Fragment::from(i.to_string())),
                ("c", Fragment::from(*c)),
                ("v_scale", Fragment::from(v_scale)),
            ])
        })
        .fold(Fragment::default(), Fragment::then)
}

/// The group's share of word `$w` of a head's output, weighted to the
/// slice's max, into the exchange buffer.
const MEET_WORD: Template = Template {
    name: "stream_meet_word",
    needs: &[],
    text: r#"if (lane + ${w}u * LANES < V_WORDS) {
    $stores
}
"#,
};

/// Served head `$c` (`$i`: its slot): the groups' shares summed and flushed with the
/// slice's (m, l), where the head is real; every invocation reaches the barriers.
const MEET_HEAD: Template = Template {
    name: "stream_meet_head",
    needs: &[],
    text: r#"$words
workgroupBarrier();
if (${i}u < n_here && tid < V4) {
    var sum = sh_x[tid];
    for (var r = 1u; r < GROUPS; r = r + 1u) {
        sum = sum + sh_x[r * V4 + tid];
    }
    partials[part_index(slice, sv.q.$c) + tid] = sum$v_scale;
    if (tid == 0u) {
        partials[part_index(slice, sv.q.$c) + V4] = vec4<f32>(mm.$c, ll.$c, 0.0, 0.0);
    }
}
workgroupBarrier();
"#,
};

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
