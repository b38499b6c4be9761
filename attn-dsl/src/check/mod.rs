//! Checks on a [`KernelSpec`] made before any WGSL exists. Each failure names the field at
//! fault and says what to change.

mod flex;
mod rows;

use crate::error::{DslError, Field};
use crate::layout::tiling::Tiling;
use crate::plan::KernelAbi;
use crate::signature::{self, Presence, Role};
use crate::spec::{
    Axis, BiasHeads, Cache, Gqa, KernelSpec, Major, Modifier, Op, Source, Target, WriteMode,
};

/// The largest head_dim the per-row schedule holds: one invocation per element of a row.
pub const MAX_HEAD_DIM: u32 = 256;

/// The rules a description must meet before any binding is planned or WGSL emitted: its
/// name, workgroup, sizes, ownership of every output, grid, masks, dtype, cache and
/// source; the first broken one as an error at its field.
pub fn check_spec(spec: &KernelSpec) -> Result<(), DslError> {
    check_name(spec)?;
    check_workgroup(spec)?;
    if spec.op.is_row_layer() {
        rows::check_sizes(spec)?;
    } else {
        check_head_dim(spec)?;
    }
    check_gqa(spec)?;
    // Ownership first: on a grid that does not fix an output's axes, the race is the
    // thing to tell the user about, before "this op has no such schedule".
    check_writes(spec)?;
    check_grid(spec)?;
    check_pack_heads(spec)?;
    if spec.grid.ragged && spec.op != Op::Extend {
        return Err(DslError::spec(
            Field::Grid,
            format!(
                "op {} has no sequences of their own row counts; `ragged` belongs to op extend \
                 (a continued cache's chunk)",
                spec.op.name()
            ),
        ));
    }
    check_masks(spec)?;
    check_dtype(spec)?;
    check_linear_io(spec)?;
    check_cache(spec)?;
    check_source(spec)
}

/// Only `linear_rows` reads x or writes y in half precision; every other product binds
/// them in f32, so a half-precision form there would be ignored.
fn check_linear_io(spec: &KernelSpec) -> Result<(), DslError> {
    let (form, f32) = (spec.matmul_form(), crate::spec::Dtype::F32);
    if spec.op == Op::LinearRows || (form.x == f32 && form.y == f32) {
        return Ok(());
    }
    Err(DslError::spec(
        Field::Dtype,
        format!(
            "op {} reads x and writes y in f32: x {} and y {} are for linear_rows (a plain \
             Linear) only",
            spec.op.name(),
            form.x.name(),
            form.y.name()
        ),
    ))
}

/// Half-precision data tensors are emitted for the ops listed below; bf16 only where each
/// invocation stores whole u32 words (vec4 stores: the flash grid's and the decode
/// reduce's; RoPE's two adjacent pairs).
fn check_dtype(spec: &KernelSpec) -> Result<(), DslError> {
    if spec.dtype == crate::spec::Dtype::F32 {
        return Ok(());
    }
    let flash_backward =
        matches!(spec.op, Op::BackwardQ | Op::BackwardKv) && spec.grid.flash.is_some();
    let ops = [
        Op::Forward,
        Op::Extend,
        Op::DecodeSplit,
        Op::DecodeReduce,
        Op::BackwardPrep,
        Op::CacheAppend,
        Op::ToDtype,
        Op::FromDtype,
        Op::SinkGrad,
        Op::RowScale,
        Op::LayernormRows,
        Op::LayernormGradRows,
        Op::Matmul,
        Op::LinearRows,
        Op::Merge,
        Op::Rope,
        Op::RopeBackward,
    ];
    if !ops.contains(&spec.op) && !flash_backward {
        let names: Vec<&str> = ops.iter().map(|o| o.name()).collect();
        return Err(DslError::spec(
            Field::Dtype,
            format!(
                "dtype {} is emitted for ops {}, and backward_q and backward_kv on flash \
                 grids; op {} on this grid reads and writes f32 (drop `dtype`, or use \
                 `grid: s_major(flash)` / `j_major(flash)`)",
                spec.dtype.name(),
                names.join(", "),
                spec.op.name()
            ),
        ));
    }
    let rope = matches!(spec.op, Op::Rope | Op::RopeBackward);
    if spec.dtype == crate::spec::Dtype::Bf16 && rope && !spec.head_dim.is_multiple_of(4) {
        return Err(DslError::spec(
            Field::HeadDim,
            format!(
                "head_dim {}: RoPE in bf16 rotates two adjacent pairs at a time (two bf16 \
                 share a u32 word), so it needs a multiple of 4; use f32 or f16 rows",
                spec.head_dim
            ),
        ));
    }
    if spec.dtype == crate::spec::Dtype::Bf16 && spec.op.is_forward() && spec.grid.flash.is_none() {
        return Err(DslError::spec(
            Field::Dtype,
            "dtype bf16 needs a flash grid (`grid: s_major(flash)`): the per-row forward \
             stores one element per invocation, and two bf16 share a u32 word",
        ));
    }
    Ok(())
}

