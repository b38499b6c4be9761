//! The default kernel family, described once with `attention_kernel!`. The WGSL of each is
//! written to `generated/` and its expansion is snapshot-tested in `snapshots/`. A
//! description with `head_dim: [64, 128]` declares NAME (head_dim 64) and NAME_d128.

use std::borrow::Cow;

use attn_dsl::{DslError, KernelAbi, KernelSpec, Masks};
use attn_macros::attention_kernel;

attention_kernel! {
    /// Causal forward with document masking, head_dim 64 and 128: the seeds' production layer.
    pub attention_forward {
        op: forward,
        grid: s_major(tile = 1),
        head_dim: [64, 128],
        gqa: any,
        masks: [causal, document],
        target: webgpu,
        workgroup_size: 256,
        writes: { o: owned, lse: owned },
    }
}

attention_kernel! {
    /// One query row per head against a KV cache, head_dim 64 and 128.
    pub attention_decode {
        op: decode,
        grid: head_major,
        head_dim: [64, 128],
        gqa: any,
        target: webgpu,
        workgroup_size: 256,
        writes: { o: owned },
    }
}

attention_kernel! {
    /// Split-K decode, pass 1, head_dim 64 and 128: one workgroup per (cache slice, KV head) for up
    /// to 4 of its query heads, so each slice of K and V is read once for all of them; it
    /// flushes each head's partial softmax (unnormalized output, max, sum) to scratch.
    pub attention_decode_split {
        op: decode_split,
        grid: slice_major(tile = 4),
        head_dim: [64, 128],
        gqa: any,
        target: webgpu,
        workgroup_size: 256,
        writes: { partials: scratch },
    }
}

attention_kernel! {
    /// Split-K decode, pass 2, head_dim 64 and 128: each head's output owned by one workgroup,
    /// combined from the slices' partials.
    pub attention_decode_reduce {
        op: decode_reduce,
        grid: head_major,
        head_dim: [64, 128],
        gqa: any,
        target: webgpu,
        workgroup_size: 256,
        source: scratch(attention_decode_split),
        writes: { o: owned },
    }
}

attention_kernel! {
    /// Split-K decode, pass 1, head_dim 64 and 128, reading a paged cache through a block table
    /// (its pass 2 is `attention_decode_reduce`).
    pub attention_decode_split_paged {
        op: decode_split,
        grid: slice_major(tile = 4),
        head_dim: [64, 128],
        gqa: any,
        target: webgpu,
        workgroup_size: 256,
        cache: paged,
        writes: { partials: scratch },
    }
}

attention_kernel! {
    /// Split-K decode, pass 1, streamed: head_dim 128, Q, the cache and O in f16, key groups
    /// of lanes that each keep an online softmax of their keys, summing a key's dot
    /// products by subgroup shuffles (`slice_major(flash)`: the layout by rule; native, on
    /// adapters with SUBGROUP). Its pass 2 is the f16 `attention_decode_reduce_d128`'s
    /// description.
    pub attention_decode_stream_f16_d128 {
        op: decode_split,
        grid: slice_major(flash),
        head_dim: 128,
        gqa: any,
        target: native(workgroup_storage = 16384, storage_buffers = 8),
        dtype: f16,
        writes: { partials: scratch },
    }
}

attention_kernel! {
    /// Split-K decode, pass 1, staged, head_dim 128, Q, the cache and O in f16, each key's
    /// lanes and the slice's max and sum reduced by subgroup operations (native, on
    /// adapters with SUBGROUP): the runtime builds its staged pass this way there, its
    /// slices as long as the device's workgroup memory holds. Its pass 2 is the f16
    /// `attention_decode_reduce_d128`'s description.
    pub attention_decode_split_sg_f16_d128 {
        op: decode_split,
        grid: slice_major(tile = 4, subgroups = true),
        head_dim: 128,
        gqa: any,
        target: native(workgroup_storage = 16384, storage_buffers = 8),
        workgroup_size: 256,
        dtype: f16,
        writes: { partials: scratch },
    }
}

