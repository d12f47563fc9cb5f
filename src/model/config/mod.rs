//! A model's `config.json` as Hugging Face writes it, turned into a validated [`ModelConfig`].
//!
//! Both layouts are read: `rope_theta`/`rope_scaling` at the top level (classic) and
//! `rope_parameters` (transformers 5), `torch_dtype` or `dtype`. Families: Qwen3 (q/k RMS norms),
//! Qwen2 (q/k/v biases), Llama (3.x, with `llama3` rope scaling), Qwen3.5 (Gated DeltaNet
//! layers beside gated attention, zero-centred norms, partial RoPE; the multimodal layout's
//! `text_config`, text only) and Gemma 3 (sliding-window layers beside full ones, sandwich norms,
//! gelu-tanh, scaled embeddings, RoPE by layer type; `gemma3_text` or the multimodal `gemma3`).
//! Anything we do not implement (Qwen2's optional sliding windows, other rope scalings, other
//! activations, logit soft-capping, unknown `model_type`) is rejected here, once, with the
//! reason. Knows nothing of weights or devices.
//!
//! A model is a list of layer kinds ([`LayerKind`]); what the sampler keeps for each layer
//! ([`LayerCache`]: keys and values per token, or a fixed state per sequence) and the parameter
//! count follow from the kinds, so that the KV cache, preflight's memory estimate, the trainer's
//! budget and the benchmarks' rooflines ask the config instead of assuming attention everywhere.
//!
//! A new family is a reader in [`FAMILIES`] (its `model_type`, layer kinds and shapes), in a
//! file of its own here when its `config.json` has fields of its own (`qwen3_5.rs`, `gemma3.rs`;
//! the decoder families share [`read_decoder`]), and the layer file of any new kind in
//! `model/layers/`.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::Value;

mod gemma3;
mod qwen3_5;
#[cfg(test)]
mod tests;

use gemma3::read_gemma3;
use qwen3_5::read_qwen3_5;

/// The model families we implement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Qwen3,
    /// Qwen2 and Qwen2.5 (Qwen2.5-Math, DeepSeek-R1-Distill-Qwen): Llama's layers with biases on
    /// the q/k/v projections.
    Qwen2,
    Llama,
    Qwen3_5,
    /// Gemma 3 (gemma-3-1b-it's `gemma3_text`, gemma-3-4b-it's multimodal `gemma3`).
    Gemma3,
}

/// The MLP's activation: `down(act(gate(h)) * up(h))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU (Qwen, Llama).
    Silu,
    /// GeGLU with the tanh approximation of GELU (`gelu_pytorch_tanh`, Gemma).
    GeluTanh,
}

/// What one decoder layer is. Every kind is followed by the SwiGLU MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LayerKind {
    /// Softmax attention over every earlier token, in the shape of the config's attention
    /// fields (`num_heads`, `num_kv_heads`, `head_dim`, `qk_norm`, `attention_bias`,
    /// `attention_gate`, `rotary_dim`).
    Attention,
    /// Attention over the last [`ModelConfig::sliding_window`] tokens only (Gemma 3's
    /// `sliding_attention`), otherwise shaped as [`LayerKind::Attention`], with its own RoPE
    /// ([`ModelConfig::sliding_rope`]).
    SlidingAttention,
    /// Gated DeltaNet linear attention (Qwen3.5's `linear_attention`), in the shape of
    /// [`ModelConfig::linear`]: a fixed state per sequence instead of keys and values.
    GatedDeltaNet,
}

/// The Gated DeltaNet layers' shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearAttention {
    pub num_key_heads: usize,
    pub num_value_heads: usize,
    pub key_head_dim: usize,
    pub value_head_dim: usize,
    /// The causal depthwise convolution's kernel (4).
    pub conv_kernel: usize,
}

impl LinearAttention {
    pub fn key_dim(&self) -> usize {
        self.num_key_heads * self.key_head_dim
    }

    pub fn value_dim(&self) -> usize {
        self.num_value_heads * self.value_head_dim
    }

    /// Channels of the convolution: queries, keys and values.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Values of one sequence's state: the convolution's last `conv_kernel - 1` inputs and the
    /// recurrent state (value heads x key dim x value dim), f32.
    pub fn state_values(&self) -> usize {
        self.conv_dim() * (self.conv_kernel - 1)
            + self.num_value_heads * self.key_head_dim * self.value_head_dim
    }
}

