//! mistral.rs as a second sampling engine (`engine = "mistralrs"`, the `mistralrs` feature).
//!
//! mistral.rs loads the checkpoint (the Hugging Face folder our [`crate::model::Checkpoint`]
//! resolved), schedules the sequences and computes the logits with its own kernels (paged
//! attention on a GPU). Everything else stays ours, so the job is the same dataset with another
//! engine underneath: the prompts are our rendered token ids (sent as
//! `RequestMessage::CompletionTokens`), and every token is drawn by our sampler
//! ([`crate::sampler::sampling::sample`], seeded per (seed, problem, sample)) inside a logits
//! processor that hands mistral.rs back a row with only that token finite. mistral.rs then takes
//! it with its argmax. The stop rules are ours too ([`crate::sampler::engine::after_token`]);
//! when they end a sample for a reason mistral.rs does not know (a stop string, a cancel), the
//! processor hands it the EOS token next, and that token is not part of the sample.
//!
//! What the user gets: the same per-sample seeds as our engine (a sample's draws do not depend on
//! the batch), over mistral.rs's logits. Those differ from ours in the last bits (other kernels,
//! and on a GPU with the batch's shape), so a near-tie can go the other way: samples match ours
//! where the top-2 gap allows, and a rerun with the same settings on the same machine reproduces
//! them. `target_correct` cancels a problem's unsent samples and ends its running ones at their
//! next token. On the CPU mistral.rs runs one sequence at a time: its batches without paged
//! attention mix up the sequences' KV caches (see [`MistralRsEngine::new`]).
//!
//! Knows nothing of parts, grading or stages: [`super::sample::run::run`] drives it like ours.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use mistralrs::{
    Constraint, CustomLogitsProcessor, MemoryGpuConfig, ModelDType, NormalRequest,
    PagedAttentionMetaBuilder, PagedCacheType, RequestMessage, Response,
    SamplingParams as MrsParams, StopTokens, TextModelBuilder, TokenSource,
};

use super::sample::engine::SampleEngine;
use crate::model::TextTokenizer;
use crate::sampler::engine::{
    after_token, After, Decoder, FinishReason, Request, Sample, ThinkingBudget, TokenLogprob,
};
use crate::sampler::params::SamplingParams;
use crate::sampler::sampling::{sample, top_logprobs, SampleRng, Scratch};

/// How mistral.rs loads and runs the model.
#[derive(Debug, Clone)]
pub struct Options {
    /// The checkpoint's local folder (config.json, tokenizer.json, safetensors).
    pub model_dir: PathBuf,
    pub device: Device,
    pub dtype: DType,
    pub max_num_seqs: usize,
    /// Paged attention's block size (GPU).
    pub block_size: usize,
    /// The KV cache (GPU); `None`: room for `max_num_seqs` sequences of `context` tokens.
    pub kv_cache_bytes: Option<u64>,
    /// fp8 e4m3 keys and values (GPU).
    pub kv_fp8: bool,
    /// The longest prompt plus `max_new_tokens`.
    pub context: usize,
}

/// How tokens are drawn and when samples end: the same settings as our engine's.
#[derive(Debug, Clone)]
pub struct Draws {
    pub params: SamplingParams,
    pub eos_token_ids: Vec<u32>,
    pub thinking: Option<ThinkingBudget>,
}

/// One sample's state, shared by the processor (mistral.rs's threads) and the engine.
struct Seq {
    request: usize,
    sample_index: u32,
    prompt: Arc<Vec<u32>>,
    generated: Vec<u32>,
    rng: SampleRng,
    scratch: Scratch,
    logprob: f64,
    token_logprobs: Vec<TokenLogprob>,
    /// Closing tokens of the thinking budget still to go in.
    closing: VecDeque<u32>,
    thinking_closed: bool,
    thinking_forced: bool,
    finish: Option<FinishReason>,
    cancelled: bool,
}

struct Shared {
    draws: Draws,
    tok: TextTokenizer,
    /// The token handed to mistral.rs to end a sample our rules ended.
    end_token: u32,
    /// Logits rows mistral.rs computed for our sequences (every decode step of every sample).
    computed: AtomicU64,
}

/// The logits processor of one sample: draws its next token with our sampler.
struct Tap {
    seq: Arc<Mutex<Seq>>,
    shared: Arc<Shared>,
}