attention_kernel! {
    /// Split-K decode in one dispatch, head_dim 128, Q, the cache and O in f16: the staged
    /// pass with subgroup sums, whose last workgroup of each query group to flush merges the
    /// group's slices into O as the reduce would (native only: a backend's device-scope
    /// barrier orders the other workgroups' stores before its loads, which WGSL alone does
    /// not). The runtime takes it where the split grid is one wave of workgroups.
    pub attention_decode_split_combined_f16_d128 {
        op: decode_split,
        grid: slice_major(tile = 4, subgroups = true),
        head_dim: 128,
        gqa: any,
        target: native(workgroup_storage = 16384, storage_buffers = 8),
        workgroup_size: 256,
        dtype: f16,
        writes: { partials: scratch, o: owned },
    }
}

attention_kernel! {
    /// Split-K decode, pass 1, head_dim 128, Q and O in f16, the cache in e4m3 bytes (four
    /// to a word) with a scale per KV head for K and for V (`runtime::ops::cache::KvCache`
    /// with `kv_fp8`); its pass 2 is the f16 `attention_decode_reduce`.
    pub attention_decode_split_e4m3 {
        op: decode_split,
        grid: slice_major(tile = 4),
        head_dim: 128,
        gqa: any,
        target: webgpu,
        workgroup_size: 256,
        dtype: f16,
        kv_cache: e4m3,
        writes: { partials: scratch },
    }
}

attention_kernel! {
    /// Backward preparation, head_dim 64 and 128: packs LSE and D = rowsum(dO ∘ O) into `stats`
    /// [2, s, h] for every backward schedule.
    pub attention_backward_prep {
        op: backward_prep,
        grid: s_major(tile = 1),
        head_dim: [64, 128],
        target: webgpu,
        workgroup_size: head_dim,
        writes: { stats: owned },
    }
}

attention_kernel! {
    /// Split schedule (a), producer, head_dim 64 and 128: dQ owned, P and dS flushed to the scratch
    /// `p_ds` [2, s, h, j].
    pub attention_backward_short {
        op: backward_q,
        grid: s_major(tile = 1),
        head_dim: [64, 128],
        gqa: any,
        masks: [causal, document],
        target: webgpu,
        workgroup_size: 256,
        writes: { dq: owned, p_ds: scratch },
    }
}

attention_kernel! {
    /// Split schedule (a), consumer, head_dim 64 and 128: dK and dV owned from the scratch P and dS.
    pub attention_backward_short_dkdv {
        op: backward_kv,
        grid: j_major(tile = 1),
        head_dim: [64, 128],
        gqa: any,
        masks: [causal, document],
        target: webgpu,
        workgroup_size: 256,
        source: scratch(attention_backward_short),
        writes: { dk: owned, dv: owned },
    }
}

attention_kernel! {
    /// Streaming schedule (b), head_dim 64: query tiles own dQ; per staged block of keys,
    /// dK and dV summed over the tile's rows are added by atomic scatter into `dkv`
    /// [2, j, kv_h, d] (a compare-exchange loop in `ABI`, native f32 atomics in
    /// `ABI_F32_ATOMIC`). No scratch. `flash` picks the tiling by rule: the query-tile half
    /// of candidate 0 of `tuning::backward_candidates(64)`.
    pub attention_backward {
        op: backward_q,
        grid: s_major(flash),
        head_dim: 64,
        gqa: any,
        masks: [causal, document],
        target: webgpu,
        writes: { dq: owned, dkv: atomic },
    }
}

attention_kernel! {
    /// Recompute-split schedule (d), dQ half, head_dim 64 and 128: recomputes P; no scratch, no atomics.
    pub attention_backward_dq {
        op: backward_q,
        grid: s_major(tile = 1),
        head_dim: [64, 128],
        gqa: any,
        masks: [causal, document],
        target: webgpu,
        workgroup_size: 256,
        writes: { dq: owned },
    }
}

