//! [`Op::LinearRows`](crate::spec::Op::LinearRows): `y = x·Wᵀ (+ b)` at a few rows, at the
//! rate W streams from memory. A workgroup owns `BLOCK` output columns: groups of `LANES`
//! invocations along the reduction, each group `COLS` columns, each lane the words `lane,
//! lane + LANES, ..` of those columns' W rows (a group reads 512 contiguous bytes of a row
//! at a time in f32). Every word of W is read once and multiplied into each of the
//! workgroup's `TILE` rows of x (x is small and shared by every workgroup, so it stays in
//! the caches); each lane keeps one sum per (row, column). The group's lanes then meet in
//! workgroup memory, sixteen sums at a time: each lane writes its batch, and lane i adds sum
//! i of it over the group's lanes, pairwise, in registers (two barriers a batch; a tree per
//! four sums took 7, and 1.2-1.5x the time from 4 to 16 rows on an H200, 2026-11-29).

use super::writer::{Fragment, Template, Wgsl, concat, lines, uint};

use crate::layout::rows::{LINEAR_COLUMNS, LINEAR_LANES};
use crate::spec::KernelSpec;

/// Word loads of W each lane issues together before multiplying them (for loads in flight).
const UNROLL: u32 = 4;

pub(super) fn constants(out: &mut Wgsl, spec: &KernelSpec) {
    out.put(CONSTANTS.fill([
        ("wg", uint(spec.workgroup_size)),
        ("hidden", uint(spec.head_dim)),
        ("out", uint(spec.out_dim)),
        ("tile", uint(spec.grid.tile)),
        ("lanes", uint(LINEAR_LANES)),
        ("cols", uint(LINEAR_COLUMNS)),
        ("unroll", uint(UNROLL)),
    ]));
}

/// The kernel's shape: the workgroup, the widths, the rows per workgroup, the lanes and
/// columns of a group and the loads per step (each a u32 literal).
const CONSTANTS: Template = Template {
    name: "linear_rows_constants",
    needs: &[],
    text: r#"const WG: u32 = $wg;
const HIDDEN: u32 = $hidden;
const OUT: u32 = $out;
// vec4s of a row of x or W.
const K4: u32 = HIDDEN / 4u;
// Rows per workgroup, lanes per column group, columns per group and workgroup.
const TILE: u32 = $tile;
const LANES: u32 = $lanes;
const COLS: u32 = $cols;
const BLOCK: u32 = WG / LANES * COLS;
// W's words each lane loads per step.
const UNROLL: u32 = $unroll;

"#,
};

pub(super) fn body(out: &mut Wgsl, spec: &KernelSpec) {
    super::dtype::vec4_codec(out, spec.dtype);
    let rows = spec.grid.tile;
    let cols = LINEAR_COLUMNS;
    let sums: Vec<(u32, u32)> = (0..rows)
        .flat_map(|r| (0..cols).map(move |c| (r, c)))
        .collect();
    let decl = lines(sums.iter().map(|(r, c)| format!("var s{r}_{c} = 0.0;")));
    let loads = lines((0..UNROLL).flat_map(|u| {
        let w = (0..cols).map(move |c| format!("let w{u}_{c} = w_at(n0 + {c}u, k{u});"));
        std::iter::once(format!("let k{u} = kb + {u}u * LANES;")).chain(w)
    }));
    let fmas = lines((0..UNROLL).flat_map(|u| {
        (0..rows).flat_map(move |r| {
            let dots =
                (0..cols).map(move |c| format!("s{r}_{c} = s{r}_{c} + dot(x{u}_{r}, w{u}_{c});"));
            std::iter::once(format!("let x{u}_{r} = x_at(r0 + {r}u, k{u});")).chain(dots)
        })
    }));
    let bias = match spec.matmul.is_some_and(|f| f.bias) {
        true => "x = x + bias[n];",
        false => "",
    };
    out.put(BODY.fill([
        ("decl", decl),
        ("loads", loads),
        ("fmas", fmas),
        ("reduce", batched_reduce(&sums)),
        ("pairs", pairs()),
        ("bias", Fragment::from(bias)),
        ("name", Fragment::from(spec.name.as_str())),
    ]));
}

