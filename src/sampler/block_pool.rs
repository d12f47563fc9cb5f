//! The KV-cache block pool: a flat array of blocks with reference counts and a free list threaded
//! through the blocks' indices, and the per-sequence append-only block tables built on it.
//!
//! ```text
//! ref_counts: [1, 0, 2, 0, 1]        free list: head -> 3 -> 1 -> end   (next_free[3] = 1)
//! seq A block_table: [0, 2]          seq B block_table: [4, 2]   (block 2 shared: ref 2)
//! token at position p of a sequence lives in slot block_table[p / B] * B + p % B
//! ```
//! Invariants: a block is on the free list iff its ref count is 0; block tables only grow (a
//! shared last block is replaced by a private copy before it is written, copy on write); freeing
//! a table releases its blocks last to first, so tail blocks go back first. Running out of blocks
//! is `None`, not an error. Knows nothing of tensors or the model.

/// Index of a block in the pool (and in every layer's KV storage).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

const NONE: u32 = u32::MAX;

#[derive(Debug, Clone)]
pub struct BlockPool {
    ref_counts: Vec<u32>,
    /// For a free block, the next free block (`NONE` ends the list).
    next_free: Vec<u32>,
    free_head: u32,
    num_free: usize,
}

impl BlockPool {
    pub fn new(num_blocks: usize) -> BlockPool {
        let n = num_blocks.min(NONE as usize - 1);
        let next_free = (0..n as u32)
            .map(|i| if i + 1 < n as u32 { i + 1 } else { NONE })
            .collect();
        BlockPool {
            ref_counts: vec![0; n],
            next_free,
            free_head: if n > 0 { 0 } else { NONE },
            num_free: n,
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// A fresh block with ref count 1, or `None` when the pool is exhausted.
    pub fn allocate(&mut self) -> Option<BlockId> {
        if self.free_head == NONE {
            return None;
        }
        let b = self.free_head;
        let i = b as usize;
        self.free_head = *self.next_free.get(i)?;
        *self.ref_counts.get_mut(i)? = 1;
        self.num_free -= 1;
        Some(BlockId(b))
    }

    /// One more holder of `b` (a sequence sharing it).
    pub fn share(&mut self, b: BlockId) {
        if let Some(rc) = self.ref_counts.get_mut(b.0 as usize) {
            debug_assert!(*rc > 0, "sharing a free block");
            *rc += 1;
        }
    }

    /// One holder fewer; the block returns to the free list at zero.
    pub fn release(&mut self, b: BlockId) {
        let i = b.0 as usize;
        let Some(rc) = self.ref_counts.get_mut(i) else {
            return;
        };
        debug_assert!(*rc > 0, "releasing a free block");
        if *rc == 0 {
            return;
        }
        *rc -= 1;
        if *rc == 0 {
            if let Some(n) = self.next_free.get_mut(i) {
                *n = self.free_head;
            }
            self.free_head = b.0;
            self.num_free += 1;
        }
    }

    pub fn ref_count(&self, b: BlockId) -> u32 {
        self.ref_counts.get(b.0 as usize).copied().unwrap_or(0)
    }
}

/// A sequence's blocks, in position order. Append-only while the sequence lives.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BlockTable {
    pub blocks: Vec<BlockId>,
}

/// What [`BlockTable::reserve`] did to make room: a block to copy before writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyOnWrite {
    pub src: BlockId,
    pub dst: BlockId,
}

impl BlockTable {
    /// The cache slot of the token at `position`.
    pub fn slot(&self, position: usize, block_size: usize) -> Option<usize> {
        let b = self.blocks.get(position / block_size)?;
        Some(b.0 as usize * block_size + position % block_size)
    }

