//! Gemma 3's `config.json` (`gemma3_text`, or the multimodal `gemma3` whose `text_config` we
//! read, with `Gemma3TextConfig`'s defaults for what it leaves out): sliding-window layers beside
//! full ones, sandwich norms, gelu-tanh, scaled embeddings, RoPE by layer type. Knows nothing of
//! weights.

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::Value;

use super::*;

/// The text fields of a Gemma 3 config (`text_config` of `gemma3`, or the top level of
/// `gemma3_text`). A missing field takes `Gemma3TextConfig`'s default, as transformers reads it:
/// gemma-3-4b-it's `text_config` lists only what differs from them.
#[derive(Debug, Deserialize)]
struct RawGemma3Text {
    #[serde(default = "defaults::hidden_size")]
    hidden_size: usize,
    #[serde(default = "defaults::intermediate_size")]
    intermediate_size: usize,
    #[serde(default = "defaults::num_hidden_layers")]
    num_hidden_layers: usize,
    #[serde(default = "defaults::num_attention_heads")]
    num_attention_heads: usize,
    #[serde(default = "defaults::num_key_value_heads")]
    num_key_value_heads: usize,
    #[serde(default = "defaults::head_dim")]
    head_dim: usize,
    #[serde(default = "defaults::vocab_size")]
    vocab_size: usize,
    #[serde(default = "defaults::rms_norm_eps")]
    rms_norm_eps: f64,
    #[serde(default = "defaults::max_position_embeddings")]
    max_position_embeddings: usize,
    #[serde(default = "defaults::query_pre_attn_scalar")]
    query_pre_attn_scalar: f64,
    #[serde(default = "defaults::sliding_window")]
    sliding_window: usize,
    /// Every this many layers one is full attention (the older layout, without `layer_types`).
    #[serde(alias = "_sliding_window_pattern")]
    sliding_window_pattern: Option<usize>,
    layer_types: Option<Vec<String>>,
    hidden_activation: Option<String>,
    hidden_act: Option<String>,
    attention_bias: Option<bool>,
    attn_logit_softcapping: Option<f64>,
    final_logit_softcapping: Option<f64>,
    use_bidirectional_attention: Option<bool>,
    tie_word_embeddings: Option<bool>,
    rope_theta: Option<f64>,
    rope_local_base_freq: Option<f64>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
}

/// `Gemma3TextConfig`'s defaults (transformers).
mod defaults {
    pub fn hidden_size() -> usize {
        2304
    }
    pub fn intermediate_size() -> usize {
        9216
    }
    pub fn num_hidden_layers() -> usize {
        26
    }
    pub fn num_attention_heads() -> usize {
        8
    }
    pub fn num_key_value_heads() -> usize {
        4
    }
    pub fn head_dim() -> usize {
        256
    }
    pub fn vocab_size() -> usize {
        262_208
    }
    pub fn rms_norm_eps() -> f64 {
        1e-6
    }
    pub fn max_position_embeddings() -> usize {
        131_072
    }
    pub fn query_pre_attn_scalar() -> f64 {
        256.0
    }
    pub fn sliding_window() -> usize {
        4096
    }
}