attention_kernel! {
    /// Recompute-split schedule (d), dK/dV half, head_dim 64 and 128: recomputes P and dS per key row.
    pub attention_backward_dkdv {
        op: backward_kv,
        grid: j_major(tile = 1),
        head_dim: [64, 128],
        gqa: any,
        masks: [causal, document],
        target: webgpu,
        workgroup_size: 256,
        source: recompute,
        writes: { dk: owned, dv: owned },
    }
}

attention_kernel! {
    /// RoPE, in place on Q (`n_heads`) or K (`n_kv_heads`), head_dim 64 and 128.
    pub rope {
        op: rope,
        grid: s_major(tile = 1),
        head_dim: [64, 128],
        target: webgpu,
        workgroup_size: head_dim,
        writes: { x: owned },
    }
}

attention_kernel! {
    /// The backward of RoPE (rotation by minus the angle), head_dim 64 and 128.
    pub rope_backward {
        op: rope_backward,
        grid: s_major(tile = 1),
        head_dim: [64, 128],
        target: webgpu,
        workgroup_size: head_dim,
        writes: { x: owned },
    }
}

attention_kernel! {
    /// Flash forward, head_dim 64 and 128, the tiling the rules pick for WebGPU's defaults:
    /// candidate 0 of `tuning::forward_candidates(64)`, within 16 KiB of workgroup memory.
    pub attention_forward_flash {
        op: forward,
        grid: s_major(flash),
        head_dim: [64, 128],
        gqa: any,
        masks: [causal, document],
        target: webgpu,
        writes: { o: owned, lse: owned },
    }
}

attention_kernel! {
    /// Flash forward, head_dim 64, with f16 Q, K, V and O (f32 arithmetic and LSE): needs
    /// WebGPU's optional shader-f16 feature.
    pub attention_forward_flash_f16 {
        op: forward,
        grid: s_major(flash),
        head_dim: 64,
        gqa: any,
        masks: [causal, document],
        target: webgpu,
        dtype: f16,
        writes: { o: owned, lse: owned },
    }
}

attention_kernel! {
    /// Flash forward, head_dim 64, with bf16 Q, K, V and O packed two to a u32 word (core
    /// WebGPU: no feature needed).
    pub attention_forward_flash_bf16 {
        op: forward,
        grid: s_major(flash),
        head_dim: 64,
        gqa: any,
        masks: [causal, document],
        target: webgpu,
        dtype: bf16,
        writes: { o: owned, lse: owned },
    }
}

attention_kernel! {
    /// Flash forward with MLA's widths (DeepSeek-V2/V3): Q and K rows of 192, V and O rows of
    /// 128 (`head_dim_v`), under WebGPU's defaults.
    pub attention_forward_flash_mla {
        op: forward,
        grid: s_major(flash),
        head_dim: 192,
        head_dim_v: 128,
        gqa: any,
        masks: [causal, document],
        target: webgpu,
        writes: { o: owned, lse: owned },
    }
}

attention_kernel! {
    /// Flash forward, head_dim 64, with row reductions by subgroup shuffles: 64 query rows
    /// per workgroup, 4 per invocation, 8 invocations per row. Needs SUBGROUP and 36,628
    /// bytes of workgroup memory; on adapters whose subgroups are narrower than 8 it
    /// reduces through workgroup memory instead. The runtime compiles the same
    /// description per candidate tiling (`plan::kernels::flash_forward`).
    pub attention_forward_flash_sg {
        op: forward,
        grid: s_major(tile = 64, key_tile = 32, rows_per_thread = 4, subgroups = true),
        head_dim: 64,
        gqa: any,
        masks: [causal, document],
        target: native(workgroup_storage = 36628),
        workgroup_size: 128,
        writes: { o: owned, lse: owned },
    }
}

