//! Next-token sampling (vLLM semantics) and a per-sample deterministic RNG; knows no model/tokenizer/scheduler.
//!
//! It sees one sequence's logits row on CPU, token ids and [`SamplingParams`]; batching, stopping
//! and detokenizing are the caller's job.
//!
//! [`sample`] turns one logits row (vocab-sized `&[f32]`) into a [`Sampled`] token. Processing
//! order, as in vLLM: repetition penalty → frequency/presence penalties → `min_new_tokens`
//! masking → temperature → top-k → top-p → min-p → softmax → one inverse-CDF draw.
//!
//! Decisions (callers rely on these):
//! - **RNG.** [`SampleRng`] is per sequence, seeded from (run seed, problem id, sample index)
//!   only, and [`sample`] advances it by exactly one draw per call — greedy calls included — so
//!   draw *n* always belongs to generated token *n*. A sample's token stream therefore depends
//!   only on its seed triple and its own logits, never on batch composition.
//! - **Logprob.** [`Sampled::logprob`] is the log-probability of the chosen token under
//!   `log_softmax` of the *raw* logits (before penalties, temperature and truncation), like
//!   vLLM's raw logprobs. Summed over a completion it is our Parquet `cumulative_logprob`.
//! - **Greedy.** `temperature < GREEDY_TEMPERATURE_EPS` (1e-5, vLLM's epsilon; also NaN or
//!   negative) is greedy: argmax after penalties and masking, ties broken by lowest token id.
//!   top-k keeps exactly `k` tokens, ties at the cut broken by lowest token id.
//! - **Degenerate input never panics.** NaN logits count as `-inf`, `+inf` as `f32::MAX`. If no
//!   token survives processing (every logit `-inf`), the token is the argmax of the raw logits
//!   (lowest id; token 0 if those are all `-inf` or the row is empty) and its logprob is `-inf`
//!   when the raw row has no finite mass. Token ids outside the vocab are ignored.
//! - **`ignore_eos`.** While `min_new_tokens` is not reached, `stop_token_ids` are masked, and the
//!   EOS ids too unless `ignore_eos` (then EOS ends nothing, as in vLLM's stop-id set).
//! - **Allocation.** [`Scratch`] owns every buffer; after the first call at a given vocab size the
//!   decode loop allocates nothing per token. Reuse one `Scratch` per worker thread.

use serde::{Deserialize, Serialize};
use std::cmp::Ordering;

use crate::simd::{max_sum_exp, sanitize};

/// Temperatures below this are greedy (vLLM's `_SAMPLING_EPS`); dividing by them overflows f32.
pub const GREEDY_TEMPERATURE_EPS: f32 = 1e-5;

/// Per-request sampling settings (vLLM/OpenAI semantics). `Default` is greedy decoding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature; 0 (below [`GREEDY_TEMPERATURE_EPS`]) means greedy argmax.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 = off.
    pub top_k: usize,
    /// Keep the smallest most-likely prefix with probability mass ≥ `top_p`; 1.0 = off.
    pub top_p: f32,
    /// Drop tokens with probability below `min_p` × the top probability; 0 = off.
    pub min_p: f32,
    /// HF/vLLM repetition penalty over prompt ∪ generated tokens; 1.0 = off.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token generated at least once; 0 = off.
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of generated tokens; 0 = off.
    pub frequency_penalty: f32,
    /// Hard cap on generated tokens (enforced by the caller).
    pub max_new_tokens: usize,
    /// EOS and stop token ids are masked until this many tokens were generated.
    pub min_new_tokens: usize,
    /// Extra token ids that end a completion (checked by the caller).
    pub stop_token_ids: Vec<u32>,
    /// Strings that end a completion; see [`stop_string_hit`].
    pub stop_strings: Vec<String>,
    /// Keep generating past EOS (EOS is then not masked by `min_new_tokens`).
    pub ignore_eos: bool,
    /// Run seed, the first part of every [`SampleRng`] seed triple.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            max_new_tokens: 2048,
            min_new_tokens: 0,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
            ignore_eos: false,
            seed: 0,
        }
    }
}

fn require(ok: bool, message: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(message())
    }
}

impl SamplingParams {
    /// Checks every field's range; the error names the offending field and its value.
    pub fn validate(&self) -> Result<(), String> {
        let t = self.temperature;
        require(t.is_finite() && t >= 0.0, || {
            format!("temperature must be a finite number >= 0 (0 = greedy), got {t}")
        })?;
        let p = self.top_p;
        require(p > 0.0 && p <= 1.0, || {
            format!("top_p must be in (0, 1] (1 = off), got {p}")
        })?;
        let m = self.min_p;
        require((0.0..=1.0).contains(&m), || {
            format!("min_p must be in [0, 1] (0 = off), got {m}")
        })?;
        let r = self.repetition_penalty;
        require(r.is_finite() && r > 0.0, || {
            format!("repetition_penalty must be a finite number > 0 (1 = off), got {r}")
        })?;
        self.validate_additive_penalties()?;
        self.validate_lengths()
    }

    fn validate_additive_penalties(&self) -> Result<(), String> {
        let presence = self.presence_penalty;
        require(presence.is_finite(), || {
            format!("presence_penalty must be a finite number (0 = off), got {presence}")
        })?;
        let frequency = self.frequency_penalty;
        require(frequency.is_finite(), || {
            format!("frequency_penalty must be a finite number (0 = off), got {frequency}")
        })
    }

    fn validate_lengths(&self) -> Result<(), String> {
        require(self.max_new_tokens >= 1, || {
            "max_new_tokens must be >= 1, got 0".to_string()
        })?;
        let (min, max) = (self.min_new_tokens, self.max_new_tokens);
        require(min <= max, || {
            format!("min_new_tokens ({min}) must be <= max_new_tokens ({max})")
        })?;
        require(self.stop_strings.iter().all(|s| !s.is_empty()), || {
            "stop_strings must not contain an empty string".to_string()
        })
    }

    /// Whether these settings decode greedily (see [`GREEDY_TEMPERATURE_EPS`]).
    pub fn is_greedy(&self) -> bool {
        self.temperature.is_nan() || self.temperature < GREEDY_TEMPERATURE_EPS
    }
}

// ---------------------------------------------------------------------------------------------
// Deterministic RNG
// ---------------------------------------------------------------------------------------------

const FNV1A_64_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV1A_64_PRIME: u64 = 0x0000_0100_0000_01b3;
const SPLITMIX64_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// FNV-1a 64 of `bytes`, continuing from `hash` (start from [`FNV1A_64_OFFSET_BASIS`]).
fn fnv1a_64(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(FNV1A_64_PRIME)
    })
}

/// SplitMix64's output finalizer (a bijective 64-bit mixer).
fn splitmix64_mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// SplitMix64 generator for one sample (one sequence). Stable across runs, platforms and
/// releases: changing the seeding or the generator changes every sampled dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleRng {
    state: u64,
}

impl SampleRng {
    /// Seeds from FNV-1a 64 over `run_seed` (8 bytes LE), `problem_id`'s byte length (8 bytes
    /// LE, so ids cannot run into the index), `problem_id`'s UTF-8 bytes and `sample_index`
    /// (4 bytes LE), passed through the SplitMix64 finalizer.
    pub fn new(run_seed: u64, problem_id: &str, sample_index: u32) -> Self {
        let id_len = problem_id.len() as u64;
        let mut hash = fnv1a_64(FNV1A_64_OFFSET_BASIS, &run_seed.to_le_bytes());
        hash = fnv1a_64(hash, &id_len.to_le_bytes());
        hash = fnv1a_64(hash, problem_id.as_bytes());
        hash = fnv1a_64(hash, &sample_index.to_le_bytes());
        Self {
            state: splitmix64_mix(hash),
        }
    }

    /// Next 64 random bits (standard SplitMix64 step).
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(SPLITMIX64_GAMMA);
        splitmix64_mix(self.state)
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        const INV_2_POW_53: f64 = 1.0 / (1u64 << 53) as f64;
        (self.next_u64() >> 11) as f64 * INV_2_POW_53
    }
}

