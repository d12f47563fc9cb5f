//! Greedy decoding through the paged cache (chunked prefill, mixed prefill/decode steps, prefix
//! sharing with copy on write, preemption by recompute) gives the tokens of a full recompute at
//! every step: on the tiny-qwen3 fixture and on a random tiny Llama with one KV head, a head_dim
//! unlike hidden/heads and untied embeddings, with block size 4 so blocks fill and spill.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

use super::block_pool::{BlockPool, BlockTable};
use super::kv_cache::{KvCache, PagedAttention, SeqStep};
use super::state_slots::StateSlots;
use crate::model::attention::CausalAttention;
use crate::model::{Checkpoint, ModelConfig, Transformer};

/// Argmax and the top-1/top-2 gap of each next-token distribution, by full recompute.
fn reference_greedy(model: &Transformer, prompt: &[u32], steps: usize) -> Vec<(u32, f32)> {
    let mut seq = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..steps {
        let logits = full_last_logits(model, &seq);
        let (best, gap) = argmax_gap(&logits);
        out.push((best, gap));
        seq.push(best);
    }
    out
}

fn full_last_logits(model: &Transformer, seq: &[u32]) -> Vec<f32> {
    let dev = Device::Cpu;
    let tokens = Tensor::new(seq, &dev).unwrap();
    let pos: Vec<u32> = (0..seq.len() as u32).collect();
    let pos = Tensor::new(pos.as_slice(), &dev).unwrap();
    let mut attn = CausalAttention::new(vec![seq.len()]);
    let h = model.forward_hidden(&tokens, &pos, &mut attn).unwrap();
    let last = h.get(seq.len() - 1).unwrap().unsqueeze(0).unwrap();
    model
        .logits(&last)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn argmax_gap(logits: &[f32]) -> (u32, f32) {
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    (idx[0] as u32, logits[idx[0]] - logits[idx[1]])
}

struct Seq {
    tokens: Vec<u32>,
    prompt_len: usize,
    table: BlockTable,
    num_computed: usize,
    /// Forced next tokens (teacher forcing), used before greedy choices.
    forced: Vec<u32>,
}

impl Seq {
    fn new(prompt: &[u32]) -> Seq {
        Seq {
            tokens: prompt.to_vec(),
            prompt_len: prompt.len(),
            table: BlockTable::default(),
            num_computed: 0,
            forced: Vec::new(),
        }
    }
    fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }
}

/// One engine step under the vLLM rule: each sequence gets up to `chunk` of its uncomputed
/// tokens; sequences whose tokens are all computed after the step sample one more.
fn step(
    model: &Transformer,
    cache: &mut KvCache,
    pool: &mut BlockPool,
    seqs: &mut [Seq],
    chunk: usize,
    steps: usize,
) {
    let bs = cache.block_size;
    let mut sched = Vec::new();
    for (i, s) in seqs.iter_mut().enumerate() {
        if s.generated().len() >= steps {
            continue;
        }
        let n = (s.tokens.len() - s.num_computed).min(chunk);
        let cow = s
            .table
            .reserve(pool, s.num_computed, n, bs)
            .expect("pool large enough");
        if let Some(c) = cow {
            cache.copy_block(c.src, c.dst);
        }
        sched.push((i, n));
    }
    if sched.is_empty() {
        return;
    }
    let mut toks = Vec::new();
    let mut pos = Vec::new();
    for &(i, n) in &sched {
        let s = &seqs[i];
        toks.extend_from_slice(&s.tokens[s.num_computed..s.num_computed + n]);
        pos.extend((s.num_computed..s.num_computed + n).map(|p| p as u32));
    }
    let dev = Device::Cpu;
    let hidden = {
        let mut attn = PagedAttention::new(
            cache,
            sched
                .iter()
                .map(|&(i, n)| SeqStep {
                    block_table: &seqs[i].table,
                    start_pos: seqs[i].num_computed,
                    num_new: n,
                })
                .collect(),
        );
        model
            .forward_hidden(
                &Tensor::new(toks.as_slice(), &dev).unwrap(),
                &Tensor::new(pos.as_slice(), &dev).unwrap(),
                &mut attn,
            )
            .unwrap()
    };
    let mut row = 0;
    for &(i, n) in &sched {
        row += n;
        let s = &mut seqs[i];
        s.num_computed += n;
        if s.num_computed == s.tokens.len() {
            let h = hidden.get(row - 1).unwrap().unsqueeze(0).unwrap();
            let logits: Vec<f32> = model
                .logits(&h)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let next = if s.forced.is_empty() {
                argmax_gap(&logits).0
            } else {
                s.forced.remove(0)
            };
            s.tokens.push(next);
        }
    }
}

