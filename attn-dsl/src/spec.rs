//! The dataflow IR: what a kernel computes, which grid runs it, who owns each output.
//!
//! A [`KernelSpec`] is built by a front end (the `attention_kernel!` macro, a test, a build
//! script) and is the single source from which the checks, the binding plan, the WGSL and the
//! generated Rust all derive.

use serde::Serialize;

/// Index axes of the attention dataflow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Axis {
    /// Sequence of a batch (the grid's third dimension).
    B,
    /// Query row.
    S,
    /// Key/value row.
    J,
    /// Query head.
    H,
    /// Key/value head; `kv_h = h / (n_heads / n_kv_heads)`.
    KvH,
    /// Head dimension.
    D,
    /// Which of the tensors packed into one buffer (e.g. P or dS in `p_ds`).
    Part,
    /// A row of a row-wise layer (LayerNorm + Linear): batch and sequence flattened.
    R,
    /// The row tile of a row grid: the workgroup a row-tile partial sum belongs to.
    RowTile,
    /// Hidden (input) feature of a LayerNorm + Linear row.
    K,
    /// Output feature of the Linear.
    N,
    /// A slice of a decode's KV cache along the key axis (split-K decode): the partial
    /// softmax of one slice.
    Slice,
    /// A page of a paged KV cache: a fixed number of consecutive keys of one sequence.
    Page,
}

impl Axis {
    /// The axis's name in a description's words (`b`, `h`, `s`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Axis::B => "b",
            Axis::S => "s",
            Axis::J => "j",
            Axis::H => "h",
            Axis::KvH => "kv_h",
            Axis::D => "d",
            Axis::Part => "part",
            Axis::R => "r",
            Axis::RowTile => "row_tile",
            Axis::K => "k",
            Axis::N => "n",
            Axis::Slice => "slice",
            Axis::Page => "page",
        }
    }
}

/// The computation a kernel performs. Each op has a fixed tensor signature
/// (the `signature` module); the description decides grid, specialization and write modes,
/// and the outputs it declares pick the schedule (a backward_q that declares `p` and `ds`
/// as scratch is the producer of the split backward; one that declares `dk` and `dv` as
/// atomic is the streaming backward).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Online-softmax attention over the whole sequence; writes O and LSE.
    Forward,
    /// One query row per head against a KV cache of `cache_len` rows.
    Decode,
    /// Split-K decode, first pass: the cache cut into slices along the key axis, each
    /// workgroup one slice for the query heads of one KV head, flushing the slice's partial
    /// softmax (max m, sum l, unnormalized output) to scratch.
    DecodeSplit,
    /// Split-K decode, second pass: each head's output combined from its slices' partials,
    /// each rescaled by exp(m_slice - m), owned by one workgroup per head.
    DecodeReduce,
    /// Backward preparation: per query row, packs the forward's LSE with
    /// D = rowsum(dO ∘ O) into `stats`, so the backward kernels bind one buffer for both.
    BackwardPrep,
    /// Backward by query rows: recomputes P from LSE, accumulates dQ; optionally flushes
    /// P and dS to scratch, or scatters dK and dV with atomics.
    BackwardQ,
    /// Backward by key rows: accumulates dK and dV, from scratch P and dS or recomputing.
    BackwardKv,
    /// Rotary position embedding, in place.
    Rope,
    /// The adjoint of [`Op::Rope`]: rotation by minus the angle, in place.
    RopeBackward,
    /// y = W·LN(x; γ, β) + b per row, saving each row's mean and 1/std for the backward.
    LayernormLinear,
    /// The backward of [`Op::LayernormLinear`], first half: dx per row (owned); dγ and dβ,
    /// sums over every row, added by atomics or flushed as partial sums. It recomputes the
    /// rows' statistics from x instead of binding the saved ones: 7 storage buffers.
    LayernormLinearBackward,
    /// The backward's second half: dW and db, sums over every row, added by atomics or
    /// flushed as one partial sum per row tile, from the forward's saved statistics: 8
    /// storage buffers.
    LayernormLinearWeightGrad,
    /// The second pass of the two-pass schedule: sums the row tiles' partials into dγ,
    /// dβ, dW and db, each element owned by one invocation (no atomics, deterministic).
    LayernormLinearReduce,
    /// Appends rows of K and V to a KV cache on the device: row `s` of sequence `b` lands
    /// at position `seq_lens[slot0 + b] + s` of its slot (through the block table when
    /// paged), and the slots' lengths, advanced, are written to `seq_lens_next`.
    CacheAppend,
    /// Sums the streaming backward's `dkv` lanes (pairwise, in a fixed order) into dK and
    /// dV: one invocation per vec4 of the result, so the sum is deterministic.
    DkvReduce,
    /// f32 values rounded (to nearest even) to the kernel's dtype: f32 activations into a
    /// half-precision cache or kernel.
    ToDtype,
    /// Values of the kernel's dtype widened to f32.
    FromDtype,
    /// The sinks' gradient, `dsinks[h] += −Σ_rows e^(sinks[h] − LSE)·D` with D = dO·O,
    /// summed over every row and sequence of head h by one workgroup (owned, no atomics).
    SinkGrad,
    /// Adds stacked rows into a gradient, one owner per element, in order with TwoSum:
    /// `grad[i] += Σ_p pair[p, i]`. The rows are the compensated sums (and their rounding
    /// errors) that a backward scattered by atomics (a modifier tensor's gradient), or
    /// partial gradients made elsewhere (`runtime::ops::sum`).
    GradFold,
    /// Each row's largest magnitude of a bf16 tensor (its f32 bits), from which the
    /// tensor-core backward takes the power of two that scales the row into f16.
    RowScale,
    /// The LayerNorm half of [`Op::LayernormLinear`] when its product runs as a
    /// [`Op::Matmul`]: each row's mean and 1/std, and its normalized row x̂·γ + β rounded
    /// once into the kernel's dtype (the product's left operand).
    LayernormRows,
    /// The first pass of the backward whose products run as [`Op::Matmul`]s: each row's
    /// x̂·γ + β (statistics recomputed as the forward computes them) and dy rounded once
    /// into the kernel's dtype (the products' operands), and db's partial sum over each
    /// workgroup's rows.
    LayernormGradRows,
    /// The LayerNorm chain rule of that backward, from dx̂ₙ = dy·W (an f32 matmul output)
    /// and the saved statistics: dx, and dγ's and dβ's partial sums over each workgroup's
    /// rows.
    LayernormRowsBackward,
    /// A product on cooperative matrices, `c = a·b (+ bias)`, f16 operands in memory and
    /// f32 sums: `[m, k]` by `[k, n]`, each operand contiguous along the reduction or the
    /// output index as the spec's [`MatmulForm`] says, the reduction optionally cut into
    /// `split` parts whose partial products land one after another in `c`.
    Matmul,
    /// A Linear at a few rows, `y = x·Wᵀ (+ b)`: `x` `[rows, hidden]` f32, `W` `[out,
    /// hidden]` (PyTorch's layout) in the kernel's dtype, `y` f32. A decode step's
    /// projection reads each weight once for every row, so it runs at the memory's rate:
    /// a workgroup per block of output columns, lanes along the reduction, the grid's
    /// `tile` rows per workgroup (more rows: more workgroups, each reading W again).
    LinearRows,
    /// A KV cache continued by `seq_len` new rows per sequence, after their append: the
    /// forward's schedule (flash tiles, cooperative matrices where the dtype allows) with
    /// query row r of sequence b at position `seq_lens[slot0 + b] - seq_len + r`, seeing
    /// the cached keys and the new rows up to itself. Chunked prefill and a conversation's
    /// next turn at the tensor cores' rate; writes O and LSE like the forward.
    Extend,
    /// Attention states of the same queries merged into one: `parts` outputs O (each
    /// normalized over its keys, in the kernel's dtype) with their LSE, into the O and LSE
    /// of attention over all their keys; a sink joins the denominator once. Context
    /// parallelism, cascade attention and a cache split between devices meet here.
    Merge,
    /// The block mask of a description's `mask_mod`: for each (sequence, head, query
    /// block, key block) of `BLOCK` positions, whether no pair, some or every pair is
    /// visible, evaluated pair by pair (tensor reads and `b` included) and written for the
    /// kernels that read it ([`crate::flex::Flex::block_mask`]) to skip and trust tiles.
    BlockMask,
}