// ---------------------------------------------------------------------------------------------
// Sampling
// ---------------------------------------------------------------------------------------------

/// One sampled token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// `log_softmax(raw logits)[token]`: before penalties, temperature and truncation.
    pub logprob: f32,
}

/// Reusable buffers for [`sample`]; they grow to the vocab size once and are then reused, so
/// decoding allocates nothing per token. Between calls `generated_counts` is all zero and
/// `seen` all false (each call resets exactly the entries it touched).
#[derive(Debug, Default)]
pub struct Scratch {
    /// The processed logits row.
    logits: Vec<f32>,
    /// Surviving candidate token ids.
    candidates: Vec<u32>,
    /// Unnormalized probabilities of `candidates`, same order.
    weights: Vec<f64>,
    /// Per-token occurrence counts in the generated tokens.
    generated_counts: Vec<u32>,
    /// Per-token "in prompt ∪ generated" flags.
    seen: Vec<bool>,
}

impl Scratch {
    pub fn new() -> Self {
        Self::default()
    }
}

/// Samples the next token from one logits row. Draws exactly one uniform from `rng` per call
/// (greedy too). `eos_token_ids` are the model's EOS ids (masked under `min_new_tokens`). Never
/// panics; see the module docs for degenerate inputs.
pub fn sample(
    logits: &[f32],
    params: &SamplingParams,
    prompt_tokens: &[u32],
    generated: &[u32],
    eos_token_ids: &[u32],
    rng: &mut SampleRng,
    scratch: &mut Scratch,
) -> Sampled {
    let uniform = rng.next_f64();
    let plain = !has_penalties(params) && generated.len() >= params.min_new_tokens;
    if params.is_greedy() && plain {
        return greedy(logits);
    }
    if plain {
        // (not greedy) the temperature step, and the raw row's max for the log-probability, in
        // one pass: the values the general path below computes in steps
        let row = crate::simd::temper(logits, params.temperature, &mut scratch.logits);
        let whole = params.top_k == 0 && params.top_p >= 1.0 && params.min_p <= 0.0;
        let token = (whole && !row.masked)
            .then(|| draw_whole_row(scratch, uniform))
            .flatten()
            .or_else(|| select_and_draw(scratch, params, uniform))
            .or_else(|| argmax(logits))
            .unwrap_or(0);
        let logprob = if row.has_inf {
            raw_logprob(logits, token)
        } else {
            logprob_with_max(logits, token, row.max)
        };
        return Sampled { token, logprob };
    }
    scratch.logits.clear();
    scratch.logits.extend(logits.iter().map(|&l| sanitize(l)));
    apply_penalties(scratch, params, prompt_tokens, generated);
    if generated.len() < params.min_new_tokens {
        mask_stop_tokens(&mut scratch.logits, params, eos_token_ids);
    }
    let chosen = if params.is_greedy() {
        argmax(&scratch.logits)
    } else {
        sample_processed(scratch, params, uniform)
    };
    let token = chosen.or_else(|| argmax(logits)).unwrap_or(0);
    Sampled {
        token,
        logprob: raw_logprob(logits, token),
    }
}

/// Greedy on an untransformed row: what the general path draws (the first maximum, NaN as
/// `-inf`, `+inf` as `f32::MAX`) from one vectorised pass for the max and the log-sum-exp and a
/// scan to the first maximum, without copying the row.
fn greedy(logits: &[f32]) -> Sampled {
    let (max, sum_exp) = max_sum_exp(logits);
    if max.is_infinite() || max.is_nan() {
        let token = argmax(logits).unwrap_or(0);
        return Sampled {
            token,
            logprob: raw_logprob(logits, token),
        };
    }
    let token = crate::simd::position_eq(logits, max).unwrap_or(0) as u32;
    let max = f64::from(max);
    Sampled {
        token,
        logprob: (f64::from(logit_at(logits, token)) - max - sum_exp.ln()) as f32,
    }
}

/// The draw of the general path when it keeps every token (temperature only: no top-k, top-p,
/// min-p, penalties or masks) and every tempered logit (`scratch.logits`, from
/// [`crate::simd::temper`]) is finite, without its list of candidates: the same weights
/// ([`fill_weights`] of the whole row) and the same scan ([`pick`]), so the same token.
fn draw_whole_row(scratch: &mut Scratch, uniform: f64) -> Option<u32> {
    let Scratch {
        logits: scaled,
        weights,
        ..
    } = scratch;
    if scaled.is_empty() {
        return None;
    }
    weights.clear();
    crate::simd::exp_sub_f64(scaled, crate::simd::lane_max(scaled), weights);
    pick(weights, sum_weights(weights), uniform).map(|i| i as u32)
}

/// Whether repetition, presence or frequency penalties change the row.
fn has_penalties(params: &SamplingParams) -> bool {
    params.repetition_penalty != 1.0
        || params.presence_penalty != 0.0
        || params.frequency_penalty != 0.0
}

/// Most candidates a row may bring from the GPU (`kernels/sampling.cu`'s KMAX).
pub const MAX_CANDIDATES: usize = 1024;

/// How many candidates per row suffice to draw exactly what [`sample`] draws from the dense row:
/// 1 for greedy, `top_k` when set; `None` when the draw needs the whole row (penalties, which
/// can reorder it; stop tokens still masked by `min_new_tokens`; no top-k).
pub fn candidates_needed(params: &SamplingParams, generated: usize) -> Option<usize> {
    if has_penalties(params) || generated < params.min_new_tokens {
        return None;
    }
    if params.is_greedy() {
        return Some(1);
    }
    (params.top_k > 0 && params.top_k <= MAX_CANDIDATES).then_some(params.top_k)
}

/// One row's best candidates: `ids` and transformed `values` (sanitized, divided by the
/// temperature unless greedy) ordered by (value desc, id asc), the sanitized raw logits of the
/// same ids, and the raw row's max and sum of `exp(x - max)` (for the log-probability).
#[derive(Debug, Clone, PartialEq)]
pub struct CandidateRow {
    pub ids: Vec<u32>,
    pub values: Vec<f32>,
    pub raw: Vec<f32>,
    pub max: f32,
    pub sum_exp: f64,
}

/// The CPU reference of the GPU kernel: the best `k` candidates of `logits` under `params`.
pub fn top_candidates(logits: &[f32], params: &SamplingParams, k: usize) -> CandidateRow {
    let value = |x: f32| {
        if params.is_greedy() {
            sanitize(x)
        } else {
            sanitize(x / params.temperature)
        }
    };
    let values: Vec<f32> = logits.iter().map(|&x| value(x)).collect();
    let mut ids: Vec<u32> = (0u32..)
        .zip(&values)
        .filter(|(_, &v)| v > f32::NEG_INFINITY)
        .map(|(i, _)| i)
        .collect();
    ids.sort_unstable_by(by_logit_desc(&values));
    ids.truncate(k);
    let clean: Vec<f32>;
    let row = if logits.contains(&f32::INFINITY) {
        clean = logits.iter().map(|&x| sanitize(x)).collect();
        &clean
    } else {
        logits
    };
    let (max, sum_exp) = max_sum_exp(row);
    CandidateRow {
        values: ids.iter().map(|&i| values[i as usize]).collect(),
        raw: ids.iter().map(|&i| logit_at(logits, i)).collect(),
        ids,
        max,
        sum_exp,
    }
}

/// [`sample`] from a row's best candidates (see [`candidates_needed`] for when they suffice):
/// the same draw, token and log-probability (up to the rounding of the row's sum of exps).
/// `None` when the row has no candidate (every value is `-inf`): the caller samples the dense
/// row. Draws one uniform from `rng` when it returns `Some`.
pub fn sample_candidates(
    c: &CandidateRow,
    params: &SamplingParams,
    rng: &mut SampleRng,
    scratch: &mut Scratch,
) -> Option<Sampled> {
    if c.ids.is_empty() {
        return None;
    }
    let uniform = rng.next_f64();
    let chosen = if params.is_greedy() {
        Some(0)
    } else {
        let Scratch {
            logits,
            candidates,
            weights,
            ..
        } = scratch;
        logits.clear();
        logits.extend_from_slice(&c.values);
        candidates.clear();
        candidates.extend(0..c.ids.len() as u32);
        if params.top_p < 1.0 {
            keep_top_p(logits, candidates, weights, params.top_p);
        }
        if params.min_p > 0.0 {
            keep_min_p(logits, candidates, params.min_p);
        }
        draw(logits, candidates, weights, uniform)
    };
    let i = chosen.unwrap_or(0) as usize;
    let logprob = if c.max == f32::NEG_INFINITY || c.max.is_nan() {
        f32::NEG_INFINITY
    } else {
        (f64::from(c.raw[i]) - f64::from(c.max) - c.sum_exp.ln()) as f32
    };
    Some(Sampled {
        token: c.ids[i],
        logprob,
    })
}

