//! The bench's unfused baseline: the same work as the fused kernels, done as a framework
//! without fusion does it, one kernel per op: a LayerNorm kernel writing x̂ₙ = x̂·γ + β to
//! memory, then a tiled matmul (+ bias); the backward as dx̂ₙ = dy·W and dW = dyᵀ·x̂ₙ
//! matmuls, a LayerNorm backward kernel, and the column sums (db, dβ, dγ) as 1ᵀ·A matmuls.
//!
//! BASELINE ONLY: this is hand-written WGSL, the one exception to "the runtime never
//! writes WGSL": it is the thing the generated kernels are measured against, so it must
//! not come from the generator under test. The matmul uses the fused kernels' tiling
//! (64×64 outputs per workgroup, 16-deep slices, 4×4 per invocation) so that the
//! comparison measures the fusion, not a weaker GEMM.

use std::borrow::Cow;

use attn_dsl::plan::{Access, Binding, KernelAbi, Scalar};

use crate::device::Gpu;
use crate::dispatch::kernel::Kernel;
use crate::error::Error;

/// The shape uniform every baseline kernel binds: C[m, n] = Σ_k A[m·sam + k·sak] ·
/// `B[k·sbk + n·sbn]` (+ `bias[n]` when `bias` ≠ 0); the LayerNorm kernels read m (rows) and
/// k (hidden).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Shape {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub sam: u32,
    pub sak: u32,
    pub sbk: u32,
    pub sbn: u32,
    pub bias: u32,
}

const SHAPE: &str = "struct Shape {\n    m: u32,\n    n: u32,\n    k: u32,\n    sam: u32,\n    \
                     sak: u32,\n    sbk: u32,\n    sbn: u32,\n    bias: u32,\n}\n";
const SHAPE_FIELDS: [&str; 8] = ["m", "n", "k", "sam", "sak", "sbk", "sbn", "bias"];

/// The workgroup tree sum of the LayerNorm kernels (one workgroup of 256 per row).
const SUM256: &str = r#"
var<workgroup> red: array<f32, 256>;

fn sum256(tid: u32, v: f32) -> f32 {
    red[tid] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (tid < s) {
            red[tid] = red[tid] + red[tid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}
"#;

const LN_FORWARD: &str = r#"
@compute @workgroup_size(256)
fn ln_forward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let row = wg.x;
    let h = shape.k;
    var s = 0.0;
    for (var k = tid; k < h; k = k + 256u) {
        s = s + x[row * h + k];
    }
    let mu = sum256(tid, s) / f32(h);
    var q = 0.0;
    for (var k = tid; k < h; k = k + 256u) {
        let d = x[row * h + k] - mu;
        q = fma(d, d, q);
    }
    let rs = inverseSqrt(sum256(tid, q) / f32(h) + 1e-5);
    if (tid == 0u) {
        mean[row] = mu;
        rstd[row] = rs;
    }
    for (var k = tid; k < h; k = k + 256u) {
        xn[row * h + k] = fma((x[row * h + k] - mu) * rs, gamma[k], beta[k]);
    }
}
"#;

const LN_BACKWARD: &str = r#"
// dx from dx̂ₙ (the matmul's gradient), and t = dx̂ₙ·x̂, whose column sum is dγ.
@compute @workgroup_size(256)
fn ln_backward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let row = wg.x;
    let h = shape.k;
    let mu = mean[row];
    let rs = rstd[row];
    var s1 = 0.0;
    var s2 = 0.0;
    for (var k = tid; k < h; k = k + 256u) {
        let dxhat = dxn[row * h + k] * gamma[k];
        s1 = s1 + dxhat;
        s2 = fma(dxhat, (x[row * h + k] - mu) * rs, s2);
    }
    let c2 = sum256(tid, s1) / f32(h);
    let c1 = sum256(tid, s2) / f32(h);
    for (var k = tid; k < h; k = k + 256u) {
        let g = dxn[row * h + k];
        let xhat = (x[row * h + k] - mu) * rs;
        dx[row * h + k] = rs * (g * gamma[k] - c2 - xhat * c1);
        t[row * h + k] = g * xhat;
    }
}
"#;

const MATMUL: &str = r#"
var<workgroup> sa: array<vec4<f32>, 256>;
var<workgroup> sb: array<vec4<f32>, 256>;

