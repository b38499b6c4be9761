//! The fixed tensor signature of each op: names, roles and index layouts, in binding order.
//!
//! Binding order follows the seeds' bind-group tables, which are the reference ABI, with
//! the tensors an op only needs in some schedules present only there.

use crate::spec::{
    Axis, BiasHeads, Cache, Dtype, Gqa, Grid, KernelSpec, Masks, Op, Scatter, Source, Target,
    WriteMode,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
/// What a kernel does with a tensor of its signature.
pub enum Role {
    /// Read only.
    Input,
    /// Written (owned, atomic or scratch, as the description's `writes` says).
    Output,
    /// A uniform block (`dims` or `params`).
    Uniform,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
/// The element type of a tensor of the signature, before the spec's dtype is applied.
pub enum Elem {
    /// f32 whatever the dtype (LSE, row statistics, partials).
    F32,
    /// `u32` (document starts, block tables, seeds).
    U32,
    /// A data tensor (Q, K, V, O): f32, f16 or bf16 words, as the spec's dtype says.
    Data,
    /// f32 data the kernel reads and writes as vec4 (`array<vec4<f32>>`): one 16-byte
    /// load per four elements. The row length must be a multiple of 4.
    F32x4,
    /// A data tensor in the spec's dtype, read and written four elements at a time:
    /// `array<vec4<f32>>`, `array<vec4<f16>>`, or bf16 as `array<vec2<u32>>`.
    Data4,
    /// A KV cache: [`Elem::Data4`], or four 8-bit floats per `u32` when the spec's
    /// `kv_fp8` says so.
    Cache4,
    /// A KV cache read as its rows of data: [`Elem::Data`], or four 8-bit floats per
    /// `u32` when the spec's `kv_fp8` says so.
    CacheRows,
    /// `u32` counters the workgroups add to atomically (`array<atomic<u32>>`).
    Counter,
    /// A Linear's input rows, four at a time, in its form's `x` dtype (as [`Elem::Data4`]).
    LinearIn4,
    /// A Linear's output, in its form's `y` dtype (as [`Elem::Data`]).
    LinearOut,
}

/// When a tensor of the signature is bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    /// Bound in every kernel of the op.
    Always,
    /// With the document mask (`seg`).
    IfDocument,
    /// When the description declares this output in `writes`.
    IfWritten,
    /// In a backward_kv that recomputes P and dS.
    IfRecompute,
    /// In a backward_kv that reads P and dS from scratch.
    IfScratch,
    /// With ALiBi (the slopes).
    IfAlibi,
    /// With attention sinks (the per-head logits).
    IfSinks,
    /// With a bias of these heads.
    IfBias(BiasHeads),
    /// When written, with a bias of these heads.
    IfBiasWritten(BiasHeads),
    /// With this KV cache layout.
    IfCache(Cache),
    /// With a KV cache in 8-bit floats (its scales).
    IfFp8,
    /// When the description declares this output with this write mode (a gradient summed
    /// over rows: the whole tensor when atomic, one partial per row tile when scratch).
    IfWrittenAs(WriteMode),
    /// With cooperative-matrix products (`true`) or without them.
    IfCoop(bool),
    /// With bf16 operands on cooperative matrices in the backward (the row scales).
    IfScaled,
    /// A matmul that adds a bias per output column.
    IfMatmulBias,
    /// A split pass that combines its slices itself (it writes `o`).
    IfCombines,
    /// The same, with attention sinks (the per-head logits it joins).
    IfCombinesSinks,
    /// A continued cache's chunk whose sequences each have their own count of rows.
    IfRagged,
    /// A flash or tensor-core kernel built to count its workgroups in flight (an
    /// instrument).
    IfCounted,
}

/// One tensor (or uniform block) an op touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor {
    /// The binding's name, as the runtime binds it.
    pub name: &'static str,
    /// Read, written, or uniform.
    pub role: Role,
    /// The element type.
    pub elem: Elem,
    /// Index axes, outermost first. Empty for uniforms.
    pub layout: &'static [Axis],
    /// When it is bound.
    pub presence: Presence,
}

/// The fields of a uniform block: all `u32` (dims) or all `f32` (params), a multiple of
/// 16 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UniformBlock {
    /// The binding's name (`dims`, `params`).
    pub binding: &'static str,
    /// The WGSL struct's name.
    pub struct_name: &'static str,
    /// The type of every field.
    pub elem: Elem,
    /// The fields, in order.
    pub fields: &'static [&'static str],
}

const fn t(name: &'static str, role: Role, elem: Elem, layout: &'static [Axis]) -> Tensor {
    Tensor {
        name,
        role,
        elem,
        layout,
        presence: Presence::Always,
    }
}

const fn when(t: Tensor, presence: Presence) -> Tensor {
    Tensor { presence, ..t }
}

