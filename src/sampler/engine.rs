//! The engine loop: requests in, finished samples out, one scheduler step at a time.
//!
//! 1) A request (one prompt, n samples) enters as one leader sequence: the prompt is prefilled
//!    once. 2) When the leader's prompt is in the cache, its n-1 siblings are forked from it: they
//!    share the prompt's blocks (the last partial block is copied on write) and recompute only the
//!    last prompt token for their own logits. 3) Every step: the scheduler picks tokens under the
//!    budget, block copies are made, the model runs one forward over all scheduled tokens through
//!    the paged cache, and every sequence whose tokens are all computed samples one more token
//!    with its own RNG, seeded by (run seed, problem id, sample index), so a sample's tokens do
//!    not depend on what else is in the batch. 4) A sample ends on EOS or a stop id, a stop string,
//!    or `max_new_tokens`.
//!
//! What differs between devices (the cache, attention, where logits land, candidate draws) is
//! the [`Backend`]'s, decided once when the engine starts; the loop here is the same on every
//! device.
//!
//! Knows nothing of Parquet, verification or problems beyond their ids: the caller grades
//! finished samples and may [`Engine::cancel`] a request (the verifier in the loop).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use candle_core::{Device, Tensor};
use rayon::prelude::*;

use super::backend::{logits_to_host, Backend, Logits, StepInputs};
use super::kv_cache::SeqStep;
use super::params::SamplingParams;
use super::sampling::{sample, stop_string_hit, SampleRng, Sampled, Scratch};
use super::scheduler::{Scheduler, SchedulerConfig, SeqId, SeqState};
use super::state_slots::{SavedState, StateSlots};
use crate::model::clock;
use crate::model::Transformer;

/// Why a sample ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop,
    /// `max_new_tokens` reached.
    Length,
    /// Ended (EOS or stop) after the thinking budget forced `</think>` in.
    ThinkingBudget,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ThinkingBudget => "thinking_budget",
        }
    }
}

/// One prompt to sample `n` times.
#[derive(Debug, Clone)]
pub struct Request {
    pub problem_id: String,
    pub prompt: Vec<u32>,
    pub n: u32,
    /// What its samples are drawn with; `None`: the engine's ([`EngineConfig::params`] and
    /// [`EngineConfig::thinking`]). Requests with different settings share the batch: every
    /// draw reads its own sequence's.
    pub settings: Option<Arc<RequestSettings>>,
}

/// What a request's samples are drawn with (temperature, top-k/p, min-p, penalties, stops, seed,
/// logprobs, max_new_tokens) and its thinking budget. The requests of one set share one.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestSettings {
    pub params: SamplingParams,
    pub thinking: Option<ThinkingBudget>,
}

/// A finished sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub request: usize,
    pub problem_id: String,
    pub sample_index: u32,
    /// Generated tokens (a stop token id or EOS that ended it included).
    pub tokens: Vec<u32>,
    pub finish_reason: FinishReason,
    /// Sum of the chosen tokens' log-probabilities under the raw model distribution.
    pub cumulative_logprob: f64,
    /// With `logprobs` in [`EngineConfig::params`]: one entry per token of `tokens`.
    pub logprobs: Option<Vec<TokenLogprob>>,
}

/// One generated token's log-probability and the most likely tokens at its position (raw model
/// distribution, as [`super::sampling::top_logprobs`] gives them).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// `None` for a token the sampler did not draw (the thinking budget's closing text).
    pub logprob: Option<f32>,
    pub top: Vec<(u32, f32)>,
}

/// A thinking model's budget: after `max_thinking_tokens` generated tokens without
/// `think_end_id`, the `closing` tokens (e.g. `"\n</think>\n\n"`) are appended and the model
/// answers within what is left of `max_new_tokens`.
#[derive(Debug, Clone, PartialEq)]
pub struct ThinkingBudget {
    pub max_thinking_tokens: usize,
    pub think_end_id: u32,
    pub closing: Vec<u32>,
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub scheduler: SchedulerConfig,
    pub num_blocks: usize,
    /// The parameters of the requests that bring none; with `logprobs`, each drawn token's
    /// log-probability and that many alternatives are recorded (otherwise nothing is, and the
    /// GPU keeps its candidate-only draw).
    pub params: SamplingParams,
    pub eos_token_ids: Vec<u32>,
    pub thinking: Option<ThinkingBudget>,
    /// Keys and values in fp8 e4m3 (CUDA, bf16 models): half the cache bytes of bf16.
    pub kv_fp8: bool,
}