/// What the sampler keeps for one layer between steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerCache {
    /// Each token's keys and values: `2 * kv_heads * head_dim` values per token (paged blocks).
    Kv { kv_heads: usize, head_dim: usize },
    /// A fixed number of values per sequence, whatever its length (a recurrent layer's state).
    State { values: usize },
    /// The keys and values of a sequence's last `window` positions, a ring of `window` rows per
    /// sequence (a sliding-window layer: what falls out of the window is overwritten, so a long
    /// generation holds `window` rows, not its length).
    Window {
        kv_heads: usize,
        head_dim: usize,
        window: usize,
    },
}

impl LayerCache {
    /// The values one sequence keeps whatever its length (a state, or a window's ring).
    pub fn fixed_values(&self) -> usize {
        match *self {
            LayerCache::Kv { .. } => 0,
            LayerCache::State { values } => values,
            LayerCache::Window {
                kv_heads,
                head_dim,
                window,
            } => 2 * window * kv_heads * head_dim,
        }
    }
}

/// A family's reader: `config.json` into a config.
type Reader = fn(&Value) -> Result<ModelConfig>;

/// The families we read, by `model_type`. A new family is a line here.
const FAMILIES: &[(&str, Reader)] = &[
    ("qwen3", read_qwen3),
    ("qwen2", read_qwen2),
    ("llama", read_llama),
    ("qwen3_5", read_qwen3_5),
    ("qwen3_5_text", read_qwen3_5),
    ("gemma3_text", read_gemma3),
    ("gemma3", read_gemma3),
];

/// Llama 3.1-style frequency scaling of RoPE.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: f64,
}

/// How RoPE's frequencies are scaled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    Llama3(Llama3Scaling),
    /// Positions divided by `factor` (every frequency divided by it; gemma-3-4b's full layers).
    Linear(f64),
}

/// One RoPE table's base and scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeParams {
    pub theta: f64,
    pub scaling: Option<RopeScaling>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub family: Family,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    /// One kind per layer.
    pub layer_kinds: Vec<LayerKind>,
    /// The attention layers' shape: query heads, KV heads, head size, Qwen3's per-head q/k
    /// RMS norms.
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub qk_norm: bool,
    /// Qwen3.5's output gate: q_proj gives a query and a gate per head, and the attention's
    /// output is scaled by `sigmoid(gate)` before o_proj.
    pub attention_gate: bool,
    /// The leading dims of each head that RoPE rotates (`head_dim` unless partial).
    pub rotary_dim: usize,
    /// Zero-centred RMS norms (`x̂ * (1 + w)`, Qwen3.5) instead of `x̂ * w`.
    pub norm_offset: bool,
    /// The Gated DeltaNet layers' shape, when the model has any.
    pub linear: Option<LinearAttention>,
    /// Where the text model's weights are: `model` (`model.layers.N...`), or
    /// `model.language_model` in the multimodal layout.
    pub weights_prefix: String,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    /// The window of the [`LayerKind::SlidingAttention`] layers, and their RoPE when it differs
    /// from the other layers' (Gemma 3: theta 1e4 there, 1e6 elsewhere).
    pub sliding_window: Option<usize>,
    pub sliding_rope: Option<RopeParams>,
    /// The softmax scale is `1 / sqrt(this)` (Gemma's `query_pre_attn_scalar`); `None`:
    /// `1 / sqrt(head_dim)`.
    pub query_pre_attn_scalar: Option<f64>,
    /// Embeddings multiplied by `sqrt(hidden_size)`, rounded to the weights' dtype (Gemma).
    pub embed_scale: bool,
    /// Gemma's sandwich norms: the mixer's and the MLP's outputs are RMS-normed before their
    /// residual adds (`post_attention_layernorm`, `post_feedforward_layernorm`; the MLP's input
    /// norm is then `pre_feedforward_layernorm`).
    pub sandwich_norms: bool,
    pub activation: Activation,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    /// The checkpoint's dtype name (`bfloat16`, `float16`, `float32`).
    pub dtype: String,
}