use Axis::{B, D, H, J, KvH, Page, Part, S, Slice};
use Elem::{Cache4, CacheRows, Counter, Data, Data4, F32, F32x4, LinearIn4, LinearOut, U32};
use Presence::{
    IfAlibi, IfBias, IfBiasWritten, IfCoop, IfDocument, IfRecompute, IfScaled, IfScratch, IfSinks,
    IfWritten,
};
use Role::{Input, Output, Uniform};

const DIMS: Tensor = t("dims", Uniform, U32, &[]);
const PARAMS_T: Tensor = t("params", Uniform, F32, &[]);
// Document start (part 0) and end (part 1) of every row.
const SEG: Tensor = when(t("seg", Input, U32, &[Part, B, S]), IfDocument);
// An instrument (`bench --only phases`): word 0 the workgroups in flight, word 1 the most
// seen at once; last, so that every other binding keeps its number.
const RESIDENT: Tensor = when(t("resident", Output, Counter, &[Part]), Presence::IfCounted);
// The score modifiers' tensors, bound after the rest so that binding numbers stay put.
const ALIBI: Tensor = when(t("alibi", Input, F32, &[H]), IfAlibi);
const BIAS: Tensor = when(
    t("bias", Input, F32, &[B, H, S, J]),
    IfBias(BiasHeads::PerHead),
);
const SHARED_BIAS: Tensor = when(t("bias", Input, F32, &[B, S, J]), IfBias(BiasHeads::Shared));
const SINKS: Tensor = when(t("sinks", Input, F32, &[H]), IfSinks);
const DBIAS: Tensor = when(
    t("dbias", Output, F32, &[B, H, S, J]),
    IfBiasWritten(BiasHeads::PerHead),
);
const SHARED_DBIAS: Tensor = when(
    t("dbias", Output, F32, &[B, S, J]),
    IfBiasWritten(BiasHeads::Shared),
);

const FORWARD: &[Tensor] = &[
    t("q", Input, Data, &[B, S, H, D]),
    t("k", Input, Data, &[B, J, KvH, D]),
    t("v", Input, Data, &[B, J, KvH, D]),
    t("o", Output, Data, &[B, S, H, D]),
    t("lse", Output, F32, &[B, S, H]),
    ROW_MAX,
    DIMS,
    PARAMS_T,
    SEG,
    ALIBI,
    BIAS,
    SHARED_BIAS,
    SINKS,
    RESIDENT,
];

// New rows over a KV cache, after their append: Q, O and LSE hold `seq_len` rows per
// sequence (ragged: sequence b's at `q_starts[b]..q_starts[b + 1]`, at most `seq_len`);
// K and V are the cache (as the split-K decode reads it), `seq_lens` each slot's length
// with the new rows counted. With the cache cut into key slices, each slice's
// partial softmax goes to `partials` instead, laid out as split-K decode's (rows in order,
// `n_rows` = seq_len), for its decode_reduce.
const EXTEND: &[Tensor] = &[
    t("q", Input, Data, &[B, S, H, D]),
    when(
        t("k", Input, CacheRows, &[B, J, KvH, D]),
        Presence::IfCache(Cache::Contiguous),
    ),
    when(
        t("v", Input, CacheRows, &[B, J, KvH, D]),
        Presence::IfCache(Cache::Contiguous),
    ),
    when(
        t("k", Input, CacheRows, &[Page, J, KvH, D]),
        Presence::IfCache(Cache::Paged),
    ),
    when(
        t("v", Input, CacheRows, &[Page, J, KvH, D]),
        Presence::IfCache(Cache::Paged),
    ),
    when(t("o", Output, Data, &[B, S, H, D]), IfWritten),
    when(t("lse", Output, F32, &[B, S, H]), IfWritten),
    when(
        t("partials", Output, F32x4, &[B, Slice, S, H, D]),
        IfWritten,
    ),
    DIMS,
    PARAMS_T,
    when(
        t("block_table", Input, U32, &[B, Page]),
        Presence::IfCache(Cache::Paged),
    ),
    t("seq_lens", Input, U32, &[B]),
    when(Q_STARTS, Presence::IfRagged),
    ALIBI,
    SINKS,
    KV_SCALES,
];