/// Counters for the end-of-run summary.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineStats {
    pub steps: u64,
    pub prompt_tokens_computed: u64,
    pub generated_tokens: u64,
    pub samples_cancelled: u64,
    /// Wall time of each part of the steps, for the benchmark's split.
    pub time: StepTimes,
}

/// Seconds spent in each part of [`Engine::step`], summed over steps.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimes {
    /// Scheduling, block copies and building the batch.
    pub schedule: f64,
    /// The transformer layers, attention excluded.
    pub layers: f64,
    /// Paged attention (KV writes included).
    pub attention: f64,
    /// The LM head over the rows that sample.
    pub lm_head: f64,
    /// Drawing tokens and stop checks.
    pub sampling: f64,
}

struct SeqMeta {
    request: usize,
    sample_index: u32,
    prompt_len: usize,
    tokens: Vec<u32>,
    rng: SampleRng,
    logprob: f64,
    /// Siblings still to fork from this leader once its prompt is cached.
    pending_forks: u32,
    done: bool,
    /// `</think>` seen or forced in.
    thinking_closed: bool,
    /// The thinking budget forced the closing text in.
    thinking_forced: bool,
    /// Per generated token, with `logprobs` in [`EngineConfig::params`].
    token_logprobs: Vec<TokenLogprob>,
}

/// The logits rows as host f32. A bf16 model's logits cross as bf16 (half the bytes; the same
/// values) and widen on the host, in parallel.
/// Turns text back from tokens, for stop strings.
pub type Decoder<'a> = &'a (dyn Fn(&[u32]) -> String + Sync);

/// What a sequence does after a drawn token (the last of `generated`).
#[derive(Debug, Clone, PartialEq)]
pub enum After<'a> {
    Continue,
    /// It ends here (before any thinking-budget rewrite of the reason: see [`after_token`]).
    Finish(FinishReason),
    /// The token was `</think>`: the budget no longer applies.
    ThinkingClosed,
    /// The thinking budget is spent: these closing tokens go in next (cut to what is left of
    /// `max_new_tokens`), and the sample ends with [`FinishReason::Length`] if they fill it.
    Close(&'a [u32]),
}

/// The stop rules of one sequence, shared by every engine that draws with our sampler: EOS (unless
/// `ignore_eos`) and `stop_token_ids` once `min_new_tokens` are out, a stop string in the tail
/// (when `decode` is given), `max_new_tokens`, then the thinking budget. A sample that ends with
/// `Stop` after its closing text was forced in is a `ThinkingBudget` finish: the caller knows
/// whether it forced it.
pub fn after_token<'c>(
    params: &SamplingParams,
    eos_token_ids: &[u32],
    thinking: Option<&'c ThinkingBudget>,
    generated: &[u32],
    thinking_closed: bool,
    decode: Option<Decoder>,
) -> After<'c> {
    let Some(&token) = generated.last() else {
        return After::Continue;
    };
    let n_gen = generated.len();
    let is_stop_id = (!params.ignore_eos && eos_token_ids.contains(&token))
        || params.stop_token_ids.contains(&token);
    if is_stop_id && n_gen >= params.min_new_tokens {
        return After::Finish(FinishReason::Stop);
    }
    if !params.stop_strings.is_empty() {
        if let Some(dec) = decode {
            // Only the tail can hold a stop string that was not there a token ago: decode the
            // last tokens (every token is at least one byte), not the whole completion.
            let longest = params
                .stop_strings
                .iter()
                .map(|x| x.len())
                .max()
                .unwrap_or(0);
            let tail = generated
                .get(n_gen.saturating_sub(longest + 4)..)
                .unwrap_or(generated);
            if stop_string_hit(&dec(tail), &params.stop_strings).is_some() {
                return After::Finish(FinishReason::Stop);
            }
        }
    }
    if n_gen >= params.max_new_tokens {
        return After::Finish(FinishReason::Length);
    }
    match thinking {
        Some(t) if token == t.think_end_id => After::ThinkingClosed,
        Some(t) if !thinking_closed && n_gen >= t.max_thinking_tokens => {
            let room = params.max_new_tokens.saturating_sub(n_gen);
            After::Close(&t.closing[..t.closing.len().min(room)])
        }
        _ => After::Continue,
    }
}

