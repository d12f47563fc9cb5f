//! The model against Hugging Face transformers' outputs for `../shared/fixtures/tiny-qwen3`
//! (made by `make_fixtures.py` with transformers 5.23, PyTorch 2.15, fp32 on CPU): tokenization,
//! chat renderings, full logits and greedy tokens.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use super::attention::CausalAttention;
use super::*;

/// The tiny Qwen3 fixture's folder (`None`, test skipped, when `../shared` is absent and not
/// required). Shared with the trainer's tests.
pub(crate) fn fixture() -> Option<PathBuf> {
    fixture_named("tiny-qwen3")
}

/// The fixture `../shared/fixtures/NAME` (`None`, test skipped, as for [`fixture`]).
pub(crate) fn fixture_named(name: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/fixtures")
        .join(name);
    if p.exists() {
        return Some(p);
    }
    assert!(
        !std::env::var("SELFDISTILL_REQUIRE_SHARED").is_ok_and(|v| v == "1"),
        "{} is missing and SELFDISTILL_REQUIRE_SHARED=1",
        p.display()
    );
    eprintln!("skipped: {} missing", p.display());
    None
}

fn expected(dir: &Path, file: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("expected").join(file)).unwrap())
        .unwrap()
}

/// The largest absolute elementwise difference of two tensors.
pub(crate) fn max_abs_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

pub(crate) fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn tokenization_matches_transformers() {
    let Some(dir) = fixture() else { return };
    let tok = Checkpoint::open(dir.to_str().unwrap())
        .unwrap()
        .tokenizer()
        .unwrap();
    for case in expected(&dir, "tokenize.json").as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        assert_eq!(
            tok.encode(text).unwrap(),
            ids(&case["input_ids"]),
            "{text:?}"
        );
        assert_eq!(tok.decode(&ids(&case["input_ids"])).unwrap(), text);
    }
}

#[test]
fn chat_renderings_are_byte_identical() {
    let Some(dir) = fixture() else { return };
    let tmpl = assert_chat_renderings_match(&dir);
    // The template shipped as chat_template.jinja (the newer layout) renders the same.
    let jinja = std::fs::read_to_string(dir.join("../qwen3_chat_template.jinja")).unwrap();
    assert_eq!(jinja, tmpl.source);
}

/// A fixture's chat renderings (and their tokens) byte-identical to transformers'; returns its
/// template.
fn assert_chat_renderings_match(dir: &Path) -> crate::model::ChatTemplate {
    let ck = Checkpoint::open(dir.to_str().unwrap()).unwrap();
    let (tmpl, tok) = (ck.chat_template().unwrap(), ck.tokenizer().unwrap());
    let cases = expected(dir, "chat_template.json");
    for case in cases.as_array().unwrap() {
        let msgs: Vec<Message> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let text = tmpl
            .render(
                &msgs,
                case["add_generation_prompt"].as_bool().unwrap(),
                case["enable_thinking"].as_bool(),
            )
            .unwrap();
        assert_eq!(text, case["text"].as_str().unwrap());
        assert_eq!(tok.encode(&text).unwrap(), ids(&case["input_ids"]));
    }
    tmpl
}

#[test]
fn eos_ids_come_from_generation_config() {
    let Some(dir) = fixture() else { return };
    let ck = Checkpoint::open(dir.to_str().unwrap()).unwrap();
    assert_eq!(ck.eos_token_ids().unwrap(), vec![482, 480]);
}

pub(crate) fn full_logits(model: &Transformer, prompt: &[u32]) -> Tensor {
    let dev = Device::Cpu;
    let tokens = Tensor::new(prompt, &dev).unwrap();
    let pos: Vec<u32> = (0..prompt.len() as u32).collect();
    let pos = Tensor::new(pos.as_slice(), &dev).unwrap();
    let mut attn = CausalAttention::new(vec![prompt.len()]);
    model.forward(&tokens, &pos, &mut attn).unwrap()
}