impl CustomLogitsProcessor for Tap {
    fn apply(&self, logits: &Tensor, context: &[u32]) -> candle_core::Result<Tensor> {
        let mut guard = self
            .seq
            .lock()
            .map_err(|_| candle_core::Error::Msg("a sampler thread panicked".into()))?;
        let token = self.next_token(&mut guard, logits, context)?;
        self.shared.computed.fetch_add(1, Ordering::Relaxed);
        let vocab = logits.elem_count();
        let mut row = vec![f32::NEG_INFINITY; vocab];
        if let Some(x) = row.get_mut(token as usize) {
            *x = 0.0;
        }
        Tensor::from_vec(row, logits.shape().clone(), &Device::Cpu)
    }
}

impl Tap {
    fn next_token(
        &self,
        s: &mut Seq,
        logits: &Tensor,
        context: &[u32],
    ) -> candle_core::Result<u32> {
        let prompt_len = s.prompt.len();
        let n = match context.len().checked_sub(prompt_len) {
            Some(n) if context[..prompt_len] == s.prompt[..] => n,
            _ => candle_core::bail!(
                "mistral.rs handed sample {} a context that does not start with its prompt",
                s.sample_index
            ),
        };
        if context[prompt_len..] != s.generated[..n.min(s.generated.len())] {
            candle_core::bail!(
                "mistral.rs's sample {} holds tokens other than the ones drawn for it",
                s.sample_index
            );
        }
        // A sequence recomputed after a preemption asks again for positions it has.
        if let Some(&t) = s.generated.get(n) {
            return Ok(t);
        }
        if n > s.generated.len() {
            candle_core::bail!(
                "mistral.rs skipped a token of sample {} (at {n}, {} drawn)",
                s.sample_index,
                s.generated.len()
            );
        }
        let d = &self.shared.draws;
        if s.finish.is_some() || s.cancelled {
            return Ok(self.shared.end_token);
        }
        if let Some(t) = s.closing.pop_front() {
            s.generated.push(t);
            if d.params.logprobs.is_some() {
                s.token_logprobs.push(TokenLogprob {
                    logprob: None,
                    top: Vec::new(),
                });
            }
            if s.generated.len() >= d.params.max_new_tokens {
                s.finish = Some(FinishReason::Length);
            }
            return Ok(t);
        }
        let row: Vec<f32> = logits.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let Seq {
            rng,
            scratch,
            generated,
            ..
        } = &mut *s;
        let drawn = sample(
            &row,
            &d.params,
            &context[..prompt_len],
            generated,
            &d.eos_token_ids,
            rng,
            scratch,
        );
        s.generated.push(drawn.token);
        s.logprob += drawn.logprob as f64;
        if let Some(k) = d.params.logprobs {
            s.token_logprobs.push(TokenLogprob {
                logprob: Some(drawn.logprob),
                top: top_logprobs(&row, k),
            });
        }
        let tok = &self.shared.tok;
        let decode = |ids: &[u32]| tok.decode(ids).unwrap_or_default();
        let decoder: Decoder = &decode;
        match after_token(
            &d.params,
            &d.eos_token_ids,
            d.thinking.as_ref(),
            &s.generated,
            s.thinking_closed,
            Some(decoder),
        ) {
            After::Continue => {}
            After::Finish(r) => {
                s.finish = Some(match r {
                    FinishReason::Stop if s.thinking_forced => FinishReason::ThinkingBudget,
                    r => r,
                })
            }
            After::ThinkingClosed => s.thinking_closed = true,
            After::Close(add) => {
                s.closing.extend(add.iter().copied());
                s.thinking_closed = true;
                s.thinking_forced = true;
            }
        }
        Ok(drawn.token)
    }
}

struct RequestInfo {
    problem_id: String,
    prompt: Arc<Vec<u32>>,
    cancelled: bool,
}

/// What came back for one sent sample.
struct Reply {
    key: u64,
    outcome: std::result::Result<ReplyOk, String>,
}

struct ReplyOk {
    prompt_tokens: usize,
    finish_reason: String,
}

/// mistral.rs behind [`SampleEngine`]: samples are sent one request each, at most twice
/// `max_num_seqs` at a time (so mistral.rs always has the next ones queued and a cancel finds
/// most of a problem's samples unsent).
pub struct MistralRsEngine {
    rt: tokio::runtime::Runtime,
    model: mistralrs::Model,
    shared: Arc<Shared>,
    requests: Vec<RequestInfo>,
    /// Samples not sent yet: (request, sample index).
    queue: VecDeque<(usize, u32)>,
    in_flight: HashMap<u64, Arc<Mutex<Seq>>>,
    next_key: u64,
    window: usize,
    replies_tx: mpsc::Sender<Reply>,
    replies: mpsc::Receiver<Reply>,
    prompt_tokens: u64,
}

