//! Built-in cards of well-known hub models: their published `config.json`, so that
//! `pipeline preflight` can plan (memory, KV cache, training budget) a pipeline that names a hub
//! id on a machine that has not downloaded it (CI validates the shipped pipelines this way).
//! A card never stands in for a checkpoint when running: sampling and training load the real
//! files.
//!
//! Knows nothing of planning; `stages` decides when a card may be used.

use anyhow::Result;

use super::ModelConfig;

/// (hub id, hidden, intermediate, layers, query heads, KV heads, tied embeddings), every one a
/// Qwen3 with head_dim 128, vocab 151,936, a 40,960-token context, RoPE theta 1e6 and bf16
/// weights, as in the hub's config.json files.
const QWEN3: &[(&str, usize, usize, usize, usize, usize, bool)] = &[
    ("Qwen/Qwen3-0.6B", 1024, 3072, 28, 16, 8, true),
    ("Qwen/Qwen3-1.7B", 2048, 6144, 28, 16, 8, true),
    ("Qwen/Qwen3-4B", 2560, 9728, 36, 32, 8, true),
    ("Qwen/Qwen3-8B", 4096, 12288, 36, 32, 8, false),
];

/// A Qwen2-family card: (hub id, hidden, intermediate, layers, query heads, KV heads, vocab,
/// tied embeddings, RoPE theta, context).
#[rustfmt::skip]
type Qwen2Card = (&'static str, usize, usize, usize, usize, usize, usize, bool, u64, usize);

/// The Qwen2 cards (q/k/v biases, head_dim 128, bf16 weights), as their hub config.json files
/// give them: the math models self-distillation and RL papers start from. Qwen2.5-Math-7B's is
/// inferred from DeepSeek-R1-Distill-Qwen-7B (built on it) and the published 4,096-token
/// context and theta 1e4; the others are quoted copies of the files.
#[rustfmt::skip]
const QWEN2: &[Qwen2Card] = &[
    ("Qwen/Qwen2.5-Math-1.5B", 1536, 8960, 28, 12, 2, 151936, true, 10_000, 4096),
    ("Qwen/Qwen2.5-Math-7B", 3584, 18944, 28, 28, 4, 152064, false, 10_000, 4096),
    ("Qwen/Qwen2.5-1.5B-Instruct", 1536, 8960, 28, 12, 2, 151936, true, 1_000_000, 32768),
    ("Qwen/Qwen2.5-7B-Instruct", 3584, 18944, 28, 28, 4, 152064, false, 1_000_000, 32768),
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", 1536, 8960, 28, 12, 2, 151936, false, 10_000, 131072),
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", 3584, 18944, 28, 28, 4, 152064, false, 10_000, 131072),
];

/// (hub id, hidden, intermediate, layers, query heads, KV heads, linear-attention value heads,
/// tied embeddings).
type Qwen35Card = (&'static str, usize, usize, usize, usize, usize, usize, bool);

/// The Qwen3.5 cards: every one a Qwen3.5 in the multimodal layout with head_dim 256, 16
/// linear-attention key heads of 128 (values 128), a full-attention layer every 4th, vocab
/// 248,320, a 262,144-token context, RoPE theta 1e7 on a quarter of each head, bf16 weights.
const QWEN3_5: &[Qwen35Card] = &[
    ("Qwen/Qwen3.5-0.8B", 1024, 3584, 24, 8, 2, 16, true),
    ("Qwen/Qwen3.5-2B", 2048, 6144, 24, 8, 2, 16, true),
    ("Qwen/Qwen3.5-4B", 2560, 9216, 32, 16, 4, 32, true),
    ("Qwen/Qwen3.5-9B", 4096, 12288, 32, 16, 4, 32, false),
];

/// The Gemma 3 cards: their hub config.json files as published (transformers 4.50's layout:
/// `rope_theta`, `rope_local_base_freq`, `sliding_window_pattern`). gemma-3-4b-it's
/// `text_config` lists only what differs from `Gemma3TextConfig`'s defaults, which the reader
/// fills in as transformers does.
const GEMMA3: &[(&str, &str)] = &[
    (
        "google/gemma-3-1b-it",
        r#"{"architectures": ["Gemma3ForCausalLM"], "attention_bias": false,
        "attention_dropout": 0.0, "attn_logit_softcapping": null, "bos_token_id": 2,
        "cache_implementation": "hybrid", "eos_token_id": [1, 106],
        "final_logit_softcapping": null, "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
        "initializer_range": 0.02, "intermediate_size": 6912, "max_position_embeddings": 32768,
        "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26,
        "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": null,
        "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
        "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0", "use_cache": true,
        "vocab_size": 262144}"#,
    ),
    (
        "google/gemma-3-4b-it",
        r#"{"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
        "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
        "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
        "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
        "model_type": "gemma3_text", "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
        "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
        "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
        "model_type": "siglip_vision_model", "num_attention_heads": 16,
        "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": false}}"#,
    ),
];

