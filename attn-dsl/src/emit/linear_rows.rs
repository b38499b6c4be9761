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

use super::writer::{Fragment, Template, Wgsl};
use std::fmt::Write;

use crate::layout::rows::{LINEAR_COLUMNS, LINEAR_LANES};
use crate::spec::KernelSpec;

/// Word loads of W each lane issues together before multiplying them (for loads in flight).
const UNROLL: u32 = 4;

pub(super) fn constants(out: &mut Wgsl, spec: &KernelSpec) {
    let _ = write!(
        out,
        "const WG: u32 = {wg}u;\nconst HIDDEN: u32 = {hidden}u;\nconst OUT: u32 = {out}u;\n\
         // vec4s of a row of x or W.\nconst K4: u32 = HIDDEN / 4u;\n\
         // Rows per workgroup, lanes per column group, columns per group and workgroup.\n\
         const TILE: u32 = {tile}u;\nconst LANES: u32 = {LINEAR_LANES}u;\n\
         const COLS: u32 = {LINEAR_COLUMNS}u;\nconst BLOCK: u32 = WG / LANES * COLS;\n\
         // W's words each lane loads per step.\nconst UNROLL: u32 = {UNROLL}u;\n\n",
        wg = spec.workgroup_size,
        hidden = spec.head_dim,
        out = spec.out_dim,
        tile = spec.grid.tile,
    );
}

pub(super) fn body(out: &mut Wgsl, spec: &KernelSpec) {
    super::dtype::vec4_codec(out, spec.dtype);
    let rows = spec.grid.tile as usize;
    let cols = LINEAR_COLUMNS as usize;
    let sums: Vec<(usize, usize)> = (0..rows)
        .flat_map(|r| (0..cols).map(move |c| (r, c)))
        .collect();
    let mut decl = String::new();
    for (r, c) in &sums {
        let _ = writeln!(decl, "var s{r}_{c} = 0.0;");
    }
    let mut loads = String::new();
    let mut fmas = String::new();
    for u in 0..UNROLL {
        let _ = writeln!(loads, "let k{u} = kb + {u}u * LANES;");
        for c in 0..cols {
            let _ = writeln!(loads, "let w{u}_{c} = w_at(n0 + {c}u, k{u});");
        }
        for r in 0..rows {
            let _ = writeln!(fmas, "let x{u}_{r} = x_at(r0 + {r}u, k{u});");
            for c in 0..cols {
                let _ = writeln!(fmas, "s{r}_{c} = s{r}_{c} + dot(x{u}_{r}, w{u}_{c});");
            }
        }
    }
    let reduce = batched_reduce(&sums);
    let bias = match spec.matmul.is_some_and(|f| f.bias) {
        true => "x = x + bias[n];\n",
        false => "",
    };
    out.put(BODY.fill([
        ("decl", Fragment::from(decl)),
        ("loads", Fragment::from(loads)),
        ("fmas", Fragment::from(fmas)),
        ("reduce", Fragment::from(reduce)),
        ("group_sums", Fragment::from(group_sums())),
        ("bias", Fragment::from(bias)),
        ("name", Fragment::from(spec.name.as_str())),
    ]));
}

/// The sums (row, column) in batches of sixteen: each batch through `group_sums`, and lane
/// i of each group stores sum i of it.
fn batched_reduce(sums: &[(usize, usize)]) -> String {
    let mut reduce = String::from("var t = 0.0;\n");
    for (b, batch) in sums.chunks(16).enumerate() {
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
        let n = batch.len();
        let _ = writeln!(reduce, "t = group_sums(tid, {n}u, {});", quads.join(", "));
        let _ = writeln!(
            reduce,
            "if (lane < {n}u) {{\n    let i = {b}u * 16u + lane;\n    store(r0 + i / COLS, n0 + i % COLS, t);\n}}"
        );
    }
    reduce
}

/// Sum `lane` of the batch over the group's lanes, pairwise: the lanes' pairs, then pairs
/// of those, .. to one, `t`.
fn group_sums() -> String {
    let mut out = String::from("let quad = lane / 4u;\nlet comp = lane % 4u;\n");
    let mut n = LINEAR_LANES / 2;
    for i in 0..n {
        let _ = writeln!(
            out,
            "let p0_{i} = sh_red[(g0 + {}u) * 4u + quad][comp] + sh_red[(g0 + {}u) * 4u + quad][comp];",
            2 * i,
            2 * i + 1
        );
    }
    let mut level = 0;
    while n > 1 {
        n /= 2;
        for i in 0..n {
            let (a, b) = (2 * i, 2 * i + 1);
            let _ = writeln!(out, "let p{}_{i} = p{level}_{a} + p{level}_{b};", level + 1);
        }
        level += 1;
    }
    let _ = writeln!(out, "t = p{level}_0;");
    out
}

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
        $group_sums
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
    $reduce
}
"#,
};
