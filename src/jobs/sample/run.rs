//! The run of a sampling job: settings to a loaded model and engine ([`run_settings`]), then
//! the loop ([`run`]) that feeds the engine the problems not yet committed, grades each finished
//! sample, stops a problem at `target_correct`, commits finished problems in parts
//! ([`super::parts`]) and joins them into the output.
//!
//! Knows nothing of stages, configs or the command line.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use super::engine::SampleEngine;
use super::memory::KvNeed;
use super::parts::{
    check_key, commit_part, committed_problems, join_parts, next_part_index, parts_dir,
    problems_digest, PartsKey,
};
use super::prompt::{build_prompts, PromptTemplate};
use super::settings::{KvCacheDtype, LogitsEngine, SampleSettings, ENGINE_OURS};
use crate::data::schema::{Completion, Grade, Logprobs, Problem};
use crate::model::{TextTokenizer, Transformer};
use crate::sampler::backend::{kv_cache_bytes_per_token, kv_cache_memory};
use crate::sampler::engine::{Engine, EngineConfig, Request, Sample, ThinkingBudget};
use crate::sampler::params::SamplingParams;
use crate::sampler::scheduler::SchedulerConfig;
use crate::sampler::state_slots::StateSlots;
use crate::verify::{grade, GradeOptions};

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

/// The prompts `s` gives `problems` with the checkpoint's tokenizer and chat template, as the
/// model sees them (left-truncated to `truncate_prompt_tokens`), and the template.
pub fn prompts_of(
    s: &SampleSettings,
    ck: &crate::model::Checkpoint,
    tok: &TextTokenizer,
    problems: &[Problem],
) -> Result<(PromptTemplate, Vec<Prompt>)> {
    let template = PromptTemplate::from_settings(s)?;
    let chat = match &template {
        PromptTemplate::Chat { .. } => Some(ck.chat_template()?),
        _ => None,
    };
    let mut prompts = build_prompts(problems, &template, chat.as_ref(), tok)?;
    if let Some(k) = s.params.truncate_prompt_tokens {
        // vLLM's left truncation; the prompt column holds what the model saw
        for (text, ids) in prompts.iter_mut().filter(|(_, ids)| ids.len() > k) {
            ids.drain(..ids.len() - k);
            *text = tok.decode(ids)?;
        }
    }
    Ok((template, prompts))
}

/// Loads the model and runs the job described by `s` over `problems` (gold answers, where not
/// empty, are graded).
pub fn run_settings(
    s: &SampleSettings,
    problems: &[Problem],
    shard: (usize, usize),
    problem_set: Option<&str>,
    output: &Path,
    progress: &crate::progress::Target,
) -> Result<JobSummary> {
    s.validate()
        .map_err(|e| anyhow::anyhow!("sample settings: {e}"))?;
    let ck = crate::model::Checkpoint::open(&s.model)?;
    let tok = ck.tokenizer()?;
    let (template, prompts) = prompts_of(s, &ck, &tok, problems)?;
    let device = crate::model::open_device(s.device)?;
    let dtype = s.dtype.resolve(s.device).map_err(anyhow::Error::msg)?;
    let kv_fp8 = s.kv_cache_dtype == KvCacheDtype::Fp8;
    let vocab = ck.config.vocab_size;
    // before the KV cache is sized for it: a length past the context is the model's limit
    let context = ck.config.max_position_embeddings;
    if s.params.max_new_tokens >= context {
        bail!(
            "max_new_tokens = {} does not fit the context of {} ({context} tokens, prompt \
             included): give at most {}",
            s.params.max_new_tokens,
            s.model,
            context.saturating_sub(1)
        );
    }
    if let Some(id) = s
        .params
        .stop_token_ids
        .iter()
        .find(|&&id| id as usize >= vocab)
    {
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
        engine: s.engine,
        model_digest: ck.digest()?.hex,
        params: s.params.clone(),
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
        problem_set: problem_set.map(str::to_string),
        progress: progress.clone(),
    };
    let eos = ck.eos_token_ids()?;
    if s.engine == LogitsEngine::Mistralrs {
        #[cfg(not(feature = "mistralrs"))]
        bail!(
            "engine: `{}` needs a binary built with `--features mistralrs`",
            s.engine.as_str()
        );
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
        Some(size) => size.bytes(),
        None => {
            // on a GPU the recurrent layers' state slots take their memory beside the cache
            let states = if device.is_cuda() {
                (s.max_num_seqs * StateSlots::bytes_per_seq(model.config())) as u64
            } else {
                0
            };
            (need.default_blocks as u64 * block_bytes)
                .min(kv_cache_memory(&device)?.saturating_sub(states))
        }
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

/// The job on mistral.rs ([`crate::jobs::mistralrs`]): its model and scheduler, our prompts, draws
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
    let kv_cache_bytes = s.kv_cache.as_ref().map(|k| k.bytes());
    let opts = crate::jobs::mistralrs::Options {
        model_dir: ck.dir.clone(),
        device,
        dtype,
        max_num_seqs: s.max_num_seqs,
        block_size: s.block_size,
        kv_cache_bytes,
        kv_fp8: cfg.kv_fp8,
        context: prompts.iter().map(|(_, ids)| ids.len()).max().unwrap_or(0)
            + s.params.max_new_tokens,
    };
    let draws = crate::jobs::mistralrs::Draws {
        params: cfg.params.clone(),
        eos_token_ids: eos.to_vec(),
        thinking: cfg.thinking.clone(),
    };
    let mut engine = crate::jobs::mistralrs::MistralRsEngine::new(&opts, draws, tok.clone())?;
    run(&mut engine, tok, problems, prompts, cfg, template, output)
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
    let shash = sampling_hash(&cfg.model_name, &cfg.params, template, cfg.engine.as_str());
    let key = PartsKey {
        model: cfg.model_name.clone(),
        model_digest: cfg.model_digest.clone(),
        problems: problems_digest(problems),
        prompt_template: format!("{template:?}"),
        engine: cfg.engine.as_str().to_string(),
        thinking: format!("{:?}", cfg.thinking),
        grading: format!("{:?}", cfg.grade),
        shard: format!("{}/{}", cfg.shard.0, cfg.shard.1),
        params: cfg.params.clone(),
    };
    check_key(&parts, &key, &shash)?;
    let done = committed_problems(&parts)?;
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
            n: cfg.params.n,
            settings: None,
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
    let n = cfg.params.n as u64;
    let mut tracker = cfg
        .progress
        .tracker("samples", Some(problems.len() as u64 * n))
        .resumed(summary.problems_resumed as u64 * n);
    let decode = |ids: &[u32]| tok.decode(ids).unwrap_or_default();
    let mut pending: HashMap<usize, Vec<Completion>> = HashMap::new();
    let mut finished_problems: Vec<usize> = Vec::new();
    let mut correct_per_request: HashMap<usize, u32> = HashMap::new();
    let mut remaining: HashMap<usize, u32> = (0..index_of_request.len())
        .map(|r| (r, cfg.params.n))
        .collect();
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
    let set = cfg
        .problem_set
        .clone()
        .unwrap_or_else(|| problems_digest(problems));
    summary.output = join_parts(
        &parts,
        problems,
        (cfg.shard, &set),
        cfg.params.logprobs.is_some(),
        &shash,
        output,
    )?;
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
        thinking: cfg.thinking.clone(),
    }
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
        rationalized: false,
    })
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
