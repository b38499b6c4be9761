//! The flash forward: a workgroup owns a tile of query rows, stages K and V a block of keys
//! at a time in workgroup memory with coalesced vec4 loads, and each invocation keeps its
//! scores and output rows in registers (named, fully unrolled, so that no driver has to
//! guess whether a private array may live in registers). The softmax runs online per row.
//!
//! Key blocks wholly outside every row's visible range are never visited (causal blocks
//! above the diagonal, blocks before the document start); blocks that some row of the tile
//! sees only in part are masked element by element.

use std::fmt::Write;

use crate::spec::KernelSpec;
use crate::tiling::Tiling;

/// One generated register name per (row, column) of an invocation's block.
pub(super) fn regs(rows: u32, cols: u32) -> impl Iterator<Item = (u32, u32)> {
    (0..rows).flat_map(move |i| (0..cols).map(move |n| (i, n)))
}

/// `acc + a·b` as four fmas in component order (one rounding each, a fixed order).
pub(super) fn fma_chain(acc: &str, a: &str, b: &str) -> String {
    ["x", "y", "z", "w"].iter().fold(acc.to_string(), |acc, c| {
        format!("fma({a}.{c}, {b}.{c}, {acc})")
    })
}

pub(super) fn constants(out: &mut String, t: &Tiling) {
    let _ = write!(
        out,
        "// Flash tiling: BR query rows per workgroup, BC keys per staged block; row groups of\n\
         // TX invocations, TM rows each.\n\
         const BR: u32 = {}u;\nconst BC: u32 = {}u;\nconst TM: u32 = {}u;\nconst TX: u32 = {}u;\n\
         const D4: u32 = {}u;\n\
         // Padded strides: a vec4 per staged row and a float per P row spread rows over banks.\n\
         const ROW4: u32 = {}u;\nconst PSTRIDE: u32 = {}u;\n\n",
        t.br,
        t.bc,
        t.tm,
        t.tx,
        t.d4,
        t.row4,
        t.bc + 1
    );
}

pub(super) fn workgroup_memory(out: &mut String, t: &Tiling) {
    let _ = write!(
        out,
        r#"var<workgroup> sh_q: array<vec4<f32>, {q}>;
// K, then V, of the current key block.
var<workgroup> sh_kv: array<vec4<f32>, {kv}>;
var<workgroup> sh_p: array<f32, {p}>;
// One slot per (row, invocation of its group) for the row reductions.
var<workgroup> sh_red: array<f32, {red}>;
// The tile's keys: x..y holds every visible key; z..w is visible to every row.
var<workgroup> sh_range: vec4<u32>;

"#,
        q = t.br * t.row4,
        kv = t.bc * t.row4,
        p = t.br * (t.bc + 1),
        red = t.br * t.tx,
    );
}

/// Staging loops, the tile's key range and the row reductions of the forward.
pub(super) fn helpers(out: &mut String, spec: &KernelSpec) {
    stage(out, "stage_q", "BR", "q_index(r, h)", "sh_q", "q");
    stage(out, "stage_k", "BC", "kv_index(r, h)", "sh_kv", "key_at");
    stage(out, "stage_v", "BC", "kv_index(r, h)", "sh_kv", "value_at");
    tile_key_range(out, spec);
    out.push_str(ROW_REDUCTIONS);
}

/// `tile_key_range(row0)`: x..y holds every key a row of the tile sees, z..w the keys every
/// row of it sees (empty when that is not known without testing each key).
pub(super) fn tile_key_range(out: &mut String, spec: &KernelSpec) {
    // Without causal, the document mask cuts keys past the document's end element by
    // element (key_visible), so no block is known to be visible to every row.
    let all_visible = if spec.masks.document && !spec.masks.causal {
        "vec2<u32>(0xffffffffu, 0u)"
    } else {
        "vec2<u32>(last.x, first.y)"
    };
    let _ = write!(
        out,
        r#"// key_range is monotone in the row (document starts never decrease, causal ends grow),
// so the first and last rows of the tile bound every row's range.
fn tile_key_range(row0: u32) -> vec4<u32> {{
    let first = key_range(row0);
    let last = key_range(min(row0 + BR, dims.seq_len) - 1u);
    return vec4<u32>(vec2<u32>(first.x, last.y), {all_visible});
}}

"#
    );
}

const ROW_REDUCTIONS: &str = r#"fn row_max(r: u32) -> f32 {
    var x = sh_red[r * TX];
    for (var i = 1u; i < TX; i = i + 1u) {
        x = max(x, sh_red[r * TX + i]);
    }
    return x;
}

fn row_sum(r: u32) -> f32 {
    var x = sh_red[r * TX];
    for (var i = 1u; i < TX; i = i + 1u) {
        x = x + sh_red[r * TX + i];
    }
    return x;
}

"#;