// Split-K decode: slice `slice` of the cache flushes, per query, its unnormalized output
// and then its max and sum, (m, l, 0, 0), one record of head_dim_v / 4 + 1 vec4s in
// `partials`, for the reduce.
// A paged cache is a pool of pages (J: the key within its page) and a block table.
const DECODE_SPLIT: &[Tensor] = &[
    t("q", Input, Data4, &[B, H, D]),
    when(
        t("k_cache", Input, Cache4, &[B, J, KvH, D]),
        Presence::IfCache(Cache::Contiguous),
    ),
    when(
        t("v_cache", Input, Cache4, &[B, J, KvH, D]),
        Presence::IfCache(Cache::Contiguous),
    ),
    when(
        t("k_cache", Input, Cache4, &[Page, J, KvH, D]),
        Presence::IfCache(Cache::Paged),
    ),
    when(
        t("v_cache", Input, Cache4, &[Page, J, KvH, D]),
        Presence::IfCache(Cache::Paged),
    ),
    t("partials", Output, F32x4, &[B, Slice, H, D]),
    DIMS,
    PARAMS_T,
    ALIBI,
    when(
        t("block_table", Input, U32, &[B, Page]),
        Presence::IfCache(Cache::Paged),
    ),
    // Keys in each sequence's cache: per sequence, and on the device, so that a ragged
    // batch decodes in one dispatch and a decode loop's uniforms never change.
    t("seq_lens", Input, U32, &[B]),
    KV_SCALES,
    Q_STARTS,
    // A split pass that combines its slices itself: the last workgroup of a query group to
    // flush (counted in `arrivals`, one per group, back to 0 when it has combined) merges the
    // group's partials into O, as the reduce would.
    when(t("o", Output, Data4, &[B, H, D]), IfWritten),
    when(t("lse", Output, F32, &[B, H]), IfWritten),
    when(
        t("arrivals", Output, Counter, &[B, KvH]),
        Presence::IfCombines,
    ),
    when(t("sinks", Input, F32, &[H]), Presence::IfCombinesSinks),
];

// Each sequence's first query row in the packed Q and O, and (entry b + 1) its end: the
// rows a sequence adds to its cache, one for a decode step (FlashInfer's qo_indptr).
const Q_STARTS: Tensor = t("q_starts", Input, U32, &[B]);

// An fp8 cache's scales: part 0 K's, part 1 V's, one per KV head (a per-tensor scale is
// the same value in every head). Run-time values, read on the device.
const KV_SCALES: Tensor = when(t("kv_scales", Input, F32, &[Part, KvH]), Presence::IfFp8);

const DECODE_REDUCE: &[Tensor] = &[
    t("partials", Input, F32x4, &[B, Slice, H, D]),
    t("o", Output, Data4, &[B, H, D]),
    // Each query's log-sum-exp, where the caller merges the decode with other keys.
    when(t("lse", Output, F32, &[B, H]), IfWritten),
    DIMS,
    SINKS,
    Q_STARTS,
];

// Attention states merged: `parts` outputs and LSEs of the same queries (rows by heads),
// each O normalized over its keys, stacked part-major.
const MERGE: &[Tensor] = &[
    t("o_parts", Input, Data4, &[Part, B, H, D]),
    t("lse_parts", Input, F32, &[Part, B, H]),
    t("o", Output, Data4, &[B, H, D]),
    t("lse", Output, F32, &[B, H]),
    DIMS,
    SINKS,
];

// One state per (sequence, head, query block, key block), sequences and heads collapsed to
// one where the mask_mod does not read them, each row followed by its block ranges (written
// by atomics over a cleared buffer); the mask_mod's tensors follow.
const BLOCK_MASK: &[Tensor] = &[t("block_mask", Output, U32, &[B, H, S, J]), DIMS];

const DECODE: &[Tensor] = &[
    t("q", Input, F32, &[B, H, D]),
    t("k_cache", Input, F32, &[B, J, KvH, D]),
    t("v_cache", Input, F32, &[B, J, KvH, D]),
    t("o", Output, F32, &[B, H, D]),
    DIMS,
    PARAMS_T,
    ALIBI,
    SINKS,
];

// dsinks[h] sums a term of every row of head h (over the batch), each with its own
// D = dO·O from O and dO in double-f32: the schedules' f32 D in `stats` carries as much
// rounding as a framework's, which a sum of a few values per head cannot average out. Two
// dispatches of one kernel: pass 0 sums blocks of rows (slices) into `dsinks_part` (hi and
// lo, part 0 and 1), pass 1 sums a head's slices in order into dsinks.
const SINK_GRAD: &[Tensor] = &[
    t("o", Input, Data, &[B, S, H, D]),
    t("d_o", Input, Data, &[B, S, H, D]),
    t("lse", Input, F32, &[B, S, H]),
    t("sinks", Input, F32, &[H]),
    t("dsinks_part", Output, F32, &[Part, H, Slice]),
    t("dsinks", Output, F32, &[H]),
    DIMS,
];

// The backward binds at most 8 storage buffers, WebGPU's default, by packing: LSE with D in
// `stats` [2, b, s, h], P with dS in the scratch `p_ds` [2, b, s, h, j], and dK with dV in
// the atomic `dkv` [2·DKV_LANES, b, j, kv_h, d]. Part 0 is the first named, part 1 the
// second; `dkv` repeats the pair per lane (see `DKV_LANES`). In a half-precision backward the
// forward's tensors and dO are in the dtype, the gradients f32: the kernels add into them
// across flushes and calls, and a half-precision sum would round at every add.
const BACKWARD_PREP: &[Tensor] = &[
    t("o", Input, Data, &[B, S, H, D]),
    t("d_o", Input, Data, &[B, S, H, D]),
    t("lse", Input, F32, &[B, S, H]),
    t("stats", Output, F32, &[Part, B, S, H]),
    DIMS,
];

