//! `--engine mistralrs` (the `mistralrs` feature) on the tiny-qwen3 fixture, on the CPU: the
//! same Parquet schema as our engine, greedy tokens that agree with ours wherever the top-2 gap
//! is more than the two engines' numerical noise, the same raw log-probabilities, our per-sample
//! seeds (the same draws as ours), the thinking budget and stop strings through our
//! rules, resume after a kill, and the settings mistral.rs cannot honour refused by name.
//! `target_correct`'s cancel is tested on the engine itself (the fixture's answers are never
//! boxed, so no sample would be correct).

#![cfg(feature = "mistralrs")]

mod common;

use std::path::Path;

use candle_core::{DType, Device};
use common::*;
use selfdistill::data::schema::{read_completions, Completion};
use selfdistill::jobs::mistralrs::{Draws, MistralRsEngine, Options};
use selfdistill::jobs::sample::engine::SampleEngine;
use selfdistill::model::Checkpoint;
use selfdistill::sampler::engine::Request;
use selfdistill::sampler::params::SamplingParams;

/// `pipeline sample` on `rows` toy problems with the tiny-qwen3 fixture and raw prompts.
fn sample(
    dir: &Path,
    rows: usize,
    engine: &str,
    extra: &[&str],
    out: &str,
) -> std::process::Output {
    sample_with(
        &shared("fixtures/tiny-qwen3").unwrap(),
        dir,
        rows,
        engine,
        extra,
        out,
    )
}

/// [`sample`] with `model`.
fn sample_with(
    model: &Path,
    dir: &Path,
    rows: usize,
    engine: &str,
    extra: &[&str],
    out: &str,
) -> std::process::Output {
    let input = toy_problems(dir, rows);
    bin()
        .args(["sample", "--model", model.to_str().unwrap()])
        .args([
            "--input",
            input.to_str().unwrap(),
            "--answer-field",
            "answer",
        ])
        .args([
            "--prompt-template",
            "raw",
            "--output",
            out,
            "--engine",
            engine,
        ])
        .args(extra)
        .current_dir(dir)
        .output()
        .unwrap()
}

fn by_key(mut rows: Vec<Completion>) -> Vec<Completion> {
    rows.sort_by(|a, b| (&a.problem_id, a.sample_index).cmp(&(&b.problem_id, b.sample_index)));
    rows
}

fn ids(r: &Completion) -> &[i32] {
    r.completion_token_ids.as_deref().unwrap()
}

fn arrow_schema(path: &Path) -> arrow_schema::Schema {
    let f = std::fs::File::open(path).unwrap();
    let b = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f).unwrap();
    let s = b.schema();
    arrow_schema::Schema::new(s.fields().clone())
}

/// Logits of the two engines differ by float noise only; a greedy divergence must sit at a
/// near-tie of our top two.
const TIE: f32 = 1e-3;

#[test]
fn greedy_tokens_agree_with_ours_where_the_top2_gap_allows_and_the_parquet_is_the_same() {
    let Some(model) = shared("fixtures/tiny-qwen3") else {
        return;
    };
    greedy_tokens_agree(&model);
}

/// The Qwen2 fixtures (q/k/v biases; tied fp32, and untied bf16 shards with one KV head) through
/// mistral.rs's Qwen2 model: the same greedy tokens and log-probabilities as ours.
#[test]
fn qwen2_greedy_tokens_agree_with_ours() {
    for name in ["qwen2-a", "qwen2-b"] {
        greedy_tokens_agree(
            &Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures")
                .join(name),
        );
    }
}

