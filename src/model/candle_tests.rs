//! Our model against a second, independent implementation: candle-transformers' Qwen2, Qwen3,
//! Llama and Gemma 3 (a dev-dependency on our candle version), on the fixtures transformers made. Every
//! prompt's last-position logits agree within f32 rounding, so a mistake shared by our code and
//! our reading of the transformers fixtures would still show here.
//!
//! candle-transformers reads its own config structs: the fixtures' `config.json` is given to
//! them as their fields expect (the newer layout's `rope_parameters` flattened to `rope_theta`,
//! Qwen2's unused `sliding_window` given a number), which changes no value the models use.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use serde_json::Value;

use super::tests::{fixture, full_logits, ids, max_abs_diff, repo_fixture};
use super::*;

/// The fixtures' prompts (their `expected/tokenize.json`).
fn prompts(dir: &Path) -> Vec<Vec<u32>> {
    let v: Value =
        serde_json::from_slice(&std::fs::read(dir.join("expected/tokenize.json")).unwrap())
            .unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|c| ids(&c["input_ids"]))
        .collect()
}

/// `config.json` as candle-transformers' structs read it.
fn candle_config(dir: &Path) -> Value {
    let mut v: Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let o = v.as_object_mut().unwrap();
    if let Some(theta) = o
        .get("rope_parameters")
        .and_then(|r| r.get("rope_theta"))
        .cloned()
    {
        o.insert("rope_theta".into(), theta);
    }
    if o.get("sliding_window").is_none_or(Value::is_null) {
        o.insert("sliding_window".into(), 4096.into());
    }
    o.entry("max_window_layers").or_insert(0.into());
    o.entry("use_sliding_window").or_insert(false.into());
    v
}

/// The fixture's weights, in f32, for candle-transformers.
fn weights(dir: &Path) -> VarBuilder<'static> {
    let ck = Checkpoint::open(dir.to_str().unwrap()).unwrap();
    // SAFETY: read-only maps of the fixture's files, which no test writes.
    unsafe { VarBuilder::from_mmaped_safetensors(&ck.weights, DType::F32, &Device::Cpu) }.unwrap()
}

