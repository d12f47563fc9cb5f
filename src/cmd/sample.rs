//! `pipeline sample`: sample completions for the problems of a file with a local or hub model and
//! write the completions Parquet (graded when the file has gold answers).
//!
//! Parses the flags into a sampling job and prints the end summary; the work is in
//! `sampler::job`. Knows nothing of stages.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use crate::data::source::{AnswerExtract, FieldMap, Location, SourceFormat, SourceSpec};
use crate::data::{hub, load_source};
use crate::sampler::job::{self, SampleSettings};

#[derive(Debug, clap::Args)]
pub struct SampleArgs {
    /// A checkpoint folder or a hub id (e.g. Qwen/Qwen3-4B).
    #[arg(long)]
    pub model: String,
    /// Problems: JSONL or Parquet (or hf://owner/name/file).
    #[arg(long)]
    pub input: String,
    /// Dataset format of the input: gsm8k, math, aime, amc, or mapped (use the field flags).
    #[arg(long, default_value = "mapped")]
    pub format: String,
    #[arg(long, default_value = "problem")]
    pub problem_field: String,
    /// Gold answers: samples are graded and `--target-correct` can stop a problem early.
    #[arg(long)]
    pub answer_field: Option<String>,
    #[arg(long)]
    pub id_field: Option<String>,
    /// `chat` (the checkpoint's template), `raw` (the problem text as is) or a Jinja file using
    /// `{{ problem }}`.
    #[arg(long, default_value = "chat")]
    pub prompt_template: String,
    /// A system message for the chat template.
    #[arg(long)]
    pub system: Option<String>,
    /// Passed to the chat template as `enable_thinking` (Qwen3); unset leaves it undefined.
    #[arg(long)]
    pub enable_thinking: Option<bool>,
    /// Thinking budget: after this many generated tokens without `</think>`, append
    /// --thinking-close-text and let the model answer within the rest of --max-new-tokens.
    #[arg(long)]
    pub max_thinking_tokens: Option<usize>,
    #[arg(long, default_value = "\n</think>\n\n")]
    pub thinking_close_text: String,
    /// Samples per problem (at most, with --target-correct).
    #[arg(long, default_value_t = 1)]
    pub n: u32,
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1024)]
    pub max_new_tokens: usize,
    #[arg(long, default_value_t = 0)]
    pub min_new_tokens: usize,
    /// Stop strings (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    #[arg(long)]
    pub ignore_eos: bool,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Most sequences decoding at once.
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Token budget of one step (prefill chunks and decode tokens together).
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,
    /// KV cache size, e.g. "4 GiB"; default: a quarter of the available memory.
    #[arg(long)]
    pub kv_cache: Option<String>,
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Stop sampling a problem once this many of its samples are correct (needs --answer-field).
    #[arg(long)]
    pub target_correct: Option<u32>,
    /// This process's shard, I/N (also from SLURM_ARRAY_TASK_ID/COUNT or JOB_COMPLETION_INDEX).
    #[arg(long)]
    pub shard: Option<String>,
    /// Shard count with JOB_COMPLETION_INDEX (Kubernetes indexed Jobs).
    #[arg(long)]
    pub num_shards: Option<usize>,
    /// Only the first N problems.
    #[arg(long)]
    pub limit: Option<usize>,
    #[arg(long)]
    pub output: PathBuf,
}

fn source_spec(a: &SampleArgs) -> Result<SourceSpec> {
    let format: SourceFormat = serde_json::from_value(serde_json::Value::String(a.format.clone()))
        .with_context(|| {
            format!(
                "--format {}: use gsm8k, math, aime, amc or mapped",
                a.format
            )
        })?;
    let mut fields = FieldMap::preset(format);
    if format == SourceFormat::Mapped {
        fields.problem = vec![a.problem_field.clone()];
        fields.answer = a.answer_field.clone();
        fields.answer_extract = AnswerExtract::Field;
    }
    if let Some(f) = &a.id_field {
        fields.id = Some(f.clone());
    }
    let name = std::path::Path::new(&a.input)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "input".into());
    Ok(SourceSpec {
        name,
        format,
        location: Location::parse(&a.input, std::path::Path::new("."), None)
            .map_err(|e| anyhow::anyhow!("--input: {e}"))?,
        fields,
        limit: a.limit,
    })
}

impl SampleArgs {
    fn settings(&self) -> SampleSettings {
        SampleSettings {
            model: self.model.clone(),
            prompt_template: self.prompt_template.clone(),
            system: self.system.clone(),
            enable_thinking: self.enable_thinking,
            n: self.n,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            max_new_tokens: self.max_new_tokens,
            min_new_tokens: self.min_new_tokens,
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            seed: self.seed,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            kv_cache: self.kv_cache.clone(),
            block_size: self.block_size,
            target_correct: self.target_correct,
            max_thinking_tokens: self.max_thinking_tokens,
            thinking_close_text: self.thinking_close_text.clone(),
        }
    }
}

pub fn run(a: &SampleArgs) -> Result<()> {
    if a.target_correct.is_some() && a.answer_field.is_none() && a.format == "mapped" {
        bail!("--target-correct needs gold answers: give --answer-field");
    }
    let settings = a.settings();
    settings
        .validate()
        .map_err(|e| anyhow::anyhow!("--{}", e.replacen('_', "-", 3)))?;
    let spec = source_spec(a)?;
    let files = hub::resolve(&spec.location)?;
    // Without an answer field a mapped source has no gold: load it with a stand-in, then clear.
    let mut spec_for_load = spec.clone();
    if spec_for_load.fields.answer.is_none() {
        spec_for_load.fields.answer = Some(a.problem_field.clone());
    }
    let (mut problems, _) = load_source(&spec_for_load, &files, false)?;
    if spec.fields.answer.is_none() {
        for p in &mut problems {
            p.gold_answer.clear();
        }
    }
    let shard = job::resolve_shard(a.shard.as_deref(), a.num_shards)?;
    if let Some(shard) = shard {
        problems.retain(|p| job::in_shard(&p.problem_id, shard));
        eprintln!("shard {}/{}: {} problems", shard.0, shard.1, problems.len());
    }
    let s = job::run_settings(&settings, &problems, shard.unwrap_or((0, 1)), &a.output)?;
    print_summary(&s, &a.output);
    Ok(())
}

pub fn print_summary(s: &job::JobSummary, output: &std::path::Path) {
    println!(
        "{} problems ({} resumed), {} samples, {} correct; prompt tokens {}, generated tokens {} \
         ({:.0} tok/s), preemptions {}, samples saved by target_correct {}, {:.1}s; wrote {}",
        s.problems,
        s.problems_resumed,
        s.samples,
        s.correct,
        s.prompt_tokens,
        s.generated_tokens,
        s.generated_tokens as f64 / s.seconds.max(1e-9),
        s.preemptions,
        s.samples_saved,
        s.seconds,
        output.display()
    );
}