// On cooperative matrices the dQ half does the prep's work itself: it reads O and the LSE,
// computes D = dO·O on the tensor cores (the order in which they sum dP = dO·V, so that
// dP − D cancels exactly where a row attends to one key) and packs both into `stats` for
// the dK/dV half.
// With bf16 operands on the tensor cores: each row's largest magnitude (f32 bits) of Q, K,
// V (parts 0-2; the forward reads these), O and dO (parts 3-4), from the `row_scale` pass;
// K's and V's rows of a part are indexed [b, j, kv_h] within its b·s·h words.
const ROW_MAX: Tensor = when(t("row_max", Input, U32, &[Part, B, S, H]), IfScaled);

const BACKWARD_Q: &[Tensor] = &[
    t("q", Input, Data, &[B, S, H, D]),
    t("k", Input, Data, &[B, J, KvH, D]),
    t("v", Input, Data, &[B, J, KvH, D]),
    t("d_o", Input, Data, &[B, S, H, D]),
    when(t("stats", Input, F32, &[Part, B, S, H]), IfCoop(false)),
    when(t("stats", Output, F32, &[Part, B, S, H]), IfCoop(true)),
    t("dq", Output, F32, &[B, S, H, D]),
    when(t("p_ds", Output, F32, &[Part, B, S, H, J]), IfWritten),
    when(t("dkv", Output, F32, &[Part, B, J, KvH, D]), IfWritten),
    when(t("o", Input, Data, &[B, S, H, D]), IfCoop(true)),
    when(t("lse", Input, F32, &[B, S, H]), IfCoop(true)),
    DIMS,
    PARAMS_T,
    SEG,
    ALIBI,
    BIAS,
    SHARED_BIAS,
    DBIAS,
    SHARED_DBIAS,
    ROW_MAX,
    RESIDENT,
];

const BACKWARD_KV: &[Tensor] = &[
    t("q", Input, Data, &[B, S, H, D]),
    when(t("k", Input, Data, &[B, J, KvH, D]), IfRecompute),
    when(t("v", Input, Data, &[B, J, KvH, D]), IfRecompute),
    t("d_o", Input, Data, &[B, S, H, D]),
    when(t("stats", Input, F32, &[Part, B, S, H]), IfRecompute),
    when(t("p_ds", Input, F32, &[Part, B, S, H, J]), IfScratch),
    t("dk", Output, F32, &[B, J, KvH, D]),
    t("dv", Output, F32, &[B, J, KvH, D]),
    // The flash backward (schedule (c)): key tiles own dK and dV and scatter dQ.
    when(t("dq", Output, F32, &[B, S, H, D]), IfWritten),
    DIMS,
    PARAMS_T,
    SEG,
    ALIBI,
    BIAS,
    SHARED_BIAS,
    DBIAS,
    SHARED_DBIAS,
    ROW_MAX,
    RESIDENT,
];

use Axis::{K, N, R, RowTile};

const LN_PARAMS_T: Tensor = t("params", Uniform, F32, &[]);

/// An f32 input of a row layer: scalar, or read as vec4 when its GEMMs run on tensor cores
/// (one 16-byte load per four staged elements; hidden and out are then multiples of 4).
macro_rules! row_input {
    ($name:literal, $($axis:ident),*) => {
        [
            when(t($name, Input, F32, &[$($axis),*]), IfCoop(false)),
            when(t($name, Input, F32x4, &[$($axis),*]), IfCoop(true)),
        ]
    };
}

const LN_X: [Tensor; 2] = row_input!("x", R, K);
const LN_GAMMA: [Tensor; 2] = row_input!("gamma", K);
const LN_BETA: [Tensor; 2] = row_input!("beta", K);
const LN_W: [Tensor; 2] = row_input!("w", N, K);
const LN_DY: [Tensor; 2] = row_input!("dy", R, N);

// 8 storage buffers, WebGPU's default.
const LAYERNORM_LINEAR: &[Tensor] = &[
    LN_X[0],
    LN_X[1],
    LN_GAMMA[0],
    LN_GAMMA[1],
    LN_BETA[0],
    LN_BETA[1],
    LN_W[0],
    LN_W[1],
    t("b", Input, F32, &[N]),
    t("y", Output, F32, &[R, N]),
    t("mean", Output, F32, &[R]),
    t("rstd", Output, F32, &[R]),
    DIMS,
    LN_PARAMS_T,
];

/// A gradient of a parameter, summed over every row: the whole tensor (atomic) or one
/// partial sum per row tile (scratch, for [`Op::LayernormLinearReduce`]): dW's and db's
/// per row tile, dγ's and dβ's per dx block of the tile (`row_layer::DX_ROWS` rows).
macro_rules! row_sum {
    ($name:literal, $($axis:ident),*) => {
        [
            when(
                t($name, Output, F32, &[$($axis),*]),
                Presence::IfWrittenAs(WriteMode::AtomicScatter),
            ),
            when(
                t($name, Output, F32, &[RowTile, $($axis),*]),
                Presence::IfWrittenAs(WriteMode::ScratchFlush),
            ),
        ]
    };
}