/// The Gemma 3 fixtures through mistral.rs's Gemma 3, with their windows lifted past prompt
/// plus generation (64 tokens): the same greedy tokens and log-probabilities as ours, so the
/// sandwich norms, gelu-tanh, scaled embeddings, `query_pre_attn_scalar` and RoPE by layer type
/// (linear x8 on gemma3-b's full layer) agree. Within a binding window they cannot: mistral.rs
/// 0.8.1's prefill mask lets a sliding layer's query see `sliding_window + 1` keys (`j +
/// sliding_window < i` masked; transformers, whose logits ours equal, masks `i - j >=
/// sliding_window`), and its decode steps follow yet another count, so no window given to it
/// reproduces transformers' model (with the fixtures' windows the first token's log-probability
/// is -4.467 there against transformers' and our -4.340). The sample job warns of it.
///
/// mistral.rs reads the layout the hub's Gemma 3 checkpoints ship (transformers 4.50:
/// `sliding_window_pattern`, `rope_theta`, `rope_local_base_freq`, `rope_scaling`), not the
/// fixtures' (transformers 5: `layer_types`, `rope_parameters` by layer type): each fixture is
/// copied with its config in that layout, which our reader takes for the same model.
#[test]
fn gemma3_greedy_tokens_agree_with_ours() {
    for name in ["gemma3-a", "gemma3-b"] {
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        let tmp = tempfile::tempdir().unwrap();
        let dst = tmp.path().join(name);
        std::fs::create_dir(&dst).unwrap();
        for e in std::fs::read_dir(&src).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() {
                std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
            }
        }
        let mut config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
        let text = match config.get_mut("text_config") {
            Some(t) => t,
            None => &mut config,
        };
        let t = text.as_object_mut().unwrap();
        let rope = t.remove("rope_parameters").unwrap();
        t.remove("layer_types");
        t.remove("_sliding_window_pattern");
        // layers [sliding, sliding, full, sliding(, sliding)]: every third is full
        t.insert("sliding_window_pattern".into(), 3.into());
        let full = &rope["full_attention"];
        t.insert("rope_theta".into(), full["rope_theta"].clone());
        t.insert(
            "rope_local_base_freq".into(),
            rope["sliding_attention"]["rope_theta"].clone(),
        );
        if full["rope_type"] == "linear" {
            let scaling = serde_json::json!({"rope_type": "linear", "factor": full["factor"]});
            t.insert("rope_scaling".into(), scaling);
        }
        std::fs::write(dst.join("config.json"), config.to_string()).unwrap();
        let ours = |d: &Path| Checkpoint::open(d.to_str().unwrap()).unwrap().config;
        assert_eq!(
            ours(&dst),
            ours(&src),
            "{name}: the same model in the older layout"
        );
        let text = match config.get_mut("text_config") {
            Some(t) => t,
            None => &mut config,
        };
        text["sliding_window"] = 64.into();
        std::fs::write(dst.join("config.json"), config.to_string()).unwrap();
        hub_vision_names(&dst);
        greedy_tokens_agree(&dst);
    }
}

/// The vision tower's tensors of a multimodal Gemma 3 copy renamed as the hub's checkpoints
/// (and mistral.rs) name them: transformers 5.24 saves `vision_tower.embeddings...`, the hub's
/// files hold `vision_tower.vision_model.embeddings...`. Our loader reads neither.
fn hub_vision_names(dir: &Path) {
    let index = dir.join("model.safetensors.index.json");
    if !index.exists() {
        return;
    }
    let rename = |n: &str| match n.strip_prefix("vision_tower.") {
        Some(rest) if !rest.starts_with("vision_model.") => {
            format!("vision_tower.vision_model.{rest}")
        }
        _ => n.to_string(),
    };
    let mut idx: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
    let map = idx["weight_map"].as_object().unwrap().clone();
    let files: std::collections::BTreeSet<String> = map
        .values()
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    for f in &files {
        let tensors = candle_core::safetensors::load(dir.join(f), &Device::Cpu).unwrap();
        let renamed: std::collections::HashMap<String, candle_core::Tensor> =
            tensors.into_iter().map(|(n, t)| (rename(&n), t)).collect();
        candle_core::safetensors::save(&renamed, dir.join(f)).unwrap();
    }
    let renamed: serde_json::Map<String, serde_json::Value> =
        map.into_iter().map(|(n, f)| (rename(&n), f)).collect();
    idx["weight_map"] = renamed.into();
    std::fs::write(&index, idx.to_string()).unwrap();
}