fn logit_at(logits: &[f32], token: u32) -> f32 {
    logits
        .get(token as usize)
        .map_or(f32::NEG_INFINITY, |&l| sanitize(l))
}

/// Lowest token id with the largest logit (NaN counts as `-inf`); `None` if all are `-inf`.
fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(u32, f32)> = None;
    for (token, &raw) in (0u32..).zip(logits) {
        let logit = sanitize(raw);
        let better = match best {
            None => logit > f32::NEG_INFINITY,
            Some((_, best_logit)) => logit > best_logit,
        };
        if better {
            best = Some((token, logit));
        }
    }
    best.map(|(token, _)| token)
}

/// `log_softmax(logits)[token]` (vectorised f32 exponentials, f64 sum across chunks: about 1e-6
/// relative error); `-inf` if the row has no finite mass.
fn raw_logprob(logits: &[f32], token: u32) -> f32 {
    // NaN → -inf (skipped), +inf → f32::MAX as `sanitize` does: rows are finite in practice.
    if logits.contains(&f32::INFINITY) {
        let clean: Vec<f32> = logits.iter().map(|&l| sanitize(l)).collect();
        return raw_logprob(&clean, token);
    }
    let (max, sum_exp) = max_sum_exp(logits);
    logprob_from(logits, token, max, sum_exp)
}

/// The `k` most likely tokens of a raw logits row and their log-probabilities, most likely
/// first (ties: the lower id first): vLLM's raw `logprobs`, the same values as
/// [`Sampled::logprob`] gives the chosen token.
pub fn top_logprobs(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    if k == 0 || logits.is_empty() {
        return Vec::new();
    }
    if logits.contains(&f32::INFINITY) {
        let clean: Vec<f32> = logits.iter().map(|&l| sanitize(l)).collect();
        return top_logprobs(&clean, k);
    }
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    for (token, &raw) in (0u32..).zip(logits) {
        let logit = sanitize(raw);
        if best.len() == k && best.last().is_some_and(|&(_, worst)| logit <= worst) {
            continue;
        }
        // after the equal ones: a tie keeps the lower id first
        let at = best.partition_point(|&(_, b)| b >= logit);
        best.insert(at, (token, logit));
        best.truncate(k);
    }
    let (max, sum_exp) = max_sum_exp(logits);
    best.into_iter()
        .map(|(token, _)| (token, logprob_from(logits, token, max, sum_exp)))
        .collect()
}

/// [`raw_logprob`] of a row without +inf whose max (as [`max_sum_exp`] finds it) is known:
/// the same bits.
fn logprob_with_max(logits: &[f32], token: u32, max: f32) -> f32 {
    let sum_exp = if max == f32::NEG_INFINITY {
        0.0
    } else {
        crate::simd::sum_exp_from(logits, max)
    };
    logprob_from(logits, token, max, sum_exp)
}

/// `log_softmax[token]` from the row's max (never NaN) and sum of exponentials.
fn logprob_from(logits: &[f32], token: u32, max: f32, sum_exp: f64) -> f32 {
    if max == f32::NEG_INFINITY {
        return f32::NEG_INFINITY;
    }
    (f64::from(logit_at(logits, token)) - f64::from(max) - sum_exp.ln()) as f32
}

fn apply_penalties(scratch: &mut Scratch, params: &SamplingParams, prompt: &[u32], gen: &[u32]) {
    let vocab = scratch.logits.len();
    if params.repetition_penalty != 1.0 {
        grow_to(&mut scratch.seen, vocab);
        let penalty = params.repetition_penalty;
        apply_repetition_penalty(&mut scratch.logits, &mut scratch.seen, penalty, prompt, gen);
    }
    if params.presence_penalty != 0.0 || params.frequency_penalty != 0.0 {
        grow_to(&mut scratch.generated_counts, vocab);
        let counts = &mut scratch.generated_counts;
        apply_presence_frequency(&mut scratch.logits, counts, params, gen);
    }
}

fn grow_to<T: Default + Clone>(buffer: &mut Vec<T>, len: usize) {
    if buffer.len() < len {
        buffer.resize(len, T::default());
    }
}

/// HF/vLLM: each token in prompt ∪ generated, once: logit > 0 → logit / p, else logit × p.
fn apply_repetition_penalty(
    logits: &mut [f32],
    seen: &mut [bool],
    penalty: f32,
    prompt: &[u32],
    generated: &[u32],
) {
    for &token in prompt.iter().chain(generated) {
        if let Some(flag) = seen.get_mut(token as usize) {
            *flag = true;
        }
    }
    for &token in prompt.iter().chain(generated) {
        let Some(flag) = seen.get_mut(token as usize) else {
            continue;
        };
        if !std::mem::take(flag) {
            continue; // already penalized (or never marked)
        }
        if let Some(logit) = logits.get_mut(token as usize) {
            let penalized = if *logit > 0.0 {
                *logit / penalty
            } else {
                *logit * penalty
            };
            *logit = sanitize(penalized);
        }
    }
}

/// OpenAI/vLLM over generated tokens: logit -= presence × (count > 0) + frequency × count.
fn apply_presence_frequency(
    logits: &mut [f32],
    counts: &mut [u32],
    params: &SamplingParams,
    generated: &[u32],
) {
    for &token in generated {
        if let Some(count) = counts.get_mut(token as usize) {
            *count = count.saturating_add(1);
        }
    }
    for &token in generated {
        let Some(count) = counts.get_mut(token as usize) else {
            continue;
        };
        let count = std::mem::take(count);
        if count == 0 {
            continue; // already penalized
        }
        if let Some(logit) = logits.get_mut(token as usize) {
            let penalty = params.presence_penalty + params.frequency_penalty * count as f32;
            *logit = sanitize(*logit - penalty);
        }
    }
}

/// `min_new_tokens` not reached: stop ids (and EOS ids unless `ignore_eos`) become `-inf`.
fn mask_stop_tokens(logits: &mut [f32], params: &SamplingParams, eos_token_ids: &[u32]) {
    let eos: &[u32] = if params.ignore_eos {
        &[]
    } else {
        eos_token_ids
    };
    for &token in params.stop_token_ids.iter().chain(eos) {
        if let Some(logit) = logits.get_mut(token as usize) {
            *logit = f32::NEG_INFINITY;
        }
    }
}

/// Temperature → top-k → top-p → min-p → draw; `None` if no token has finite logit.
fn sample_processed(scratch: &mut Scratch, params: &SamplingParams, uniform: f64) -> Option<u32> {
    for logit in scratch.logits.iter_mut() {
        *logit = sanitize(*logit / params.temperature);
    }
    select_and_draw(scratch, params, uniform)
}

/// The draw of [`sample_processed`] from a row already divided by the temperature.
fn select_and_draw(scratch: &mut Scratch, params: &SamplingParams, uniform: f64) -> Option<u32> {
    let Scratch {
        logits,
        candidates,
        weights,
        ..
    } = scratch;
    if params.top_k > 0 && params.top_k <= TOP_K_SCAN_MAX {
        // the k best in one scan, without a candidate list of the whole vocabulary
        top_k_scan(logits, params.top_k, candidates);
    } else {
        candidates.clear();
        candidates.extend(
            (0u32..)
                .zip(logits.iter())
                .filter(|(_, &l)| l > f32::NEG_INFINITY)
                .map(|(token, _)| token),
        );
        if params.top_k > 0 {
            keep_top_k(logits, candidates, params.top_k);
        }
    }
    if params.top_p < 1.0 {
        keep_top_p(logits, candidates, weights, params.top_p);
    }
    if params.min_p > 0.0 {
        keep_min_p(logits, candidates, params.min_p);
    }
    draw(logits, candidates, weights, uniform)
}