attention_kernel! {
    /// Flash forward on tensor cores, head_dim 128, f16: Q·Kᵀ and P·V as 16x16x16
    /// cooperative-matrix products (f32 accumulators), two subgroups of 32 per 16 query
    /// rows (splitting the block's keys, then head_dim), 32 keys per block. Needs EXPERIMENTAL_COOPERATIVE_MATRIX with f16 x f16 -> f32
    /// at 16x16x16, SHADER_F16, and subgroups of exactly 32 (`Gpu::has_coop16`); the
    /// runtime plans it for f16 forwards where the device has them
    /// (`tuning::Table::forward`).
    pub attention_forward_flash_tc_d128 {
        op: forward,
        grid: s_major(tile = 64, key_tile = 32, rows_per_thread = 16, matrix = coop16),
        head_dim: 128,
        gqa: any,
        masks: [causal, document],
        target: native(workgroup_storage = 27168),
        workgroup_size: 256,
        dtype: f16,
        writes: { o: owned, lse: owned },
    }
}

attention_kernel! {
    /// A continued cache's chunk on tensor cores, head_dim 128, f16: n new rows per
    /// sequence (their K and V appended) attend to their slot's whole cache, row r at
    /// position `seq_lens[slot] - n + r`, in the tensor-core forward's 64-row tiles. What
    /// `runtime::ops::decode::Decode` runs for calls of many rows (`ops::extend`).
    pub attention_extend_tc_d128 {
        op: extend,
        masks: [causal],
        grid: s_major(tile = 64, key_tile = 32, rows_per_thread = 16, matrix = coop16),
        head_dim: 128,
        gqa: any,
        target: native(workgroup_storage = 27168),
        workgroup_size: 256,
        dtype: f16,
        writes: { o: owned, lse: owned },
    }
}

attention_kernel! {
    /// The same chunk with the cache's keys cut into slices (the grid's third axis is
    /// sequence × slice): each slice's rows flush their unnormalized outputs and (m, l) in
    /// split-K decode's record layout, which `attention_decode_reduce_d128` merges (and
    /// where the sinks join). What the runtime runs when the query tiles alone would leave
    /// the GPU idle.
    pub attention_extend_sliced_tc_d128 {
        op: extend,
        masks: [causal],
        grid: s_major(tile = 64, key_tile = 32, rows_per_thread = 16, matrix = coop16),
        head_dim: 128,
        gqa: any,
        target: native(workgroup_storage = 27168),
        workgroup_size: 256,
        dtype: f16,
        writes: { partials: scratch },
    }
}

attention_kernel! {
    /// The sliced chunk with a KV head's query heads packed into its tiles: tile row p is
    /// position p / group of query head p % group, so a few rows per sequence (4 rows of
    /// 32 heads over 8 fill 16 rows) still fill a tile, and the query heads sharing a KV
    /// head stage its K and V once. What the runtime runs where a head's rows fill less
    /// than a tile (`ops::extend`).
    pub attention_extend_sliced_packed_tc_d128 {
        op: extend,
        masks: [causal],
        grid: s_major(tile = 64, key_tile = 32, rows_per_thread = 16, matrix = coop16, pack_heads = true),
        head_dim: 128,
        gqa: any,
        target: native(workgroup_storage = 27168),
        workgroup_size: 256,
        dtype: f16,
        writes: { partials: scratch },
    }
}

attention_kernel! {
    /// The same over a paged cache on scalar flash tiles, head_dim 64, f32: its keys found
    /// through the block table.
    pub attention_extend_paged {
        op: extend,
        masks: [causal],
        grid: s_major(flash),
        head_dim: 64,
        gqa: any,
        target: webgpu,
        cache: paged,
        writes: { o: owned, lse: owned },
    }
}

attention_kernel! {
    /// The tiled recompute split on tensor cores, dQ half, head_dim 128: S = Q·Kᵀ, dP = dO·Vᵀ
    /// and dQ += dS·K as f16 cooperative-matrix products into f32, 64 query rows by two
    /// subgroups per 16; it packs LSE and D (dO·O on the tensor cores) into `stats` itself,
    /// so the schedule runs without the prep. The planner's first half-precision backward
    /// where the device has cooperative matrices (`tuning::backward_configs`).
    pub attention_backward_dq_flash_tc_d128 {
        op: backward_q,
        grid: s_major(tile = 64, key_tile = 32, rows_per_thread = 16, matrix = coop16),
        head_dim: 128,
        gqa: any,
        masks: [causal, document],
        target: native(workgroup_storage = 40976, storage_buffers = 9),
        workgroup_size: 256,
        dtype: f16,
        writes: { dq: owned },
    }
}