pub struct Engine<'m> {
    model: &'m Transformer,
    cfg: EngineConfig,
    /// The device's cache and step work.
    backend: Backend,
    sched: Scheduler,
    seqs: Vec<SeqState>,
    meta: Vec<SeqMeta>,
    requests: Vec<Request>,
    /// Each request's settings (the engine's own where it brought none).
    settings: Vec<Arc<RequestSettings>>,
    /// The engine's settings, for the requests that bring none.
    default_settings: Arc<RequestSettings>,
    cancelled: Vec<bool>,
    /// One per sampling worker thread.
    scratch: Vec<Scratch>,
    /// The recurrent layers' state slots (none for an attention-only model) and each
    /// sequence's slot while it runs.
    states: StateSlots,
    slot_of: Vec<Option<usize>>,
    /// Per request whose samples wait to start: the prompt's state before its last token (the
    /// point the samples fork at) and how many samples have yet to copy it.
    prompt_states: HashMap<usize, (SavedState, u32)>,
    pub stats: EngineStats,
    /// On a GPU, wait for the device at each part of a step so that [`StepTimes`] holds device
    /// time (slower: for the benchmark's split only). Without it, GPU parts are launch times.
    pub sync_timing: bool,
}

impl<'m> Engine<'m> {
    pub fn new(model: &'m Transformer, cfg: EngineConfig) -> Result<Self> {
        if let Err(e) = cfg.params.validate() {
            bail!("sampling parameters: {e}");
        }
        let states =
            StateSlots::new_on(model.config(), cfg.scheduler.max_num_seqs, model.device())?;
        let backend = Backend::new(
            model,
            cfg.scheduler.block_size,
            cfg.num_blocks,
            cfg.kv_fp8,
            cfg.scheduler.max_num_seqs,
        )?;
        let sched = Scheduler::new(cfg.scheduler, cfg.num_blocks);
        let default_settings = Arc::new(RequestSettings {
            params: cfg.params.clone(),
            thinking: cfg.thinking.clone(),
        });
        Ok(Engine {
            model,
            cfg,
            backend,
            sched,
            seqs: Vec::new(),
            meta: Vec::new(),
            requests: Vec::new(),
            settings: Vec::new(),
            default_settings,
            cancelled: Vec::new(),
            scratch: Vec::new(),
            states,
            slot_of: Vec::new(),
            prompt_states: HashMap::new(),
            stats: EngineStats::default(),
            sync_timing: false,
        })
    }

    /// Decode steps on a GPU replay CUDA graphs (the default) or run eagerly (`false`:
    /// `enforce_eager`); an error on the CPU.
    pub fn set_cuda_graphs(&mut self, on: bool) -> Result<()> {
        self.backend.set_cuda_graphs(on)
    }

    /// Decode steps replayed from CUDA graphs, captured, and run eagerly under a graph's plan.
    pub fn graph_counts(&self) -> super::backend::GraphCounts {
        self.backend.graph_counts()
    }

