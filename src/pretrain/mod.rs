//! A model from nothing: a word-level tokenizer built from a corpus, a Qwen3-shaped config of a
//! given size, seeded initial weights, written as a Hugging Face checkpoint folder that every
//! other part of the program (sampler, trainer, eval) loads like a downloaded one.
//!
//! The tokenizer splits digits one by one and everything else GPT-2 style (byte-level, a leading
//! space kept with its word), then gives every piece of the corpus its own id: for a generated
//! corpus with a closed vocabulary that is lossless and tiny (about seventy ids for the
//! arithmetic problems), and decoding is exact. Also the `[pretrain]` section's validated
//! settings ([`PretrainConfig`]); the pretrain stage does the work. Knows nothing of how training
//! runs or of what the corpus means.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{bail, Context, Result};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::data::source::SourceSpec;
use crate::model::config::ModelConfig;
use crate::model::init::init_weights;
use crate::train::settings::TrainSettings;

/// The end-of-sequence (and padding) token, id 0.
pub const EOS: &str = "<|endoftext|>";
/// Pieces the corpus never had; id 1.
pub const UNK: &str = "<unk>";

/// The `[pretrain]` section, validated: what the pretrain stage builds and trains.
#[derive(Debug, Clone, Serialize)]
pub struct PretrainConfig {
    /// Problems with worked solutions (`solution_field`): the rows learned from, the prompt
    /// rendered with `prompt_template` and the solution as the completion.
    pub source: SourceSpec,
    /// Sources whose text the tokenizer also covers: the data stage's and the eval sets', so
    /// that every prompt the model will see tokenizes without unknown pieces.
    pub tokenizer_sources: Vec<SourceSpec>,
    /// `raw` or a Jinja file, as `[sample].prompt_template` (which must agree).
    pub prompt_template: String,
    pub model: ModelShape,
    /// Seeds the initial weights (the trainer's order of rows has its own `train.seed`).
    pub seed: u64,
    /// The trainer's settings; `model` is the stage's initial checkpoint.
    pub train: TrainSettings,
}

/// The size of a model built from scratch (Qwen3 layout, tied embeddings).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelShape {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    /// Standard deviation of the initial weights (norms start at 1).
    #[serde(default = "default_init_std")]
    pub init_std: f64,
}

fn default_rope_theta() -> f64 {
    10_000.0
}

fn default_init_std() -> f64 {
    0.02
}

impl ModelShape {
    pub fn validate(&self, what: &str) -> Result<()> {
        let fields = [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (k, v) in fields {
            if v == 0 {
                bail!("{what}.{k} must be at least 1");
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            bail!(
                "{what}.num_heads = {} is not a multiple of num_kv_heads = {}",
                self.num_heads,
                self.num_kv_heads
            );
        }
        if !self.head_dim.is_multiple_of(2) {
            bail!("{what}.head_dim = {} must be even (RoPE)", self.head_dim);
        }
        if !(self.init_std > 0.0 && self.init_std.is_finite()) {
            bail!("{what}.init_std must be positive");
        }
        Ok(())
    }

    /// `config.json` for this shape and vocabulary.
    pub fn config_json(&self, vocab_size: usize) -> serde_json::Value {
        json!({
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": 1e-6,
            "rope_theta": self.rope_theta,
            "rope_scaling": null,
            "tie_word_embeddings": true,
            "attention_bias": false,
            "hidden_act": "silu",
            "bos_token_id": 0,
            "eos_token_id": 0,
            "pad_token_id": 0,
            "sliding_window": null,
            "use_sliding_window": false,
            "torch_dtype": "float32",
        })
    }
}

/// The pre-tokenizer and decoder of [`build_tokenizer`], as tokenizer.json parts.
fn pipeline_json() -> (serde_json::Value, serde_json::Value) {
    (
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
        ]}),
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}),
    )
}

fn tokenizer_json(vocab: &BTreeMap<String, u32>) -> serde_json::Value {
    let (pre, dec) = pipeline_json();
    let special = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(0, EOS), special(1, UNK)],
        "normalizer": null,
        "pre_tokenizer": pre,
        "post_processor": null,
        "decoder": dec,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": UNK},
    })
}

/// A word-level tokenizer.json covering every piece of `texts` (plus the ten digits): ids 0 and
/// 1 are [`EOS`] and [`UNK`], then pieces by falling count, ties in byte order.
pub fn build_tokenizer<'a>(texts: impl IntoIterator<Item = &'a str>) -> Result<String> {
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
    // A tokenizer with the pipeline and an empty vocabulary, to split the corpus with.
    let mut empty = BTreeMap::new();
    empty.insert(UNK.to_string(), 0u32);
    let splitter = tokenizers::Tokenizer::from_bytes(serde_json::to_vec(&tokenizer_json(&empty))?)
        .map_err(|e| anyhow::anyhow!("building the splitter: {e}"))?;
    let pre = splitter
        .get_pre_tokenizer()
        .context("the splitter has no pre-tokenizer")?;
    let mut counts: HashMap<String, u64> = HashMap::new();
    let digits = "0 1 2 3 4 5 6 7 8 9";
    for text in std::iter::once(digits).chain(texts) {
        let mut s = PreTokenizedString::from(text);
        pre.pre_tokenize(&mut s)
            .map_err(|e| anyhow::anyhow!("splitting {text:?}: {e}"))?;
        for (piece, _, _) in s.get_splits(OffsetReferential::Original, OffsetType::Byte) {
            *counts.entry(piece.to_string()).or_default() += 1;
        }
    }
    let mut pieces: Vec<(String, u64)> = counts.into_iter().collect();
    pieces.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mut vocab = BTreeMap::new();
    vocab.insert(EOS.to_string(), 0);
    vocab.insert(UNK.to_string(), 1);
    for (p, _) in pieces {
        let id = vocab.len() as u32;
        vocab.entry(p).or_insert(id);
    }
    Ok(serde_json::to_string_pretty(&tokenizer_json(&vocab))?)
}