/// Every prompt's full logits within 1e-4 of transformers'; returns the prompts.
fn assert_logits_match_transformers(model: &Transformer, dir: &Path) -> Vec<Vec<u32>> {
    let want =
        candle_core::safetensors::load(dir.join("expected/logits.safetensors"), &Device::Cpu)
            .unwrap();
    let cases = expected(dir, "tokenize.json");
    let prompts: Vec<Vec<u32>> = cases
        .as_array()
        .unwrap()
        .iter()
        .map(|c| ids(&c["input_ids"]))
        .collect();
    for (i, p) in prompts.iter().enumerate() {
        let got = full_logits(model, p);
        let exp = &want[&format!("prompt{i}")];
        assert_eq!(got.dims(), exp.dims());
        let diff: f32 = (got - exp)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        assert!(diff < 1e-4, "prompt{i}: max |logit diff| = {diff}");
    }
    prompts
}

#[test]
fn logits_match_transformers_within_1e4() {
    let Some(dir) = fixture() else { return };
    let ck = Checkpoint::open(dir.to_str().unwrap()).unwrap();
    let model = ck.load_transformer(&Device::Cpu, DType::F32).unwrap();
    assert_logits_match_transformers(&model, &dir);
}

#[test]
fn greedy_tokens_match_where_the_top2_gap_is_clear() {
    let Some(dir) = fixture() else { return };
    let ck = Checkpoint::open(dir.to_str().unwrap()).unwrap();
    let model = ck.load_transformer(&Device::Cpu, DType::F32).unwrap();
    assert_greedy_matches_transformers(&model, &dir);
}

