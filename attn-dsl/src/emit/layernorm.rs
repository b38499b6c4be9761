//! The fused LayerNorm + Linear of seed 003: the forward, its backward (dx owned per row;
//! dγ, dβ, dW and db summed over the row tile, then added by atomics or flushed as the
//! tile's partial for the reduce kernel), and that reduce.
//!
//! Statistics are f32 with the two-pass variance (mean first, then the mean of squared
//! deviations), reduced by the workgroup tree. Every long dot product is summed in blocks
//! of [`super::numerics::DOT_BLOCK`] terms, blocks of blocks, then the total, so no chain is
//! longer than a framework's pairwise leaves (see `blocked_sum`).

use std::fmt::Write;

use super::{reduce, scatter};
use crate::spec::{KernelSpec, Op, WriteMode};

/// The reductions' memory, and the forward's normalized tile rows.
pub(super) fn workgroup_bytes(spec: &KernelSpec) -> u32 {
    let reductions = reduce::workgroup_bytes(spec.workgroup_size);
    match spec.op {
        Op::LayernormLinear => reductions + 4 * spec.grid.tile * spec.head_dim,
        Op::LayernormLinearBackward => reductions,
        _ => 0,
    }
}

pub(super) fn constants(out: &mut String, spec: &KernelSpec) {
    let _ = write!(
        out,
        "const WG: u32 = {}u;\nconst HIDDEN: u32 = {}u;\nconst OUT: u32 = {}u;\n\
         const TILE: u32 = {}u;\n// Hidden features each invocation keeps in registers.\n\
         const KPT: u32 = (HIDDEN + WG - 1u) / WG;\nconst BLOCK: u32 = {}u;\n\
         // dW elements per backward workgroup.\nconst DW_CHUNK: u32 = {}u;\n\n",
        spec.workgroup_size,
        spec.head_dim,
        spec.out_dim,
        spec.grid.tile,
        super::numerics::DOT_BLOCK,
        crate::row_layer::dw_chunk(spec.workgroup_size),
    );
}

pub(super) fn body(out: &mut String, spec: &KernelSpec) {
    match spec.op {
        Op::LayernormLinear => forward(out, spec),
        Op::LayernormLinearBackward => backward(out, spec),
        _ => reduce_partials(out, spec),
    }
}

/// `sum_{i in 0..count} TERM(i)` as a WGSL statement block leaving the sum in `result`:
/// leaves of BLOCK terms (written out, so that a leaf is one loop trip: llvmpipe stops any
/// invocation after 65535 loop trips), BLOCK leaves per branch, then the branches in turn.
fn blocked_sum(result: &str, count: &str, term: &str) -> String {
    let leaf: String = (0..super::numerics::DOT_BLOCK)
        .map(|j| format!("{{ let i = i2 + {j}u; leaf = leaf + {term}; }}\n                    "))
        .collect();
    format!(
        r#"var {result} = 0.0;
        for (var i1 = 0u; i1 < {count}; i1 = i1 + BLOCK * BLOCK) {{
            var mid = 0.0;
            for (var i2 = i1; i2 < min(i1 + BLOCK * BLOCK, {count}); i2 = i2 + BLOCK) {{
                var leaf = 0.0;
                if (i2 + BLOCK <= {count}) {{
                    {leaf}
                }} else {{
                    for (var i = i2; i < {count}; i = i + 1u) {{
                        leaf = leaf + {term};
                    }}
                }}
                mid = mid + leaf;
            }}
            {result} = {result} + mid;
        }}"#
    )
}

fn stats(out: &mut String) {
    reduce::reductions(out);
    out.push_str(
        r#"// (mean, 1/std) of a row: the two-pass variance, never E[x²] − E[x]².
fn row_stats(row: u32, tid: u32) -> vec2<f32> {
    var s = 0.0;
    for (var k = tid; k < HIDDEN; k = k + WG) {
        s = s + x[row * HIDDEN + k];
    }
    let mu = wg_reduce_sum(tid, s) / f32(HIDDEN);
    var q = 0.0;
    for (var k = tid; k < HIDDEN; k = k + WG) {
        let dev = x[row * HIDDEN + k] - mu;
        q = fma(dev, dev, q);
    }
    let variance = wg_reduce_sum(tid, q) / f32(HIDDEN);
    return vec2<f32>(mu, inverseSqrt(variance + params.eps));
}

"#,
    );
}

