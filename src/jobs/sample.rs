//! A sampling job: problems in, a completions Parquet out, resumable.
//!
//! 1) Prompts are built from the problems (chat template, raw text, or a Jinja file with
//!    `{{ problem }}`). 2) The engine samples `n` completions per problem; with gold answers, each
//!    finished sample is graded, and with `target_correct = k` a problem stops being sampled once
//!    k samples are correct. 3) Finished problems are committed in parts (every problem's samples
//!    in one part, each part written whole) under `<output>.parts/`, so a killed run resumes
//!    without duplicates or gaps: it skips the problems already committed, and every sample's
//!    tokens depend only on (seed, problem id, sample index). 4) At the end the parts are joined,
//!    in input order, into the output file (atomically).
//!
//! Knows nothing of stages or configs: the `pipeline sample` command and the sample stage call it.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use serde::{Deserialize, Serialize};

use crate::data::schema::{
    completions_batch, completions_schema, has_logprobs, read_completions, write_parquet_atomic,
    write_parquet_atomic_kv, Completion, Grade, Logprobs, Problem,
};
use crate::model::{ChatTemplate, Message, TextTokenizer, Transformer};
use crate::sampler::engine::{
    kv_cache_bytes_per_token, kv_cache_memory, Decoder, Engine, EngineConfig, Request, Sample,
    ThinkingBudget,
};
use crate::sampler::sampling::SamplingParams;
use crate::sampler::scheduler::SchedulerConfig;
use crate::sampler::state_slots::StateSlots;
use crate::verify::{grade, GradeOptions};

/// How a problem becomes a prompt.
#[derive(Debug, Clone)]
pub enum PromptTemplate {
    /// The checkpoint's chat template, with an optional system message.
    Chat {
        system: Option<String>,
        enable_thinking: Option<bool>,
    },
    /// The problem text unchanged.
    Raw,
    /// A Jinja template with `{{ problem }}`.
    File(String),
}

impl PromptTemplate {
    /// `chat`, `raw`, or a Jinja file's path (read here).
    pub fn parse(
        name: &str,
        system: Option<String>,
        enable_thinking: Option<bool>,
    ) -> Result<PromptTemplate> {
        Ok(match name {
            "chat" => PromptTemplate::Chat {
                system,
                enable_thinking,
            },
            "raw" => PromptTemplate::Raw,
            path => PromptTemplate::File(std::fs::read_to_string(path).with_context(|| {
                format!("prompt_template `{path}`: not chat, raw or a readable file")
            })?),
        })
    }

    pub fn from_settings(s: &SampleSettings) -> Result<PromptTemplate> {
        PromptTemplate::parse(&s.prompt_template, s.system.clone(), s.enable_thinking)
    }
}

#[derive(Debug, Clone)]
pub struct JobConfig {
    pub model_name: String,
    /// [`ENGINE_OURS`] or [`ENGINE_MISTRALRS`]; part of the sampling hash when not ours.
    pub engine: String,
    pub n: u32,
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
    /// Per-token logprobs and this many alternatives in the output (see
    /// [`SampleSettings::logprobs`]); not part of the sampling hash (the tokens do not change).
    pub logprobs: Option<usize>,
    /// Where progress goes (bar or lines, and a `progress.json`).
    pub progress: crate::progress::Target,
}

/// Metadata keys of a completions file, read by `pipeline merge`.
pub const META_SHARD: &str = "selfdistill.shard";
pub const META_SAMPLING_HASH: &str = "selfdistill.sampling_hash";
pub const META_PROBLEMS: &str = "selfdistill.problems";

fn d_chat() -> String {
    "chat".into()
}
fn d_one() -> u32 {
    1
}
fn d_max_new() -> usize {
    1024
}
fn d_seqs() -> usize {
    64
}
fn d_budget() -> usize {
    2048
}
fn d_block() -> usize {
    16
}
fn d_cpu() -> String {
    "cpu".into()
}
fn d_auto() -> String {
    "auto".into()
}
fn d_close() -> String {
    "\n</think>\n\n".into()
}
fn d_one_f() -> f32 {
    1.0
}
fn is_one(v: &f32) -> bool {
    *v == 1.0
}
fn is_zero(v: &f32) -> bool {
    *v == 0.0
}

/// The most alternatives `logprobs` may ask for per token (vLLM's default `max_logprobs`).
pub const MAX_LOGPROBS: usize = 20;