/// Compares greedy tokens while the reference's choice is clear (top-2 gap above 1e-4).
fn assert_same(got: &[u32], want: &[(u32, f32)], what: &str) {
    for (k, (&g, &(w, gap))) in got.iter().zip(want).enumerate() {
        if gap < 1e-4 {
            return;
        }
        assert_eq!(g, w, "{what}: step {k} differs (gap {gap})");
    }
}

fn check_model(model: &Transformer, prompts: &[Vec<u32>], steps: usize) {
    let cfg = model.config().clone();
    let refs: Vec<_> = prompts
        .iter()
        .map(|p| reference_greedy(model, p, steps))
        .collect();
    let bs = 4;
    let mut pool = BlockPool::new(256);
    let mut cache = KvCache::new(&cfg, bs, 256);
    let mut seqs: Vec<Seq> = prompts.iter().map(|p| Seq::new(p)).collect();
    // A forked sample of prompt 0 that is forced off the greedy path at its first token.
    let forced_first = {
        let logits = full_last_logits(model, &prompts[0]);
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        idx[1] as u32
    };
    let mut forked = false;
    for t in 0..200 {
        // Fork sequence 0 once its prompt is in the cache (prefix sharing, copy on write).
        if !forked && seqs[0].num_computed >= seqs[0].prompt_len {
            let s0 = &seqs[0];
            let mut f = Seq {
                tokens: s0.tokens[..s0.prompt_len].to_vec(),
                prompt_len: s0.prompt_len,
                table: s0.table.fork(&mut pool),
                num_computed: s0.prompt_len,
                forced: vec![forced_first],
            };
            // The forked sequence re-reads the last prompt token to get its own logits.
            f.num_computed -= 1;
            seqs.push(f);
            forked = true;
        }
        // Preempt sequence 1 midway: free its blocks, recompute prompt + generated tokens.
        if t == 6 && seqs.len() > 1 {
            let s = &mut seqs[1];
            s.table.free(&mut pool);
            s.num_computed = 0;
        }
        step(model, &mut cache, &mut pool, &mut seqs, 5, steps);
        if seqs.iter().all(|s| s.generated().len() >= steps) {
            break;
        }
    }
    for (i, s) in seqs.iter().enumerate().take(prompts.len()) {
        assert_eq!(s.generated().len(), steps, "sequence {i} did not finish");
        assert_same(s.generated(), &refs[i], &format!("prompt {i}"));
    }
    let f = seqs.last().unwrap();
    let mut forced_prompt = prompts[0].clone();
    forced_prompt.push(forced_first);
    let want = reference_greedy(model, &forced_prompt, steps - 1);
    assert_eq!(f.generated()[0], forced_first);
    assert_same(&f.generated()[1..], &want, "forked sample");
    for s in seqs.iter_mut() {
        s.table.free(&mut pool);
    }
    assert_eq!(pool.num_free(), 256, "every block returns to the pool");
}

#[test]
fn paged_greedy_equals_full_recompute_on_the_fixture() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/tiny-qwen3");
    if !dir.exists() {
        assert!(!std::env::var("SELFDISTILL_REQUIRE_SHARED").is_ok_and(|v| v == "1"));
        return;
    }
    let model = Checkpoint::open(dir.to_str().unwrap())
        .unwrap()
        .load_transformer(&Device::Cpu, DType::F32)
        .unwrap();
    let prompts = vec![
        vec![
            41, 273, 317, 435, 295, 82, 220, 16, 21, 358, 220, 18, 358, 220, 19, 277, 220,
        ],
        vec![87],
        vec![308, 434, 82, 86, 265, 305, 365, 65, 78],
    ];
    check_model(&model, &prompts, 12);
}

