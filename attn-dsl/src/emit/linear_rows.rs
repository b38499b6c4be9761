//! [`Op::LinearRows`](crate::spec::Op::LinearRows): `y = x·Wᵀ (+ b)` at a few rows, at the
//! rate W streams from memory. Every word of W is read once and multiplied into each of
//! the workgroup's `TILE` rows of x (x is small and shared by every workgroup, so it stays
//! in the caches). How the lanes share W's columns and the reduction is
//! [`LinearLayout`](crate::layout::rows::LinearLayout): lanes on one column take
//! interleaved steps of the reduction (`PARTS` of them), each keeps one sum per (row,
//! column), each step's products summed apart first, and the parts meet in workgroup
//! memory, sixteen sums at a time, each added over the parts by one invocation, its
//! rounding errors carried (and, in the layout of few rows, from each unrolled iteration
//! of a lane's loop to the next).

use super::numerics::Helper;
use super::writer::{Fragment, Template, Wgsl, concat, lines, uint};

use crate::layout::rows::{LinearLayout, linear_layout};
use crate::spec::{Dtype, KernelSpec};

/// The layout the rules give `spec`.
fn layout(spec: &KernelSpec) -> LinearLayout {
    linear_layout(spec.grid.tile, spec.dtype.bytes(), spec.workgroup_size)
}

pub(super) fn constants(out: &mut Wgsl, spec: &KernelSpec) {
    let l = layout(spec);
    out.put(CONSTANTS.fill([
        ("wg", uint(spec.workgroup_size)),
        ("hidden", uint(spec.head_dim)),
        ("out", uint(spec.out_dim)),
        ("tile", uint(spec.grid.tile)),
        ("lpc", uint(l.lanes_per_column)),
        ("gk", uint(l.groups_along_reduction)),
        ("cols", uint(l.columns)),
        ("step", uint(l.step)),
        ("unroll", uint(l.unroll)),
        ("unmasked", Fragment::from(l.unmasked_when_even.to_string())),
    ]));
}

/// The kernel's shape (each a u32 literal).
const CONSTANTS: Template = Template {
    name: "linear_rows_constants",
    needs: &[],
    text: r#"const WG: u32 = $wg;
const HIDDEN: u32 = $hidden;
const OUT: u32 = $out;
// vec4s of a row of x or W.
const K4: u32 = HIDDEN / 4u;
// Rows per workgroup.
const TILE: u32 = $tile;
// A group of 32 lanes: SPAN columns side by side, LPC lanes on each; GK groups on the same
// columns, the workgroup's others (SETS) on others; COLS columns per lane.
const LPC: u32 = $lpc;
const SPAN: u32 = 32u / LPC;
const GK: u32 = $gk;
const SETS: u32 = WG / 32u / GK;
const COLS: u32 = $cols;
// Columns a workgroup owns, column slots (a lane's first column), parts of the reduction.
const SLOTS: u32 = SETS * SPAN;
const BLOCK: u32 = SLOTS * COLS;
const PARTS: u32 = LPC * GK;
// vec4s of W per lane, column and step; steps whose loads are issued together.
const STEP: u32 = $step;
const UNROLL: u32 = $unroll;
// Whether loads go untested: every lane's steps end exactly at the reduction's end (and
// the layout takes the untested loads there).
const EVEN: bool = $unmasked && K4 % (UNROLL * PARTS * STEP) == 0u;

"#,
};