/// Everything a sampling run is configured with: the `[sample]` section of a pipeline config
/// and the flags of `pipeline sample` (same names, same defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct SampleSettings {
    /// A checkpoint folder or a hub id (e.g. Qwen/Qwen3-4B). A pipeline with `[pretrain]`
    /// leaves it out: the pretrained model is used.
    #[serde(default)]
    #[arg(long)]
    pub model: String,
    /// `chat` (the checkpoint's template), `raw` (the problem text as is) or a Jinja file using
    /// `{{ problem }}`.
    #[serde(default = "d_chat")]
    #[arg(long, default_value_t = d_chat())]
    pub prompt_template: String,
    /// A system message for the chat template.
    #[arg(long)]
    pub system: Option<String>,
    /// Passed to the chat template as `enable_thinking` (Qwen3); unset leaves it undefined.
    #[arg(long)]
    pub enable_thinking: Option<bool>,
    /// Samples per problem (at most, with target_correct).
    #[serde(default = "d_one")]
    #[arg(long, default_value_t = d_one())]
    pub n: u32,
    /// 0 = greedy.
    #[serde(default)]
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[serde(default = "d_one_f")]
    #[arg(long, default_value_t = d_one_f())]
    pub top_p: f32,
    /// 0 = off.
    #[serde(default)]
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[serde(default)]
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// vLLM's (and HF's) repetition penalty over the prompt's and the generated tokens: a
    /// positive logit is divided by it, a negative one multiplied; 1 = off.
    #[serde(default = "d_one_f", skip_serializing_if = "is_one")]
    #[arg(long, default_value_t = d_one_f())]
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token generated so far (vLLM's); 0 = off.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Subtracted from a generated token's logit once per time it was generated (vLLM's);
    /// 0 = off.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Token ids that end a sample like EOS (kept in the completion, as vLLM does); repeatable
    /// or comma-separated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[arg(long, value_delimiter = ',')]
    pub stop_token_ids: Vec<u32>,
    /// Write each generated token's log-probability and the `K` most likely tokens at its
    /// position (vLLM's `logprobs = K`: the raw model's, before penalties and temperature) as
    /// the columns `token_logprobs`, `top_logprob_ids`, `top_logprobs`; 0 = the chosen token's
    /// only. Unset: no columns and no cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub logprobs: Option<usize>,
    #[serde(default = "d_max_new")]
    #[arg(long, default_value_t = d_max_new())]
    pub max_new_tokens: usize,
    #[serde(default)]
    #[arg(long, default_value_t = 0)]
    pub min_new_tokens: usize,
    /// Stop strings (repeatable).
    #[serde(default)]
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    #[serde(default)]
    #[arg(long)]
    pub ignore_eos: bool,
    /// Samples are seeded by (seed, problem id, sample index).
    #[serde(default)]
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Most sequences decoding at once.
    #[serde(default = "d_seqs")]
    #[arg(long, default_value_t = d_seqs())]
    pub max_num_seqs: usize,
    /// Token budget of one step (prefill chunks and decode tokens together).
    #[serde(default = "d_budget")]
    #[arg(long, default_value_t = d_budget())]
    pub max_num_batched_tokens: usize,
    /// KV cache size ("4 GiB"); default: what the run needs, at most a quarter of free memory.
    #[arg(long)]
    pub kv_cache: Option<String>,
    #[serde(default = "d_block")]
    #[arg(long, default_value_t = d_block())]
    pub block_size: usize,
    /// `cpu`, or `cuda` / `cuda:N` (a binary built with `--features cuda`).
    #[serde(default = "d_cpu")]
    #[arg(long, default_value_t = d_cpu())]
    pub device: String,
    /// Weights' dtype: `auto` (f32 on the CPU, bf16 on a GPU), `f32` or `bf16`.
    #[serde(default = "d_auto")]
    #[arg(long, default_value_t = d_auto())]
    pub dtype: String,
    /// `auto` (the weights' dtype) or `fp8` (e4m3 keys and values: half the bytes of bf16;
    /// CUDA with bf16 weights).
    #[serde(default = "d_auto")]
    #[arg(long, default_value_t = d_auto())]
    pub kv_cache_dtype: String,
    /// Stop sampling a problem once this many of its samples are correct (needs gold answers).
    #[arg(long)]
    pub target_correct: Option<u32>,
    /// Thinking budget: after this many generated tokens without `</think>`, append
    /// thinking_close_text and let the model answer within the rest of max_new_tokens.
    #[arg(long)]
    pub max_thinking_tokens: Option<usize>,
    #[serde(default = "d_close")]
    #[arg(long, default_value_t = d_close())]
    pub thinking_close_text: String,
    /// Which engine computes the logits: `selfdistill` (ours) or `mistralrs` (mistral.rs, in a
    /// binary built with `--features mistralrs`). Prompts, the draw of every token (our sampler,
    /// seeded per sample), stop rules, grading and the Parquet are the same with both.
    #[serde(default = "d_engine", skip_serializing_if = "is_default_engine")]
    #[arg(long, default_value_t = d_engine())]
    pub engine: String,
}

/// The default sampling engine: ours.
pub const ENGINE_OURS: &str = "selfdistill";
/// mistral.rs (the `mistralrs` feature).
pub const ENGINE_MISTRALRS: &str = "mistralrs";

fn d_engine() -> String {
    ENGINE_OURS.into()
}
fn is_default_engine(e: &String) -> bool {
    e == ENGINE_OURS
}

impl SampleSettings {
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            max_new_tokens: self.max_new_tokens,
            min_new_tokens: self.min_new_tokens,
            stop_token_ids: self.stop_token_ids.clone(),
            stop_strings: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            seed: self.seed,
        }
    }

    /// Range checks; the message starts with the offending field's name.
    pub fn validate(&self) -> std::result::Result<(), String> {
        self.params().validate()?;
        for (name, v) in [
            ("n", self.n as usize),
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("block_size", self.block_size),
        ] {
            if v == 0 {
                return Err(format!("{name} must be at least 1"));
            }
        }
        if let Some(s) = &self.kv_cache {
            crate::bytes::parse_bytes(s).map_err(|e| format!("kv_cache: {e}"))?;
        }
        let gpu = match self.device.as_str() {
            "cpu" => false,
            d if d == "cuda"
                || d.strip_prefix("cuda:")
                    .is_some_and(|n| n.parse::<usize>().is_ok()) =>
            {
                true
            }
            d => return Err(format!("device must be cpu, cuda or cuda:N, got `{d}`")),
        };
        match (self.dtype.as_str(), gpu) {
            ("auto" | "f32", _) | ("bf16", true) => {}
            ("bf16", false) => {
                return Err("dtype bf16 needs a cuda device (the CPU sampler runs f32)".into())
            }
            (d, _) => return Err(format!("dtype must be auto, f32 or bf16, got `{d}`")),
        }
        match (self.kv_cache_dtype.as_str(), gpu) {
            ("auto", _) => {}
            ("fp8", true) if self.dtype != "f32" => {}
            ("fp8", _) => {
                return Err("kv_cache_dtype fp8 needs a cuda device and bf16 weights".into())
            }
            (d, _) => return Err(format!("kv_cache_dtype must be auto or fp8, got `{d}`")),
        }
        if self.target_correct == Some(0) {
            return Err("target_correct must be at least 1".into());
        }
        if let Some(k) = self.logprobs.filter(|&k| k > MAX_LOGPROBS) {
            return Err(format!(
                "logprobs must be at most {MAX_LOGPROBS} (alternatives per token), got {k}"
            ));
        }
        match self.engine.as_str() {
            ENGINE_OURS => Ok(()),
            ENGINE_MISTRALRS => self.validate_mistralrs(gpu),
            e => Err(format!(
                "engine must be {ENGINE_OURS} or {ENGINE_MISTRALRS}, got `{e}`"
            )),
        }
    }

    /// The settings mistral.rs cannot honour, refused by name: it ends a sequence at the
    /// model's EOS (so no `ignore_eos`), schedules prefill its own way (no
    /// `max_num_batched_tokens`), and has no paged KV cache on the CPU (no `kv_cache` or
    /// `block_size` there).
    fn validate_mistralrs(&self, gpu: bool) -> std::result::Result<(), String> {
        if !cfg!(feature = "mistralrs") {
            return Err(format!(
                "engine: `{ENGINE_MISTRALRS}` needs a binary built with `--features mistralrs` \
                 (cargo build --release --features mistralrs)"
            ));
        }
        if self.ignore_eos {
            return Err(
                "ignore_eos: the mistralrs engine ends a sequence at the model's EOS; \
                        use engine = \"selfdistill\""
                    .into(),
            );
        }
        if self.max_num_batched_tokens != d_budget() {
            return Err(format!(
                "max_num_batched_tokens: the mistralrs engine has no per-step token budget \
                 (it schedules prefill itself); leave it at {}",
                d_budget()
            ));
        }
        if !gpu && self.kv_cache.is_some() {
            return Err(
                "kv_cache: the mistralrs engine has no paged KV cache on the CPU (its \
                        cache grows per sequence); leave it unset or use a cuda device"
                    .into(),
            );
        }
        if !gpu && self.block_size != d_block() {
            return Err(format!(
                "block_size: the mistralrs engine has no paged KV cache on the CPU; leave it \
                 at {}",
                d_block()
            ));
        }
        if gpu && ![8, 16, 32].contains(&self.block_size) {
            return Err(format!(
                "block_size: mistral.rs's paged attention takes 8, 16 or 32, got {}",
                self.block_size
            ));
        }
        Ok(())
    }
}

