//! The WGSL emitter. A kernel is assembled from sections: specialization constants,
//! binding declarations (read off the plan), workgroup memory, reductions, the op's index
//! helpers, and a schedule body shared by every op that runs it.

mod attend;
mod backward;
mod block_mask;
mod cache;
pub mod coop;
mod coop_backward;
mod coop_scale;
mod decode_split;
mod decode_stream;
mod dtype;
mod extend;
mod flash;
mod flash_backward;
pub mod flex;
mod grid_order;
mod index;
mod lanes;
mod layernorm;
mod linear_rows;
mod matmul;
mod merge;
mod numerics;
mod reduce;
mod residency;
mod rope;
mod row_gemm;
mod scatter;
pub(crate) mod scores;
mod served;
mod sinks;
mod states;
mod tiles;
mod writer;

pub use crate::layout::MAX_STRIDE_WORKGROUPS;
pub use crate::layout::decode::{
    MAX_SPLIT_HEADS, key_tile as split_key_tile, max_slice as split_max_slice,
};
pub use crate::layout::workgroup_bytes;

use writer::{Fragment, Template, Wgsl, lines, uint};

use crate::layout::tiling::Tiling;
use crate::plan::{Access, Binding};
use crate::signature;
use crate::spec::{KernelSpec, Op};

/// WGSL source for `spec`, declaring exactly `bindings`.
pub fn emit(spec: &KernelSpec, bindings: &[Binding]) -> String {
    emit_phases(spec, bindings, coop::Phases::ALL)
}

/// [`emit`], with a tensor-core kernel's block loop running only the phases in `keep` (its
/// barriers stay): the instrument behind the phase model in docs/performance.md. Every
/// other kernel ignores `keep`.
pub fn emit_phases(spec: &KernelSpec, bindings: &[Binding], keep: coop::Phases) -> String {
    let mut head = Wgsl::new();
    header(&mut head, spec);
    if spec.op == Op::LinearRows {
        linear_rows::constants(&mut head, spec);
    } else if spec.op.is_row_layer() {
        layernorm::constants(&mut head, spec);
    } else if matches!(spec.op, Op::DecodeSplit | Op::DecodeReduce) {
        decode_split::constants(&mut head, spec);
    } else if spec.op == Op::CacheAppend {
        cache::constants(&mut head, spec);
    } else if spec.op == Op::Matmul {
        matmul::constants(&mut head, spec);
    } else if spec.op == Op::Merge {
        merge::constants(&mut head, spec);
    } else if spec.op == Op::BlockMask {
        block_mask::constants(&mut head, spec);
    } else if matches!(
        spec.op,
        Op::DkvReduce | Op::ToDtype | Op::FromDtype | Op::GradFold | Op::RowScale
    ) {
        lanes::constants(&mut head, spec);
    } else {
        constants(&mut head, spec);
    }
    uniform_structs(&mut head, spec, bindings);
    declarations(&mut head, spec, bindings);
    let mut body = Wgsl::new();
    emit_body(&mut body, spec, keep);
    let (mut out, head_needs) = head.into_parts();
    let (body, body_needs) = body.into_parts();
    out.push_str(&numerics::helpers(head_needs.union(body_needs), spec.op));
    out.push_str(&body);
    out
}

/// The names of the numerics helpers, which a kernel defines only where it calls them.
pub fn helper_names() -> impl Iterator<Item = &'static str> {
    numerics::Helper::ALL.into_iter().map(|h| h.name())
}

