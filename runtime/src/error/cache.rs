//! The KV cache's refusals.

use thiserror::Error;

/// Why the cache refused a change; nothing was recorded.
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum CacheError {
    /// A range of slots that does not lie within the cache.
    #[error("slots {first}..{end} are past the cache's {slots} slots")]
    Slots {
        /// The range's first slot.
        first: u32,
        /// The slot after the range's last.
        end: u32,
        /// Slots the cache has.
        slots: u32,
    },
    /// An append to a slot that holds no sequence.
    #[error("slot {slot} is free; open it (KvCache::open) before appending to it")]
    Free {
        /// The free slot.
        slot: u32,
    },
    /// A free of a slot that holds no sequence.
    #[error("slot {slot} is already free; only an open slot can be freed")]
    AlreadyFree {
        /// The free slot.
        slot: u32,
    },
    /// An open of a slot that already holds a sequence.
    #[error("slot {slot} is already open; free it first to start a new sequence there")]
    Open {
        /// The open slot.
        slot: u32,
    },
    /// An append that would pass a slot's capacity.
    #[error("slot {slot} holds {len} rows and {adding} more would pass its capacity of {capacity}")]
    Full {
        /// The slot appended to.
        slot: u32,
        /// Rows the slot holds.
        len: u32,
        /// Rows the append adds.
        adding: u32,
        /// The most rows a slot holds.
        capacity: u32,
    },
    /// An append to a paged cache that needs more pages than the pool has free.
    #[error("the append needs {needed} new pages and the pool has {free} free; free a sequence")]
    OutOfPages {
        /// Pages the append needs, over all its slots.
        needed: u32,
        /// Pages free in the pool.
        free: u32,
    },
    /// A prefill into a slot that already holds rows.
    #[error(
        "prefill writes a whole prompt (its forward sees only its own rows), and slot {slot} \
         already holds {len} rows; continue it with `KvCache::extend`, whose rows attend over \
         the rows it holds"
    )]
    NotEmpty {
        /// The slot prefilled.
        slot: u32,
        /// Rows the slot holds.
        len: u32,
    },
    /// A cache described with a dimension of 0.
    #[error("the cache's {what} is 0; every dimension must be at least 1")]
    Zero {
        /// The dimension that is 0.
        what: &'static str,
    },
    /// fp8 scales that are neither one value nor one per KV head.
    #[error(
        "an fp8 cache takes {given} {what} scales; give 1 (the whole tensor) or {n_kv_heads} (one per KV head)"
    )]
    Scales {
        /// Whose scales: `K` or `V`.
        what: &'static str,
        /// Scales given.
        given: usize,
        /// The cache's KV heads.
        n_kv_heads: u32,
    },
    /// An fp8 scale that is not finite or not positive.
    #[error("a scale of {value} cannot scale an fp8 cache; each must be finite and > 0")]
    BadScale {
        /// The scale refused.
        value: f32,
    },
    /// Scales set on a cache that does not hold fp8.
    #[error("the cache holds {dtype}, not 8-bit floats: it has no scales to set")]
    NotFp8 {
        /// The cache's element type.
        dtype: &'static str,
    },
}