/// What the job loop needs of a sampling engine: ours ([`Engine`]) or mistral.rs's
/// (`super::mistralrs`, the `mistralrs` feature). Requests are numbered in the order they are
/// added; a finished sample names its request.
pub trait SampleEngine {
    fn add(&mut self, req: Request) -> Result<usize>;
    /// Runs until some samples finish (or a step passes) and returns them.
    fn step(&mut self, decode: Option<Decoder>) -> Result<Vec<Sample>>;
    /// Drops the request's unfinished samples; returns how many.
    fn cancel(&mut self, request: usize) -> u64;
    fn is_idle(&self) -> bool;
    fn num_running(&self) -> usize;
    /// Fraction of the KV cache in use, where the engine says it.
    fn kv_usage(&self) -> Option<f64>;
    /// Sequences preempted so far, where the engine says it.
    fn preemptions(&self) -> Option<u64>;
    fn prompt_tokens(&self) -> u64;
    fn generated_tokens(&self) -> u64;
}

impl SampleEngine for Engine<'_> {
    fn add(&mut self, req: Request) -> Result<usize> {
        Engine::add(self, req)
    }
    fn step(&mut self, decode: Option<Decoder>) -> Result<Vec<Sample>> {
        Engine::step(self, decode)
    }
    fn cancel(&mut self, request: usize) -> u64 {
        Engine::cancel(self, request)
    }
    fn is_idle(&self) -> bool {
        Engine::is_idle(self)
    }
    fn num_running(&self) -> usize {
        Engine::num_running(self)
    }
    fn kv_usage(&self) -> Option<f64> {
        Some(Engine::kv_usage(self))
    }
    fn preemptions(&self) -> Option<u64> {
        Some(Engine::preemptions(self))
    }
    fn prompt_tokens(&self) -> u64 {
        self.stats.prompt_tokens_computed
    }
    fn generated_tokens(&self) -> u64 {
        self.stats.generated_tokens
    }
}

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
        let n = s.n.max(1) as usize;
        let sequence_blocks = (prompt + s.max_new_tokens).div_ceil(bs);
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
            s.n,
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
    if s.max_new_tokens >= config.max_position_embeddings {
        bail!(
            "sample.max_new_tokens = {} does not fit the model's context of {} tokens",
            s.max_new_tokens,
            config.max_position_embeddings
        );
    }
    if s.device != "cpu" {
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
        Some(text) => {
            crate::bytes::parse_bytes(text).map_err(|e| anyhow::anyhow!("kv_cache: {e}"))?
        }
        None => {
            let need = KvNeed::new(ESTIMATE_PROMPT_TOKENS, s, s.max_num_seqs);
            (blocks(&need) * s.block_size) as u64 * per_token
        }
    })
}