impl Op {
    /// Every op, in the order the manifest and the tests walk them.
    pub const ALL: [Op; 28] = [
        Op::Forward,
        Op::Decode,
        Op::DecodeSplit,
        Op::DecodeReduce,
        Op::BackwardPrep,
        Op::BackwardQ,
        Op::BackwardKv,
        Op::Rope,
        Op::RopeBackward,
        Op::LayernormLinear,
        Op::LayernormLinearBackward,
        Op::LayernormLinearWeightGrad,
        Op::LayernormLinearReduce,
        Op::CacheAppend,
        Op::DkvReduce,
        Op::ToDtype,
        Op::FromDtype,
        Op::SinkGrad,
        Op::GradFold,
        Op::RowScale,
        Op::LayernormRows,
        Op::LayernormGradRows,
        Op::LayernormRowsBackward,
        Op::Matmul,
        Op::LinearRows,
        Op::Extend,
        Op::Merge,
        Op::BlockMask,
    ];

    /// The op's word in a description (`op: forward`).
    pub fn name(self) -> &'static str {
        match self {
            Op::Forward => "forward",
            Op::Decode => "decode",
            Op::DecodeSplit => "decode_split",
            Op::DecodeReduce => "decode_reduce",
            Op::BackwardPrep => "backward_prep",
            Op::BackwardQ => "backward_q",
            Op::BackwardKv => "backward_kv",
            Op::Rope => "rope",
            Op::RopeBackward => "rope_backward",
            Op::LayernormLinear => "layernorm_linear",
            Op::LayernormLinearBackward => "layernorm_linear_backward",
            Op::LayernormLinearWeightGrad => "layernorm_linear_weight_grad",
            Op::LayernormLinearReduce => "layernorm_linear_reduce",
            Op::CacheAppend => "cache_append",
            Op::DkvReduce => "dkv_reduce",
            Op::ToDtype => "to_dtype",
            Op::FromDtype => "from_dtype",
            Op::SinkGrad => "sink_grad",
            Op::GradFold => "grad_fold",
            Op::RowScale => "row_scale",
            Op::LayernormRows => "layernorm_rows",
            Op::LayernormGradRows => "layernorm_grad_rows",
            Op::LayernormRowsBackward => "layernorm_rows_backward",
            Op::Matmul => "matmul",
            Op::LinearRows => "linear_rows",
            Op::Extend => "extend",
            Op::Merge => "merge",
            Op::BlockMask => "block_mask",
        }
    }

    /// The grid every schedule of this op runs.
    pub fn major(self) -> Major {
        match self {
            Op::Forward
            | Op::Extend
            | Op::BackwardPrep
            | Op::BackwardQ
            | Op::Rope
            | Op::RopeBackward => Major::S,
            Op::Decode | Op::DecodeReduce => Major::Head,
            Op::DecodeSplit => Major::Slice,
            Op::BackwardKv => Major::J,
            Op::LayernormLinear
            | Op::LayernormLinearBackward
            | Op::LayernormLinearWeightGrad
            | Op::LayernormRows
            | Op::LayernormGradRows
            | Op::LayernormRowsBackward
            | Op::LinearRows => Major::R,
            Op::LayernormLinearReduce
            | Op::CacheAppend
            | Op::DkvReduce
            | Op::ToDtype
            | Op::FromDtype
            | Op::GradFold
            | Op::RowScale
            | Op::Matmul
            | Op::Merge
            | Op::BlockMask
            // A reduce: each workgroup owns one head's dsinks, walking every sequence.
            | Op::SinkGrad => Major::Elem,
        }
    }

    /// Whether this op reads a KV cache with one query row per head (plain or split-K).
    /// Whether this op's kernels compute a score for a (query, key) pair, and so take a
    /// description's `score_mod`, `mask_mod` and `tensors`.
    pub fn takes_modifiers(self) -> bool {
        matches!(
            self,
            Op::Forward
                | Op::Extend
                | Op::Decode
                | Op::DecodeSplit
                | Op::BackwardQ
                | Op::BackwardKv
                | Op::BlockMask
        )
    }

    /// Whether this op runs the forward's schedule (O and LSE of query tiles): the forward,
    /// and the forward of new rows over a KV cache.
    pub fn is_forward(self) -> bool {
        matches!(self, Op::Forward | Op::Extend)
    }

    /// Whether the op is one of a decode's kernels (one query row per sequence against a KV cache).
    pub fn is_decode(self) -> bool {
        matches!(self, Op::Decode | Op::DecodeSplit | Op::DecodeReduce)
    }

    /// Whether this op is a row-wise layer (hidden and out sizes) rather than attention
    /// (head_dim, heads, masks).
    pub fn is_row_layer(self) -> bool {
        matches!(
            self,
            Op::LayernormLinear
                | Op::LayernormLinearBackward
                | Op::LayernormLinearWeightGrad
                | Op::LayernormLinearReduce
                | Op::LayernormRows
                | Op::LayernormGradRows
                | Op::LayernormRowsBackward
                | Op::LinearRows
        )
    }
}

