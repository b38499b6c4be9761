//! The KV cache's refusals.

use thiserror::Error;

/// Why the cache refused a change; nothing was recorded.
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum CacheError {
    #[error("slots {first}..{end} are past the cache's {slots} slots")]
    Slots { first: u32, end: u32, slots: u32 },
    #[error("slot {slot} is free; open it (KvCache::open) before appending to it")]
    Free { slot: u32 },
    #[error("slot {slot} is already free; only an open slot can be freed")]
    AlreadyFree { slot: u32 },
    #[error("slot {slot} is already open; free it first to start a new sequence there")]
    Open { slot: u32 },
    #[error("slot {slot} holds {len} rows and {adding} more would pass its capacity of {capacity}")]
    Full {
        slot: u32,
        len: u32,
        adding: u32,
        capacity: u32,
    },
    #[error("the append needs {needed} new pages and the pool has {free} free; free a sequence")]
    OutOfPages { needed: u32, free: u32 },
    #[error(
        "prefill writes a whole prompt (its forward sees only its own rows), and slot {slot} \
         already holds {len} rows; continue it with `KvCache::extend`, whose rows attend over \
         the rows it holds"
    )]
    NotEmpty { slot: u32, len: u32 },
    #[error("the cache's {what} is 0; every dimension must be at least 1")]
    Zero { what: &'static str },
    #[error(
        "an fp8 cache takes {given} {what} scales; give 1 (the whole tensor) or {n_kv_heads} (one per KV head)"
    )]
    Scales {
        what: &'static str,
        given: usize,
        n_kv_heads: u32,
    },
    #[error("a scale of {value} cannot scale an fp8 cache; each must be finite and > 0")]
    BadScale { value: f32 },
    #[error("the cache holds {dtype}, not 8-bit floats: it has no scales to set")]
    NotFp8 { dtype: &'static str },
}