/// GPU memory a run on a GPU cannot do without: the weights in the compute dtype, the CUDA
/// context (1 GiB), the recurrent layers' state for max_num_seqs sequences, and the KV cache
/// (`kv_cache`, or the least that runs these settings: see [`KvNeed`]; the default cache takes
/// what is left, 90% of it). 0 on the CPU.
pub fn gpu_memory_estimate(s: &SampleSettings, config: &crate::model::ModelConfig) -> Result<u64> {
    if s.device == "cpu" {
        return Ok(0);
    }
    let params = config.num_params() as u64;
    let weight = if s.dtype == "f32" { 4 } else { 2 };
    // the CPU cache stores f32; on the GPU the weights' dtype, or one byte with fp8
    let per_token_f32 = crate::sampler::kv_cache::KvCache::bytes_per_token(config) as u64;
    let per_token = match (s.kv_cache_dtype.as_str(), weight) {
        ("fp8", _) => per_token_f32 / 4,
        (_, 2) => per_token_f32 / 2,
        _ => per_token_f32,
    };
    let states = (s.max_num_seqs * StateSlots::bytes_per_seq(config)) as u64;
    let kv = planned_kv(s, per_token, |need| need.min_blocks)?;
    Ok(params * weight + states + kv + (1 << 30))
}

/// Loads the model and runs the job described by `s` over `problems` (gold answers, where not
/// empty, are graded).
pub fn run_settings(
    s: &SampleSettings,
    problems: &[Problem],
    shard: (usize, usize),
    output: &Path,
    progress: &crate::progress::Target,
) -> Result<JobSummary> {
    s.validate()
        .map_err(|e| anyhow::anyhow!("sample settings: {e}"))?;
    let ck = crate::model::Checkpoint::open(&s.model)?;
    let tok = ck.tokenizer()?;
    let template = PromptTemplate::from_settings(s)?;
    let chat = match &template {
        PromptTemplate::Chat { .. } => Some(ck.chat_template()?),
        _ => None,
    };
    let prompts = build_prompts(problems, &template, chat.as_ref(), &tok)?;
    let device = crate::model::parse_device(&s.device)?;
    let dtype = crate::model::parse_dtype(&s.dtype, &device)?;
    let kv_fp8 = s.kv_cache_dtype == "fp8";
    let vocab = ck.config.vocab_size;
    if let Some(id) = s.stop_token_ids.iter().find(|&&id| id as usize >= vocab) {
        bail!(
            "stop_token_ids: {id} is not a token id of {} (vocabulary of {vocab})",
            s.model
        );
    }
    let thinking = match s.max_thinking_tokens {
        None => None,
        Some(max_thinking_tokens) => Some(ThinkingBudget {
            max_thinking_tokens,
            think_end_id: tok
                .token_id("</think>")
                .context("max_thinking_tokens: the tokenizer has no `</think>` token")?,
            closing: tok.encode(&s.thinking_close_text.replace("\\n", "\n"))?,
        }),
    };
    let mut cfg = JobConfig {
        model_name: s.model.clone(),
        engine: s.engine.clone(),
        n: s.n,
        params: s.params(),
        block_size: s.block_size,
        max_num_seqs: s.max_num_seqs,
        max_num_batched_tokens: s.max_num_batched_tokens,
        kv_cache_bytes: 0,
        kv_fp8,
        target_correct: s.target_correct,
        part_problems: 8,
        grade: GradeOptions {
            thinking: s.enable_thinking == Some(true),
            ..GradeOptions::default()
        },
        thinking,
        shard,
        logprobs: s.logprobs,
        progress: progress.clone(),
    };
    let eos = ck.eos_token_ids()?;
    if s.engine == ENGINE_MISTRALRS {
        #[cfg(not(feature = "mistralrs"))]
        bail!("engine: `{ENGINE_MISTRALRS}` needs a binary built with `--features mistralrs`");
        #[cfg(feature = "mistralrs")]
        return run_mistralrs(
            s, &ck, device, dtype, &tok, &eos, problems, &prompts, &cfg, &template, output,
        );
    }
    let mut model = ck.load_transformer(&device, dtype)?;
    model.set_fused_inference(true)?;
    // Default KV cache: what max_num_seqs sequences of the longest prompt plus max_new_tokens
    // need, capped at a quarter of the available memory (on a GPU: 90% of its free memory).
    let longest = prompts.iter().map(|(_, ids)| ids.len()).max().unwrap_or(0);
    let per_token = kv_cache_bytes_per_token(&model, kv_fp8) as u64;
    let need = KvNeed::new(longest, s, problems.len());
    let block_bytes = per_token * s.block_size as u64;
    cfg.kv_cache_bytes = match &s.kv_cache {
        Some(text) => {
            crate::bytes::parse_bytes(text).map_err(|e| anyhow::anyhow!("kv_cache: {e}"))?
        }
        None => (need.default_blocks as u64 * block_bytes).min(kv_cache_memory(&device)?),
    };
    need.check(cfg.kv_cache_bytes / block_bytes.max(1), block_bytes, s)?;
    let mut engine = Engine::new(&model, engine_config(&model, &eos, &prompts, &cfg))?;
    run(
        &mut engine,
        &tok,
        problems,
        &prompts,
        &cfg,
        &template,
        output,
    )
}

