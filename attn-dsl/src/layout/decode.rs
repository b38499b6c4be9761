//! The layout of split-K decode: query heads per workgroup, keys per scoring step, the
//! longest slice a workgroup's memory holds, and the bytes it takes.

use crate::spec::{KernelSpec, Op};

/// Query heads one split workgroup serves: the four components of a vec4.
pub const MAX_SPLIT_HEADS: u32 = 4;

/// The most keys one slice holds (its scores are staged in workgroup memory); fewer where
/// the workgroup memory of the target does not hold that many (WebGPU's 16 KiB holds 608 at
/// head_dim 128). Measured on an H200 (2026-11-30, `bench --decode --slice-len`, 32 query
/// heads over 8, d 128, f16, the whole decode): slices of 1024 keys against 512 took 0.070
/// against 0.082 ms at a 32k cache, 0.206 against 0.233 at 128k and 0.372 against 0.414 at
/// 32k with 8 sequences; slices of 2048 were slower than either (0.090, 0.273, 0.508).
pub const SLICE_CAP: u32 = 1024;

/// The most keys one slice of the streamed pass holds: it stages nothing, so only the
/// slicing rule bounds it; this keeps each group's chain of sums within a few hundred
/// terms.
pub const STREAM_SLICE_CAP: u32 = 8192;

/// Cache elements one invocation of a split pass loads at once: the streamed pass's
/// [`Stream::word`], else the staged pass's: 8 (a 16-byte word) in f16 and bf16 where
/// both rows' widths allow, else 4 (16 bytes of f32, a word of fp8, 8 bytes of halves).
pub fn word(spec: &KernelSpec) -> u32 {
    match Stream::of(spec) {
        Some(Ok(s)) => s.word,
        _ => staged_word(spec),
    }
}

/// Whether both rows' widths are whole words of eight elements.
fn eights(spec: &KernelSpec) -> bool {
    spec.head_dim.is_multiple_of(8) && spec.v_dim().is_multiple_of(8)
}

/// Measured on an H200 (2026-11-29, 32/8 heads, d 128, caches of 32k at batch 1 and 8 and
/// of 128k): 16-byte words of halves with the query's columns in registers took the f16
/// decode from 0.090 to 0.082 ms at 32k, 0.273 to 0.233 at 128k and 0.487 to 0.413 at
/// batch 8 (bf16 0.084 to 0.078, 0.240 to 0.225, 0.420 to 0.405); without the registers the
/// words were slower than before. An fp8 cache in words of eight was 5-14% slower than in
/// words of four (in words of sixteen with the query in registers, 2026-11-30, 1.55-1.66x
/// slower), and f32's query in registers 5-10% slower at 128k and at batch 8 (faster only
/// at one sequence of 32k), so both keep the narrow layout.
fn staged_word(spec: &KernelSpec) -> u32 {
    match spec.kv_fp8.is_none() && spec.dtype.bytes() == 2 && eights(spec) {
        true => 8,
        false => 4,
    }
}

/// Invocations that share one key's dot products in the staged scores pass, each reading a
/// strided share of the key's words. In words of eight, the largest of 8, 4, 2, 1 dividing
/// the words of a K row (one load of a subgroup reads runs of up to 128 bytes of each key).
/// In words of four, f32's is the largest of 8, 4, 2, 1 dividing the vec4s of a K row and
/// fp8's a quarter of it, so each invocation keeps f32's bytes in flight.
pub fn lanes(spec: &KernelSpec) -> u32 {
    let largest_dividing = |n: u32| {
        [8, 4, 2, 1]
            .into_iter()
            .find(|l| n.is_multiple_of(*l))
            .unwrap_or(1)
    };
    let words = spec.head_dim / staged_word(spec);
    match staged_word(spec) {
        8 => largest_dividing(words),
        _ => (largest_dividing(words) * 4 * element_bytes(spec) / 16).max(1),
    }
}

/// Whether the staged pass holds each invocation's columns of the served queries in
/// registers (its words are eight elements and the columns fit in sixteen vec4s) rather
/// than reading them from workgroup memory per key (measured beside the staged pass's
/// words, above [`word`]'s rule).
pub fn query_in_registers(spec: &KernelSpec) -> bool {
    let per_lane = spec.head_dim / staged_word(spec) / lanes(spec);
    staged_word(spec) == 8 && per_lane * 2 * spec.grid.tile <= 16
}