/// Which index of a product's operand is contiguous in memory: the reduction index (the
/// rows of x or of W in a Linear's forward) or the output index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Along {
    /// The reduction index is contiguous (x as `[rows, hidden]`, W as `[out, hidden]`).
    Reduction,
    /// The output index is contiguous (W as `[hidden, out]`).
    Output,
}

/// The memory layout of a [`Op::Matmul`]'s operands, whether it adds a bias per output
/// column, and (of a row-wise Linear, [`Op::LinearRows`]) the element types of its input
/// rows and its output; the weights are the spec's dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct MatmulForm {
    /// How the left operand is laid out.
    pub a: Along,
    /// How the right operand is laid out.
    pub b: Along,
    /// Whether a bias per output column is added.
    pub bias: bool,
    /// A Linear's x as held: f32, or f16 or bf16 rows (an engine's attention output in
    /// its cache's dtype). f32 in a [`Op::Matmul`].
    pub x: Dtype,
    /// A Linear's y as written: f32, or rounded once into f16 or bf16 (Q, K and V in
    /// the cache's dtype). f32 in a [`Op::Matmul`].
    pub y: Dtype,
}

impl MatmulForm {
    /// The form of a matmul whose spec names none (a description's default).
    pub const DEFAULT: MatmulForm = MatmulForm::f32(Along::Reduction, Along::Reduction, false);

    /// Operands laid out as `a` and `b`, with a bias or without, x and y in f32.
    pub const fn f32(a: Along, b: Along, bias: bool) -> MatmulForm {
        MatmulForm {
            a,
            b,
            bias,
            x: Dtype::F32,
            y: Dtype::F32,
        }
    }
}

/// Where a key-major backward gets P and dS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Recomputed from Q, K, V, O, dO and LSE: no scratch, no atomics.
    #[default]
    Recompute,
    /// Read from the scratch a query-major producer flushed.
    Scratch,
}

/// How atomic-scatter outputs are added into.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scatter {
    /// A compare-exchange loop on `atomic<u32>` with bitcasts: portable everywhere.
    #[default]
    Cas,
    /// Native `atomicAdd` on `atomic<f32>`: needs SHADER_FLOAT32_ATOMIC.
    F32Atomic,
}

/// Which axis the dispatch grid walks: one workgroup per tile of that axis (and per head).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Major {
    /// One workgroup per (query tile, head).
    S,
    /// One workgroup per (key tile, KV head).
    J,
    /// One workgroup per head (decode: a single query row).
    Head,
    /// One workgroup per (key slice, KV head): split-K decode, `tile` query heads of the KV
    /// head per workgroup, so each slice of K and V is read once for all of them.
    Slice,
    /// One workgroup per tile of rows of a row-wise layer.
    R,
    /// One invocation per output element, each summing what it owns (a reduce).
    Elem,
}