const DGAMMA: [Tensor; 2] = row_sum!("dgamma", K);
const DBETA: [Tensor; 2] = row_sum!("dbeta", K);
const DW: [Tensor; 2] = row_sum!("dw", N, K);
const DB: [Tensor; 2] = row_sum!("db", N);

// The backward in two kernels of at most 8 storage buffers, WebGPU's default (one would
// bind 12). dx, dγ and dβ: 7, the rows' mean and 1/std recomputed from x as the forward
// computes them, since binding the saved ones would make 9.
const LAYERNORM_LINEAR_BACKWARD: &[Tensor] = &[
    LN_X[0],
    LN_X[1],
    LN_GAMMA[0],
    LN_GAMMA[1],
    LN_W[0],
    LN_W[1],
    LN_DY[0],
    LN_DY[1],
    t("dx", Output, F32, &[R, K]),
    DGAMMA[0],
    DGAMMA[1],
    DBETA[0],
    DBETA[1],
    DIMS,
    LN_PARAMS_T,
];

// dW and db: 8. β is read for dW = dyᵀ·(x̂·γ + β), the Linear's input.
const LAYERNORM_LINEAR_WEIGHT_GRAD: &[Tensor] = &[
    LN_X[0],
    LN_X[1],
    LN_GAMMA[0],
    LN_GAMMA[1],
    LN_BETA[0],
    LN_BETA[1],
    LN_DY[0],
    LN_DY[1],
    t("mean", Input, F32, &[R]),
    t("rstd", Input, F32, &[R]),
    DW[0],
    DW[1],
    DB[0],
    DB[1],
    DIMS,
];

const LAYERNORM_LINEAR_REDUCE: &[Tensor] = &[
    t("dgamma_part", Input, F32, &[RowTile, K]),
    t("dbeta_part", Input, F32, &[RowTile, K]),
    t("dw_part", Input, F32, &[RowTile, N, K]),
    t("db_part", Input, F32, &[RowTile, N]),
    t("dgamma", Output, F32, &[K]),
    t("dbeta", Output, F32, &[K]),
    t("dw", Output, F32, &[N, K]),
    t("db", Output, F32, &[N]),
    DIMS,
];

// Row s of sequence b is at position positions[b] + s: per sequence and on the device,
// so that a decode step rotates at each sequence's cache length without a new uniform.
const ROPE: &[Tensor] = &[
    t("x", Output, Data, &[B, S, H, D]),
    t("inv_freq", Input, F32, &[D]),
    DIMS,
    t("positions", Input, U32, &[B]),
];

// New rows of K and V appended to a cache (contiguous: [slot, capacity, kv_h, d]; paged:
// a pool of pages through the block table), at each slot's length, which `seq_lens` holds
// and `seq_lens_next` receives advanced: two buffers, so that one dispatch both reads
// where the rows go and moves the lengths on.
const CACHE_APPEND: &[Tensor] = &[
    t("k_new", Input, Data4, &[B, S, KvH, D]),
    t("v_new", Input, Data4, &[B, S, KvH, D]),
    when(
        t("k_cache", Output, Cache4, &[B, J, KvH, D]),
        Presence::IfCache(Cache::Contiguous),
    ),
    when(
        t("v_cache", Output, Cache4, &[B, J, KvH, D]),
        Presence::IfCache(Cache::Contiguous),
    ),
    when(
        t("k_cache", Output, Cache4, &[Page, J, KvH, D]),
        Presence::IfCache(Cache::Paged),
    ),
    when(
        t("v_cache", Output, Cache4, &[Page, J, KvH, D]),
        Presence::IfCache(Cache::Paged),
    ),
    t("seq_lens", Input, U32, &[B]),
    t("seq_lens_next", Output, U32, &[B]),
    DIMS,
    when(
        t("block_table", Input, U32, &[B, Page]),
        Presence::IfCache(Cache::Paged),
    ),
    KV_SCALES,
];

// The streaming backward's lanes of dK and dV (see BACKWARD_KV's note on `dkv`), summed
// into the gradients.
// Conversions between f32 and the kernel's dtype, four elements at a time (R: any
// element count that is a multiple of 4).
const TO_DTYPE: &[Tensor] = &[
    t("src", Input, F32x4, &[R]),
    t("dst", Output, Data4, &[R]),
    DIMS,
];

const FROM_DTYPE: &[Tensor] = &[
    t("src", Input, Data4, &[R]),
    t("dst", Output, F32x4, &[R]),
    DIMS,
];

const DKV_REDUCE: &[Tensor] = &[
    t("dkv", Input, F32x4, &[Part, B, J, KvH, D]),
    t("dk", Output, F32x4, &[B, J, KvH, D]),
    t("dv", Output, F32x4, &[B, J, KvH, D]),
    DIMS,
];

