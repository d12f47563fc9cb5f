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