impl Major {
    /// The major's word in a description (`grid: s_major(..)`).
    pub fn name(self) -> &'static str {
        match self {
            Major::S => "s_major",
            Major::J => "j_major",
            Major::Head => "head_major",
            Major::Slice => "slice_major",
            Major::R => "r_major",
            Major::Elem => "elementwise",
        }
    }

    /// Axes that tell the workgroups of this grid apart: an `owned` output must be indexed
    /// by all of them, or two workgroups write one element.
    pub fn fixed_axes(self) -> &'static [Axis] {
        match self {
            Major::S => &[Axis::B, Axis::S, Axis::H],
            Major::J => &[Axis::B, Axis::J, Axis::KvH],
            Major::Head => &[Axis::B, Axis::H],
            Major::Slice => &[Axis::B, Axis::Slice, Axis::KvH],
            Major::R => &[Axis::RowTile],
            // Every invocation owns the elements it is handed; none shares one.
            Major::Elem => &[],
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
/// How a kernel's workgroups cover its work: the major axis, the rows per workgroup, and how
/// a tile's rows and products are computed.
pub struct Grid {
    /// The axis whose tiles are owned, one per workgroup.
    pub major: Major,
    /// Rows of the major axis per workgroup. 1 is the per-query design of the seeds.
    pub tile: u32,
    /// `None`: the rows of a tile are walked one at a time (the seeds' design).
    /// `Some`: the flash schedule, all rows of the tile at once.
    pub flash: Option<Flash>,
    /// How the tiles' matrix products are computed: the flash schedule's Q·Kᵀ and P·V,
    /// the row layers' GEMMs.
    #[serde(default, skip_serializing_if = "Matrix::is_scalar")]
    pub matrix: Matrix,
    /// A continued cache's query tile holds (position, query head) pairs of one KV head's
    /// query heads, row-major, instead of positions of one head: the query heads sharing
    /// a KV head read its K and V once, and a few rows per sequence still fill a tile
    /// (tensor cores, [`Op::Extend`] only).
    #[serde(default, skip_serializing_if = "is_false")]
    pub pack_heads: bool,
    /// A continued cache's sequences each have their own count of new rows: sequence b's
    /// are rows `q_starts[b]..q_starts[b + 1]` of Q and O (vLLM's and FlashInfer's
    /// `qo_indptr`), at most `seq_len` of them, and a tile past them walks no keys
    /// ([`Op::Extend`] only).
    #[serde(default, skip_serializing_if = "is_false")]
    pub ragged: bool,
    /// Reductions across invocations by subgroup operations instead of workgroup memory:
    /// the flash schedule's row reductions, a streamed split pass's key groups, the staged
    /// split pass's key lanes and slice reductions. Needs a `native` target and an adapter
    /// with SUBGROUP; the kernel checks at run time that the adapter's subgroups hold whole
    /// groups and falls back to workgroup memory where they do not, so it is right for any
    /// subgroup size.
    #[serde(default, skip_serializing_if = "is_false")]
    pub subgroups: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Grid {
    /// Whether the grid's row reductions use subgroup operations.
    pub fn uses_subgroups(&self) -> bool {
        self.uses_coop() || self.subgroups
    }

    /// Whether the grid's products are cooperative-matrix products.
    pub fn uses_coop(&self) -> bool {
        self.matrix == Matrix::Coop16
    }

    /// The seeds' per-row grid over `major`, `tile` rows walked in turn.
    pub const fn rows(major: Major, tile: u32) -> Grid {
        Grid {
            major,
            tile,
            flash: None,
            matrix: Matrix::Scalar,
            pack_heads: false,
            ragged: false,
            subgroups: false,
        }
    }
}

/// The flash schedule's compile-time tiling: a workgroup owns `tile` rows of its major axis,
/// stages `inner` rows of the other axis at a time in workgroup memory, and each invocation
/// keeps a register block of `rows_per_thread` rows by `inner / threads-per-row` columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Flash {
    /// Rows of the other axis (keys for an s-major grid) staged per step.
    pub inner: u32,
    /// Rows of the workgroup's tile each invocation accumulates in registers.
    pub rows_per_thread: u32,
}

/// How a grid computes its matrix products (the flash schedule's Q·Kᵀ and P·V, the row
/// layers' GEMMs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Matrix {
    /// Per-invocation register blocks of f32 fused multiply-adds: every adapter.
    #[default]
    Scalar,
    /// 16x16x16 cooperative-matrix products (tensor cores): f16 operands, f32
    /// accumulators, one subgroup of 32 invocations per 16 query rows. Native only
    /// (wgpu's EXPERIMENTAL_COOPERATIVE_MATRIX, on adapters that list f16 x f16 -> f32
    /// at 16x16x16 and run subgroups of exactly 32).
    Coop16,
}

impl Matrix {
    /// The word in a description (`matrix = coop16`).
    pub fn name(self) -> &'static str {
        match self {
            Matrix::Scalar => "scalar",
            Matrix::Coop16 => "coop16",
        }
    }

    /// The matrix of a description's word, `None` for an unknown one.
    pub fn parse(word: &str) -> Option<Matrix> {
        [Matrix::Scalar, Matrix::Coop16]
            .into_iter()
            .find(|m| m.name() == word)
    }

    /// Whether the products are per-invocation f32 FMAs (every adapter).
    pub fn is_scalar(&self) -> bool {
        *self == Matrix::Scalar
    }
}

/// Query heads per KV head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Gqa {
    /// Read from the run-time dims (`n_heads / n_kv_heads`).
    Any,
    /// Fixed at compile time; the runtime rejects other head counts.
    Ratio(u32),
}

/// Which keys a query sees, and how its scores are modified before the softmax: the words
/// of a description's `masks` list. Each is a compile-time specialization; the values
/// (window, slopes, bias, cap, dropout probability and seed) come at run time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Masks {
    /// Query `s` sees keys `j <= s`.
    pub causal: bool,
    /// Query `s` sees only keys of its own document: `seg` holds each row's document
    /// start and end.
    pub document: bool,
    /// Query `s` sees keys within the run-time `dims.window` W: `s - W < j <= s` with
    /// `causal`, `|s - j| < W` without. Tiles outside every row's window are skipped.
    pub window: bool,
    /// `alibi[h] · (j - s)` is added to the scores (ALiBi), slopes `[n_heads]` at run time.
    pub alibi: bool,
    /// An additive bias tensor, and whether it has a slice per head or one shared by all.
    pub bias: Option<BiasHeads>,
    /// Scores become `cap · tanh(score / cap)`, `cap = params.softcap`, before the softmax
    /// (Gemma 2's logit soft-capping); the bias and ALiBi are added before the cap.
    pub softcap: bool,
    /// P is dropped with probability `params.dropout` and the kept values scaled by
    /// `1 / (1 - p)`, by a counter-based RNG keyed by `(seed, offset, batch, head, s, j)`
    /// (Philox-4x32-10), so every kernel regenerates the same mask whatever its tile order.
    pub dropout: bool,
    /// Attention sinks (gpt-oss): a per-head logit `sinks[h]` joins every row's softmax
    /// denominator, a key with no value. The LSE includes it, so the backward's P needs
    /// nothing more; its gradient, `dsinks[h] = −Σ_rows e^(sink − LSE)·D`, is the
    /// `sink_grad` op's.
    pub sinks: bool,
    /// User-written modifiers (`score_mod`, `mask_mod` and the tensors they read), applied
    /// after the built-in ones: the score modifier to the scaled, biased, capped score, the
    /// mask within the built-in masks' key range.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flex: Option<crate::flex::FlexRef>,
}