/// Limits that depend on the finished plan (buffers, workgroup memory).
pub fn check_limits(spec: &KernelSpec, abi: &KernelAbi) -> Result<(), DslError> {
    if abi.binding(&spec.name).is_some() {
        return Err(DslError::spec(
            Field::Name,
            format!(
                "kernel name `{0}` is also the name of one of its bindings, and WGSL has one \
                 namespace for both: rename the kernel (e.g. `{0}_kernel`)",
                spec.name
            ),
        ));
    }
    let limits = spec.target.limits();
    let storage = abi.storage_buffers() as u32;
    if storage > limits.storage_buffers_per_stage {
        return Err(DslError::spec(
            Field::Target,
            format!(
                "kernel `{}` binds {storage} storage buffers but target allows {}; \
                 raise `storage_buffers` in a `native(..)` target for adapters that have more, or pack \
                 tensors into one binding",
                spec.name, limits.storage_buffers_per_stage
            ),
        ));
    }
    let uniforms = abi.uniform_buffers() as u32;
    if uniforms > limits.uniform_buffers_per_stage {
        return Err(DslError::spec(
            Field::Target,
            format!(
                "kernel `{}` binds {uniforms} uniform buffers, over the target's {}",
                spec.name, limits.uniform_buffers_per_stage
            ),
        ));
    }
    if abi.workgroup_storage_bytes > limits.workgroup_storage_bytes {
        let (field, lower, hint) = match spec.grid.flash {
            Some(_) => (
                Field::Grid,
                "shrink the tile or the inner tile",
                fitting_hint(spec),
            ),
            None => (
                Field::WorkgroupSize,
                "lower workgroup_size or head_dim",
                String::new(),
            ),
        };
        return Err(DslError::spec(
            field,
            format!(
                "kernel `{}` needs {} bytes of workgroup memory but the target allows {}; \
                 {lower}, or use a `native` target with more{hint}",
                spec.name, abi.workgroup_storage_bytes, limits.workgroup_storage_bytes
            ),
        ));
    }
    Ok(())
}

fn check_name(spec: &KernelSpec) -> Result<(), DslError> {
    let ok = spec
        .name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && spec
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(DslError::spec(
            Field::Name,
            format!(
                "kernel name `{}` must be an identifier (letters, digits, `_`)",
                spec.name
            ),
        ))
    }
}

fn check_workgroup(spec: &KernelSpec) -> Result<(), DslError> {
    let wg = spec.workgroup_size;
    let max = spec.target.limits().invocations_per_workgroup;
    // Flash grids reduce a row over its few invocations one by one, so they take any size
    // (head_dim 80 lays out 20 invocations a row); the per-row grids halve theirs.
    if spec.grid.flash.is_some() {
        if wg == 0 || wg > max {
            return Err(DslError::spec(
                Field::WorkgroupSize,
                format!(
                    "workgroup_size {wg} must be from 1 to {max} (the target's invocations per workgroup)"
                ),
            ));
        }
        return Ok(());
    }
    if !wg.is_power_of_two() || !(32..=max).contains(&wg) {
        return Err(DslError::spec(
            Field::WorkgroupSize,
            format!(
                "workgroup_size {wg} must be a power of two from 32 to {max} (the target's \
             invocations per workgroup); the reductions halve it down to one"
            ),
        ));
    }
    Ok(())
}

fn check_head_dim(spec: &KernelSpec) -> Result<(), DslError> {
    check_head_dim_v(spec)?;
    let hd = spec.width();
    if hd == 0 || hd > MAX_HEAD_DIM {
        return Err(DslError::spec(
            Field::HeadDim,
            format!(
                "head_dim {hd} is outside this kernel's limit of 1..={MAX_HEAD_DIM}; \
             the per-row schedule keeps one query row in one workgroup"
            ),
        ));
    }
    if matches!(spec.op, Op::Rope | Op::RopeBackward) && !hd.is_multiple_of(2) {
        return Err(DslError::spec(
            Field::HeadDim,
            format!(
                "head_dim {hd} is odd; RoPE rotates pairs (i, i + head_dim/2), so it needs an \
             even head_dim"
            ),
        ));
    }
    let vec4_rows = match spec.op {
        Op::DecodeSplit | Op::DecodeReduce => Some("split-K decode reads K, V and the partials"),
        Op::CacheAppend => Some("the cache append copies K and V rows"),
        Op::Merge => Some("the merge reads and writes the outputs"),
        _ => None,
    };
    if let Some(what) = vec4_rows.filter(|_| !hd.is_multiple_of(4)) {
        return Err(DslError::spec(
            Field::HeadDim,
            format!("head_dim {hd} is not a multiple of 4; {what} as vec4"),
        ));
    }
    if hd > spec.workgroup_size && spec.grid.flash.is_none() {
        return Err(DslError::spec(
            Field::HeadDim,
            format!(
                "head_dim {hd} is larger than workgroup_size {}; raise workgroup_size to at \
             least {}",
                spec.workgroup_size,
                hd.next_power_of_two()
            ),
        ));
    }
    Ok(())
}