pub(super) fn body(out: &mut Wgsl, spec: &KernelSpec) {
    super::dtype::vec4_codec(out, spec.dtype);
    let form = spec.matmul_form();
    if form.y == Dtype::Bf16 && spec.dtype != Dtype::Bf16 {
        super::dtype::bf16_bits(out);
    }
    out.put(WIDEN_X.fill([
        ("t", Fragment::from(super::dtype::vec4_type(form.x))),
        ("widen", Fragment::from(super::dtype::widen4(form.x))),
    ]));
    let l = layout(spec);
    // Each (sum, column slot) of a batch has an invocation of its own in `part_sums`, and
    // a word's two columns neighbouring ones: true of every layout at the row layers'
    // workgroup of 256 (`check_sizes` holds them to it).
    let slots = l.block(spec.workgroup_size) / l.columns;
    assert!(16 * slots <= spec.workgroup_size && slots.is_multiple_of(2));
    let sums: Vec<(u32, u32)> = (0..spec.grid.tile)
        .flat_map(|r| (0..l.columns).map(move |c| (r, c)))
        .collect();
    let errs = sums.iter().filter(|_| l.compensated);
    let decl = lines(
        sums.iter()
            .map(|(r, c)| format!("var s{r}_{c} = 0.0;"))
            .chain(errs.map(|(r, c)| format!("var e{r}_{c} = 0.0;"))),
    );
    if l.compensated {
        out.put(CARRIED_ADD.plain());
    }
    let bias = match form.bias {
        true => "let u = two_sum(sum.x, bias[n]);\nreturn u.x + (sum.y + u.y);",
        false => "return sum.x + sum.y;",
    };
    out.put(BODY.fill([
        ("decl", decl),
        ("loads", loads(&l)),
        ("fmas", fmas(&l, spec.grid.tile)),
        ("reduce", batched_reduce(&sums, l.compensated)),
        ("bias", Fragment::from(bias)),
        ("store", store(form.y)),
        ("name", Fragment::from(spec.name.as_str())),
    ]));
}

/// `widen_x`: four elements of x, as held, in f32.
const WIDEN_X: Template = Template {
    name: "linear_rows_widen_x",
    needs: &[],
    text: r#"fn widen_x(x: $t) -> vec4<f32> {
    return $widen;
}

"#,
};

/// `part_sums`'s store of its sum `t` into y[r, col] where it is `mine` (a row and column
/// of the call), rounded once into y's dtype. A half-precision y is bound as words of two
/// columns, written together by the invocation of the even one (`part_sums` gives the
/// columns of a word to neighbouring invocations; a Linear writing halves has even
/// parts), through `sh_red`: invocations writing parts of one word, or of one vector, may
/// race (WGSL lets a component's store touch the whole vector).
fn store(y: Dtype) -> Fragment {
    let word = match y {
        Dtype::F32 => {
            return Fragment::from("if (mine) {\n    y[y_at(r, col)] = y_value(col, t);\n}");
        }
        // Rounded by WGSL's conversion, so that the packing (whose rounding is the
        // platform's) meets values it holds exactly.
        Dtype::F16 => "pack2x16float(vec2<f32>(vec2<f16>(f16(v), f16(sh_red[tid + 1u]))))",
        Dtype::Bf16 => "bf16_bits(v) | (bf16_bits(sh_red[tid + 1u]) << 16u)",
    };
    HALF_STORE.fill([("word", Fragment::from(word))])
}

const HALF_STORE: Template = Template {
    name: "linear_rows_half_store",
    needs: &[],
    text: r#"let v = select(0.0, y_value(min(col, OUT - 1u), t), mine);
workgroupBarrier();
sh_red[tid] = v;
workgroupBarrier();
if (mine && q % 2u == 0u) {
    y[y_at(r, col) >> 1u] = $word;
}
"#,
};

/// A lane's loads of W for `unroll` steps: `w{u}_{c}_{v}`, vec4 v of step u's run of
/// column c.
fn loads(l: &LinearLayout) -> Fragment {
    lines((0..l.unroll).flat_map(|u| {
        let w = (0..l.columns).flat_map(move |c| {
            (0..l.step)
                .map(move |v| format!("let w{u}_{c}_{v} = w_at(n0 + {c}u * SLOTS, k{u} + {v}u);"))
        });
        std::iter::once(format!("let k{u} = c + {u}u * PARTS * STEP;")).chain(w)
    }))
}