/// The head axis of an additive bias: `[n_heads, seq, seq]` or `[1, seq, seq]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BiasHeads {
    /// One slice per query head: the grid owns dBias wherever it owns the head.
    PerHead,
    /// One slice broadcast over the heads: dBias sums over heads, a reduction.
    Shared,
}

/// One word of a description's `masks` list: the single place a mask or score modifier
/// is declared. The macro parses these words, the checks ask which ops honour each, the
/// runtime compares a kernel's words with the values it is given, and the case matrix
/// covers each; their `match`es are exhaustive, so a new variant is listed by the compiler
/// wherever it needs an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Modifier {
    /// Keys after the query are masked.
    Causal,
    /// Keys of another document of the same sequence are masked.
    Document,
    /// Keys farther from the query than a window are masked.
    Window,
    /// ALiBi: a per-head slope times the key's distance added to each score.
    Alibi,
    /// An additive score bias per head, read from a tensor.
    Bias,
    /// An additive score bias shared by every head.
    SharedBias,
    /// Scores soft-capped: `c·tanh(score / c)`.
    Softcap,
    /// Dropout on the probabilities, from a seed (the backward regenerates the same mask).
    Dropout,
    /// A learned logit per head joined to every row's softmax denominator.
    Sinks,
}

impl Modifier {
    /// In the order descriptions list them and labels print them.
    pub const ALL: [Modifier; 9] = [
        Modifier::Causal,
        Modifier::Document,
        Modifier::Window,
        Modifier::Alibi,
        Modifier::Bias,
        Modifier::SharedBias,
        Modifier::Softcap,
        Modifier::Dropout,
        Modifier::Sinks,
    ];

    /// The modifier's word in a description's `masks: [..]`.
    pub fn word(self) -> &'static str {
        match self {
            Modifier::Causal => "causal",
            Modifier::Document => "document",
            Modifier::Window => "window",
            Modifier::Alibi => "alibi",
            Modifier::Bias => "bias",
            Modifier::SharedBias => "shared_bias",
            Modifier::Softcap => "softcap",
            Modifier::Dropout => "dropout",
            Modifier::Sinks => "sinks",
        }
    }

    /// The modifier of a description's word, `None` for an unknown one.
    pub fn parse(word: &str) -> Option<Modifier> {
        Modifier::ALL.into_iter().find(|m| m.word() == word)
    }

    /// Every word, as an error message lists them: "`causal`, ... or `sinks`".
    pub fn expected() -> String {
        let words: Vec<String> = Modifier::ALL
            .iter()
            .map(|m| format!("`{}`", m.word()))
            .collect();
        let (last, rest) = words.split_last().expect("there are modifiers");
        format!("{} or {last}", rest.join(", "))
    }

    /// Whether the kernel needs a value for this word at run time (a window, slopes, a
    /// bias, a cap, dropout's p and seed), which the runtime checks is given exactly when
    /// the kernel was built with the word. The causal mask needs none; the document mask
    /// reads `seg`, which every kernel binds.
    pub fn takes_value(self) -> bool {
        match self {
            Modifier::Causal | Modifier::Document => false,
            Modifier::Window
            | Modifier::Alibi
            | Modifier::Bias
            | Modifier::SharedBias
            | Modifier::Softcap
            | Modifier::Dropout
            | Modifier::Sinks => true,
        }
    }

    /// The words a kernel cannot take together with this one.
    pub fn excludes(self) -> Option<Modifier> {
        match self {
            Modifier::Bias => Some(Modifier::SharedBias),
            Modifier::SharedBias => Some(Modifier::Bias),
            Modifier::Causal
            | Modifier::Document
            | Modifier::Window
            | Modifier::Alibi
            | Modifier::Softcap
            | Modifier::Dropout
            | Modifier::Sinks => None,
        }
    }
}

impl Masks {
    /// Only the causal and document masks, as the kernels had before the modifiers.
    pub const fn new(causal: bool, document: bool) -> Masks {
        Masks {
            causal,
            document,
            window: false,
            alibi: false,
            bias: None,
            softcap: false,
            dropout: false,
            sinks: false,
            flex: None,
        }
    }

    /// Whether the masks turn `m` on.
    pub fn has(&self, m: Modifier) -> bool {
        match m {
            Modifier::Causal => self.causal,
            Modifier::Document => self.document,
            Modifier::Window => self.window,
            Modifier::Alibi => self.alibi,
            Modifier::Bias => self.bias == Some(BiasHeads::PerHead),
            Modifier::SharedBias => self.bias == Some(BiasHeads::Shared),
            Modifier::Softcap => self.softcap,
            Modifier::Dropout => self.dropout,
            Modifier::Sinks => self.sinks,
        }
    }

