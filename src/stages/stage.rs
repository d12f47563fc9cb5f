//! The vocabulary every stage shares: the kinds of stage, a planned stage and its key, the
//! plan as a list of stages, the files stages hand each other, the estimates preflight reads,
//! and a stage's state on disk.
//!
//! Knows nothing of what a stage computes, of how the plan is built ([`super::plan`]) or run
//! ([`super::runner`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::store::{self, InputRef, Manifest, OutputFile};

/// The kinds of stage, in pipeline order. A config's plan is the subsequence it configures
/// (sample, filter and train repeated per round).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StageKind {
    Data,
    Pretrain,
    Sample,
    Filter,
    Train,
    Eval,
}

impl StageKind {
    pub const ALL: [StageKind; 6] = [
        StageKind::Data,
        StageKind::Pretrain,
        StageKind::Sample,
        StageKind::Filter,
        StageKind::Train,
        StageKind::Eval,
    ];

    /// The kind's name: the stage's name in a one-round plan, the first part of its folder's
    /// name and of its key (so it must never change).
    pub fn as_str(self) -> &'static str {
        match self {
            StageKind::Data => "data",
            StageKind::Pretrain => "pretrain",
            StageKind::Sample => "sample",
            StageKind::Filter => "filter",
            StageKind::Train => "train",
            StageKind::Eval => "eval",
        }
    }

    pub fn parse(name: &str) -> Option<StageKind> {
        StageKind::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

impl std::fmt::Display for StageKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

// The files stages write for the stages after them (and the report) to read: the only way
// stages meet. Each is written by the stage named beside it.
/// `data`: the problems (`data::schema::problems_schema`).
pub const PROBLEMS: &str = "problems.parquet";
/// `sample`: the completions (`data::schema::completions_schema`).
pub const COMPLETIONS: &str = "completions.parquet";
/// `filter`: the SFT rows (`data::schema::sft_schema`).
pub const SFT: &str = "sft.parquet";
/// `pretrain` and `train`: the model folder (Hugging Face layout).
pub const MODEL_DIR: &str = "model";
/// `pretrain` and `train`: checkpoints and `metrics.jsonl`.
pub const TRAIN_STATE_DIR: &str = "train_state";
/// `eval`: every model's metrics on every set.
pub const EVAL_METRICS: &str = "metrics.json";

/// One stage of a plan, with everything that determines its output already resolved.
#[derive(Debug, Clone)]
pub struct PlannedStage {
    /// Unique in the plan: the kind, with `-r<N>` in a multi-round plan.
    pub name: String,
    /// Which runner.
    pub kind: StageKind,
    /// The stages this one reads, by role (`data`, `completions`, `sft`, `model`, `trained`).
    pub deps: Vec<(&'static str, String)>,
    /// The model this stage loads (a folder or hub id), resolved: another stage's output folder
    /// when an earlier stage makes it.
    pub model: Option<String>,
    pub key: String,
    pub dir: PathBuf,
    pub code_version: u32,
    /// The stage's validated config section (hashed into the key, stored in the manifest).
    pub config: serde_json::Value,
    pub inputs: Vec<InputRef>,
    /// Local files this stage reads, by input name.
    pub files: Vec<(String, PathBuf)>,
    /// Rough figures for preflight.
    pub estimate: Estimate,
}

/// What a stage is expected to need, from its input sizes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Estimate {
    pub disk_bytes: u64,
    /// Host memory.
    pub memory_bytes: u64,
    /// GPU memory, for a stage that runs on one (0: none).
    #[serde(default)]
    pub gpu_bytes: u64,
    /// Rows the stage writes, where they can be counted or bounded before it runs (problems,
    /// samples, SFT rows).
    #[serde(default)]
    pub rows: Option<u64>,
    /// Tokens per written row (prompt and completion), for the stage that trains on them.
    #[serde(default)]
    pub row_tokens: Option<u64>,
    /// The compute the stage does, for the time and cost estimate ([`cost`]).
    #[serde(default)]
    pub work: Option<Work>,
    /// The built-in dataset cards (`data::cards`) its figures come from: hub data that is not
    /// downloaded yet, counted from its card (said in the cost table).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cards: Vec<String>,
}

/// Tokens a stage generates or trains on, and where.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Work {
    pub tokens: u64,
    /// Training (6 FLOPs per parameter and token) rather than generating.
    pub train: bool,
    pub params: u64,
    pub device: crate::device::DeviceSpec,
    /// Sequences decoded at once (generation).
    pub batch: usize,
    /// How `tokens` was counted, said in the table.
    pub basis: String,
}

/// The completion length assumed before a run: half of `max_new_tokens`.
pub fn expected_completion_tokens(max_new_tokens: usize) -> u64 {
    (max_new_tokens as u64).div_ceil(2)
}

