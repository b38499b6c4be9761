//! The layout of the cooperative-matrix (tensor-core) flash kernels: fragment and subgroup
//! sizes, tile shapes, row strides, what lives in workgroup memory and how many bytes it
//! takes. The emitter (`emit::coop`, `emit::coop_backward`) writes WGSL to this layout.

use crate::spec::{Dtype, KernelSpec, Op};

/// Rows of a cooperative matrix, and so of a subgroup's share of the tile.
pub const FRAG: u32 = 16;
/// Invocations per subgroup the layout assumes: the runtime runs the kernel only on
/// adapters whose subgroups are exactly this size.
pub const SUBGROUP: u32 = 32;

/// Whether a kernel of `op` in `dtype` over rows `width` wide runs its products on
/// cooperative matrices: where the dtype does ([`Dtype::on_tensor_cores`]), and a bf16
/// chunk where each row lies in one subgroup ([`CoopTiling::scales_at_fetch`]).
pub fn on_tensor_cores(dtype: Dtype, op: Op, width: u32) -> bool {
    let at_fetch = dtype == Dtype::Bf16 && op == Op::Extend;
    dtype.on_tensor_cores(op) && (!at_fetch || row_in_subgroup(width))
}

/// Whether the `width / 4` invocations that fetch a row of `width` values, a vec4 each,
/// are consecutive lanes of one subgroup (`width / 4` divides [`SUBGROUP`]).
fn row_in_subgroup(width: u32) -> bool {
    width >= 4 && SUBGROUP.is_multiple_of(width / 4)
}

/// The layout of a cooperative-matrix flash forward.
#[derive(Clone, Copy, Debug)]
pub struct CoopTiling {
    /// Query rows per workgroup.
    pub br: u32,
    /// Keys per staged block.
    pub bc: u32,
    /// The width a row is held at: the wider of Q/K's and V/O's ([`KernelSpec::width`]).
    pub head_dim: u32,
    /// Subgroups per 16 query rows (1 or 2): two split each block's keys in Q·Kᵀ and
    /// head_dim in P·V, so each holds half the accumulators and a workgroup twice the
    /// subgroups to hide latency with.
    pub split: u32,
    /// 16-column fragments of a Q or K row, and those of a V or O row P·V sums over: the
    /// kernel's width but where attention's rows are narrower (MLA's 192 and 128); V's
    /// count stays the width's where the split cannot share its fragments evenly.
    pub qk_frags: u32,
    /// The V or O row's fragments, as [`qk_frags`](Self::qk_frags) says.
    pub v_frags: u32,
    /// The forward, or a half of the tiled backward (the emitter's `coop_backward`).
    pub op: Op,
    /// Whether the operands are bf16, scaled into f16 by a power of two per row, from the
    /// row maxima of the `row_scale` pass (the backward also keeps each accumulator's lazy
    /// row references).
    pub scaled: bool,
    /// Whether K and V are an fp8 cache's words of four values (a continued cache's chunk),
    /// fetched raw and widened exactly into f16 at their store; their scales multiply the
    /// scores and O, so the tiles hold no rounded product of a value and its scale.
    pub fp8: bool,
}

impl CoopTiling {
    /// The layout of `spec`, `None` where its grid does not run on cooperative matrices.
    pub fn of(spec: &KernelSpec) -> Option<CoopTiling> {
        let flash = spec.grid.flash?;
        let per_split = spec.grid.tile / FRAG * SUBGROUP;
        let split = (spec.workgroup_size / per_split.max(1)).max(1);
        let v_frags = match (spec.v_dim() / FRAG).is_multiple_of(split) {
            true => spec.v_dim() / FRAG,
            false => spec.width() / FRAG,
        };
        spec.grid.uses_coop().then_some(CoopTiling {
            br: spec.grid.tile,
            bc: flash.inner,
            head_dim: spec.width(),
            split,
            qk_frags: spec.head_dim / FRAG,
            v_frags,
            op: spec.op,
            scaled: spec.dtype == Dtype::Bf16,
            fp8: spec.kv_fp8.is_some(),
        })
    }