/// Everything after the declarations and the numerics helpers: the op's helpers and its
/// schedule.
fn emit_body(out: &mut Wgsl, spec: &KernelSpec, keep: coop::Phases) {
    if let Some(t) = coop::CoopTiling::of(spec) {
        if spec.op.is_forward() {
            attend::forward_helpers(out, spec);
            coop::kernel(out, spec, &t, keep);
        } else {
            coop_backward::kernel(out, spec, &t, keep);
        }
        return;
    }
    if let Some(Ok(t)) = Tiling::of(spec) {
        emit_flash(out, spec, &t);
        return;
    }
    match spec.op {
        // Checked: a continued cache runs the flash schedule.
        Op::Forward | Op::Extend | Op::Decode => {
            attend::workgroup_memory(out);
            reduce::reductions(out);
            if spec.op == Op::Forward {
                attend::forward_helpers(out, spec);
            } else {
                attend::decode_helpers(out, spec);
            }
            attend::attend_row(out, spec);
        }
        Op::BackwardPrep => backward::backward_prep(out, spec),
        Op::BackwardQ => backward::backward_q(out, spec),
        Op::BackwardKv => backward::backward_kv(out, spec),
        Op::Rope | Op::RopeBackward => rope::rope(out, spec),
        Op::DecodeSplit | Op::DecodeReduce => {
            decode_split::body(out, spec, keep);
            return;
        }
        Op::LayernormLinear
        | Op::LayernormLinearBackward
        | Op::LayernormLinearWeightGrad
        | Op::LayernormLinearReduce
        | Op::LayernormRows
        | Op::LayernormGradRows
        | Op::LayernormRowsBackward => {
            layernorm::body(out, spec);
            return;
        }
        Op::Matmul => {
            matmul::body(out, spec);
            return;
        }
        Op::LinearRows => {
            linear_rows::body(out, spec);
            return;
        }
        Op::CacheAppend => {
            cache::append(out, spec);
            return;
        }
        Op::DkvReduce => {
            lanes::reduce(out, spec);
            return;
        }
        Op::ToDtype | Op::FromDtype => {
            lanes::convert(out, spec, spec.op == Op::ToDtype);
            return;
        }
        Op::SinkGrad => {
            sinks::grad(out, spec);
            return;
        }
        Op::GradFold => {
            lanes::fold(out, spec);
            return;
        }
        Op::RowScale => {
            lanes::row_scale(out, spec);
            return;
        }
        Op::Merge => {
            merge::body(out, spec);
            return;
        }
        Op::BlockMask => {
            block_mask::body(out, spec);
            return;
        }
    }
    match spec.op {
        Op::Forward | Op::Extend => tile_entry(out, spec, "attend_row"),
        Op::Decode => attend::decode_entry(out, &spec.name),
        Op::BackwardPrep => tile_entry(out, spec, "prep_row"),
        Op::BackwardQ => tile_entry(out, spec, "backward_row"),
        Op::BackwardKv => tile_entry(out, spec, "backward_col"),
        Op::Rope | Op::RopeBackward => tile_entry(out, spec, "rope_row"),
        // These bodies carry their own entry points.
        Op::DecodeSplit
        | Op::DecodeReduce
        | Op::LayernormLinear
        | Op::LayernormLinearBackward
        | Op::LayernormLinearWeightGrad
        | Op::LayernormLinearReduce
        | Op::CacheAppend
        | Op::DkvReduce
        | Op::ToDtype
        | Op::FromDtype
        | Op::SinkGrad
        | Op::GradFold
        | Op::RowScale
        | Op::LayernormRows
        | Op::LayernormGradRows
        | Op::LayernormRowsBackward
        | Op::Matmul
        | Op::LinearRows
        | Op::Merge
        | Op::BlockMask => {}
    }
}

/// The flash schedule of a checked spec.
fn emit_flash(out: &mut Wgsl, spec: &KernelSpec, t: &Tiling) {
    match spec.op {
        Op::BackwardQ => flash_backward::backward_q(out, spec, t),
        Op::BackwardKv => flash_backward::backward_kv(out, spec, t),
        _ => {
            flash::constants(out, t);
            flash::workgroup_memory(out, t);
            attend::forward_helpers(out, spec);
            flash::helpers(out, spec, t);
            flash::forward_body(out, spec, t);
            flash::entry(out, spec, t, "flash_forward");
        }
    }
}

/// The entry of a tiled grid: workgroup (x, y, z) takes rows x·TILE.. of the walked axis,
/// for head (or KV head) y of sequence z, one row at a time.
fn tile_entry(out: &mut Wgsl, spec: &KernelSpec, row_fn: &str) {
    out.put(TILE_ENTRY.fill([
        ("name", Fragment::from(spec.name.as_str())),
        ("row_fn", Fragment::from(row_fn)),
        ("flush", flex::flush_call(spec)),
    ]));
}

/// The tiled grid's entry: each of the workgroup's rows in turn, a barrier between them,
/// then the modifiers' gradients flushed where the kernel writes them.
const TILE_ENTRY: Template = Template {
    name: "tile_entry",
    needs: &[],
    text: r#"@compute @workgroup_size(WG)
fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    batch = wg.z;
    for (var r = 0u; r < TILE; r = r + 1u) {
        let row = wg.x * TILE + r;
        if (row < dims.seq_len) {
            $row_fn(row, wg.y, tid);
        }
        // The next row reuses the workgroup memory.
        workgroupBarrier();
    }
    $flush
}
"#,
};

fn header(out: &mut Wgsl, spec: &KernelSpec) {
    let masks = match (spec.masks.causal, spec.masks.document) {
        (true, true) => "causal + document",
        (true, false) => "causal",
        (false, true) => "document",
        (false, false) => "none",
    };
    let dims = match spec.split_dims() {
        true => format!("{} (v {})", spec.head_dim, spec.v_dim()),
        false => spec.head_dim.to_string(),
    };
    out.put(HEADER.fill([
        ("name", Fragment::from(spec.name.as_str())),
        ("op", Fragment::from(spec.op.name())),
        ("major", Fragment::from(spec.grid.major.name())),
        ("tile", Fragment::from(spec.grid.tile.to_string())),
        ("dims", Fragment::from(dims)),
        ("masks", Fragment::from(masks)),
    ]));
    dtype::directive(out, spec);
    if spec.grid.uses_coop() {
        coop::directive(out);
    }
}

