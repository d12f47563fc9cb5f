//! A run of one or more sampling jobs on one model: settings to jobs ([`prepare_job`]: prompts,
//! checks, the job's config), the model loaded once and one engine sized for every job
//! ([`run_jobs`]), then [`super::feed`]'s loop. Jobs that share a run must agree on what the
//! engine is ([`engine_difference`]); each may have its own sampling parameters, prompts and
//! output.
//!
//! Knows nothing of stages, configs or the command line.

use std::path::Path;

use anyhow::{bail, Context, Result};

use super::job::{Job, JobConfig, JobSummary, Prompt};
use super::memory::KvNeed;
use super::prompt::{build_prompts, PromptTemplate};
use super::settings::{KvCacheDtype, LogitsEngine, SampleSettings};
use crate::data::schema::Problem;
use crate::model::{Checkpoint, TextTokenizer, Transformer};
use crate::progress::Target;
use crate::sampler::backend::{kv_cache_bytes_per_token, kv_cache_memory};
use crate::sampler::engine::{Engine, EngineConfig, ThinkingBudget};
use crate::sampler::scheduler::SchedulerConfig;
use crate::sampler::state_slots::StateSlots;
use crate::verify::GradeOptions;

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

/// One job of a run: its settings, its problems (gold answers, where not empty, are graded),
/// its shard and where it writes and reports.
pub struct JobSpec<'a> {
    pub settings: &'a SampleSettings,
    pub problems: &'a [Problem],
    pub shard: (usize, usize),
    /// The whole set's digest, for a shard (see [`JobConfig::problem_set`]).
    pub problem_set: Option<&'a str>,
    pub output: &'a Path,
    pub progress: &'a Target,
}

/// Loads the model and runs the job described by `s` over `problems` (gold answers, where not
/// empty, are graded).
pub fn run_settings(
    s: &SampleSettings,
    problems: &[Problem],
    shard: (usize, usize),
    problem_set: Option<&str>,
    output: &Path,
    progress: &Target,
) -> Result<JobSummary> {
    let spec = JobSpec {
        settings: s,
        problems,
        shard,
        problem_set,
        output,
        progress,
    };
    let mut done = run_jobs(&[spec], progress)?;
    Ok(done.remove(0))
}

/// The first setting in which `b` runs another engine than `a` (another model, device, dtype,
/// cache, batch or engine): jobs that differ in one cannot share a run. `None`: they can.
pub fn engine_difference(a: &SampleSettings, b: &SampleSettings) -> Option<&'static str> {
    [
        ("model", a.model == b.model),
        ("device", a.device == b.device),
        ("dtype", a.dtype == b.dtype),
        ("kv_cache_dtype", a.kv_cache_dtype == b.kv_cache_dtype),
        ("kv_cache", a.kv_cache == b.kv_cache),
        ("block_size", a.block_size == b.block_size),
        ("max_num_seqs", a.max_num_seqs == b.max_num_seqs),
        (
            "max_num_batched_tokens",
            a.max_num_batched_tokens == b.max_num_batched_tokens,
        ),
        ("engine", a.engine == b.engine),
        ("enforce_eager", a.enforce_eager == b.enforce_eager),
    ]
    .into_iter()
    .find(|(_, same)| !same)
    .map(|(key, _)| key)
}

/// Loads the model once and runs every job of `specs` through one engine (see [`Loaded::run`]).
/// `overall` reports the run where there are several jobs.
pub fn run_jobs(specs: &[JobSpec], overall: &Target) -> Result<Vec<JobSummary>> {
    let Some(first) = specs.first() else {
        return Ok(Vec::new());
    };
    Loaded::open(first.settings)?.run(specs, overall)
}

/// A model loaded for sampling with the engine-wide settings of its runs: the checkpoint, its
/// tokenizer and content digest, the device and dtype, and the weights (none for mistral.rs,
/// which loads its own for each run). Every run of a stage's passes or of an evaluation's sets
/// on one model goes through one of these.
pub struct Loaded {
    settings: SampleSettings,
    ck: Checkpoint,
    tok: TextTokenizer,
    digest: String,
    device: candle_core::Device,
    /// The weights' dtype, for mistral.rs to load them in (ours are loaded already).
    #[cfg(feature = "mistralrs")]
    dtype: candle_core::DType,
    eos: Vec<u32>,
    model: Option<Transformer>,
}

