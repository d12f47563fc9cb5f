//! A CUDA sampling step's plan and what it issues, as plain data compiled with or without the
//! `cuda` feature: how the paged attention splits long contexts ([`partitions`]), and the
//! launches, buffers, copies and waits of the step's work outside the model's layers and of each
//! attention call ([`StepCosts`]), declared from the code that issues them (`backend.rs`'s
//! forward and logits, `gpu/paged.rs`, `gpu/sampling.rs`, `state_slots.rs`). The GPU code plans
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

/// What the parts of a CUDA sampling step outside the model's layers issue.
pub struct StepCosts;

impl StepCosts {
    /// The step's tokens and positions, uploaded (`Backend::forward`).
    pub const INPUTS: Cost = Cost {
        launches: 0,
        allocations: 2,
        host_to_device: 2,
        device_to_host: 0,
        syncs: 0,
    };

    /// The paged attention's metadata (`GpuStep::new`): slots, each token's sequence and
    /// length, the block tables uploaded; with split contexts, the partials' two buffers.
    pub fn paged_metadata(split: bool) -> Cost {
        Cost {
            allocations: 4 + 2 * u64::from(split),
            host_to_device: 4,
            ..Cost::default()
        }
    }

    /// One attention call (`GpuPagedAttention::attend`): a copy of each of q, k, v that is not
    /// contiguous, the KV write, the attention kernel into its new output, the reduce of split
    /// partitions.
    pub fn paged_attend(strided: u64, split: bool) -> Cost {
        Cost::kernels(strided + 1)
            + Cost {
                launches: 1 + u64::from(split),
                ..Cost::default()
            }
    }

    /// A recurrent layer's state rows gathered from the pool (a kernel into a new buffer), with
    /// the step's slot ids uploaded on the first layer (`state_slots.rs`).
    pub fn state_gather(first: bool) -> Cost {
        Cost::kernels(1) + if first { Cost::UPLOAD } else { Cost::default() }
    }

    /// A recurrent layer's states handed to the kernels in the pool itself: the step's slot
    /// ids uploaded on the first layer, and its sequence starts when a sequence brings more
    /// than one token (`state_slots.rs`).
    pub fn state_pool(first: bool, starts: bool) -> Cost {
        if first {
            Cost::UPLOAD * (1 + u64::from(starts))
        } else {
            Cost::default()
        }
    }

    /// A recurrent layer's new states scattered back into the pool (a kernel).
    pub const STATE_SCATTER: Cost = Cost {
        launches: 1,
        allocations: 0,
        host_to_device: 0,
        device_to_host: 0,
        syncs: 0,
    };

    /// The sampling rows' logits (`Backend::logits`): their indices uploaded, the rows picked,
    /// the LM head.
    pub const LOGITS: Cost = Cost {
        launches: 2,
        allocations: 3,
        host_to_device: 1,
        device_to_host: 0,
        syncs: 0,
    };

    /// Each row's best candidates (`top_candidates`): six zeroed buffers, the kernel, and six
    /// copies to the host, each waiting for the device.
    pub const CANDIDATES: Cost = Cost {
        launches: 7,
        allocations: 6,
        host_to_device: 0,
        device_to_host: 6,
        syncs: 6,
    };
}
