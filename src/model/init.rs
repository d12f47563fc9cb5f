//! Weights from nothing: every weight's name and shape for a config, seeded initial weights (the
//! pretrain stage's starting point), and random models of benchmark shapes (benchmarks and
//! tests, no checkpoint needed).
//!
//! Knows the checkpoint layout of the families [`ModelConfig`] reads; nothing of training.

use std::collections::HashMap;

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

use super::layers::{norm_init, Init};
use super::{ModelConfig, Transformer};
use crate::rng::SplitMix;

/// Every weight of a model of `cfg`'s shape as (checkpoint name, shape, is a norm weight), in
/// checkpoint order.
pub fn weight_shapes(cfg: &ModelConfig) -> Vec<(String, Vec<usize>, Init)> {
    let h = cfg.hidden_size;
    let m = &cfg.weights_prefix;
    let mut out = vec![(
        format!("{m}.embed_tokens.weight"),
        vec![cfg.vocab_size, h],
        Init::Normal,
    )];
    for l in 0..cfg.num_layers() {
        out.extend(super::layers::weight_shapes(
            cfg,
            l,
            &format!("{m}.layers.{l}"),
        ));
    }
    out.push((format!("{m}.norm.weight"), vec![h], norm_init(cfg)));
    if !cfg.tie_word_embeddings {
        out.push((
            "lm_head.weight".into(),
            vec![cfg.vocab_size, h],
            Init::Normal,
        ));
    }
    out
}

/// Seeded initial weights: normal(0, `init_std`) for every matrix, ones for the norms. Each
/// 64K-element block of a tensor draws from its own stream of (seed, tensor, block), so the
/// blocks fill in parallel and the result does not depend on the thread count.
pub fn init_weights(cfg: &ModelConfig, init_std: f64, seed: u64) -> Result<Vec<(String, Tensor)>> {
    use rayon::prelude::*;
    const BLOCK: usize = 1 << 16;
    let dev = Device::Cpu;
    let mut out = Vec::new();
    for (name, shape, init) in weight_shapes(cfg) {
        let t = if let Some(c) = init.value() {
            Tensor::full(c, shape.as_slice(), &dev)?
        } else {
            let n: usize = shape.iter().product();
            let stream = seed ^ (out.len() as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let v: Vec<f32> = (0..n.div_ceil(BLOCK))
                .into_par_iter()
                .flat_map_iter(|b| {
                    let mut rng =
                        SplitMix(stream ^ (b as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03));
                    (b * BLOCK..n.min((b + 1) * BLOCK))
                        .map(move |_| (rng.normal() * init_std) as f32)
                })
                .collect();
            Tensor::from_vec(v, shape.as_slice(), &dev)?
        };
        out.push((name, t));
    }
    Ok(out)
}

/// The benchmark shapes: Qwen3 (tied embeddings), Qwen2 (`qwen2.5-1.5b`, or any Qwen3 shape's
/// dims as Qwen2: `qwen2:20m`), Gemma 3 (`gemma3-1b`, or `gemma3:20m`) and hybrid Qwen3.5 (`hybrid-20m`, and the text model of
/// `qwen3.5-0.8b`).
pub fn shape(name: &str) -> Result<ModelConfig> {
    ModelConfig::parse(&shape_json(name)?)
}

/// The `config.json` text of a benchmark shape (see [`shape`]).
pub fn shape_json(name: &str) -> Result<String> {
    if let Some(json) = hybrid_shape(name) {
        return Ok(json);
    }
    // Qwen2 shapes: q/k/v biases, no q/k norms (Qwen2.5-1.5B's dims, and a small one)
    let (family, name) = match (name.strip_prefix("qwen2:"), name.strip_prefix("gemma3:")) {
        (Some(rest), _) => ("qwen2", rest),
        (_, Some(rest)) => ("gemma3_text", rest),
        _ if name == "qwen2.5-1.5b" => ("qwen2", "qwen2.5-1.5b"),
        _ if name == "gemma3-1b" => ("gemma3_text", "gemma3-1b"),
        _ => ("qwen3", name),
    };
    let (h, i, l, q, kv, d, v) = match name {
        "tiny" => (64, 176, 2, 4, 2, 16, 485),
        "arith" => (128, 384, 4, 4, 4, 32, 72),
        "20m" => (256, 768, 8, 8, 4, 32, 32000),
        "50m" => (512, 1536, 10, 8, 4, 64, 32000),
        "qwen3-0.6b" => (1024, 3072, 28, 16, 8, 128, 151936),
        "qwen3-4b" => (2560, 9728, 36, 32, 8, 128, 151936),
        "qwen2.5-1.5b" => (1536, 8960, 28, 12, 2, 128, 151936),
        "gemma3-1b" => (1152, 6912, 26, 4, 1, 256, 262144),
        other => bail!(
            "--shape {other}: use tiny, arith, 20m, 50m, qwen3-0.6b, qwen3-4b, qwen2.5-1.5b, \
             gemma3-1b, hybrid-20m or qwen3.5-0.8b (`qwen2:20m`: a shape as Qwen2, with q/k/v \
             biases; `gemma3:20m`: as Gemma 3, five sliding-window layers of 512 tokens to a \
             full one)"
        ),
    };
    let json = if family == "gemma3_text" {
        // gemma-3-1b-it's layout: a full layer every sixth, the others a 512-token window
        format!(
            r#"{{"model_type": "gemma3_text", "hidden_size": {h}, "intermediate_size": {i},
            "num_hidden_layers": {l}, "num_attention_heads": {q}, "num_key_value_heads": {kv},
            "head_dim": {d}, "vocab_size": {v}, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 32768, "tie_word_embeddings": true,
            "query_pre_attn_scalar": {d}, "sliding_window": 512, "sliding_window_pattern": 6,
            "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "hidden_activation": "gelu_pytorch_tanh"}}"#
        )
    } else {
        format!(
            r#"{{"model_type": "{family}", "hidden_size": {h}, "intermediate_size": {i},
            "num_hidden_layers": {l}, "num_attention_heads": {q}, "num_key_value_heads": {kv},
            "head_dim": {d}, "vocab_size": {v}, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 40960, "tie_word_embeddings": true,
            "rope_theta": 1000000.0}}"#
        )
    };
    Ok(json)
}