    /// These masks with `m` turned on (a bias replaces the other bias layout).
    pub fn with(mut self, m: Modifier) -> Masks {
        match m {
            Modifier::Causal => self.causal = true,
            Modifier::Document => self.document = true,
            Modifier::Window => self.window = true,
            Modifier::Alibi => self.alibi = true,
            Modifier::Bias => self.bias = Some(BiasHeads::PerHead),
            Modifier::SharedBias => self.bias = Some(BiasHeads::Shared),
            Modifier::Softcap => self.softcap = true,
            Modifier::Dropout => self.dropout = true,
            Modifier::Sinks => self.sinks = true,
        }
        self
    }

    /// The words turned on, in [`Modifier::ALL`]'s order.
    pub fn modifiers(&self) -> impl Iterator<Item = Modifier> + '_ {
        Modifier::ALL.into_iter().filter(|m| self.has(*m))
    }

    /// The description's words for these masks, in the order the macro takes them.
    pub fn words(&self) -> Vec<&'static str> {
        self.modifiers().map(Modifier::word).collect()
    }

    /// How the backward kernel that computes dS writes dBias: owned with a bias per head
    /// (the grids that own a head own its slice), by atomics with one shared by the heads.
    pub fn dbias_mode(&self) -> Option<WriteMode> {
        self.bias.map(|heads| match heads {
            BiasHeads::PerHead => WriteMode::Owned,
            BiasHeads::Shared => WriteMode::AtomicScatter,
        })
    }

    /// The gradients a backward kernel that sees every dS writes beside dQ, dK and dV:
    /// dBias (see [`Masks::dbias_mode`]) and, for each tensor a score modifier declares
    /// `grad`, `d<name>` by atomics (its reads land anywhere in the table).
    pub fn score_grad_writes(&self) -> Vec<(String, WriteMode)> {
        let flex = self.flex.map(|f| f.get());
        let flex_grads = flex
            .iter()
            .flat_map(|f| f.tensors.iter().filter_map(|t| t.grad_name()))
            .map(|name| (name, WriteMode::AtomicScatter));
        self.dbias_mode()
            .map(|m| ("dbias".to_string(), m))
            .into_iter()
            .chain(flex_grads)
            .collect()
    }

    /// Whether a score is anything but `scale · q·k`.
    pub fn modifies_scores(&self) -> bool {
        self.alibi || self.bias.is_some() || self.softcap
    }
}

/// How a decode's KV cache is laid out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cache {
    /// `[batch, capacity, n_kv_heads, head_dim]`: each sequence's rows in one block.
    #[default]
    Contiguous,
    /// A pool of pages `[n_pages, page_size, n_kv_heads, head_dim]` and a block table
    /// `[batch, pages_per_seq]` naming the page of each sequence's keys
    /// `p·page_size..(p + 1)·page_size` (vLLM's PagedAttention layout); page_size and
    /// pages_per_seq are run-time dims.
    Paged,
}

impl Cache {
    /// The layout's word in a description (`cache: paged`).
    pub fn name(self) -> &'static str {
        match self {
            Cache::Contiguous => "contiguous",
            Cache::Paged => "paged",
        }
    }
}

/// An 8-bit float format of a decode's KV cache: four values packed in a u32 word (element
/// 4i + t in byte t), each the value divided by its KV head's scale (`kv_scales`, f32 run-time
/// values), rounded to nearest even and saturated to the largest finite value (no NaN, no
/// infinity is ever stored). The kernel widens them exactly and applies the scales to q·k
/// and to the P·V sum (so a head's scale costs two multiplies per row, not one per value).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fp8 {
    /// 4 exponent bits (bias 7), 3 mantissa bits; largest 448 (FlashAttention 3, vLLM).
    E4m3,
    /// 5 exponent bits (bias 15), 2 mantissa bits; largest 57344: range over precision.
    E5m2,
}

impl Fp8 {
    /// Both formats.
    pub const ALL: [Fp8; 2] = [Fp8::E4m3, Fp8::E5m2];

    /// The format's word in a description (`kv_cache: e4m3`).
    pub fn name(self) -> &'static str {
        match self {
            Fp8::E4m3 => "e4m3",
            Fp8::E5m2 => "e5m2",
        }
    }

    /// The format of a description's word, `None` for an unknown one.
    pub fn parse(word: &str) -> Option<Fp8> {
        Fp8::ALL.into_iter().find(|f| f.name() == word)
    }

    /// Mantissa bits.
    pub fn mantissa_bits(self) -> u32 {
        match self {
            Fp8::E4m3 => 3,
            Fp8::E5m2 => 2,
        }
    }

    /// The exponent bias.
    pub fn bias(self) -> u32 {
        match self {
            Fp8::E4m3 => 7,
            Fp8::E5m2 => 15,
        }
    }

    /// The largest finite value (what larger magnitudes saturate to).
    pub fn max(self) -> f32 {
        match self {
            Fp8::E4m3 => 448.0,
            Fp8::E5m2 => 57344.0,
        }
    }
}

/// Where the kernel must run, and so which limits and shader capabilities apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// What browsers accept under WebGPU's default limits.
    Webgpu,
    /// wgpu on a known adapter class: limits are stated by the description.
    Native(Limits),
}

/// The limits that a kernel's plan is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// Workgroup memory per workgroup, in bytes.
    pub workgroup_storage_bytes: u32,
    /// Storage buffers bound to one shader stage.
    pub storage_buffers_per_stage: u32,
    /// Uniform buffers bound to one shader stage.
    pub uniform_buffers_per_stage: u32,
    /// Invocations in one workgroup.
    pub invocations_per_workgroup: u32,
}

impl Limits {
    /// WebGPU's default limits (the spec's "default" column).
    pub const WEBGPU: Limits = Limits {
        workgroup_storage_bytes: 16384,
        storage_buffers_per_stage: 8,
        uniform_buffers_per_stage: 12,
        invocations_per_workgroup: 256,
    };
}