/// `name(r0, h, tid)`: `rows` rows from r0 (zeros past the sequence) into `dst`, one vec4 per
/// invocation per step, consecutive invocations on consecutive addresses.
pub(super) fn stage(out: &mut String, name: &str, rows: &str, index: &str, dst: &str, src: &str) {
    let read = |k: u32| {
        if src.ends_with("_at") {
            format!("{src}(i + {k}u)")
        } else {
            format!("{src}[i + {k}u]")
        }
    };
    let _ = write!(
        out,
        r#"fn {name}(r0: u32, h: u32, tid: u32) {{
    for (var e = tid; e < {rows} * D4; e = e + WG) {{
        let r = r0 + e / D4;
        let c4 = e % D4;
        var x = vec4<f32>(0.0);
        if (r < dims.seq_len) {{
            let i = {index} + c4 * 4u;
            x = vec4<f32>({}, {}, {}, {});
        }}
        {dst}[(e / D4) * ROW4 + c4] = x;
    }}
}}

"#,
        read(0),
        read(1),
        read(2),
        read(3)
    );
}

pub(super) fn forward_body(out: &mut String, t: &Tiling) {
    let (tm, tn, dn) = (t.tm, t.tn, t.dn);
    let mut b = String::new();
    b.push_str(
        "fn flash_forward(tile: u32, h: u32, tid: u32) {\n    let kv_h = kv_head(h);\n    \
         let g = tid / TX;\n    let tx = tid % TX;\n    let row0 = tile * BR;\n    \
         if (tid == 0u) {\n        sh_range = tile_key_range(row0);\n    }\n    \
         stage_q(row0, h, tid);\n",
    );
    for i in 0..tm {
        let _ = write!(
            b,
            "    let row_{i} = row0 + g * TM + {i}u;\n    var lo_{i} = 0u;\n    var hi_{i} = 0u;\n    \
             if (row_{i} < dims.seq_len) {{\n        let range = key_range(row_{i});\n        \
             lo_{i} = range.x;\n        hi_{i} = range.y;\n    }}\n    var m_{i} = NEG_BIG;\n    \
             var l_{i} = 0.0;\n"
        );
        for n in 0..dn {
            let _ = writeln!(b, "    var acc_{i}_{n} = vec4<f32>(0.0);");
        }
    }
    b.push_str(
        "    let range = workgroupUniformLoad(&sh_range);\n    \
         for (var kt = range.x / BC; kt < (range.y + BC - 1u) / BC; kt = kt + 1u) {\n        \
         let j0 = kt * BC;\n        \
         // The previous block is done with sh_kv, sh_p and sh_red.\n        \
         workgroupBarrier();\n        stage_k(j0, kv_h, tid);\n        workgroupBarrier();\n",
    );
    scores(&mut b, tm, tn);
    softmax(&mut b, tm, tn, dn);
    b.push_str("        stage_v(j0, kv_h, tid);\n        workgroupBarrier();\n");
    b.push_str(
        "        // A block every row sees in full has p == 0 only by underflow, so it needs no\n        \
         // guard; elsewhere masked keys must not multiply V (0 · inf is NaN).\n        \
         if (range.z <= j0 && j0 + BC <= range.w) {\n",
    );
    accumulate(&mut b, tm, dn, &[("acc", "sh_p", "sh_kv")], false);
    b.push_str("        } else {\n");
    accumulate(&mut b, tm, dn, &[("acc", "sh_p", "sh_kv")], true);
    b.push_str("        }\n    }\n");
    finish(&mut b, tm, dn);
    out.push_str(&b);
}

/// S = Q·Kᵀ for the invocation's block, then the mask and the scale.
fn scores(b: &mut String, tm: u32, tn: u32) {
    for (i, n) in regs(tm, tn) {
        let _ = writeln!(b, "        var s_{i}_{n} = 0.0;");
    }
    b.push_str("        for (var d4 = 0u; d4 < D4; d4 = d4 + 1u) {\n");
    for i in 0..tm {
        let _ = writeln!(
            b,
            "            let q_{i} = sh_q[(g * TM + {i}u) * ROW4 + d4];"
        );
    }
    for n in 0..tn {
        let _ = writeln!(
            b,
            "            let k_{n} = sh_kv[(tx + {n}u * TX) * ROW4 + d4];"
        );
    }
    for (i, n) in regs(tm, tn) {
        let chain = fma_chain(&format!("s_{i}_{n}"), &format!("q_{i}"), &format!("k_{n}"));
        let _ = writeln!(b, "            s_{i}_{n} = {chain};");
    }
    b.push_str("        }\n");
    for n in 0..tn {
        let _ = writeln!(b, "        let j_{n} = j0 + tx + {n}u * TX;");
    }
    for (i, n) in regs(tm, tn) {
        let _ = writeln!(
            b,
            "        let v_{i}_{n} = j_{n} >= lo_{i} && j_{n} < hi_{i} && key_visible(row_{i}, j_{n});\n        \
             s_{i}_{n} = select(NEG_BIG, s_{i}_{n} * params.scale, v_{i}_{n});"
        );
    }
}

