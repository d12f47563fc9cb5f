//! What a sampling run needs of memory before it starts: the KV cache's blocks for the run's
//! prompts ([`KvNeed`]), and the host and GPU memory estimates preflight checks.
//!
//! Knows nothing of running: the job sizes its cache with [`KvNeed`] too.

use anyhow::{bail, Result};

use super::settings::{KvCacheDtype, LogitsEngine, SampleDtype, SampleSettings};
use crate::sampler::state_slots::StateSlots;

/// What the KV cache must hold, in blocks, for a run's prompts (up to `prompt` tokens), `n`
/// samples each, `max_new_tokens` each, `max_num_seqs` at once.
///
/// A prompt's blocks are shared by its samples and stay cached while any of them waits to run
/// (forked samples wait at the front of the queue; a new prompt is admitted only when none
/// waits), so at most `min(max_num_seqs, problems)` prompts hold blocks at once. With fewer
/// blocks than those prompts plus one whole sequence (its prompt recomputed after a
/// preemption), every sequence can end up preempted and the run stalls: that is
/// [`Self::min_blocks`]. [`Self::default_blocks`] adds every running sequence's own blocks, so
/// none is preempted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvNeed {
    pub min_blocks: usize,
    pub default_blocks: usize,
    /// Blocks held by cached prompts at most.
    pub prompt_blocks: usize,
    /// Blocks of one sequence: its prompt and max_new_tokens.
    pub sequence_blocks: usize,
}

impl KvNeed {
    pub fn new(prompt: usize, s: &SampleSettings, problems: usize) -> KvNeed {
        let bs = s.block_size.max(1);
        let n = s.params.n.max(1) as usize;
        let sequence_blocks = (prompt + s.params.max_new_tokens).div_ceil(bs);
        let running = s.max_num_seqs.min(problems.max(1) * n).max(1);
        let prompt_blocks = match n {
            1 => 0, // nothing shared, nothing held while waiting
            _ => s.max_num_seqs.min(problems.max(1)).max(1) * prompt.div_ceil(bs),
        };
        KvNeed {
            min_blocks: prompt_blocks + sequence_blocks,
            // one more block per sequence: the copy of a shared, partly filled prompt block
            default_blocks: prompt_blocks + running * (sequence_blocks + 1),
            prompt_blocks,
            sequence_blocks,
        }
    }

    /// An error naming `kv_cache` when `blocks` cannot run these settings.
    pub fn check(&self, blocks: u64, block_bytes: u64, s: &SampleSettings) -> Result<()> {
        if blocks >= self.min_blocks as u64 {
            return Ok(());
        }
        let mib = |b: usize| (b as u64 * block_bytes) as f64 / (1 << 20) as f64;
        let given = match &s.kv_cache {
            Some(k) => format!("kv_cache = \"{k}\""),
            None => "the memory available for the KV cache".into(),
        };
        bail!(
            "{given} holds {blocks} blocks of {} tokens, but n = {} with max_num_seqs = {} needs \
             at least {} ({:.1} MiB): {} for the prompts whose samples wait for a slot and {} for \
             one sequence of the longest prompt plus max_new_tokens; give it more memory, or \
             lower max_num_seqs or max_new_tokens",
            s.block_size,
            s.params.n,
            s.max_num_seqs,
            self.min_blocks,
            mib(self.min_blocks),
            self.prompt_blocks,
            self.sequence_blocks,
        )
    }
}

/// Prompt length assumed for the KV estimate before the prompts exist.
pub const ESTIMATE_PROMPT_TOKENS: usize = 512;

/// Host memory: on the CPU, the weights as computed (f32: a bf16 checkpoint doubles) plus the KV
/// cache (`kv_cache`, or max_num_seqs sequences of a 512-token prompt plus max_new_tokens); on a
/// GPU, the checkpoint as read (weights and cache live on the device, whose memory is checked
/// when the run starts: the default cache takes 90% of what the weights leave free).
pub fn host_memory_estimate(
    s: &SampleSettings,
    config: &crate::model::ModelConfig,
    weight_bytes: u64,
) -> Result<u64> {
    let stored = weight_bytes;
    let widen = match config.dtype.as_str() {
        "bfloat16" | "float16" => 2,
        _ => 1,
    };
    if s.params.max_new_tokens >= config.max_position_embeddings {
        bail!(
            "sample.max_new_tokens = {} does not fit the model's context of {} tokens",
            s.params.max_new_tokens,
            config.max_position_embeddings
        );
    }
    if s.device.is_cuda() {
        return Ok(stored);
    }
    let per_token = crate::sampler::kv_cache::KvCache::bytes_per_token(config) as u64;
    // recurrent layers' state: a slot per running sequence, beside the KV cache
    let states = (s.max_num_seqs * StateSlots::bytes_per_seq(config)) as u64;
    // the problems are not counted yet: as many as sequences
    let kv = planned_kv(s, per_token, |need| need.default_blocks)?;
    Ok(stored * widen + kv + states)
}

/// The KV cache a plan counts: `kv_cache` when given, else `blocks` of the [`KvNeed`] of
/// max_num_seqs prompts of [`ESTIMATE_PROMPT_TOKENS`], at `per_token` bytes.
fn planned_kv(
    s: &SampleSettings,
    per_token: u64,
    blocks: impl Fn(&KvNeed) -> usize,
) -> Result<u64> {
    Ok(match &s.kv_cache {
        Some(size) => size.bytes(),
        None => {
            let need = KvNeed::new(ESTIMATE_PROMPT_TOKENS, s, s.max_num_seqs);
            (blocks(&need) * s.block_size) as u64 * per_token
        }
    })
}

/// GPU memory a run on a GPU cannot do without: the weights in the compute dtype, the CUDA
/// context (1 GiB), the recurrent layers' state for max_num_seqs sequences and the padding
/// slot, the rows CUDA graphs keep their outputs in (max_num_seqs rows of logits and hidden
/// states, unless `enforce_eager`), and the KV cache
/// (`kv_cache`, or the least that runs these settings: see [`KvNeed`]; the default cache takes
/// what is left, 90% of it). 0 on the CPU.
pub fn gpu_memory_estimate(s: &SampleSettings, config: &crate::model::ModelConfig) -> Result<u64> {
    if s.device.is_cpu() {
        return Ok(0);
    }
    if s.engine == LogitsEngine::Selfdistill {
        if let Err(e) = crate::sampler::backend::check_gpu_model(config) {
            bail!("sample.device = {}: {e}", s.device);
        }
    }
    let params = config.num_params() as u64;
    let weight = if s.dtype == SampleDtype::F32 { 4 } else { 2 };
    // the CPU cache stores f32; on the GPU the weights' dtype, or one byte with fp8
    let per_token_f32 = crate::sampler::kv_cache::KvCache::bytes_per_token(config) as u64;
    let per_token = match (s.kv_cache_dtype, weight) {
        (KvCacheDtype::Fp8, _) => per_token_f32 / 4,
        (_, 2) => per_token_f32 / 2,
        _ => per_token_f32,
    };
    let states = ((s.max_num_seqs + 1) * StateSlots::bytes_per_seq(config)) as u64;
    let kept = if s.enforce_eager || s.engine != LogitsEngine::Selfdistill {
        0
    } else {
        (s.max_num_seqs * (config.vocab_size + config.hidden_size) * weight as usize) as u64
    };
    let kv = planned_kv(s, per_token, |need| need.min_blocks)?;
    Ok(params * weight + states + kept + kv + (1 << 30))
}