impl Target {
    /// The limits this target's kernels are checked against.
    pub fn limits(&self) -> Limits {
        match self {
            Target::Webgpu => Limits::WEBGPU,
            Target::Native(l) => *l,
        }
    }
}

/// The element type a kernel reads and writes its data tensors in (Q, K, V, O). The
/// arithmetic, the accumulators and the row statistics (LSE) are f32 in every dtype.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    #[default]
    /// IEEE single precision: every adapter.
    F32,
    /// IEEE half, through WGSL's `enable f16` (wgpu's SHADER_F16, an optional WebGPU
    /// feature).
    F16,
    /// bfloat16, stored as the upper halves of f32 bit patterns packed two to a u32 word
    /// (element 2i in the low half) and widened in the kernel: WGSL has no bf16 type.
    Bf16,
}

impl Dtype {
    /// Every dtype.
    pub const ALL: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::Bf16];

    /// Whether `op` runs its products on cooperative matrices (`matrix = coop16`, f16
    /// operands) in this dtype: f16 as it is; bf16 in the forward, the backward's halves and
    /// a continued cache's chunk, each row of every operand scaled by a power of two into
    /// f16's range (exact for every value within 2^31 of its row's largest; see
    /// `emit::coop_scale`). A chunk's rows have a width rule besides:
    /// [`crate::layout::coop::on_tensor_cores`].
    pub fn on_tensor_cores(self, op: Op) -> bool {
        match self {
            Dtype::F16 => true,
            Dtype::Bf16 => matches!(
                op,
                Op::Forward | Op::BackwardQ | Op::BackwardKv | Op::Extend
            ),
            Dtype::F32 => false,
        }
    }

    /// The dtype's word in a description (`dtype: bf16`).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
        }
    }

    /// Bytes per element in memory.
    pub fn bytes(self) -> u32 {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
        }
    }

    /// The dtype of a description's word, `None` for an unknown one.
    pub fn parse(word: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == word)
    }
}

/// How the workgroups of a kernel reach an output tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteMode {
    /// Exactly one workgroup writes each element.
    Owned,
    /// Many workgroups add into each element with atomics.
    AtomicScatter,
    /// An intermediate written in one layout for a consumer kernel of the other major.
    ScratchFlush,
}

impl WriteMode {
    /// The write mode's word in a description (`writes: { o: owned }`).
    pub fn name(self) -> &'static str {
        match self {
            WriteMode::Owned => "owned",
            WriteMode::AtomicScatter => "atomic",
            WriteMode::ScratchFlush => "scratch",
        }
    }
}

/// One kernel, fully specialized.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelSpec {
    /// Rust module name and WGSL label, e.g. `attention_forward`.
    pub name: String,
    /// What the kernel computes.
    pub op: Op,
    /// How its workgroups cover the work.
    pub grid: Grid,
    /// The compile-time width of a row: head_dim of attention, hidden of a row-wise layer.
    pub head_dim: u32,
    /// The width of an output row: the Linear's output of a row-wise layer; of attention,
    /// `head_dim_v`, the width of V, O, dO and dV rows (MLA's 128 beside Q and K's 192),
    /// 0 where it equals `head_dim`.
    #[serde(skip_serializing_if = "is_zero")]
    pub out_dim: u32,
    /// Query heads per KV head.
    pub gqa: Gqa,
    /// The masks and score modifiers, built in and user-written.
    pub masks: Masks,
    /// The limits the kernel is checked against.
    pub target: Target,
    /// The element type of the data tensors.
    #[serde(skip_serializing_if = "is_f32")]
    pub dtype: Dtype,
    /// Invocations per workgroup.
    pub workgroup_size: u32,
    /// Write mode of each output, by tensor name, as the description declares them.
    pub writes: Vec<(String, WriteMode)>,
    /// Where a backward_kv kernel gets P and dS.
    pub source: Source,
    /// How atomic outputs are added into.
    pub scatter: Scatter,
    /// How a decode's KV cache is laid out.
    #[serde(skip_serializing_if = "is_contiguous")]
    pub cache: Cache,
    /// A decode's (and a cache append's) KV cache in 8-bit floats; `None`: in `dtype`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_fp8: Option<Fp8>,
    /// A [`Op::Matmul`]'s operand layouts; `None` for every other op.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matmul: Option<MatmulForm>,
    /// An instrument, for a flash or tensor-core kernel: each workgroup counts itself in
    /// `resident` while it runs, and the most in flight at once is kept (how many the GPU
    /// holds).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub counts_residency: bool,
}