/// The fields of `config.json` we read; everything else in it is ignored.
#[derive(Debug, Deserialize)]
struct RawHfConfig {
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
        let raw: Value = serde_json::from_str(text).context("not a model config")?;
        let Some(model_type) = raw.get("model_type").and_then(Value::as_str) else {
            bail!("no `model_type`")
        };
        match FAMILIES.iter().find(|(name, _)| *name == model_type) {
            Some((_, read)) => read(&raw),
            None => {
                let names: Vec<&str> = FAMILIES.iter().map(|(n, _)| *n).collect();
                bail!(
                    "model_type `{model_type}` is not supported (supported: {})",
                    names.join(", ")
                )
            }
        }
    }

    pub fn num_layers(&self) -> usize {
        self.layer_kinds.len()
    }

    /// Name prefixes of a checkpoint's tensors that the text model does not use and that a
    /// fine-tuned export carries through byte for byte: Qwen3.5's vision tower and its
    /// multi-token-prediction head (neither is loaded).
    pub fn carried_prefixes(&self) -> &'static [&'static str] {
        match self.family {
            Family::Qwen3_5 => &["model.visual.", "mtp."],
            Family::Gemma3 => &["vision_tower.", "multi_modal_projector."],
            Family::Qwen3 | Family::Qwen2 | Family::Llama => &[],
        }
    }

    /// What the sampler keeps for layer `i`.
    pub fn layer_cache(&self, i: usize) -> LayerCache {
        match self.layer_kinds[i] {
            LayerKind::Attention => LayerCache::Kv {
                kv_heads: self.num_kv_heads,
                head_dim: self.head_dim,
            },
            LayerKind::SlidingAttention => LayerCache::Window {
                kv_heads: self.num_kv_heads,
                head_dim: self.head_dim,
                window: self.sliding_window.unwrap_or(0),
            },
            LayerKind::GatedDeltaNet => LayerCache::State {
                values: self.linear.map_or(0, |l| l.state_values()),
            },
        }
    }

    /// The window of layer `i`: `Some` for a sliding-window layer.
    pub fn window(&self, i: usize) -> Option<usize> {
        match self.layer_kinds[i] {
            LayerKind::SlidingAttention => self.sliding_window,
            LayerKind::Attention | LayerKind::GatedDeltaNet => None,
        }
    }

    /// The RoPE of layer `i`'s kind.
    pub fn rope_of(&self, kind: LayerKind) -> RopeParams {
        match (kind, self.sliding_rope) {
            (LayerKind::SlidingAttention, Some(r)) => r,
            _ => RopeParams {
                theta: self.rope_theta,
                scaling: self.rope_scaling,
            },
        }
    }

    /// The layers that keep keys and values, in order.
    pub fn kv_layers(&self) -> Vec<usize> {
        (0..self.num_layers())
            .filter(|&i| matches!(self.layer_cache(i), LayerCache::Kv { .. }))
            .collect()
    }

    /// For each layer, its place among the layers that keep keys and values (a cache holds
    /// those only).
    pub fn kv_slots(&self) -> Vec<Option<usize>> {
        let mut next = 0;
        (0..self.num_layers())
            .map(|i| match self.layer_cache(i) {
                LayerCache::Kv { .. } => {
                    next += 1;
                    Some(next - 1)
                }
                LayerCache::State { .. } | LayerCache::Window { .. } => None,
            })
            .collect()
    }

    /// Keys and values one token adds over all layers (values, not bytes).
    pub fn kv_values_per_token(&self) -> usize {
        (0..self.num_layers())
            .map(|i| match self.layer_cache(i) {
                LayerCache::Kv { kv_heads, head_dim } => 2 * kv_heads * head_dim,
                LayerCache::State { .. } | LayerCache::Window { .. } => 0,
            })
            .sum()
    }

    /// What one sequence keeps over all layers whatever its length (values, not bytes): the
    /// recurrent layers' states and the sliding-window layers' rings.
    pub fn state_values_per_seq(&self) -> usize {
        (0..self.num_layers())
            .map(|i| self.layer_cache(i).fixed_values())
            .sum()
    }

    /// Parameters, counting a tied embedding once.
    pub fn num_params(&self) -> usize {
        let layers: usize = (0..self.num_layers()).map(|i| self.layer_params(i)).sum();
        let h = self.hidden_size;
        let embed = self.vocab_size * h * if self.tie_word_embeddings { 1 } else { 2 };
        layers + embed + h
    }

    /// RMS norms of a decoder layer around its mixer and MLP: two, four with sandwich norms.
    pub fn layer_norms(&self) -> usize {
        if self.sandwich_norms {
            4
        } else {
            2
        }
    }

    /// Parameters of layer `i` (its mixer, MLP and norms).
    pub fn layer_params(&self, i: usize) -> usize {
        let h = self.hidden_size;
        3 * h * self.intermediate_size
            + self.layer_norms() * h
            + self.mixer_params(self.layer_kinds[i])
    }

    /// Parameters of a layer's token mixer (its attention), without the MLP and norms.
    fn mixer_params(&self, kind: LayerKind) -> usize {
        match kind {
            LayerKind::Attention | LayerKind::SlidingAttention => {
                let (h, d) = (self.hidden_size, self.head_dim);
                let (q, kv) = (self.num_heads * d, self.num_kv_heads * d);
                let gate = if self.attention_gate { q } else { 0 };
                let bias = if self.attention_bias {
                    q + gate + 2 * kv
                } else {
                    0
                };
                let norms = if self.qk_norm { 2 * d } else { 0 };
                h * (2 * q + gate + 2 * kv) + bias + norms
            }
            LayerKind::GatedDeltaNet => {
                let Some(l) = self.linear else { return 0 };
                let (h, nv) = (self.hidden_size, l.num_value_heads);
                let proj = h * (l.conv_dim() + l.value_dim() + 2 * nv) + l.value_dim() * h;
                proj + l.conv_dim() * l.conv_kernel + 2 * nv + l.value_head_dim
            }
        }
    }
}