/// Rows of two widths (Q and K `head_dim`, V and O `head_dim_v`): the forward's and the
/// decode's schedules and the cache append take them; the narrower must fill whole vec4s
/// (flash, split-K decode, the append) or 16-column fragments (tensor cores), since its end
/// is tested a vec4 or a fragment at a time.
fn check_head_dim_v(spec: &KernelSpec) -> Result<(), DslError> {
    if !spec.split_dims() {
        return Ok(());
    }
    let (hd, dv) = (spec.head_dim, spec.v_dim());
    let vec4_op = matches!(
        spec.op,
        Op::DecodeSplit | Op::DecodeReduce | Op::CacheAppend
    );
    // The backward takes them on every grid; a `dkv` scatter (dK and dV rows in one
    // buffer, each at its width) on the flash grid only.
    let backward = matches!(spec.op, Op::BackwardPrep | Op::BackwardQ | Op::BackwardKv)
        && (spec.write_mode("dkv").is_none() || spec.grid.flash.is_some());
    if !(vec4_op || backward || matches!(spec.op, Op::Forward | Op::Extend | Op::Decode)) {
        return Err(DslError::spec(
            Field::HeadDimV,
            format!(
                "head_dim_v {dv} differs from head_dim {hd}, and op {} on this grid does not \
                 take rows of two widths yet (the forward, the decode, the cache append and \
                 the backward do, a `dkv` scatter on the flash grid only); drop head_dim_v",
                spec.op.name()
            ),
        ));
    }
    let step = match (spec.grid.uses_coop(), spec.grid.flash.is_some() || vec4_op) {
        (true, _) => 16,
        (false, true) => 4,
        (false, false) => 1,
    };
    for (dim, field, name) in [
        (hd, Field::HeadDim, "head_dim"),
        (dv, Field::HeadDimV, "head_dim_v"),
    ] {
        if dim == 0 || !dim.is_multiple_of(step) {
            return Err(DslError::spec(
                field,
                format!(
                    "{name} {dim} must be a nonzero multiple of {step} for this grid: the \
                     narrower of head_dim and head_dim_v ends at a whole {}",
                    if step == 16 {
                        "16-column fragment"
                    } else {
                        "vec4"
                    }
                ),
            ));
        }
    }
    Ok(())
}

fn check_gqa(spec: &KernelSpec) -> Result<(), DslError> {
    if spec.gqa == Gqa::Ratio(0) {
        return Err(DslError::spec(
            Field::Gqa,
            "gqa ratio 0: each KV head serves at least one query head; use 1 for plain \
             multi-head attention, or `any` to take it from the run-time head counts",
        ));
    }
    Ok(())
}

fn check_grid(spec: &KernelSpec) -> Result<(), DslError> {
    let wanted = spec.op.major();
    let tile_max = match spec.op {
        Op::Decode | Op::DecodeReduce => 1,
        Op::DecodeSplit => crate::layout::decode::MAX_SPLIT_HEADS,
        // A backward row tile sums its rows in one workgroup: large tiles keep the
        // two-pass scratch (one partial per tile) and the atomic adds few.
        op if op.is_row_layer() => crate::layout::rows::MAX_ROW_TILE,
        _ => 64,
    };
    if spec.grid.major != wanted {
        return Err(DslError::spec(
            Field::Grid,
            format!(
                "op {} runs {}: one workgroup per {}; `{}` is not a schedule of this op",
                spec.op.name(),
                wanted.name(),
                grid_unit(wanted),
                spec.grid.major.name()
            ),
        ));
    }
    if spec.grid.flash.is_some() {
        return check_flash(spec);
    }
    if spec.op == Op::Extend {
        return Err(DslError::spec(
            Field::Grid,
            "op extend runs the flash forward's tiles only: use `grid: s_major(flash)` (with \
             `matrix = coop16` for tensor cores)",
        ));
    }
    if spec.grid.uses_coop() {
        return rows::check_coop(spec);
    }
    if spec.op == Op::DecodeSplit {
        return check_split_tile(spec);
    }
    if spec.grid.subgroups {
        return Err(DslError::spec(
            Field::Grid,
            format!(
                "op {} has no subgroup variant in its per-row grid (the flash schedule \
                 and the split-K decode's split pass have one); drop `subgroups`",
                spec.op.name()
            ),
        ));
    }
    if spec.grid.tile == 0 || spec.grid.tile > tile_max {
        return Err(DslError::spec(
            Field::Grid,
            format!(
                "tile {} for op {}: use a tile from 1 to {tile_max}",
                spec.grid.tile,
                spec.op.name()
            ),
        ));
    }
    Ok(())
}

/// A split pass's workgroup serves 1 to 4 query slots, one per vec4 component, in either
/// layout; its subgroup sums only natively.
fn check_split_tile(spec: &KernelSpec) -> Result<(), DslError> {
    if spec.grid.subgroups {
        native_subgroups(spec)?;
    }
    let tile_max = crate::layout::decode::MAX_SPLIT_HEADS;
    if !(1..=tile_max).contains(&spec.grid.tile) {
        return Err(DslError::spec(
            Field::Grid,
            format!(
                "tile {}: a decode_split workgroup serves 1 to {tile_max} query heads of its KV \
                 head, one per vec4 component; a KV head with more gets several workgroups",
                spec.grid.tile
            ),
        ));
    }
    Ok(())
}

/// The streamed split pass (`slice_major(flash)`): its heads per workgroup and subgroups
/// as the staged pass's, its layout by [`crate::layout::decode::Stream`].
fn check_stream(spec: &KernelSpec) -> Result<(), DslError> {
    check_split_tile(spec)?;
    if let Some(Err(problem)) = crate::layout::decode::Stream::of(spec) {
        return Err(DslError::spec(Field::Grid, problem));
    }
    Ok(())
}

/// The fewest query rows a streaming (dK/dV by atomic scatter) tile may sum per add:
/// with 8, the adds' rounding took dV over the pass rule on lavapipe.
pub const MIN_STREAMING_TILE: u32 = 16;

/// Ops with a flash schedule, and the most rows a flash tile may hold.
const FLASH_OPS: &[Op] = &[Op::Forward, Op::Extend, Op::BackwardQ, Op::BackwardKv];
const FLASH_TILE_MAX: u32 = 128;

