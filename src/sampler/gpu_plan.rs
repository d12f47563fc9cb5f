//! A CUDA sampling step's plan and what it issues, as plain data compiled with or without the
//! `cuda` feature: how the paged attention splits long contexts ([`partitions`]); the batch-size
//! buckets a decode step is padded to and the fixed launch shape of each ([`decode_buckets`],
//! [`GraphPlan`]: what a CUDA graph of the step bakes in); and the launches, buffers, copies and
//! waits of the step's work outside the model's layers and of each attention call
//! ([`StepCosts`]), declared from the code that issues them (`backend.rs`'s forward and logits,
//! `gpu/paged.rs`, `gpu/sampling.rs`, `gpu/graphs.rs`, `state_slots.rs`). The GPU code plans
//! with it, and `pipeline bench sample --count` counts a GPU's step with it on any machine.
//!
//! Knows nothing of kernels' code, sequences or sampling rules.

use crate::model::cost::Cost;

/// A multiple of the keys a warp reads per iteration (`STEP` in the kernel) at every head_dim.
pub const KEYS_PER_WARP_STEP: usize = 8;
/// Shortest key partition worth a block of its own when a context is split.
pub const MIN_PARTITION: usize = 256;
/// Most block-table entries one partition stages in shared memory (v5): longer contexts are
/// split further (8 KB of entries: 32,768 keys in blocks of 16).
pub const MAX_PARTITION_BLOCKS: usize = 2048;

/// (keys per partition, partitions) for a step of `tokens` queries over `kv_heads` heads whose
/// longest context is `max_len` keys, on `sm_count` SMs: long contexts are split when the
/// (token, KV head) blocks alone would not fill the GPU twice over; each partition is one more
/// block, merged by the reduce kernel.
pub fn partitions(
    tokens: usize,
    kv_heads: usize,
    max_len: usize,
    block_size: usize,
    sm_count: usize,
) -> (usize, usize) {
    let blocks = (tokens * kv_heads).max(1);
    let want = (2 * sm_count).div_ceil(blocks);
    let num_parts = want
        .clamp(1, max_len.div_ceil(MIN_PARTITION).max(1))
        .max(max_len.div_ceil(MAX_PARTITION_BLOCKS * block_size));
    let part_size = max_len
        .div_ceil(num_parts)
        .next_multiple_of(KEYS_PER_WARP_STEP);
    (part_size, max_len.div_ceil(part_size))
}

/// The batch sizes a decode step is padded to for a CUDA graph, up to `max_num_seqs` (which is
/// always the last): 1, 2, 4, 8, then steps of 8 to 64 and of 16 beyond (vLLM's capture sizes).
/// A step of `n` sequences runs in the smallest bucket of at least `n` rows; padding costs at
/// most 15 rows of matrix work, which decode, bound by reading the weights, barely feels.
pub fn decode_buckets(max_num_seqs: usize) -> Vec<usize> {
    let mut out: Vec<usize> = [1, 2, 4]
        .into_iter()
        .chain((8..=64).step_by(8))
        .chain((80..).step_by(16))
        .take_while(|&b| b < max_num_seqs)
        .collect();
    if max_num_seqs > 0 {
        out.push(max_num_seqs);
    }
    out
}

/// The smallest of `buckets` (ascending) that holds `n` rows.
pub fn bucket_for(buckets: &[usize], n: usize) -> Option<usize> {
    buckets.iter().copied().find(|&b| b >= n)
}

/// Fewest block-table entries per sequence a graph's plan reserves (its class of contexts).
pub const MIN_TABLE_BLOCKS: usize = 16;

/// What a CUDA graph of a decode step fixes when it is captured, so that every step it replays
/// fits it: the rows (the bucket; padded rows write no key and read one), the block-table stride
/// (a power of two: the step's longest table rounded up, so a graph serves a class of contexts),
/// and the attention's key partitions, planned for the longest context the stride holds
/// (partitions past a row's length end at once; the reduce skips them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphPlan {
    pub rows: usize,
    pub max_blocks: usize,
    pub part_size: usize,
    pub num_parts: usize,
}

impl GraphPlan {
    /// The plan of a bucket of `rows` whose longest block table has `blocks` entries, over a
    /// cache of `block_size`-token blocks with `kv_heads` heads on `sm_count` SMs.
    pub fn new(
        rows: usize,
        blocks: usize,
        block_size: usize,
        kv_heads: usize,
        sm_count: usize,
    ) -> GraphPlan {
        let max_blocks = blocks.max(MIN_TABLE_BLOCKS).next_power_of_two();
        let (part_size, num_parts) = partitions(
            rows,
            kv_heads,
            max_blocks * block_size,
            block_size,
            sm_count,
        );
        GraphPlan {
            rows,
            max_blocks,
            part_size,
            num_parts,
        }
    }
}