/// Largest `top_k` that [`top_k_scan`] takes (its cost grows with k; past this, selection).
const TOP_K_SCAN_MAX: usize = 64;

/// What [`keep_top_k`] leaves of the finite tokens of `logits` (no NaN: the row is sanitized),
/// without listing them first: the `k` best under [`by_logit_desc`]'s order, best first, found in
/// one pass in id order. The pass keeps the k best seen so far; a later token enters only with a
/// logit above the worst kept (on a tie its higher id loses), and blocks of 64 whose largest
/// value cannot enter are skipped after one vectorised max.
fn top_k_scan(logits: &[f32], k: usize, out: &mut Vec<u32>) {
    out.clear();
    let mut i = 0;
    while out.len() < k && i < logits.len() {
        if logits[i] > f32::NEG_INFINITY {
            out.push(i as u32);
        }
        i += 1;
    }
    if out.len() == k {
        // the worst kept: lowest logit, and of those the highest id
        let worst = |out: &[u32]| {
            let mut w = 0;
            for (j, &t) in out.iter().enumerate() {
                let (a, b) = (logits[t as usize], logits[out[w] as usize]);
                if a < b || (a == b && t > out[w]) {
                    w = j;
                }
            }
            (w, logits[out[w] as usize])
        };
        let (mut wpos, mut wval) = worst(out);
        while i < logits.len() {
            let end = (i + 64).min(logits.len());
            if crate::simd::lane_max(&logits[i..end]) > wval {
                for (t, &l) in (i..end).zip(&logits[i..end]) {
                    if l > wval {
                        out[wpos] = t as u32;
                        (wpos, wval) = worst(out);
                    }
                }
            }
            i = end;
        }
    }
    out.sort_unstable_by(by_logit_desc(logits));
}

/// Higher logit first, then lower token id (a total order: candidates are in range, not NaN).
fn by_logit_desc(logits: &[f32]) -> impl Fn(&u32, &u32) -> Ordering + '_ {
    move |&a, &b| {
        let logit = |token: u32| logits.get(token as usize).copied();
        logit(b)
            .partial_cmp(&logit(a))
            .unwrap_or(Ordering::Equal)
            .then(a.cmp(&b))
    }
}

/// Keeps exactly the `top_k` best candidates (partial selection, then a sort of those kept).
/// The kept ones end sorted best first, so that the draw's order (and so its outcome) is a
/// function of the kept set alone, not of the selection algorithm: the GPU's top-k candidates
/// ([`sample_candidates`]) then draw exactly what this draws.
fn keep_top_k(logits: &[f32], candidates: &mut Vec<u32>, top_k: usize) {
    if top_k < candidates.len() {
        candidates.select_nth_unstable_by(top_k - 1, by_logit_desc(logits));
        candidates.truncate(top_k);
    }
    candidates.sort_unstable_by(by_logit_desc(logits));
}

/// First prefix length top-p examines; it grows ×8 until the prefix holds the wanted mass.
const TOP_P_FIRST_PREFIX_LEN: usize = 256;

/// Keeps the smallest most-likely prefix with probability mass ≥ `top_p` (at least one token).
/// Only a prefix holding that mass is sorted, not the whole vocab.
fn keep_top_p(logits: &[f32], candidates: &mut Vec<u32>, weights: &mut Vec<f64>, top_p: f32) {
    let max = max_logit(logits, candidates);
    let total = fill_weights(logits, candidates, weights);
    let target_mass = f64::from(top_p) * total;
    let prefix_len = select_prefix_with_mass(logits, candidates, max, target_mass);
    candidates.truncate(prefix_len);
    candidates.sort_unstable_by(by_logit_desc(logits));
    let mut cumulative = 0.0;
    let mut keep = candidates.len();
    for (rank, &token) in candidates.iter().enumerate() {
        cumulative += weight(logits, token, max);
        if cumulative >= target_mass {
            keep = rank + 1;
            break;
        }
    }
    candidates.truncate(keep.max(1));
}

/// Reorders `candidates` so that its first `n` entries are the `n` best (unsorted), for some
/// `n` whose summed weight reaches `target_mass` (or all of them); returns `n`.
fn select_prefix_with_mass(
    logits: &[f32],
    candidates: &mut [u32],
    max: f32,
    target_mass: f64,
) -> usize {
    let mut len = TOP_P_FIRST_PREFIX_LEN;
    while len < candidates.len() {
        candidates.select_nth_unstable_by(len - 1, by_logit_desc(logits));
        let mass: f64 = candidates
            .iter()
            .take(len)
            .map(|&token| weight(logits, token, max))
            .sum();
        if mass >= target_mass {
            return len;
        }
        len = len.saturating_mul(8);
    }
    candidates.len()
}

/// Drops candidates whose probability is below `min_p` × the top probability (min_p > 1 acts
/// as 1: only the top logit's ties survive).
fn keep_min_p(logits: &[f32], candidates: &mut Vec<u32>, min_p: f32) {
    let max = max_logit(logits, candidates);
    let min_ratio = f64::from(min_p.min(1.0));
    candidates.retain(|&token| weight(logits, token, max) >= min_ratio);
}

fn max_logit(logits: &[f32], candidates: &[u32]) -> f32 {
    candidates
        .iter()
        .map(|&token| logit_at(logits, token))
        .fold(f32::NEG_INFINITY, f32::max)
}

/// Unnormalized probability `exp(logit - max)`: [`crate::simd::fast_exp`] (within 2 ulp of
/// libm's) of the f32 difference, widened to f64 for the sums.
fn weight(logits: &[f32], token: u32, max: f32) -> f64 {
    f64::from(crate::simd::fast_exp(logit_at(logits, token) - max))
}

/// `weights[i] = weight(candidates[i])` with the candidates' max logit; returns their sum (in
/// eight f64 lanes). When the candidates are the whole row in order (a draw from the full
/// vocabulary), the row is read directly, eight values at a time, for the same values.
fn fill_weights(logits: &[f32], candidates: &[u32], weights: &mut Vec<f64>) -> f64 {
    weights.clear();
    let whole_row =
        candidates.len() == logits.len() && candidates.iter().zip(0u32..).all(|(&c, i)| c == i);
    if whole_row {
        // every candidate is finite, so the row's max is theirs
        crate::simd::exp_sub_f64(logits, crate::simd::lane_max(logits), weights);
    } else {
        let max = max_logit(logits, candidates);
        weights.extend(candidates.iter().map(|&token| weight(logits, token, max)));
    }
    sum_weights(weights)
}

/// The sum of the weights, in eight f64 lanes.
fn sum_weights(weights: &[f64]) -> f64 {
    let mut lanes = [0f64; 8];
    let chunks = weights.chunks_exact(8);
    let tail: f64 = chunks.remainder().iter().sum();
    for c in chunks {
        for (l, w) in lanes.iter_mut().zip(c) {
            *l += w;
        }
    }
    lanes.iter().sum::<f64>() + tail
}

/// Inverse-CDF draw over the softmax of the candidates with one uniform in [0, 1).
fn draw(logits: &[f32], candidates: &[u32], weights: &mut Vec<f64>, uniform: f64) -> Option<u32> {
    let total = fill_weights(logits, candidates, weights);
    pick(weights, total, uniform).map(|i| candidates[i])
}

/// The index the uniform lands on in the CDF of `weights` (whose sum is `total`); zero weights
/// are never picked; `None` if every weight is zero.
fn pick(weights: &[f64], total: f64, uniform: f64) -> Option<usize> {
    let target = uniform * total;
    let mut cumulative = 0.0;
    let mut last_positive = None;
    for (i, &weight) in weights.iter().enumerate() {
        if weight <= 0.0 {
            continue;
        }
        cumulative += weight;
        last_positive = Some(i);
        if target < cumulative {
            return Some(i);
        }
    }
    last_positive // rounding put `target` at the very end of the CDF
}