fn check_flash(spec: &KernelSpec) -> Result<(), DslError> {
    if spec.op == Op::DecodeSplit {
        return check_stream(spec);
    }
    if !FLASH_OPS.contains(&spec.op) {
        return Err(DslError::spec(
            Field::Grid,
            format!(
                "op {} has no flash schedule yet; drop the inner tile and rows_per_thread to \
                 walk the rows of a tile one at a time",
                spec.op.name()
            ),
        ));
    }
    if spec.op == Op::BackwardQ && spec.write_mode("p_ds").is_some() {
        return Err(DslError::spec(
            Field::Write("p_ds".into()),
            "the flash backward_q keeps P and dS in workgroup memory and flushes no scratch; \
             drop `p_ds` (declare `dkv: atomic` for the streaming schedule), or use the \
             per-row grid for the split schedule",
        ));
    }
    if spec.op == Op::BackwardQ
        && spec.write_mode("dkv").is_some()
        && spec.grid.tile < MIN_STREAMING_TILE
    {
        return Err(DslError::spec(
            Field::Grid,
            format!(
                "a streaming backward_q adds each key's dK and dV summed over its tile's rows, \
                 one atomic add per tile; with tile {} a key's gradient arrives in too many \
                 pieces to stay within twice a framework's f32 error; use a tile of at least \
                 {MIN_STREAMING_TILE} rows",
                spec.grid.tile
            ),
        ));
    }
    if spec.op == Op::BackwardKv && spec.source == Source::Scratch {
        return Err(DslError::spec(
            Field::Source,
            "the flash backward_kv recomputes P and dS from staged tiles; use \
             `source: recompute`, or the per-row grid to read a split's scratch",
        ));
    }
    if spec.grid.tile > FLASH_TILE_MAX {
        return Err(DslError::spec(
            Field::Grid,
            format!(
                "flash tile {} is over {FLASH_TILE_MAX} rows",
                spec.grid.tile
            ),
        ));
    }
    if spec.grid.uses_coop() {
        return check_coop(spec);
    }
    match Tiling::of(spec) {
        Some(Err(problem)) => Err(DslError::spec(
            Field::Grid,
            format!("{problem}{}", fitting_hint(spec)),
        )),
        Some(Ok(t)) if spec.grid.uses_subgroups() => check_subgroups(spec, &t),
        _ => Ok(()),
    }
}

/// Cooperative-matrix products: the forward's two and the tiled backward's halves (owned
/// outputs only), in f16, under a native target (no browser exposes cooperative matrices).
fn check_coop(spec: &KernelSpec) -> Result<(), DslError> {
    let refuse = |problem: String| Err(DslError::spec(Field::Matrix, problem));
    if !matches!(
        spec.op,
        Op::Forward | Op::Extend | Op::BackwardQ | Op::BackwardKv
    ) {
        return refuse(format!(
            "`matrix = coop16` is emitted for ops forward, extend, backward_q and backward_kv; \
             drop it for op {}",
            spec.op.name()
        ));
    }
    let scattered = ["dq", "dkv"].into_iter().find(|name| {
        !spec.op.is_forward()
            && spec.write_mode(name) == Some(crate::spec::WriteMode::AtomicScatter)
    });
    if let Some(name) = scattered {
        return refuse(format!(
            "the cooperative-matrix backward owns its outputs (the tiled schedule); `{name}` by \
             atomic scatter is emitted on scalar tiles only: drop `matrix = coop16` or write \
             `{name}` owned by the other half"
        ));
    }
    if spec.op == Op::BackwardKv && spec.write_mode("dk") != spec.write_mode("dv") {
        return Err(DslError::spec(
            Field::Write("dv".into()),
            "the cooperative-matrix backward_kv writes dk and dv the same way: both `owned` \
             (a workgroup per KV head) or both `atomic` (a workgroup per query head)",
        ));
    }
    if spec.target == Target::Webgpu {
        return refuse(
            "cooperative matrices are not in WebGPU; use `target: native(..)` (the runtime \
             runs the kernel only on adapters with EXPERIMENTAL_COOPERATIVE_MATRIX)"
                .into(),
        );
    }
    if !spec.dtype.on_tensor_cores(spec.op) {
        return refuse(format!(
            "`matrix = coop16` multiplies f16 operands (bf16 ones scaled into f16); add \
             `dtype: f16` (this description reads {} for op {})",
            spec.dtype.name(),
            spec.op.name()
        ));
    }
    let t = crate::layout::coop::CoopTiling::of(spec).expect("a coop grid");
    match t.problem(spec) {
        Some(problem) => Err(DslError::spec(Field::Grid, problem)),
        None => Ok(()),
    }
}

/// Packed heads: a continued cache's tile on tensor cores in f16, whose key loop decides
/// a tile from one head (a `mask_mod` reading `h` would see only the group's first).
fn check_pack_heads(spec: &KernelSpec) -> Result<(), DslError> {
    if !spec.grid.pack_heads {
        return Ok(());
    }
    let refuse = |problem: &str| Err(DslError::spec(Field::Grid, problem.to_string()));
    if spec.op != Op::Extend || !spec.grid.uses_coop() || spec.dtype != crate::Dtype::F16 {
        return refuse(
            "query heads are packed into one tile only by op extend on `matrix = coop16` in \
             f16; drop the packing",
        );
    }
    let mask = spec.flex().and_then(|f| f.mask_mod);
    if mask.is_some_and(|m| m.mentions("h")) {
        return refuse(
            "a packed tile holds several query heads, and this `mask_mod` reads `h`; drop \
             the packing",
        );
    }
    Ok(())
}