/// Deterministic pseudo-random weights (SplitMix64), scaled like an initialised model.
fn random_weights(cfg: &ModelConfig, seed: u64) -> HashMap<String, Tensor> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0
    };
    let mut w = HashMap::new();
    let mut put = |name: String, shape: &[usize], scale: f32, offset: f32| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| offset + scale * next()).collect();
        w.insert(name, Tensor::from_vec(v, shape, &Device::Cpu).unwrap());
    };
    let (h, d, i) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
    put(
        "model.embed_tokens.weight".into(),
        &[cfg.vocab_size, h],
        1.0,
        0.0,
    );
    for l in 0..cfg.num_layers() {
        let p = format!("model.layers.{l}");
        put(format!("{p}.input_layernorm.weight"), &[h], 0.1, 1.0);
        put(
            format!("{p}.post_attention_layernorm.weight"),
            &[h],
            0.1,
            1.0,
        );
        put(
            format!("{p}.self_attn.q_proj.weight"),
            &[cfg.num_heads * d, h],
            0.3,
            0.0,
        );
        put(
            format!("{p}.self_attn.k_proj.weight"),
            &[cfg.num_kv_heads * d, h],
            0.3,
            0.0,
        );
        put(
            format!("{p}.self_attn.v_proj.weight"),
            &[cfg.num_kv_heads * d, h],
            0.3,
            0.0,
        );
        put(
            format!("{p}.self_attn.o_proj.weight"),
            &[h, cfg.num_heads * d],
            0.3,
            0.0,
        );
        put(format!("{p}.mlp.gate_proj.weight"), &[i, h], 0.3, 0.0);
        put(format!("{p}.mlp.up_proj.weight"), &[i, h], 0.3, 0.0);
        put(format!("{p}.mlp.down_proj.weight"), &[h, i], 0.3, 0.0);
    }
    put("model.norm.weight".into(), &[h], 0.1, 1.0);
    put("lm_head.weight".into(), &[cfg.vocab_size, h], 0.3, 0.0);
    w
}

#[test]
fn paged_greedy_equals_full_recompute_on_a_random_mqa_llama() {
    let cfg = ModelConfig::parse(
        r#"{"model_type": "llama", "hidden_size": 48, "intermediate_size": 96,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 20,
        "vocab_size": 97, "rms_norm_eps": 1e-5, "max_position_embeddings": 256,
        "tie_word_embeddings": false, "rope_theta": 10000.0, "hidden_act": "silu"}"#,
    )
    .unwrap();
    let vb = VarBuilder::from_tensors(random_weights(&cfg, 7), DType::F32, &Device::Cpu);
    let model = Transformer::new(&cfg, vb).unwrap();
    let prompts = vec![
        (0..13).map(|i| (i * 7 % 97) as u32).collect(),
        vec![5, 9, 3],
        (0..22).map(|i| (i * 11 % 97) as u32).collect(),
        vec![1, 2, 3, 4],
    ];
    check_model(&model, &prompts, 16);
}

mod engine {
    use super::super::engine::{
        Engine, EngineConfig, FinishReason, Request, RequestSettings, Sample,
    };
    use super::super::params::SamplingParams;
    use super::super::scheduler::SchedulerConfig;
    use super::*;

    fn fixture_model() -> Option<Transformer> {
        fixture_named("tiny-qwen3")
    }