fn is_contiguous(c: &Cache) -> bool {
    *c == Cache::Contiguous
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_f32(d: &Dtype) -> bool {
    *d == Dtype::F32
}

impl KernelSpec {
    /// The width of V, O, dO and dV rows (attention) or of the Linear's output row.
    pub fn v_dim(&self) -> u32 {
        match self.out_dim {
            0 => self.head_dim,
            d => d,
        }
    }

    /// This attention kernel with V and O rows `head_dim_v` wide, named with `_v{dv}` where
    /// that differs from head_dim.
    pub fn with_head_dim_v(mut self, head_dim_v: u32) -> KernelSpec {
        if head_dim_v != self.head_dim {
            self.out_dim = head_dim_v;
            self.name = format!("{}_v{head_dim_v}", self.name);
        }
        self
    }

    /// Whether attention's V rows are narrower or wider than its Q and K rows.
    pub fn split_dims(&self) -> bool {
        !self.op.is_row_layer() && self.v_dim() != self.head_dim
    }

    /// The width at which the kernel's tiles and registers hold a row: the wider of Q/K's
    /// and V/O's, the narrower read as zeros past its end. Zero columns add nothing to
    /// Q·Kᵀ and come out of P·V as zero columns that are never stored.
    pub fn width(&self) -> u32 {
        match self.split_dims() {
            true => self.head_dim.max(self.v_dim()),
            false => self.head_dim,
        }
    }

    /// The storage buffers the modifiers add: the tensors they read, the gradients of
    /// those declared `grad` that this kernel writes, the block mask it reads and the report of
    /// reads out of range.
    pub fn flex_buffers(&self) -> u32 {
        self.flex().map_or(0, |f| {
            let grads = f.tensors.iter().filter_map(|t| t.grad_name());
            (f.tensors.len() + grads.filter(|g| self.write_mode(g).is_some()).count()) as u32
                + u32::from(self.reads_block_mask())
                + u32::from(f.report_reads)
        })
    }

    /// The user-written modifiers this kernel applies: its masks' for an op that compares
    /// queries with keys, none for the others (a backward's prep, a decode's reduce).
    pub fn flex(&self) -> Option<crate::flex::Flex> {
        self.masks
            .flex
            .filter(|_| self.op.takes_modifiers())
            .map(|f| f.get())
    }

    /// Whether the kernel reads a block mask (the `block_mask` binding): its modifiers ask
    /// for one and it skips tiles by a `mask_mod` that its key ranges do not hold exactly.
    pub fn reads_block_mask(&self) -> bool {
        // The tile loops: the flash schedules' and the split-K decode's (the per-row
        // schedules test every pair of their key range).
        let reader = match self.op {
            Op::Forward | Op::Extend | Op::BackwardQ | Op::BackwardKv => self.grid.flash.is_some(),
            Op::DecodeSplit => true,
            _ => false,
        };
        reader && self.tests_mask_pairs() && self.flex().is_some_and(|f| f.block_mask)
    }

    /// Whether the kernel tests `mask_mod` per pair: it has one that its key ranges do not
    /// already hold exactly.
    pub fn tests_mask_pairs(&self) -> bool {
        self.flex()
            .and_then(|f| f.mask_mod)
            .is_some_and(|m| !crate::flex::bounds::key_bounds(&m).exact)
    }

    /// Whether this is a split-K decode pass that combines its slices itself (it writes
    /// `o`): the last workgroup of each query group to flush merges the group's partials,
    /// with no reduce pass after it.
    pub fn combines_slices(&self) -> bool {
        self.op == Op::DecodeSplit && self.write_mode("o").is_some()
    }

    /// How `tensor` is written, `None` where the kernel does not write it.
    pub fn write_mode(&self, tensor: &str) -> Option<WriteMode> {
        self.writes
            .iter()
            .find(|(n, _)| n == tensor)
            .map(|(_, m)| *m)
    }

    /// The form of its products: the spec's, or [`MatmulForm::DEFAULT`].
    pub fn matmul_form(&self) -> MatmulForm {
        self.matmul.unwrap_or(MatmulForm::DEFAULT)
    }

    /// Whether the kernel computes in f16 (needs SHADER_F16): f16 data, f16 operands of
    /// cooperative matrices (bf16 data scaled into them), or a Linear's x or y in f16.
    pub fn uses_f16(&self) -> bool {
        let rows = self
            .matmul
            .is_some_and(|f| f.x == Dtype::F16 || f.y == Dtype::F16);
        self.dtype == Dtype::F16 || self.grid.uses_coop() || rows
    }

    /// Whether any output is added into by atomics.
    pub fn has_atomics(&self) -> bool {
        self.writes
            .iter()
            .any(|(_, m)| *m == WriteMode::AtomicScatter)
    }
}

/// A flash configuration: the tiling parameters of a flash grid, with the workgroup size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
pub struct FlashConfig {
    /// Rows of the major axis per workgroup.
    pub tile: u32,
    /// Rows of the other axis staged per step.
    pub inner: u32,
    /// Rows of the tile each invocation accumulates in registers.
    pub rows_per_thread: u32,
    /// Invocations per workgroup.
    pub workgroup_size: u32,
    /// Row reductions by subgroup shuffles ([`Grid::subgroups`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub subgroups: bool,
    /// Cooperative-matrix products ([`Matrix::Coop16`]).
    #[serde(default, skip_serializing_if = "Matrix::is_scalar")]
    pub matrix: Matrix,
}

impl FlashConfig {
    /// The configuration a [`FlashConfig::label`] names, e.g. `32x32/4@128+sg`.
    pub fn from_label(label: &str) -> Option<FlashConfig> {
        let (label, matrix) = match label.strip_suffix("+tc") {
            Some(rest) => (rest, Matrix::Coop16),
            None => (label, Matrix::Scalar),
        };
        let (label, subgroups) = match label.strip_suffix("+sg") {
            Some(rest) => (rest, true),
            None => (label, false),
        };
        let (tiles, workgroup_size) = label.split_once('@')?;
        let (tiles, rows_per_thread) = tiles.split_once('/')?;
        let (tile, inner) = tiles.split_once('x')?;
        Some(FlashConfig {
            tile: tile.parse().ok()?,
            inner: inner.parse().ok()?,
            rows_per_thread: rows_per_thread.parse().ok()?,
            workgroup_size: workgroup_size.parse().ok()?,
            subgroups,
            matrix,
        })
    }

    /// `tile x inner / rows_per_thread @ workgroup_size`, e.g. `32x32/4@128`, with `+sg`
    /// when the reductions use subgroups and `+tc` for cooperative-matrix (tensor core)
    /// products.
    pub fn label(&self) -> String {
        format!(
            "{}x{}/{}@{}{}{}",
            self.tile,
            self.inner,
            self.rows_per_thread,
            self.workgroup_size,
            if self.subgroups { "+sg" } else { "" },
            if self.matrix == Matrix::Coop16 {
                "+tc"
            } else {
                ""
            }
        )
    }
}