/// Greedy samples of `model` by both engines: the same tokens and raw log-probabilities until a
/// near-tie of our top two, and the same Parquet schema.
fn greedy_tokens_agree(model: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let greedy = [
        "--temperature",
        "0",
        "--max-new-tokens",
        "24",
        "--logprobs",
        "2",
    ];
    let o = sample_with(
        model,
        dir.path(),
        20,
        "selfdistill",
        &greedy,
        "ours.parquet",
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = sample_with(
        model,
        dir.path(),
        20,
        "mistralrs",
        &greedy,
        "theirs.parquet",
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("preemptions not reported by the engine"),
        "{}",
        text(&o)
    );
    assert!(text(&o).contains("one sequence at a time"), "{}", text(&o));
    let (po, pt) = (
        dir.path().join("ours.parquet"),
        dir.path().join("theirs.parquet"),
    );
    assert_eq!(arrow_schema(&po), arrow_schema(&pt));
    let ours = by_key(read_completions(&po).unwrap());
    let theirs = by_key(read_completions(&pt).unwrap());
    assert_eq!(ours.len(), 20);
    assert_eq!(theirs.len(), 20);
    let (mut same, mut compared) = (0, 0);
    for (a, b) in ours.iter().zip(&theirs) {
        assert_eq!(
            (&a.problem_id, a.sample_index),
            (&b.problem_id, b.sample_index)
        );
        assert_eq!(a.prompt_token_ids, b.prompt_token_ids);
        assert!(b.grade.is_some());
        assert_ne!(
            a.sampling_hash, b.sampling_hash,
            "the engine is part of the hash"
        );
        let (la, lb) = (a.logprobs.as_ref().unwrap(), b.logprobs.as_ref().unwrap());
        let (ta, tb) = (ids(a), ids(b));
        assert_eq!(lb.token.len(), tb.len());
        let common = ta.iter().zip(tb).take_while(|(x, y)| x == y).count();
        for i in 0..common {
            // the same raw log-probabilities: the two engines' logits agree
            let (x, y) = (la.token[i].unwrap(), lb.token[i].unwrap());
            assert!(
                (x - y).abs() < TIE,
                "{} token {i}: {x} vs {y}",
                a.problem_id
            );
            compared += 1;
        }
        if common == ta.len() && common == tb.len() {
            assert_eq!(a.completion, b.completion);
            assert_eq!(a.finish_reason, b.finish_reason);
            same += 1;
        } else if common < ta.len().min(tb.len()) {
            let gap = la.top[common][0] - la.top[common][1];
            assert!(
                gap < TIE,
                "{}: the engines diverge at token {common} where our top-2 gap is {gap}",
                a.problem_id
            );
        } else {
            panic!(
                "{}: one engine stopped where the other went on",
                a.problem_id
            );
        }
    }
    assert!(same >= 15, "only {same} of 20 greedy samples are identical");
    assert!(compared > 200, "{compared}");
}

#[test]
fn seeded_samples_are_ours_and_our_stop_rules_hold() {
    if shared("fixtures/tiny-qwen3").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sampled = [
        "--n",
        "3",
        "--temperature",
        "0.8",
        "--top-p",
        "0.95",
        "--seed",
        "7",
        "--max-new-tokens",
        "10",
    ];
    let run = |seqs: &str, out: &str| {
        let o = sample(
            dir.path(),
            12,
            "mistralrs",
            &[&sampled[..], &["--max-num-seqs", seqs]].concat(),
            out,
        );
        assert!(o.status.success(), "{}", text(&o));
        by_key(read_completions(&dir.path().join(out)).unwrap())
    };
    // (on the CPU mistral.rs runs one sequence at a time whatever max_num_seqs says)
    let one = run("16", "one.parquet");
    assert_eq!(one.len(), 36);
    let key = |rows: &[Completion]| rows.iter().map(|r| ids(r).to_vec()).collect::<Vec<_>>();
    // our engine draws with the same per-sample seeds: the same tokens, but where the two
    // engines' logits, equal to float noise, straddle a draw's threshold
    let o = sample(dir.path(), 12, "selfdistill", &sampled, "ours.parquet");
    assert!(o.status.success(), "{}", text(&o));
    let ours = by_key(read_completions(&dir.path().join("ours.parquet")).unwrap());
    let same = key(&ours)
        .iter()
        .zip(key(&one))
        .filter(|(a, b)| **a == *b)
        .count();
    assert!(same >= 34, "only {same} of 36 seeded samples match ours");

    // a stop string ends a sample where it starts, as ours does; the token mistral.rs was
    // handed to stop is not part of it
    let word = {
        let c = &one[0].completion;
        c.split_whitespace().next().unwrap_or(c).to_string()
    };
    let stop = [&sampled[..], &["--stop", &word]].concat();
    for (engine, out) in [("selfdistill", "so.parquet"), ("mistralrs", "st.parquet")] {
        let o = sample(dir.path(), 12, engine, &stop, out);
        assert!(o.status.success(), "{}", text(&o));
    }
    let so = by_key(read_completions(&dir.path().join("so.parquet")).unwrap());
    let st = by_key(read_completions(&dir.path().join("st.parquet")).unwrap());
    let stopped = st.iter().filter(|r| !r.completion.contains(&word)).count();
    assert_eq!(stopped, st.len(), "a stop string is cut off");
    let agree = key(&so)
        .iter()
        .zip(key(&st))
        .filter(|(a, b)| **a == *b)
        .count();
    assert!(agree >= 34, "stop strings: {agree} of 36 match ours");
}

#[test]
fn thinking_budget_and_resume_after_a_kill_run_through_our_rules() {
    if shared("fixtures/tiny-qwen3").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The thinking budget: after 3 tokens without `</think>` the closing text goes in, token by
    // token, and the sample answers within the rest of max_new_tokens.
    let think = [
        "--temperature",
        "0",
        "--max-new-tokens",
        "12",
        "--max-thinking-tokens",
        "3",
    ];
    for (engine, out) in [("selfdistill", "to.parquet"), ("mistralrs", "tt.parquet")] {
        let o = sample(dir.path(), 6, engine, &think, out);
        assert!(o.status.success(), "{}", text(&o));
    }
    let to = by_key(read_completions(&dir.path().join("to.parquet")).unwrap());
    let tt = by_key(read_completions(&dir.path().join("tt.parquet")).unwrap());
    let mut same = 0;
    for (a, b) in to.iter().zip(&tt) {
        assert!(b.completion.contains("</think>"), "{:?}", b.completion);
        if ids(a) == ids(b) {
            assert_eq!(a.finish_reason, b.finish_reason);
            same += 1;
        }
    }
    assert!(same >= 5, "thinking budget: {same} of 6 match ours");

    // Killed after its first committed part, the run resumes to the uninterrupted rows.
    let sampled = [
        "--n",
        "2",
        "--temperature",
        "0.8",
        "--seed",
        "3",
        "--max-new-tokens",
        "8",
    ];
    let o = sample(dir.path(), 20, "mistralrs", &sampled, "clean.parquet");
    assert!(o.status.success(), "{}", text(&o));
    let killed = bin()
        .args(["sample", "--model"])
        .arg(shared("fixtures/tiny-qwen3").unwrap())
        .args(["--input", "problems.jsonl", "--answer-field", "answer"])
        .args(["--prompt-template", "raw", "--output", "killed.parquet"])
        .args(["--engine", "mistralrs"])
        .args(sampled)
        .env(selfdistill::fault::ENV, "sample.part:1")
        .current_dir(dir.path())
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(killed.status.signal(), Some(9), "{}", text(&killed));
    assert!(!dir.path().join("killed.parquet").exists());
    let o = sample(dir.path(), 20, "mistralrs", &sampled, "killed.parquet");
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains("(0 resumed)"), "{}", text(&o));
    let clean = by_key(read_completions(&dir.path().join("clean.parquet")).unwrap());
    let resumed = by_key(read_completions(&dir.path().join("killed.parquet")).unwrap());
    assert_eq!(clean.len(), 40);
    let key = |rows: &[Completion]| {
        rows.iter()
            .map(|r| (r.problem_id.clone(), r.sample_index, ids(r).to_vec()))
            .collect::<Vec<_>>()
    };
    assert_eq!(key(&clean), key(&resumed));
}