    /// Queues a request; returns its index.
    pub fn add(&mut self, mut req: Request) -> Result<usize> {
        let settings = match req.settings.take() {
            Some(s) => {
                if let Err(e) = s.params.validate() {
                    bail!("problem {}: sampling parameters: {e}", req.problem_id);
                }
                s
            }
            None => self.default_settings.clone(),
        };
        let max_new_tokens = settings.params.max_new_tokens;
        let max_len = req.prompt.len() + max_new_tokens;
        let capacity = self.cfg.num_blocks * self.cfg.scheduler.block_size;
        if req.prompt.is_empty() {
            bail!("problem {}: empty prompt", req.problem_id);
        }
        if max_len > capacity || max_len > self.model.config().max_position_embeddings {
            bail!(
                "problem {}: prompt ({}) + max_new_tokens ({}) exceeds the KV cache ({capacity} \
                 tokens) or the model's context ({})",
                req.problem_id,
                req.prompt.len(),
                max_new_tokens,
                self.model.config().max_position_embeddings
            );
        }
        let r = self.requests.len();
        let (n, prompt) = (req.n, req.prompt.clone());
        self.requests.push(req);
        self.settings.push(settings);
        self.cancelled.push(false);
        if n > 0 {
            // A recurrent model's samples fork before the prompt's last token (their states
            // cannot be shared, so each computes that token itself from a copy of the state).
            let limit = (self.states.is_used() && n > 1).then(|| prompt.len() - 1);
            let state = SeqState {
                limit,
                ..Default::default()
            };
            let id = self.new_seq(r, 0, &prompt, n - 1, state);
            self.sched.add(id);
            if limit == Some(0) {
                self.fork_siblings(id)?;
            }
        }
        Ok(r)
    }

    fn new_seq(
        &mut self,
        request: usize,
        sample_index: u32,
        prompt: &[u32],
        pending_forks: u32,
        state: SeqState,
    ) -> SeqId {
        let problem_id = self
            .requests
            .get(request)
            .map(|r| r.problem_id.as_str())
            .unwrap_or("");
        let rng = SampleRng::new(self.settings[request].params.seed, problem_id, sample_index);
        let id = SeqId(self.seqs.len());
        self.seqs.push(SeqState {
            num_tokens: prompt.len(),
            ..state
        });
        self.slot_of.push(None);
        self.meta.push(SeqMeta {
            request,
            sample_index,
            prompt_len: prompt.len(),
            tokens: prompt.to_vec(),
            rng,
            logprob: 0.0,
            pending_forks,
            done: false,
            thinking_closed: false,
            thinking_forced: false,
            token_logprobs: Vec::new(),
        });
        id
    }

    pub fn is_idle(&self) -> bool {
        self.sched.is_idle()
    }

    pub fn num_running(&self) -> usize {
        self.sched.num_running()
    }

    /// Share of KV blocks in use.
    pub fn kv_usage(&self) -> f64 {
        let p = &self.sched.pool;
        1.0 - p.num_free() as f64 / p.num_blocks().max(1) as f64
    }

    pub fn preemptions(&self) -> u64 {
        self.sched.total_preemptions
    }

    /// Stops every unfinished sample of `request` (its target is met); returns how many samples
    /// will not be generated.
    pub fn cancel(&mut self, request: usize) -> u64 {
        let Some(c) = self.cancelled.get_mut(request) else {
            return 0;
        };
        if *c {
            return 0;
        }
        *c = true;
        let mut saved = 0u64;
        for i in 0..self.meta.len() {
            let m = &mut self.meta[i];
            if m.request != request || m.done {
                continue;
            }
            saved += 1 + m.pending_forks as u64;
            m.pending_forks = 0;
            m.done = true;
            self.finish_seq(SeqId(i));
        }
        self.prompt_states.remove(&request);
        self.stats.samples_cancelled += saved;
        saved
    }

    /// One engine step; returns the samples that finished in it.
    pub fn step(&mut self, decode: Option<Decoder>) -> Result<Vec<Sample>> {
        // On the CPU a step is a few dozen parallel loops with serial code between them. Run
        // from outside rayon's pool, each loop would hand its work to the pool and put this
        // thread to sleep until it is done; run on one of the pool's threads, the loops split
        // with the other workers, which stay awake between them.
        if self.backend.is_host() && rayon::current_thread_index().is_none() {
            // a running clock goes with the step, and comes back
            let carried = clock::take();
            let (r, carried) = rayon::scope(|_| {
                let _unset = clock::Unset;
                clock::put(carried);
                (self.step_inner(decode), clock::take())
            });
            clock::put(carried);
            return r;
        }
        self.step_inner(decode)
    }