attention_kernel! {
    /// Its dK/dV half: 64 key rows, K and V held as fragments for every query head of the
    /// KV head, Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, dV += Pᵀ·dO and dK += dSᵀ·Q.
    pub attention_backward_dkdv_flash_tc_d128 {
        op: backward_kv,
        grid: j_major(tile = 64, query_tile = 32, rows_per_thread = 16, matrix = coop16),
        head_dim: 128,
        gqa: any,
        masks: [causal, document],
        target: native(workgroup_storage = 46352),
        workgroup_size: 256,
        dtype: f16,
        source: recompute,
        writes: { dk: owned, dv: owned },
    }
}

attention_kernel! {
    /// The tiled backward's dK/dV half on tensor cores spread over query heads (the
    /// `scattered` schedule), head_dim 64: a workgroup per 64 key rows and query head adds
    /// its dK and dV by atomics (a compare-exchange loop in `ABI`, native f32 atomics in
    /// `ABI_F32_ATOMIC`), so the seeds' 12 heads over 4 fill three times the workgroups.
    pub attention_backward_dkdv_flash_scattered_tc {
        op: backward_kv,
        grid: j_major(tile = 64, query_tile = 32, rows_per_thread = 16, matrix = coop16),
        head_dim: 64,
        gqa: any,
        masks: [causal, document],
        target: native(workgroup_storage = 38160),
        workgroup_size: 256,
        dtype: f16,
        source: recompute,
        writes: { dk: atomic, dv: atomic },
    }
}

attention_kernel! {
    /// Tiled recompute split, dQ half, head_dim 64 and 128: query tiles with Q and dO staged, K and
    /// V staged a block of keys at a time (candidate 0 of the backward configurations).
    pub attention_backward_dq_flash {
        op: backward_q,
        grid: s_major(flash),
        head_dim: [64, 128],
        gqa: any,
        masks: [causal, document],
        target: webgpu,
        writes: { dq: owned },
    }
}

attention_kernel! {
    /// Tiled recompute split, dK/dV half, head_dim 64 and 128: key tiles with K and V staged, Q and
    /// dO staged a block of queries at a time (candidate 0).
    pub attention_backward_dkdv_flash {
        op: backward_kv,
        grid: j_major(flash),
        head_dim: [64, 128],
        gqa: any,
        masks: [causal, document],
        target: webgpu,
        source: recompute,
        writes: { dk: owned, dv: owned },
    }
}

attention_kernel! {
    /// Flash backward (schedule (c)), head_dim 64: key tiles own dK and dV, Q and dO staged
    /// a block of queries at a time, dQ added by atomics (candidate 0's key-tile half). With the document mask it binds 9
    /// storage buffers, one over WebGPU's default, hence the native target. The runtime
    /// compiles the same description per candidate tiling (`plan::kernels::flash_scatter`).
    pub attention_backward_flash {
        op: backward_kv,
        grid: j_major(flash),
        head_dim: 64,
        gqa: any,
        masks: [causal, document],
        target: native(storage_buffers = 9),
        source: recompute,
        writes: { dk: owned, dv: owned, dq: atomic },
    }
}

attention_kernel! {
    /// The fused LayerNorm + Linear forward at a real layer's widths, 768 -> 3072:
    /// 64 rows × 64 outputs per workgroup. Portable (8 storage buffers, under 10 KiB of
    /// workgroup memory). The runtime compiles the same description for other widths
    /// (`runtime::ops::layernorm`).
    pub layernorm_linear {
        op: layernorm_linear,
        grid: r_major(tile = 64),
        hidden: 768,
        out: 3072,
        target: webgpu,
        workgroup_size: 256,
        writes: { y: owned, mean: owned, rstd: owned },
    }
}