/// Subgroup operations are not in core WebGPU: a kernel using them targets `native`.
fn native_subgroups(spec: &KernelSpec) -> Result<(), DslError> {
    match spec.target {
        Target::Webgpu => Err(DslError::spec(
            Field::Target,
            "subgroup operations are not in core WebGPU; use `target: native(..)` (the \
             runtime runs the kernel only on adapters with SUBGROUP)",
        )),
        Target::Native(_) => Ok(()),
    }
}

/// Subgroup reductions in a flash schedule: of its ops only the forward reduces across
/// invocations, core WebGPU has no subgroups, and the butterfly pairs invocations `tx ^ 1,
/// tx ^ 2, ..` of a row group.
fn check_subgroups(spec: &KernelSpec, t: &Tiling) -> Result<(), DslError> {
    if !spec.op.is_forward() {
        return Err(DslError::spec(
            Field::Grid,
            format!(
                "op {} reduces nothing across invocations in its flash schedule (only the \
                 forward's row max and row sum do); drop `subgroups`",
                spec.op.name()
            ),
        ));
    }
    native_subgroups(spec)?;
    if !t.tx.is_power_of_two() {
        return Err(DslError::spec(
            Field::Grid,
            format!(
                "subgroup reductions need a power-of-two number of invocations per row \
                 group, not {}; pick a workgroup_size and tile whose quotient by \
                 rows_per_thread is a power of two",
                t.tx
            ),
        ));
    }
    Ok(())
}

/// "; `s_major(tile = .., ..), workgroup_size: ..` fits ..": the configuration the rules
/// pick for this op, head_dim and target, for an error about one that does not fit.
fn fitting_hint(spec: &KernelSpec) -> String {
    let limits = spec.target.limits();
    let Some(c) = crate::layout::configs::for_description(spec.op, spec.width(), &limits, None)
    else {
        return String::new();
    };
    let (major, inner) = match spec.grid.major {
        Major::J => ("j_major", "query_tile"),
        _ => ("s_major", "key_tile"),
    };
    format!(
        ". `grid: {major}(tile = {}, {inner} = {}, rows_per_thread = {}), workgroup_size: {}` \
         fits head_dim {} under this target (or write `grid: {major}(flash)` to get it)",
        c.tile, c.inner, c.rows_per_thread, c.workgroup_size, spec.head_dim
    )
}

fn grid_unit(major: Major) -> &'static str {
    match major {
        Major::S => "(query tile, head)",
        Major::J => "(key tile, KV head)",
        Major::Head => "head",
        Major::Slice => "(key slice, KV head)",
        Major::R => "row tile",
        Major::Elem => "tile of output elements",
    }
}

fn check_masks(spec: &KernelSpec) -> Result<(), DslError> {
    if let Some(flex) = spec.masks.flex {
        flex::check(spec.op, &flex.get())?;
    }
    for m in spec.masks.modifiers() {
        let word = m.word();
        if let Some(why) = cannot_honour(spec.op, m) {
            return Err(DslError::spec(
                Field::Mask(word.to_string()),
                format!(
                    "op {} cannot honour `{word}`: {why}; remove `{word}`",
                    spec.op.name()
                ),
            ));
        }
    }
    Ok(())
}

/// Why `op` cannot honour the mask or modifier `m`, if it cannot.
fn cannot_honour(op: Op, m: Modifier) -> Option<&'static str> {
    use Modifier::*;
    match (op, m) {
        (
            Op::LayernormLinear
            | Op::LayernormLinearBackward
            | Op::LayernormLinearWeightGrad
            | Op::LayernormLinearReduce,
            _,
        ) => Some(
            "it is a row-wise layer (LayerNorm + Linear): no query meets a key, so no mask or \
             score modifier applies",
        ),
        (Op::CacheAppend, _) => Some(
            "it copies new rows of K and V into the cache; the masks and modifiers belong to \
             the decode that reads them",
        ),
        (Op::ToDtype | Op::FromDtype, _) => {
            Some("it converts values one by one; no query meets a key")
        }
        (Op::RowScale, _) => Some("it reads each row of one tensor on its own"),
        (Op::LayernormRows | Op::LayernormGradRows | Op::LayernormRowsBackward, _) => {
            Some("it normalizes each row on its own")
        }
        (Op::Matmul | Op::LinearRows, _) => Some("it is a plain product: no query meets a key"),
        (Op::DkvReduce | Op::GradFold, _) => {
            Some("it sums parts of gradients in which the masks and modifiers are already applied")
        }
        (Op::Rope | Op::RopeBackward, _) => Some(
            "it rotates each row on its own and never compares a query with a key, so no \
             mask or score modifier applies",
        ),
        // The partials carry no sink: the reduce joins it to the denominator once.
        (Op::DecodeReduce | Op::Merge, Sinks) => None,
        (Op::Merge, _) => Some(
            "it merges whole attention states, in which the masks and modifiers are already \
             applied; give them to the kernels that make the parts (a sink joins once, here)",
        ),
        (Op::BlockMask, _) => Some(
            "it evaluates the description's mask_mod alone; give the built-in masks to the \
             kernels that read the block mask",
        ),
        (Op::SinkGrad, Sinks) => None,
        (Op::SinkGrad, _) => Some(
            "it reads the forward's O and LSE, in which the masks and modifiers are already \
             applied; it needs only `sinks`",
        ),
        (Op::DecodeReduce, _) => Some(
            "it combines the slices' partial softmaxes, in which the masks and modifiers are \
             already applied; give them to the decode_split kernel",
        ),
        (Op::BackwardPrep, _) => Some(
            "it reads the forward's O and LSE, in which the masks and modifiers are already \
             applied",
        ),
        (Op::Decode | Op::DecodeSplit, Causal | Document) => Some(
            "its one query row attends to the whole KV cache, whose length is the run-time \
             `cache_len`; limit the keys with cache_len (or `window`)",
        ),
        (Op::Decode | Op::DecodeSplit, Bias | SharedBias) => Some(
            "a bias is a [seq, seq] tensor over a sequence's own queries, and a decode's query \
             is not one of its cache's rows",
        ),
        (Op::Decode | Op::DecodeSplit, Dropout) => Some(
            "dropout belongs to training, and a decode step runs inference; it has no \
             backward to regenerate the mask",
        ),
        (Op::Extend, Document) => Some(
            "its rows continue one sequence's cache, which is one document; cut a packed \
             batch into sequences (one slot each)",
        ),
        (Op::Extend, Bias | SharedBias) => Some(
            "a bias is a [seq, seq] tensor over one call's rows, and a continued cache's keys \
             span every earlier call",
        ),
        (Op::Extend, Dropout) => Some(
            "dropout belongs to training, and continuing a cache is inference; it has no \
             backward to regenerate the mask",
        ),
        (Op::Decode | Op::DecodeSplit, Window | Alibi | Softcap | Sinks)
        | (Op::Extend, Causal | Window | Alibi | Softcap | Sinks)
        | (Op::Forward | Op::BackwardQ | Op::BackwardKv, _) => None,
    }
}