/// Rows of V each invocation loads at once in P·V: 64 bytes in flight, 128 in half
/// precision. Measured on the H100 (32k cache, 32/8 heads, d 128, 8-byte loads of halves):
/// doubling half precision's rows took f16 from 0.098 to 0.094 ms and bf16 from 0.094 to
/// 0.088; doubling f32's or fp8's gained nothing.
pub fn pv_unroll(spec: &KernelSpec) -> u32 {
    let bytes = match (spec.kv_fp8, spec.dtype.bytes()) {
        (None, 2) => 128,
        _ => 64,
    };
    (bytes / (staged_word(spec) * element_bytes(spec))).max(1)
}

/// Keys scored per step: the workgroup's invocations in groups of [`lanes`]. A slice's
/// length is a multiple of it.
pub fn key_tile(spec: &KernelSpec) -> u32 {
    match Stream::of(spec) {
        Some(Ok(s)) => s.step(),
        _ => spec.workgroup_size / lanes(spec),
    }
}

/// Workgroup memory besides the staged scores: Q of the served heads (Q's width), one vec4 per
/// invocation for the reductions, and the sequence's length.
pub fn fixed_bytes(spec: &KernelSpec) -> u32 {
    4 * spec.grid.tile * spec.head_dim + 16 * spec.workgroup_size + 4 + combine_bytes(spec)
}

/// The combine's workgroup memory beside the reductions': the reduce's running max and sum
/// per group of invocations and its rows; a split pass that combines its slices merges in
/// the reductions' memory and keeps one flag.
fn combine_bytes(spec: &KernelSpec) -> u32 {
    let groups = spec.workgroup_size / (spec.v_dim() / 4).max(1);
    if spec.op == Op::DecodeReduce {
        8 * groups + 8
    } else if spec.combines_slices() {
        4
    } else {
        0
    }
}

/// The longest slice (a multiple of [`key_tile`]) whose scores fit the target's workgroup
/// memory beside the rest, at most [`SLICE_CAP`] keys.
pub fn max_slice(spec: &KernelSpec) -> u32 {
    if let Some(Ok(s)) = Stream::of(spec) {
        return (STREAM_SLICE_CAP / s.step()).max(1) * s.step();
    }
    let limit = spec.target.limits().workgroup_storage_bytes;
    let room = limit.saturating_sub(fixed_bytes(spec)) / 16;
    let tile = key_tile(spec).max(1);
    (room.min(SLICE_CAP) / tile * tile).max(tile)
}

/// Bytes of workgroup memory a decode kernel declares: the streamed pass's own count, the
/// split pass's fixed part and 16 per key of its longest slice, else 16 per invocation.
pub fn workgroup_bytes(spec: &KernelSpec) -> u32 {
    if let Some(Ok(s)) = Stream::of(spec) {
        return s.bytes(spec);
    }
    match spec.op {
        Op::DecodeSplit => fixed_bytes(spec) + 16 * max_slice(spec),
        _ => 16 * spec.workgroup_size + combine_bytes(spec),
    }
}

/// The streamed split pass (`grid: slice_major(flash)`): no scores staged, so no slice
/// limit from workgroup memory. Its invocations form key groups of [`Stream::lanes`]; a
/// group takes whole keys, each lane a strided share of the key's K and V words, the key's
/// dot products summed over the group by a butterfly (subgroup shuffles, or workgroup
/// memory where subgroups do not cover a group), and keeps an online softmax of its keys in
/// registers: the keys' loads, products and softmax run with no barrier, and the groups'
/// states meet once per slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream {
    /// Cache elements in the word a lane loads at once: 8 (16 bytes of halves, 8 of fp8)
    /// where both rows' widths allow, else 4; f32 always 4 (16 bytes).
    pub word: u32,
    /// Words in a K row.
    pub k_words: u32,
    /// Words in a V row.
    pub v_words: u32,
    /// Lanes per key: a power of two, at most 32 and at most either row's words.
    pub lanes: u32,
    /// Key groups per workgroup.
    pub groups: u32,
    /// Keys each group takes per step, their loads issued together.
    pub keys: u32,
    /// Words of a K row per lane (the last may be past the row on some lanes).
    pub k_per_lane: u32,
    /// Words of a V row per lane, likewise.
    pub v_per_lane: u32,
}