impl MistralRsEngine {
    pub fn new(opts: &Options, draws: Draws, tok: TextTokenizer) -> Result<Self> {
        let Some(&end_token) = draws.eos_token_ids.first() else {
            bail!(
                "{}: no EOS token id in generation_config.json or config.json: the mistralrs \
                 engine needs one to end samples",
                opts.model_dir.display()
            );
        };
        let rt = runtime()?;
        let mut opts = opts.clone();
        if opts.device.is_cpu() && opts.max_num_seqs > 1 {
            // mistral.rs 0.8.1 without paged attention (the CPU) hands the sequences of a batch
            // the keys and values of another one: batched, 18 of 20 greedy samples of the
            // tiny-qwen3 fixture leave the single-sequence tokens at their second token, and with
            // max_num_seqs 1 and a second request waiting, some still do. So on the CPU it gets
            // one sequence at a time, the next sent when the last is back.
            tracing::warn!(
                "mistralrs engine on the CPU: one sequence at a time (max_num_seqs {} -> 1): \
                 mistral.rs 0.8.1 mixes up the KV caches of a batch without paged attention",
                opts.max_num_seqs
            );
            opts.max_num_seqs = 1;
        }
        warn_of_windows(&opts)?;
        let model = load(&rt, &opts)?;
        let (replies_tx, replies) = mpsc::channel();
        Ok(MistralRsEngine {
            rt,
            model,
            shared: Arc::new(Shared {
                draws,
                tok,
                end_token,
                computed: AtomicU64::new(0),
            }),
            requests: Vec::new(),
            queue: VecDeque::new(),
            in_flight: HashMap::new(),
            next_key: 0,
            // On the CPU one sequence at a time, sent only when the last one is back (see above).
            window: if opts.device.is_cpu() {
                1
            } else {
                2 * opts.max_num_seqs.max(1)
            },
            replies_tx,
            replies,
            prompt_tokens: 0,
        })
    }

    /// Sends queued samples until the window is full.
    fn top_up(&mut self) -> Result<()> {
        while self.in_flight.len() < self.window {
            let Some((request, sample_index)) = self.queue.pop_front() else {
                break;
            };
            let info = &self.requests[request];
            if info.cancelled {
                continue;
            }
            let d = &self.shared.draws;
            let seq = Arc::new(Mutex::new(Seq {
                request,
                sample_index,
                prompt: info.prompt.clone(),
                generated: Vec::new(),
                rng: SampleRng::new(d.params.seed, &info.problem_id, sample_index),
                scratch: Scratch::new(),
                logprob: 0.0,
                token_logprobs: Vec::new(),
                closing: VecDeque::new(),
                thinking_closed: false,
                thinking_forced: false,
                finish: None,
                cancelled: false,
            }));
            let key = self.next_key;
            self.next_key += 1;
            let tap: Arc<dyn CustomLogitsProcessor> = Arc::new(Tap {
                seq: seq.clone(),
                shared: self.shared.clone(),
            });
            let mut stop: Vec<u32> = d.eos_token_ids.clone();
            stop.extend(&d.params.stop_token_ids);
            let params = MrsParams {
                max_len: Some(d.params.max_new_tokens),
                stop_toks: Some(StopTokens::Ids(stop)),
                ..MrsParams::neutral()
            };
            let (tx, mut rx) = tokio::sync::mpsc::channel(1);
            let req = completion_request(info.prompt.to_vec(), params, key as usize, tap, tx);
            let sender = self
                .model
                .inner()
                .get_sender(None)
                .map_err(|e| anyhow::anyhow!("mistral.rs: {e:?}"))?;
            let replies = self.replies_tx.clone();
            self.rt.spawn(async move {
                let outcome = match sender.send(req).await {
                    Err(e) => Err(format!("cannot send to mistral.rs: {e}")),
                    Ok(()) => completion_reply(rx.recv().await).map(|c| ReplyOk {
                        prompt_tokens: c.usage.prompt_tokens,
                        finish_reason: c
                            .choices
                            .first()
                            .map(|c| c.finish_reason.clone())
                            .unwrap_or_default(),
                    }),
                };
                let _ = replies.send(Reply { key, outcome });
            });
            self.in_flight.insert(key, seq);
        }
        Ok(())
    }