    /// How far a block's row max must pass the row's reference max before the reference
    /// moves (and O is rescaled): P = exp(s - m) is then at most e^threshold. Between
    /// moves a row's largest P is not the exact 1 it is with the exact running max, so it
    /// carries f16's rounding (2^-12 of the row's heaviest weight); rows of many keys see
    /// more stale references.
    ///
    /// A continued cache's chunk takes 1.0: its rows each see the whole cache, and with
    /// 5.5 an f16 chunk of 133 rows over a 300-row cache (h 8, kv 2, d 64, seed 2) missed
    /// the check's bound at 1.34x of it on an H200 (2026-11-29; a CPU emulation of the
    /// kernel's arithmetic matched 99.5% of that output bit for bit and gave 0.47x with
    /// the exact max); with 1.0 every decode row of seeds 1 and 2 passed (worst 0.76), at
    /// the same speed (`bench --decode 32768 --continued`, 32/8 heads, d 128: 0.171 /
    /// 0.189 / 0.462 / 3.121 ms at 4 / 16 / 64 / 512 rows against 0.172 / 0.186 / 0.457 /
    /// 3.138). The forward keeps FlashAttention-4's 5.5: at 1.0 its f16 forward at seq
    /// 4096, d 128 took 1.17 ms against 0.60 (rescaling through workgroup memory in most
    /// blocks of random scores), and its check rows average about 1.1x the exact max's error.
    pub fn rescale_threshold(&self) -> f32 {
        match self.op {
            Op::Extend => 1.0,
            _ => 5.5,
        }
    }

    /// Vec4s of each staged block tensor an invocation carries from global memory.
    pub fn carried(&self) -> u32 {
        (self.bc * self.head_dim / 4).div_ceil(self.workgroup_size())
    }

    /// Whether a backward half fetches each block's tensors into registers during the
    /// previous block's products: where they take few registers. On an H100 (fetched ahead
    /// / not): at the seeds' shape (d 64, 2 vec4s each) 0.141 / 0.153 ms for 64x32/16@256;
    /// at seq 4096, d 128 (4 vec4s) 2.836 / 2.739 ms, and 10.6 / 7.6 ms for 32x32/16@64 (16).
    pub fn prefetches(&self) -> bool {
        !self.op.is_forward() && self.carried() <= 2
    }

    /// Whether a block's bf16 words are held raw from their loads and converted at their
    /// store (always, with bf16 operands): converted as loaded, each load's latency was
    /// waited for before the next load issued (each sits in its own bounds test) or before
    /// the barrier or products that the loads should run ahead of. On an H100 at seq 4096,
    /// d 128 the bf16 forward took 1.81 ms converted as loaded, 1.06 at its store (f16
    /// 0.80); the bf16 backward, without its products (the phase model's *none*), 4.19 ms
    /// against f16's 1.20.
    pub fn converts_at_store(&self) -> bool {
        self.scaled
    }

    /// Whether bf16 rows take their scales from their own values as they are fetched (each
    /// row's largest magnitude reduced over the lanes that fetched it) rather than from the
    /// `row_scale` pass: a continued cache's chunk, whose cached rows no pass has seen.
    pub fn scales_at_fetch(&self) -> bool {
        self.scaled && self.op == Op::Extend
    }

    /// Fragments of a backward accumulator (dQ, dK: `v_rows` false; dV: true): its
    /// tensor's row where the subgroups of a split share them evenly, else the width's (the
    /// columns past the row sum zeros and are not stored).
    pub fn sum_frags(&self, v_rows: bool) -> u32 {
        match v_rows {
            true => self.v_frags,
            false if self.qk_frags.is_multiple_of(self.split) => self.qk_frags,
            false => self.head_dim / FRAG,
        }
    }