/// Keys per group per step by rule: each lane keeps about 128 bytes of K and V in flight.
pub fn stream_keys(spec: &KernelSpec) -> u32 {
    let s = stream_shape(spec, 1);
    let per_key = (s.k_per_lane + s.v_per_lane) * s.word * element_bytes(spec);
    (128 / per_key.max(1)).clamp(1, 8)
}

/// Bytes of one cache element as stored.
fn element_bytes(spec: &KernelSpec) -> u32 {
    match spec.kv_fp8 {
        Some(_) => 1,
        None => spec.dtype.bytes(),
    }
}

fn stream_shape(spec: &KernelSpec, keys: u32) -> Stream {
    let word = match (spec.kv_fp8.is_some() || spec.dtype.bytes() == 2) && eights(spec) {
        true => 8,
        false => 4,
    };
    let (k_words, v_words) = (spec.head_dim / word, spec.v_dim() / word);
    let narrow = k_words.min(v_words).max(1);
    let lanes = (1u32 << (31 - narrow.leading_zeros())).min(32);
    Stream {
        word,
        k_words,
        v_words,
        lanes,
        groups: spec.workgroup_size / lanes,
        keys,
        k_per_lane: k_words.div_ceil(lanes),
        v_per_lane: v_words.div_ceil(lanes),
    }
}

impl Stream {
    /// The layout of a streamed split pass, or what is wrong with its grid; `None` when
    /// `spec` is not one.
    pub fn of(spec: &KernelSpec) -> Option<Result<Stream, String>> {
        let flash = spec.grid.flash.filter(|_| spec.op == Op::DecodeSplit)?;
        let s = stream_shape(spec, flash.rows_per_thread);
        Some(s.validate(spec, flash.inner))
    }

    fn validate(self, spec: &KernelSpec, inner: u32) -> Result<Stream, String> {
        if self.keys == 0 || self.keys > 8 {
            return Err(format!(
                "rows_per_thread {} is the keys each key group loads per step: 1 to 8",
                self.keys
            ));
        }
        if !spec.workgroup_size.is_multiple_of(self.lanes) || self.groups == 0 {
            return Err(format!(
                "{} lanes share each key at head_dim {}, which does not divide workgroup_size {}",
                self.lanes, spec.head_dim, spec.workgroup_size
            ));
        }
        if inner != self.step() {
            return Err(format!(
                "a streamed decode takes {} keys per step ({} key groups of {} lanes, {} keys \
                 each): write `key_tile = {}`, or `slice_major(flash)` for the rule's layout",
                self.step(),
                self.groups,
                self.lanes,
                self.keys,
                self.step()
            ));
        }
        Ok(self)
    }

    /// Keys a workgroup takes per step; a slice's length is a multiple of it.
    pub fn step(&self) -> u32 {
        self.groups * self.keys
    }

    /// vec4s of f32 in a word.
    pub fn quads(&self) -> u32 {
        self.word / 4
    }

    /// vec4 slots of the exchange buffer: the fallback butterfly's one per invocation, the
    /// groups' partial outputs of one head when they meet.
    pub fn exchange(&self, spec: &KernelSpec) -> u32 {
        spec.workgroup_size.max(self.groups * spec.v_dim() / 4)
    }

    /// Workgroup memory: the exchange buffer, each group's (m, l), the length and the
    /// subgroup flag.
    pub fn bytes(&self, spec: &KernelSpec) -> u32 {
        16 * (self.exchange(spec) + 2 * self.groups) + 8
    }
}

/// The rule's streamed grid for a split pass of `spec`'s widths and dtypes.
pub fn stream_flash(spec: &KernelSpec) -> crate::spec::Flash {
    let keys = stream_keys(spec);
    let s = stream_shape(spec, keys);
    crate::spec::Flash {
        inner: s.step(),
        rows_per_thread: keys,
    }
}

/// The WGSL type of the word a streamed pass loads: four or eight cache elements.
pub fn stream_word_type(spec: &KernelSpec, word: u32) -> &'static str {
    match (spec.kv_fp8, spec.dtype, word) {
        (Some(_), _, 8) => "vec2<u32>",
        (Some(_), _, _) => "u32",
        (None, crate::spec::Dtype::F32, _) => "vec4<f32>",
        (None, _, 8) => "vec4<u32>",
        (None, crate::spec::Dtype::F16, _) => "vec4<f16>",
        (None, crate::spec::Dtype::Bf16, _) => "vec2<u32>",
    }
}