/// The online-softmax step: row maxes across the group, P, the rescale of l and O.
fn softmax(b: &mut String, tm: u32, tn: u32, dn: u32) {
    for i in 0..tm {
        let row_max = (1..tn).fold(format!("s_{i}_0"), |acc, n| {
            format!("max({acc}, s_{i}_{n})")
        });
        let _ = writeln!(b, "        sh_red[(g * TM + {i}u) * TX + tx] = {row_max};");
    }
    b.push_str("        workgroupBarrier();\n");
    for i in 0..tm {
        let _ = writeln!(
            b,
            "        let mn_{i} = max(m_{i}, row_max(g * TM + {i}u));\n        \
             let c_{i} = exp(m_{i} - mn_{i});\n        m_{i} = mn_{i};"
        );
        let mut sum = String::new();
        for n in 0..tn {
            let _ = writeln!(
                b,
                "        let p_{i}_{n} = select(0.0, exp(s_{i}_{n} - mn_{i}), v_{i}_{n});\n        \
                 sh_p[(g * TM + {i}u) * PSTRIDE + tx + {n}u * TX] = p_{i}_{n};"
            );
            sum += &format!(" + p_{i}_{n}");
        }
        // Each invocation keeps its share of l; the shares are summed once, at the end.
        let _ = writeln!(b, "        l_{i} = l_{i} * c_{i}{sum};");
        for n in 0..dn {
            let _ = writeln!(b, "        acc_{i}_{n} = acc_{i}_{n} * c_{i};");
        }
    }
}

/// `acc += w · rows` over the staged block, for each (acc, weights, rows) triple: the
/// weights are the invocation's own rows of a P-shaped tile, the rows head_dim-wide.
/// Guarded, a zero weight skips the update (a masked entry must not multiply inf).
pub(super) fn accumulate(
    b: &mut String,
    tm: u32,
    dn: u32,
    triples: &[(&str, &str, &str)],
    guarded: bool,
) {
    b.push_str("            for (var c = 0u; c < BC; c = c + 1u) {\n");
    for (acc, w, rows) in triples {
        for n in 0..dn {
            let _ = writeln!(
                b,
                "                let {acc}r_{n} = {rows}[c * ROW4 + tx + {n}u * TX];"
            );
        }
        for i in 0..tm {
            let _ = writeln!(
                b,
                "                let {acc}w_{i} = {w}[(g * TM + {i}u) * PSTRIDE + c];"
            );
            let update: Vec<String> = (0..dn)
                .map(|n| {
                    format!(
                        "{acc}_{i}_{n} = fma(vec4<f32>({acc}w_{i}), {acc}r_{n}, {acc}_{i}_{n});"
                    )
                })
                .collect();
            if guarded {
                let _ = writeln!(
                    b,
                    "                if ({acc}w_{i} != 0.0) {{\n                    {}\n                }}",
                    update.join("\n                    ")
                );
            } else {
                let _ = writeln!(b, "                {}", update.join("\n                "));
            }
        }
    }
    b.push_str("            }\n");
}

/// Sums each row's shares of l, then stores O = acc / l and the LSE.
fn finish(b: &mut String, tm: u32, dn: u32) {
    b.push_str("    workgroupBarrier();\n");
    for i in 0..tm {
        let _ = writeln!(b, "    sh_red[(g * TM + {i}u) * TX + tx] = l_{i};");
    }
    b.push_str("    workgroupBarrier();\n");
    for i in 0..tm {
        let _ = write!(
            b,
            "    let lt_{i} = row_sum(g * TM + {i}u);\n    if (row_{i} < dims.seq_len) {{\n        \
             var inv = 0.0;\n        if (lt_{i} != 0.0) {{\n            inv = 1.0 / lt_{i};\n        }}\n        \
             let base = q_index(row_{i}, h);\n"
        );
        for n in 0..dn {
            let _ = write!(
                b,
                "        let o_{n} = acc_{i}_{n} * inv;\n        let at_{n} = base + (tx + {n}u * TX) * 4u;\n        \
                 store_out(at_{n}, o_{n}.x);\n        store_out(at_{n} + 1u, o_{n}.y);\n        \
                 store_out(at_{n} + 2u, o_{n}.z);\n        store_out(at_{n} + 3u, o_{n}.w);\n"
            );
        }
        let _ = write!(
            b,
            "        if (tx == 0u) {{\n            store_lse(row_{i}, h, m_{i}, lt_{i});\n        }}\n    }}\n"
        );
    }
    b.push_str("}\n\n");
}

pub(super) fn entry(out: &mut String, name: &str) {
    let _ = write!(
        out,
        r#"@compute @workgroup_size(WG)
fn {name}(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {{
    flash_forward(wg.x, wg.y, tid);
}}
"#
    );
}