/// The kernel's first lines: what it is, and where it came from.
const HEADER: Template = Template {
    name: "header",
    needs: &[],
    text: r#"// $name: op $op, $major tile $tile, head_dim $dims, masks $masks.
// Generated by attn-dsl from an attention_kernel! description. Do not edit.

"#,
};

fn constants(out: &mut Wgsl, spec: &KernelSpec) {
    let split = match spec.split_dims() {
        true => SPLIT_DIMS.fill([
            ("qk_dim", uint(spec.head_dim)),
            ("v_dim", uint(spec.v_dim())),
        ]),
        false => Fragment::default(),
    };
    let k_par = match spec.grid.flash {
        None => K_PAR.plain(),
        Some(_) => Fragment::default(),
    };
    out.put(CONSTANTS.fill([
        ("wg", uint(spec.workgroup_size)),
        ("head_dim", uint(spec.width())),
        ("split", split),
        ("tile", uint(spec.grid.tile)),
        ("k_par", k_par),
    ]));
}

/// The attention kernels' sizes: the workgroup, the row width they work at, the rows of
/// Q and K and of V and O where those differ, and the rows a workgroup takes.
const CONSTANTS: Template = Template {
    name: "constants",
    needs: &[],
    text: r#"const WG: u32 = $wg;
const HEAD_DIM: u32 = $head_dim;
$split
const TILE: u32 = $tile;
$k_par
// A finite stand-in for -inf: exp(NEG_BIG - m) is 0 for any real m, and
// NEG_BIG - NEG_BIG is 0, never NaN.
const NEG_BIG: f32 = -3.0e38;

"#,
};

/// The two row widths where Q and K's differ from V and O's.
const SPLIT_DIMS: Template = Template {
    name: "split_dims",
    needs: &[],
    text: r#"// Q and K rows, V and O rows: the narrower reads as zeros to HEAD_DIM.
const QK_DIM: u32 = $qk_dim;
const V_DIM: u32 = $v_dim;
"#,
};

/// The per-row schedule's split of P·V over the workgroup.
const K_PAR: Template = Template {
    name: "k_par",
    needs: &[],
    text: r#"// Invocations per output element in the P·V product, and the key chunk each takes.
const K_PAR: u32 = WG / HEAD_DIM;
const N_ACTIVE: u32 = HEAD_DIM * K_PAR;
const CHUNK: u32 = (WG + K_PAR - 1u) / K_PAR;
"#,
};

fn uniform_structs(out: &mut Wgsl, spec: &KernelSpec, bindings: &[Binding]) {
    for b in bindings.iter().filter(|b| b.access == Access::Uniform) {
        let block = signature::uniform_block(spec.op, &b.name).expect("uniform has a block");
        let fields = block
            .fields
            .iter()
            .map(|f| format!("{f}: {},", b.scalar.wgsl()));
        out.put(UNIFORM_STRUCT.fill([
            ("name", Fragment::from(block.struct_name)),
            ("fields", lines(fields)),
        ]));
    }
}

/// A uniform binding's struct, one field a line.
const UNIFORM_STRUCT: Template = Template {
    name: "uniform_struct",
    needs: &[],
    text: r#"struct $name {
    $fields
}

"#,
};

fn declarations(out: &mut Wgsl, spec: &KernelSpec, bindings: &[Binding]) {
    let bindings = bindings.iter().map(|b| {
        let space = match b.access {
            Access::Read => "storage, read",
            Access::ReadWrite => "storage, read_write",
            Access::Uniform => "uniform",
        };
        format!(
            "@group({}) @binding({}){} var<{space}> {}: {};",
            b.group,
            b.binding,
            coherence(spec, &b.name),
            b.name,
            b.wgsl_type
        )
    });
    out.put(DECLARATIONS.fill([("bindings", lines(bindings))]));
}

/// ` @coherent` (naga's SPIR-V `Coherent`) on the partials of a split pass that combines
/// its slices: the last workgroup of a group reads records other workgroups wrote in the
/// same dispatch, and without it (SPIR-V's GLSL450 memory model, where only coherent
/// memory is promised visible across workgroups) an H200 read one slice's record stale
/// (f32 at head_dims 32, 96 and 256, 10 slices of 32 keys, one seed in three, 2026-11-30).
/// Never under `target: webgpu`, which refuses the combining pass.
fn coherence(spec: &KernelSpec, binding: &str) -> &'static str {
    match spec.combines_slices() && binding == "partials" {
        true => " @coherent",
        false => "",
    }
}

/// The sequence every kernel indexes by, and the plan's bindings, one a line.
const DECLARATIONS: Template = Template {
    name: "declarations",
    needs: &[],
    text: r#"// The sequence of the batch this workgroup works on, set by the entry point.
var<private> batch: u32;
$bindings

"#,
};