    fn step_inner(&mut self, decode: Option<Decoder>) -> Result<Vec<Sample>> {
        let t0 = Instant::now();
        let step = self.sched.schedule(&mut self.seqs);
        if step.scheduled.is_empty() {
            if !self.sched.is_idle() {
                bail!("the KV cache cannot hold even one sequence: give it more memory");
            }
            return Ok(Vec::new());
        }
        self.stats.steps += 1;
        for c in &step.copies {
            self.backend.copy_block(*c)?;
        }
        let (tokens, positions) = self.batch(&step);
        let slots = if self.states.is_used() {
            Some(self.assign_slots(&step)?)
        } else {
            None
        };
        let dev = self.model.device().clone();
        self.sync_device(&dev)?;
        let t1 = Instant::now();
        self.stats.time.schedule += (t1 - t0).as_secs_f64();
        // the rows of sequences that sample after this step: their last new token's
        let mut rows = Vec::new();
        let mut samplers = Vec::new();
        let mut end = 0u32;
        for &(id, n) in &step.scheduled {
            end += n as u32;
            let s = &self.seqs[id.0];
            if s.num_computed + n == s.num_tokens {
                rows.push(end - 1);
                samplers.push(id);
            }
        }
        let (hidden, attention_s) =
            self.forward(&step, (&tokens, &positions), slots, (&rows, &samplers))?;
        self.sync_device(&dev)?;
        let t2 = Instant::now();
        self.stats.time.attention += attention_s;
        self.stats.time.layers += (t2 - t1).as_secs_f64() - attention_s;
        // advance
        for &(id, n) in &step.scheduled {
            let s = &mut self.seqs[id.0];
            s.num_computed += n;
            if s.num_computed != s.num_tokens && s.limit == Some(s.num_computed) {
                // a recurrent model's leader at its prompt's last token: the samples fork
                self.fork_siblings(id)?;
            }
        }
        if samplers.is_empty() {
            return Ok(Vec::new());
        }
        let logits = self.logits(&hidden, &rows)?;
        clock::mark(None, "lm_head");
        self.sync_device(&dev)?;
        let t3 = Instant::now();
        self.stats.time.lm_head += (t3 - t2).as_secs_f64();
        let finished = self.sample_rows(samplers, logits, decode)?;
        clock::mark(None, "sampling");
        self.stats.time.sampling += t3.elapsed().as_secs_f64();
        Ok(finished)
    }

    /// The step's tokens and positions: the scheduled tokens of every sequence, end to end.
    fn batch(&mut self, step: &super::scheduler::Step) -> (Vec<u32>, Vec<u32>) {
        let mut tokens = Vec::new();
        let mut positions = Vec::new();
        for &(id, n) in &step.scheduled {
            let (s, m) = (&self.seqs[id.0], &self.meta[id.0]);
            let range = s.num_computed..s.num_computed + n;
            tokens.extend_from_slice(&m.tokens[range.clone()]);
            positions.extend(range.clone().map(|p| p as u32));
            self.stats.prompt_tokens_computed += range.filter(|&p| p < m.prompt_len).count() as u64;
        }
        (tokens, positions)
    }

    /// The model's final hidden states for the step's tokens, through the paged cache on the
    /// model's device; and the seconds spent in attention.
    ///
    /// The sampling `rows` and their sequences go with the step's inputs (a GPU uploads them
    /// with the rest, for the logits and the draw).
    fn forward(
        &mut self,
        step: &super::scheduler::Step,
        (tokens, positions): (&[u32], &[u32]),
        slots: Option<Vec<usize>>,
        (rows, samplers): (&[u32], &[SeqId]),
    ) -> Result<(Tensor, f64)> {
        let temperatures = samplers
            .iter()
            .map(|&id| super::backend::row_temperature(&self.settings_of(id).params))
            .collect();
        let seqs = &self.seqs;
        let seq_steps: Vec<SeqStep> = step
            .scheduled
            .iter()
            .map(|&(id, n)| SeqStep {
                block_table: &seqs[id.0].block_table,
                start_pos: seqs[id.0].num_computed,
                num_new: n,
            })
            .collect();
        let inputs = StepInputs {
            seq_steps,
            tokens,
            positions,
            states: slots.map(|s| (&mut self.states, s)),
            sample_rows: rows,
            temperatures,
            sync_timing: self.sync_timing,
        };
        self.backend.forward(self.model, inputs)
    }