/// The job on mistral.rs ([`super::mistralrs`]): its model and scheduler, our prompts, draws
/// and stop rules.
#[cfg(feature = "mistralrs")]
#[allow(clippy::too_many_arguments)]
fn run_mistralrs(
    s: &SampleSettings,
    ck: &crate::model::Checkpoint,
    device: candle_core::Device,
    dtype: candle_core::DType,
    tok: &TextTokenizer,
    eos: &[u32],
    problems: &[Problem],
    prompts: &[(String, Vec<u32>)],
    cfg: &JobConfig,
    template: &PromptTemplate,
    output: &Path,
) -> Result<JobSummary> {
    let kv_cache_bytes = s
        .kv_cache
        .as_deref()
        .map(crate::bytes::parse_bytes)
        .transpose()
        .map_err(|e| anyhow::anyhow!("kv_cache: {e}"))?;
    let opts = super::mistralrs::Options {
        model_dir: ck.dir.clone(),
        device,
        dtype,
        max_num_seqs: s.max_num_seqs,
        block_size: s.block_size,
        kv_cache_bytes,
        kv_fp8: cfg.kv_fp8,
        context: prompts.iter().map(|(_, ids)| ids.len()).max().unwrap_or(0) + s.max_new_tokens,
    };
    let draws = super::mistralrs::Draws {
        params: cfg.params.clone(),
        eos_token_ids: eos.to_vec(),
        thinking: cfg.thinking.clone(),
        logprobs: cfg.logprobs,
    };
    let mut engine = super::mistralrs::MistralRsEngine::new(&opts, draws, tok.clone())?;
    run(&mut engine, tok, problems, prompts, cfg, template, output)
}

/// Figures for the end-of-run summary.
#[derive(Debug, Clone, Default)]
pub struct JobSummary {
    pub problems: usize,
    pub problems_resumed: usize,
    pub samples: u64,
    pub correct: u64,
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
            "{} problems ({} resumed), {} samples, {} correct; prompt tokens {}, generated tokens {} \
             ({:.0} tok/s), preemptions {}, samples saved by target_correct {}, {:.1}s; wrote {}",
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
            output.display()
        );
    }
}

/// Renders and tokenizes every problem's prompt.
pub fn build_prompts(
    problems: &[Problem],
    template: &PromptTemplate,
    chat: Option<&ChatTemplate>,
    tok: &TextTokenizer,
) -> Result<Vec<(String, Vec<u32>)>> {
    problems
        .iter()
        .map(|p| {
            let text = match template {
                PromptTemplate::Raw => p.problem.clone(),
                PromptTemplate::Chat {
                    system,
                    enable_thinking,
                } => {
                    let chat = chat.context("the checkpoint has no chat template")?;
                    let mut msgs = Vec::new();
                    if let Some(s) = system {
                        msgs.push(Message::new("system", s));
                    }
                    msgs.push(Message::new("user", &p.problem));
                    chat.render(&msgs, true, *enable_thinking)?
                }
                PromptTemplate::File(src) => {
                    let env = minijinja::Environment::new();
                    env.render_str(src, minijinja::context! { problem => p.problem.clone() })
                        .with_context(|| format!("prompt template for {}", p.problem_id))?
                }
            };
            let ids = tok.encode(&text)?;
            Ok((text, ids))
        })
        .collect()
}

/// A hash naming everything that shapes the samples (for the `sampling_hash` column).
pub fn sampling_hash(cfg: &JobConfig, template: &PromptTemplate) -> String {
    let mut text = format!(
        "{}|{}|{:?}|{:?}",
        cfg.model_name, cfg.n, cfg.params, template
    );
    // Another engine's logits differ in the last bits: its samples are another dataset. Ours
    // adds nothing, so that every existing hash stays.
    if cfg.engine != ENGINE_OURS {
        text.push_str(&format!("|engine={}", cfg.engine));
    }
    hex::encode(Sha256::digest(text.as_bytes()))
        .get(..16)
        .unwrap_or_default()
        .to_string()
}

fn parts_dir(output: &Path) -> PathBuf {
    let mut s = output.as_os_str().to_owned();
    s.push(".parts");
    PathBuf::from(s)
}

/// Runs the job; `problems` and `prompts` are in input order.
#[allow(clippy::too_many_arguments)]
pub fn run(
    engine: &mut dyn SampleEngine,
    tok: &TextTokenizer,
    problems: &[Problem],
    prompts: &[(String, Vec<u32>)],
    cfg: &JobConfig,
    template: &PromptTemplate,
    output: &Path,
) -> Result<JobSummary> {
    let t0 = Instant::now();
    let parts = parts_dir(output);
    std::fs::create_dir_all(&parts)
        .with_context(|| format!("cannot create {}", parts.display()))?;
    let done = committed_problems(&parts)?;
    let shash = sampling_hash(cfg, template);
    let mut summary = JobSummary {
        problems: problems.len(),
        ..JobSummary::default()
    };
    let mut index_of_request = Vec::new();
    for (i, (p, (_, ids))) in problems.iter().zip(prompts).enumerate() {
        if done.contains(&p.problem_id) {
            summary.problems_resumed += 1;
            continue;
        }
        engine.add(Request {
            problem_id: p.problem_id.clone(),
            prompt: ids.clone(),
            n: cfg.n,
        })?;
        index_of_request.push(i);
    }
    if summary.problems_resumed > 0 {
        tracing::info!(
            "resuming: {} of {} problems already committed in {}",
            summary.problems_resumed,
            problems.len(),
            parts.display()
        );
    }
    let n = cfg.n as u64;
    let mut tracker = cfg
        .progress
        .tracker("samples", Some(problems.len() as u64 * n))
        .resumed(summary.problems_resumed as u64 * n);
    let decode = |ids: &[u32]| tok.decode(ids).unwrap_or_default();
    let mut pending: HashMap<usize, Vec<Completion>> = HashMap::new();
    let mut finished_problems: Vec<usize> = Vec::new();
    let mut correct_per_request: HashMap<usize, u32> = HashMap::new();
    let mut remaining: HashMap<usize, u32> =
        (0..index_of_request.len()).map(|r| (r, cfg.n)).collect();
    let mut next_part = next_part_index(&parts)?;
    let mut last_detail: Option<Instant> = None;
    while !engine.is_idle() {
        let finished: Vec<Sample> = engine.step(Some(&decode))?;
        for s in finished {
            let pi = index_of_request[s.request];
            let row = to_row(&s, &problems[pi], &prompts[pi], tok, cfg, &shash)?;
            summary.samples += 1;
            if row.grade.as_ref().is_some_and(|g| g.correct) {
                summary.correct += 1;
                let c = correct_per_request.entry(s.request).or_insert(0);
                *c += 1;
                if cfg.target_correct.is_some_and(|k| *c >= k) {
                    let saved = engine.cancel(s.request);
                    summary.samples_saved += saved;
                    tracker.inc(saved);
                    if let Some(r) = remaining.get_mut(&s.request) {
                        *r = r.saturating_sub(saved as u32);
                    }
                }
            }
            pending.entry(s.request).or_default().push(row);
            tracker.inc(1);
            if let Some(r) = remaining.get_mut(&s.request) {
                *r = r.saturating_sub(1);
                if *r == 0 {
                    finished_problems.push(s.request);
                }
            }
        }
        if finished_problems.len() >= cfg.part_problems {
            commit_part(&parts, &mut next_part, &mut finished_problems, &mut pending)?;
        }
        if last_detail.is_none_or(|t| t.elapsed().as_secs_f64() > 0.5) {
            tracker.detail(detail(engine, problems.len(), &remaining, t0));
            last_detail = Some(Instant::now());
        }
    }
    commit_part(&parts, &mut next_part, &mut finished_problems, &mut pending)?;
    tracker.detail(detail(engine, problems.len(), &remaining, t0));
    tracker.finish();
    join_parts(&parts, problems, cfg, &shash, output)?;
    std::fs::remove_dir_all(&parts)
        .with_context(|| format!("cannot remove {}", parts.display()))?;
    summary.prompt_tokens = engine.prompt_tokens();
    summary.generated_tokens = engine.generated_tokens();
    summary.preemptions = engine.preemptions();
    summary.seconds = t0.elapsed().as_secs_f64();
    Ok(summary)
}

