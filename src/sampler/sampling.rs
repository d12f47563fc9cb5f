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

use std::cmp::Ordering;

use super::params::SamplingParams;

use crate::simd::{max_sum_exp, sanitize};

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

impl CandidateRow {
    /// The best `n` (of a launch that took more for other rows): candidates are ordered, so
    /// these are exactly what a launch of `n` gives.
    pub fn truncate(&mut self, n: usize) {
        self.ids.truncate(n);
        self.values.truncate(n);
        self.raw.truncate(n);
    }
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
mod tests;