attention_kernel! {
    /// A Linear at a decode step's few rows, 768 -> 3072, W held in f16: each weight read
    /// once for both rows (`runtime::ops::linear::Linear` compiles the same description for
    /// other widths, weight dtypes and row counts).
    pub linear_rows_f16 {
        op: linear_rows,
        grid: r_major(tile = 2),
        hidden: 768,
        out: 3072,
        target: webgpu,
        workgroup_size: 256,
        dtype: f16,
        writes: { y: owned },
    }
}

attention_kernel! {
    /// The LayerNorm + Linear backward's first kernel, 768 -> 3072, two-pass: dx, and dγ
    /// and dβ as one partial per dx block, for row tiles of 64 rows (what the runtime
    /// compiles for up to 448 rows at these widths). Portable: 7 storage buffers, the rows'
    /// statistics recomputed from x rather than bound.
    pub layernorm_linear_backward {
        op: layernorm_linear_backward,
        grid: r_major(tile = 64),
        hidden: 768,
        out: 3072,
        target: webgpu,
        workgroup_size: 256,
        writes: { dx: owned, dgamma: scratch, dbeta: scratch },
    }
}

attention_kernel! {
    /// The backward's second kernel, beside the first: dW and db as one partial per row
    /// tile of 64 rows. Portable: 8 storage buffers.
    pub layernorm_linear_weight_grad {
        op: layernorm_linear_weight_grad,
        grid: r_major(tile = 64),
        hidden: 768,
        out: 3072,
        target: webgpu,
        workgroup_size: 256,
        writes: { dw: scratch, db: scratch },
    }
}

attention_kernel! {
    /// The second pass of the LayerNorm + Linear backward's two-pass schedule, 768 -> 3072:
    /// one invocation per element of dγ, dβ, dW and db sums its partials. Portable.
    pub layernorm_linear_reduce {
        op: layernorm_linear_reduce,
        grid: elementwise,
        hidden: 768,
        out: 3072,
        target: webgpu,
        workgroup_size: 256,
        writes: { dgamma: owned, dbeta: owned, dw: owned, db: owned },
    }
}

attention_kernel! {
    /// Attention states merged, head_dim 128, O in f16 (`runtime::ops::merge::Merge`): the
    /// outputs and LSEs of attention over parts of the keys, stacked part-major, into those
    /// of attention over all of them; an invocation per vec4 of output. Portable.
    pub attention_merge {
        op: merge,
        grid: elementwise,
        head_dim: 128,
        target: webgpu,
        workgroup_size: 256,
        dtype: f16,
        writes: { o: owned, lse: owned },
    }
}

attention_kernel! {
    /// Appends rows of K and V to a contiguous KV cache on the device, head_dim 64: row s of
    /// sequence b lands at `seq_lens[slot0 + b] + s`, and every slot's length, advanced, is
    /// written to `seq_lens_next` in the same dispatch (`runtime::ops::cache::KvCache`).
    pub attention_cache_append {
        op: cache_append,
        grid: elementwise,
        head_dim: 64,
        target: webgpu,
        workgroup_size: 256,
        writes: { k_cache: owned, v_cache: owned, seq_lens_next: owned },
    }
}

attention_kernel! {
    /// Appends f16 rows to an e4m3 cache, head_dim 128: each value over its KV head's scale,
    /// rounded to nearest even and saturated, four to a word.
    pub attention_cache_append_e4m3 {
        op: cache_append,
        grid: elementwise,
        head_dim: 128,
        target: webgpu,
        workgroup_size: 256,
        dtype: f16,
        kv_cache: e4m3,
        writes: { k_cache: owned, v_cache: owned, seq_lens_next: owned },
    }
}