fn forward(out: &mut String, spec: &KernelSpec) {
    out.push_str(
        "// The tile's rows, normalized, scaled and shifted: the Linear's left operand.\n",
    );
    out.push_str("var<workgroup> sh_xn: array<f32, TILE * HIDDEN>;\n\n");
    stats(out);
    let dot = blocked_sum("acc", "HIDDEN", "w[n * HIDDEN + i] * sh_xn[r * HIDDEN + i]");
    let _ = write!(
        out,
        r#"@compute @workgroup_size(WG)
fn {name}(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {{
    let first = wg.x * TILE;
    for (var r = 0u; r < TILE; r = r + 1u) {{
        let row = first + r;
        if (row < dims.rows) {{
            let st = row_stats(row, tid);
            if (tid == 0u && wg.y == 0u) {{
                mean[row] = st.x;
                rstd[row] = st.y;
            }}
            for (var k = tid; k < HIDDEN; k = k + WG) {{
                let xhat = (x[row * HIDDEN + k] - st.x) * st.y;
                sh_xn[r * HIDDEN + k] = fma(xhat, gamma[k], beta[k]);
            }}
        }}
    }}
    workgroupBarrier();
    let rows = min(TILE, dims.rows - first);
    // Workgroup row y of the grid takes outputs y·WG..: one per invocation, its W row
    // read once per tile and used for every row of it.
    let n = wg.y * WG + tid;
    if (n < OUT) {{
        for (var r = 0u; r < rows; r = r + 1u) {{
        {dot}
            y[(first + r) * OUT + n] = acc + b[n];
        }}
    }}
}}
"#,
        name = spec.name
    );
}

/// How a row-sum gradient leaves the tile: `add_<t>` for atomics, a store into the tile's
/// own partial otherwise.
fn flush(spec: &KernelSpec, t: &str, size: &str, index: &str, value: &str) -> String {
    match spec.write_mode(t) {
        Some(WriteMode::AtomicScatter) => format!("add_{t}({index}, {value});"),
        _ => format!("{t}[wg.x * {size} + {index}] = {value};"),
    }
}

fn backward(out: &mut String, spec: &KernelSpec) {
    atomic_adds(out, spec);
    reduce::reductions(out);
    let dyw = blocked_sum("g", "OUT", "w[i * HIDDEN + k] * dy[row * OUT + i]");
    let dw_sum = blocked_sum(
        "acc",
        "rows",
        "dy[(first + i) * OUT + n] * fma((x[(first + i) * HIDDEN + k] - mean[first + i]) * rstd[first + i], gamma[k], beta[k])",
    );
    let db_sum = blocked_sum("acc", "rows", "dy[(first + i) * OUT + n]");
    let dgamma = flush(spec, "dgamma", "HIDDEN", "k", "dgamma_t[j]");
    let dbeta = flush(spec, "dbeta", "HIDDEN", "k", "dbeta_t[j]");
    let dw = flush(spec, "dw", "(OUT * HIDDEN)", "e", "acc");
    let db = flush(spec, "db", "OUT", "n", "acc");
    let _ = write!(
        out,
        r#"@compute @workgroup_size(WG)
fn {name}(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {{
    let first = wg.x * TILE;
    let rows = min(TILE, dims.rows - first);
    if (wg.y > 0u) {{
        // dW = dyᵀ·(x̂·γ + β) over the tile's rows: workgroup row y takes chunk y − 1.
        for (var j = 0u; j < DW_CHUNK / WG; j = j + 1u) {{
            let e = (wg.y - 1u) * DW_CHUNK + j * WG + tid;
            if (e < OUT * HIDDEN) {{
                let n = e / HIDDEN;
                let k = e % HIDDEN;
                {dw_sum}
                {dw}
            }}
        }}
        return;
    }}
    // dγ and dβ of this invocation's features, summed over the tile's rows in leaves of
    // BLOCK rows (as a framework's pairwise sum), each leaf then added to the tile's sum.
    var dgamma_t: array<f32, KPT>;
    var dbeta_t: array<f32, KPT>;
    var dgamma_leaf: array<f32, KPT>;
    var dbeta_leaf: array<f32, KPT>;
    for (var r = 0u; r < rows; r = r + 1u) {{
        let row = first + r;
        let mu = mean[row];
        let rs = rstd[row];
        var xhat: array<f32, KPT>;
        var dxhat: array<f32, KPT>;
        var s_dxhat = 0.0;
        var s_dxhat_xhat = 0.0;
        for (var j = 0u; j < KPT; j = j + 1u) {{
            let k = tid + j * WG;
            if (k < HIDDEN) {{
                // dŷ = Wᵀ·dy, the gradient at the LayerNorm's output.
                {dyw}
                xhat[j] = (x[row * HIDDEN + k] - mu) * rs;
                dxhat[j] = g * gamma[k];
                dgamma_leaf[j] = fma(g, xhat[j], dgamma_leaf[j]);
                dbeta_leaf[j] = dbeta_leaf[j] + g;
                if ((r + 1u) % BLOCK == 0u || r + 1u == rows) {{
                    dgamma_t[j] = dgamma_t[j] + dgamma_leaf[j];
                    dbeta_t[j] = dbeta_t[j] + dbeta_leaf[j];
                    dgamma_leaf[j] = 0.0;
                    dbeta_leaf[j] = 0.0;
                }}
                s_dxhat = s_dxhat + dxhat[j];
                s_dxhat_xhat = fma(dxhat[j], xhat[j], s_dxhat_xhat);
            }}
        }}
        let c2 = wg_reduce_sum(tid, s_dxhat) / f32(HIDDEN);
        let c1 = wg_reduce_sum(tid, s_dxhat_xhat) / f32(HIDDEN);
        for (var j = 0u; j < KPT; j = j + 1u) {{
            let k = tid + j * WG;
            if (k < HIDDEN) {{
                dx[row * HIDDEN + k] = rs * (dxhat[j] - c2 - xhat[j] * c1);
            }}
        }}
    }}
    for (var j = 0u; j < KPT; j = j + 1u) {{
        let k = tid + j * WG;
        if (k < HIDDEN) {{
            {dgamma}
            {dbeta}
        }}
    }}
    // db = Σ dy over the tile's rows.
    for (var n = tid; n < OUT; n = n + WG) {{
        {db_sum}
        {db}
    }}
}}
"#,
        name = spec.name
    );
}

/// The atomic adds the backward's atomic row sums need.
fn atomic_adds(out: &mut String, spec: &KernelSpec) {
    for t in crate::row_layer::ROW_SUMS {
        if spec.write_mode(t) == Some(WriteMode::AtomicScatter) {
            scatter::atomic_add(out, spec, t);
        }
    }
}

fn reduce_partials(out: &mut String, spec: &KernelSpec) {
    let sum = |part: &str, size: &str| {
        blocked_sum("acc", "dims.n_tiles", &format!("{part}[i * {size} + e]"))
    };
    let (dgamma, dbeta) = (sum("dgamma_part", "HIDDEN"), sum("dbeta_part", "HIDDEN"));
    let (dw, db) = (sum("dw_part", "(OUT * HIDDEN)"), sum("db_part", "OUT"));
    let _ = write!(
        out,
        r#"// One invocation per element of dγ | dβ | dW | db, summing its row tiles' partials.
@compute @workgroup_size(WG)
fn {name}(@builtin(global_invocation_id) gid: vec3<u32>) {{
    var e = gid.x;
    if (e < HIDDEN) {{
        {dgamma}
        dgamma[e] = acc;
        return;
    }}
    e = e - HIDDEN;
    if (e < HIDDEN) {{
        {dbeta}
        dbeta[e] = acc;
        return;
    }}
    e = e - HIDDEN;
    if (e < OUT * HIDDEN) {{
        {dw}
        dw[e] = acc;
        return;
    }}
    e = e - OUT * HIDDEN;
    if (e < OUT) {{
        {db}
        db[e] = acc;
    }}
}}
"#,
        name = spec.name
    );
}