/// Bytes a completions row takes in our zstd Parquet with `tokens` completion tokens from a
/// model of `vocab` tokens: prompt and completion text and token ids, ~4 bytes a token after
/// compression for a real tokenizer's text (measured on math completions), ~1 for a small
/// word-level vocabulary (ids and words compress far better); plus per completion token 8 bytes
/// for each logprob kept (the chosen token's and `logprobs` alternatives').
pub fn completion_row_bytes(tokens: u64, vocab: usize, logprobs: Option<usize>) -> u64 {
    let per_token = if vocab < 4096 { 1 } else { 4 };
    let lp = logprobs.map_or(0, |k| 8 * (1 + k as u64));
    32 + per_token * (ASSUMED_PROMPT_TOKENS + tokens) + lp * tokens
}

/// The prompt length assumed before the prompts are rendered (a math problem in a chat
/// template).
pub const ASSUMED_PROMPT_TOKENS: u64 = 150;
/// Tokens a prompt adds to its problem (a chat template and a one-line system prompt), assumed.
pub const ASSUMED_TEMPLATE_TOKENS: u64 = 40;

#[derive(Debug, Clone)]
pub struct Plan {
    pub workdir: PathBuf,
    pub stages: Vec<PlannedStage>,
}

impl Plan {
    /// The stage `stage` reads in `role`.
    pub fn dep(&self, stage: &PlannedStage, role: &str) -> Result<&PlannedStage> {
        let name = stage
            .deps
            .iter()
            .find(|(r, _)| *r == role)
            .map(|(_, n)| n.as_str())
            .with_context(|| format!("stage {} has no `{role}` input", stage.name))?;
        self.get(name)
            .with_context(|| format!("stage {} reads {name}, which is not planned", stage.name))
    }

    pub fn get(&self, name: &str) -> Option<&PlannedStage> {
        self.stages.iter().find(|s| s.name == name)
    }
}

/// Named counts, in the order a stage reports them (rules, reasons, skipped rows).
pub type Counts = Vec<(String, u64)>;

/// What a finished stage reports to the runner, which adds timing and writes the manifest.
pub struct StageOutput {
    pub outputs: Vec<OutputFile>,
    pub counts: Counts,
    pub rows: u64,
}

/// A stage's state on disk.
#[derive(Debug, Clone, PartialEq)]
pub enum StageState {
    Done(Box<Manifest>),
    Partial(Option<store::Progress>),
    NotStarted,
}

/// A stage is done when its manifest exists and every output it lists is there with its size.
pub fn stage_state(dir: &Path) -> Result<StageState> {
    if let Some(m) = store::read_manifest(dir)? {
        let intact = m
            .outputs
            .iter()
            .all(|o| std::fs::metadata(dir.join(&o.path)).is_ok_and(|md| md.len() == o.bytes));
        if intact {
            return Ok(StageState::Done(Box::new(m)));
        }
        return Ok(StageState::Partial(store::read_progress(dir)));
    }
    if dir.exists() {
        return Ok(StageState::Partial(store::read_progress(dir)));
    }
    Ok(StageState::NotStarted)
}

impl PlannedStage {
    /// A stage with no dependencies and no model yet: the fields every `plan` fills.
    pub fn new(
        kind: StageKind,
        workdir: &Path,
        code_version: u32,
        config: serde_json::Value,
        inputs: Vec<InputRef>,
    ) -> PlannedStage {
        let key = stage_key(kind.as_str(), code_version, &config, &inputs);
        PlannedStage {
            name: kind.to_string(),
            kind,
            deps: Vec::new(),
            model: None,
            dir: store::stage_dir(workdir, kind.as_str(), &key),
            key,
            code_version,
            config,
            inputs,
            files: Vec::new(),
            estimate: Estimate::default(),
        }
    }

    /// This stage's model folder (pretrain and train stages) as a model input of later stages:
    /// fingerprinted by this stage's key, since the folder does not exist yet at planning.
    pub fn model_input(&self) -> InputRef {
        InputRef {
            name: "model".into(),
            location: self.dir.join(MODEL_DIR).display().to_string(),
            hash: self.key.clone(),
        }
    }
}

/// The key of a stage: a hash over everything that determines its output. File locations are
/// left out (their content hashes are inputs), so a moved file or another spelling of its path
/// keeps the cache.
pub fn stage_key(
    name: &str,
    code_version: u32,
    config: &serde_json::Value,
    inputs: &[InputRef],
) -> String {
    let hashes: Vec<_> = inputs.iter().map(|i| (&i.name, &i.hash)).collect();
    store::hash_json(&serde_json::json!({
        "stage": name,
        "code_version": code_version,
        "config": without_locations(config),
        "inputs": hashes,
    }))
}

fn without_locations(v: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| k.as_str() != "location")
                .map(|(k, v)| (k.clone(), without_locations(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_locations).collect()),
        other => other.clone(),
    }
}

/// Describes an output file for a manifest.
pub fn output_file(dir: &Path, path: &Path, rows: u64) -> Result<OutputFile> {
    Ok(OutputFile {
        path: path.strip_prefix(dir).unwrap_or(path).display().to_string(),
        bytes: std::fs::metadata(path)
            .with_context(|| format!("missing output {}", path.display()))?
            .len(),
        rows,
    })
}