attention_kernel! {
    /// The same append into a paged cache (a pool of pages and a block table), head_dim 64.
    pub attention_cache_append_paged {
        op: cache_append,
        grid: elementwise,
        head_dim: 64,
        target: webgpu,
        workgroup_size: 256,
        cache: paged,
        writes: { k_cache: owned, v_cache: owned, seq_lens_next: owned },
    }
}

attention_kernel! {
    /// Split-K decode, pass 1, with MLA's widths: K rows of 192 and V rows of 128 in a paged
    /// cache (its pass 2 is `attention_decode_reduce_d128`'s description at these widths).
    pub attention_decode_split_paged_mla {
        op: decode_split,
        grid: slice_major(tile = 4),
        head_dim: 192,
        head_dim_v: 128,
        gqa: any,
        target: webgpu,
        workgroup_size: 256,
        cache: paged,
        writes: { partials: scratch },
    }
}

attention_kernel! {
    /// The append into a paged cache of MLA's widths: K rows of 192, V rows of 128.
    pub attention_cache_append_paged_mla {
        op: cache_append,
        grid: elementwise,
        head_dim: 192,
        head_dim_v: 128,
        target: webgpu,
        workgroup_size: 256,
        cache: paged,
        writes: { k_cache: owned, v_cache: owned, seq_lens_next: owned },
    }
}

/// The kernels of one backward specialization (one head_dim and mask set), by schedule:
/// borrowed from the family's statics, or compiled at run time by [`BackwardKernels::compile`].
pub struct BackwardKernels {
    /// The pass before the halves: each row's D = dO·O, packed with its LSE into `stats`.
    pub prep: Cow<'static, KernelAbi>,
    /// The split schedule's query-major half: dQ, with P and dS flushed to scratch.
    pub split_q: Cow<'static, KernelAbi>,
    /// The split schedule's key-major half: dK and dV from the scratch `split_q` flushed.
    pub split_kv: Cow<'static, KernelAbi>,
    /// The recompute schedule's query-major half: dQ, recomputing P.
    pub recompute_q: Cow<'static, KernelAbi>,
    /// The recompute schedule's key-major half: dK and dV, recomputing P.
    pub recompute_kv: Cow<'static, KernelAbi>,
}

impl BackwardKernels {
    /// Every kernel of the set.
    pub fn all(&self) -> [&KernelAbi; 5] {
        [
            &self.prep,
            &self.split_q,
            &self.split_kv,
            &self.recompute_q,
            &self.recompute_kv,
        ]
    }

    /// The same set as the family's descriptions, for any head_dim and masks, compiled (and
    /// naga-validated) now.
    ///
    /// Q and K rows are `dims.0` wide, V, O, dO and dV rows `dims.1` (MLA's 192 and 128).
    pub fn compile(dims: (u32, u32), masks: Masks) -> Result<BackwardKernels, DslError> {
        // The set a forward description implies ([`attn_dsl::implied`]), each kernel given
        // the limits it needs where WebGPU's defaults do not hold it.
        let build = |mut s: KernelSpec| {
            s.fit_target();
            attn_dsl::compile(&s).map(Cow::Owned)
        };
        let [prep, split_q, split_kv, recompute_q, recompute_kv] =
            attn_dsl::implied::backward(dims, masks);
        Ok(BackwardKernels {
            prep: build(prep)?,
            split_q: build(split_q)?,
            split_kv: build(split_kv)?,
            recompute_q: build(recompute_q)?,
            recompute_kv: build(recompute_kv)?,
        })
    }
}

macro_rules! backward_kernels {
    ($prep:ident, $short:ident, $short_kv:ident, $dq:ident, $dkdv:ident) => {
        BackwardKernels {
            prep: Cow::Borrowed(&$prep::ABI),
            split_q: Cow::Borrowed(&$short::ABI),
            split_kv: Cow::Borrowed(&$short_kv::ABI),
            recompute_q: Cow::Borrowed(&$dq::ABI),
            recompute_kv: Cow::Borrowed(&$dkdv::ABI),
        }
    };
}