/// The engine's settings for this job, with a KV cache of `cfg.kv_cache_bytes` (said on
/// stderr, with how many sequences of the longest prompt it holds).
fn engine_config(
    model: &Transformer,
    eos: &[u32],
    prompts: &[(String, Vec<u32>)],
    cfg: &JobConfig,
) -> EngineConfig {
    let per_block = (kv_cache_bytes_per_token(model, cfg.kv_fp8) * cfg.block_size).max(1) as u64;
    let num_blocks = (cfg.kv_cache_bytes / per_block) as usize;
    let tokens = num_blocks * cfg.block_size;
    let longest = prompts.iter().map(|(_, ids)| ids.len()).max().unwrap_or(0);
    let per_seq = longest + cfg.params.max_new_tokens;
    let state = StateSlots::bytes_per_seq(model.config());
    let states = if state > 0 {
        format!(
            "; recurrent state: {} slots of {:.2} MiB = {:.1} MiB",
            cfg.max_num_seqs,
            state as f64 / (1 << 20) as f64,
            (cfg.max_num_seqs * state) as f64 / (1 << 20) as f64
        )
    } else {
        String::new()
    };
    tracing::info!(
        "KV cache: {num_blocks} blocks of {} tokens = {tokens} tokens ({:.1} MiB): room for {} \
         sequences of the longest prompt plus max_new_tokens ({per_seq} tokens){states}",
        cfg.block_size,
        cfg.kv_cache_bytes as f64 / (1 << 20) as f64,
        tokens / per_seq.max(1),
    );
    EngineConfig {
        scheduler: SchedulerConfig {
            block_size: cfg.block_size,
            max_num_seqs: cfg.max_num_seqs,
            max_num_batched_tokens: cfg.max_num_batched_tokens,
        },
        num_blocks,
        params: cfg.params.clone(),
        eos_token_ids: eos.to_vec(),
        kv_fp8: cfg.kv_fp8,
        logprobs: cfg.logprobs,
        thinking: cfg.thinking.clone(),
    }
}

/// Joins the committed parts, in input order (then sample index), into `output` (atomically),
/// with the shard, sampling hash and problem count as file metadata.
fn join_parts(
    parts: &Path,
    problems: &[Problem],
    cfg: &JobConfig,
    shash: &str,
    output: &Path,
) -> Result<()> {
    let order: HashMap<&str, usize> = problems
        .iter()
        .enumerate()
        .map(|(i, p)| (p.problem_id.as_str(), i))
        .collect();
    let mut rows = Vec::new();
    for part in part_files(parts)? {
        rows.extend(read_completions(&part)?);
    }
    rows.sort_by_key(|r| (order.get(r.problem_id.as_str()).copied(), r.sample_index));
    let graded = rows.iter().all(|r| r.grade.is_some());
    let logprobs = cfg.logprobs.is_some();
    let batches = rows
        .chunks(crate::data::schema::ROW_GROUP_ROWS)
        .map(|c| completions_batch(c, graded, logprobs))
        .collect::<Result<Vec<_>>>()?;
    let kv = vec![
        (
            META_SHARD.to_string(),
            format!("{}/{}", cfg.shard.0, cfg.shard.1),
        ),
        (META_SAMPLING_HASH.to_string(), shash.to_string()),
        (META_PROBLEMS.to_string(), problems.len().to_string()),
    ];
    write_parquet_atomic_kv(output, completions_schema(graded, logprobs), &batches, &kv)?;
    Ok(())
}

