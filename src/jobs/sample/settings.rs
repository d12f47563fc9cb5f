//! The settings of a sampling run: the `[sample]` section of a pipeline config and the flags of
//! `pipeline sample` (one struct for both: same names, same defaults), their range checks, the
//! names of the engines, and [`SampleOverrides`], the partial form `[eval]` and `pipeline eval`
//! set over an eval set's own settings.
//!
//! The sampling parameters themselves are [`SamplingParams`], flattened in: this file adds what
//! a run needs around them (the model, the prompt, the batch, the device, the engine).
//!
//! Knows nothing of models, prompts or files: [`super::run`] turns settings into a job.

use serde::{Deserialize, Serialize};

use crate::device::DeviceSpec;
use crate::sampler::params::SamplingParams;

/// The sampler's weights: `auto` (f32 on the CPU, bf16 on a GPU), `f32` or `bf16`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SampleDtype {
    Auto,
    F32,
    Bf16,
}

impl SampleDtype {
    /// The dtype on `device`; the CPU sampler runs f32 only.
    pub fn resolve(self, device: DeviceSpec) -> std::result::Result<candle_core::DType, String> {
        use candle_core::DType;
        match (self, device.is_cpu()) {
            (SampleDtype::Auto | SampleDtype::F32, true) | (SampleDtype::F32, false) => {
                Ok(DType::F32)
            }
            (SampleDtype::Bf16, true) => {
                Err("dtype bf16 needs a cuda device (the CPU sampler runs f32)".into())
            }
            (SampleDtype::Auto | SampleDtype::Bf16, false) => Ok(DType::BF16),
        }
    }
}

/// The KV cache's dtype: `auto` (the weights') or `fp8` (e4m3: half the bytes of bf16; CUDA with
/// bf16 weights).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum KvCacheDtype {
    Auto,
    Fp8,
}

/// Which engine computes the logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogitsEngine {
    /// Ours.
    #[default]
    Selfdistill,
    /// mistral.rs (a binary built with `--features mistralrs`).
    Mistralrs,
}

impl LogitsEngine {
    /// The name as configs spell it (and the sampling hash reads it).
    pub fn as_str(self) -> &'static str {
        match self {
            LogitsEngine::Selfdistill => ENGINE_OURS,
            LogitsEngine::Mistralrs => ENGINE_MISTRALRS,
        }
    }
}

fn d_chat() -> String {
    "chat".into()
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
fn d_close() -> String {
    "\n</think>\n\n".into()
}

/// Everything a sampling run is configured with: the `[sample]` section of a pipeline config
/// and the flags of `pipeline sample` (same names, same defaults).
///
/// The serialised field order is what stage keys hash: the sampling parameters sit between
/// `enable_thinking` and `max_num_seqs`, where their keys always were.
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
    #[serde(default)]
    #[arg(long)]
    pub system: Option<String>,
    /// Passed to the chat template as `enable_thinking` (Qwen3); unset leaves it undefined.
    #[serde(default)]
    #[arg(long)]
    pub enable_thinking: Option<bool>,
    #[serde(flatten)]
    #[command(flatten)]
    pub params: SamplingParams,
    /// Most sequences decoding at once.
    #[serde(default = "d_seqs")]
    #[arg(long, default_value_t = d_seqs())]
    pub max_num_seqs: usize,
    /// Token budget of one step (prefill chunks and decode tokens together).
    #[serde(default = "d_budget")]
    #[arg(long, default_value_t = d_budget())]
    pub max_num_batched_tokens: usize,
    /// KV cache size ("4 GiB"); default: what the run needs, at most a quarter of free memory.
    #[serde(default)]
    #[arg(long)]
    pub kv_cache: Option<crate::bytes::ByteSize>,
    #[serde(default = "d_block")]
    #[arg(long, default_value_t = d_block())]
    pub block_size: usize,
    /// `cpu`, or `cuda` / `cuda:N` (a binary built with `--features cuda`).
    #[serde(default)]
    #[arg(long, default_value = "cpu")]
    pub device: DeviceSpec,
    /// Weights' dtype: `auto` (f32 on the CPU, bf16 on a GPU), `f32` or `bf16`.
    #[serde(default = "d_auto")]
    #[arg(long, value_enum, default_value = "auto")]
    pub dtype: SampleDtype,
    /// `auto` (the weights' dtype) or `fp8` (e4m3 keys and values: half the bytes of bf16;
    /// CUDA with bf16 weights).
    #[serde(default = "d_kv_auto")]
    #[arg(long, value_enum, default_value = "auto")]
    pub kv_cache_dtype: KvCacheDtype,
    /// Run every GPU decode step eagerly instead of replaying CUDA graphs (vLLM's
    /// `enforce_eager`): for debugging and comparisons; the samples are the same. A cuda
    /// device's setting.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[arg(long)]
    pub enforce_eager: bool,
    /// Stop sampling a problem once this many of its samples are correct (needs gold answers).
    #[serde(default)]
    #[arg(long)]
    pub target_correct: Option<u32>,
    /// Thinking budget: after this many generated tokens without `</think>`, append
    /// thinking_close_text and let the model answer within the rest of max_new_tokens.
    #[serde(default)]
    #[arg(long)]
    pub max_thinking_tokens: Option<usize>,
    #[serde(default = "d_close")]
    #[arg(long, default_value_t = d_close())]
    pub thinking_close_text: String,
    /// Which engine computes the logits: `selfdistill` (ours) or `mistralrs` (mistral.rs, in a
    /// binary built with `--features mistralrs`). Prompts, the draw of every token (our sampler,
    /// seeded per sample), stop rules, grading and the Parquet are the same with both.
    #[serde(default, skip_serializing_if = "is_default_engine")]
    #[arg(long, value_enum, default_value = ENGINE_OURS)]
    pub engine: LogitsEngine,
}

