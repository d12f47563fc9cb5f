//! `config.json` of every family read against what transformers reads, and what we refuse.

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
    assert!(matches!(c.rope_scaling, Some(RopeScaling::Llama3(s)) if s.factor == 8.0));
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

/// Gemma 3's two RoPE layouts agree, and what we do not implement is refused by name.
#[test]
fn gemma3_layouts_and_refusals() {
    let old = r#"{"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "vocab_size": 100, "sliding_window": 8, "sliding_window_pattern": 3,
        "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 4.0},
        "attn_logit_softcapping": null, "final_logit_softcapping": null}"#;
    let a = ModelConfig::parse(old).unwrap();
    let s = LayerKind::SlidingAttention;
    let f = LayerKind::Attention;
    assert_eq!(a.layer_kinds, vec![s, s, f, s, s, f]);
    assert_eq!(a.rope_scaling, Some(RopeScaling::Linear(4.0)));
    assert_eq!(a.query_pre_attn_scalar, Some(256.0));
    assert!(a.tie_word_embeddings && a.sandwich_norms && a.embed_scale);
    assert_eq!(a.activation, Activation::GeluTanh);
    assert_eq!((a.window(0), a.window(2)), (Some(8), None));
    let new = old
        .replace(
            r#""sliding_window_pattern": 3,"#,
            r#""layer_types": ["sliding_attention", "sliding_attention", "full_attention",
            "sliding_attention", "sliding_attention", "full_attention"],"#,
        )
        .replace(
            r#""rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 4.0},"#,
            r#""rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 4.0,
            "rope_theta": 1000000.0}, "sliding_attention": {"rope_type": "default",
            "rope_theta": 10000.0}},"#,
        );
    assert_eq!(ModelConfig::parse(&new).unwrap(), a);
    // four norms per layer and the q/k norms: the count agrees with the weight list
    let weights: usize = crate::model::init::weight_shapes(&a)
        .iter()
        .map(|(_, shape, _)| shape.iter().product::<usize>())
        .sum();
    assert_eq!(a.num_params(), weights);
    for (edit, refused) in [
        (
            r#""attn_logit_softcapping": 50.0"#,
            "attn_logit_softcapping = 50 is not supported",
        ),
        (
            r#""final_logit_softcapping": 30.0"#,
            "final_logit_softcapping = 30 is not supported",
        ),
        (r#""sliding_window": 0"#, "sliding_window = 0"),
        (r#""hidden_activation": "silu""#, "hidden_activation `silu`"),
        (
            r#""rope_scaling": {"rope_type": "yarn", "factor": 4.0}"#,
            "`yarn` is not supported",
        ),
    ] {
        let key = edit.split(':').next().unwrap();
        let mut v: Value = serde_json::from_str(old).unwrap();
        let e: Value = serde_json::from_str(&format!("{{{edit}}}")).unwrap();
        v[key.trim_matches('"')] = e[key.trim_matches('"')].clone();
        let err = format!("{:#}", ModelConfig::parse(&v.to_string()).unwrap_err());
        assert!(err.contains(refused), "{edit}: {err}");
    }
}

#[test]
fn parameters_and_cache_needs_follow_the_layer_kinds() {
    for (text, tied) in [
        (QWEN3.to_string(), true),
        (
            QWEN3.replace(
                "\"tie_word_embeddings\": true",
                "\"tie_word_embeddings\": false",
            ),
            false,
        ),
        (QWEN3.replace("qwen3", "llama"), true),
    ] {
        let c = ModelConfig::parse(&text).unwrap();
        assert_eq!(c.tie_word_embeddings, tied);
        // the count agrees with the list of weights a checkpoint of this config holds
        let weights: usize = crate::model::init::weight_shapes(&c)
            .iter()
            .map(|(_, shape, _)| shape.iter().product::<usize>())
            .sum();
        assert_eq!(c.num_params(), weights, "{text}");
        // every layer is attention here: keys and values in each, no per-sequence state
        assert_eq!(c.kv_layers(), vec![0, 1]);
        assert_eq!(c.kv_slots(), vec![Some(0), Some(1)]);
        assert_eq!(c.kv_values_per_token(), 2 * 2 * 2 * 16);
        assert_eq!(c.state_values_per_seq(), 0);
    }
}