/// Writes a benchmark shape with [`random_weights`] (the weights [`random_model`] builds) as a
/// Hugging Face folder, for engines that load checkpoints (mistral.rs, transformers):
/// config.json (with `architectures` and `torch_dtype`), model.safetensors (in `dtype`), and a
/// word-level tokenizer.json of `vocab_size` tokens `t0`, `t1`, ... (ids decode to those
/// words; no EOS, so generation runs to its length). Written beside `dir` and renamed into place.
pub fn write_random_hf(name: &str, dir: &std::path::Path, dtype: DType) -> Result<()> {
    use anyhow::Context;
    let cfg = shape(name)?;
    let mut config: serde_json::Value = serde_json::from_str(&shape_json(name)?)?;
    let arch = match config["model_type"].as_str() {
        Some("qwen3") => "Qwen3ForCausalLM",
        Some("qwen2") => "Qwen2ForCausalLM",
        Some("qwen3_5_text") => "Qwen3_5ForCausalLM",
        Some("gemma3_text") => "Gemma3ForCausalLM",
        other => bail!("shape {name}: no architecture for model_type {other:?}"),
    };
    config["architectures"] = serde_json::json!([arch]);
    config["torch_dtype"] = serde_json::json!(match dtype {
        DType::F32 => "float32",
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        other => bail!("shape {name}: no checkpoint dtype {other:?} (f32, bf16 or f16)"),
    });
    // what transformers writes and mistral.rs's Qwen configs require (a Gemma 3 shape is
    // already in the hub's layout, its window included)
    let qwen = arch.starts_with("Qwen");
    for (k, v) in [
        ("hidden_act", serde_json::json!("silu")),
        ("attention_bias", serde_json::json!(false)),
        ("attention_dropout", serde_json::json!(0.0)),
        (
            "max_window_layers",
            serde_json::json!(cfg.layer_kinds.len()),
        ),
        ("sliding_window", serde_json::Value::Null),
        ("use_sliding_window", serde_json::json!(false)),
    ]
    .into_iter()
    .filter(|_| qwen)
    {
        config[k] = v;
    }
    let vocab: serde_json::Map<String, serde_json::Value> = (0..cfg.vocab_size)
        .map(|i| (format!("t{i}"), serde_json::json!(i)))
        .collect();
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null,
        // mistral.rs (llguidance) reads token bytes through a byte-level or byte-fallback decoder
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
                    "use_regex": false},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}
    });
    let tmp = dir.with_extension("tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    std::fs::write(
        tmp.join("config.json"),
        serde_json::to_string_pretty(&config)?,
    )?;
    std::fs::write(tmp.join("tokenizer.json"), tokenizer.to_string())?;
    let weights = random_weights(&cfg)?
        .into_iter()
        .map(|(k, t)| Ok((k, t.to_dtype(dtype)?)))
        .collect::<Result<HashMap<_, _>>>()?;
    candle_core::safetensors::save(&weights, tmp.join("model.safetensors"))?;
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::rename(&tmp, dir).with_context(|| format!("cannot write {}", dir.display()))
}

