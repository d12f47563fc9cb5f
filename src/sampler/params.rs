//! The sampling parameters, defined once (vLLM/OpenAI semantics): [`SamplingParams`] is what the
//! engine draws with, and the same struct, flattened, is the sampling part of a config's
//! `[sample]` section and of the flags of `pipeline sample` and `pipeline eval` (same names,
//! same defaults, same range checks). [`SamplingParams::hash_text`] is the stable form the
//! sampling hash is taken over.
//!
//! Adding a parameter: a field here, with its doc, default (in `Default`), flag and range check,
//! serialised only when it differs from its default (`skip_serializing_if`), so that stage keys
//! and sampling hashes of runs that do not set it stay what they were; then the code that uses
//! it. Nothing else names the parameters one by one.
//!
//! Knows nothing of models, prompts or jobs.

use serde::{Deserialize, Serialize};

/// Temperatures below this are greedy (vLLM's `_SAMPLING_EPS`); dividing by them overflows f32.
pub const GREEDY_TEMPERATURE_EPS: f32 = 1e-5;

/// The most alternatives `logprobs` may ask for per token (vLLM's default `max_logprobs`).
pub const MAX_LOGPROBS: usize = 20;

/// How the samples of one prompt are drawn and when they stop. `Default` is one greedy sample
/// of at most 1,024 tokens.
///
/// The field order is the order of the keys in a serialised `[sample]` section, which stage
/// keys hash: new fields go where they read best, serialised only when set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(default)]
pub struct SamplingParams {
    /// Samples per prompt (at most, with target_correct).
    #[arg(long, default_value_t = SamplingParams::default().n)]
    pub n: u32,
    /// Softmax temperature; 0 (below 1e-5) = greedy argmax.
    #[arg(long, default_value_t = SamplingParams::default().temperature)]
    pub temperature: f32,
    /// Keep the smallest most-likely prefix with probability mass >= top_p; 1 = off.
    #[arg(long, default_value_t = SamplingParams::default().top_p)]
    pub top_p: f32,
    /// Keep only the top_k most likely tokens; 0 = off.
    #[arg(long, default_value_t = SamplingParams::default().top_k)]
    pub top_k: usize,
    /// Drop tokens with probability below min_p x the top probability; 0 = off.
    #[arg(long, default_value_t = SamplingParams::default().min_p)]
    pub min_p: f32,
    /// vLLM's (and HF's) repetition penalty over the prompt's and the generated tokens: a
    /// positive logit is divided by it, a negative one multiplied; 1 = off.
    #[serde(skip_serializing_if = "is_one")]
    #[arg(long, default_value_t = SamplingParams::default().repetition_penalty)]
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token generated so far (vLLM's); 0 = off.
    #[serde(skip_serializing_if = "is_zero")]
    #[arg(long, default_value_t = SamplingParams::default().presence_penalty, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Subtracted from a generated token's logit once per time it was generated (vLLM's);
    /// 0 = off.
    #[serde(skip_serializing_if = "is_zero")]
    #[arg(long, default_value_t = SamplingParams::default().frequency_penalty, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Token ids that end a sample like EOS (kept in the completion, as vLLM does); repeatable
    /// or comma-separated.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[arg(long, value_delimiter = ',')]
    pub stop_token_ids: Vec<u32>,
    /// Write each generated token's log-probability and the `K` most likely tokens at its
    /// position (vLLM's `logprobs = K`: the raw model's, before penalties and temperature) as
    /// the columns `token_logprobs`, `top_logprob_ids`, `top_logprobs`; 0 = the chosen token's
    /// only. Unset: no columns and no cost. Not part of the sampling hash (the tokens do not
    /// change).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub logprobs: Option<usize>,
    /// Most tokens generated per sample.
    #[arg(long, default_value_t = SamplingParams::default().max_new_tokens)]
    pub max_new_tokens: usize,
    /// EOS and stop token ids are masked until this many tokens were generated.
    #[arg(long, default_value_t = SamplingParams::default().min_new_tokens)]
    pub min_new_tokens: usize,
    /// Strings that end a sample (repeatable); the completion is cut where one starts (see
    /// `sampling::stop_string_hit`).
    #[serde(rename = "stop")]
    #[arg(long = "stop", id = "stop")]
    pub stop_strings: Vec<String>,
    /// Keep generating past EOS (EOS is then not masked by `min_new_tokens`).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Samples are seeded by (seed, problem id, sample index).
    #[arg(long, default_value_t = SamplingParams::default().seed)]
    pub seed: u64,
    /// Keep only the last this many tokens of each prompt (vLLM's `truncate_prompt_tokens`:
    /// left truncation, so that long few-shot prompts fit the context); unset: whole prompts.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub truncate_prompt_tokens: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            n: 1,
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            stop_token_ids: Vec::new(),
            logprobs: None,
            max_new_tokens: 1024,
            min_new_tokens: 0,
            stop_strings: Vec::new(),
            ignore_eos: false,
            seed: 0,
            truncate_prompt_tokens: None,
        }
    }
}