/// Byte index in `text_tail` where the earliest-starting stop string begins, if any; the caller
/// truncates the completion there. Empty stop strings are ignored.
pub fn stop_string_hit(text_tail: &str, stop_strings: &[String]) -> Option<usize> {
    stop_strings
        .iter()
        .filter(|stop| !stop.is_empty())
        .filter_map(|stop| text_tail.find(stop.as_str()))
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits_from_probs(probs: &[f64]) -> Vec<f32> {
        probs.iter().map(|p| p.ln() as f32).collect()
    }

    fn sample_plain(logits: &[f32], params: &SamplingParams, rng: &mut SampleRng) -> Sampled {
        let mut scratch = Scratch::new();
        sample(logits, params, &[], &[], &[], rng, &mut scratch)
    }

    /// Empirical token frequencies over `draws` samples from one fixed logits row.
    fn frequencies(logits: &[f32], params: &SamplingParams, draws: usize) -> Vec<f64> {
        let mut rng = SampleRng::new(7, "freq", 0);
        let mut scratch = Scratch::new();
        let mut counts = vec![0usize; logits.len()];
        for _ in 0..draws {
            let s = sample(logits, params, &[], &[], &[], &mut rng, &mut scratch);
            counts[s.token as usize] += 1;
        }
        counts.iter().map(|&c| c as f64 / draws as f64).collect()
    }

    fn assert_close(actual: &[f64], expected: &[f64], tolerance: f64) {
        assert_eq!(actual.len(), expected.len());
        for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
            assert!(
                (a - e).abs() < tolerance,
                "token {i}: got {a}, want {e} (all: {actual:?})"
            );
        }
    }

    fn random_params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            ..SamplingParams::default()
        }
    }

    /// Processed logits after penalties (and masking) only.
    fn processed(
        logits: &[f32],
        params: &SamplingParams,
        prompt: &[u32],
        generated: &[u32],
        scratch: &mut Scratch,
    ) -> Vec<f32> {
        scratch.logits.clear();
        scratch.logits.extend_from_slice(logits);
        apply_penalties(scratch, params, prompt, generated);
        scratch.logits.clone()
    }

    /// Rows with ties (values rounded to bf16-like steps), NaN, ±inf and -inf runs.
    fn awkward_row(seed: u64, vocab: usize) -> Vec<f32> {
        let mut rng = SampleRng::new(seed, "row", 0);
        (0..vocab)
            .map(|_| match rng.next_u64() % 50 {
                0 => f32::NAN,
                1 => f32::NEG_INFINITY,
                2 if seed.is_multiple_of(3) => f32::INFINITY,
                _ => ((rng.next_f64() * 12.0 - 6.0) * 4.0).round() as f32 / 4.0,
            })
            .collect()
    }

    #[test]
    fn candidate_rows_draw_exactly_what_the_dense_row_draws() {
        let settings = [
            (0.0, 0, 1.0, 0.0),
            (0.6, 20, 0.95, 0.0),
            (1.0, 5, 1.0, 0.1),
            (0.8, 50, 0.9, 0.05),
            (1.3, 400, 0.99, 0.0),
            (0.7, 1000, 1.0, 0.0),
        ];
        for (ti, &setting) in settings.iter().enumerate() {
            let params = truncation(setting);
            let k = candidates_needed(&params, 0).expect("no penalties: candidates suffice");
            for seed in 0..40u64 {
                let row = awkward_row(seed * 7 + ti as u64, 300 + seed as usize * 13);
                let mut a = SampleRng::new(seed, "p", 1);
                let mut b = a.clone();
                let dense = sample_plain(&row, &params, &mut a);
                let c = top_candidates(&row, &params, k);
                let got = sample_candidates(&c, &params, &mut b, &mut Scratch::new())
                    .expect("rows have finite values");
                assert_eq!(got.token, dense.token, "setting {ti}, seed {seed}");
                assert!(
                    (got.logprob - dense.logprob).abs() <= 1e-5 * dense.logprob.abs().max(1.0),
                    "setting {ti}, seed {seed}: {} vs {}",
                    got.logprob,
                    dense.logprob
                );
                assert_eq!(a.next_u64(), b.next_u64(), "one uniform drawn by each");
            }
        }
        let penalised = SamplingParams {
            repetition_penalty: 1.1,
            top_k: 20,
            temperature: 0.6,
            ..SamplingParams::default()
        };
        assert_eq!(candidates_needed(&penalised, 0), None);
        let min_new = SamplingParams {
            min_new_tokens: 3,
            ..SamplingParams::default()
        };
        assert_eq!(candidates_needed(&min_new, 2), None);
        assert_eq!(candidates_needed(&min_new, 3), Some(1));
        let no_top_k = SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        };
        assert_eq!(candidates_needed(&no_top_k, 0), None);
    }

    #[test]
    fn greedy_picks_argmax_lowest_id_on_ties() {
        let mut rng = SampleRng::new(1, "p", 0);
        let params = SamplingParams::default();
        assert_eq!(
            sample_plain(&[0.1, 3.0, -1.0, 2.9], &params, &mut rng).token,
            1
        );
        assert_eq!(
            sample_plain(&[0.1, 3.0, 3.0, 2.9], &params, &mut rng).token,
            1
        );
        assert_eq!(
            sample_plain(&[-5.0, -4.0, -4.5], &params, &mut rng).token,
            1
        );
    }

    /// Rows for the fast paths: ties, NaN, infinities, masked tokens, and a long row.
    fn odd_rows() -> Vec<Vec<f32>> {
        vec![
            vec![0.1, 3.0, 3.0, 2.9],
            vec![-0.0, 0.0, -1.0],
            vec![f32::NAN, -2.0, -1.0, f32::NAN],
            vec![1.0, f32::INFINITY, 2.0, f32::INFINITY],
            vec![f32::NAN, f32::NEG_INFINITY],
            vec![f32::NEG_INFINITY; 3],
            vec![5.0, f32::NEG_INFINITY, 4.0, 1.0, 0.5],
            vec![-80.0, 0.0, 80.0, 1e-3],
            (0..1000)
                .map(|i| ((i * 37 % 101) as f32).sin() * 5.0)
                .collect(),
            (0..5003)
                .map(|i| ((i * 7919 % 4999) as f32 / 4999.0 - 0.5) * 30.0)
                .collect(),
        ]
    }

    /// Sampling settings (temperature, top-k, top-p, min-p), the rest default.
    fn truncation((temperature, top_k, top_p, min_p): (f32, usize, f32, f32)) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            ..SamplingParams::default()
        }
    }

    /// `sample` on a plain row draws what the general path does with the same uniform (through
    /// the candidate list), with the same log-probability bit for bit, and takes one uniform.
    fn assert_draws_the_general_path(
        row: &[f32],
        params: &SamplingParams,
        rng: &mut SampleRng,
        scratch: &mut Scratch,
        at: &str,
    ) {
        let mut general_rng = rng.clone();
        let got = sample(row, params, &[], &[], &[], rng, scratch);
        let uniform = general_rng.next_f64();
        scratch.logits.clear();
        scratch.logits.extend(row.iter().map(|&l| sanitize(l)));
        let token = sample_processed(scratch, params, uniform)
            .or_else(|| argmax(row))
            .unwrap_or(0);
        assert_eq!(got.token, token, "{at}: {row:?}");
        assert_same_bits(got.logprob, raw_logprob(row, token), at);
        assert_eq!(*rng, general_rng);
    }

    /// The same f32, bit for bit (any NaN matching any NaN).
    fn assert_same_bits(got: f32, want: f32, at: &str) {
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "{at}: {got} vs {want}"
        );
    }

    /// The whole-row draw (temperature only) gives the general path's token and log-probability
    /// for the same uniform, row for row.
    #[test]
    fn whole_row_fast_path_draws_what_the_general_path_draws() {
        let mut rng = SampleRng::new(11, "whole", 0);
        let mut scratch = Scratch::new();
        for row in &odd_rows() {
            for temperature in [0.3f32, 0.7, 1.0, 1.7] {
                let params = random_params(temperature);
                for _ in 0..50 {
                    let at = format!("T {temperature}");
                    assert_draws_the_general_path(row, &params, &mut rng, &mut scratch, &at);
                }
            }
        }
    }

    /// The one-pass temperature step of a plain row (top-k, top-p, min-p) gives the general
    /// path's token and log-probability, bit for bit, for the same uniform.
    #[test]
    fn tempered_fast_path_draws_what_the_general_path_draws() {
        let mut rows = odd_rows();
        rows.extend((0..6).map(|seed| awkward_row(seed, 700 + 37 * seed as usize)));
        rows.push(Vec::new());
        rows.push(vec![f32::MAX, 1.0, -f32::MAX, f32::MAX, 0.5]);
        let settings = [
            (0.6, 20, 0.95, 0.0),
            (1.0, 5, 1.0, 0.1),
            (0.7, 0, 0.9, 0.0),
            (0.5, 0, 1.0, 0.0),
        ];
        let mut rng = SampleRng::new(5, "tempered", 0);
        let mut scratch = Scratch::new();
        for row in &rows {
            for &setting in &settings {
                let params = truncation(setting);
                for _ in 0..20 {
                    let at = format!("(T, top-k, top-p, min-p) {setting:?}");
                    assert_draws_the_general_path(row, &params, &mut rng, &mut scratch, &at);
                }
            }
        }
    }

    /// Top-k by one scan gives selection's set, in its order, for every k up to the scan's
    /// limit (ties, masked tokens, fewer finite tokens than k).
    #[test]
    fn top_k_scan_keeps_what_selection_keeps() {
        let mut rows = odd_rows();
        rows.push((0..3000).map(|i| ((i * 13) % 7) as f32).collect()); // many ties
        for row in &rows {
            let clean: Vec<f32> = row.iter().map(|&l| sanitize(l)).collect();
            for k in [1usize, 2, 3, 5, 20, 63, 64] {
                let mut want: Vec<u32> = (0u32..)
                    .zip(&clean)
                    .filter(|(_, &l)| l > f32::NEG_INFINITY)
                    .map(|(t, _)| t)
                    .collect();
                keep_top_k(&clean, &mut want, k);
                let mut got = Vec::new();
                top_k_scan(&clean, k, &mut got);
                assert_eq!(got, want, "k {k}: {row:?}");
            }
        }
    }

    #[test]
    fn greedy_fast_path_draws_what_the_general_path_draws() {
        let rows = odd_rows();
        for row in &rows {
            let want = argmax(row).unwrap_or(0);
            let got = greedy(row);
            assert_eq!(got.token, want, "{row:?}");
            assert_same_bits(got.logprob, raw_logprob(row, want), &format!("{row:?}"));
        }
    }

    #[test]
    fn every_call_draws_exactly_once_greedy_included() {
        let mut rng = SampleRng::new(1, "p", 0);
        let mut reference = rng.clone();
        let _ = sample_plain(&[1.0, 2.0], &SamplingParams::default(), &mut rng);
        let _ = sample_plain(&[1.0, 2.0], &random_params(1.0), &mut rng);
        reference.next_u64();
        reference.next_u64();
        assert_eq!(rng, reference);
    }

    #[test]
    fn temperature_one_frequencies_match_softmax() {
        let probs = [0.1, 0.2, 0.3, 0.4];
        let freq = frequencies(&logits_from_probs(&probs), &random_params(1.0), 50_000);
        assert_close(&freq, &probs, 0.01);
        let chi_square: f64 = freq
            .iter()
            .zip(&probs)
            .map(|(f, p)| 50_000.0 * (f - p).powi(2) / p)
            .sum();
        assert!(
            chi_square < 16.27,
            "chi-square {chi_square} (3 dof, p=0.001)"
        );
    }

    /// A row long enough for the eight-lane weights (and with a masked token, for the general
    /// path) draws its softmax at temperature 1 and 0.5.
    #[test]
    fn long_rows_draw_their_softmax() {
        let mut probs: Vec<f64> = (1..=27).map(f64::from).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        let freq = frequencies(&logits_from_probs(&probs), &random_params(1.0), 60_000);
        assert_close(&freq, &probs, 0.006);
        let squared: f64 = probs.iter().map(|p| p * p).sum();
        let sharp: Vec<f64> = probs.iter().map(|p| p * p / squared).collect();
        let freq = frequencies(&logits_from_probs(&probs), &random_params(0.5), 60_000);
        assert_close(&freq, &sharp, 0.006);
        let mut masked = logits_from_probs(&probs);
        masked[26] = f32::NEG_INFINITY;
        let rest = 1.0 - probs[26];
        let want: Vec<f64> = (0..27)
            .map(|i| if i == 26 { 0.0 } else { probs[i] / rest })
            .collect();
        let freq = frequencies(&masked, &random_params(1.0), 60_000);
        assert_close(&freq, &want, 0.006);
    }

    #[test]
    fn temperature_half_sharpens_to_squared_probs() {
        let probs = [0.1, 0.2, 0.3, 0.4];
        let squared_sum: f64 = probs.iter().map(|p| p * p).sum();
        let expected: Vec<f64> = probs.iter().map(|p| p * p / squared_sum).collect();
        let freq = frequencies(&logits_from_probs(&probs), &random_params(0.5), 50_000);
        assert_close(&freq, &expected, 0.01);
    }

    #[test]
    fn top_k_one_equals_greedy() {
        let mut greedy_rng = SampleRng::new(3, "k", 0);
        let mut top1_rng = SampleRng::new(3, "k", 1);
        let top1 = SamplingParams {
            top_k: 1,
            ..random_params(1.3)
        };
        for step in 0..200u32 {
            let logits: Vec<f32> = (0..50u32)
                .map(|i| ((i * 7919 + step * 104_729) % 101) as f32 / 10.0)
                .collect();
            let greedy = sample_plain(&logits, &SamplingParams::default(), &mut greedy_rng);
            assert_eq!(
                sample_plain(&logits, &top1, &mut top1_rng).token,
                greedy.token
            );
        }
    }

    #[test]
    fn top_k_renormalizes_over_the_k_best() {
        let probs = [0.1, 0.4, 0.2, 0.3];
        let params = SamplingParams {
            top_k: 2,
            ..random_params(1.0)
        };
        let freq = frequencies(&logits_from_probs(&probs), &params, 50_000);
        assert_close(&freq, &[0.0, 4.0 / 7.0, 0.0, 3.0 / 7.0], 0.01);
        assert_eq!(freq[0] + freq[2], 0.0);
    }

    #[test]
    fn top_p_keeps_smallest_prefix_reaching_p() {
        let probs = [0.15, 0.5, 0.05, 0.3];
        let params = SamplingParams {
            top_p: 0.75,
            ..random_params(1.0)
        };
        let freq = frequencies(&logits_from_probs(&probs), &params, 50_000);
        assert_eq!(
            freq[0] + freq[2],
            0.0,
            "excluded tokens were drawn: {freq:?}"
        );
        assert_close(&freq, &[0.0, 0.625, 0.0, 0.375], 0.01);
        let tiny = SamplingParams {
            top_p: 0.4,
            ..random_params(1.0)
        };
        let freq = frequencies(&logits_from_probs(&probs), &tiny, 2_000);
        assert_eq!(
            freq[1], 1.0,
            "top_p below the top mass keeps only the top token"
        );
    }

    /// Top-p by a full sort of the whole row, for comparison with the partial-selection path.
    fn top_p_by_full_sort(logits: &[f32], top_p: f64) -> Vec<u32> {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let weight = |t: u32| (f64::from(logits[t as usize]) - f64::from(max)).exp();
        let total: f64 = (0..logits.len() as u32).map(weight).sum();
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        order.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        let mut cumulative = 0.0;
        let keep = order.iter().position(|&t| {
            cumulative += weight(t);
            cumulative >= top_p * total
        });
        order.truncate(keep.map_or(logits.len(), |k| k + 1));
        order.sort_unstable();
        order
    }

    #[test]
    fn top_p_partial_selection_matches_full_sort_on_large_rows() {
        for (row, spread) in [(0u32, 0.5f32), (1, 3.0), (2, 20.0)] {
            let logits: Vec<f32> = (0..5000u32)
                .map(|i| ((i * 7919 + row * 31) % 4999) as f32 / 4999.0 * spread)
                .collect();
            for top_p in [0.01f32, 0.3, 0.9, 0.999] {
                let mut candidates: Vec<u32> = (0..5000).collect();
                keep_top_p(&logits, &mut candidates, &mut Vec::new(), top_p);
                candidates.sort_unstable();
                let want = top_p_by_full_sort(&logits, f64::from(top_p));
                assert_eq!(candidates, want, "spread {spread}, top_p {top_p}");
            }
        }
    }

    #[test]
    fn min_p_drops_tokens_below_fraction_of_top() {
        let probs = [0.5, 0.3, 0.15, 0.05];
        let params = SamplingParams {
            min_p: 0.2,
            ..random_params(1.0)
        };
        let freq = frequencies(&logits_from_probs(&probs), &params, 50_000);
        assert_eq!(freq[3], 0.0, "token below min_p x max was drawn: {freq:?}");
        assert_close(&freq, &[0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0], 0.01);
    }

    #[test]
    fn repetition_penalty_divides_positive_multiplies_negative_once() {
        let params = SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::default()
        };
        let logits = [2.0, -2.0, 1.0, 0.5, 4.0];
        let mut scratch = Scratch::new();
        let out = processed(&logits, &params, &[0, 0, 99], &[1, 1, 4], &mut scratch);
        assert_eq!(out, vec![1.0, -4.0, 1.0, 0.5, 2.0]);
        assert!(
            scratch.seen.iter().all(|&flag| !flag),
            "seen flags not reset"
        );
        let mut rng = SampleRng::new(0, "r", 0);
        let picked = sample(&logits, &params, &[4], &[], &[], &mut rng, &mut scratch);
        assert_eq!(
            picked.token, 0,
            "penalized 4.0 -> 2.0 ties 2.0, lowest id wins"
        );
    }

    #[test]
    fn presence_and_frequency_penalize_generated_only() {
        let params = SamplingParams {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..SamplingParams::default()
        };
        let logits = [1.0, 1.0, 1.0, 1.0];
        let mut scratch = Scratch::new();
        let out = processed(&logits, &params, &[0, 3], &[2, 2, 2, 1, 7], &mut scratch);
        assert_eq!(out, vec![1.0, 0.25, -0.25, 1.0]);
        assert!(
            scratch.generated_counts.iter().all(|&c| c == 0),
            "counts not reset"
        );
        let again = processed(&logits, &params, &[], &[2], &mut scratch);
        assert_eq!(again, vec![1.0, 1.0, 0.25, 1.0]);
    }

    #[test]
    fn min_new_tokens_masks_eos_and_stop_ids() {
        let eos = [0u32];
        let logits = [5.0, 4.0, 3.0, 1.0];
        let params = SamplingParams {
            min_new_tokens: 2,
            stop_token_ids: vec![1],
            ..SamplingParams::default()
        };
        let mut rng = SampleRng::new(0, "m", 0);
        let mut scratch = Scratch::new();
        let mut step = |generated: &[u32], params: &SamplingParams| {
            sample(
                &logits,
                params,
                &[],
                generated,
                &eos,
                &mut rng,
                &mut scratch,
            )
            .token
        };
        assert_eq!(step(&[], &params), 2);
        assert_eq!(step(&[2], &params), 2);
        assert_eq!(step(&[2, 2], &params), 0, "min reached: EOS allowed again");
        let ignore = SamplingParams {
            ignore_eos: true,
            ..params.clone()
        };
        assert_eq!(
            step(&[], &ignore),
            0,
            "ignore_eos: EOS is not a stop, not masked"
        );
        let random = SamplingParams {
            temperature: 1.0,
            ..params
        };
        for _ in 0..500 {
            assert!(step(&[3], &random) >= 2);
        }
    }

    #[test]
    fn same_seed_triple_same_stream_other_triples_differ() {
        let params = random_params(1.0);
        let stream = |seed: u64, problem: &str, index: u32| -> Vec<u32> {
            let mut rng = SampleRng::new(seed, problem, index);
            let mut scratch = Scratch::new();
            let mut generated = Vec::new();
            for step in 0..64u32 {
                let logits: Vec<f32> = (0..32u32).map(|i| ((i * 31 + step) % 7) as f32).collect();
                let s = sample(
                    &logits,
                    &params,
                    &[],
                    &generated,
                    &[],
                    &mut rng,
                    &mut scratch,
                );
                generated.push(s.token);
            }
            generated
        };
        assert_eq!(stream(42, "gsm8k/17", 3), stream(42, "gsm8k/17", 3));
        assert_ne!(stream(42, "gsm8k/17", 3), stream(42, "gsm8k/17", 4));
        assert_ne!(stream(42, "gsm8k/17", 3), stream(42, "gsm8k/18", 3));
        assert_ne!(stream(42, "gsm8k/17", 3), stream(43, "gsm8k/17", 3));
    }

    #[test]
    fn rng_matches_published_vectors_and_is_pinned() {
        assert_eq!(fnv1a_64(FNV1A_64_OFFSET_BASIS, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_64(FNV1A_64_OFFSET_BASIS, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(
            fnv1a_64(FNV1A_64_OFFSET_BASIS, b"foobar"),
            0x8594_4171_f739_67e8
        );
        let mut splitmix_seed_0 = SampleRng { state: 0 };
        assert_eq!(splitmix_seed_0.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(splitmix_seed_0.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        let mut rng = SampleRng::new(1234, "math/42", 7);
        let first: Vec<u64> = (0..2).map(|_| rng.next_u64()).collect();
        assert_eq!(
            first,
            PINNED_STREAM.to_vec(),
            "seeding changed: datasets would change"
        );
        assert_ne!(SampleRng::new(1, "ab", 0), SampleRng::new(1, "a", 0));
    }

    /// `SampleRng::new(1234, "math/42", 7)`: its first two `next_u64` outputs.
    const PINNED_STREAM: [u64; 2] = [0xe57e_4407_dc05_86eb, 0x57d4_ab09_5ee1_6ec1];

    #[test]
    fn next_f64_is_in_unit_interval_with_mean_half() {
        let mut rng = SampleRng::new(9, "u", 0);
        let draws: Vec<f64> = (0..100_000).map(|_| rng.next_f64()).collect();
        assert!(draws.iter().all(|&u| (0.0..1.0).contains(&u)));
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((mean - 0.5).abs() < 0.005, "mean {mean}");
    }

    #[test]
    fn top_logprobs_are_the_chosen_tokens_logprobs_in_order() {
        let row = [0.5f32, 2.0, -1.0, 2.0, f32::NAN, 1.0];
        let top = top_logprobs(&row, 3);
        // 2.0 twice (lower id first), then 1.0
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 5]);
        for &(token, lp) in &top {
            assert_same_bits(lp, raw_logprob(&row, token), "top vs raw");
        }
        // the greedy draw's logprob is the top entry's, bit for bit
        let params = SamplingParams::default();
        let mut rng = SampleRng::new(0, "p", 0);
        let s = sample(&row, &params, &[], &[], &[], &mut rng, &mut Scratch::new());
        assert_eq!(
            (s.token, s.logprob.to_bits()),
            (top[0].0, top[0].1.to_bits())
        );
        // k past the vocabulary: every token, NaN last as -inf
        let all = top_logprobs(&row, 10);
        assert_eq!(all.len(), row.len());
        assert_eq!(all.last().map(|t| (t.0, t.1)), Some((4, f32::NEG_INFINITY)));
        assert!(top_logprobs(&row, 0).is_empty());
        let probs: f64 = all.iter().map(|t| f64::from(t.1).exp()).sum();
        assert!((probs - 1.0).abs() < 1e-5, "{probs}");
        // +inf is f32::MAX, as everywhere in the sampler
        let inf = [0.0f32, f32::INFINITY, 1.0];
        assert_eq!(top_logprobs(&inf, 1), vec![(1, 0.0)]);
    }

    #[test]
    fn logprob_is_raw_log_softmax_of_chosen_token() {
        let logits = [1.0f32, 2.0, 0.5, -1.0, 3.0];
        let max = 3.0f64;
        let lse = max
            + logits
                .iter()
                .map(|&l| (f64::from(l) - max).exp())
                .sum::<f64>()
                .ln();
        let params = SamplingParams {
            temperature: 0.7,
            top_k: 3,
            repetition_penalty: 1.5,
            presence_penalty: 0.3,
            ..SamplingParams::default()
        };
        let mut rng = SampleRng::new(5, "lp", 0);
        let mut scratch = Scratch::new();
        for _ in 0..200 {
            let s = sample(&logits, &params, &[4], &[1], &[], &mut rng, &mut scratch);
            let want = (f64::from(logits[s.token as usize]) - lse) as f32;
            assert!((s.logprob - want).abs() < 1e-6, "{} vs {want}", s.logprob);
        }
    }

    #[test]
    fn degenerate_logits_do_not_panic() {
        let nan = f32::NAN;
        let (ninf, inf) = (f32::NEG_INFINITY, f32::INFINITY);
        for params in [SamplingParams::default(), random_params(1.0)] {
            let mut rng = SampleRng::new(0, "d", 0);
            let s = sample_plain(&[nan, 1.0, nan], &params, &mut rng);
            assert_eq!(s.token, 1);
            assert!((s.logprob - 0.0).abs() < 1e-6);
            let s = sample_plain(&[ninf, ninf, ninf], &params, &mut rng);
            assert_eq!((s.token, s.logprob), (0, ninf));
            assert_eq!(sample_plain(&[nan, nan], &params, &mut rng).token, 0);
            assert_eq!(sample_plain(&[], &params, &mut rng).token, 0);
            let s = sample_plain(&[1.0, inf, 2.0, inf], &params, &mut rng);
            assert!(s.token == 1 || s.token == 3, "{s:?}");
            assert!((s.logprob - (0.5f32).ln()).abs() < 1e-6);
        }
    }

    #[test]
    fn fully_masked_row_falls_back_to_raw_argmax() {
        let params = SamplingParams {
            min_new_tokens: 1,
            temperature: 0.8,
            ..SamplingParams::default()
        };
        let logits = [f32::NEG_INFINITY, 2.0, f32::NEG_INFINITY];
        let mut rng = SampleRng::new(0, "f", 0);
        let mut scratch = Scratch::new();
        let s = sample(&logits, &params, &[], &[], &[1], &mut rng, &mut scratch);
        assert_eq!((s.token, s.logprob), (1, 0.0));
    }

    #[test]
    fn invalid_params_and_odd_ids_do_not_panic() {
        let logits = [0.3f32, -0.2, 1.5, 0.0];
        let odd = [
            SamplingParams {
                temperature: f32::NAN,
                ..SamplingParams::default()
            },
            SamplingParams {
                temperature: -1.0,
                ..SamplingParams::default()
            },
            SamplingParams {
                top_p: 0.0,
                ..random_params(1.0)
            },
            SamplingParams {
                top_p: f32::NAN,
                min_p: f32::NAN,
                ..random_params(1.0)
            },
            SamplingParams {
                min_p: 3.0,
                top_k: 100,
                ..random_params(1.0)
            },
            SamplingParams {
                temperature: 1e-30,
                ..random_params(1.0)
            },
            SamplingParams {
                repetition_penalty: 0.0,
                ..random_params(1.0)
            },
            SamplingParams {
                repetition_penalty: f32::NAN,
                frequency_penalty: f32::INFINITY,
                ..random_params(1.0)
            },
            SamplingParams {
                min_new_tokens: 9,
                stop_token_ids: vec![u32::MAX],
                ..random_params(1.0)
            },
        ];
        let mut rng = SampleRng::new(0, "odd", 0);
        let mut scratch = Scratch::new();
        for params in &odd {
            let gen = [2, u32::MAX, 1];
            let s = sample(
                &logits,
                params,
                &[u32::MAX, 0],
                &gen,
                &[u32::MAX],
                &mut rng,
                &mut scratch,
            );
            assert!((s.token as usize) < logits.len(), "{params:?} -> {s:?}");
        }
        let bigger: Vec<f32> = (0..100).map(|i| i as f32 / 100.0).collect();
        let params = SamplingParams {
            repetition_penalty: 1.2,
            presence_penalty: 1.0,
            ..random_params(1.0)
        };
        let _ = sample(
            &bigger,
            &params,
            &[99, 50],
            &[98],
            &[],
            &mut rng,
            &mut scratch,
        );
        let s = sample(
            &logits,
            &params,
            &[99, 3],
            &[98, 3],
            &[],
            &mut rng,
            &mut scratch,
        );
        assert!((s.token as usize) < logits.len());
        assert!(
            scratch.seen.iter().all(|&f| !f) && scratch.generated_counts.iter().all(|&c| c == 0)
        );
    }

    #[test]
    fn stop_string_hit_finds_earliest_start() {
        let stops = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(stop_string_hit("no stop here", &stops(&["</s>"])), None);
        assert_eq!(stop_string_hit("x = 4</s>tail", &stops(&["</s>"])), Some(5));
        assert_eq!(
            stop_string_hit("ab END cd STOP", &stops(&["STOP", "END"])),
            Some(3)
        );
        assert_eq!(stop_string_hit("abcd", &stops(&["cd", "bcd"])), Some(1));
        assert_eq!(stop_string_hit("é→∑ stop", &stops(&["stop"])), Some(9));
        assert_eq!(stop_string_hit("aaa", &stops(&["", "aa"])), Some(0));
        assert_eq!(stop_string_hit("abc", &stops(&[""])), None);
        assert_eq!(stop_string_hit("", &stops(&["x"])), None);
        assert_eq!(
            stop_string_hit("Question:", &stops(&["Question:"])),
            Some(0)
        );
    }

    #[test]
    fn validate_names_the_field() {
        assert_eq!(SamplingParams::default().validate(), Ok(()));
        let cases: Vec<(SamplingParams, &str)> = vec![
            (
                SamplingParams {
                    temperature: -0.1,
                    ..Default::default()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    temperature: f32::NAN,
                    ..Default::default()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    top_p: 0.0,
                    ..Default::default()
                },
                "top_p",
            ),
            (
                SamplingParams {
                    top_p: 1.5,
                    ..Default::default()
                },
                "top_p",
            ),
            (
                SamplingParams {
                    min_p: -0.1,
                    ..Default::default()
                },
                "min_p",
            ),
            (
                SamplingParams {
                    min_p: 1.1,
                    ..Default::default()
                },
                "min_p",
            ),
            (
                SamplingParams {
                    repetition_penalty: 0.0,
                    ..Default::default()
                },
                "repetition_penalty",
            ),
            (
                SamplingParams {
                    repetition_penalty: -1.0,
                    ..Default::default()
                },
                "repetition_penalty",
            ),
            (
                SamplingParams {
                    presence_penalty: f32::NAN,
                    ..Default::default()
                },
                "presence_penalty",
            ),
            (
                SamplingParams {
                    frequency_penalty: f32::INFINITY,
                    ..Default::default()
                },
                "frequency_penalty",
            ),
            (
                SamplingParams {
                    max_new_tokens: 0,
                    ..Default::default()
                },
                "max_new_tokens",
            ),
            (
                SamplingParams {
                    min_new_tokens: 10,
                    max_new_tokens: 5,
                    ..Default::default()
                },
                "min_new_tokens",
            ),
            (
                SamplingParams {
                    stop_strings: vec![String::new()],
                    ..Default::default()
                },
                "stop_strings",
            ),
        ];
        for (params, field) in cases {
            let message = params.validate().expect_err(field);
            assert!(message.starts_with(field), "{field}: {message}");
        }
        let ok = SamplingParams {
            temperature: 0.7,
            top_p: 0.95,
            top_k: 20,
            min_p: 0.05,
            ..Default::default()
        };
        assert_eq!(ok.validate(), Ok(()));
    }
}