/// Our last-position logits of each prompt against `theirs(prompt)`'s, within `tol`.
fn agree(dir: &Path, tol: f32, mut theirs: impl FnMut(&Tensor) -> Tensor) {
    let ck = Checkpoint::open(dir.to_str().unwrap()).unwrap();
    let ours = ck.load_transformer(&Device::Cpu, DType::F32).unwrap();
    let mut worst = 0f32;
    for (i, p) in prompts(dir).iter().enumerate() {
        let all = full_logits(&ours, p);
        let last = all.get(p.len() - 1).unwrap();
        let input = Tensor::new(p.as_slice(), &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let reference = theirs(&input).flatten_all().unwrap();
        let diff = max_abs_diff(&last, &reference);
        worst = worst.max(diff);
        assert!(
            diff < tol,
            "{} prompt{i}: max |logit diff| {diff} against candle-transformers",
            dir.display()
        );
    }
    eprintln!(
        "{}: candle-transformers' logits within {worst:.1e}",
        dir.display()
    );
}

/// f32 rounding over a forward of these sizes, in another summation order: measured within
/// 2.1e-6 on every fixture (qwen2-b; 9.5e-7 to 1.4e-6 on the others).
const TOL: f32 = 1e-5;

#[test]
fn qwen3_logits_equal_candle_transformers() {
    let Some(dir) = fixture() else { return };
    let cfg: candle_transformers::models::qwen3::Config =
        serde_json::from_value(candle_config(&dir)).unwrap();
    let mut m =
        candle_transformers::models::qwen3::ModelForCausalLM::new(&cfg, weights(&dir)).unwrap();
    agree(&dir, TOL, |x| {
        m.clear_kv_cache();
        m.forward(x, 0).unwrap()
    });
}

#[test]
fn qwen2_logits_equal_candle_transformers() {
    for name in ["qwen2-a", "qwen2-b"] {
        let dir = repo_fixture(name);
        let cfg: candle_transformers::models::qwen2::Config =
            serde_json::from_value(candle_config(&dir)).unwrap();
        let mut m =
            candle_transformers::models::qwen2::ModelForCausalLM::new(&cfg, weights(&dir)).unwrap();
        agree(&dir, TOL, |x| {
            m.clear_kv_cache();
            m.forward(x, 0).unwrap()
        });
    }
}

#[test]
fn llama_logits_equal_candle_transformers() {
    let dir = repo_fixture("llama");
    let cfg: candle_transformers::models::llama::LlamaConfig =
        serde_json::from_value(candle_config(&dir)).unwrap();
    let cfg = cfg.into_config(false);
    let m = candle_transformers::models::llama::Llama::load(weights(&dir), &cfg).unwrap();
    agree(&dir, TOL, |x| {
        let mut cache =
            candle_transformers::models::llama::Cache::new(false, DType::F32, &cfg, &Device::Cpu)
                .unwrap();
        m.forward(x, 0, &mut cache).unwrap()
    });
}

/// Gemma 3 (gemma3-a: `gemma3_text`, sliding layers of a 4-token window beside a full one),
/// given to candle-transformers' Gemma 3 in the older layout it reads (`sliding_window_pattern`,
/// `rope_local_base_freq`). Its prefill cannot be the reference: its rotating KV cache refuses
/// a prompt longer than the window in one call (it appends the values' non-contiguous
/// transpose), and its prefill mask lets a query see `sliding_window + 1` keys (`j +
/// sliding_window < i` masked; transformers masks `i - j >= sliding_window`, and its own decode
/// path keeps `sliding_window`). So the prompt goes in a token at a time, through the rotating
/// cache, which agrees with transformers. It also scales scores by `1 / sqrt(head_dim)` whatever
/// `query_pre_attn_scalar` says (equal in the published Gemma 3 models, not in the fixture: 16
/// and 24): its q-norm weights are given as `(1 + w) * sqrt(16 / 24) - 1`, which scales its
/// queries, hence its scores, by exactly what the scalar asks. gemma3-b is not compared:
/// candle-transformers has neither linear RoPE scaling nor the multimodal layout.
#[test]
fn gemma3_logits_equal_candle_transformers() {
    let dir = repo_fixture("gemma3-a");
    let ours = Checkpoint::open(dir.to_str().unwrap()).unwrap().config;
    let mut v = candle_config(&dir);
    let o = v.as_object_mut().unwrap();
    let rope = o["rope_parameters"].clone();
    o.insert(
        "rope_theta".into(),
        rope["full_attention"]["rope_theta"].clone(),
    );
    o.insert(
        "rope_local_base_freq".into(),
        rope["sliding_attention"]["rope_theta"].clone(),
    );
    // layers [sliding, sliding, full, sliding]: every third is full
    o.insert("sliding_window_pattern".into(), 3.into());
    o.insert("sliding_window".into(), ours.sliding_window.unwrap().into());
    let cfg: candle_transformers::models::gemma3::Config = serde_json::from_value(v).unwrap();
    let ck = Checkpoint::open(dir.to_str().unwrap()).unwrap();
    let mut tensors = candle_core::safetensors::load(&ck.weights[0], &Device::Cpu).unwrap();
    let c = (ours.head_dim as f64 / ours.query_pre_attn_scalar.unwrap()).sqrt();
    for (name, t) in tensors.iter_mut() {
        if name.ends_with("q_norm.weight") {
            *t = t.affine(1.0, 1.0).unwrap().affine(c, -1.0).unwrap();
        }
    }
    let vb = VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu);
    let mut m = candle_transformers::models::gemma3::Model::new(false, &cfg, vb).unwrap();
    agree(&dir, TOL, |x| {
        m.clear_kv_cache();
        let n = x.dim(1).unwrap();
        let mut last = None;
        for i in 0..n {
            last = Some(m.forward(&x.narrow(1, i, 1).unwrap(), i).unwrap());
        }
        last.unwrap()
    });
}
