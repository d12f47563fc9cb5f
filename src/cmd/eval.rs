//! `pipeline eval`: evaluate one or more models on eval sets (`evals/*.toml`) with the same
//! seeds, and print and write the metrics (see `eval`). Parses flags; the work is in `eval`.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::eval::{self, EvalConfig};

#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// A checkpoint folder or a hub id (repeatable; the first is the baseline of the deltas).
    #[arg(long = "model", required = true)]
    pub models: Vec<String>,
    /// Eval sets, comma-separated: names of `evals/<name>.toml` or paths of definition files.
    #[arg(long, value_delimiter = ',', required = true)]
    pub sets: Vec<String>,
    /// Samples per problem (default: the set's).
    #[arg(long)]
    pub n: Option<u32>,
    /// Sampling temperature (default: the set's; 0 = greedy).
    #[arg(long)]
    pub temperature: Option<f32>,
    #[arg(long)]
    pub top_p: Option<f32>,
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long)]
    pub min_p: Option<f32>,
    /// vLLM's repetition penalty (1 = off).
    #[arg(long)]
    pub repetition_penalty: Option<f32>,
    /// vLLM's presence penalty (0 = off).
    #[arg(long, allow_negative_numbers = true)]
    pub presence_penalty: Option<f32>,
    /// vLLM's frequency penalty (0 = off).
    #[arg(long, allow_negative_numbers = true)]
    pub frequency_penalty: Option<f32>,
    /// Token ids that end a sample like EOS (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub stop_token_ids: Option<Vec<u32>>,
    /// Per-token log-probabilities (and K alternatives) in each set's samples Parquet.
    #[arg(long)]
    pub logprobs: Option<usize>,
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Chat template's `enable_thinking` (Qwen3), over the sets' own.
    #[arg(long)]
    pub enable_thinking: Option<bool>,
    /// Only the first N problems of each set.
    #[arg(long)]
    pub limit: Option<usize>,
    /// `cpu`, or `cuda` / `cuda:N` (default: the set's, cpu).
    #[arg(long)]
    pub device: Option<String>,
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// `selfdistill` (ours) or `mistralrs` (a binary built with `--features mistralrs`).
    #[arg(long)]
    pub engine: Option<String>,
    #[arg(long)]
    pub output: PathBuf,
}

pub fn run(a: &EvalArgs) -> Result<()> {
    let cfg = EvalConfig {
        sets: a.sets.clone(),
        model: None,
        n: a.n,
        temperature: a.temperature,
        top_p: a.top_p,
        top_k: a.top_k,
        max_new_tokens: a.max_new_tokens,
        enable_thinking: a.enable_thinking,
        limit: a.limit,
        seed: a.seed,
        device: a.device.clone(),
        max_num_seqs: a.max_num_seqs,
        min_p: a.min_p,
        repetition_penalty: a.repetition_penalty,
        presence_penalty: a.presence_penalty,
        frequency_penalty: a.frequency_penalty,
        stop_token_ids: a.stop_token_ids.clone(),
        logprobs: a.logprobs,
        engine: a.engine.clone(),
    };
    let sets = cfg.load_sets(Path::new("."))?;
    eval::evaluate(&a.models, &sets, &cfg, &a.output, None)?;
    println!("wrote {}", a.output.display());
    Ok(())
}