    /// The logits of the hidden `rows` that sample (see [`Backend::logits`]).
    fn logits(&mut self, hidden: &Tensor, rows: &[u32]) -> Result<Logits> {
        self.backend.logits(self.model, hidden, rows)
    }

    /// Draws each sampling sequence's token from its logits row (with its logprobs when asked),
    /// forks waiting siblings, and returns the samples that finished.
    fn sample_rows(
        &mut self,
        samplers: Vec<SeqId>,
        logits: Logits,
        decode: Option<Decoder>,
    ) -> Result<Vec<Sample>> {
        // Logprobs need their rows' alternatives: the rows go to the host whole.
        let wants: Vec<Option<usize>> = samplers
            .iter()
            .map(|&id| self.settings_of(id).params.logprobs)
            .collect();
        let logits = match logits {
            Logits::Device(t) if wants.iter().any(Option::is_some) => {
                Logits::Host(logits_to_host(&t)?)
            }
            l => l,
        };
        let drawn = self.draw(&samplers, &logits)?;
        let mut tops = Vec::new();
        if let Logits::Host(rows) = &logits {
            if wants.iter().any(Option::is_some) {
                let vocab = (rows.len() / samplers.len()).max(1);
                tops = rows
                    .par_chunks(vocab)
                    .zip(&wants)
                    .map(|(row, k)| k.map(|k| super::sampling::top_logprobs(row, k)))
                    .collect();
            }
        }
        if let Logits::Host(rows) = logits {
            self.backend.recycle(rows);
        }
        let mut tops = tops.into_iter();
        let mut finished = Vec::new();
        for ((id, (s, rng)), want) in samplers.into_iter().zip(drawn).zip(&wants) {
            self.fork_siblings(id)?;
            self.meta[id.0].rng = rng;
            let top = tops.next().flatten();
            if want.is_some() {
                self.meta[id.0].token_logprobs.push(TokenLogprob {
                    logprob: Some(s.logprob),
                    top: top.unwrap_or_default(),
                });
            }
            if let Some(done) = self.take_token(id, s, decode) {
                finished.push(done);
            }
        }
        Ok(finished)
    }

    /// With `sync_timing`, waits for the device so that the next clock reading is device time.
    fn sync_device(&self, dev: &Device) -> Result<()> {
        self.backend.synchronize(dev, self.sync_timing)
    }

    /// Draws one token per sampling sequence from `logits` (one row each). On a GPU, where every
    /// row's settings allow it ([`super::sampling::candidates_needed`]), only each row's best
    /// candidates cross to the host (as many as its own settings need); otherwise the rows do.
    fn draw(&mut self, samplers: &[SeqId], logits: &Logits) -> Result<Vec<(Sampled, SampleRng)>> {
        let logits = match logits {
            Logits::Host(rows) => return Ok(self.draw_tokens(samplers, rows)),
            Logits::Device(t) => t,
        };
        let (meta, settings) = (&self.meta, &self.settings);
        let rows: Vec<(&SamplingParams, usize)> = samplers
            .iter()
            .map(|&id| {
                let m = &meta[id.0];
                (&settings[m.request].params, m.tokens.len() - m.prompt_len)
            })
            .collect();
        if let Some(rows) = self.backend.candidates(logits, &rows)? {
            return self.draw_from_candidates(samplers, logits, &rows);
        }
        let host = logits_to_host(logits)?;
        Ok(self.draw_tokens(samplers, &host))
    }