    /// A fixture's model, on the candle path (`host` false) or packed for the host path.
    fn fixture_named(name: &str) -> Option<Transformer> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/fixtures")
            .join(name);
        if !dir.exists() {
            assert!(!std::env::var("SELFDISTILL_REQUIRE_SHARED").is_ok_and(|v| v == "1"));
            return None;
        }
        Some(
            Checkpoint::open(dir.to_str().unwrap())
                .unwrap()
                .load_transformer(&Device::Cpu, DType::F32)
                .unwrap(),
        )
    }

    fn prompts() -> Vec<Vec<u32>> {
        vec![
            vec![
                41, 273, 317, 435, 295, 82, 220, 16, 21, 358, 220, 18, 358, 220, 19, 277, 220,
            ],
            vec![87],
            vec![308, 434, 82, 86, 265, 305, 365, 65, 78, 87, 293, 90],
            vec![48, 84, 461, 392, 25, 417, 286],
            vec![43, 317, 281, 69, 7, 87, 8, 277, 220, 18],
        ]
    }

    fn run(
        model: &Transformer,
        params: SamplingParams,
        max_num_seqs: usize,
        num_blocks: usize,
        n: u32,
    ) -> (Vec<Sample>, u64) {
        let requests = prompts()
            .into_iter()
            .enumerate()
            .map(|(i, p)| Request {
                problem_id: format!("p{i}"),
                prompt: p,
                n,
                settings: None,
            })
            .collect();
        run_requests(model, params, max_num_seqs, num_blocks, requests)
    }

    /// `requests` through one engine whose own parameters are `params`: every finished sample,
    /// by request and sample index, and the preemptions.
    fn run_requests(
        model: &Transformer,
        params: SamplingParams,
        max_num_seqs: usize,
        num_blocks: usize,
        requests: Vec<Request>,
    ) -> (Vec<Sample>, u64) {
        let cfg = EngineConfig {
            scheduler: SchedulerConfig {
                block_size: 4,
                max_num_seqs,
                max_num_batched_tokens: 24,
            },
            num_blocks,
            params,
            eos_token_ids: vec![482, 480],
            kv_fp8: false,
            thinking: None,
        };
        let mut e = Engine::new(model, cfg).unwrap();
        for r in requests {
            e.add(r).unwrap();
        }
        let mut out = Vec::new();
        while !e.is_idle() {
            out.extend(e.step(None).unwrap());
        }
        out.sort_by_key(|a| (a.request, a.sample_index));
        (out, e.preemptions())
    }

    /// Settings unlike each other in every way a draw reads: nucleus sampling, greedy with
    /// logprobs and a short length, min-p with penalties and a stop id, each its own seed.
    fn three_settings() -> Vec<SamplingParams> {
        vec![
            sampling(),
            SamplingParams {
                temperature: 0.0,
                max_new_tokens: 7,
                logprobs: Some(3),
                ..SamplingParams::default()
            },
            SamplingParams {
                temperature: 0.7,
                min_p: 0.05,
                repetition_penalty: 1.3,
                presence_penalty: 0.5,
                stop_token_ids: vec![220],
                max_new_tokens: 12,
                seed: 99,
                ..SamplingParams::default()
            },
        ]
    }

    /// Every request carries its own settings: sets with different settings sampled in one
    /// batch give each set the tokens (and logprobs) it gets alone, at max_num_seqs 1 and 64 and
    /// under preemption, whatever the engine's own parameters.
    #[test]
    fn requests_with_their_own_settings_sample_as_they_would_alone() {
        let Some(model) = fixture_model() else { return };
        let sets = three_settings();
        let alone: Vec<Vec<Sample>> = sets
            .iter()
            .map(|p| run(&model, p.clone(), 1, 512, 2).0)
            .collect();
        assert!(alone[1]
            .iter()
            .all(|s| s.tokens.len() <= 7 && s.logprobs.is_some()));
        assert!(alone[0].iter().all(|s| s.logprobs.is_none()));
        let together = |max_num_seqs: usize, num_blocks: usize| {
            let shared: Vec<_> = sets
                .iter()
                .map(|p| {
                    std::sync::Arc::new(RequestSettings {
                        params: p.clone(),
                        thinking: None,
                    })
                })
                .collect();
            // the sets' requests interleaved, so every batch mixes them
            let mut requests = Vec::new();
            for (i, p) in prompts().into_iter().enumerate() {
                for s in &shared {
                    requests.push(Request {
                        problem_id: format!("p{i}"),
                        prompt: p.clone(),
                        n: 2,
                        settings: Some(s.clone()),
                    });
                }
            }
            let other = SamplingParams {
                temperature: 1.0,
                seed: 5,
                max_new_tokens: 3,
                ..SamplingParams::default()
            };
            run_requests(&model, other, max_num_seqs, num_blocks, requests)
        };
        for (max_num_seqs, num_blocks) in [(1, 512), (64, 512), (64, 24)] {
            let (got, preempted) = together(max_num_seqs, num_blocks);
            if num_blocks == 24 {
                assert!(preempted > 0, "the tight cache should force preemptions");
            }
            for (k, want) in alone.iter().enumerate() {
                let mine: Vec<&Sample> = got.iter().filter(|s| s.request % 3 == k).collect();
                assert_eq!(mine.len(), want.len(), "set {k}");
                for (a, b) in want.iter().zip(mine) {
                    let what = format!("set {k}, {} sample {}", a.problem_id, a.sample_index);
                    assert_eq!(
                        (&a.problem_id, a.sample_index, &a.tokens, a.finish_reason),
                        (&b.problem_id, b.sample_index, &b.tokens, b.finish_reason),
                        "{what} at max_num_seqs {max_num_seqs}, {num_blocks} blocks"
                    );
                    assert!((a.cumulative_logprob - b.cumulative_logprob).abs() < 1e-3);
                    let tops = |s: &Sample| {
                        s.logprobs
                            .as_ref()
                            .map(|l| l.iter().map(|t| t.top.len()).collect::<Vec<_>>())
                    };
                    assert_eq!(tops(a), tops(b), "{what}");
                }
            }
        }
    }

    /// A request's own parameters are checked when it is added, naming its problem.
    #[test]
    fn a_request_with_bad_settings_is_refused_naming_its_problem() {
        let Some(model) = fixture_model() else { return };
        let cfg = EngineConfig {
            scheduler: SchedulerConfig {
                block_size: 4,
                max_num_seqs: 2,
                max_num_batched_tokens: 64,
            },
            num_blocks: 64,
            params: sampling(),
            eos_token_ids: vec![482],
            kv_fp8: false,
            thinking: None,
        };
        let mut e = Engine::new(&model, cfg).unwrap();
        let bad = RequestSettings {
            params: SamplingParams {
                top_p: 1.5,
                ..sampling()
            },
            thinking: None,
        };
        let err = e
            .add(Request {
                problem_id: "q7".into(),
                prompt: vec![1, 2],
                n: 1,
                settings: Some(std::sync::Arc::new(bad)),
            })
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("problem q7: sampling parameters: top_p"),
            "{err}"
        );
    }

    fn sampling() -> SamplingParams {
        SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            top_k: 50,
            max_new_tokens: 20,
            seed: 1234,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn seeded_samples_do_not_depend_on_batch_size_or_memory_pressure() {
        let Some(model) = fixture_model() else { return };
        assert_batch_invariant(&model);
    }

    /// Qwen3.5 (recurrent layers with a state slot per sequence): the samples fork before the
    /// prompt's last token with a copy of its state, preemption rebuilds it, chunked prefill
    /// carries it; on both the candle path and the host path.
    #[test]
    fn qwen3_5_samples_do_not_depend_on_batch_size_or_memory_pressure() {
        let Some(mut model) = fixture_named("tiny-qwen3_5") else {
            return;
        };
        assert_batch_invariant(&model);
        model.set_fused_inference(true).unwrap();
        assert_batch_invariant(&model);
    }

    #[test]
    fn qwen3_5_greedy_engine_matches_full_recompute_for_every_sample() {
        let Some(mut model) = fixture_named("tiny-qwen3_5") else {
            return;
        };
        assert_greedy_matches(&model);
        model.set_fused_inference(true).unwrap();
        assert_greedy_matches(&model);
    }

    /// Gemma 3 (sliding-window layers of 4 and 3 tokens, shorter than the prompts plus the
    /// generations; their keys in a ring per sequence): seeded samples identical at
    /// max_num_seqs 1 and 64 and under preemption, greedy samples equal to full recompute
    /// (transformers' windowed attention, see `model::tests`), on the candle and host paths.
    /// A sliding layer holds its window's keys whatever the length: the cache's blocks hold the
    /// full layer only, and a sequence's slot the rings.
    #[test]
    fn gemma3_samples_are_batch_invariant_and_greedy_equals_full_recompute() {
        for name in ["gemma3-a", "gemma3-b"] {
            let dir = crate::model::tests::repo_fixture(name);
            let mut model = Checkpoint::open(dir.to_str().unwrap())
                .unwrap()
                .load_transformer(&Device::Cpu, DType::F32)
                .unwrap();
            let cfg = model.config().clone();
            let w = cfg.sliding_window.unwrap();
            assert!(prompts().iter().any(|p| p.len() > w), "{name}");
            assert_eq!(KvCache::new(&cfg, 4, 8).num_layers(), 1, "{name}");
            let sliding = cfg.num_layers() - 1;
            assert_eq!(
                StateSlots::bytes_per_seq(&cfg),
                sliding * 2 * w * cfg.num_kv_heads * cfg.head_dim * 4,
                "{name}"
            );
            assert_batch_invariant(&model);
            assert_greedy_matches(&model);
            model.set_fused_inference(true).unwrap();
            assert_batch_invariant(&model);
            assert_greedy_matches(&model);
        }
    }

    fn assert_batch_invariant(model: &Transformer) {
        let model = &model;
        let (one, _) = run(model, sampling(), 1, 512, 3);
        let (many, _) = run(model, sampling(), 64, 512, 3);
        let (tight, preempted) = run(model, sampling(), 64, 24, 3);
        assert_eq!(one.len(), 15);
        assert!(preempted > 0, "the tight cache should force preemptions");
        // Tokens are identical; log-probabilities agree to float noise (the batch shapes of the
        // matmuls differ).
        for other in [&many, &tight] {
            assert_eq!(one.len(), other.len());
            for (a, b) in one.iter().zip(other.iter()) {
                assert_eq!(
                    (&a.problem_id, a.sample_index, &a.tokens),
                    (&b.problem_id, b.sample_index, &b.tokens)
                );
                assert!((a.cumulative_logprob - b.cumulative_logprob).abs() < 1e-3);
            }
        }
        // Different sample indices of one problem differ (they have their own RNG streams).
        assert_ne!(one[0].tokens, one[1].tokens);
    }

    #[test]
    fn greedy_engine_matches_full_recompute_for_every_sample() {
        let Some(model) = fixture_model() else { return };
        assert_greedy_matches(&model);
    }

    fn assert_greedy_matches(model: &Transformer) {
        let params = SamplingParams {
            max_new_tokens: 12,
            ignore_eos: true,
            ..SamplingParams::default()
        };
        let (out, _) = run(model, params, 8, 64, 2);
        assert_eq!(out.len(), 2 * prompts().len());
        for s in &out {
            let want = reference_greedy(model, &prompts()[s.request], 12);
            assert_eq!(s.finish_reason, FinishReason::Length);
            assert_same(
                &s.tokens,
                &want,
                &format!("problem {} sample {}", s.request, s.sample_index),
            );
        }
    }

    #[test]
    fn cancelling_a_request_saves_its_unfinished_samples() {
        let Some(model) = fixture_model() else { return };
        let cfg = EngineConfig {
            scheduler: SchedulerConfig {
                block_size: 4,
                max_num_seqs: 2,
                max_num_batched_tokens: 64,
            },
            num_blocks: 256,
            params: SamplingParams {
                max_new_tokens: 8,
                ignore_eos: true,
                ..sampling()
            },
            eos_token_ids: vec![482],
            kv_fp8: false,
            thinking: None,
        };
        let mut e = Engine::new(&model, cfg).unwrap();
        let r = e
            .add(Request {
                problem_id: "p".into(),
                prompt: prompts()[0].clone(),
                n: 6,
                settings: None,
            })
            .unwrap();
        let mut done = Vec::new();
        while done.is_empty() {
            done.extend(e.step(None).unwrap());
        }
        let saved = e.cancel(r);
        while !e.is_idle() {
            done.extend(e.step(None).unwrap());
        }
        assert_eq!(done.len() as u64 + saved, 6);
        assert!(saved >= 3, "saved {saved}");
        assert_eq!(e.stats.samples_cancelled, saved);
    }

    #[test]
    fn the_thinking_budget_forces_the_closing_text_in() {
        let Some(model) = fixture_model() else { return };
        let closing = vec![198, 484, 198, 198]; // "\n</think>\n\n"
        let cfg = EngineConfig {
            scheduler: SchedulerConfig {
                block_size: 4,
                max_num_seqs: 4,
                max_num_batched_tokens: 64,
            },
            num_blocks: 128,
            params: SamplingParams {
                max_new_tokens: 14,
                ignore_eos: true,
                ..sampling()
            },
            eos_token_ids: vec![482],
            kv_fp8: false,
            thinking: Some(super::super::engine::ThinkingBudget {
                max_thinking_tokens: 5,
                think_end_id: 484,
                closing: closing.clone(),
            }),
        };
        let mut e = Engine::new(&model, cfg).unwrap();
        e.add(Request {
            problem_id: "p".into(),
            prompt: prompts()[0].clone(),
            n: 3,
            settings: None,
        })
        .unwrap();
        let mut out = Vec::new();
        while !e.is_idle() {
            out.extend(e.step(None).unwrap());
        }
        assert_eq!(out.len(), 3);
        for s in &out {
            assert_eq!(s.tokens.len(), 14);
            if s.tokens[..5].contains(&484) {
                continue; // closed on its own
            }
            assert_eq!(&s.tokens[5..9], closing.as_slice(), "{:?}", s.tokens);
            assert_eq!(s.finish_reason, FinishReason::Length);
        }
        // After the forced text the model keeps answering with its own samples.
        assert!(out.iter().any(|s| !s.tokens[9..].iter().all(|&t| t == 198)));
    }

    #[test]
    fn a_stop_string_ends_the_sample_where_it_appears() {
        let Some(model) = fixture_model() else { return };
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/tiny-qwen3");
        let tok = Checkpoint::open(dir.to_str().unwrap())
            .unwrap()
            .tokenizer()
            .unwrap();
        let greedy = SamplingParams {
            max_new_tokens: 16,
            ignore_eos: true,
            ..SamplingParams::default()
        };
        let (free, _) = run(&model, greedy.clone(), 8, 64, 1);
        // A stop string made of the text of generated tokens 6 and 7 of the first sample.
        let stop = tok.decode(&free[0].tokens[6..8]).unwrap();
        let cfg = EngineConfig {
            scheduler: SchedulerConfig {
                block_size: 4,
                max_num_seqs: 8,
                max_num_batched_tokens: 24,
            },
            num_blocks: 64,
            params: SamplingParams {
                stop_strings: vec![stop.clone()],
                ..greedy
            },
            eos_token_ids: vec![482, 480],
            kv_fp8: false,
            thinking: None,
        };
        let mut e = Engine::new(&model, cfg).unwrap();
        e.add(Request {
            problem_id: "p0".into(),
            prompt: prompts()[0].clone(),
            n: 1,
            settings: None,
        })
        .unwrap();
        let decode = |ids: &[u32]| tok.decode(ids).unwrap_or_default();
        let mut out = Vec::new();
        while !e.is_idle() {
            out.extend(e.step(Some(&decode)).unwrap());
        }
        assert_eq!(out[0].finish_reason, FinishReason::Stop);
        assert!(out[0].tokens.len() <= 8, "{:?}", out[0].tokens);
        assert!(tok.decode(&out[0].tokens).unwrap().contains(&stop));
        assert_eq!(&out[0].tokens[..], &free[0].tokens[..out[0].tokens.len()]);
    }
}
