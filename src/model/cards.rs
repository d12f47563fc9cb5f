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

/// The config of a known hub id (`hf://` prefix allowed), or `None`.
pub fn card(id: &str) -> Option<Result<ModelConfig>> {
    let id = id.strip_prefix("hf://").unwrap_or(id);
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
    QWEN3.iter().map(|c| c.0).collect()
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
}
