//! What a sampling job is once prepared ([`Job`]: its problems, prompts, template and
//! [`JobConfig`]), the figures a run gives back ([`JobSummary`]), and the hash that names what
//! shapes its samples ([`sampling_hash`]). Shared by [`super::run`], which prepares jobs, and
//! [`super::feed`], which runs them. Knows nothing of models or engines.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::prompt::PromptTemplate;
use super::settings::{LogitsEngine, ENGINE_OURS};
use crate::data::schema::Problem;
use crate::sampler::engine::ThinkingBudget;
use crate::sampler::params::SamplingParams;
use crate::verify::GradeOptions;

#[derive(Debug, Clone)]
pub struct JobConfig {
    pub model_name: String,
    /// Ours or mistral.rs; part of the sampling hash when not ours.
    pub engine: LogitsEngine,
    /// The content digest of the model's files (see [`crate::model::Checkpoint::digest`]).
    pub model_digest: String,
    /// The sampling parameters (`n` and `logprobs` among them: `logprobs` is not part of the
    /// sampling hash, the tokens do not change).
    pub params: SamplingParams,
    pub block_size: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub kv_cache_bytes: u64,
    /// fp8 e4m3 keys and values (CUDA).
    pub kv_fp8: bool,
    pub target_correct: Option<u32>,
    /// Problems per committed part.
    pub part_problems: usize,
    pub grade: GradeOptions,
    pub thinking: Option<ThinkingBudget>,
    /// This run's shard `(i, n)`; `(0, 1)` for an unsharded run.
    pub shard: (usize, usize),
    /// The digest ([`problems_digest`]) of the whole problem set the shard was cut from, as
    /// file metadata: `pipeline merge` refuses shards of different sets. `None`: the run's own
    /// problems are the set.
    pub problem_set: Option<String>,
    /// Where progress goes (bar or lines, and a `progress.json`).
    pub progress: crate::progress::Target,
}

/// A rendered prompt: its text and token ids.
pub type Prompt = (String, Vec<u32>);

/// A job ready to run: its problems' prompts, template and config, and its output.
pub struct Job<'a> {
    pub problems: &'a [Problem],
    pub prompts: Vec<Prompt>,
    pub template: PromptTemplate,
    pub cfg: JobConfig,
    pub output: PathBuf,
}

/// Figures for the end-of-run summary.
#[derive(Debug, Clone, Default)]
pub struct JobSummary {
    pub problems: usize,
    pub problems_resumed: usize,
    /// Samples drawn and correct ones in this process (a resumed run's earlier ones not counted).
    pub samples: u64,
    pub correct: u64,
    /// What the output holds: every committed part, resumed ones included.
    pub output: super::parts::OutputCounts,
    /// The tokens this process's engine computed (prompt tokens recomputed after a preemption
    /// counted again; a resumed run's earlier ones not counted): its throughput.
    pub prompt_tokens: u64,
    pub generated_tokens: u64,
    /// `None` where the engine does not say (mistral.rs).
    pub preemptions: Option<u64>,
    pub samples_saved: u64,
    pub seconds: f64,
}

impl JobSummary {
    /// The summary line of `pipeline sample` and the sample stage.
    pub fn print(&self, output: &Path) {
        let s = self;
        tracing::info!(
            "{} problems ({} resumed), {} samples, {} correct in this run; prompt tokens {}, \
             generated tokens {} ({:.0} tok/s), preemptions {}, samples saved by target_correct \
             {}, {:.1}s; wrote {} ({} rows, {} correct)",
            s.problems,
            s.problems_resumed,
            s.samples,
            s.correct,
            s.prompt_tokens,
            s.generated_tokens,
            s.generated_tokens as f64 / s.seconds.max(1e-9),
            s.preemptions
                .map_or("not reported by the engine".to_string(), |p| p.to_string()),
            s.samples_saved,
            s.seconds,
            output.display(),
            s.output.rows,
            s.output.correct
        );
    }
}

/// A hash naming everything that shapes the samples (for the `sampling_hash` column): the
/// model as named, the sampling parameters' stable text ([`SamplingParams::hash_text`]), the
/// prompt template and the engine.
pub fn sampling_hash(
    model: &str,
    params: &SamplingParams,
    template: &PromptTemplate,
    engine: &str,
) -> String {
    let mut text = format!("{model}|{}|{}|{template:?}", params.n, params.hash_text());
    // Another engine's logits differ in the last bits: its samples are another dataset. Ours
    // adds nothing, so that every existing hash stays.
    if engine != ENGINE_OURS {
        text.push_str(&format!("|engine={engine}"));
    }
    hex::encode(Sha256::digest(text.as_bytes()))
        .get(..16)
        .unwrap_or_default()
        .to_string()
}