    /// Row strides, in elements, of the staged f16 rows, of S (f32) and of P (f16): each a
    /// multiple of 16 bytes, so that every 16x16 load and store starts 16-byte aligned.
    pub(crate) fn strides(&self) -> (u32, u32, u32) {
        (self.head_dim + 8, self.bc + 4, self.bc + 8)
    }

    /// Rows the f16 staging area holds: Q at the start (in column passes where its rows
    /// outnumber K's and V's), then K and V over it once Q's fragments are in registers.
    /// Q always lives in registers: held in workgroup memory (each subgroup reloading its
    /// fragments per block) it made the workgroup's memory the bound on how many run at
    /// once. On an H200 (2026-11-30, `bench --seq 4096 --heads 16 --kv-heads 16 --only
    /// phases`, f16) 64x32/16@256 at head_dim 64 went from one workgroup per SM to two and
    /// from 0.634 to 0.391 ms, 64x16/16@128 at 128 from one to two and 1.370 to 0.793; no
    /// configuration held in registers was more than 7% slower.
    pub(crate) fn staged_rows(&self) -> u32 {
        self.staged_over(self.block_rows())
    }

    /// [`Self::staged_rows`] where a block takes `block` staged rows.
    fn staged_over(&self, block: u32) -> u32 {
        match self.q_columns_over(block) < self.head_dim {
            true => block,
            false => self.br.max(block),
        }
    }

    /// Columns of Q staged per pass on its way into registers: all of head_dim where BR
    /// rows of it fit beside nothing larger than K and V, else the widest multiple of 16
    /// dividing head_dim whose BR rows (padded by 8 halves) fit in K's and V's rows (where
    /// none does, head_dim: one pass, the staging area then sized for BR rows). Every
    /// subgroup loads its fragments of each pass's columns, so the loads stay in
    /// workgroup-uniform control flow (a pass per row group would not).
    pub(crate) fn q_columns(&self) -> u32 {
        self.q_columns_over(self.block_rows())
    }

    /// [`Self::q_columns`] where a block takes `block` staged rows.
    fn q_columns_over(&self, block: u32) -> u32 {
        if self.br <= block {
            return self.head_dim;
        }
        let room = block * (self.head_dim + 8);
        (1..=self.head_dim / FRAG)
            .rev()
            .map(|n| n * FRAG)
            .find(|&cols| self.head_dim.is_multiple_of(cols) && self.br * (cols + 8) <= room)
            .unwrap_or(self.head_dim)
    }

    /// Whether Q is staged in column passes (then loaded into registers).
    pub(crate) fn q_in_passes(&self) -> bool {
        self.q_columns() < self.head_dim
    }

    /// The first staged rows of K and of V.
    pub(crate) fn kv_rows(&self) -> (u32, u32) {
        match self.v_over_k() {
            true => (0, 0),
            false => (0, self.bc),
        }
    }