    /// The finished sample of a reply, or `None` for a cancelled one.
    fn finish(&mut self, reply: Reply) -> Result<Option<Sample>> {
        let Some(seq) = self.in_flight.remove(&reply.key) else {
            return Ok(None);
        };
        let ok = reply
            .outcome
            .map_err(|e| anyhow::anyhow!("mistral.rs: {e}"))?;
        self.prompt_tokens += ok.prompt_tokens as u64;
        let mut s = seq
            .lock()
            .map_err(|_| anyhow::anyhow!("a mistral.rs sampler thread panicked"))?;
        let finish_reason = match s.finish {
            Some(r) => r,
            None if s.cancelled => return Ok(None),
            // mistral.rs ended it where our rules did not (its own EOS list or model length).
            None if ok.finish_reason == "length" => FinishReason::Length,
            None => FinishReason::Stop,
        };
        let info = &self.requests[s.request];
        Ok(Some(Sample {
            request: s.request,
            problem_id: info.problem_id.clone(),
            sample_index: s.sample_index,
            tokens: std::mem::take(&mut s.generated),
            finish_reason,
            cumulative_logprob: s.logprob,
            logprobs: self
                .shared
                .draws
                .params
                .logprobs
                .map(|_| std::mem::take(&mut s.token_logprobs)),
        }))
    }
}

/// One completion request: our prompt ids, mistral.rs's sampling settings, our logits processor,
/// no streaming, no logprobs from mistral.rs.
fn completion_request(
    prompt: Vec<u32>,
    params: MrsParams,
    id: usize,
    processor: Arc<dyn CustomLogitsProcessor>,
    response: tokio::sync::mpsc::Sender<Response>,
) -> mistralrs::Request {
    mistralrs::Request::Normal(Box::new(NormalRequest {
        messages: RequestMessage::CompletionTokens(prompt),
        sampling_params: params,
        response,
        return_logprobs: false,
        is_streaming: false,
        id,
        constraint: Constraint::None,
        suffix: None,
        tools: None,
        tool_choice: None,
        logits_processors: Some(vec![processor]),
        return_raw_logits: false,
        web_search_options: None,
        model_id: None,
        truncate_sequence: false,
    }))
}

/// mistral.rs's answer to a completion request: the completion, or its error as text.
fn completion_reply(
    reply: Option<Response>,
) -> std::result::Result<mistralrs::CompletionResponse, String> {
    match reply {
        Some(Response::CompletionDone(c)) => Ok(c),
        Some(Response::CompletionModelError(e, _)) => Err(e),
        Some(Response::InternalError(e)) | Some(Response::ValidationError(e)) => Err(e.to_string()),
        Some(_) => Err("mistral.rs answered with another kind of response".into()),
        None => Err("mistral.rs dropped the request".into()),
    }
}

/// The async runtime mistral.rs's requests are sent and awaited on (its engine runs on a
/// thread of its own).
fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime for mistral.rs")
}

/// Warns where mistral.rs computes another model than the checkpoint's: its Gemma 3 (0.8.1)
/// lets a sliding-window layer's query see one key more than transformers does at prefill (it
/// masks `j + sliding_window < i`, transformers `i - j >= sliding_window`), and its decode steps
/// keep another count, so once prompt plus generation pass the window its samples are not the
/// model's (tests/mistralrs.rs measures them equal to ours only with the window lifted).
fn warn_of_windows(opts: &Options) -> Result<()> {
    let cfg = crate::model::ModelConfig::load(&opts.model_dir.join("config.json"))?;
    if let (crate::model::Family::Gemma3, Some(w)) = (cfg.family, cfg.sliding_window) {
        if opts.context > w {
            tracing::warn!(
                "mistralrs engine: contexts up to {} tokens pass Gemma 3's {w}-token sliding \
                 window, where mistral.rs 0.8.1's attention sees other keys than transformers' \
                 (and ours): its samples there are not the model's; `--engine selfdistill` \
                 follows transformers",
                opts.context
            );
        }
    }
    Ok(())
}