impl Loaded {
    /// The model and engine `s` names, loaded (its settings checked first).
    pub fn open(s: &SampleSettings) -> Result<Loaded> {
        s.validate()
            .map_err(|e| anyhow::anyhow!("sample settings: {e}"))?;
        let ck = Checkpoint::open(&s.model)?;
        let tok = ck.tokenizer()?;
        let digest = ck.digest()?.hex;
        let device = crate::model::open_device(s.device)?;
        let dtype = s.dtype.resolve(s.device).map_err(anyhow::Error::msg)?;
        let eos = ck.eos_token_ids()?;
        let model = match s.engine {
            LogitsEngine::Mistralrs if !cfg!(feature = "mistralrs") => bail!(
                "engine: `{}` needs a binary built with `--features mistralrs`",
                s.engine.as_str()
            ),
            LogitsEngine::Mistralrs => None,
            LogitsEngine::Selfdistill => {
                let mut model = ck.load_transformer(&device, dtype)?;
                model.set_fused_inference(true)?;
                Some(model)
            }
        };
        Ok(Loaded {
            settings: s.clone(),
            ck,
            tok,
            digest,
            device,
            #[cfg(feature = "mistralrs")]
            dtype,
            eos,
            model,
        })
    }

    pub fn checkpoint(&self) -> &Checkpoint {
        &self.ck
    }

    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tok
    }

    /// Runs every job of `specs` through one engine on this model: their requests in one
    /// continuous batch, each with its own job's settings, each job's output what it would be
    /// alone. The jobs must agree with the model's settings on the engine
    /// ([`engine_difference`]); mistral.rs runs one job. `overall` reports the run where there
    /// are several jobs.
    pub fn run(&self, specs: &[JobSpec], overall: &Target) -> Result<Vec<JobSummary>> {
        let s = &self.settings;
        for spec in specs {
            spec.settings
                .validate()
                .map_err(|e| anyhow::anyhow!("sample settings: {e}"))?;
            if let Some(key) = engine_difference(s, spec.settings) {
                bail!("jobs of one run differ in `{key}`: they need an engine each");
            }
        }
        let mut jobs = specs
            .iter()
            .map(|spec| prepare_job(spec, &self.ck, &self.tok, &self.digest))
            .collect::<Result<Vec<_>>>()?;
        let Some(model) = &self.model else {
            #[cfg(feature = "mistralrs")]
            return run_mistralrs(self, jobs, overall);
            #[cfg(not(feature = "mistralrs"))]
            unreachable!("a model without weights is mistral.rs's, refused at open");
        };
        let engine_cfg = size_engine(s, model, &self.device, &self.eos, &mut jobs)?;
        let mut engine = Engine::new(model, engine_cfg)?;
        engine.set_cuda_graphs(!s.enforce_eager)?;
        let done = super::feed::run(&mut engine, &self.tok, &jobs, overall);
        let g = engine.graph_counts();
        if g.replayed + g.captured + g.eager > 0 {
            tracing::info!(
                "decode steps: {} replayed from CUDA graphs, {} captured, {} run eagerly under a \
                 graph's plan",
                g.replayed,
                g.captured,
                g.eager
            );
        }
        done
    }
}

/// The engine's settings for `jobs` on `model`, with the KV cache `kv_cache` gives, or by
/// default what max_num_seqs sequences of the longest prompt plus the longest max_new_tokens
/// need, capped at a quarter of the available memory (on a GPU: 90% of its free memory); each
/// job's config records the cache.
fn size_engine(
    s: &SampleSettings,
    model: &Transformer,
    device: &candle_core::Device,
    eos: &[u32],
    jobs: &mut [Job],
) -> Result<EngineConfig> {
    let longest = jobs
        .iter()
        .flat_map(|j| j.prompts.iter().map(|(_, ids)| ids.len()))
        .max()
        .unwrap_or(0);
    // the jobs together: the most samples and tokens any asks for, over all their problems
    let mut all = s.clone();
    all.params.n = jobs.iter().map(|j| j.cfg.params.n).max().unwrap_or(1);
    all.params.max_new_tokens = jobs
        .iter()
        .map(|j| j.cfg.params.max_new_tokens)
        .max()
        .unwrap_or(0);
    let problems = jobs.iter().map(|j| j.problems.len()).sum();
    let kv_fp8 = s.kv_cache_dtype == KvCacheDtype::Fp8;
    let per_token = kv_cache_bytes_per_token(model, kv_fp8) as u64;
    let need = KvNeed::new(longest, &all, problems);
    let block_bytes = per_token * s.block_size as u64;
    let bytes = match &s.kv_cache {
        Some(size) => size.bytes(),
        None => {
            // on a GPU the recurrent layers' state slots (and the padding slot) and the CUDA
            // graphs' kept output rows take their memory beside the cache
            let states = if device.is_cuda() {
                let cfg = model.config();
                let kept = if s.enforce_eager {
                    0
                } else {
                    s.max_num_seqs
                        * (cfg.vocab_size + cfg.hidden_size)
                        * model.dtype().size_in_bytes()
                };
                ((s.max_num_seqs + 1) * StateSlots::bytes_per_seq(cfg) + kept) as u64
            } else {
                0
            };
            (need.default_blocks as u64 * block_bytes)
                .min(kv_cache_memory(device)?.saturating_sub(states))
        }
    };
    need.check(bytes / block_bytes.max(1), block_bytes, &all)?;
    for j in jobs.iter_mut() {
        j.cfg.kv_cache_bytes = bytes;
    }
    Ok(engine_config(
        model,
        eos,
        longest + all.params.max_new_tokens,
        &jobs[0].cfg,
    ))
}