fn to_row(
    s: &Sample,
    p: &Problem,
    prompt: &(String, Vec<u32>),
    tok: &TextTokenizer,
    cfg: &JobConfig,
    shash: &str,
) -> Result<Completion> {
    let text = tok.decode(&s.tokens)?;
    // A stop string ends the completion where it starts.
    let text = match crate::sampler::sampling::stop_string_hit(&text, &cfg.params.stop_strings) {
        Some(i) => text.get(..i).unwrap_or(&text).to_string(),
        None => text,
    };
    let grade_row = (!p.gold_answer.is_empty()).then(|| {
        let v = grade(&text, &p.gold_answer, &cfg.grade);
        Grade {
            gold_answer: p.gold_answer.clone(),
            extracted_answer: v.extracted,
            correct: v.correct,
            reason: v.reason.as_str().to_string(),
        }
    });
    Ok(Completion {
        problem_id: s.problem_id.clone(),
        sample_index: s.sample_index as i32,
        prompt: prompt.0.clone(),
        prompt_token_ids: Some(prompt.1.iter().map(|&t| t as i32).collect()),
        completion: text,
        completion_token_ids: Some(s.tokens.iter().map(|&t| t as i32).collect()),
        finish_reason: Some(s.finish_reason.as_str().to_string()),
        num_completion_tokens: Some(s.tokens.len() as i32),
        cumulative_logprob: Some(s.cumulative_logprob),
        seed: Some(cfg.params.seed as i64),
        model: Some(cfg.model_name.clone()),
        sampling_hash: Some(shash.to_string()),
        grade: grade_row,
        logprobs: s.logprobs.as_ref().map(|lp| Logprobs {
            token: lp.iter().map(|t| t.logprob).collect(),
            top_ids: lp
                .iter()
                .map(|t| t.top.iter().map(|&(id, _)| id as i32).collect())
                .collect(),
            top: lp
                .iter()
                .map(|t| t.top.iter().map(|&(_, p)| p).collect())
                .collect(),
        }),
    })
}

fn part_files(parts: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(parts)
        .with_context(|| format!("cannot read {}", parts.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("part-"))
        })
        .collect();
    files.sort();
    Ok(files)
}

fn next_part_index(parts: &Path) -> Result<usize> {
    Ok(part_files(parts)?.len())
}

/// Problem ids whose samples are already committed.
fn committed_problems(parts: &Path) -> Result<HashSet<String>> {
    let mut done = HashSet::new();
    for p in part_files(parts)? {
        for r in read_completions(&p)? {
            done.insert(r.problem_id);
        }
    }
    Ok(done)
}

fn commit_part(
    parts: &Path,
    next: &mut usize,
    finished: &mut Vec<usize>,
    pending: &mut HashMap<usize, Vec<Completion>>,
) -> Result<()> {
    if finished.is_empty() {
        return Ok(());
    }
    let mut rows = Vec::new();
    for r in finished.drain(..) {
        rows.extend(pending.remove(&r).unwrap_or_default());
    }
    if rows.is_empty() {
        return Ok(());
    }
    let graded = rows.iter().all(|r| r.grade.is_some());
    let logprobs = has_logprobs(&rows);
    let batch = completions_batch(&rows, graded, logprobs)?;
    let path = parts.join(format!("part-{:06}.parquet", *next));
    write_parquet_atomic(&path, completions_schema(graded, logprobs), &[batch])?;
    *next += 1;
    crate::fault::point("sample.part");
    Ok(())
}

/// The sampler's side of a progress line: problems finished, tokens/s, batch, KV use.
fn detail(
    engine: &dyn SampleEngine,
    total: usize,
    remaining: &HashMap<usize, u32>,
    t0: Instant,
) -> String {
    let open = remaining.values().filter(|r| **r > 0).count();
    let secs = t0.elapsed().as_secs_f64();
    let tps = engine.generated_tokens() as f64 / secs.max(1e-9);
    let kv = engine
        .kv_usage()
        .map(|u| format!("  KV {:.0}%", 100.0 * u))
        .unwrap_or_default();
    format!(
        "problems {}/{total}  {tps:.0} tok/s  running {}{kv}",
        total - open,
        engine.num_running(),
    )
}

/// Which shard this process is: `--shard I/N`, else `SLURM_ARRAY_TASK_ID`/`SLURM_ARRAY_TASK_COUNT`,
/// else `JOB_COMPLETION_INDEX` with `num_shards` (or `SELFDISTILL_NUM_SHARDS`).
pub fn resolve_shard(
    flag: Option<&str>,
    num_shards: Option<usize>,
) -> Result<Option<(usize, usize)>> {
    let parse = |i: &str, n: &str, what: &str| -> Result<(usize, usize)> {
        let i: usize = i
            .trim()
            .parse()
            .with_context(|| format!("{what}: `{i}` is not a number"))?;
        let n: usize = n
            .trim()
            .parse()
            .with_context(|| format!("{what}: `{n}` is not a number"))?;
        if n == 0 || i >= n {
            bail!("{what}: shard {i} of {n} does not exist (shards are 0..{n})");
        }
        Ok((i, n))
    };
    if let Some(f) = flag {
        let (i, n) = f.split_once('/').context("--shard takes I/N, e.g. 0/4")?;
        return parse(i, n, "--shard").map(Some);
    }
    if let (Ok(_), Ok(n)) = (
        std::env::var("SLURM_ARRAY_TASK_ID"),
        std::env::var("SLURM_ARRAY_TASK_COUNT"),
    ) {
        // an array of any range and step (`--array=1-8`, `0-14:2`): the task's place in it
        let num = |k: &str, default: i64| -> Result<i64> {
            match std::env::var(k) {
                Ok(v) => v
                    .trim()
                    .parse()
                    .with_context(|| format!("{k}: `{v}` is not a number")),
                Err(_) => Ok(default),
            }
        };
        let id = num("SLURM_ARRAY_TASK_ID", 0)?;
        let (min, step) = (
            num("SLURM_ARRAY_TASK_MIN", 0)?,
            num("SLURM_ARRAY_TASK_STEP", 1)?.max(1),
        );
        let place = (id - min) / step;
        return parse(
            &place.to_string(),
            &n,
            "SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT (from SLURM_ARRAY_TASK_MIN, _STEP)",
        )
        .map(Some);
    }
    if let Ok(i) = std::env::var("JOB_COMPLETION_INDEX") {
        let from_env = std::env::var("SELFDISTILL_NUM_SHARDS").ok();
        let n = match (num_shards, from_env) {
            (Some(n), _) => n,
            (None, Some(n)) => n
                .trim()
                .parse()
                .with_context(|| format!("SELFDISTILL_NUM_SHARDS: `{n}` is not a number"))?,
            (None, None) => bail!(
                "JOB_COMPLETION_INDEX is set: give --num-shards or SELFDISTILL_NUM_SHARDS (the \
                 Job's completions)"
            ),
        };
        return parse(&i, &n.to_string(), "JOB_COMPLETION_INDEX").map(Some);
    }
    Ok(None)
}