/// Backward kernels for head_dim 64 and 128.
pub static BACKWARD: [BackwardKernels; 2] = [
    backward_kernels!(
        attention_backward_prep,
        attention_backward_short,
        attention_backward_short_dkdv,
        attention_backward_dq,
        attention_backward_dkdv
    ),
    backward_kernels!(
        attention_backward_prep_d128,
        attention_backward_short_d128,
        attention_backward_short_dkdv_d128,
        attention_backward_dq_d128,
        attention_backward_dkdv_d128
    ),
];

/// Split-K decode (pass 1, pass 2) for head_dim 64 and 128.
pub static DECODE_SPLIT: [(&attn_dsl::KernelAbi, &attn_dsl::KernelAbi); 2] = [
    (&attention_decode_split::ABI, &attention_decode_reduce::ABI),
    (
        &attention_decode_split_d128::ABI,
        &attention_decode_reduce_d128::ABI,
    ),
];

/// Split-K decode over a paged cache (pass 1, pass 2) for head_dim 64 and 128.
pub static DECODE_SPLIT_PAGED: [(&attn_dsl::KernelAbi, &attn_dsl::KernelAbi); 2] = [
    (
        &attention_decode_split_paged::ABI,
        &attention_decode_reduce::ABI,
    ),
    (
        &attention_decode_split_paged_d128::ABI,
        &attention_decode_reduce_d128::ABI,
    ),
];

/// RoPE kernels (forward, backward) for head_dim 64 and 128.
pub static ROPE: [(&attn_dsl::KernelAbi, &attn_dsl::KernelAbi); 2] = [
    (&rope::ABI, &rope_backward::ABI),
    (&rope_d128::ABI, &rope_backward_d128::ABI),
];

/// Every portable kernel of the default family, in the order `generated/manifest.json`
/// lists them. (The native-f32-atomic variants are left out: browsers have no
/// `atomic<f32>`; so is streaming at head_dim 128, whose tiles of 16 rows need more than
/// WebGPU's 16 KiB of workgroup memory.)
pub static FAMILY: [&attn_dsl::KernelAbi; 45] = [
    &attention_forward::ABI,
    &attention_forward_d128::ABI,
    &attention_decode::ABI,
    &attention_decode_d128::ABI,
    &attention_decode_split::ABI,
    &attention_decode_reduce::ABI,
    &attention_decode_split_d128::ABI,
    &attention_decode_reduce_d128::ABI,
    &attention_decode_split_paged::ABI,
    &attention_decode_split_paged_d128::ABI,
    &attention_backward_prep::ABI,
    &attention_backward_short::ABI,
    &attention_backward_short_dkdv::ABI,
    &attention_backward::ABI,
    &attention_backward_dq::ABI,
    &attention_backward_dkdv::ABI,
    &attention_backward_prep_d128::ABI,
    &attention_backward_short_d128::ABI,
    &attention_backward_short_dkdv_d128::ABI,
    &attention_backward_dq_d128::ABI,
    &attention_backward_dkdv_d128::ABI,
    &rope::ABI,
    &rope_backward::ABI,
    &rope_d128::ABI,
    &rope_backward_d128::ABI,
    &attention_forward_flash::ABI,
    &attention_forward_flash_d128::ABI,
    &attention_forward_flash_f16::ABI,
    &attention_forward_flash_bf16::ABI,
    &attention_forward_flash_mla::ABI,
    &attention_backward_dq_flash::ABI,
    &attention_backward_dkdv_flash::ABI,
    &attention_backward_dq_flash_d128::ABI,
    &attention_backward_dkdv_flash_d128::ABI,
    &layernorm_linear::ABI,
    &layernorm_linear_backward::ABI,
    &layernorm_linear_weight_grad::ABI,
    &layernorm_linear_reduce::ABI,
    &attention_cache_append::ABI,
    &attention_cache_append_paged::ABI,
    &attention_decode_split_e4m3::ABI,
    &attention_cache_append_e4m3::ABI,
    &attention_decode_split_paged_mla::ABI,
    &attention_cache_append_paged_mla::ABI,
    &attention_merge::ABI,
];