    /// Makes slots `num_tokens..num_tokens + n` writable: allocates the blocks they need and, if
    /// the block the first one lands in is shared, replaces it with a private copy (returned so
    /// the caller copies the KV data). `None` (with nothing changed) when the pool runs out.
    pub fn reserve(
        &mut self,
        pool: &mut BlockPool,
        num_tokens: usize,
        n: usize,
        block_size: usize,
    ) -> Option<Option<CopyOnWrite>> {
        let need_blocks = (num_tokens + n).div_ceil(block_size);
        let new_blocks = need_blocks.saturating_sub(self.blocks.len());
        let partial = !num_tokens.is_multiple_of(block_size);
        let last_shared = partial
            && n > 0
            && self
                .blocks
                .get(num_tokens / block_size)
                .is_some_and(|b| pool.ref_count(*b) > 1);
        if pool.num_free() < new_blocks + last_shared as usize {
            return None;
        }
        let mut cow = None;
        if last_shared {
            let idx = num_tokens / block_size;
            let dst = pool.allocate()?;
            if let Some(slot) = self.blocks.get_mut(idx) {
                let src = *slot;
                pool.release(src);
                *slot = dst;
                cow = Some(CopyOnWrite { src, dst });
            }
        }
        for _ in 0..new_blocks {
            self.blocks.push(pool.allocate()?);
        }
        Some(cow)
    }

    /// A table holding the same blocks (each shared once more): the n samples of one prompt.
    pub fn fork(&self, pool: &mut BlockPool) -> BlockTable {
        for b in &self.blocks {
            pool.share(*b);
        }
        self.clone()
    }

    /// Releases every block, last first.
    pub fn free(&mut self, pool: &mut BlockPool) {
        while let Some(b) = self.blocks.pop() {
            pool.release(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_until_exhausted_then_none() {
        let mut p = BlockPool::new(3);
        let a: Vec<_> = (0..3).map(|_| p.allocate().unwrap()).collect();
        assert_eq!(a, vec![BlockId(0), BlockId(1), BlockId(2)]);
        assert_eq!(p.allocate(), None);
        p.release(BlockId(1));
        assert_eq!(p.num_free(), 1);
        assert_eq!(p.allocate(), Some(BlockId(1)));
    }

    #[test]
    fn shared_blocks_free_at_last_release() {
        let mut p = BlockPool::new(2);
        let b = p.allocate().unwrap();
        p.share(b);
        p.release(b);
        assert_eq!(p.num_free(), 1);
        p.release(b);
        assert_eq!(p.num_free(), 2);
    }

    #[test]
    fn free_list_returns_tail_blocks_first() {
        let mut p = BlockPool::new(4);
        let mut t = BlockTable::default();
        t.reserve(&mut p, 0, 8, 2).unwrap();
        assert_eq!(t.blocks.len(), 4);
        t.free(&mut p);
        // Released 3, 2, 1, 0: block 0 was released last, so it is handed out first.
        assert_eq!(p.allocate(), Some(BlockId(0)));
    }

    #[test]
    fn reserve_grows_and_slots_map() {
        let mut p = BlockPool::new(8);
        let mut t = BlockTable::default();
        assert_eq!(t.reserve(&mut p, 0, 5, 4), Some(None));
        assert_eq!(t.blocks, vec![BlockId(0), BlockId(1)]);
        assert_eq!(t.slot(5, 4), Some(5));
        assert_eq!(t.slot(8, 4), None);
        assert_eq!(t.reserve(&mut p, 5, 3, 4), Some(None)); // fits in block 1
        assert_eq!(t.blocks.len(), 2);
        assert_eq!(t.reserve(&mut p, 8, 1, 4), Some(None));
        assert_eq!(t.blocks.len(), 3);
    }

    #[test]
    fn forked_partial_block_is_copied_on_write() {
        let mut p = BlockPool::new(8);
        let mut a = BlockTable::default();
        a.reserve(&mut p, 0, 6, 4).unwrap(); // blocks 0 (full), 1 (2 of 4 used)
        let mut b = a.fork(&mut p);
        assert_eq!(p.ref_count(BlockId(1)), 2);
        let cow = b.reserve(&mut p, 6, 1, 4).unwrap().unwrap();
        assert_eq!(cow.src, BlockId(1));
        assert_eq!(b.blocks[0], BlockId(0)); // full block stays shared
        assert_ne!(b.blocks[1], BlockId(1));
        assert_eq!(p.ref_count(BlockId(1)), 1);
        assert_eq!(p.ref_count(BlockId(0)), 2);
        // The other holder now owns block 1 alone and writes in place.
        assert_eq!(a.reserve(&mut p, 6, 1, 4), Some(None));
    }

    #[test]
    fn reserve_without_room_changes_nothing() {
        let mut p = BlockPool::new(2);
        let mut t = BlockTable::default();
        assert_eq!(t.reserve(&mut p, 0, 9, 4), None);
        assert!(t.blocks.is_empty());
        assert_eq!(p.num_free(), 2);
    }
}