/// The default sampling engine: ours.
pub const ENGINE_OURS: &str = "selfdistill";
/// mistral.rs (the `mistralrs` feature).
pub const ENGINE_MISTRALRS: &str = "mistralrs";

fn d_auto() -> SampleDtype {
    SampleDtype::Auto
}
fn d_kv_auto() -> KvCacheDtype {
    KvCacheDtype::Auto
}
fn is_default_engine(e: &LogitsEngine) -> bool {
    *e == LogitsEngine::Selfdistill
}

impl Default for SampleSettings {
    /// Every key at its default (`model` empty).
    fn default() -> Self {
        toml::from_str("").expect("every [sample] key has a default")
    }
}

impl SampleSettings {
    /// The keys of a `[sample]` section (and the ids of the flags of `pipeline sample`), in
    /// order.
    pub fn keys() -> Vec<String> {
        use clap::Args;
        SampleSettings::augment_args(clap::Command::new("keys"))
            .get_arguments()
            .map(|a| a.get_id().to_string())
            .collect()
    }

    /// The settings a `[sample]`-shaped table gives. The error names the key: an unknown one
    /// with the closest valid key and the list, a bad value with serde's reason.
    pub fn from_table(t: &toml::Table) -> Result<SampleSettings, KeyError> {
        let keys = SampleSettings::keys();
        for k in t.keys() {
            if !keys.contains(k) {
                return Err(KeyError::Unknown {
                    key: k.clone(),
                    valid: keys,
                });
            }
        }
        toml::Value::Table(t.clone()).try_into().map_err(|e| {
            // serde does not say which key of a flattened struct failed: try them one by one
            let key = t
                .iter()
                .find(|(k, v)| {
                    let one = toml::Table::from_iter([((*k).clone(), (*v).clone())]);
                    toml::Value::Table(one)
                        .try_into::<SampleSettings>()
                        .is_err()
                })
                .map(|(k, _)| k.clone());
            KeyError::Value {
                key,
                message: e.message().trim().to_string(),
            }
        })
    }