/// Writes a complete checkpoint folder for `shape` with a tokenizer built from `texts` and
/// weights from `seed`: config.json, tokenizer.json, tokenizer_config.json,
/// generation_config.json, model.safetensors. The folder is built beside `dir` and renamed into
/// place; an existing `dir` is replaced.
pub fn write_initial_checkpoint<'a>(
    dir: &Path,
    shape: &ModelShape,
    texts: impl IntoIterator<Item = &'a str>,
    seed: u64,
) -> Result<()> {
    shape.validate("model")?;
    let tokenizer = build_tokenizer(texts)?;
    let vocab_size = {
        let t = tokenizers::Tokenizer::from_bytes(tokenizer.as_bytes())
            .map_err(|e| anyhow::anyhow!("the built tokenizer does not load: {e}"))?;
        t.get_vocab_size(true)
    };
    let config = shape.config_json(vocab_size);
    let cfg = ModelConfig::parse(&config.to_string())?;
    let weights = init_weights(&cfg, shape.init_std, seed)?;
    let tmp = dir.with_extension("tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let write = |name: &str, text: &str| -> Result<()> {
        std::fs::write(tmp.join(name), text)
            .with_context(|| format!("cannot write {}", tmp.join(name).display()))
    };
    write("config.json", &serde_json::to_string_pretty(&config)?)?;
    write("tokenizer.json", &tokenizer)?;
    write(
        "tokenizer_config.json",
        &serde_json::to_string_pretty(&json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": EOS,
            "pad_token": EOS,
            "unk_token": UNK,
            "model_max_length": shape.max_position_embeddings,
        }))?,
    )?;
    write(
        "generation_config.json",
        &serde_json::to_string_pretty(&json!({"eos_token_id": [0], "pad_token_id": 0}))?,
    )?;
    let map: HashMap<String, Tensor> = weights.into_iter().collect();
    candle_core::safetensors::save(&map, tmp.join("model.safetensors"))?;
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::rename(&tmp, dir).with_context(|| format!("cannot write {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::init::init_weights;
    use candle_core::{DType, Device};

    const SHAPE: ModelShape = ModelShape {
        hidden_size: 32,
        intermediate_size: 64,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 8,
        max_position_embeddings: 128,
        rope_theta: 10_000.0,
        init_std: 0.02,
    };

    /// Every piece of the corpus round-trips exactly, digits are single tokens, and the folder
    /// loads as a checkpoint (config, tokenizer, EOS, weights) that runs a forward pass.
    #[test]
    fn the_checkpoint_loads_and_its_tokenizer_round_trips() {
        let corpus = [
            "Ana has 17 apples. Ana buys 5 more.",
            "17 + 5 = 22\n\\boxed{22}",
        ];
        let dir = tempfile::tempdir().unwrap();
        let ck_dir = dir.path().join("m");
        write_initial_checkpoint(&ck_dir, &SHAPE, corpus, 3).unwrap();
        let ck = crate::model::Checkpoint::open(ck_dir.to_str().unwrap()).unwrap();
        assert_eq!(ck.eos_token_ids().unwrap(), vec![0]);
        let tok = ck.tokenizer().unwrap();
        for text in corpus.iter().chain(&["Ana has 90 apples.\n"]) {
            let ids = tok.encode(text).unwrap();
            assert!(!ids.contains(&1), "{text:?} has an unknown piece: {ids:?}");
            assert_eq!(tok.decode(&ids).unwrap(), *text);
        }
        let ids = tok.encode("1234").unwrap();
        assert_eq!(ids.len(), 4, "digits are one token each");
        let model = ck.load_transformer(&Device::Cpu, DType::F32).unwrap();
        assert_eq!(model.config().vocab_size, ck.config.vocab_size);
        // Seeded: the same seed gives the same weights, another seed others.
        let cfg = ck.config.clone();
        let a = init_weights(&cfg, 0.02, 3).unwrap();
        let b = init_weights(&cfg, 0.02, 3).unwrap();
        let c = init_weights(&cfg, 0.02, 4).unwrap();
        let flat = |w: &[(String, Tensor)]| w[0].1.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(flat(&a), flat(&b));
        assert_ne!(flat(&a), flat(&c));
        let std = {
            let v = flat(&a);
            (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt()
        };
        assert!((std - 0.02).abs() < 0.003, "init std {std}");
    }

    #[test]
    fn bad_shapes_name_their_key() {
        let mut s = SHAPE;
        s.num_kv_heads = 3;
        let e = s.validate("pretrain.model").unwrap_err().to_string();
        assert!(e.contains("pretrain.model.num_heads"), "{e}");
        s = SHAPE;
        s.head_dim = 0;
        let e = s.validate("pretrain.model").unwrap_err().to_string();
        assert!(e.contains("pretrain.model.head_dim"), "{e}");
    }
}