fn is_one(v: &f32) -> bool {
    *v == 1.0
}

fn is_zero(v: &f32) -> bool {
    *v == 0.0
}

fn require(ok: bool, message: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(message())
    }
}

impl SamplingParams {
    /// Checks every field's range; the error starts with the offending field's name.
    pub fn validate(&self) -> Result<(), String> {
        require(self.n >= 1, || "n must be at least 1".to_string())?;
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
        self.validate_lengths()?;
        require(self.truncate_prompt_tokens != Some(0), || {
            "truncate_prompt_tokens must be at least 1 (unset: whole prompts)".to_string()
        })?;
        match self.logprobs {
            Some(k) if k > MAX_LOGPROBS => Err(format!(
                "logprobs must be at most {MAX_LOGPROBS} (alternatives per token), got {k}"
            )),
            _ => Ok(()),
        }
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
            "stop must not contain an empty string".to_string()
        })
    }

    /// Whether these settings decode greedily (see [`GREEDY_TEMPERATURE_EPS`]).
    pub fn is_greedy(&self) -> bool {
        self.temperature.is_nan() || self.temperature < GREEDY_TEMPERATURE_EPS
    }

    /// The keys (and flag ids) of the parameters, in order.
    pub fn keys() -> Vec<String> {
        use clap::Args;
        SamplingParams::augment_args(clap::Command::new("keys"))
            .get_arguments()
            .map(|a| a.get_id().to_string())
            .collect()
    }

    /// The stable text the sampling hash is taken over: the parameters the hash was first taken
    /// over, in the form they had then ([`v1`]: every existing hash stands), then `|key=value`
    /// (the value as JSON) for each parameter added since, in field order, where it is set
    /// (serialised: see the module doc). `n` is hashed beside it by the job, and `logprobs` not
    /// at all (it does not change the tokens).
    pub fn hash_text(&self) -> String {
        let mut text = format!("{:?}", v1::SamplingParams::from(self));
        if let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(self) {
            for (key, value) in fields {
                if !v1::KEYS.contains(&key.as_str()) && key != "n" && key != "logprobs" {
                    text.push_str(&format!("|{key}={value}"));
                }
            }
        }
        text
    }
}

/// The sampling parameters as the first sampling hashes saw them: this struct's `Debug` text
/// is that of the `SamplingParams` of then, field for field. Frozen: never add a field.
mod v1 {
    /// The serialised names of the fields below.
    pub const KEYS: [&str; 13] = [
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "max_new_tokens",
        "min_new_tokens",
        "stop_token_ids",
        "stop",
        "ignore_eos",
        "seed",
    ];

    #[derive(Debug)]
    #[allow(dead_code)] // read through `Debug`
    pub struct SamplingParams<'a> {
        temperature: f32,
        top_k: usize,
        top_p: f32,
        min_p: f32,
        repetition_penalty: f32,
        presence_penalty: f32,
        frequency_penalty: f32,
        max_new_tokens: usize,
        min_new_tokens: usize,
        stop_token_ids: &'a [u32],
        stop_strings: &'a [String],
        ignore_eos: bool,
        seed: u64,
    }

    impl<'a> From<&'a super::SamplingParams> for SamplingParams<'a> {
        fn from(p: &'a super::SamplingParams) -> Self {
            SamplingParams {
                temperature: p.temperature,
                top_k: p.top_k,
                top_p: p.top_p,
                min_p: p.min_p,
                repetition_penalty: p.repetition_penalty,
                presence_penalty: p.presence_penalty,
                frequency_penalty: p.frequency_penalty,
                max_new_tokens: p.max_new_tokens,
                min_new_tokens: p.min_new_tokens,
                stop_token_ids: &p.stop_token_ids,
                stop_strings: &p.stop_strings,
                ignore_eos: p.ignore_eos,
                seed: p.seed,
            }
        }
    }
}

#[cfg(test)]
mod tests;