fn read_qwen3(v: &Value) -> Result<ModelConfig> {
    read_decoder(serde_json::from_value(v.clone())?, Family::Qwen3)
}

/// Qwen2's q/k/v projections always carry biases (its config has no `attention_bias` key); its
/// `sliding_window` applies only with `use_sliding_window = true`, which is refused.
fn read_qwen2(v: &Value) -> Result<ModelConfig> {
    let mut raw: RawHfConfig = serde_json::from_value(v.clone())?;
    raw.attention_bias = Some(true);
    read_decoder(raw, Family::Qwen2)
}

fn read_llama(v: &Value) -> Result<ModelConfig> {
    read_decoder(serde_json::from_value(v.clone())?, Family::Llama)
}

/// The attention layers' KV heads (all query heads when unset, which must divide them) and
/// head size (`hidden / heads` when unset, even for RoPE).
fn attention_heads(
    hidden: usize,
    heads: usize,
    kv_heads: Option<usize>,
    head_dim: Option<usize>,
) -> Result<(usize, usize)> {
    let kv = kv_heads.unwrap_or(heads);
    if kv == 0 || !heads.is_multiple_of(kv) {
        bail!("num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}");
    }
    let head_dim = head_dim.unwrap_or(hidden / heads.max(1));
    if !head_dim.is_multiple_of(2) {
        bail!("head_dim {head_dim} is odd; RoPE needs an even head_dim");
    }
    Ok((kv, head_dim))
}

/// Qwen3, Qwen2 and Llama: every layer attention, Qwen3's with q/k norms.
fn read_decoder(raw: RawHfConfig, family: Family) -> Result<ModelConfig> {
    if let Some(act) = raw.hidden_act.as_deref().filter(|a| *a != "silu") {
        bail!("hidden_act `{act}` is not supported (only silu)");
    }
    if raw.use_sliding_window == Some(true) {
        bail!("sliding-window attention (use_sliding_window = true) is not supported");
    }
    let (num_kv_heads, head_dim) = attention_heads(
        raw.hidden_size,
        raw.num_attention_heads,
        raw.num_key_value_heads,
        raw.head_dim,
    )?;
    let (rope_theta, rope_scaling) = rope(&raw)?;
    Ok(ModelConfig {
        family,
        hidden_size: raw.hidden_size,
        intermediate_size: raw.intermediate_size,
        layer_kinds: vec![LayerKind::Attention; raw.num_hidden_layers],
        num_heads: raw.num_attention_heads,
        num_kv_heads,
        head_dim,
        qk_norm: family == Family::Qwen3,
        attention_gate: false,
        rotary_dim: head_dim,
        norm_offset: false,
        linear: None,
        weights_prefix: "model".into(),
        vocab_size: raw.vocab_size,
        rms_norm_eps: raw.rms_norm_eps,
        rope_theta,
        rope_scaling,
        sliding_window: None,
        sliding_rope: None,
        query_pre_attn_scalar: None,
        embed_scale: false,
        sandwich_norms: false,
        activation: Activation::Silu,
        max_position_embeddings: raw.max_position_embeddings,
        tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
        attention_bias: raw.attention_bias.unwrap_or(false),
        dtype: raw
            .dtype
            .or(raw.torch_dtype)
            .unwrap_or_else(|| "float32".into()),
    })
}