/// Gemma 3: `gemma3_text` (`Gemma3ForCausalLM`, weights under `model`) or `gemma3` (the
/// multimodal layout: the text model's config in `text_config`, its weights under
/// `language_model.model`, the SigLIP tower and projector left on disk and carried through
/// exports). Layers are sliding-window attention except every `sliding_window_pattern`-th (or
/// as `layer_types` lists them); RoPE by layer type (`rope_parameters.full_attention` and
/// `.sliding_attention`, or the older `rope_theta`/`rope_scaling` and `rope_local_base_freq`).
///
/// Over 100 lines: a field of `ModelConfig` after another from the family's config.json, with the
/// check of each; split, the one mapping would be spread over several functions.
pub(super) fn read_gemma3(v: &Value) -> Result<ModelConfig> {
    let (text, multimodal) = text_part(v, "gemma3")?;
    let raw: RawGemma3Text =
        serde_json::from_value(text.clone()).context("text_config of a gemma3 model")?;
    let act = raw
        .hidden_activation
        .as_deref()
        .or(raw.hidden_act.as_deref())
        .unwrap_or("gelu_pytorch_tanh");
    if act != "gelu_pytorch_tanh" && act != "gelu_tanh" {
        bail!("hidden_activation `{act}` is not supported for Gemma 3 (only gelu_pytorch_tanh)");
    }
    for (key, value) in [
        ("attn_logit_softcapping", raw.attn_logit_softcapping),
        ("final_logit_softcapping", raw.final_logit_softcapping),
    ] {
        if let Some(cap) = value {
            bail!("{key} = {cap} is not supported (logit soft-capping: Gemma 2's, not Gemma 3's)");
        }
    }
    if raw.use_bidirectional_attention == Some(true) {
        bail!("use_bidirectional_attention = true is not supported (an encoder, not a decoder)");
    }
    let n = raw.num_hidden_layers;
    let layer_kinds = layer_kinds(
        raw.layer_types.as_deref(),
        n,
        &[
            ("full_attention", LayerKind::Attention),
            ("sliding_attention", LayerKind::SlidingAttention),
        ],
        (
            raw.sliding_window_pattern.unwrap_or(6),
            LayerKind::SlidingAttention,
        ),
    )?;
    if raw.sliding_window == 0 {
        bail!("sliding_window = 0: a sliding layer would see nothing");
    }
    let (num_kv_heads, head_dim) = attention_heads(
        raw.hidden_size,
        raw.num_attention_heads,
        Some(raw.num_key_value_heads),
        Some(raw.head_dim),
    )?;
    // RoPE by layer type: `rope_parameters` keyed by it (transformers 5), or the full layers'
    // `rope_theta`/`rope_scaling` and the sliding layers' `rope_local_base_freq`
    let by_type = raw
        .rope_parameters
        .as_ref()
        .filter(|p| p.get("full_attention").is_some() || p.get("sliding_attention").is_some());
    let (full, sliding) = match by_type {
        Some(p) => (
            rope_params(p.get("full_attention"), 1_000_000.0)
                .context("rope_parameters.full_attention")?,
            rope_params(p.get("sliding_attention"), 10_000.0)
                .context("rope_parameters.sliding_attention")?,
        ),
        None => {
            let full = rope_params(
                raw.rope_parameters.as_ref().or(raw.rope_scaling.as_ref()),
                1e6,
            )
            .context("rope_scaling")?;
            let theta = raw.rope_theta.unwrap_or(full.theta);
            (
                RopeParams { theta, ..full },
                RopeParams {
                    theta: raw.rope_local_base_freq.unwrap_or(10_000.0),
                    scaling: None,
                },
            )
        }
    };
    let (tie, dtype) = tie_and_dtype(
        v,
        multimodal,
        raw.tie_word_embeddings,
        true,
        raw.dtype,
        raw.torch_dtype,
    );
    Ok(ModelConfig {
        family: Family::Gemma3,
        hidden_size: raw.hidden_size,
        intermediate_size: raw.intermediate_size,
        layer_kinds,
        num_heads: raw.num_attention_heads,
        num_kv_heads,
        head_dim,
        qk_norm: true,
        attention_gate: false,
        rotary_dim: head_dim,
        norm_offset: true,
        linear: None,
        weights_prefix: if multimodal {
            "language_model.model".into()
        } else {
            "model".into()
        },
        vocab_size: raw.vocab_size,
        rms_norm_eps: raw.rms_norm_eps,
        rope_theta: full.theta,
        rope_scaling: full.scaling,
        sliding_window: Some(raw.sliding_window),
        sliding_rope: Some(sliding),
        query_pre_attn_scalar: Some(raw.query_pre_attn_scalar),
        embed_scale: true,
        sandwich_norms: true,
        activation: Activation::GeluTanh,
        max_position_embeddings: raw.max_position_embeddings,
        tie_word_embeddings: tie,
        attention_bias: raw.attention_bias.unwrap_or(false),
        dtype,
    })
}