    /// [`super::sampling::sample_candidates`] per row; a row without candidates is sampled densely.
    fn draw_from_candidates(
        &mut self,
        samplers: &[SeqId],
        logits: &Tensor,
        rows: &[super::sampling::CandidateRow],
    ) -> Result<Vec<(Sampled, SampleRng)>> {
        if self.scratch.is_empty() {
            self.scratch.push(Scratch::new());
        }
        let scratch = &mut self.scratch[0];
        let eos = &self.cfg.eos_token_ids;
        let mut out = Vec::with_capacity(samplers.len());
        for (i, (id, row)) in samplers.iter().zip(rows).enumerate() {
            let m = &self.meta[id.0];
            let params = &self.settings[m.request].params;
            let mut rng = m.rng.clone();
            let s = match super::sampling::sample_candidates(row, params, &mut rng, scratch) {
                Some(s) => s,
                None => {
                    let dense = logits_to_host(&logits.get(i)?)?;
                    let (prompt, generated) = m.tokens.split_at(m.prompt_len);
                    sample(&dense, params, prompt, generated, eos, &mut rng, scratch)
                }
            };
            out.push((s, rng));
        }
        Ok(out)
    }

    /// Draws one token per sampling sequence from its logits row (`logits` holds the rows end to
    /// end), in parallel: each worker owns one scratch and a contiguous run of rows. A draw
    /// depends only on its row and its own RNG, so the split cannot change any token. Returns
    /// each draw and the sequence's advanced RNG.
    fn draw_tokens(&mut self, samplers: &[SeqId], logits: &[f32]) -> Vec<(Sampled, SampleRng)> {
        let vocab = logits.len() / samplers.len().max(1);
        let workers = rayon::current_num_threads().clamp(1, samplers.len().max(1));
        if self.scratch.len() < workers {
            self.scratch.resize_with(workers, Scratch::new);
        }
        let per = samplers.len().div_ceil(workers).max(1);
        let (meta, settings, eos) = (&self.meta, &self.settings, &self.cfg.eos_token_ids);
        samplers
            .par_chunks(per)
            .zip(logits.par_chunks(per * vocab.max(1)))
            .zip(self.scratch.par_iter_mut())
            .flat_map_iter(|((ids, rows), scratch)| {
                ids.iter()
                    .zip(rows.chunks(vocab.max(1)))
                    .map(|(id, row)| {
                        let m = &meta[id.0];
                        let params = &settings[m.request].params;
                        let mut rng = m.rng.clone();
                        let (prompt, generated) = m.tokens.split_at(m.prompt_len);
                        let s = sample(row, params, prompt, generated, eos, &mut rng, scratch);
                        (s, rng)
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Forks the leader's waiting siblings once its prompt is cached.
    fn fork_siblings(&mut self, leader: SeqId) -> Result<()> {
        let (request, pending, prompt_len) = {
            let m = &self.meta[leader.0];
            (m.request, m.pending_forks, m.prompt_len)
        };
        // a recurrent model's samples fork before the prompt's last token (see `add`)
        let at = if self.states.is_used() {
            prompt_len - 1
        } else {
            prompt_len
        };
        if pending == 0 || self.seqs[leader.0].num_computed < at {
            return Ok(());
        }
        self.meta[leader.0].pending_forks = 0;
        if self.states.is_used() {
            self.seqs[leader.0].limit = None;
            if at > 0 {
                let slot = self.slot_of[leader.0].expect("a leader past its first token runs");
                let state = self.states.read(slot)?;
                self.prompt_states.insert(request, (state, pending));
            }
        }
        let prompt = self.meta[leader.0].tokens[..prompt_len].to_vec();
        // Highest index first, so that add_front leaves them in index order.
        for k in (1..=pending).rev() {
            let table = self.seqs[leader.0].block_table.fork(&mut self.sched.pool);
            let state = SeqState {
                num_computed: prompt_len - 1,
                block_table: table,
                ..SeqState::default()
            };
            let id = self.new_seq(request, k, &prompt, 0, state);
            self.sched.add_front(id);
        }
        Ok(())
    }

    /// Appends the drawn token to `id`; returns the sample when it ended.
    fn take_token(&mut self, id: SeqId, s: Sampled, decode: Option<Decoder>) -> Option<Sample> {
        let m = &mut self.meta[id.0];
        m.tokens.push(s.token);
        m.logprob += s.logprob as f64;
        self.seqs[id.0].num_tokens += 1;
        self.stats.generated_tokens += 1;
        let generated = &m.tokens[m.prompt_len..];
        let settings = &self.settings[m.request];
        let after = after_token(
            &settings.params,
            &self.cfg.eos_token_ids,
            settings.thinking.as_ref(),
            generated,
            m.thinking_closed,
            decode,
        );
        let mut reason = match after {
            After::Continue => None,
            After::Finish(r) => Some(r),
            After::ThinkingClosed => {
                m.thinking_closed = true;
                None
            }
            After::Close(add) => {
                // Force the closing text in; the next steps compute it like a prompt chunk.
                m.tokens.extend_from_slice(add);
                if settings.params.logprobs.is_some() {
                    m.token_logprobs.extend(add.iter().map(|_| TokenLogprob {
                        logprob: None,
                        top: Vec::new(),
                    }));
                }
                self.seqs[id.0].num_tokens += add.len();
                m.thinking_closed = true;
                m.thinking_forced = true;
                (m.tokens.len() - m.prompt_len >= settings.params.max_new_tokens)
                    .then_some(FinishReason::Length)
            }
        };
        if reason == Some(FinishReason::Stop) && m.thinking_forced {
            reason = Some(FinishReason::ThinkingBudget);
        }
        let reason = reason?;
        m.done = true;
        let sample = Sample {
            request: m.request,
            problem_id: self.requests[m.request].problem_id.clone(),
            sample_index: m.sample_index,
            tokens: m.tokens[m.prompt_len..].to_vec(),
            finish_reason: reason,
            cumulative_logprob: m.logprob,
            logprobs: settings
                .params
                .logprobs
                .map(|_| std::mem::take(&mut m.token_logprobs)),
        };
        // Siblings are forked before the leader's blocks go (see `step`).
        self.finish_seq(id);
        Some(sample)
    }

    /// The settings sequence `id` draws with (its request's).
    fn settings_of(&self, id: SeqId) -> &Arc<RequestSettings> {
        &self.settings[self.meta[id.0].request]
    }

    /// Removes a finished sequence: its blocks and its state slot go back.
    fn finish_seq(&mut self, id: SeqId) {
        self.sched.finish(id, &mut self.seqs);
        if let Some(slot) = self.slot_of[id.0].take() {
            self.states.release(slot);
        }
    }

    /// Gives every sequence of `step` a state slot (preempted ones give theirs back first):
    /// zeros for a sequence that starts at its first token, the prompt's state for a sample
    /// that starts at the prompt's last token.
    fn assign_slots(&mut self, step: &super::scheduler::Step) -> Result<Vec<usize>> {
        for id in &step.preempted {
            if let Some(slot) = self.slot_of[id.0].take() {
                self.states.release(slot);
            }
        }
        let mut slots = Vec::with_capacity(step.scheduled.len());
        for &(id, _) in &step.scheduled {
            if let Some(slot) = self.slot_of[id.0] {
                slots.push(slot);
                continue;
            }
            let Some(slot) = self.states.alloc()? else {
                bail!("no free state slot: more sequences run than max_num_seqs");
            };
            self.slot_of[id.0] = Some(slot);
            if self.seqs[id.0].num_computed > 0 {
                let request = self.meta[id.0].request;
                let Some((state, waiting)) = self.prompt_states.get_mut(&request) else {
                    bail!(
                        "sample {} of request {request} starts without its prompt's state",
                        id.0
                    );
                };
                self.states.write(slot, state)?;
                *waiting -= 1;
                if *waiting == 0 {
                    self.prompt_states.remove(&request);
                }
            }
            slots.push(slot);
        }
        Ok(slots)
    }
}