/// A multimodal family's text config: `text_config` when `model_type` is `multimodal` (the
/// multimodal layout, then `true`), else the config itself.
fn text_part<'a>(v: &'a Value, multimodal: &str) -> Result<(&'a Value, bool)> {
    if v.get("model_type").and_then(Value::as_str) != Some(multimodal) {
        return Ok((v, false));
    }
    let text = v
        .get("text_config")
        .with_context(|| format!("model_type `{multimodal}` without a `text_config`"))?;
    Ok((text, true))
}

/// Tied embeddings (`default_tie` when unset) and the dtype, read where transformers writes
/// them: a multimodal config's top level first, then the text config (`dtype`, `torch_dtype`).
fn tie_and_dtype(
    v: &Value,
    multimodal: bool,
    tie: Option<bool>,
    default_tie: bool,
    dtype: Option<String>,
    torch_dtype: Option<String>,
) -> (bool, String) {
    let outer = |k: &str| if multimodal { v.get(k) } else { None };
    let tie = outer("tie_word_embeddings")
        .and_then(Value::as_bool)
        .or(tie)
        .unwrap_or(default_tie);
    let dtype = outer("dtype")
        .or(outer("torch_dtype"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .or(dtype)
        .or(torch_dtype)
        .unwrap_or_else(|| "float32".into());
    (tie, dtype)
}

/// Each of `n` layers' kind: from `layer_types` (names as `names` map them), or without it
/// every `every`-th layer full attention and the others `other` (Qwen3.5's
/// `full_attention_interval`, Gemma 3's `sliding_window_pattern`).
fn layer_kinds(
    types: Option<&[String]>,
    n: usize,
    names: &[(&str, LayerKind)],
    (every, other): (usize, LayerKind),
) -> Result<Vec<LayerKind>> {
    let Some(types) = types else {
        let every = every.max(1);
        return Ok((0..n)
            .map(|i| {
                if (i + 1) % every == 0 {
                    LayerKind::Attention
                } else {
                    other
                }
            })
            .collect());
    };
    if types.len() != n {
        bail!(
            "layer_types lists {} layers, num_hidden_layers is {n}",
            types.len()
        );
    }
    types
        .iter()
        .map(|t| match names.iter().find(|(name, _)| name == t) {
            Some((_, kind)) => Ok(*kind),
            None => {
                let known: Vec<&str> = names.iter().map(|(name, _)| *name).collect();
                bail!("layer type `{t}` is not supported ({})", known.join(", "))
            }
        })
        .collect()
}

/// One RoPE table's `rope_theta` (`default_theta` when unset) and scaling (`default` or
/// `linear`) from a `rope_parameters` entry or a `rope_scaling` object.
fn rope_params(p: Option<&Value>, default_theta: f64) -> Result<RopeParams> {
    let Some(p) = p.filter(|p| !p.is_null()) else {
        return Ok(RopeParams {
            theta: default_theta,
            scaling: None,
        });
    };
    let theta = p
        .get("rope_theta")
        .and_then(Value::as_f64)
        .unwrap_or(default_theta);
    let kind = p
        .get("rope_type")
        .or_else(|| p.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let scaling = match kind {
        "default" => None,
        "linear" => {
            let f = p
                .get("factor")
                .and_then(Value::as_f64)
                .context("rope scaling `linear` needs `factor`")?;
            if f <= 0.0 {
                bail!("rope scaling factor {f} must be positive");
            }
            Some(RopeScaling::Linear(f))
        }
        other => bail!("rope scaling `{other}` is not supported here (supported: default, linear)"),
    };
    Ok(RopeParams { theta, scaling })
}

/// `rope_theta` and the scaling from either layout.
fn rope(raw: &RawHfConfig) -> Result<(f64, Option<RopeScaling>)> {
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
                Some(RopeScaling::Llama3(Llama3Scaling {
                    factor: f("factor")?,
                    low_freq_factor: f("low_freq_factor")?,
                    high_freq_factor: f("high_freq_factor")?,
                    original_max_position_embeddings: f("original_max_position_embeddings")?,
                })),
            ))
        }
        other => bail!("rope scaling `{other}` is not supported (supported: default, llama3)"),
    }
}