/// A model with [`random_weights`].
pub fn random_model(cfg: &ModelConfig) -> Result<Transformer> {
    let vb = VarBuilder::from_tensors(random_weights(cfg)?, DType::F32, &Device::Cpu);
    Ok(Transformer::new(cfg, vb)?)
}

/// A model with N(0, 0.02) weights drawn on `dev` itself (no host copy of a 4B model), in
/// `dtype`. On the CPU in f32 it is [`random_model`].
pub fn random_model_on(cfg: &ModelConfig, dev: &Device, dtype: DType) -> Result<Transformer> {
    if dev.is_cpu() && dtype == DType::F32 {
        return random_model(cfg);
    }
    let mut w = HashMap::new();
    for (name, shape, init) in weight_shapes(cfg) {
        let t = if let Some(c) = init.value() {
            Tensor::full(c, shape.as_slice(), dev)?.to_dtype(dtype)?
        } else {
            Tensor::randn(0f32, 0.02, shape.as_slice(), dev)?.to_dtype(dtype)?
        };
        w.insert(name, t);
    }
    let vb = VarBuilder::from_tensors(w, dtype, dev);
    Ok(Transformer::new(cfg, vb)?)
}

/// Random N(0, 0.02) weights with unit norms, named as in a checkpoint (seed 0).
pub fn random_weights(cfg: &ModelConfig) -> Result<HashMap<String, Tensor>> {
    Ok(init_weights(cfg, 0.02, 0)?.into_iter().collect())
}

/// A Qwen3.5 text config (`qwen3_5_text`: three Gated DeltaNet layers to one gated attention
/// layer, partial RoPE) of a benchmark shape.
fn hybrid_shape(name: &str) -> Option<String> {
    // hidden, intermediate, layers, heads, KV heads, head_dim, linear key heads, linear value
    // heads, linear head dim, vocab
    let (h, i, l, q, kv, d, nk, nv, ld, v) = match name {
        "hybrid-20m" => (256, 768, 8, 4, 1, 64, 2, 4, 32, 32000),
        "qwen3.5-0.8b" => (1024, 3584, 24, 8, 2, 256, 16, 16, 128, 248320),
        // Qwen3.5-4B's text model as published (check against its config.json when at hand)
        "qwen3.5-4b" => (2560, 9216, 32, 16, 4, 256, 16, 32, 128, 248320),
        _ => return None,
    };
    Some(format!(
        r#"{{"model_type": "qwen3_5_text", "hidden_size": {h}, "intermediate_size": {i},
        "num_hidden_layers": {l}, "num_attention_heads": {q}, "num_key_value_heads": {kv},
        "head_dim": {d}, "linear_num_key_heads": {nk}, "linear_num_value_heads": {nv},
        "linear_key_head_dim": {ld}, "linear_value_head_dim": {ld}, "linear_conv_kernel_dim": 4,
        "full_attention_interval": 4, "vocab_size": {v}, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960, "tie_word_embeddings": true,
        "rope_parameters": {{"rope_type": "default", "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25}}}}"#
    ))
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};

    /// `bench checkpoint` and `bench sample --engine mistralrs` write a shape of each family
    /// (Qwen3, Qwen2, Gemma 3) as a Hugging Face folder that reads back as the same config and
    /// loads.
    #[test]
    fn random_checkpoints_of_each_family_read_back_as_their_shape() {
        let tmp = tempfile::tempdir().unwrap();
        for (name, arch) in [
            ("tiny", "Qwen3ForCausalLM"),
            ("qwen2:tiny", "Qwen2ForCausalLM"),
            ("gemma3:tiny", "Gemma3ForCausalLM"),
        ] {
            let dir = tmp.path().join(name.replace(':', "-"));
            super::write_random_hf(name, &dir, DType::F32).unwrap();
            let ck = crate::model::Checkpoint::open(dir.to_str().unwrap()).unwrap();
            let mut want = super::shape(name).unwrap();
            want.dtype = "float32".into();
            assert_eq!(ck.config, want, "{name}");
            let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
            assert!(config.contains(arch), "{name}: {config}");
            ck.load_transformer(&Device::Cpu, DType::F32).unwrap();
        }
    }
}