/// Each step's products: every row's vec4s of x, each met with every column's words, the
/// step's products summed pairwise before they join the row's sum. Where the sums are
/// `compensated`, the unroll's steps are summed pairwise first and join the sum once per
/// iteration, its rounding error carried: a TwoSum per step cost the layout of 8 rows
/// 1.4x its time on an H200 (2026-11-30), and a quarter of them keeps the chain's error
/// that of a few-level tree.
fn fmas(l: &LinearLayout, rows: u32) -> Fragment {
    let l = *l;
    let steps = (0..l.unroll).flat_map(move |u| {
        (0..rows).flat_map(move |r| {
            let x = (0..l.step)
                .map(move |v| format!("let x{u}_{r}_{v} = x_at(r0 + {r}u, k{u} + {v}u);"));
            let dots = (0..l.columns).map(move |c| {
                let terms: Vec<String> = (0..l.step)
                    .map(|v| format!("dot(x{u}_{r}_{v}, w{u}_{c}_{v})"))
                    .collect();
                let d = pairwise(&terms);
                match l.compensated {
                    true => format!("let d{u}_{r}_{c} = {d};"),
                    false => format!("s{r}_{c} = s{r}_{c} + {d};"),
                }
            });
            x.chain(dots)
        })
    });
    let carried = (0..rows)
        .flat_map(move |r| (0..l.columns).map(move |c| (r, c)))
        .filter(move |_| l.compensated)
        .map(move |(r, c)| {
            let d: Vec<String> = (0..l.unroll).map(|u| format!("d{u}_{r}_{c}")).collect();
            format!("add_carried(&s{r}_{c}, &e{r}_{c}, {});", pairwise(&d))
        });
    lines(steps.chain(carried))
}

/// `add_carried`: a lane's step added to its sum, the rounding error to the sum's error.
const CARRIED_ADD: Template = Template {
    name: "linear_rows_carried_add",
    needs: &[Helper::TwoSumErr4],
    text: r#"// *s + d into *s, its rounding error (TwoSum) into *e.
fn add_carried(s: ptr<function, f32>, e: ptr<function, f32>, d: f32) {
    let t = *s + d;
    *e = *e + two_sum_err4(vec4<f32>(*s), vec4<f32>(d), vec4<f32>(t)).x;
    *s = t;
}

"#,
};

/// `terms` added pairwise, as one WGSL expression.
fn pairwise(terms: &[String]) -> String {
    match terms.len() {
        0 => "0.0".into(),
        1 => terms[0].clone(),
        n => {
            let (a, b) = terms.split_at(n.div_ceil(2));
            format!("({} + {})", pairwise(a), pairwise(b))
        }
    }
}

/// The sums (row, column) in batches of sixteen, each written by every part (with its
/// carried error where `compensated`) and then added over the parts by `part_sums`.
fn batched_reduce(sums: &[(u32, u32)], compensated: bool) -> Fragment {
    concat(sums.chunks(16).enumerate().map(|(b, batch)| {
        let writes = lines(batch.iter().enumerate().map(|(i, (r, c))| {
            let e = match compensated {
                true => format!(" + e{r}_{c}"),
                false => String::new(),
            };
            format!("sh_red[({i}u * PARTS + part) * SLOTS + slot] = s{r}_{c}{e};")
        }));
        BATCH.fill([
            ("writes", writes),
            ("n", uint(batch.len() as u32)),
            ("first", uint(16 * b as u32)),
        ])
    }))
}

/// A batch of `$n` sums from sum `$first` on: written by every lane, then added over the
/// parts, a (sum, column) per invocation.
const BATCH: Template = Template {
    name: "linear_rows_batch",
    needs: &[],
    text: r#"workgroupBarrier();
$writes
workgroupBarrier();
part_sums(tid, $first, $n, wg.x, r0);
"#,
};