/// Only split-K decode reads a paged or fp8 cache: its key index is the one place that
/// walks the block table, its loads the one place that widens fp8.
fn check_cache(spec: &KernelSpec) -> Result<(), DslError> {
    if spec.cache == Cache::Paged
        && !matches!(spec.op, Op::DecodeSplit | Op::Extend | Op::CacheAppend)
    {
        return Err(DslError::spec(
            Field::Cache,
            format!(
                "op {} reads no paged cache; `cache: paged` belongs to a decode_split kernel \
                 (run it with its decode_reduce), an extend or a cache_append",
                spec.op.name()
            ),
        ));
    }
    if let Some(f) = spec.kv_fp8
        && !matches!(spec.op, Op::DecodeSplit | Op::CacheAppend | Op::Extend)
    {
        return Err(DslError::spec(
            Field::Cache,
            format!(
                "op {} reads no KV cache; an {} cache belongs to a decode_split kernel, an \
                 extend or a cache_append",
                spec.op.name(),
                f.name()
            ),
        ));
    }
    if let Some(f) = spec.kv_fp8
        && spec.op == Op::Extend
        && !(spec.grid.uses_coop() && spec.dtype == crate::Dtype::F16)
    {
        return Err(DslError::spec(
            Field::Cache,
            format!(
                "an extend reads an {} cache into f16 tiles: give it `dtype: f16` and \
                 `matrix = coop16` in its grid",
                f.name()
            ),
        ));
    }
    Ok(())
}

fn check_source(spec: &KernelSpec) -> Result<(), DslError> {
    if spec.op == Op::DecodeReduce && spec.source != Source::Scratch {
        return Err(DslError::spec(
            Field::Source,
            "decode_reduce combines the partials a decode_split kernel flushes; name it with \
             `source: scratch(<decode_split kernel>)`",
        ));
    }
    if spec.source == Source::Scratch && !matches!(spec.op, Op::BackwardKv | Op::DecodeReduce) {
        return Err(DslError::spec(
            Field::Source,
            format!(
                "op {} reads no scratch: `source: scratch` belongs to a backward_kv kernel that \
             consumes the P and dS a backward_q flushed",
                spec.op.name()
            ),
        ));
    }
    Ok(())
}