/// The config of a known hub id (`hf://` prefix allowed), or `None`.
pub fn card(id: &str) -> Option<Result<ModelConfig>> {
    let id = id.strip_prefix("hf://").unwrap_or(id);
    if let Some((_, json)) = GEMMA3.iter().find(|c| c.0 == id) {
        return Some(ModelConfig::parse(json));
    }
    if let Some(&(_, h, i, l, q, kv, nv, tied)) = QWEN3_5.iter().find(|c| c.0 == id) {
        let json = format!(
            r#"{{"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
            "tie_word_embeddings": {tied}, "dtype": "bfloat16",
            "text_config": {{"model_type": "qwen3_5_text", "hidden_size": {h},
            "intermediate_size": {i}, "num_hidden_layers": {l}, "num_attention_heads": {q},
            "num_key_value_heads": {kv}, "head_dim": 256, "linear_num_key_heads": 16,
            "linear_num_value_heads": {nv}, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
            "full_attention_interval": 4, "vocab_size": 248320, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 262144, "tie_word_embeddings": {tied},
            "hidden_act": "silu", "attention_bias": false, "eos_token_id": 248044,
            "rope_parameters": {{"rope_type": "default", "rope_theta": 10000000,
            "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
            "mrope_interleaved": true}}}}}}"#
        );
        return Some(ModelConfig::parse(&json));
    }
    if let Some(&(_, h, i, l, q, kv, vocab, tied, theta, ctx)) = QWEN2.iter().find(|c| c.0 == id) {
        let json = format!(
            r#"{{"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": {h},
            "intermediate_size": {i}, "num_hidden_layers": {l}, "num_attention_heads": {q},
            "num_key_value_heads": {kv}, "vocab_size": {vocab}, "rms_norm_eps": 1e-6,
            "max_position_embeddings": {ctx}, "tie_word_embeddings": {tied},
            "rope_theta": {theta}, "torch_dtype": "bfloat16", "hidden_act": "silu",
            "use_sliding_window": false, "sliding_window": 4096, "max_window_layers": 21,
            "bos_token_id": 151643, "eos_token_id": 151643}}"#
        );
        return Some(ModelConfig::parse(&json));
    }
    let &(_, h, i, l, q, kv, tied) = QWEN3.iter().find(|c| c.0 == id)?;
    let json = format!(
        r#"{{"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": {h},
        "intermediate_size": {i}, "num_hidden_layers": {l}, "num_attention_heads": {q},
        "num_key_value_heads": {kv}, "head_dim": 128, "vocab_size": 151936,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 40960, "tie_word_embeddings": {tied},
        "rope_theta": 1000000, "torch_dtype": "bfloat16", "attention_bias": false,
        "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": 151645}}"#
    );
    Some(ModelConfig::parse(&json))
}