/// `pipeline eval --engine mistralrs` over two sets: mistral.rs runs one job at a time, so each
/// set gets its own run (ours shares one engine between the sets), and both are evaluated.
#[test]
fn eval_on_mistralrs_runs_each_set_on_its_own() {
    let Some(model) = shared("fixtures/tiny-qwen3") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let input = toy_problems(dir.path(), 3);
    for (name, n) in [("one", 2), ("two", 1)] {
        std::fs::write(
            dir.path().join(format!("{name}.toml")),
            format!(
                "[source]\nname = \"{name}\"\nformat = \"mapped\"\npath = \"{}\"\n\
                 problem_field = \"problem\"\nanswer_field = \"answer\"\n\
                 [sample]\nprompt_template = \"raw\"\nn = {n}\ntemperature = 0.7\n\
                 max_new_tokens = 4\n",
                input.display()
            ),
        )
        .unwrap();
    }
    let o = bin()
        .args(["eval", "--model", model.to_str().unwrap()])
        .args(["--sets", "one.toml,two.toml", "--engine", "mistralrs"])
        .args(["--output", "out"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let log = text(&o);
    assert_eq!(log.matches("the model loaded once").count(), 2, "{log}");
    let slug = selfdistill::eval::model_slug(model.to_str().unwrap());
    for (name, n) in [("one", 2), ("two", 1)] {
        let rows = read_completions(
            &dir.path()
                .join("out")
                .join(&slug)
                .join(name)
                .join("samples.parquet"),
        )
        .unwrap();
        assert_eq!(rows.len(), 3 * n, "{name}");
    }
}

#[test]
fn settings_mistralrs_cannot_honour_are_refused_by_name() {
    if shared("fixtures/tiny-qwen3").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (flags, key) in [
        (&["--ignore-eos"][..], "ignore_eos"),
        (
            &["--max-num-batched-tokens", "512"][..],
            "max_num_batched_tokens",
        ),
        (&["--kv-cache", "4 MiB"][..], "kv_cache"),
        (&["--block-size", "32"][..], "block_size"),
    ] {
        let o = sample(dir.path(), 2, "mistralrs", flags, "x.parquet");
        assert!(!o.status.success(), "{flags:?}");
        let flag = format!("--{}", key.replace('_', "-"));
        assert!(
            text(&o).contains(key) || text(&o).contains(&flag),
            "{flags:?}: {}",
            text(&o)
        );
        assert!(!dir.path().join("x.parquet").exists());
    }
}

/// The adapter on the tiny-qwen3 fixture (skipped without `../shared`).
fn engine(max_num_seqs: usize, max_new_tokens: usize) -> Option<MistralRsEngine> {
    let dir = shared("fixtures/tiny-qwen3")?;
    let ck = Checkpoint::open(dir.to_str().unwrap()).unwrap();
    let opts = Options {
        model_dir: ck.dir.clone(),
        device: Device::Cpu,
        dtype: DType::F32,
        max_num_seqs,
        block_size: 16,
        kv_cache_bytes: None,
        kv_fp8: false,
        context: 64,
    };
    let draws = Draws {
        params: SamplingParams {
            temperature: 1.0,
            max_new_tokens,
            seed: 5,
            ..SamplingParams::default()
        },
        eos_token_ids: ck.eos_token_ids().unwrap(),
        thinking: None,
    };
    Some(MistralRsEngine::new(&opts, draws, ck.tokenizer().unwrap()).unwrap())
}

#[test]
fn a_cancel_drops_the_unsent_and_running_samples_and_keeps_finished_ones() {
    let Some(mut e) = engine(1, 16) else {
        return;
    };
    let prompt = vec![10, 20, 30, 40];
    let r = e
        .add(Request {
            problem_id: "p".into(),
            prompt: prompt.clone(),
            n: 6,
            settings: None,
        })
        .unwrap();
    let other = e
        .add(Request {
            problem_id: "q".into(),
            prompt,
            n: 2,
            settings: None,
        })
        .unwrap();
    // one sequence at a time, two in flight: when the first sample is back, at least three
    // have not been sent
    let mut got = Vec::new();
    while got.is_empty() {
        got = e.step(None).unwrap();
    }
    assert!(got.iter().all(|s| s.request == r));
    let cancelled = e.cancel(r);
    assert!(cancelled >= 3, "{cancelled}");
    let mut rest = Vec::new();
    while !e.is_idle() {
        rest.extend(e.step(None).unwrap());
    }
    let of_r = got.len() + rest.iter().filter(|s| s.request == r).count();
    assert_eq!(
        of_r as u64 + cancelled,
        6,
        "each sample finished or cancelled once"
    );
    assert_eq!(rest.iter().filter(|s| s.request == other).count(), 2);
    assert!(rest
        .iter()
        .all(|s| !s.tokens.is_empty() && s.tokens.len() <= 16));
    assert!(e.generated_tokens() as usize >= got[0].tokens.len());
}