/// Loads the model into mistral.rs: the local folder, our dtype and device, no hub token, no
/// prefix cache; paged attention on a GPU (mistral.rs has none on the CPU). A checkpoint in a
/// multimodal layout (`*ForConditionalGeneration`: Qwen3.5, Gemma 3), and Gemma 3's text-only
/// `Gemma3ForCausalLM`, load through mistral.rs's multimodal builder, which takes the same token
/// prompts.
fn load(rt: &tokio::runtime::Runtime, opts: &Options) -> Result<mistralrs::Model> {
    let dtype = match opts.dtype {
        DType::F32 => ModelDType::F32,
        DType::BF16 => ModelDType::BF16,
        DType::F16 => ModelDType::F16,
        d => bail!("the mistralrs engine loads f32, bf16 or f16 weights, not {d:?}"),
    };
    let paged = if opts.device.is_cpu() {
        None
    } else {
        let mem = match opts.kv_cache_bytes {
            Some(bytes) => MemoryGpuConfig::MbAmount((bytes >> 20) as usize),
            None => MemoryGpuConfig::ContextSize(opts.context * opts.max_num_seqs),
        };
        let cache = if opts.kv_fp8 {
            PagedCacheType::F8E4M3
        } else {
            PagedCacheType::Auto
        };
        Some(
            PagedAttentionMetaBuilder::default()
                .with_block_size(opts.block_size)
                .with_gpu_memory(mem)
                .with_paged_cache_type(cache)
                .build()?,
        )
    };
    let config = std::fs::read_to_string(opts.model_dir.join("config.json"))
        .with_context(|| format!("cannot read {}/config.json", opts.model_dir.display()))?;
    // mistral.rs serves Gemma 3's text-only class through its multimodal loader too
    let multimodal =
        config.contains("ForConditionalGeneration") || config.contains("\"Gemma3ForCausalLM\"");
    let id = opts.model_dir.display().to_string();
    macro_rules! configured {
        ($builder:expr) => {{
            let mut b = $builder
                .with_token_source(TokenSource::None)
                .with_dtype(dtype)
                .with_max_num_seqs(opts.max_num_seqs)
                .with_prefix_cache_n(None)
                .with_device(opts.device.clone());
            if opts.device.is_cpu() {
                b = b.with_force_cpu();
            }
            if let Some(p) = paged.clone() {
                b = b.with_paged_attn(p);
            }
            rt.block_on(b.build())
        }};
    }
    let model = if multimodal {
        configured!(mistralrs::MultimodalModelBuilder::new(id))
    } else {
        configured!(TextModelBuilder::new(id))
    };
    model.with_context(|| format!("mistral.rs could not load {}", opts.model_dir.display()))
}

impl SampleEngine for MistralRsEngine {
    fn add(&mut self, req: Request) -> Result<usize> {
        if req.settings.is_some() {
            bail!(
                "problem {}: the mistralrs engine draws every request with the settings it \
                 started with; settings per request need engine = \"selfdistill\"",
                req.problem_id
            );
        }
        let id = self.requests.len();
        self.requests.push(RequestInfo {
            problem_id: req.problem_id,
            prompt: Arc::new(req.prompt),
            cancelled: false,
        });
        self.queue.extend((0..req.n).map(|k| (id, k)));
        Ok(id)
    }

    fn step(&mut self, _decode: Option<Decoder>) -> Result<Vec<Sample>> {
        self.top_up()?;
        if self.in_flight.is_empty() {
            return Ok(Vec::new());
        }
        let mut replies = Vec::new();
        match self.replies.recv_timeout(Duration::from_millis(250)) {
            Ok(r) => replies.push(r),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("mistral.rs stopped answering"),
        }
        replies.extend(self.replies.try_iter());
        let mut done = Vec::new();
        for r in replies {
            if let Some(s) = self.finish(r)? {
                done.push(s);
            }
        }
        self.top_up()?;
        Ok(done)
    }

    fn cancel(&mut self, request: usize) -> u64 {
        let Some(info) = self.requests.get_mut(request) else {
            return 0;
        };
        info.cancelled = true;
        let unsent = self.queue.iter().filter(|(r, _)| *r == request).count() as u64;
        self.queue.retain(|(r, _)| *r != request);
        let mut running = 0;
        for seq in self.in_flight.values() {
            if let Ok(mut s) = seq.lock() {
                // A sample our rules already ended is kept (its reply is on its way).
                if s.request == request && s.finish.is_none() && !s.cancelled {
                    s.cancelled = true;
                    running += 1;
                }
            }
        }
        unsent + running
    }

    fn is_idle(&self) -> bool {
        self.in_flight.is_empty() && self.queue.iter().all(|(r, _)| self.requests[*r].cancelled)
    }

