//! Which device attends which queries to which keys. The sequence is cut into
//! `2 · devices` chunks of equal rows; device `d` holds key chunks `d` and
//! `2 · devices − 1 − d` (the zigzag ring attention uses), so that under a causal mask every
//! device has as many visible pairs: an early chunk, seen by many queries, goes with a late
//! one, seen by few. Every query is on every device; each device attends them to its own
//! keys, block by block, a block being one query chunk against one key chunk: the forward's
//! own shape (as many queries as keys), causal on the diagonal, whole below it, and absent
//! above it under a causal mask.

/// The chunks of one sequence over `devices` devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub devices: usize,
    /// Rows per chunk.
    pub chunk: u32,
    pub causal: bool,
}

/// One forward (or backward) call: query chunk `query` against key chunk `key`, which its
/// device holds at `slot` (0 or 1) of its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub query: usize,
    pub key: usize,
    pub slot: usize,
    /// On the diagonal of a causal mask: the block's own causal mask applies.
    pub diagonal: bool,
}

impl Plan {
    /// The chunks of a sequence.
    pub fn chunks(&self) -> usize {
        2 * self.devices
    }

    /// The key chunks device `d` holds, in slot order.
    pub fn owned(&self, d: usize) -> [usize; 2] {
        [d, self.chunks() - 1 - d]
    }

    /// The device holding key chunk `key`.
    pub fn owner(&self, key: usize) -> usize {
        key.min(self.chunks() - 1 - key)
    }

    /// The blocks device `d` computes, by query chunk: a chunk's share of dQ is final
    /// after its last block.
    pub fn blocks(&self, d: usize) -> Vec<Block> {
        let mut blocks = Vec::new();
        for (slot, key) in self.owned(d).into_iter().enumerate() {
            let first = if self.causal { key } else { 0 };
            for query in first..self.chunks() {
                blocks.push(Block {
                    query,
                    key,
                    slot,
                    diagonal: self.causal && query == key,
                });
            }
        }
        blocks.sort_by_key(|b| (b.query, b.slot));
        blocks
    }

    /// The key chunks query chunk `query` sees: those before it and itself under a causal
    /// mask, all of them otherwise.
    pub fn seen(&self, query: usize) -> usize {
        match self.causal {
            true => query + 1,
            false => self.chunks(),
        }
    }

    /// Visible (query, key) pairs device `d` scores, per query head.
    pub fn pairs(&self, d: usize) -> u64 {
        let m = u64::from(self.chunk);
        self.blocks(d)
            .iter()
            .map(|b| match b.diagonal {
                true => m * (m + 1) / 2,
                false => m * m,
            })
            .sum()
    }
}
