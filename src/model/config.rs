//! A model's `config.json` as Hugging Face writes it, turned into a validated [`ModelConfig`].
//!
//! Both layouts are read: `rope_theta`/`rope_scaling` at the top level (classic) and
//! `rope_parameters` (transformers 5), `torch_dtype` or `dtype`. Families: Qwen3 (q/k RMS norms)
//! and Llama (3.x, with `llama3` rope scaling). Anything we do not implement (sliding windows,
//! other rope scalings, other activations, unknown `model_type`) is rejected here, once, with the
//! reason. Knows nothing of weights or devices.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::Value;

/// The model families we implement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Qwen3,
    Llama,
}

/// Llama 3.1-style frequency scaling of RoPE.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub family: Family,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<Llama3Scaling>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    /// The checkpoint's dtype name (`bfloat16`, `float16`, `float32`).
    pub dtype: String,
}

/// The fields of `config.json` we read; everything else in it is ignored.
#[derive(Debug, Deserialize)]
struct RawHfConfig {
    model_type: Option<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    max_position_embeddings: usize,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    hidden_act: Option<String>,
    use_sliding_window: Option<bool>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
}

impl ModelConfig {
    pub fn load(path: &Path) -> Result<ModelConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        ModelConfig::parse(&text).with_context(|| format!("{}", path.display()))
    }

    pub fn parse(text: &str) -> Result<ModelConfig> {
        let raw: RawHfConfig = serde_json::from_str(text).context("not a model config")?;
        let family = match raw.model_type.as_deref() {
            Some("qwen3") => Family::Qwen3,
            Some("llama") => Family::Llama,
            Some(other) => bail!("model_type `{other}` is not supported (supported: qwen3, llama)"),
            None => bail!("no `model_type`"),
        };
        if let Some(act) = raw.hidden_act.as_deref().filter(|a| *a != "silu") {
            bail!("hidden_act `{act}` is not supported (only silu)");
        }
        if raw.use_sliding_window == Some(true) {
            bail!("sliding-window attention (use_sliding_window = true) is not supported");
        }
        let num_kv_heads = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        if num_kv_heads == 0 || !raw.num_attention_heads.is_multiple_of(num_kv_heads) {
            bail!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {num_kv_heads}",
                raw.num_attention_heads
            );
        }
        let head_dim = raw
            .head_dim
            .unwrap_or(raw.hidden_size / raw.num_attention_heads.max(1));
        if !head_dim.is_multiple_of(2) {
            bail!("head_dim {head_dim} is odd; RoPE needs an even head_dim");
        }
        let (rope_theta, rope_scaling) = rope(&raw)?;
        Ok(ModelConfig {
            family,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_layers: raw.num_hidden_layers,
            num_heads: raw.num_attention_heads,
            num_kv_heads,
            head_dim,
            vocab_size: raw.vocab_size,
            rms_norm_eps: raw.rms_norm_eps,
            rope_theta,
            rope_scaling,
            max_position_embeddings: raw.max_position_embeddings,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            attention_bias: raw.attention_bias.unwrap_or(false),
            dtype: raw
                .dtype
                .or(raw.torch_dtype)
                .unwrap_or_else(|| "float32".into()),
        })
    }

    /// Parameters, counting a tied embedding once.
    pub fn num_params(&self) -> usize {
        let (h, i, d) = (self.hidden_size, self.intermediate_size, self.head_dim);
        let attn = h * d * (self.num_heads * 2 + self.num_kv_heads * 2)
            + if self.attention_bias {
                (self.num_heads + 2 * self.num_kv_heads) * d
            } else {
                0
            };
        let mlp = 3 * h * i;
        let norms = 2 * h
            + if self.family == Family::Qwen3 {
                2 * d
            } else {
                0
            };
        let embed = self.vocab_size * h * if self.tie_word_embeddings { 1 } else { 2 };
        self.num_layers * (attn + mlp + norms) + embed + h
    }
}

/// `rope_theta` and the scaling from either layout.
fn rope(raw: &RawHfConfig) -> Result<(f64, Option<Llama3Scaling>)> {
    let params = raw.rope_parameters.as_ref();
    let theta = raw
        .rope_theta
        .or_else(|| {
            params
                .and_then(|p| p.get("rope_theta"))
                .and_then(Value::as_f64)
        })
        .unwrap_or(10_000.0);
    let scaling = params
        .or(raw.rope_scaling.as_ref())
        .filter(|v| !v.is_null());
    let Some(s) = scaling else {
        return Ok((theta, None));
    };
    let kind = s
        .get("rope_type")
        .or_else(|| s.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    match kind {
        "default" => Ok((theta, None)),
        "llama3" => {
            let f = |k: &str| {
                s.get(k)
                    .and_then(Value::as_f64)
                    .with_context(|| format!("rope scaling `llama3` needs `{k}`"))
            };
            Ok((
                theta,
                Some(Llama3Scaling {
                    factor: f("factor")?,
                    low_freq_factor: f("low_freq_factor")?,
                    high_freq_factor: f("high_freq_factor")?,
                    original_max_position_embeddings: f("original_max_position_embeddings")?,
                }),
            ))
        }
        other => bail!("rope scaling `{other}` is not supported (supported: default, llama3)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN3: &str = r#"{"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 176,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": 485, "rms_norm_eps": 1e-6, "max_position_embeddings": 1024,
        "tie_word_embeddings": true, "rope_theta": 1000000.0, "torch_dtype": "float32",
        "hidden_act": "silu", "use_sliding_window": false, "sliding_window": null}"#;

    #[test]
    fn classic_and_new_layouts_agree() {
        let a = ModelConfig::parse(QWEN3).unwrap();
        let new = QWEN3
            .replace(
                "\"rope_theta\": 1000000.0,",
                "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0},",
            )
            .replace("torch_dtype", "dtype");
        let b = ModelConfig::parse(&new).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.rope_theta, 1e6);
        assert_eq!((a.num_heads, a.num_kv_heads, a.head_dim), (4, 2, 16));
    }

    #[test]
    fn llama3_scaling_and_unsupported_configs() {
        let llama = QWEN3.replace("qwen3", "llama").replace(
            "\"rope_theta\": 1000000.0,",
            "\"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \
             \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192},",
        );
        let c = ModelConfig::parse(&llama).unwrap();
        assert_eq!(c.family, Family::Llama);
        assert_eq!(c.rope_scaling.unwrap().factor, 8.0);
        let yarn = llama.replace("\"llama3\"", "\"yarn\"");
        assert!(ModelConfig::parse(&yarn)
            .unwrap_err()
            .to_string()
            .contains("`yarn` is not supported"));
        let mistral = QWEN3.replace("qwen3", "mistral");
        assert!(ModelConfig::parse(&mistral)
            .unwrap_err()
            .to_string()
            .contains("`mistral` is not supported"));
        let sliding = QWEN3.replace(
            "\"use_sliding_window\": false",
            "\"use_sliding_window\": true",
        );
        assert!(ModelConfig::parse(&sliding)
            .unwrap_err()
            .to_string()
            .contains("sliding-window"));
    }
}