fn check_writes(spec: &KernelSpec) -> Result<(), DslError> {
    let tensors = signature::all_tensors(spec.op);
    let flex = spec.flex();
    for (name, mode) in &spec.writes {
        let grad_of = flex
            .iter()
            .flat_map(|f| &f.tensors)
            .find(|t| t.grad_name().as_ref() == Some(name));
        // A name of the op's own is the op's (the flex check refuses the clash).
        if let Some(t) = grad_of.filter(|_| tensors.iter().all(|t| t.name != name)) {
            check_flex_grad(spec, &t.name, name, *mode)?;
            continue;
        }
        match tensors.iter().find(|t| t.name == name) {
            None => {
                return Err(DslError::spec(
                    Field::Write(name.clone()),
                    format!(
                        "op {} has no tensor `{name}`; its outputs are: {}",
                        spec.op.name(),
                        output_names(spec).join(", ")
                    ),
                ));
            }
            Some(t) if t.role != Role::Output => {
                return Err(DslError::spec(
                    Field::Write(name.clone()),
                    format!(
                        "`{name}` is an input of op {}, not an output; only outputs take a \
                     write mode",
                        spec.op.name()
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    check_dbias(spec)?;
    check_extend_outputs(spec)?;
    check_split_outputs(spec)?;
    rows::check_row_sums(spec)?;
    let present = signature::tensors(spec);
    for t in tensors.iter().filter(|t| t.role == Role::Output) {
        // A tensor listed twice (dbias, per head and shared) is checked in its present form.
        if present.iter().any(|p| p.name == t.name && p != t) {
            continue;
        }
        match spec.write_mode(t.name) {
            // The last workgroup of a query group to flush owns its O and LSE.
            Some(WriteMode::Owned) if spec.combines_slices() && matches!(t.name, "o" | "lse") => {}
            Some(mode) => check_ownership(spec, t.name, t.layout, mode)?,
            None if t.presence == Presence::Always => {
                return Err(DslError::spec(
                    Field::Write(String::new()),
                    format!(
                        "op {} writes `{}`: declare its write mode in `writes`, e.g. `{}: {}`",
                        spec.op.name(),
                        t.name,
                        t.name,
                        supported_mode(spec, t.name).name()
                    ),
                ));
            }
            None => {}
        }
    }
    check_pairs(spec)
}

/// A continued cache's kernel writes O and LSE, or (its keys cut into slices) each slice's
/// partial softmax for a decode_reduce, which joins the sinks where the slices meet.
fn check_extend_outputs(spec: &KernelSpec) -> Result<(), DslError> {
    if spec.op != Op::Extend {
        return Ok(());
    }
    let refuse = |m: &str| Err(DslError::spec(Field::Write(String::new()), m.to_string()));
    let sliced = spec.write_mode("partials").is_some();
    let whole = ["o", "lse"].map(|n| spec.write_mode(n).is_some());
    match (sliced, whole) {
        (true, [false, false]) if spec.masks.sinks => refuse(
            "an extend that writes `partials` leaves the sinks to its decode_reduce, which joins \
             them once where the slices meet; drop `sinks` here and keep it on the reduce",
        ),
        (true, [false, false]) | (false, [true, true]) => Ok(()),
        (true, _) => refuse(
            "an extend writes `o` and `lse`, or its key slices' `partials`, not both: drop one",
        ),
        (false, _) => refuse(
            "op extend writes `o` and `lse` (`writes: { o: owned, lse: owned }`), or its key \
             slices' `partials: scratch` for a decode_reduce",
        ),
    }
}

/// A split pass writes its slices' `partials`, and combines them itself only natively, in
/// the staged layout: its last workgroup reads what the others stored, which core WGSL's
/// `storageBarrier` (workgroup scope) does not order, and native backends' device-scope
/// barriers do.
fn check_split_outputs(spec: &KernelSpec) -> Result<(), DslError> {
    if spec.op != Op::DecodeSplit {
        return Ok(());
    }
    let refuse =
        |name: &str, m: &str| Err(DslError::spec(Field::Write(name.into()), m.to_string()));
    if spec.write_mode("lse").is_some() && !spec.combines_slices() {
        return refuse(
            "lse",
            "a split pass writes `lse` only where it combines its slices itself \
             (`o: owned` beside it); else its decode_reduce writes it",
        );
    }
    if !spec.combines_slices() {
        return Ok(());
    }
    if spec.target == Target::Webgpu {
        return refuse(
            "o",
            "a split pass that combines its slices needs `target: native(..)`: its last \
             workgroup reads the partials the others stored, which WGSL's storageBarrier \
             orders only within a workgroup (native backends order them across the device); \
             drop `o` and combine them with a decode_reduce",
        );
    }
    if crate::layout::decode::Stream::of(spec).is_some() {
        return refuse(
            "o",
            "the streamed split pass (`slice_major(flash)`) leaves its slices to a \
             decode_reduce; drop `o`, or use the staged pass (`slice_major(tile = N)`)",
        );
    }
    Ok(())
}

/// dBias needs a bias, and a kernel that sees dS for every (query, key) it writes.
fn check_dbias(spec: &KernelSpec) -> Result<(), DslError> {
    if spec.write_mode("dbias").is_none() {
        return Ok(());
    }
    let why = if spec.masks.bias.is_none() {
        "`dbias` is the gradient of a bias: add `bias` (per head) or `shared_bias` to `masks`"
    } else if spec.op == Op::BackwardKv && spec.grid.flash.is_none() {
        "the per-row backward_kv sums dS over queries without keeping it; write dBias in the \
         schedule's backward_q (or in a flash backward_kv)"
    } else {
        return Ok(());
    };
    Err(DslError::spec(Field::Write("dbias".into()), why))
}

/// The gradient `grad` of a modifier's tensor `tensor`: written by a backward kernel that
/// sees every dS, by atomics (many pairs read one element).
fn check_flex_grad(
    spec: &KernelSpec,
    tensor: &str,
    grad: &str,
    mode: WriteMode,
) -> Result<(), DslError> {
    let why = if !matches!(spec.op, Op::BackwardQ | Op::BackwardKv) {
        format!(
            "`{grad}` is the gradient of `{tensor}`: only a backward_q or backward_kv writes it"
        )
    } else if spec.op == Op::BackwardKv && spec.grid.flash.is_none() {
        format!(
            "the per-row backward_kv sums dS over queries without keeping it; write `{grad}` in \
             the schedule's backward_q (or in a flash backward_kv)"
        )
    } else if mode != WriteMode::AtomicScatter {
        format!(
            "`{grad}` gathers the gradient of every (query, key) pair that reads an element of \
             `{tensor}`, from many workgroups: write it `atomic`"
        )
    } else {
        return Ok(());
    };
    Err(DslError::spec(Field::Write(grad.into()), why))
}

/// Schedules that exclude each other.
fn check_pairs(spec: &KernelSpec) -> Result<(), DslError> {
    if spec.op == Op::BackwardKv
        && spec.write_mode("dq").is_some()
        && (spec.grid.flash.is_none() || spec.source == Source::Scratch)
    {
        return Err(DslError::spec(
            Field::Write("dq".into()),
            "only the flash backward_kv that recomputes P scatters `dq` (schedule (c)); give \
             the grid a query_tile and rows_per_thread and use `source: recompute`, or leave \
             dq to an s-major kernel",
        ));
    }
    if spec.op == Op::BackwardQ
        && spec.write_mode("p_ds").is_some()
        && spec.write_mode("dkv").is_some()
    {
        return Err(DslError::spec(
            Field::Write("dkv".into()),
            "backward_q flushes scratch (`p_ds`) or scatters `dkv`, not both: pick the split or \
             the streaming schedule",
        ));
    }
    Ok(())
}

/// The write mode the emitter produces for an output of an op.
fn supported_mode(spec: &KernelSpec, tensor: &str) -> WriteMode {
    match (spec.op, tensor) {
        // Either schedule of a sum over rows; an owned one is caught as a race first.
        (Op::LayernormLinearBackward, "dgamma" | "dbeta")
        | (Op::LayernormLinearWeightGrad, "dw" | "db") => spec
            .write_mode(tensor)
            .filter(|m| *m != WriteMode::Owned)
            .unwrap_or(WriteMode::AtomicScatter),
        (_, "dbias") if spec.masks.bias == Some(BiasHeads::Shared) => WriteMode::AtomicScatter,
        (Op::BackwardQ, "p_ds") => WriteMode::ScratchFlush,
        // The split backward's row passes leave partial sums for the reduce.
        (Op::LayernormGradRows, "db") | (Op::LayernormRowsBackward, "dgamma" | "dbeta") => {
            WriteMode::ScratchFlush
        }
        (Op::DecodeSplit | Op::Extend, "partials") => WriteMode::ScratchFlush,
        (Op::BackwardQ, "dkv") => WriteMode::AtomicScatter,
        // The tensor-core key-major half owns dK and dV per KV head, or adds them by
        // atomics from a workgroup per query head.
        (Op::BackwardKv, "dk" | "dv") if spec.grid.uses_coop() => {
            spec.write_mode(tensor).unwrap_or(WriteMode::Owned)
        }
        (Op::BackwardKv, "dq") => WriteMode::AtomicScatter,
        // Each block's state is its workgroup's; its row's and column's ranges are widened
        // by every block of them.
        (Op::BlockMask, "block_mask") => WriteMode::AtomicScatter,
        _ => WriteMode::Owned,
    }
}

/// An output written by one workgroup per element (`owned`, or a scratch flush) must be
/// indexed by every axis that tells the grid's workgroups apart; otherwise two workgroups
/// write one element.
fn check_ownership(
    spec: &KernelSpec,
    name: &str,
    layout: &[Axis],
    mode: WriteMode,
) -> Result<(), DslError> {
    if mode != WriteMode::AtomicScatter
        && let Some(axis) = spec
            .grid
            .major
            .fixed_axes()
            .iter()
            .find(|a| !fixed_by(layout, **a))
    {
        let axes: Vec<_> = layout.iter().map(|a| a.name()).collect();
        let fix = match spec.grid.major {
            Major::R => {
                "declare it `atomic` (scatter: each row tile adds its sum, the seed's way), or \
                 `scratch` (the two-pass schedule: each row tile writes its own partial sum, and \
                 a `layernorm_linear_reduce` kernel owns the final sum; no atomics, deterministic)"
            }
            _ => {
                "declare it `atomic` (scatter), or compute it in a kernel whose grid walks its \
                 axes"
            }
        };
        let rows = match spec.grid.major {
            Major::R => " (its rows are summed over)",
            _ => "",
        };
        return Err(DslError::spec(
            Field::Write(name.to_string()),
            format!(
                "`{name}` is declared {}, but its index [{}] lacks axis `{}`{rows}, which tells \
                 the workgroups of the {} grid apart, so several workgroups write each element \
                 (a data race); {fix}",
                mode.name(),
                axes.join(", "),
                axis.name(),
                spec.grid.major.name()
            ),
        ));
    }
    let supported = supported_mode(spec, name);
    if mode != supported {
        return Err(DslError::spec(
            Field::Write(name.to_string()),
            format!(
                "op {} writes `{name}` as `{}` only; `{}` is not emitted for it",
                spec.op.name(),
                supported.name(),
                mode.name()
            ),
        ));
    }
    Ok(())
}

/// Whether an index over `layout` fixes grid axis `axis`: it has it, or an axis that lies
/// in exactly one of its values (a query head in one KV head's group, a row in one row tile).
fn fixed_by(layout: &[Axis], axis: Axis) -> bool {
    let implied = match axis {
        Axis::KvH => Some(Axis::H),
        Axis::RowTile => Some(Axis::R),
        _ => None,
    };
    layout.contains(&axis) || implied.is_some_and(|a| layout.contains(&a))
}

fn output_names(spec: &KernelSpec) -> Vec<&'static str> {
    signature::all_tensors(spec.op)
        .iter()
        .filter(|t| t.role == Role::Output)
        .map(|t| t.name)
        .collect()
}

/// Workgroup memory of the kernel, as the emitter lays it out.
pub fn workgroup_bytes(spec: &KernelSpec) -> u32 {
    crate::layout::workgroup_bytes(spec)
}