/// What the parts of a CUDA sampling step outside the model's layers issue.
pub struct StepCosts;

impl StepCosts {
    /// The step's one upload (`Backend::forward`, `gpu/step_io.rs`): its tokens and
    /// positions, the paged attention's slots, token sequences, lengths and block tables, the
    /// state slots' ids and sequence starts, the sampling rows and their temperatures, in one
    /// copy from page-locked memory into a buffer kept from step to step (as are the split
    /// attention's partials): no allocation once warm.
    pub const STEP_UPLOAD: Cost = Cost {
        launches: 0,
        allocations: 0,
        host_to_device: 1,
        device_to_host: 0,
        syncs: 0,
    };

    /// One attention call (`GpuPagedAttention::attend`): a copy of each of q, k, v that is not
    /// contiguous (candle's strided copy, which uploads the layout it reads by), the KV write,
    /// the attention kernel into its new output, the reduce of split partitions.
    pub fn paged_attend(strided: u64, split: bool) -> Cost {
        Cost::kernels(strided + 1)
            + Cost::UPLOAD * strided
            + Cost {
                launches: 1 + u64::from(split),
                ..Cost::default()
            }
    }

    /// A recurrent layer's state rows gathered from the pool (a kernel into a new buffer; the
    /// slot ids are in the step's upload).
    pub const STATE_GATHER: Cost = Cost::kernels(1);

    /// A recurrent layer's new states scattered back into the pool (a kernel).
    pub const STATE_SCATTER: Cost = Cost {
        launches: 1,
        allocations: 0,
        host_to_device: 0,
        device_to_host: 0,
        syncs: 0,
    };

    /// The sampling rows' logits (`Backend::logits`): the rows picked (their indices are in
    /// the step's upload), the LM head.
    pub const LOGITS: Cost = Cost::kernels(2);

    /// A decode step replayed from its CUDA graph (`gpu/graphs.rs`): one graph launch runs the
    /// whole forward and the LM head into buffers the graph owns and kept output rows; the host
    /// allocates, uploads and waits for nothing inside it (the step's upload comes before it).
    pub const GRAPH_REPLAY: Cost = Cost {
        launches: 1,
        allocations: 0,
        host_to_device: 0,
        device_to_host: 0,
        syncs: 0,
    };

    /// Each row's best candidates (`top_candidates`): the kernel into the kept output buffer,
    /// and one copy of all of it to the host, the step's one wait.
    pub const CANDIDATES: Cost = Cost {
        launches: 1,
        allocations: 0,
        host_to_device: 0,
        device_to_host: 1,
        syncs: 1,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_batch_has_one_smallest_bucket_and_the_largest_is_max_num_seqs() {
        assert_eq!(
            decode_buckets(100),
            vec![1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 100]
        );
        assert_eq!(decode_buckets(1), vec![1]);
        assert_eq!(decode_buckets(3), vec![1, 2, 3]);
        assert!(decode_buckets(0).is_empty());
        for max in [1, 7, 64, 65, 256, 300] {
            let b = decode_buckets(max);
            assert!(b.windows(2).all(|w| w[0] < w[1]), "{b:?}");
            assert_eq!(b.last(), Some(&max));
            for n in 1..=max {
                let got = bucket_for(&b, n).unwrap();
                assert!(got >= n && got - n < 16, "{n} -> {got}");
                assert!(
                    b.iter().all(|&x| x < n || x >= got),
                    "{n} -> {got} in {b:?}"
                );
            }
            assert_eq!(bucket_for(&b, max + 1), None);
        }
    }

    #[test]
    fn a_graph_plan_covers_every_context_its_stride_holds() {
        for (rows, blocks, bs, kvh, sms) in [
            (1, 1, 16, 8, 132),
            (1, 300, 16, 8, 132),
            (32, 17, 16, 8, 132),
            (256, 257, 16, 8, 132),
            (8, 5000, 32, 4, 78),
        ] {
            let p = GraphPlan::new(rows, blocks, bs, kvh, sms);
            assert!(
                p.max_blocks >= blocks && p.max_blocks.is_power_of_two(),
                "{p:?}"
            );
            assert!(p.max_blocks >= MIN_TABLE_BLOCKS);
            // the partitions cover the longest context the stride holds, none of them empty
            let capacity = p.max_blocks * bs;
            assert!(p.part_size * p.num_parts >= capacity, "{p:?}");
            assert!(p.part_size * (p.num_parts - 1) < capacity, "{p:?}");
            assert_eq!(p.part_size % KEYS_PER_WARP_STEP, 0);
            // a table one entry longer within the class keeps the plan: one graph serves both
            if blocks < p.max_blocks {
                assert_eq!(GraphPlan::new(rows, blocks + 1, bs, kvh, sms), p);
            }
        }
    }
}
