//! [`Op::LinearRows`](crate::spec::Op::LinearRows): `y = x·Wᵀ (+ b)` at a few rows, at the
//! rate W streams from memory. A workgroup owns `BLOCK` output columns: groups of `LANES`
//! invocations along the reduction, each group `COLS` columns, each lane the words `lane,
//! lane + LANES, ..` of those columns' W rows (a group reads 512 contiguous bytes of a row
//! at a time in f32). Every word of W is read once and multiplied into each of the
//! workgroup's `TILE` rows of x (x is small and shared by every workgroup, so it stays in
//! the caches); each lane keeps one sum per (row, column), then the group's lanes add
//! theirs pairwise through workgroup memory.

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
    // The group's lanes add each lane's sums, four at a time.
    let mut reduce = String::new();
    for chunk in sums.chunks(4) {
        let mut v = ["0.0".to_string(), "0.0".into(), "0.0".into(), "0.0".into()];
        for (i, (r, c)) in chunk.iter().enumerate() {
            v[i] = format!("s{r}_{c}");
        }
        let _ = writeln!(reduce, "t = group_sum(tid, vec4<f32>({}));", v.join(", "));
        let comps = ["x", "y", "z", "w"];
        reduce.push_str("if (lane == 0u) {\n");
        for (i, (r, c)) in chunk.iter().enumerate() {
            let _ = writeln!(reduce, "    store(r0 + {r}u, n0 + {c}u, t.{});", comps[i]);
        }
        reduce.push_str("}\n");
    }
    let bias = match spec.matmul.is_some_and(|f| f.bias) {
        true => "x = x + bias[n];\n",
        false => "",
    };
    out.put(BODY.fill([
        ("decl", Fragment::from(decl)),
        ("loads", Fragment::from(loads)),
        ("fmas", Fragment::from(fmas)),
        ("reduce", Fragment::from(reduce)),
        ("bias", Fragment::from(bias)),
        ("name", Fragment::from(spec.name.as_str())),
    ]));
}

const BODY: Template = Template {
    name: "linear_rows",
    needs: &[],
    text: r#"var<workgroup> sh_red: array<vec4<f32>, WG>;

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

// x summed over the LANES invocations of this one's group, pairwise; every invocation
// reaches the barriers.
fn group_sum(tid: u32, x: vec4<f32>) -> vec4<f32> {
    sh_red[tid] = x;
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s = s / 2u) {
        if (tid % LANES < s) {
            sh_red[tid] = sh_red[tid] + sh_red[tid + s];
        }
        workgroupBarrier();
    }
    let r = sh_red[tid - tid % LANES];
    workgroupBarrier();
    return r;
}

// y[r, n], by the group's first lane, for the call's rows and columns.
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
    var t = vec4<f32>(0.0);
    $reduce
}
"#,
};