@compute @workgroup_size(256)
fn matmul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let tx = tid % 16u;
    let ty = tid / 16u;
    let m0 = wg.x * 64u;
    let n0 = wg.y * 64u;
    var acc: array<vec4<f32>, 4>;
    for (var k0 = 0u; k0 < shape.k; k0 = k0 + 16u) {
        for (var q = 0u; q < 4u; q = q + 1u) {
            let e = tid + q * 256u;
            // Neighbouring invocations read neighbouring addresses of either layout.
            var m = e % 64u;
            var kk = e / 64u;
            if (shape.sak == 1u) {
                m = e / 16u;
                kk = e % 16u;
            }
            var av = 0.0;
            if (m0 + m < shape.m && k0 + kk < shape.k) {
                av = a[(m0 + m) * shape.sam + (k0 + kk) * shape.sak];
            }
            sa[kk * 16u + m / 4u][m % 4u] = av;
            var r = e / 64u;
            var c = e % 64u;
            if (shape.sbn != 1u) {
                r = e % 16u;
                c = e / 16u;
            }
            var bv = 0.0;
            if (k0 + r < shape.k && n0 + c < shape.n) {
                bv = b[(k0 + r) * shape.sbk + (n0 + c) * shape.sbn];
            }
            sb[r * 16u + c / 4u][c % 4u] = bv;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < 16u; kk = kk + 1u) {
            let av = sa[kk * 16u + ty];
            let bv = sb[kk * 16u + tx];
            acc[0] = fma(vec4<f32>(av.x), bv, acc[0]);
            acc[1] = fma(vec4<f32>(av.y), bv, acc[1]);
            acc[2] = fma(vec4<f32>(av.z), bv, acc[2]);
            acc[3] = fma(vec4<f32>(av.w), bv, acc[3]);
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i = i + 1u) {
        let m = m0 + ty * 4u + i;
        for (var j = 0u; j < 4u; j = j + 1u) {
            let n = n0 + tx * 4u + j;
            if (m < shape.m && n < shape.n) {
                var v = acc[i][j];
                if (shape.bias != 0u) {
                    v = v + bias[n];
                }
                c[m * shape.n + n] = v;
            }
        }
    }
}
"#;

/// The three baseline kernels.
pub struct Baseline {
    pub ln_forward: Kernel,
    pub ln_backward: Kernel,
    pub matmul: Kernel,
}

impl Baseline {
    /// Compiles the kernels, their ABI modelled on `like` (a compiled row kernel: the
    /// same target, no features).
    pub fn new(gpu: &Gpu, like: &KernelAbi) -> Result<Baseline, Error> {
        let (r, w) = (Access::Read, Access::ReadWrite);
        let forward = [
            ("x", r),
            ("gamma", r),
            ("beta", r),
            ("xn", w),
            ("mean", w),
            ("rstd", w),
        ];
        let backward = [
            ("x", r),
            ("gamma", r),
            ("dxn", r),
            ("mean", r),
            ("rstd", r),
            ("dx", w),
            ("t", w),
        ];
        let matmul = [("a", r), ("b", r), ("bias", r), ("c", w)];
        let kernel = |name: &'static str, body: &str, bindings: &[(&'static str, Access)]| {
            Kernel::now(gpu, &abi(like, name, body, bindings))
        };
        Ok(Baseline {
            ln_forward: kernel("ln_forward", &format!("{SUM256}{LN_FORWARD}"), &forward)?,
            ln_backward: kernel("ln_backward", &format!("{SUM256}{LN_BACKWARD}"), &backward)?,
            matmul: kernel("matmul", MATMUL, &matmul)?,
        })
    }
}

/// The grid of a matmul of `shape`.
pub fn matmul_grid(shape: &Shape) -> [u32; 3] {
    [shape.m.div_ceil(64), shape.n.div_ceil(64), 1]
}

/// A KernelAbi for hand-written `body`: its storage bindings in order, then `shape`.
fn abi(
    like: &KernelAbi,
    name: &'static str,
    body: &str,
    storage: &[(&'static str, Access)],
) -> KernelAbi {
    let mut wgsl = String::from(SHAPE);
    let mut bindings = Vec::new();
    for (i, (n, access)) in storage.iter().enumerate() {
        let mode = if *access == Access::Read {
            "read"
        } else {
            "read_write"
        };
        wgsl.push_str(&format!(
            "@group(0) @binding({i}) var<storage, {mode}> {n}: array<f32>;\n"
        ));
        bindings.push(binding(i as u32, n, *access, "array<f32>", &[]));
    }
    let at = storage.len();
    wgsl.push_str(&format!(
        "@group(0) @binding({at}) var<uniform> shape: Shape;\n"
    ));
    bindings.push(binding(
        at as u32,
        "shape",
        Access::Uniform,
        "Shape",
        &SHAPE_FIELDS,
    ));
    wgsl.push_str(body);
    KernelAbi {
        name: Cow::Borrowed(name),
        entry_point: Cow::Borrowed(name),
        workgroup_size: [256, 1, 1],
        f32_atomics: false,
        workgroup_storage_bytes: 2048,
        bindings: Cow::Owned(bindings),
        wgsl: Cow::Owned(wgsl),
        ..like.clone()
    }
}

fn binding(
    at: u32,
    name: &'static str,
    access: Access,
    ty: &'static str,
    fields: &[&'static str],
) -> Binding {
    Binding {
        group: 0,
        binding: at,
        name: Cow::Borrowed(name),
        access,
        scalar: if access == Access::Uniform {
            Scalar::U32
        } else {
            Scalar::F32
        },
        wgsl_type: Cow::Borrowed(ty),
        fields: fields.iter().map(|f| Cow::Borrowed(*f)).collect(),
        layout: Cow::Borrowed(&[]),
        write: None,
    }
}