/// Greedy decoding by full recompute gives transformers' tokens wherever the top-2 gap exceeds
/// 1e-3 (and may part ways after a closer call).
fn assert_greedy_matches_transformers(model: &Transformer, dir: &Path) {
    for case in expected(dir, "greedy.json").as_array().unwrap() {
        let mut seq = ids(&case["prompt_ids"]);
        let want = ids(&case["generated_ids"]);
        let gaps: Vec<f64> = case["top2_gaps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g.as_f64().unwrap())
            .collect();
        for (step, &w) in want.iter().enumerate() {
            let logits = full_logits(model, &seq);
            let last = logits.get(seq.len() - 1).unwrap();
            let next: u32 = last.argmax(0).unwrap().to_scalar().unwrap();
            if gaps[step] > 1e-3 {
                assert_eq!(next, w, "step {step} of {:?}", case["prompt"]);
            } else if next != w {
                break; // two correct implementations may part ways here
            }
            seq.push(w);
        }
    }
}

fn logits_of(model: &Transformer, seqs: &[&[u32]]) -> Vec<Vec<f32>> {
    let dev = Device::Cpu;
    let tokens: Vec<u32> = seqs.iter().flat_map(|s| s.iter().copied()).collect();
    let pos: Vec<u32> = seqs.iter().flat_map(|s| 0..s.len() as u32).collect();
    let mut attn = CausalAttention::new(seqs.iter().map(|s| s.len()).collect());
    model
        .forward(
            &Tensor::new(tokens.as_slice(), &dev).unwrap(),
            &Tensor::new(pos.as_slice(), &dev).unwrap(),
            &mut attn,
        )
        .unwrap()
        .to_vec2()
        .unwrap()
}

#[test]
fn inference_mode_logits_match_transformers_and_ignore_the_batch() {
    let Some(dir) = fixture() else { return };
    let ck = Checkpoint::open(dir.to_str().unwrap()).unwrap();
    let mut model = ck.load_transformer(&Device::Cpu, DType::F32).unwrap();
    model.set_fused_inference(true).unwrap();
    // fused kernels, stacked projections and the batch-invariant matmul: same logits
    let prompts = assert_logits_match_transformers(&model, &dir);
    for (i, p) in prompts.iter().enumerate() {
        // a sequence's rows are bit-identical alone and batched with others
        let alone = logits_of(&model, &[p]);
        let other = &prompts[(i + 1) % prompts.len()];
        // with more sequences behind, so that the batch is past the packed layer's threshold
        // for running its row-wise ops in parallel (the prompts alone are below it)
        let mut batch: Vec<&[u32]> = vec![other, p, &p[..1]];
        while batch.iter().map(|s| s.len()).sum::<usize>() * model.config().hidden_size < 5000 {
            batch.push(other);
        }
        assert!(p.len() * model.config().hidden_size < 4096);
        let batched = logits_of(&model, &batch);
        assert_eq!(
            alone,
            batched[other.len()..other.len() + p.len()],
            "prompt{i}"
        );
        assert_eq!(
            alone[0],
            batched[other.len() + p.len()],
            "prompt{i} first token"
        );
    }
}

#[test]
fn qwen3_5_logits_and_greedy_tokens_match_transformers() {
    let Some(dir) = fixture_named("tiny-qwen3_5") else {
        return;
    };
    let ck = Checkpoint::open(dir.to_str().unwrap()).unwrap();
    let c = &ck.config;
    assert_eq!(c.family, Family::Qwen3_5);
    assert_eq!(
        c.layer_kinds,
        [
            LayerKind::GatedDeltaNet,
            LayerKind::GatedDeltaNet,
            LayerKind::GatedDeltaNet,
            LayerKind::Attention
        ]
    );
    assert_eq!(
        (c.rotary_dim, c.weights_prefix.as_str()),
        (8, "model.language_model")
    );
    // what each layer keeps: keys and values in the last; a state slot in the others
    assert_eq!(c.kv_layers(), vec![3]);
    assert_eq!(c.kv_values_per_token(), 2 * 2 * 32);
    assert_eq!(c.state_values_per_seq(), 3 * (128 * 3 + 4 * 16 * 16));
    // the text weights are all a checkpoint of this config holds besides the vision tower
    let text: usize = init::weight_shapes(c)
        .iter()
        .map(|(_, s, _)| s.iter().product::<usize>())
        .sum();
    assert_eq!(c.num_params(), text);
    matches_transformers_on_both_paths(&dir);
}

/// The held-out Qwen3.5 variant (`tests/fixtures/qwen3_5-q35b`, in the repository): untied, bf16
/// shards, a full-attention layer every 3rd, one KV head, 1 key head for 3 value heads, dk != dv,
/// half the head rotated.
#[test]
fn qwen3_5_held_out_variant_matches_transformers() {
    let dir = q35b();
    let c = Checkpoint::open(dir.to_str().unwrap()).unwrap().config;
    assert!(!c.tie_word_embeddings);
    assert_eq!(c.kv_layers(), vec![2, 5]);
    assert_eq!((c.num_kv_heads, c.rotary_dim, c.head_dim), (1, 12, 24));
    let l = c.linear.unwrap();
    assert_eq!(
        (
            l.num_key_heads,
            l.num_value_heads,
            l.key_head_dim,
            l.value_head_dim
        ),
        (1, 3, 8, 12)
    );
    matches_transformers_on_both_paths(&dir);
}

/// The Qwen2 fixtures (`tests/fixtures/qwen2-a`: Qwen2.5-1.5B's layout in small, tied, fp32;
/// `qwen2-b`: DeepSeek-R1-Distill-Qwen's, untied, one KV head for four query heads, bf16 shards;
/// both made with `scripts/fixtures/make_fixtures.py`): q/k/v biases and no q/k norms, logits
/// and greedy tokens as transformers' on the candle and host paths, and Qwen2.5's chat template.
#[test]
fn qwen2_variants_match_transformers() {
    for (name, tied, kv) in [("qwen2-a", true, 2), ("qwen2-b", false, 1)] {
        let dir = repo_fixture(name);
        let c = Checkpoint::open(dir.to_str().unwrap()).unwrap().config;
        assert_eq!(c.family, crate::model::Family::Qwen2);
        assert!(c.attention_bias && !c.qk_norm, "{name}");
        assert_eq!(
            (c.tie_word_embeddings, c.num_kv_heads),
            (tied, kv),
            "{name}"
        );
        matches_transformers_on_both_paths(&dir);
        assert_chat_renderings_match(&dir);
    }
}

/// The Gemma 3 fixtures (`tests/fixtures/gemma3-a`: `gemma3_text`, tied f32, a 4-token window
/// beside a full layer, `query_pre_attn_scalar` 24 against head_dim 16, RoPE 1e4 / 1e6 by layer
/// type; `gemma3-b`: the multimodal layout with a vision tower, bf16 shards, one KV head of 24,
/// a 3-token window, linear RoPE x8 on the full layer): logits and greedy tokens as
/// transformers' on both paths (the windows are shorter than the prompts), and the chat
/// renderings.
#[test]
fn gemma3_variants_match_transformers() {
    use crate::model::{LayerKind, RopeScaling};
    for (name, window, kinds, prefix) in [
        ("gemma3-a", 4, "ssfs", "model"),
        ("gemma3-b", 3, "ssfss", "language_model.model"),
    ] {
        let dir = repo_fixture(name);
        let c = Checkpoint::open(dir.to_str().unwrap()).unwrap().config;
        assert_eq!(c.family, crate::model::Family::Gemma3);
        let want: Vec<_> = kinds
            .chars()
            .map(|k| match k {
                's' => LayerKind::SlidingAttention,
                _ => LayerKind::Attention,
            })
            .collect();
        assert_eq!(c.layer_kinds, want, "{name}");
        assert_eq!(c.sliding_window, Some(window), "{name}");
        assert_eq!(c.weights_prefix, prefix, "{name}");
        assert!(c.qk_norm && c.norm_offset && c.sandwich_norms && c.embed_scale);
        assert_eq!(c.sliding_rope.map(|r| r.theta), Some(10_000.0));
        assert_eq!(c.rope_theta, 1_000_000.0);
        if name == "gemma3-b" {
            assert_eq!(c.rope_scaling, Some(RopeScaling::Linear(8.0)));
        }
        // only the full layer keeps keys per token; the sliding ones a window's ring
        assert_eq!(c.kv_layers(), vec![2], "{name}");
        assert_eq!(
            c.state_values_per_seq(),
            (kinds.len() - 1) * 2 * window * c.num_kv_heads * c.head_dim
        );
        matches_transformers_on_both_paths(&dir);
        assert_chat_renderings_match(&dir);
    }
}

/// The Llama fixture (`tests/fixtures/llama`, the shared generator's `llama` variant: untied,
/// RoPE theta 5e5, the newer layout with `rope_parameters` and `chat_template.jinja`): logits and
/// greedy tokens as transformers' on both paths, and its chat renderings.
#[test]
fn llama_matches_transformers() {
    let dir = repo_fixture("llama");
    let c = Checkpoint::open(dir.to_str().unwrap()).unwrap().config;
    assert_eq!(c.family, crate::model::Family::Llama);
    assert!(!c.qk_norm && !c.attention_bias && !c.tie_word_embeddings);
    assert_eq!(c.rope_theta, 500_000.0);
    matches_transformers_on_both_paths(&dir);
    assert_chat_renderings_match(&dir);
}

/// A fixture made for this repository (`tests/fixtures/NAME`).
pub(crate) fn repo_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The held-out Qwen3.5 fixture's folder (in the repository).
pub(crate) fn q35b() -> PathBuf {
    repo_fixture("qwen3_5-q35b")
}

/// A fixture's logits and greedy tokens against transformers', on the candle path and the host
/// path (which is also batch-invariant).
fn matches_transformers_on_both_paths(dir: &Path) {
    let ck = Checkpoint::open(dir.to_str().unwrap()).unwrap();
    let mut model = ck.load_transformer(&Device::Cpu, DType::F32).unwrap();
    let dir = &dir.to_path_buf();
    assert_logits_match_transformers(&model, dir);
    assert_greedy_matches_transformers(&model, dir);
    // the host path (packed weights, the recurrent form token by token): the same logits, and
    // a sequence's rows bit-identical alone and batched with others
    model.set_fused_inference(true).unwrap();
    let prompts = assert_logits_match_transformers(&model, dir);
    let (p, other) = (&prompts[2], &prompts[0]);
    let alone = logits_of(&model, &[p]);
    let mut batch: Vec<&[u32]> = vec![other, p];
    while batch.iter().map(|s| s.len()).sum::<usize>() * model.config().hidden_size < 5000 {
        batch.push(other);
    }
    let batched = logits_of(&model, &batch);
    assert_eq!(alone, batched[other.len()..other.len() + p.len()]);
}

/// The Qwen3.5 loader on the layouts real checkpoints ship and the fixture does not: bf16
/// weights, sharded with an index, an untied LM head, and the text-only `qwen3_5_text` layout
/// (weights under `model.`, no vision tower). Each gives the logits of the fixture's weights
/// rounded to bf16 (written here as a tied, single-file f32 checkpoint).
#[test]
fn qwen3_5_loads_bf16_shards_untied_and_text_only_layouts() {
    let Some(dir) = fixture_named("tiny-qwen3_5") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let weights =
        candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let rounded = |t: &Tensor| {
        t.to_dtype(DType::BF16)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
    };
    let write = |name: &str, config: &Value, shards: Vec<HashMap<String, Tensor>>| {
        let out = tmp.path().join(name);
        std::fs::create_dir_all(&out).unwrap();
        for f in [
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
        ] {
            std::fs::copy(dir.join(f), out.join(f)).unwrap();
        }
        std::fs::write(out.join("config.json"), config.to_string()).unwrap();
        if shards.len() == 1 {
            candle_core::safetensors::save(&shards[0], out.join("model.safetensors")).unwrap();
        } else {
            let mut map = serde_json::Map::new();
            for (i, shard) in shards.iter().enumerate() {
                let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, shards.len());
                candle_core::safetensors::save(shard, out.join(&file)).unwrap();
                for n in shard.keys() {
                    map.insert(n.clone(), file.clone().into());
                }
            }
            let index = serde_json::json!({"metadata": {}, "weight_map": map});
            std::fs::write(out.join("model.safetensors.index.json"), index.to_string()).unwrap();
        }
        let ck = Checkpoint::open(out.to_str().unwrap()).unwrap();
        ck.load_transformer(&Device::Cpu, DType::F32).unwrap()
    };
    // the reference: f32 values rounded to bf16, tied, one file
    let reference: HashMap<String, Tensor> = weights
        .iter()
        .map(|(n, t)| (n.clone(), rounded(t)))
        .collect();
    let want = write("reference", &config, vec![reference]);
    // bf16, untied (a separate lm_head.weight), in three shards
    let mut untied = config.clone();
    untied["tie_word_embeddings"] = false.into();
    untied["text_config"]["tie_word_embeddings"] = false.into();
    untied["dtype"] = "bfloat16".into();
    let mut bf16: Vec<(String, Tensor)> = weights
        .iter()
        .map(|(n, t)| (n.clone(), t.to_dtype(DType::BF16).unwrap()))
        .collect();
    let embed = weights["model.language_model.embed_tokens.weight"].to_dtype(DType::BF16);
    bf16.push(("lm_head.weight".into(), embed.unwrap()));
    bf16.sort_by(|a, b| a.0.cmp(&b.0));
    let shards: Vec<HashMap<String, Tensor>> = bf16
        .chunks(bf16.len().div_ceil(3))
        .map(|c| c.iter().cloned().collect())
        .collect();
    assert_eq!(shards.len(), 3);
    let sharded = write("sharded", &untied, shards);
    assert!(!sharded.config().tie_word_embeddings);
    // text only: Qwen3_5ForCausalLM's flat config, weights under `model.`, no vision tower
    let mut text = config["text_config"].clone();
    text["model_type"] = "qwen3_5_text".into();
    let flat: HashMap<String, Tensor> = weights
        .iter()
        .filter(|(n, _)| n.starts_with("model.language_model."))
        .map(|(n, t)| (n.replace("model.language_model.", "model."), rounded(t)))
        .collect();
    let text_only = write("text-only", &text, vec![flat]);
    assert_eq!(text_only.config().weights_prefix, "model");
    let prompt = [41u32, 273, 317, 435, 295, 82, 220, 16, 21];
    let expect = full_logits(&want, &prompt);
    for (what, m) in [("bf16 shards, untied", &sharded), ("text only", &text_only)] {
        let d = max_abs_diff(&full_logits(m, &prompt), &expect);
        assert!(d < 1e-5, "{what}: max |logit diff| {d}");
    }
}
