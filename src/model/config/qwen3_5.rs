//! Qwen3.5's `config.json` (`qwen3_5`, the multimodal layout whose `text_config` we read, or
//! `qwen3_5_text`): Gated DeltaNet layers beside gated attention, zero-centred norms, partial
//! RoPE. Knows nothing of weights.

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::Value;

use super::*;

/// The text fields of a Qwen3.5 config (`text_config`, or the top level of `qwen3_5_text`).
#[derive(Debug, Deserialize)]
struct RawQwen35Text {
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    rms_norm_eps: f64,
    max_position_embeddings: usize,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    hidden_act: Option<String>,
    layer_types: Option<Vec<String>>,
    full_attention_interval: Option<usize>,
    linear_conv_kernel_dim: usize,
    linear_key_head_dim: usize,
    linear_value_head_dim: usize,
    linear_num_key_heads: usize,
    linear_num_value_heads: usize,
    rope_parameters: Option<Value>,
    rope_theta: Option<f64>,
    partial_rotary_factor: Option<f64>,
    attn_output_gate: Option<bool>,
    num_experts: Option<usize>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
}

/// Qwen3.5: `qwen3_5` (the multimodal layout: the text model's config in `text_config`, its
/// weights under `model.language_model`; the vision tower is left on disk) or `qwen3_5_text`
/// (`Qwen3_5ForCausalLM`: flat, weights under `model`). Layers are Gated DeltaNet except every
/// `full_attention_interval`-th (or as `layer_types` lists them), which is gated attention.
///
/// Over 100 lines: a field of `ModelConfig` after another from the family's config.json, with the
/// check of each; split, the one mapping would be spread over several functions.
pub(super) fn read_qwen3_5(v: &Value) -> Result<ModelConfig> {
    let (text, multimodal) = text_part(v, "qwen3_5")?;
    let raw: RawQwen35Text =
        serde_json::from_value(text.clone()).context("text_config of a qwen3_5 model")?;
    if raw.num_experts.is_some_and(|n| n > 0) {
        bail!(
            "Qwen3.5 mixture-of-experts (num_experts = {:?}) is not supported",
            raw.num_experts
        );
    }
    if let Some(act) = raw.hidden_act.as_deref().filter(|a| *a != "silu") {
        bail!("hidden_act `{act}` is not supported (only silu)");
    }
    if raw.attn_output_gate == Some(false) {
        bail!("attn_output_gate = false is not supported (Qwen3.5's attention is gated)");
    }
    let n = raw.num_hidden_layers;
    let layer_kinds = layer_kinds(
        raw.layer_types.as_deref(),
        n,
        &[
            ("full_attention", LayerKind::Attention),
            ("attention", LayerKind::Attention),
            ("linear_attention", LayerKind::GatedDeltaNet),
            ("mamba", LayerKind::GatedDeltaNet),
        ],
        (
            raw.full_attention_interval.unwrap_or(4),
            LayerKind::GatedDeltaNet,
        ),
    )?;
    let (num_kv_heads, head_dim) = attention_heads(
        raw.hidden_size,
        raw.num_attention_heads,
        raw.num_key_value_heads,
        raw.head_dim,
    )?;
    let params = raw.rope_parameters.as_ref();
    let param = |k: &str| params.and_then(|p| p.get(k)).and_then(Value::as_f64);
    if let Some(kind) = params
        .and_then(|p| p.get("rope_type"))
        .and_then(Value::as_str)
        .filter(|k| *k != "default")
    {
        bail!("rope_type `{kind}` is not supported for Qwen3.5 (only default)");
    }
    let theta = param("rope_theta").or(raw.rope_theta).unwrap_or(10_000.0);
    let factor = param("partial_rotary_factor")
        .or(raw.partial_rotary_factor)
        .unwrap_or(0.25);
    let rotary_dim = (head_dim as f64 * factor) as usize;
    if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) || rotary_dim > head_dim {
        bail!(
            "partial_rotary_factor {factor} of head_dim {head_dim} gives {rotary_dim} rotated \
             dims; RoPE needs an even number up to head_dim"
        );
    }
    let linear = LinearAttention {
        num_key_heads: raw.linear_num_key_heads,
        num_value_heads: raw.linear_num_value_heads,
        key_head_dim: raw.linear_key_head_dim,
        value_head_dim: raw.linear_value_head_dim,
        conv_kernel: raw.linear_conv_kernel_dim,
    };
    if linear.num_key_heads == 0 || !linear.num_value_heads.is_multiple_of(linear.num_key_heads) {
        bail!(
            "linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
            linear.num_value_heads,
            linear.num_key_heads
        );
    }
    if linear.conv_kernel < 2 {
        bail!(
            "linear_conv_kernel_dim {} must be at least 2",
            linear.conv_kernel
        );
    }
    let (tie, dtype) = tie_and_dtype(
        v,
        multimodal,
        raw.tie_word_embeddings,
        false,
        raw.dtype,
        raw.torch_dtype,
    );
    Ok(ModelConfig {
        family: Family::Qwen3_5,
        hidden_size: raw.hidden_size,
        intermediate_size: raw.intermediate_size,
        layer_kinds,
        num_heads: raw.num_attention_heads,
        num_kv_heads,
        head_dim,
        qk_norm: true,
        attention_gate: true,
        rotary_dim,
        norm_offset: true,
        linear: Some(linear),
        weights_prefix: if multimodal {
            "model.language_model".into()
        } else {
            "model".into()
        },
        vocab_size: raw.vocab_size,
        rms_norm_eps: raw.rms_norm_eps,
        rope_theta: theta,
        rope_scaling: None,
        sliding_window: None,
        sliding_rope: None,
        query_pre_attn_scalar: None,
        embed_scale: false,
        sandwich_norms: false,
        activation: Activation::Silu,
        max_position_embeddings: raw.max_position_embeddings,
        tie_word_embeddings: tie,
        attention_bias: raw.attention_bias.unwrap_or(false),
        dtype,
    })
}