// Rows to add (compensated sums in lanes: per lane part 0 the sum, part 1 its rounding
// errors; or one partial sum per part) and the gradient they add to.
const GRAD_FOLD: &[Tensor] = &[
    t("pair", Input, F32, &[Slice, Part, R]),
    t("grad", Output, F32, &[R]),
    DIMS,
];

// Each row's largest magnitude of a bf16 tensor (rows of width4 vec4s), as f32 bits.
const ROW_SCALE: &[Tensor] = &[
    t("src", Input, Data4, &[R]),
    t("dst", Output, U32, &[R]),
    DIMS,
];

// 6 storage buffers. xn: the normalized rows, rounded into the kernel's dtype.
// x, γ and β are read four at a time.
const LAYERNORM_ROWS: &[Tensor] = &[
    t("x", Input, F32x4, &[R, K]),
    t("gamma", Input, F32x4, &[K]),
    t("beta", Input, F32x4, &[K]),
    t("xn", Output, Data4, &[R, K]),
    t("mean", Output, F32, &[R]),
    t("rstd", Output, F32, &[R]),
    DIMS,
    LN_PARAMS_T,
];

// The split backward's first pass: 7 storage buffers (the statistics are recomputed, so
// that the saved ones need no binding). x, γ, β and dy are read four at a time.
const LAYERNORM_GRAD_ROWS: &[Tensor] = &[
    t("x", Input, F32x4, &[R, K]),
    t("gamma", Input, F32x4, &[K]),
    t("beta", Input, F32x4, &[K]),
    t("dy", Input, F32x4, &[R, N]),
    t("xn", Output, Data4, &[R, K]),
    t("dyh", Output, Data4, &[R, N]),
    DB[1],
    DIMS,
    LN_PARAMS_T,
];

// Its chain rule: 8 storage buffers, dx̂ₙ the dx matmul's f32 output.
const LAYERNORM_ROWS_BACKWARD: &[Tensor] = &[
    t("x", Input, F32x4, &[R, K]),
    t("gamma", Input, F32x4, &[K]),
    t("mean", Input, F32, &[R]),
    t("rstd", Input, F32, &[R]),
    t("dxn", Input, F32x4, &[R, K]),
    t("dx", Output, F32x4, &[R, K]),
    DGAMMA[1],
    DBETA[1],
    DIMS,
    LN_PARAMS_T,
];

// a: [m, k] and b: [k, n] in the kernel's dtype, laid out as the spec's form says; c:
// [split, m, n].
const MATMUL: &[Tensor] = &[
    t("a", Input, Data4, &[R, K]),
    t("b", Input, Data4, &[K, N]),
    when(t("bias", Input, F32, &[N]), Presence::IfMatmulBias),
    t("c", Output, F32, &[Part, R, N]),
    DIMS,
];

// x: [rows, hidden] and y: [rows, out] in the dtypes of the Linear's form (f32 unless it
// names halves); w: [out, hidden] in the kernel's dtype.
const LINEAR_ROWS: &[Tensor] = &[
    t("x", Input, LinearIn4, &[R, K]),
    t("w", Input, Data4, &[N, K]),
    when(t("bias", Input, F32, &[N]), Presence::IfMatmulBias),
    t("y", Output, LinearOut, &[R, N]),
    DIMS,
];

/// Every tensor `op` may bind, whatever the description.
pub fn all_tensors(op: Op) -> &'static [Tensor] {
    match op {
        Op::Forward => FORWARD,
        Op::Decode => DECODE,
        Op::DecodeSplit => DECODE_SPLIT,
        Op::DecodeReduce => DECODE_REDUCE,
        Op::BackwardPrep => BACKWARD_PREP,
        Op::BackwardQ => BACKWARD_Q,
        Op::BackwardKv => BACKWARD_KV,
        Op::Rope | Op::RopeBackward => ROPE,
        Op::LayernormLinear => LAYERNORM_LINEAR,
        Op::LayernormLinearBackward => LAYERNORM_LINEAR_BACKWARD,
        Op::LayernormLinearWeightGrad => LAYERNORM_LINEAR_WEIGHT_GRAD,
        Op::LayernormLinearReduce => LAYERNORM_LINEAR_REDUCE,
        Op::CacheAppend => CACHE_APPEND,
        Op::DkvReduce => DKV_REDUCE,
        Op::ToDtype => TO_DTYPE,
        Op::FromDtype => FROM_DTYPE,
        Op::SinkGrad => SINK_GRAD,
        Op::GradFold => GRAD_FOLD,
        Op::RowScale => ROW_SCALE,
        Op::LayernormRows => LAYERNORM_ROWS,
        Op::LayernormGradRows => LAYERNORM_GRAD_ROWS,
        Op::LayernormRowsBackward => LAYERNORM_ROWS_BACKWARD,
        Op::Matmul => MATMUL,
        Op::LinearRows => LINEAR_ROWS,
        Op::Extend => EXTEND,
        Op::Merge => MERGE,
        Op::BlockMask => BLOCK_MASK,
    }
}