/// Whether `problem_id` belongs to shard `i` of `n` (by a stable hash of the id).
pub fn in_shard(problem_id: &str, shard: (usize, usize)) -> bool {
    let h = Sha256::digest(problem_id.as_bytes());
    let first: [u8; 8] = h.get(..8).and_then(|b| b.try_into().ok()).unwrap_or([0; 8]);
    let v = u64::from_le_bytes(first);
    (v % shard.1 as u64) as usize == shard.0
}

/// Joins the outputs of a sharded run (all N shards of one sampling hash, each once) into one
/// completions file, rows ordered by problem id then sample index. Refuses incomplete sets.
pub fn merge(inputs: &[PathBuf], output: &Path) -> Result<usize> {
    merge_ordered(inputs, output, None)
}

/// [`merge`], with the rows in the order of `problem_ids` (then sample index) when given: the
/// order an unsharded run of those problems writes.
pub fn merge_ordered(
    inputs: &[PathBuf],
    output: &Path,
    problem_ids: Option<&[String]>,
) -> Result<usize> {
    let mut seen: Vec<Option<PathBuf>> = Vec::new();
    let mut hash: Option<String> = None;
    let mut rows = Vec::new();
    let mut problems = 0usize;
    for p in inputs {
        let kv: HashMap<String, String> = crate::data::schema::read_kv_metadata(p)?
            .into_iter()
            .collect();
        let shard = kv
            .get(META_SHARD)
            .with_context(|| format!("{} was not written by `pipeline sample`", p.display()))?;
        let (i, n) = shard
            .split_once('/')
            .and_then(|(i, n)| Some((i.parse::<usize>().ok()?, n.parse::<usize>().ok()?)))
            .with_context(|| format!("{}: bad shard `{shard}`", p.display()))?;
        let h = kv.get(META_SAMPLING_HASH).cloned().unwrap_or_default();
        match &hash {
            None => hash = Some(h),
            Some(x) if *x != h => bail!(
                "{} was sampled with other settings (sampling hash {h}, not {x})",
                p.display()
            ),
            _ => {}
        }
        if seen.is_empty() {
            seen = vec![None; n];
        }
        if n != seen.len() || i >= n {
            bail!(
                "{}: shard {i}/{n} does not belong to a set of {} shards",
                p.display(),
                seen.len()
            );
        }
        if let Some(prev) = &seen[i] {
            bail!(
                "shard {i}/{n} given twice: {} and {}",
                prev.display(),
                p.display()
            );
        }
        seen[i] = Some(p.clone());
        problems += kv
            .get(META_PROBLEMS)
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        rows.extend(read_completions(p)?);
    }
    let missing: Vec<String> = seen
        .iter()
        .enumerate()
        .filter(|(_, s)| s.is_none())
        .map(|(i, _)| i.to_string())
        .collect();
    if seen.is_empty() || !missing.is_empty() {
        bail!(
            "incomplete shard set: missing shard(s) {} of {}",
            missing.join(", "),
            seen.len()
        );
    }
    match problem_ids {
        Some(ids) => {
            let order: HashMap<&str, usize> = ids
                .iter()
                .enumerate()
                .map(|(i, p)| (p.as_str(), i))
                .collect();
            if let Some(r) = rows
                .iter()
                .find(|r| !order.contains_key(r.problem_id.as_str()))
            {
                bail!(
                    "the shards hold problem `{}`, which is not among the problems",
                    r.problem_id
                );
            }
            rows.sort_by_key(|r| (order.get(r.problem_id.as_str()).copied(), r.sample_index));
        }
        None => rows
            .sort_by(|a, b| (&a.problem_id, a.sample_index).cmp(&(&b.problem_id, b.sample_index))),
    }
    let graded = rows.iter().all(|r| r.grade.is_some());
    let logprobs = has_logprobs(&rows);
    let batches = rows
        .chunks(crate::data::schema::ROW_GROUP_ROWS)
        .map(|c| completions_batch(c, graded, logprobs))
        .collect::<Result<Vec<_>>>()?;
    let kv = vec![
        (META_SHARD.to_string(), "0/1".to_string()),
        (META_SAMPLING_HASH.to_string(), hash.unwrap_or_default()),
        (META_PROBLEMS.to_string(), problems.to_string()),
    ];
    write_parquet_atomic_kv(output, completions_schema(graded, logprobs), &batches, &kv)?;
    Ok(rows.len())
}