    /// Whether the forward stages a block's V over its K once S is made (V's loads wait
    /// in registers until then), so that the staging area holds one block's rows rather
    /// than two: where K and V side by side would not fit within
    /// [`super::configs::CANDIDATE_WORKGROUP_BYTES`]. That lets the 128-row tile run at
    /// head_dim 256, where on an H200 (2026-11-30, `bench --seq 4096 --heads 16 --kv-heads
    /// 16 --head-dim 256 --only planned`, f16) the planner's pick went from 64x32/16@256 at
    /// 1.282 ms to 128x32/16@256 at 1.075. Where both fit it costs: V's stores wait for the
    /// scores' barrier, and at head_dim 128 no configuration gained more than 3% although
    /// several ran one more workgroup per SM (64x32/16@256 0.866 ms at two against 0.836 at
    /// one). Only where it makes the workgroup smaller: P then needs an area of its own,
    /// which for some tiles off the menu (128x48 at head_dim 32) outweighs the block saved.
    /// The limit is the candidates' 48 KiB, not the device's: on a device with more, the
    /// 128-row tile at head_dim 256 keeps V over K although both blocks would fit there.
    /// The scaled (bf16) forward notes each staged row's scales with its stores, and keeps
    /// both blocks (its emitter stages the two together).
    ///
    /// A continued cache's chunk also stages V over K where a tile of at most 32 rows then
    /// fits one more workgroup an SM: its few packed rows make each block a short chain of
    /// barriers, which only more workgroups in flight overlap. On an H200 (2026-12-03,
    /// `bench --decode 32768 --heads 32 --kv-heads 8 --head-dim 128 --continued`, f16, 4
    /// new rows, the configuration forced) 32x32/16@64 went from two an SM to three and
    /// from 0.179 to 0.125 ms; in a grid of one wave of three, 0.103. The larger tiles keep
    /// both blocks, as the forward's 64-row tile measured above.
    pub(crate) fn v_over_k(&self) -> bool {
        let apart = self.bytes_of(self.staged_over(2 * self.bc), self.p_fits_over_k());
        let over = self.bytes_of(self.staged_over(self.bc), false);
        let limit = super::configs::CANDIDATE_WORKGROUP_BYTES;
        let holds_more = self.op == Op::Extend
            && self.br <= 2 * FRAG
            && limit / over.max(1) > limit / apart.max(1);
        matches!(self.op, Op::Forward | Op::Extend)
            && !self.scaled
            && (apart > limit || holds_more)
            && over < apart
    }

    /// Staged rows of one block: K's and V's, or one block's where V goes over K.
    fn block_rows(&self) -> u32 {
        match self.v_over_k() {
            true => self.bc,
            false => 2 * self.bc,
        }
    }

    /// Invocations per workgroup: a subgroup per 16 query rows and split.
    pub fn workgroup_size(&self) -> u32 {
        self.br / FRAG * SUBGROUP * self.split
    }

    /// Bytes of workgroup memory the kernel declares.
    pub fn bytes(&self) -> u32 {
        match self.op {
            Op::Forward | Op::Extend => self.bytes_with(self.staged_rows()),
            _ => self.backward_bytes(),
        }
    }

    /// Whether the forward's P lives over K's staged rows rather than in an area of its
    /// own: wherever its rows fit there (K is free once S is made, and the softmax that
    /// writes P runs after the barrier that publishes S). Less memory lets more
    /// workgroups run at once: on an H200 (2026-11-30, as [`Self::staged_rows`]) it took
    /// 32x32/16@128 at head_dim 128 from one workgroup per SM to two and from 1.48 to
    /// 0.98 ms, 32x16/16@64 from three to four; where the count stayed, the time did.
    /// V over K takes those rows, and P then has an area of its own.
    pub(crate) fn p_over_k(&self) -> bool {
        self.p_fits_over_k() && !self.v_over_k()
    }

    /// Whether P's rows fit in K's staged rows.
    fn p_fits_over_k(&self) -> bool {
        let (ks, _, ps) = self.strides();
        matches!(self.op, Op::Forward | Op::Extend) && self.br * ps <= self.bc * ks
    }

    /// Workgroup memory with `staged` f16 rows: the staging area, S, P, the tile's key
    /// range and the rescale flag.
    fn bytes_with(&self, staged: u32) -> u32 {
        self.bytes_of(staged, self.p_over_k())
    }

    /// [`Self::bytes_with`], P over K or not.
    fn bytes_of(&self, staged: u32, p_over_k: bool) -> u32 {
        let (ks, ss, ps) = self.strides();
        let p = match p_over_k {
            true => 0,
            false => 2 * self.br * ps,
        };
        // The range and the rescale flag (16 bytes each); each row's rescale factor and sum
        // (sh_c, sh_l).
        2 * staged * ks + 4 * self.br * ss + p + 16 + 16 + 8 * self.br + self.scale_bytes()
    }