/// `spec` as a job on the checkpoint `ck` (content digest `digest`): its prompts, its checks
/// against the model (context, stop ids, thinking budget) and its config.
fn prepare_job<'a>(
    spec: &JobSpec<'a>,
    ck: &Checkpoint,
    tok: &TextTokenizer,
    digest: &str,
) -> Result<Job<'a>> {
    let s = spec.settings;
    let (template, prompts) = prompts_of(s, ck, tok, spec.problems)?;
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
    let cfg = JobConfig {
        model_name: s.model.clone(),
        engine: s.engine,
        model_digest: digest.to_string(),
        params: s.params.clone(),
        block_size: s.block_size,
        max_num_seqs: s.max_num_seqs,
        max_num_batched_tokens: s.max_num_batched_tokens,
        kv_cache_bytes: 0,
        kv_fp8: s.kv_cache_dtype == KvCacheDtype::Fp8,
        target_correct: s.target_correct,
        part_problems: 8,
        grade: GradeOptions {
            thinking: s.enable_thinking == Some(true),
            ..GradeOptions::default()
        },
        thinking,
        shard: spec.shard,
        problem_set: spec.problem_set.map(str::to_string),
        progress: spec.progress.clone(),
    };
    Ok(Job {
        problems: spec.problems,
        prompts,
        template,
        cfg,
        output: spec.output.to_path_buf(),
    })
}

/// The job on mistral.rs ([`crate::jobs::mistralrs`]): its model and scheduler, our prompts, draws
/// and stop rules.
#[cfg(feature = "mistralrs")]
fn run_mistralrs(loaded: &Loaded, jobs: Vec<Job>, overall: &Target) -> Result<Vec<JobSummary>> {
    if jobs.len() != 1 {
        bail!(
            "engine: the mistralrs engine runs one job at a time ({} given)",
            jobs.len()
        );
    }
    let (s, job) = (&loaded.settings, &jobs[0]);
    let opts = crate::jobs::mistralrs::Options {
        model_dir: loaded.ck.dir.clone(),
        device: loaded.device.clone(),
        dtype: loaded.dtype,
        max_num_seqs: s.max_num_seqs,
        block_size: s.block_size,
        kv_cache_bytes: s.kv_cache.as_ref().map(|k| k.bytes()),
        kv_fp8: job.cfg.kv_fp8,
        context: job
            .prompts
            .iter()
            .map(|(_, ids)| ids.len())
            .max()
            .unwrap_or(0)
            + job.cfg.params.max_new_tokens,
    };
    let draws = crate::jobs::mistralrs::Draws {
        params: job.cfg.params.clone(),
        eos_token_ids: loaded.eos.clone(),
        thinking: job.cfg.thinking.clone(),
    };
    let tok = loaded.tok.clone();
    let mut engine = crate::jobs::mistralrs::MistralRsEngine::new(&opts, draws, tok)?;
    super::feed::run(&mut engine, &loaded.tok, &jobs, overall)
}

/// The engine's settings for a run whose engine-wide settings are `cfg`'s, with a KV cache of
/// `cfg.kv_cache_bytes` (said on stderr, with how many sequences of `per_seq` tokens, the
/// longest prompt plus max_new_tokens, it holds).
fn engine_config(
    model: &Transformer,
    eos: &[u32],
    per_seq: usize,
    cfg: &JobConfig,
) -> EngineConfig {
    let per_block = (kv_cache_bytes_per_token(model, cfg.kv_fp8) * cfg.block_size).max(1) as u64;
    let num_blocks = (cfg.kv_cache_bytes / per_block) as usize;
    let tokens = num_blocks * cfg.block_size;
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