/// The kernel: `$decl` the lane's sums, each step's `$loads` of W's words and `$fmas` of
/// the rows of x into the sums, `$reduce` the sums added over the parts and stored
/// (`$bias`: with the bias). The parts' sums and the bias are added with their rounding errors carried
/// (TwoSum): a sum then comes within about an ulp of the exact one, where a plain pairwise
/// sum (and the check's f32 baseline) differ from it by several; with the tree's plain
/// adds, 0.5-2.5% of seeds went over the check's bound at 200 to 4096 wide.
const BODY: Template = Template {
    name: "linear_rows",
    needs: &[Helper::TwoSumErr4],
    text: r#"var<workgroup> sh_red: array<f32, 16u * WG>;

// vec4 k4 of row r of x; rows past the call's repeat its last (their sums are not stored).
fn x_at(r: u32, k4: u32) -> vec4<f32> {
    if (EVEN) {
        return widen_x(x[min(r, dims.rows - 1u) * K4 + k4]);
    }
    let v = widen_x(x[min(r, dims.rows - 1u) * K4 + min(k4, K4 - 1u)]);
    return select(vec4<f32>(0.0), v, k4 < K4);
}

// vec4 k4 of W's row n, as f32; zeros past the reduction, row n clamped to the last.
fn w_at(n: u32, k4: u32) -> vec4<f32> {
    if (EVEN) {
        return widen4(w[min(n, OUT - 1u) * K4 + k4]);
    }
    let v = widen4(w[min(n, OUT - 1u) * K4 + min(k4, K4 - 1u)]);
    return select(vec4<f32>(0.0), v, k4 < K4);
}

// a + b as (sum, its rounding error).
fn two_sum(a: f32, b: f32) -> vec2<f32> {
    let t = a + b;
    return vec2<f32>(t, two_sum_err4(vec4<f32>(a), vec4<f32>(b), vec4<f32>(t)).x);
}

// Sums first..first + n of the batch in `sh_red`, each added over the parts and stored:
// sum i of column slot q by invocation i * SLOTS + q (n * SLOTS is at most WG).
fn part_sums(tid: u32, first: u32, n: u32, wgx: u32, r0: u32) {
    let i = tid / SLOTS;
    let q = tid % SLOTS;
    let at = first + i;
    let r = r0 + at / COLS;
    let col = wgx * BLOCK + at % COLS * SLOTS + q;
    let mine = tid < n * SLOTS && r < dims.rows && col < OUT;
    var t = vec2<f32>(0.0);
    if (mine) {
        for (var p = 0u; p < PARTS; p = p + 1u) {
            let u = two_sum(t.x, sh_red[(i * PARTS + p) * SLOTS + q]);
            t = vec2<f32>(u.x, t.y + u.y);
        }
    }
    $store
}

// Where y holds row r of column n: y's columns are cut into up to three parts (a fused
// projection's Q, K and V), each part's y_rows rows stored whole (the call's rows first),
// one part after another, so that each part is a tensor of its own; one part is y row by
// row.
fn y_at(r: u32, n: u32) -> u32 {
    let p1 = select(dims.part1, OUT, dims.part1 == 0u);
    let p2 = select(dims.part2, OUT, dims.part2 == 0u);
    let start = select(select(0u, p1, n >= p1), p2, n >= p2);
    let end = select(select(p1, p2, n >= p1), OUT, n >= p2);
    return dims.y_rows * start + r * (end - start) + (n - start);
}

// y[r, n] from its sum and error, with the bias.
fn y_value(n: u32, sum: vec2<f32>) -> f32 {
    $bias
}

@compute @workgroup_size(WG)
fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let group = tid / 32u;
    let lane = tid % 32u;
    let slot = group / GK * SPAN + lane % SPAN;
    let part = group % GK * LPC + lane / SPAN;
    let n0 = wg.x * BLOCK + slot;
    let r0 = wg.y * TILE;
    $decl
    for (var c = part * STEP; c < K4; c = c + UNROLL * PARTS * STEP) {
        $loads
        $fmas
    }
    $reduce
}
"#,
};