/// The tensors `spec` binds, in binding order.
pub fn tensors(spec: &KernelSpec) -> Vec<Tensor> {
    all_tensors(spec.op)
        .iter()
        .filter(|t| match t.presence {
            Presence::Always => true,
            Presence::IfDocument => spec.masks.document,
            Presence::IfWritten => spec.write_mode(t.name).is_some(),
            Presence::IfRecompute => spec.source == Source::Recompute,
            Presence::IfScratch => spec.source == Source::Scratch,
            Presence::IfAlibi => spec.masks.alibi,
            Presence::IfSinks => spec.masks.sinks,
            Presence::IfBias(heads) => spec.masks.bias == Some(heads),
            Presence::IfBiasWritten(heads) => {
                spec.masks.bias == Some(heads) && spec.write_mode(t.name).is_some()
            }
            Presence::IfWrittenAs(mode) => spec.write_mode(t.name) == Some(mode),
            Presence::IfCache(cache) => spec.cache == cache,
            Presence::IfFp8 => spec.kv_fp8.is_some(),
            Presence::IfCoop(coop) => spec.grid.uses_coop() == coop,
            Presence::IfScaled => spec.dtype == Dtype::Bf16 && spec.grid.uses_coop(),
            Presence::IfMatmulBias => spec.matmul.is_some_and(|f| f.bias),
            Presence::IfCombines => spec.combines_slices(),
            Presence::IfCombinesSinks => spec.combines_slices() && spec.masks.sinks,
            Presence::IfRagged => spec.grid.ragged,
            Presence::IfCounted => spec.counts_residency && spec.grid.flash.is_some(),
        })
        .copied()
        .collect()
}

/// The `params` uniform block: the f32 scalars a kernel reads at run time (scale,
/// soft-cap, dropout), padded to 16 bytes.
pub const PARAMS: UniformBlock = UniformBlock {
    binding: "params",
    struct_name: "Params",
    elem: F32,
    fields: &["scale", "softcap", "dropout_scale", "_pad0"],
};

/// The row-wise layers' parameters: LayerNorm's epsilon.
pub const LN_PARAMS: UniformBlock = UniformBlock {
    binding: "params",
    struct_name: "Params",
    elem: F32,
    fields: &["eps", "_pad0", "_pad1", "_pad2"],
};