    fn num_running(&self) -> usize {
        self.in_flight.len()
    }

    fn kv_usage(&self) -> Option<f64> {
        None
    }

    fn preemptions(&self) -> Option<u64> {
        None
    }

    fn prompt_tokens(&self) -> u64 {
        self.prompt_tokens
    }

    fn generated_tokens(&self) -> u64 {
        self.shared.computed.load(Ordering::Relaxed)
    }
}

/// mistral.rs with its own sampler, for `pipeline bench sample --engine mistralrs`: the same
/// prompts and lengths as our benchmark, timed from inside the engine by a pass-through logits
/// processor (the moment every sequence has its first token ends the prefill; every later row
/// is a decode token).
pub struct Bench {
    rt: tokio::runtime::Runtime,
    model: mistralrs::Model,
}

/// The bench processor's clock, shared by one batch's sequences.
struct Clock {
    batch: usize,
    prompt_len: usize,
    firsts: usize,
    prefill_done: Option<std::time::Instant>,
    last: Option<std::time::Instant>,
    decode_rows: u64,
}

struct Timer(Arc<Mutex<Clock>>);

impl CustomLogitsProcessor for Timer {
    fn apply(&self, logits: &Tensor, context: &[u32]) -> candle_core::Result<Tensor> {
        if let Ok(mut c) = self.0.lock() {
            let now = std::time::Instant::now();
            if context.len() == c.prompt_len {
                c.firsts += 1;
                if c.firsts == c.batch {
                    c.prefill_done = Some(now);
                }
            } else if c.prefill_done.is_some() {
                c.decode_rows += 1;
                c.last = Some(now);
            }
        }
        Ok(logits.clone())
    }
}

impl Bench {
    pub fn load(opts: &Options) -> Result<Bench> {
        let rt = runtime()?;
        let model = load(&rt, opts)?;
        Ok(Bench { rt, model })
    }

    /// (prefill tokens/s, decode tokens/s) of `prompts` run together, `new` tokens each.
    pub fn run(
        &self,
        prompts: &[Vec<u32>],
        new: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
    ) -> Result<(f64, f64)> {
        let prompt_len = prompts.first().map_or(0, Vec::len);
        let clock = Arc::new(Mutex::new(Clock {
            batch: prompts.len(),
            prompt_len,
            firsts: 0,
            prefill_done: None,
            last: None,
            decode_rows: 0,
        }));
        let sender = self
            .model
            .inner()
            .get_sender(None)
            .map_err(|e| anyhow::anyhow!("mistral.rs: {e:?}"))?;
        let t0 = std::time::Instant::now();
        let outcomes: Vec<std::result::Result<(), String>> = self.rt.block_on(async {
            let mut waits = Vec::new();
            for (i, p) in prompts.iter().enumerate() {
                let (tx, mut rx) = tokio::sync::mpsc::channel(1);
                let tap: Arc<dyn CustomLogitsProcessor> = Arc::new(Timer(clock.clone()));
                let params = MrsParams {
                    temperature: (temperature > 0.0).then_some(f64::from(temperature)),
                    top_k: (top_k > 0).then_some(top_k),
                    top_p: (top_p < 1.0).then_some(f64::from(top_p)),
                    max_len: Some(new),
                    ..MrsParams::neutral()
                };
                let req = completion_request(p.clone(), params, i, tap, tx);
                if let Err(e) = sender.send(req).await {
                    return vec![Err(format!("cannot send to mistral.rs: {e}"))];
                }
                waits.push(async move { completion_reply(rx.recv().await).map(|_| ()) });
            }
            let mut out = Vec::new();
            for w in waits {
                out.push(w.await);
            }
            out
        });
        for o in outcomes {
            o.map_err(|e| anyhow::anyhow!("mistral.rs: {e}"))?;
        }
        let c = clock
            .lock()
            .map_err(|_| anyhow::anyhow!("a mistral.rs sampler thread panicked"))?;
        let Some(prefill_done) = c.prefill_done else {
            bail!("mistral.rs did not sample every sequence's first token");
        };
        let prefill_s = (prefill_done - t0).as_secs_f64();
        let decode_s = c.last.map_or(0.0, |l| (l - prefill_done).as_secs_f64());
        Ok((
            (prompts.len() * prompt_len) as f64 / prefill_s.max(1e-9),
            c.decode_rows as f64 / decode_s.max(1e-9),
        ))
    }
}