    /// With scaled operands: each staged key's two scales, and where they are taken at
    /// fetch each of the tile's rows of Q's maximum.
    fn scale_bytes(&self) -> u32 {
        match (self.scaled, self.scales_at_fetch()) {
            (true, true) => 4 * 2 * self.bc + 4 * self.br,
            (true, false) => 4 * 2 * self.bc,
            (false, _) => 0,
        }
    }

    /// What is wrong with this layout under `spec` (its workgroup size, its rows per
    /// thread: the rows of one subgroup), if anything.
    pub fn problem(&self, spec: &KernelSpec) -> Option<String> {
        let workgroup_size = spec.workgroup_size;
        let rows = spec.grid.flash.map_or(0, |f| f.rows_per_thread);
        let multiple = |what: &str, n: u32| {
            (!n.is_multiple_of(FRAG) || n == 0).then(|| {
                format!("cooperative-matrix products take {what} in multiples of {FRAG}, not {n}")
            })
        };
        multiple("the tile", self.br)
            .or_else(|| multiple("the key tile", self.bc))
            .or_else(|| multiple("head_dim", self.head_dim))
            .or_else(|| {
                (rows != FRAG).then(|| {
                    format!(
                        "with cooperative matrices each subgroup owns {FRAG} query rows: use \
                         rows_per_thread = {FRAG}, not {rows}"
                    )
                })
            })
            .or_else(|| {
                let one = self.br / FRAG * SUBGROUP;
                (workgroup_size != one && workgroup_size != 2 * one).then(|| {
                    format!(
                        "with cooperative matrices one or two subgroups of {SUBGROUP} \
                         invocations own {FRAG} query rows: tile {} needs workgroup_size {one} \
                         or {}, not {workgroup_size}",
                        self.br,
                        2 * one
                    )
                })
            })
            .or_else(|| {
                (self.scales_at_fetch() && !row_in_subgroup(self.head_dim)).then(|| {
                    format!(
                        "a bf16 chunk scales each cached row as it is fetched, over lanes of \
                         one subgroup: head_dim / 4 must divide {SUBGROUP} (head_dim 16, 32, \
                         64 or 128), not {}; drop `matrix = coop16` to run it on scalar tiles",
                        self.head_dim
                    )
                })
            })
            .or_else(|| {
                (self.scaled && self.fp8).then(|| {
                    "an fp8 cache's chunk on cooperative matrices takes f16 queries; use \
                     `dtype: f16`"
                        .to_string()
                })
            })
            .or_else(|| {
                let halves = |n: u32| (n / FRAG).is_multiple_of(self.split);
                (!halves(self.bc) || !halves(self.head_dim)).then(|| {
                    format!(
                        "two subgroups per {FRAG} rows split the key tile and head_dim in \
                         halves of whole {FRAG}-column fragments: key tile {} and head_dim {} \
                         must be multiples of {}",
                        self.bc,
                        self.head_dim,
                        2 * FRAG
                    )
                })
            })
    }

    /// Rows of the backward's f16 staging area: each owned tensor in turn (loaded into
    /// fragments before the next), then each block's two tensors over them.
    pub(crate) fn backward_staged_rows(&self) -> u32 {
        self.br.max(2 * self.bc)
    }

    /// The backward's workgroup memory: the f16 staging area, S and dP (f32), dS (and for
    /// the key-major half P and the block's (LSE, D)) and the tile's range.
    fn backward_bytes(&self) -> u32 {
        let (ks, ss, ps) = self.strides();
        let staged = self.backward_staged_rows() * ks * 2;
        let weights = match self.op {
            Op::BackwardKv => 2 * (2 * self.br * ps) + 8 * self.bc,
            _ => 2 * self.br * ps,
        };
        // With bf16 operands: the block rows' exponents, each accumulator's rescale
        // factors (two for the key-major half's dV and dK) and the flags.
        let scales = match self.scaled {
            true => 8 * self.bc + 2 * 4 * self.br + 16,
            false => 0,
        };
        staged + 2 * 4 * self.br * ss + weights + 16 + scales
    }
}