/// The run-time dims of `op`. Field 0 is the length the grid walks (or the cache length),
/// field 1 the head count of the grid; `batch` is the number of sequences (the grid's
/// third dimension, the second for decode).
pub fn dims(op: Op) -> UniformBlock {
    let fields: &'static [&'static str] = match op {
        Op::Decode => &[
            "cache_len",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "batch",
            "capacity",
            "window",
            "_pad0",
        ],
        // Both passes of split-K decode bind one dims block: slice_len keys per slice (a
        // multiple of the split kernel's key tile), n_slices of them; a paged cache's
        // page_size (keys per page) and pages_per_seq (a block table row's length); the most
        // query rows a sequence adds (n_rows) and the cache slot of sequence 0 (slot0).
        Op::DecodeSplit | Op::DecodeReduce => &[
            "cache_len",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "batch",
            "capacity",
            "window",
            "page_size",
            "slice_len",
            "n_slices",
            "pages_per_seq",
            "n_rows",
            "slot0",
            "_pad0",
            "_pad1",
            "_pad2",
        ],
        // seq_len new rows for each of `batch` sequences, continuing slots slot0..; the
        // cache's geometry as the append's; n_slices key slices of slice_len keys (a
        // kernel that writes `partials`).
        Op::Extend => &[
            "seq_len",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "batch",
            "window",
            "capacity",
            "page_size",
            "pages_per_seq",
            "slot0",
            "n_slices",
            "slice_len",
        ],
        // n_heads rows a token, of which the last n_kv_heads (0: none) lie in a second
        // tensor second_at head rows after the first's start (K after Q, as a fused
        // projection's parts).
        Op::Rope | Op::RopeBackward => &[
            "seq_len",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "batch",
            "second_at",
            "_pad1",
            "_pad2",
        ],
        // n_new rows for each of `batch` sequences, appended to slots slot0..slot0 + batch
        // of n_slots; a contiguous cache holds `capacity` rows a slot, a paged one
        // pages_per_seq pages of page_size rows.
        Op::CacheAppend => &[
            "n_new",
            "n_slots",
            "n_kv_heads",
            "head_dim",
            "batch",
            "capacity",
            "page_size",
            "pages_per_seq",
            "slot0",
            "_pad0",
            "_pad1",
            "_pad2",
        ],
        // n_slices: blocks of WG rows (all sequences'); sink_pass 0 sums each block, 1 the
        // blocks of a head.
        Op::SinkGrad => &[
            "seq_len",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "batch",
            "n_slices",
            "sink_pass",
            "_pad0",
        ],
        // vec4s of dK (and of dV) to sum.
        // len4_v: dV's vec4s beside dK's len4 (they differ where V's rows do).
        Op::DkvReduce => &["len4", "len4_v", "_pad0", "_pad1"],
        Op::ToDtype | Op::FromDtype => &["len4", "_pad0", "_pad1", "_pad2"],
        // queries (rows by heads) of head_dim-wide outputs, from `parts` states each.
        Op::Merge => &["queries", "n_heads", "head_dim", "parts"],
        // seq_len positions in blocks of BLOCK (`blocks` a side) for `batch` sequences of
        // n_heads heads; the mask's own sequences and heads (1 where it reads no `b`, `h`).
        Op::BlockMask => &[
            "seq_len",
            "n_heads",
            "blocks",
            "mask_heads",
            "batch",
            "mask_batch",
            "_pad0",
            "_pad1",
        ],
        // elements of the gradient, and the rows of `len` stacked in `pair`.
        Op::GradFold => &["len", "parts", "_pad0", "_pad1"],
        // rows of width4 vec4s each; their maxima land at dst[at + row].
        Op::RowScale => &["rows", "width4", "at", "_pad0"],
        // c = a·b over [m, k] by [k, n], the reduction in `split` parts.
        Op::Matmul => &["m", "n", "k", "split"],
        // rows: batch·seq; the reduce's partials: n_tiles of dW (the fused backward's row
        // tiles, the split one's matmul parts), n_blocks of dγ and dβ (the fused backward's
        // dx blocks, the split one's row workgroups), db_parts of db (row tiles, or row
        // workgroups).
        Op::LayernormLinear
        | Op::LayernormLinearBackward
        | Op::LayernormLinearWeightGrad
        | Op::LayernormLinearReduce
        | Op::LayernormRows
        | Op::LayernormGradRows
        | Op::LayernormRowsBackward => &[
            "rows", "hidden", "out", "n_tiles", "n_blocks", "db_parts", "_pad1", "_pad2",
        ],
        // part1, part2: where y's second and third parts start among its columns (0: no
        // such part); each part's y_rows rows are stored whole before the next part's (the
        // call's rows, or more where the caller pads the parts to offsets it can bind).
        Op::LinearRows => &[
            "rows", "hidden", "out", "part1", "part2", "y_rows", "_pad1", "_pad2",
        ],
        // window: the sliding window; seed_lo, seed_hi, rng_offset: dropout's Philox key and
        // counter word; drop_threshold: p·2^32, under which a Philox word drops.
        _ => &[
            "seq_len",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "batch",
            "window",
            "seed_lo",
            "seed_hi",
            "rng_offset",
            "drop_threshold",
            "_pad0",
            "_pad1",
        ],
    };
    UniformBlock {
        binding: "dims",
        struct_name: "Dims",
        elem: U32,
        fields,
    }
}

/// Whether a consumer's input named `name` is scratch some producer flushed (the split
/// backward's P and dS, split-K decode's partials): the tensor the macro checks against
/// the producer's published layout.
pub fn is_scratch_read(name: &str) -> bool {
    matches!(name, "p_ds" | "partials")
}

/// The uniform block behind a uniform binding name.
pub fn uniform_block(op: Op, binding: &str) -> Option<UniformBlock> {
    match (binding, op) {
        ("dims", _) => Some(dims(op)),
        ("params", op) if op.is_row_layer() => Some(LN_PARAMS),
        ("params", _) => Some(PARAMS),
        _ => None,
    }
}

impl KernelSpec {
    /// The kernel of `op: block_mask` for `flex`'s mask_mod: a workgroup of 256 per block,
    /// the states stored and the ranges widened by atomics.
    pub fn block_mask(name: &str, flex: crate::flex::FlexRef) -> KernelSpec {
        let masks = Masks {
            flex: Some(flex),
            ..Masks::default()
        };
        KernelSpec {
            writes: vec![("block_mask".into(), WriteMode::AtomicScatter)],
            scatter: Scatter::Cas,
            ..KernelSpec::standard(name, Op::BlockMask, 4, masks)
        }
    }

    /// The usual description of an op, for tests and tools: default grid for the op,
    /// 256 invocations, `webgpu` target, every output owned.
    /// Optional outputs (scratch, atomics) are left out.
    pub fn standard(name: &str, op: Op, head_dim: u32, masks: Masks) -> KernelSpec {
        let writes = all_tensors(op)
            .iter()
            .filter(|t| t.role == Role::Output)
            .filter(|t| t.presence == Presence::Always)
            .map(|t| (t.name.to_string(), WriteMode::Owned))
            .collect();
        KernelSpec {
            name: name.to_string(),
            op,
            grid: Grid::rows(op.major(), 1),
            head_dim,
            out_dim: 0,
            gqa: Gqa::Any,
            masks,
            target: Target::Webgpu,
            dtype: Dtype::F32,
            workgroup_size: 256,
            writes,
            source: Source::default(),
            scatter: Scatter::default(),
            cache: Cache::default(),
            kv_fp8: None,
            matmul: None,
            counts_residency: false,
        }
    }
}