/// The hub ids with a card.
pub fn known() -> Vec<&'static str> {
    QWEN3
        .iter()
        .map(|c| c.0)
        .chain(QWEN3_5.iter().map(|c| c.0))
        .chain(QWEN2.iter().map(|c| c.0))
        .chain(GEMMA3.iter().map(|c| c.0))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cards_parse_with_the_published_parameter_counts() {
        // parameters as the model cards state them (embeddings counted once when tied)
        for (id, billions) in [
            ("Qwen/Qwen3-0.6B", 0.596),
            ("Qwen/Qwen3-1.7B", 1.72),
            ("Qwen/Qwen3-4B", 4.02),
            ("hf://Qwen/Qwen3-8B", 8.19),
        ] {
            let cfg = card(id).unwrap().unwrap();
            let got = cfg.num_params() as f64 / 1e9;
            assert!((got - billions).abs() / billions < 0.01, "{id}: {got}");
            assert_eq!(cfg.dtype, "bfloat16");
        }
        assert!(card("Qwen/Qwen3-5B").is_none());
    }

    /// The Qwen2 cards: q/k/v biases, no q/k norms, and the parameter counts the hub's
    /// safetensors metadata gives (Qwen2.5-1.5B-Instruct 1,543,714,304; the 7B models
    /// 7,615,616,512; R1-Distill-Qwen-1.5B, untied, 1,777,088,000).
    #[test]
    fn qwen2_cards_have_biases_and_the_published_sizes() {
        for (id, params) in [
            ("Qwen/Qwen2.5-1.5B-Instruct", 1_543_714_304),
            ("Qwen/Qwen2.5-Math-1.5B", 1_543_714_304),
            ("Qwen/Qwen2.5-7B-Instruct", 7_615_616_512),
            ("Qwen/Qwen2.5-Math-7B", 7_615_616_512),
            ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", 1_777_088_000),
            (
                "hf://deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
                7_615_616_512,
            ),
        ] {
            let cfg = card(id).unwrap().unwrap();
            assert_eq!(cfg.family, super::super::Family::Qwen2, "{id}");
            assert!(cfg.attention_bias && !cfg.qk_norm, "{id}");
            assert_eq!(cfg.num_params(), params, "{id}");
        }
    }

    /// The Gemma 3 cards: five sliding-window layers to a full one, and the text models'
    /// parameter counts (gemma-3-1b-it's 999,885,952 as its safetensors metadata gives it;
    /// gemma-3-4b-it's 4,300,079,472 there count its SigLIP tower and projector, 419,816,304,
    /// which the text model does not load).
    #[test]
    fn gemma3_cards_interleave_sliding_layers_with_the_published_sizes() {
        use super::super::{LayerCache, LayerKind, RopeScaling};
        for (id, params, layers, window, prefix, scaling) in [
            ("google/gemma-3-1b-it", 999_885_952, 26, 512, "model", None),
            (
                "hf://google/gemma-3-4b-it",
                4_300_079_472 - 419_816_304,
                34,
                1024,
                "language_model.model",
                Some(RopeScaling::Linear(8.0)),
            ),
        ] {
            let cfg = card(id).unwrap().unwrap();
            assert_eq!(cfg.family, super::super::Family::Gemma3, "{id}");
            assert_eq!(cfg.num_params(), params, "{id}");
            assert_eq!(cfg.num_layers(), layers, "{id}");
            assert_eq!(cfg.weights_prefix, prefix, "{id}");
            assert_eq!(cfg.rope_scaling, scaling, "{id}");
            assert_eq!(cfg.sliding_rope.map(|r| r.theta), Some(10_000.0), "{id}");
            assert_eq!(cfg.dtype, "bfloat16", "{id}");
            // every 6th layer is full attention, and only those keep keys per token
            let full: Vec<usize> = (0..layers).filter(|i| (i + 1) % 6 == 0).collect();
            assert_eq!(cfg.kv_layers(), full, "{id}");
            assert!(cfg
                .layer_kinds
                .iter()
                .enumerate()
                .all(|(i, k)| { (*k == LayerKind::Attention) == full.contains(&i) }));
            let ring = LayerCache::Window {
                kv_heads: cfg.num_kv_heads,
                head_dim: 256,
                window,
            };
            assert_eq!(cfg.layer_cache(0), ring, "{id}");
            assert_eq!(
                cfg.state_values_per_seq(),
                (layers - full.len()) * ring.fixed_values(),
                "{id}"
            );
        }
    }

    #[test]
    fn qwen3_5_cards_are_hybrid_text_models() {
        for (id, layers, nominal) in [
            ("Qwen/Qwen3.5-0.8B", 24, 0.8),
            ("Qwen/Qwen3.5-2B", 24, 2.0),
            ("Qwen/Qwen3.5-4B", 32, 4.0),
            ("Qwen/Qwen3.5-9B", 32, 9.0),
        ] {
            let cfg = card(id).unwrap().unwrap();
            assert_eq!(cfg.num_layers(), layers, "{id}");
            // a full-attention layer every 4th: keys and values only there
            let kv: Vec<usize> = (0..layers / 4).map(|i| 4 * i + 3).collect();
            assert_eq!(cfg.kv_layers(), kv, "{id}");
            assert_eq!(
                (cfg.rotary_dim, cfg.weights_prefix.as_str()),
                (64, "model.language_model")
            );
            // the text model is near the nominal size (which is rounded, and counts the vision
            // tower too)
            let billions = cfg.num_params() as f64 / 1e9;
            assert!((billions / nominal - 1.0).abs() < 0.15, "{id}: {billions}");
        }
    }
}