/// The sums (row, column) in batches of sixteen: each batch through `group_sums`, and lane
/// i of each group stores sum i of it.
fn batched_reduce(sums: &[(u32, u32)]) -> Fragment {
    concat(sums.chunks(16).enumerate().map(|(b, batch)| {
        let mut quads: Vec<String> = batch
            .chunks(4)
            .map(|q| {
                let mut c = vec!["0.0".to_string(); 4];
                for (i, (r, col)) in q.iter().enumerate() {
                    c[i] = format!("s{r}_{col}");
                }
                format!("vec4<f32>({})", c.join(", "))
            })
            .collect();
        quads.resize(4, "vec4<f32>(0.0)".into());
        BATCH.fill([
            ("n", uint(batch.len() as u32)),
            ("quads", Fragment::from(quads.join(", "))),
            ("batch", uint(b as u32)),
        ])
    }))
}

/// Batch `$batch` of `$n` sums, `$quads` the four vec4s holding them, through
/// `group_sums`, and stored by the lanes that hold them.
const BATCH: Template = Template {
    name: "linear_rows_batch",
    needs: &[],
    text: r#"t = group_sums(tid, $n, $quads);
if (lane < $n) {
    let i = $batch * 16u + lane;
    store(r0 + i / COLS, n0 + i % COLS, t);
}
"#,
};

/// Sum `lane` of the batch over the group's lanes, pairwise: the lanes' pairs, then pairs
/// of those, .. to one, `t`.
fn pairs() -> Fragment {
    let mut n = LINEAR_LANES / 2;
    let mut pairs: Vec<String> = (0..n)
        .map(|i| {
            format!(
                "let p0_{i} = sh_red[(g0 + {}u) * 4u + quad][comp] + sh_red[(g0 + {}u) * 4u + quad][comp];",
                2 * i,
                2 * i + 1
            )
        })
        .collect();
    let mut level = 0;
    while n > 1 {
        n /= 2;
        for i in 0..n {
            let (a, b) = (2 * i, 2 * i + 1);
            pairs.push(format!(
                "let p{}_{i} = p{level}_{a} + p{level}_{b};",
                level + 1
            ));
        }
        level += 1;
    }
    pairs.push(format!("t = p{level}_0;"));
    lines(pairs)
}

/// The kernel: `$decl` the lane's sums, each step's `$loads` of W's words and `$fmas` of
/// the rows of x into the sums, `$reduce` the sums through `group_sums` (`$pairs` the
/// pairwise sum of a lane's share) and stored (`$bias` added).
const BODY: Template = Template {
    name: "linear_rows",
    needs: &[],
    text: r#"var<workgroup> sh_red: array<vec4<f32>, 4u * WG>;

// vec4 k4 of row r of x; rows past the call's repeat its last (their sums are not stored).
fn x_at(r: u32, k4: u32) -> vec4<f32> {
    let v = x[min(r, dims.rows - 1u) * K4 + min(k4, K4 - 1u)];
    return select(vec4<f32>(0.0), v, k4 < K4);
}

// vec4 k4 of W's row n, as f32; zeros past the reduction, row n clamped to the last.
fn w_at(n: u32, k4: u32) -> vec4<f32> {
    let v = widen4(w[min(n, OUT - 1u) * K4 + min(k4, K4 - 1u)]);
    return select(vec4<f32>(0.0), v, k4 < K4);
}

// A batch of up to sixteen sums (a, b, c, d) of every lane: lane i < n of each group returns
// sum i of the batch over the group's lanes, added pairwise. Every invocation reaches the
// barriers.
fn group_sums(tid: u32, n: u32, a: vec4<f32>, b: vec4<f32>, c: vec4<f32>, d: vec4<f32>) -> f32 {
    sh_red[tid * 4u] = a;
    sh_red[tid * 4u + 1u] = b;
    sh_red[tid * 4u + 2u] = c;
    sh_red[tid * 4u + 3u] = d;
    workgroupBarrier();
    let lane = tid % LANES;
    let g0 = tid - lane;
    var t = 0.0;
    if (lane < n) {
        let quad = lane / 4u;
        let comp = lane % 4u;
        $pairs
    }
    workgroupBarrier();
    return t;
}

// y[r, n], by the lane that holds its sum, for the call's rows and columns.
fn store(r: u32, n: u32, sum: f32) {
    if (r < dims.rows && n < OUT) {
        var x = sum;
        $bias
        y[r * OUT + n] = x;
    }
}

@compute @workgroup_size(WG)
fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let lane = tid % LANES;
    let n0 = wg.x * BLOCK + tid / LANES * COLS;
    let r0 = wg.y * TILE;
    $decl
    for (var kb = lane; kb < K4; kb = kb + UNROLL * LANES) {
        $loads
        $fmas
    }
    var t = 0.0;
    $reduce
}
"#,
};