    /// Range checks; the message starts with the offending field's name.
    pub fn validate(&self) -> std::result::Result<(), String> {
        self.params.validate()?;
        for (name, v) in [
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("block_size", self.block_size),
        ] {
            if v == 0 {
                return Err(format!("{name} must be at least 1"));
            }
        }
        let gpu = self.device.is_cuda();
        self.dtype.resolve(self.device)?;
        if self.kv_cache_dtype == KvCacheDtype::Fp8 && (!gpu || self.dtype == SampleDtype::F32) {
            return Err("kv_cache_dtype fp8 needs a cuda device and bf16 weights".into());
        }
        if self.target_correct == Some(0) {
            return Err("target_correct must be at least 1".into());
        }
        if self.enforce_eager && !gpu {
            return Err("enforce_eager needs a cuda device (CUDA graphs are a GPU's)".into());
        }
        if self.enforce_eager && self.engine == LogitsEngine::Mistralrs {
            return Err(format!(
                "enforce_eager: our engine's CUDA graphs; `{ENGINE_MISTRALRS}` runs its own way"
            ));
        }
        match self.engine {
            LogitsEngine::Selfdistill => Ok(()),
            LogitsEngine::Mistralrs => self.validate_mistralrs(gpu),
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
        if self.params.ignore_eos {
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

/// What is wrong with a key of a `[sample]`-shaped table.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyError {
    /// A key the table may not have, with the keys it may.
    Unknown { key: String, valid: Vec<String> },
    /// A bad value (of `key`, where it is known).
    Value {
        key: Option<String>,
        message: String,
    },
}

impl KeyError {
    /// The key the error is about, where it is known.
    pub fn key(&self) -> Option<&str> {
        match self {
            KeyError::Unknown { key, .. } => Some(key),
            KeyError::Value { key, .. } => key.as_deref(),
        }
    }

    /// The message without the key's name ("did you mean" and the valid keys for an unknown
    /// one).
    pub fn reason(&self) -> String {
        self.reason_in(None)
    }

    /// [`Self::reason`], an unknown key said to be `in [section]`.
    pub fn reason_in(&self, section: Option<&str>) -> String {
        match self {
            KeyError::Unknown { key, valid } => format!(
                "unknown key `{key}`{}{} (valid: {})",
                section.map(|s| format!(" in [{s}]")).unwrap_or_default(),
                crate::names::closest(key, valid)
                    .map(|c| format!("; did you mean `{c}`?"))
                    .unwrap_or_default(),
                valid.join(", ")
            ),
            KeyError::Value { message, .. } => message.clone(),
        }
    }
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyError::Value {
                key: Some(k),
                message,
            } => write!(f, "`{k}`: {message}"),
            _ => f.write_str(&self.reason()),
        }
    }
}

impl std::error::Error for KeyError {}

/// Some keys of [`SampleSettings`] (any but `model`) with their values: the partial form that
/// `[eval]` and the flags of `pipeline eval` set over every eval set's own settings, applied by
/// [`Self::apply`]. Built only through [`Self::new`], which checks every key and value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SampleOverrides(toml::Table);

impl SampleOverrides {
    /// Checks `t`'s keys and values against [`SampleSettings`].
    pub fn new(t: toml::Table) -> Result<SampleOverrides, KeyError> {
        if t.contains_key("model") {
            return Err(KeyError::Value {
                key: Some("model".into()),
                message: "is not an override: the models are the eval's own".into(),
            });
        }
        SampleSettings::from_table(&t)?;
        Ok(SampleOverrides(t))
    }

    /// `s` with every overridden key set.
    pub fn apply(&self, s: &SampleSettings) -> Result<SampleSettings, KeyError> {
        let mut t = toml::Table::try_from(s).map_err(|e| KeyError::Value {
            key: None,
            message: e.to_string(),
        })?;
        t.extend(self.0.clone());
        SampleSettings::from_table(&t)
    }

    pub fn get(&self, key: &str) -> Option<&toml::Value> {
        self.0.get(key)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The overrides, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &toml::Value)> {
        self.0.iter()
    }

    /// A value as its field's type serialises it (a float key through f32, as the field is),
    /// so that `temperature = 1` and `temperature = 1.0` hash alike.
    pub fn typed_json(key: &str, value: &toml::Value) -> serde_json::Value {
        let takes_float = || {
            let one = toml::Table::from_iter([(key.to_string(), toml::Value::Float(0.5))]);
            toml::Value::Table(one).try_into::<SampleSettings>().is_ok()
        };
        match value {
            toml::Value::Float(f) => serde_json::json!(*f as f32),
            toml::Value::Integer(i) if takes_float() => serde_json::json!(*i as f32),
            v => serde_json::to_value(v).unwrap_or(serde_json::Value::Null),
        }
    }
}
