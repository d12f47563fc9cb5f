//! GPU tests (`--features cuda`, on a machine with an NVIDIA GPU): the paged-attention kernels
//! against the CPU reference (`sampler::kv_cache`), greedy decoding of the tiny fixture on the
//! GPU against the CPU sampler, and the trainer on the GPU against the CPU (the same 8 steps in
//! f32 and bf16, and a SIGKILLed GPU run resumed). CI compiles them (`cargo check --features cuda --all-targets`)
//! but has no GPU to run them on; without a GPU every test fails rather than passing vacuously.
//! Run them on a GPU machine as docs/gpu.md says; the fixture folder is found at
//! `$SELFDISTILL_SHARED/fixtures/tiny-qwen3` or `../shared/fixtures/tiny-qwen3`, and the binary the
//! trainer tests run at `$SELFDISTILL_PIPELINE` or cargo's own (`scripts/gpu-acceptance.sh` sets
//! both when the executables travel to a GPU machine).
#![cfg(feature = "cuda")]

mod common;

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use selfdistill::model::attention::AttentionBackend;
use selfdistill::model::ModelConfig;
use selfdistill::sampler::block_pool::{BlockPool, BlockTable};
use selfdistill::sampler::engine::{Engine, EngineConfig, Request, Sample};
use selfdistill::sampler::gpu::{GpuKvCache, GpuPagedAttention, GpuStep};
use selfdistill::sampler::kv_cache::{KvCache, PagedAttention, SeqStep};
use selfdistill::sampler::params::SamplingParams;
use selfdistill::sampler::scheduler::SchedulerConfig;

fn gpu() -> Device {
    selfdistill::cuda::sampler_device(0).expect("these tests need a CUDA GPU")
}

fn config(hq: usize, hkv: usize, d: usize) -> ModelConfig {
    ModelConfig::parse(&format!(
        r#"{{"model_type": "qwen3", "hidden_size": {h}, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": {hq}, "num_key_value_heads": {hkv},
        "head_dim": {d}, "vocab_size": 32, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 8192, "tie_word_embeddings": true, "rope_theta": 10000.0}}"#,
        h = hq * d
    ))
    .unwrap()
}

/// ‖a − b‖ / ‖b‖ over f32 copies.
fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    let a: Vec<f32> = a
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let b: Vec<f32> = b
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(a.len(), b.len());
    assert!(a.iter().all(|x| x.is_finite()), "non-finite output");
    let num: f64 = a
        .iter()
        .zip(&b)
        .map(|(x, y)| ((x - y) as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// Runs a prefill step (every sequence's whole history, in chunks as the scheduler would give
/// them) and then two decode steps through both caches, with the same random inputs, and
/// returns the worst relative error of the GPU outputs.
fn compare(hq: usize, hkv: usize, d: usize, dtype: DType, fp8: bool, lens: &[usize]) -> f64 {
    compare_with(hq, hkv, d, dtype, fp8, lens, 16, None)
}

/// [`compare`] in blocks of `bs` tokens, with a kernel variant (`_v4`, `_v5r1`, ...) or the
/// cache's default kernel.
#[allow(clippy::too_many_arguments)]
fn compare_with(
    hq: usize,
    hkv: usize,
    d: usize,
    dtype: DType,
    fp8: bool,
    lens: &[usize],
    bs: usize,
    variant: Option<&'static str>,
) -> f64 {
    let cfg = config(hq, hkv, d);
    let dev = gpu();
    let num_blocks = lens.iter().map(|l| (l + 3).div_ceil(bs)).sum::<usize>() + 4;
    let mut cpu = KvCache::new(&cfg, bs, num_blocks);
    let mut gcache = GpuKvCache::new(&cfg, bs, num_blocks, &dev, dtype, fp8).unwrap();
    let mut pool = BlockPool::new(num_blocks);
    let mut tables: Vec<BlockTable> = lens.iter().map(|_| BlockTable::default()).collect();
    let mut done = vec![0usize; lens.len()];
    let mut worst: f64 = 0.0;
    // steps: the prompts in two chunks, then two single-token steps
    let plan: Vec<Vec<usize>> = vec![
        lens.iter().map(|l| l.div_ceil(2)).collect(),
        lens.iter().map(|l| l - l.div_ceil(2)).collect(),
        vec![1; lens.len()],
        vec![1; lens.len()],
    ];
    for (si, news) in plan.iter().enumerate() {
        for (i, &n) in news.iter().enumerate() {
            if n > 0 {
                tables[i]
                    .reserve(&mut pool, done[i], n, bs)
                    .expect("blocks");
            }
        }
        let t: usize = news.iter().sum();
        let rnd = |h: usize| {
            Tensor::randn(0f32, 1.0, (t, h, d), &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap()
        };
        let (q, k, v) = (rnd(hq), rnd(hkv), rnd(hkv));
        let (qf, kf, vf) = (
            q.to_dtype(DType::F32).unwrap(),
            k.to_dtype(DType::F32).unwrap(),
            v.to_dtype(DType::F32).unwrap(),
        );
        let steps: Vec<SeqStep> = news
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(i, &n)| SeqStep {
                block_table: &tables[i],
                start_pos: done[i],
                num_new: n,
            })
            .collect();
        let gstep = GpuStep::new(&gcache, &steps, hq).unwrap();
        for layer in 0..2 {
            let want = PagedAttention::new(&mut cpu, steps.clone())
                .attend(layer, &qf, &kf, &vf, None)
                .unwrap();
            let mut g = GpuPagedAttention {
                seq_lens: Vec::new(),
                states: None,
                cache: &mut gcache,
                step: &gstep,
                sync_timing: false,
                variant,
                seconds: 0.0,
                events: Vec::new(),
                spent: Default::default(),
            };
            let got = g
                .attend(
                    layer,
                    &q.to_device(&dev).unwrap(),
                    &k.to_device(&dev).unwrap(),
                    &v.to_device(&dev).unwrap(),
                    None,
                )
                .unwrap();
            assert_eq!(got.dtype(), dtype);
            let e = rel_err(&got.to_device(&Device::Cpu).unwrap(), &want);
            println!(
                "  hq {hq} hkv {hkv} d {d} {dtype:?}{} bs {bs} {} step {si} layer {layer}: {} \
                 tokens, {} partitions, rel err {e:.2e}",
                if fp8 { " fp8" } else { "" },
                variant.map_or(gcache.attn_kernel(), |v| v),
                t,
                gstep.num_parts()
            );
            worst = worst.max(e);
        }
        for (i, &n) in news.iter().enumerate() {
            done[i] += n;
        }
    }
    worst
}

#[test]
fn paged_attention_matches_the_cpu_reference() {
    // (Hq, Hkv, D): the tiny fixture, plain heads, Qwen3-4B's grouping, MQA with 8 heads
    let shapes = [
        (4, 2, 16),
        (8, 8, 64),
        (32, 8, 128),
        (8, 1, 128),
        (4, 4, 256),
    ];
    // one long context among short ones: the decode steps split it over partitions
    let lens = [1, 37, 300, 1500];
    for &(hq, hkv, d) in &shapes {
        let e = compare(hq, hkv, d, DType::F32, false, &lens);
        assert!(e < 1e-5, "f32 ({hq}, {hkv}, {d}): rel err {e}");
        let e = compare(hq, hkv, d, DType::BF16, false, &lens);
        assert!(e < 1e-2, "bf16 ({hq}, {hkv}, {d}): rel err {e}");
        let e = compare(hq, hkv, d, DType::BF16, true, &lens);
        assert!(
            e < 8e-2,
            "bf16 with an fp8 cache ({hq}, {hkv}, {d}): rel err {e}"
        );
    }
}

#[test]
fn every_attention_kernel_version_matches_the_cpu_reference() {
    // v4 (the f32 kernels, and bf16 caches in blocks that are not a power of two) and the
    // benchmark's variants of v5, at Qwen3-4B's grouping
    let lens = [1, 37, 300, 1500];
    for (variant, fp8) in [
        (Some("_v4"), false),
        (Some("_v4"), true),
        (Some("_v5r1"), false),
        (Some("_v5r2"), false),
        (Some("_v5r1"), true),
        (Some("_v5r2"), true),
    ] {
        let e = compare_with(32, 8, 128, DType::BF16, fp8, &lens, 16, variant);
        let tol = if fp8 { 8e-2 } else { 1e-2 };
        assert!(e < tol, "{variant:?} fp8 {fp8}: rel err {e}");
    }
    // blocks of 12 run v4 by default; blocks of 1 split a 3,000-key context into partitions of
    // at most 2,048 table entries (v5's shared-memory table)
    for bs in [12, 1] {
        let e = compare_with(8, 2, 64, DType::BF16, false, &[1, 37, 3000], bs, None);
        assert!(e < 1e-2, "blocks of {bs}: rel err {e}");
    }
}

#[test]
fn block_copies_move_every_layer() {
    let cfg = config(4, 2, 16);
    let dev = gpu();
    let (bs, nb) = (16, 8);
    let mut g = GpuKvCache::new(&cfg, bs, nb, &dev, DType::F32, false).unwrap();
    let mut pool = BlockPool::new(nb);
    let mut table = BlockTable::default();
    table.reserve(&mut pool, 0, bs, bs).unwrap();
    let step = GpuStep::new(
        &g,
        &[SeqStep {
            block_table: &table,
            start_pos: 0,
            num_new: bs,
        }],
        4,
    )
    .unwrap();
    let q = Tensor::randn(0f32, 1.0, (bs, 4, 16), &dev).unwrap();
    let k = Tensor::randn(0f32, 1.0, (bs, 2, 16), &dev).unwrap();
    let v = Tensor::randn(0f32, 1.0, (bs, 2, 16), &dev).unwrap();
    let mut outs = Vec::new();
    for layer in 0..2 {
        let mut a = GpuPagedAttention {
            seq_lens: Vec::new(),
            states: None,
            cache: &mut g,
            step: &step,
            sync_timing: false,
            variant: None,
            seconds: 0.0,
            events: Vec::new(),
            spent: Default::default(),
        };
        outs.push(a.attend(layer, &q, &k, &v, None).unwrap());
    }
    // Move the block and attend with the last token only: same output as before.
    let src = table.blocks[0];
    let dst = pool.allocate().unwrap();
    g.copy_block(src, dst).unwrap();
    let moved = BlockTable { blocks: vec![dst] };
    let step = GpuStep::new(
        &g,
        &[SeqStep {
            block_table: &moved,
            start_pos: bs - 1,
            num_new: 1,
        }],
        4,
    )
    .unwrap();
    for (layer, out) in outs.iter().enumerate() {
        let mut a = GpuPagedAttention {
            seq_lens: Vec::new(),
            states: None,
            cache: &mut g,
            step: &step,
            sync_timing: false,
            variant: None,
            seconds: 0.0,
            events: Vec::new(),
            spent: Default::default(),
        };
        let last = |t: &Tensor| t.narrow(0, bs - 1, 1).unwrap();
        let got = a
            .attend(layer, &last(&q), &last(&k), &last(&v), None)
            .unwrap();
        let e = rel_err(&got, &last(out));
        assert!(e < 1e-6, "layer {layer}: {e}");
    }
}

/// A step's one upload: sections read back as written through their views (u32, i64 words,
/// f32 bits), across a growth of the buffer and a smaller step after it; the row gather that
/// reads ids from the upload equals candle's `index_select` in f32 and bf16; the kept output
/// buffer comes back in one copy.
#[test]
fn one_upload_feeds_every_reader_and_the_row_gather_equals_index_select() {
    use selfdistill::sampler::gpu::step_io::{Staging, StepIo};
    let dev = gpu();
    let cuda = dev.as_cuda_device().unwrap();
    let mut io = StepIo::new(cuda);
    let mut grew = Vec::new();
    for n in [3usize, 5000, 7] {
        let mut s = Staging::new();
        let ids: Vec<u32> = (0..n as u32).map(|i| (i * 7 + n as u32) % 50).collect();
        let a = s.u32s(ids.iter().copied());
        let b = s.i64s([-(n as i64), 1 << 40]);
        let c = s.f32s([0.5, -2.25]);
        let (buf, g) = io.upload(&s).unwrap();
        grew.push(g.0);
        assert_eq!(
            buf.tensor(a).unwrap().to_vec1::<u32>().unwrap(),
            ids,
            "n = {n}"
        );
        let words = buf.tensor(b).unwrap().to_vec1::<u32>().unwrap();
        let back: Vec<i64> = words
            .chunks(2)
            .map(|w| (w[0] as i64) | ((w[1] as i64) << 32))
            .collect();
        assert_eq!(back, [-(n as i64), 1 << 40]);
        let f: Vec<f32> = buf
            .tensor(c)
            .unwrap()
            .to_vec1::<u32>()
            .unwrap()
            .into_iter()
            .map(f32::from_bits)
            .collect();
        assert_eq!(f, [0.5, -2.25]);
        for dtype in [DType::F32, DType::BF16] {
            for cols in [12, 64, 6] {
                let table = Tensor::randn(0f32, 1.0, (50, cols), &dev)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let idx = buf.tensor(a).unwrap();
                let got = selfdistill::cuda::rows::gather(&table, &idx)
                    .unwrap()
                    .expect("the gather takes an f32 or even bf16 table");
                let want = table.index_select(&idx, 0).unwrap();
                let (g, w) = (
                    got.to_dtype(DType::F32).unwrap().flatten_all().unwrap(),
                    want.to_dtype(DType::F32).unwrap().flatten_all().unwrap(),
                );
                assert_eq!(
                    g.to_vec1::<f32>().unwrap(),
                    w.to_vec1::<f32>().unwrap(),
                    "{dtype:?} cols {cols} n {n}"
                );
            }
        }
    }
    assert_eq!(
        grew,
        [true, true, false],
        "grows once past 4,096 words, then kept"
    );
    // the output buffer: written by a copy on the device, read back whole
    let (out, _) = io.output(10).unwrap();
    let src = Tensor::arange(100u32, 110, &dev).unwrap();
    let sp = selfdistill::cuda::kernels::tensor_ptr(&src).unwrap();
    let stream = cuda.cuda_stream();
    unsafe {
        candle_core::cuda_backend::cudarc::driver::result::memcpy_dtod_async(
            out,
            sp,
            40,
            stream.cu_stream(),
        )
        .unwrap();
    }
    assert_eq!(io.download(10).unwrap(), (100..110).collect::<Vec<u32>>());
}

/// The head's loss and gradients through the cross-entropy kernel (a GPU, f32 and bf16) against
/// the candle ops on the CPU: chunks of 5 rows over 23 positions (some of weight 0), a
/// vocabulary of 1,000 (not a multiple of the block). f32 within 1e-4 of the largest value;
/// bf16 off the f32 reference by at most twice the CPU's own bf16 path plus one bf16 step.
#[test]
fn the_cross_entropy_kernel_follows_the_candle_head() {
    use selfdistill::model::cost::Cost;
    use selfdistill::train::grads::head_grads;
    use selfdistill::train::loss::PackedBatch;
    let (t, h, v) = (23usize, 48usize, 1000usize);
    let cpu = Device::Cpu;
    let hidden = Tensor::randn(0f32, 1.0, (t, h), &cpu).unwrap();
    let w = (Tensor::randn(0f32, 1.0, (v, h), &cpu).unwrap() * 0.3).unwrap();
    let b = PackedBatch {
        tokens: vec![1; t],
        positions: (0..t as u32).collect(),
        seq_lens: vec![t],
        targets: (0..t as u32).map(|i| (i * 37 + 11) % v as u32).collect(),
        weights: (0..t).map(|i| if i % 4 == 0 { 0.0 } else { 1.0 }).collect(),
    };
    let run = |dev: &Device, dtype: DType| {
        let (hd, wd) = (
            hidden.to_dtype(dtype).unwrap().to_device(dev).unwrap(),
            w.to_dtype(dtype).unwrap().to_device(dev).unwrap(),
        );
        let (loss, gh, gw) =
            head_grads(&hd, &wd, &b, 0.25, 5, false, &mut Cost::default()).unwrap();
        let host = |x: Tensor| {
            x.to_dtype(DType::F32)
                .unwrap()
                .to_device(&Device::Cpu)
                .unwrap()
        };
        (loss, host(gh), host(gw))
    };
    let reference = run(&cpu, DType::F32);
    let err = |a: &(f64, Tensor, Tensor), b: &(f64, Tensor, Tensor)| {
        let rel = |x: &Tensor, y: &Tensor| {
            let big = y
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap() as f64;
            (x - y)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap() as f64
                / big
        };
        [
            (a.0 - b.0).abs() / b.0.abs(),
            rel(&a.1, &b.1),
            rel(&a.2, &b.2),
        ]
    };
    let gpu_f32 = err(&run(&gpu(), DType::F32), &reference);
    assert!(gpu_f32.iter().all(|&e| e < 1e-4), "f32: {gpu_f32:?}");
    let cpu_bf16 = err(&run(&cpu, DType::BF16), &reference);
    let gpu_bf16 = err(&run(&gpu(), DType::BF16), &reference);
    for i in 0..3 {
        assert!(
            gpu_bf16[i] <= 2.0 * cpu_bf16[i] + 1.0 / 128.0,
            "bf16 (loss, dh, dw): the kernel {gpu_bf16:?}, candle on the CPU {cpu_bf16:?}"
        );
    }
}

fn fixture() -> PathBuf {
    fixture_named("tiny-qwen3")
}

fn fixture_named(name: &str) -> PathBuf {
    let p = common::shared_root().join("fixtures").join(name);
    assert!(p.exists(), "fixture not found at {}", p.display());
    p
}

#[test]
fn gpu_candidates_equal_the_cpu_reference() {
    use selfdistill::sampler::gpu::sampling::{top_candidates as gpu_top_candidates, Temperatures};
    use selfdistill::sampler::sampling::{top_candidates, SampleRng};
    let dev = gpu();
    for (ti, &(temperature, k)) in [(0.0f32, 1usize), (0.6, 20), (1.0, 5), (0.9, 300)]
        .iter()
        .enumerate()
    {
        let params = SamplingParams {
            temperature,
            top_k: if temperature == 0.0 { 0 } else { k },
            ..SamplingParams::default()
        };
        for dtype in [DType::F32, DType::BF16] {
            let (n, vocab) = (7, 151_936 / (ti + 1));
            let mut rng = SampleRng::new(ti as u64, "rows", 0);
            let mut rows = Vec::with_capacity(n * vocab);
            for r in 0..n {
                for _ in 0..vocab {
                    rows.push(match rng.next_u64() % 1000 {
                        0 => f32::NAN,
                        1 => f32::NEG_INFINITY,
                        2 if r == 3 => f32::INFINITY,
                        // coarse values: many ties, as bf16 logits have
                        _ => ((rng.next_f64() * 30.0 - 15.0) * 8.0).round() as f32 / 8.0,
                    });
                }
            }
            // row 5 is all -inf but for two tokens
            for x in &mut rows[5 * vocab..6 * vocab] {
                *x = f32::NEG_INFINITY;
            }
            rows[5 * vocab + 17] = 1.0;
            rows[5 * vocab + 3] = 1.0;
            let t = Tensor::from_vec(rows.clone(), (n, vocab), &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let host: Vec<f32> = t
                .to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let one = Temperatures::One {
                greedy: params.is_greedy(),
                temperature,
            };
            let got = gpu_top_candidates(&t, k, &one).unwrap();
            // and each row at its own temperature (requests with their own settings), row 2
            // greedy
            let row_params: Vec<SamplingParams> = (0..n)
                .map(|r| SamplingParams {
                    temperature: if r == 2 { 0.0 } else { 0.3 + 0.2 * r as f32 },
                    ..params.clone()
                })
                .collect();
            let per_row = Temperatures::PerRow(
                row_params
                    .iter()
                    .map(|p| if p.is_greedy() { 0.0 } else { p.temperature })
                    .collect(),
            );
            let mixed = gpu_top_candidates(&t, k, &per_row).unwrap();
            for r in 0..n {
                let row = &host[r * vocab..(r + 1) * vocab];
                let want = top_candidates(row, &row_params[r], k);
                assert_eq!(
                    mixed[r].ids, want.ids,
                    "setting {ti} {dtype:?} row {r}, own"
                );
                assert_eq!(
                    mixed[r].values, want.values,
                    "setting {ti} {dtype:?} row {r}, own"
                );
                let want = top_candidates(row, &params, k);
                let g = &got[r];
                assert_eq!(g.ids, want.ids, "setting {ti} {dtype:?} row {r}");
                assert_eq!(g.values, want.values, "setting {ti} {dtype:?} row {r}");
                assert_eq!(g.raw, want.raw);
                assert_eq!(g.max, want.max);
                let rel = (g.sum_exp - want.sum_exp).abs() / want.sum_exp.max(1e-30);
                assert!(
                    rel < 1e-5,
                    "setting {ti} {dtype:?} row {r}: sum {} vs {}",
                    g.sum_exp,
                    want.sum_exp
                );
            }
        }
    }
}

#[test]
fn seeded_sampling_on_the_gpu_matches_the_cpu_sampler() {
    let prompts = vec![
        vec![41, 273, 317, 435, 295, 82],
        vec![87],
        vec![308, 434, 82, 86],
    ];
    let params = top_k_top_p(40, 7);
    let cpu = run_fixture(&Device::Cpu, DType::F32, &prompts, 3, params.clone());
    let g = run_fixture(&gpu(), DType::F32, &prompts, 3, params);
    assert_eq!(cpu.len(), 9);
    assert_same_samples(&cpu, &g, "seeded top-k/top-p on the GPU");
}

/// Same tokens, and log-probabilities within 1e-3, sample by sample.
/// Seeded top-k 20 / top-p 0.95 sampling at temperature 0.8, `max_new_tokens` each.
fn top_k_top_p(max_new_tokens: usize, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        top_k: 20,
        top_p: 0.95,
        max_new_tokens,
        ignore_eos: true,
        seed,
        ..SamplingParams::default()
    }
}

fn assert_same_samples(cpu: &[Sample], gpu: &[Sample], what: &str) {
    assert_eq!(cpu.len(), gpu.len(), "{what}: sample counts");
    for (c, g) in cpu.iter().zip(gpu) {
        let id = (c.request, c.sample_index);
        assert_eq!(c.tokens, g.tokens, "{what}, sample {id:?}");
        assert!(
            (c.cumulative_logprob - g.cumulative_logprob).abs() < 1e-3,
            "{what}, sample {id:?}: logprob {} vs {}",
            c.cumulative_logprob,
            g.cumulative_logprob
        );
    }
}

fn greedy(dev: &Device, dtype: DType, prompts: &[Vec<u32>], n: u32) -> Vec<Sample> {
    greedy_of(fixture(), dev, dtype, prompts, n)
}

fn greedy_of(
    dir: PathBuf,
    dev: &Device,
    dtype: DType,
    prompts: &[Vec<u32>],
    n: u32,
) -> Vec<Sample> {
    let params = SamplingParams {
        temperature: 0.0,
        max_new_tokens: 40,
        ignore_eos: true,
        ..SamplingParams::default()
    };
    run_fixture_at(dir, dev, dtype, prompts, n, params)
}

fn run_fixture(
    dev: &Device,
    dtype: DType,
    prompts: &[Vec<u32>],
    n: u32,
    params: SamplingParams,
) -> Vec<Sample> {
    run_fixture_at(fixture(), dev, dtype, prompts, n, params)
}

fn run_fixture_at(
    dir: PathBuf,
    dev: &Device,
    dtype: DType,
    prompts: &[Vec<u32>],
    n: u32,
    params: SamplingParams,
) -> Vec<Sample> {
    let ck = selfdistill::model::Checkpoint::open(dir.to_str().unwrap()).unwrap();
    let mut model = ck.load_transformer(dev, dtype).unwrap();
    model.set_fused_inference(true).unwrap();
    run_model(&model, prompts, n, params)
}

/// Every sample of `prompts` (n each) from `model` through the engine, in request order.
fn run_model(
    model: &selfdistill::model::Transformer,
    prompts: &[Vec<u32>],
    n: u32,
    params: SamplingParams,
) -> Vec<Sample> {
    run_model_with(model, prompts, n, params, 8)
}

/// [`run_model`] with at most `max_num_seqs` sequences in a step.
fn run_model_with(
    model: &selfdistill::model::Transformer,
    prompts: &[Vec<u32>],
    n: u32,
    params: SamplingParams,
    max_num_seqs: usize,
) -> Vec<Sample> {
    run_model_graphs(model, prompts, n, params, max_num_seqs, true).0
}

/// [`run_model_with`], decode steps replaying CUDA graphs or not (`enforce_eager`), and how
/// many steps ran under a graph's plan.
fn run_model_graphs(
    model: &selfdistill::model::Transformer,
    prompts: &[Vec<u32>],
    n: u32,
    params: SamplingParams,
    max_num_seqs: usize,
    graphs: bool,
) -> (Vec<Sample>, selfdistill::sampler::backend::GraphCounts) {
    let cfg = EngineConfig {
        scheduler: SchedulerConfig {
            block_size: 16,
            max_num_seqs,
            max_num_batched_tokens: 64,
        },
        num_blocks: 64,
        params,
        eos_token_ids: vec![],
        kv_fp8: false,
        thinking: None,
    };
    let mut e = Engine::new(model, cfg).unwrap();
    if model.device().is_cuda() {
        e.set_cuda_graphs(graphs).unwrap();
    }
    for (i, p) in prompts.iter().enumerate() {
        e.add(Request {
            problem_id: format!("p{i}"),
            prompt: p.clone(),
            n,
            settings: None,
        })
        .unwrap();
    }
    let mut out = Vec::new();
    while !e.is_idle() {
        out.extend(e.step(None).unwrap());
    }
    out.sort_by_key(|s| (s.request, s.sample_index));
    (out, e.graph_counts())
}

#[test]
fn replayed_decode_graphs_sample_what_eager_steps_sample() {
    // 5 prompts x 3 samples: 15 sequences padded to the bucket of 16 (and to 4 at
    // max_num_seqs 4); greedy and seeded top-k/top-p; f32 and bf16; Qwen3, and Qwen3.5 with
    // its recurrent layers' padding slot
    let prompts = vec![
        vec![41, 273, 317, 435, 295, 82],
        vec![87],
        vec![308, 434, 82, 86],
        vec![5, 6, 7],
        vec![99, 100],
    ];
    let dev = gpu();
    for name in ["tiny-qwen3", "tiny-qwen3_5"] {
        let dir = fixture_named(name);
        let ck = selfdistill::model::Checkpoint::open(dir.to_str().unwrap()).unwrap();
        for dtype in [DType::F32, DType::BF16] {
            let mut model = ck.load_transformer(&dev, dtype).unwrap();
            model.set_fused_inference(true).unwrap();
            let mut greedy = top_k_top_p(40, 5);
            greedy.temperature = 0.0;
            for params in [top_k_top_p(40, 5), greedy] {
                for max in [4, 64] {
                    let what = format!(
                        "{name}, {dtype:?}, temperature {}, max_num_seqs {max}",
                        params.temperature
                    );
                    let (eager, none) =
                        run_model_graphs(&model, &prompts, 3, params.clone(), max, false);
                    let (replayed, counts) =
                        run_model_graphs(&model, &prompts, 3, params.clone(), max, true);
                    assert_eq!(none.replayed + none.captured + none.eager, 0, "{what}");
                    assert!(
                        counts.captured >= 1 && counts.replayed >= 30,
                        "{what}: {counts:?} (graphs off? see the warning above)"
                    );
                    assert_eq!(eager.len(), 15, "{what}");
                    assert_same_samples(&eager, &replayed, &what);
                }
            }
        }
    }
}

#[test]
fn greedy_decode_on_the_gpu_matches_the_cpu_sampler() {
    let prompts = vec![
        vec![
            41, 273, 317, 435, 295, 82, 220, 16, 21, 358, 220, 18, 358, 220, 19, 277, 220,
        ],
        vec![87],
        vec![308, 434, 82, 86, 265, 305, 365, 65, 78],
    ];
    let cpu = greedy(&Device::Cpu, DType::F32, &prompts, 2);
    let g32 = greedy(&gpu(), DType::F32, &prompts, 2);
    assert_eq!(cpu.len(), 6);
    assert_same_samples(&cpu, &g32, "greedy f32 on the GPU");
    // bf16 weights round every logit: report how far the greedy paths agree.
    let g16 = greedy(&gpu(), DType::BF16, &prompts, 2);
    for (c, g) in cpu.iter().zip(&g16) {
        let same = c
            .tokens
            .iter()
            .zip(&g.tokens)
            .take_while(|(a, b)| a == b)
            .count();
        println!(
            "bf16 sample {:?}: first {same} of {} tokens equal the CPU's",
            (c.request, c.sample_index),
            c.tokens.len()
        );
    }
}

/// Qwen3.5 on the GPU through candle's ops (no recurrent kernel yet): greedy samples of the hybrid
/// fixture, with their state slots moved to the device each step, equal the CPU sampler's.
#[test]
fn qwen3_5_greedy_decode_on_the_gpu_matches_the_cpu_sampler() {
    let prompts = vec![vec![41, 273, 317, 435, 295, 82, 220, 16, 21], vec![87]];
    let dir = fixture_named("tiny-qwen3_5");
    let cpu = greedy_of(dir.clone(), &Device::Cpu, DType::F32, &prompts, 2);
    let gpu = greedy_of(dir, &gpu(), DType::F32, &prompts, 2);
    assert_eq!(cpu.len(), 4);
    assert_same_samples(&cpu, &gpu, "Qwen3.5 greedy f32 on the GPU");
}

/// The Gated DeltaNet decode kernels (`kernels/gated_deltanet.cu`, sampling only) in bf16
/// against the candle path they replace (the model with fused inference off), on the GPU: the
/// same greedy tokens. The f32 test above holds them to the CPU's tokens exactly.
#[test]
fn qwen3_5_bf16_decode_kernels_follow_the_candle_path() {
    let prompts = vec![vec![41, 273, 317, 435, 295, 82, 220, 16, 21], vec![87]];
    let dir = fixture_named("tiny-qwen3_5");
    let run = |fused: bool| {
        let ck = selfdistill::model::Checkpoint::open(dir.to_str().unwrap()).unwrap();
        let mut model = ck.load_transformer(&gpu(), DType::BF16).unwrap();
        model.set_fused_inference(true).unwrap();
        if !fused {
            model.set_fused_inference(false).unwrap();
        }
        let params = SamplingParams {
            temperature: 0.0,
            max_new_tokens: 8,
            ignore_eos: true,
            ..SamplingParams::default()
        };
        run_model(&model, &prompts, 2, params)
    };
    let (kernels, candle) = (run(true), run(false));
    assert_eq!(kernels.len(), 4);
    for (a, b) in kernels.iter().zip(&candle) {
        println!(
            "  kernels {:?} {:.4}\n  candle  {:?} {:.4}",
            a.tokens, a.cumulative_logprob, b.tokens, b.cumulative_logprob
        );
        assert_eq!(
            a.tokens, b.tokens,
            "Qwen3.5 greedy bf16, kernels against candle"
        );
        // the two paths round to bf16 at different points (2^-8 relative each): their summed
        // logprobs agree to a percent, not to f32's 1e-3 of the f32 tests
        let rel = (a.cumulative_logprob - b.cumulative_logprob).abs()
            / b.cumulative_logprob.abs().max(1.0);
        assert!(
            rel < 1e-2,
            "logprob {} vs {}",
            a.cumulative_logprob,
            b.cumulative_logprob
        );
    }
}

/// A `[train]` config over the fixture's SFT reference rows (data + filter of 40 GSM8K problems,
/// as `tests/train.rs`), 8 steps (two epochs of 5 steps, cut at 8), on `device` in `compute`;
/// written to `dir/NAME.toml`.
fn train_config(dir: &std::path::Path, name: &str, device: &str, compute: &str) -> PathBuf {
    let data = common::shared_root().join("data/gsm8k_train.jsonl");
    let train = format!(
        "lr = 0.003
rows_per_step = 8
epochs = 2
max_steps = 8
warmup_steps = 1
max_seq_len = 256
micro_batch_tokens = 1024
loss_chunk_tokens = 100
checkpoint_every = 2
peak_tflops = 1.0
device = \"{device}\"
compute_dtype = \"{compute}\"
"
    );
    let cfg = common::gsm8k_train_config(name, name, &data, &fixture(), &train);
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, cfg).unwrap();
    p
}

/// Runs `pipeline run all` on `config` (with `env`); returns the train stage's folder.
fn run_train(dir: &std::path::Path, config: &std::path::Path, env: &[(&str, &str)]) -> PathBuf {
    let mut cmd = common::bin();
    cmd.args(["run", "all", "--config", config.to_str().unwrap()])
        .current_dir(dir);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    if env.is_empty() {
        assert!(o.status.success(), "{text}");
    }
    let name = config.file_stem().unwrap().to_str().unwrap();
    let stages = dir.join(name).join("stages");
    std::fs::read_dir(&stages)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("train")
        })
        .unwrap_or_else(|| panic!("no train stage in {}: {text}", stages.display()))
}

/// (loss, grad_norm) of each step of a train stage's `metrics.jsonl`.
fn losses(stage: &std::path::Path) -> Vec<(f64, f64)> {
    std::fs::read_to_string(stage.join("train_state/metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["loss"].as_f64().unwrap(),
                v["grad_norm"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// The exported model's tensors as f32.
fn exported(stage: &std::path::Path) -> std::collections::HashMap<String, Tensor> {
    candle_core::safetensors::load(stage.join("model/model.safetensors"), &Device::Cpu).unwrap()
}

/// 8 steps on the GPU give the CPU's trajectory: in f32 within 1e-4 relative (losses, grad
/// norms) and the same exported parameters to 1e-4; in bf16 compute (fp32 master) within 2% of
/// the f32 losses (bf16's 8-bit mantissa; the CPU test of the same setting measures 0.5%).
#[test]
fn training_on_the_gpu_follows_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cpu = run_train(d, &train_config(d, "cpu", "cpu", "f32"), &[]);
    let gpu = run_train(d, &train_config(d, "gpu", "cuda", "f32"), &[]);
    let bf16 = run_train(d, &train_config(d, "bf", "cuda", "bf16"), &[]);
    let (lc, lg, lb) = (losses(&cpu), losses(&gpu), losses(&bf16));
    assert_eq!(lc.len(), 8);
    for (i, ((c, g), b)) in lc.iter().zip(&lg).zip(&lb).enumerate() {
        assert!(
            (c.0 - g.0).abs() <= 1e-4 * c.0,
            "step {i}: loss {} vs {}",
            g.0,
            c.0
        );
        assert!(
            (c.1 - g.1).abs() <= 1e-4 * c.1,
            "step {i}: norm {} vs {}",
            g.1,
            c.1
        );
        assert!(
            (c.0 - b.0).abs() <= 0.02 * c.0,
            "step {i}: bf16 loss {} vs {}",
            b.0,
            c.0
        );
    }
    let (wc, wg) = (exported(&cpu), exported(&gpu));
    for (name, t) in &wc {
        let err = rel_err(&wg[name], t);
        assert!(err <= 1e-4, "{name}: GPU export differs by {err}");
    }
}

/// A GPU run SIGKILLed right after its checkpoint at step 4 and rerun ends with the weights of
/// the uninterrupted GPU run: bit for bit where the kernels are deterministic (the test prints
/// which), and within 1e-6 in any case.
#[test]
fn a_killed_gpu_run_resumes_to_the_uninterrupted_weights() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let straight = run_train(d, &train_config(d, "a", "cuda", "bf16"), &[]);
    let cfg = train_config(d, "b", "cuda", "bf16");
    run_train(
        d,
        &cfg,
        &[(selfdistill::fault::ENV, "train.after_checkpoint:2")],
    );
    let resumed = run_train(d, &cfg, &[]);
    let (a, b) = (exported(&straight), exported(&resumed));
    let same = std::fs::read(straight.join("model/model.safetensors")).unwrap()
        == std::fs::read(resumed.join("model/model.safetensors")).unwrap();
    eprintln!("resumed GPU weights bit-identical: {same}");
    for (name, t) in &a {
        let err = rel_err(&b[name], t);
        assert!(err <= 1e-6, "{name}: resumed weights differ by {err}");
    }
}

/// The Gated DeltaNet decode kernels at Qwen3.5-4B's head size (dk = dv = 128: each state
/// column split over 4 threads, their partial sums meeting in shared memory), which the tiny
/// fixture (dk = 16) does not reach: a random hybrid model in f32, kernels against the candle
/// path on the GPU, the same greedy tokens.
#[test]
fn gated_deltanet_kernels_at_head_dim_128_follow_the_candle_path() {
    let mut cfg = selfdistill::model::init::shape("hybrid-20m").unwrap();
    let l = cfg.linear.expect("a hybrid shape");
    cfg.linear = Some(selfdistill::model::config::LinearAttention {
        key_head_dim: 128,
        value_head_dim: 128,
        ..l
    });
    let prompts = vec![vec![5, 17, 300, 41, 9, 77, 12], vec![3]];
    let params = SamplingParams {
        temperature: 0.0,
        max_new_tokens: 12,
        ignore_eos: true,
        ..SamplingParams::default()
    };
    // the same seeded weights (drawn on the host) for both runs
    let weights = selfdistill::model::init::random_weights(&cfg).unwrap();
    let run = |fused: bool| {
        let w: std::collections::HashMap<String, Tensor> = weights
            .iter()
            .map(|(k, v)| (k.clone(), v.to_device(&gpu()).unwrap()))
            .collect();
        let vb = candle_nn::VarBuilder::from_tensors(w, DType::F32, &gpu());
        let mut model = selfdistill::model::Transformer::new(&cfg, vb).unwrap();
        model.set_fused_inference(true).unwrap();
        if !fused {
            model.set_fused_inference(false).unwrap();
        }
        run_model(&model, &prompts, 2, params.clone())
    };
    let (kernels, candle) = (run(true), run(false));
    assert_eq!(kernels.len(), 4);
    assert_same_samples(
        &candle,
        &kernels,
        "hybrid dk 128 f32, kernels against candle",
    );
}

/// Seeded samples do not depend on what else is in the batch, on the GPU: at max_num_seqs 1 and
/// 64 the same tokens, for Qwen3 (paged attention) and Qwen3.5 (the state slots on the device
/// and the Gated DeltaNet kernels), and the CPU's.
#[test]
fn seeded_gpu_samples_are_the_same_at_max_num_seqs_1_and_64() {
    let prompts = vec![
        vec![41, 273, 317, 435, 295, 82],
        vec![87],
        vec![308, 434, 82, 86],
    ];
    let params = top_k_top_p(24, 11);
    for name in ["tiny-qwen3", "tiny-qwen3_5"] {
        let dir = fixture_named(name);
        let ck = selfdistill::model::Checkpoint::open(dir.to_str().unwrap()).unwrap();
        let mut samples = Vec::new();
        for dev in [Device::Cpu, gpu()] {
            let mut model = ck.load_transformer(&dev, DType::F32).unwrap();
            model.set_fused_inference(true).unwrap();
            for max in [1, 64] {
                samples.push(run_model_with(&model, &prompts, 3, params.clone(), max));
            }
        }
        assert_eq!(samples[0].len(), 9, "{name}");
        for (i, s) in samples.iter().enumerate().skip(1) {
            assert_same_samples(
                &samples[0],
                s,
                &format!("{name}, run {i} of cpu/gpu x 1/64"),
            );
        }
    }
}

/// Max |a - b| over f32 copies, and max |b|.
fn max_abs(a: &[f32], b: &[f32]) -> (f64, f64) {
    assert_eq!(a.len(), b.len());
    assert!(a.iter().all(|x| x.is_finite()), "non-finite output");
    let d = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from((x - y).abs()))
        .fold(0.0, f64::max);
    (d, b.iter().map(|y| f64::from(y.abs())).fold(0.0, f64::max))
}

fn host(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// The FlashAttention-2 kernels (`kernels/flash_attention.cu`) against their tiling on the CPU
/// (`model::attention::flash`, f32, on the same bf16-rounded inputs), forward and backward: GQA
/// 1:1, 4:1 and 8:1, head_dim 64, 128 and 256, packed sequences of lengths that are not a
/// multiple of a tile (one of one token), sliding windows. The tolerance is the spread of the
/// path the GPU trained with before these kernels, the block attention in bf16 (candle's ops
/// and autograd), against the same reference: the kernels may be off by at most twice as much.
#[test]
fn flash_attention_kernels_follow_their_tiling() {
    use selfdistill::cuda::flash_attention as fa;
    use selfdistill::model::attention::{block, flash};
    let dev = gpu();
    // (query heads, KV heads, head_dim, sequence lengths, window)
    type Case<'a> = (usize, usize, usize, &'a [usize], Option<usize>);
    let cases: &[Case] = &[
        (32, 8, 128, &[300, 77], None),
        (16, 4, 64, &[129], Some(50)),
        (8, 1, 256, &[200, 1, 64], None),
        (4, 4, 128, &[65], Some(3)),
        (8, 2, 128, &[1000], Some(600)),
    ];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut draw = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ((seed >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0) as f32
            })
            .collect()
    };
    let mut failed = Vec::new();
    for &(hq, hkv, d, lens, window) in cases {
        let t: usize = lens.iter().sum();
        let what = format!("hq {hq} hkv {hkv} d {d} lens {lens:?} window {window:?}");
        let bf = |x: Vec<f32>, h: usize| {
            Tensor::from_vec(x, (t, h, d), &dev)
                .unwrap()
                .to_dtype(DType::BF16)
                .unwrap()
        };
        let (q, k, v, d_o) = (
            bf(draw(t * hq * d), hq),
            bf(draw(t * hkv * d), hkv),
            bf(draw(t * hkv * d), hkv),
            bf(draw(t * hq * d), hq),
        );
        let heads = flash::Heads {
            hq,
            hkv,
            d,
            scale: 1.0 / (d as f32).sqrt(),
            window,
        };
        let (hq_, hk_, hv_, hdo) = (host(&q), host(&k), host(&v), host(&d_o));
        let (o_ref, lse_ref) = flash::forward(flash::KERNEL_TILES, &hq_, &hk_, &hv_, lens, heads);
        let saved = flash::Saved {
            o: &o_ref,
            lse: &lse_ref,
            d_o: &hdo,
        };
        let (dq_ref, dk_ref, dv_ref) =
            flash::backward(flash::KERNEL_TILES, &hq_, &hk_, &hv_, saved, lens, heads);
        // the kernels
        let st = fa::starts(lens, &q).unwrap();
        let (o, lse) = fa::forward(&q, &k, &v, lens, &st, window).unwrap();
        let saved = fa::Saved {
            o: &o,
            lse: &lse,
            d_o: &d_o,
        };
        let (dq, dk, dv) = fa::backward(&q, &k, &v, saved, lens, &st, window).unwrap();
        // the block attention in bf16, with candle's autograd, per sequence
        let vars = [&q, &k, &v].map(|x| candle_core::Var::from_tensor(x).unwrap());
        let mut outs = Vec::new();
        let mut start = 0;
        for &l in lens {
            let n = |x: &candle_core::Var| x.as_tensor().narrow(0, start, l).unwrap();
            outs.push(
                block::causal(
                    &n(&vars[0]),
                    &n(&vars[1]),
                    &n(&vars[2]),
                    block::BLOCK,
                    window,
                )
                .unwrap(),
            );
            start += l;
        }
        let o_block = Tensor::cat(&outs, 0).unwrap();
        let grads = (o_block.to_dtype(DType::F32).unwrap() * d_o.to_dtype(DType::F32).unwrap())
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let g = |i: usize| host(grads.get(vars[i].as_tensor()).unwrap());
        let pairs = [
            ("o", host(&o), host(&o_block), &o_ref),
            ("dq", host(&dq), g(0), &dq_ref),
            ("dk", host(&dk), g(1), &dk_ref),
            ("dv", host(&dv), g(2), &dv_ref),
        ];
        for (name, ours, theirs, reference) in pairs {
            let (err, scale) = max_abs(&ours, reference);
            let (spread, _) = max_abs(&theirs, reference);
            println!(
                "{what} {name}: kernel {err:.3e}, block bf16 {spread:.3e}, max |ref| {scale:.3e}"
            );
            if err > 2.0 * spread {
                failed.push(format!(
                    "{what}: {name} off by {err:e}, the bf16 block attention by {spread:e}"
                ));
            }
        }
        let (err, _) = max_abs(&host(&lse), &lse_ref);
        println!("{what} lse: kernel {err:.3e}");
    }
    // every case printed first, then the failures together
    assert!(failed.is_empty(), "{failed:#?}");
}

/// A test backend holding recurrent states for one Gated DeltaNet layer: on the GPU, a pool
/// handed to the kernels in place (`pool` set); on the CPU, the same slots handed out as copies
/// and taken back (the candle path's reference).
struct SlotBackend {
    seq_lens: Vec<usize>,
    slots: Vec<usize>,
    /// (slots, values) f32.
    pool: Tensor,
    on_device: bool,
}

impl AttentionBackend for SlotBackend {
    fn attend(
        &mut self,
        layer: usize,
        _q: &Tensor,
        _k: &Tensor,
        _v: &Tensor,
        _window: Option<usize>,
    ) -> candle_core::Result<Tensor> {
        candle_core::bail!("layer {layer}: no attention in this test")
    }

    fn recurrent_pool(
        &mut self,
        _layer: usize,
        _values: usize,
    ) -> candle_core::Result<Option<selfdistill::model::attention::PoolStep>> {
        if !self.on_device {
            return Ok(None);
        }
        let dev = self.pool.device().clone();
        let ids: Vec<u32> = self.slots.iter().map(|&s| s as u32).collect();
        let starts = selfdistill::model::attention::seq_starts(&self.seq_lens);
        Ok(Some(selfdistill::model::attention::PoolStep {
            seq_lens: self.seq_lens.clone(),
            pool: self.pool.clone(),
            ids: Tensor::new(ids.as_slice(), &dev)?,
            starts: starts
                .map(|s| Tensor::new(s.as_slice(), &dev))
                .transpose()?,
        }))
    }

    fn recurrent_state(
        &mut self,
        layer: usize,
        _values: usize,
    ) -> candle_core::Result<selfdistill::model::attention::RecurrentStep> {
        if self.on_device {
            candle_core::bail!("layer {layer}: the kernels were to take the pool in place")
        }
        let rows: Vec<Tensor> = self
            .slots
            .iter()
            .map(|&s| self.pool.get(s))
            .collect::<candle_core::Result<_>>()?;
        Ok(selfdistill::model::attention::RecurrentStep {
            seq_lens: self.seq_lens.clone(),
            state: Some(Tensor::stack(&rows, 0)?),
        })
    }

    fn store_recurrent_state(&mut self, layer: usize, state: Tensor) -> candle_core::Result<()> {
        if self.on_device {
            candle_core::bail!("layer {layer}: the kernels were to write the pool in place")
        }
        let mut rows: Vec<Tensor> = (0..self.pool.dim(0)?)
            .map(|s| self.pool.get(s))
            .collect::<candle_core::Result<_>>()?;
        for (i, &s) in self.slots.iter().enumerate() {
            rows[s] = state.get(i)?;
        }
        self.pool = Tensor::stack(&rows, 0)?;
        Ok(())
    }
}

/// The Gated DeltaNet kernels as sampling runs them: the states updated in place in a pool of
/// slots (the step's slots out of order, the others left alone), prompts of several tokens (one
/// longer than the candle path's chunk) beside a decode token, the kernels reading the parts of
/// one stacked input projection's rows. The whole mixer (f32, key/value head_dim 16 and 128)
/// against the candle path on the CPU: outputs and every slot's state after. The two forms of
/// the delta rule (the CPU's chunks, the kernel's tokens) agree to 1e-4 on the CPU
/// (`chunked_and_recurrent_forms_agree`): the same bound here, relative to the largest value.
#[test]
fn gated_deltanet_kernels_update_the_slots_in_place() {
    use selfdistill::model::layer_ops::candle_ops::CandleOps;
    use selfdistill::model::layers::gated_deltanet::GatedDeltaNet;
    use selfdistill::model::ops::Exec;
    for dk in [16, 128] {
        let mut cfg = selfdistill::model::init::shape("hybrid-20m").unwrap();
        let l = cfg.linear.expect("a hybrid shape");
        let l = selfdistill::model::config::LinearAttention {
            key_head_dim: dk,
            value_head_dim: dk,
            ..l
        };
        cfg.linear = Some(l);
        let first = cfg
            .layer_kinds
            .iter()
            .position(|&k| k == selfdistill::model::config::LayerKind::GatedDeltaNet)
            .unwrap();
        let weights = selfdistill::model::init::random_weights(&cfg).unwrap();
        let (seq_lens, slots) = (vec![5, 1, 70], vec![3, 0, 4]);
        let t: usize = seq_lens.iter().sum();
        let h = Tensor::randn(0f32, 1.0, (t, cfg.hidden_size), &Device::Cpu).unwrap();
        let pool0 = Tensor::randn(0f32, 0.5, (6, l.state_values()), &Device::Cpu).unwrap();
        let run = |dev: &Device| {
            let w: std::collections::HashMap<String, Tensor> = weights
                .iter()
                .map(|(k, v)| (k.clone(), v.to_device(dev).unwrap()))
                .collect();
            let vb = candle_nn::VarBuilder::from_tensors(w, DType::F32, dev);
            let vb = vb.pp(format!("model.layers.{first}"));
            let mut layer = GatedDeltaNet::new(&cfg, vb).unwrap();
            let on_device = dev.is_cuda();
            let mut ops = if on_device {
                layer.stack_projections().unwrap();
                CandleOps::new(Exec::Sampling)
            } else {
                CandleOps::new(Exec::Composed)
            };
            let mut backend = SlotBackend {
                seq_lens: seq_lens.clone(),
                slots: slots.clone(),
                pool: pool0.to_device(dev).unwrap().copy().unwrap(),
                on_device,
            };
            let y = layer
                .forward(&mut ops, first, h.to_device(dev).unwrap(), &mut backend)
                .unwrap();
            (host(&y), host(&backend.pool))
        };
        let (y_gpu, pool_gpu) = run(&gpu());
        let (y_cpu, pool_cpu) = run(&Device::Cpu);
        let (dy, my) = max_abs(&y_gpu, &y_cpu);
        let (ds, ms) = max_abs(&pool_gpu, &pool_cpu);
        println!("dk {dk}: output {dy:.2e} of {my:.2e}, states {ds:.2e} of {ms:.2e}");
        assert!(
            dy <= 1e-4 * my,
            "dk {dk}: outputs differ by {dy} (largest {my})"
        );
        assert!(
            ds <= 1e-4 * ms,
            "dk {dk}: states differ by {ds} (largest {ms})"
        );
        // the slots outside the step are untouched, bit for bit
        let v = l.state_values();
        let p0 = host(&pool0);
        for s in [1, 2, 5] {
            assert_eq!(
                pool_gpu[s * v..(s + 1) * v],
                p0[s * v..(s + 1) * v],
                "slot {s}"
            );
        }
    }
}

/// The fused sampling kernels of a layer (`kernels/layer_ops.cu`'s q/k/v epilogue, the Gated
/// DeltaNet kernels on a step's own states with prompts of several tokens) against the candle
/// path, through a whole forward of packed prompts (7, 1 and 12 tokens) of random models:
/// Qwen3 at head_dim 64 (GQA 2:1, per-head norms), and the hybrid Qwen3.5 shape (a gated query,
/// partial RoPE). The reference is the candle path in f32. In f32 the kernels' logits are within
/// 1e-4 of it (relative); in bf16 they may be off by at most twice as much as the candle path
/// in bf16 is.
#[test]
fn fused_layer_kernels_follow_the_candle_path() {
    use selfdistill::model::attention::CausalAttention;
    for name in ["50m", "hybrid-20m"] {
        let cfg = selfdistill::model::init::shape(name).unwrap();
        let weights = selfdistill::model::init::random_weights(&cfg).unwrap();
        let seq_lens = vec![7, 1, 12];
        let tokens: Vec<u32> = (0..20u32).map(|i| (i * 7919 + 13) % 1000 + 5).collect();
        let positions: Vec<u32> = seq_lens.iter().flat_map(|&n| 0..n as u32).collect();
        let logits = |dtype: DType, fused: bool| {
            let dev = gpu();
            let w: std::collections::HashMap<String, Tensor> = weights
                .iter()
                .map(|(k, v)| (k.clone(), v.to_device(&dev).unwrap()))
                .collect();
            let vb = candle_nn::VarBuilder::from_tensors(w, dtype, &dev);
            let mut model = selfdistill::model::Transformer::new(&cfg, vb).unwrap();
            model.set_fused_inference(true).unwrap();
            if !fused {
                model.set_fused_inference(false).unwrap();
            }
            let t = Tensor::new(tokens.as_slice(), &dev).unwrap();
            let p = Tensor::new(positions.as_slice(), &dev).unwrap();
            let mut attn = CausalAttention::new(seq_lens.clone());
            // counted, so that the test knows which path ran
            let mut counts = selfdistill::model::layer_ops::Counts::default();
            let into = selfdistill::model::transformer::CountInto {
                counts: &mut counts,
                as_cuda: false,
            };
            let hidden = model
                .forward_hidden_counted(&t, &p, &mut attn, Some(into))
                .unwrap();
            // the fused q/k/v epilogue is the matmul and one launch; candle's is six or more
            let qkv = counts
                .layer(3)
                .into_iter()
                .find(|o| o.0 == "qkv_rope")
                .unwrap();
            assert_eq!(
                qkv.2.launches == 2,
                fused,
                "{name} {dtype:?} fused {fused}: qkv_rope {qkv:?}"
            );
            model.logits(&hidden).unwrap()
        };
        let reference = logits(DType::F32, false);
        let f32_err = rel_err(&logits(DType::F32, true), &reference);
        let bf16_kernels = rel_err(&logits(DType::BF16, true), &reference);
        let bf16_candle = rel_err(&logits(DType::BF16, false), &reference);
        println!(
            "{name}: f32 kernels {f32_err:.2e}; bf16 kernels {bf16_kernels:.2e}, bf16 candle \
             {bf16_candle:.2e}"
        );
        assert!(f32_err <= 1e-4, "{name}: f32 kernels off by {f32_err}");
        assert!(
            bf16_kernels <= 2.0 * bf16_candle,
            "{name}: bf16 kernels off by {bf16_kernels}, the candle path by {bf16_candle}"
        );
    }
}

/// The fused AdamW kernel (`kernels/adamw.cu`) against the optimizer's host passes on the CPU,
/// its reference: three steps with clipping, weight decay on some parameters and a bf16
/// working copy, from the same weights, gradients and norm. The kernel rounds each operation as
/// the host does (no fused multiply-add), so the master weights, both moments and the working
/// copies are equal bit for bit; the statistics, summed in another grouping (per block, f32
/// partials), within 1e-6.
#[test]
fn the_fused_adamw_kernel_equals_the_host_passes() {
    use candle_core::Var;
    use selfdistill::train::adamw::{AdamW, AdamWConfig};
    let shapes: [(&str, &[usize]); 4] = [
        ("w.big", &[300, 257]),
        ("w.odd", &[4099]),
        ("norm.weight", &[64]),
        ("one", &[1]),
    ];
    let init: Vec<(String, Tensor)> = shapes
        .iter()
        .map(|(n, s)| {
            let t = Tensor::randn(0f32, 0.5, *s, &Device::Cpu).unwrap();
            (n.to_string(), t)
        })
        .collect();
    let decay = |name: &str| name.starts_with("w.");
    let setup = |dev: &Device| {
        let vars: Vec<(String, Var)> = init
            .iter()
            .map(|(n, t)| {
                (
                    n.clone(),
                    Var::from_tensor(&t.to_device(dev).unwrap()).unwrap(),
                )
            })
            .collect();
        let working: Vec<(String, Var)> = vars
            .iter()
            .map(|(n, v)| {
                let w = v.as_tensor().to_dtype(DType::BF16).unwrap();
                (n.clone(), Var::from_tensor(&w).unwrap())
            })
            .collect();
        let mut opt = AdamW::with_state(
            vars.clone(),
            AdamWConfig::default(),
            decay,
            selfdistill::train::adamw::StateRounding::F32,
            DType::BF16,
        )
        .unwrap();
        opt.set_working(&working).unwrap();
        (opt, vars, working)
    };
    // one device handle for the weights and the gradients: another handle on the same GPU is
    // another stream, which the fused kernel refuses (the candle slices would run instead)
    let dev = gpu();
    let (mut cpu, cpu_vars, cpu_work) = setup(&Device::Cpu);
    let (mut gpu_opt, gpu_vars, gpu_work) = setup(&dev);
    for step in 0..3 {
        let grads: Vec<Tensor> = init
            .iter()
            .map(|(_, t)| Tensor::randn(0f32, 1.0, t.shape(), &Device::Cpu).unwrap())
            .collect();
        let norm = AdamW::grad_norm(&grads).unwrap();
        let gpu_grads: Vec<Tensor> = grads.iter().map(|g| g.to_device(&dev).unwrap()).collect();
        let a = cpu.step_with_norm(&grads, norm, 1e-3, Some(1.0)).unwrap();
        let b = gpu_opt
            .step_with_norm(&gpu_grads, norm, 1e-3, Some(1.0))
            .unwrap();
        println!("step {step}: cpu {a:?}\n        gpu {b:?}");
        assert_eq!(
            (cpu.last_fused, gpu_opt.last_fused),
            (0, init.len()),
            "the CPU takes the host passes, the GPU the fused kernel"
        );
        assert_eq!(a.changed_share, b.changed_share, "step {step}");
        let rel = (a.update_ratio - b.update_ratio).abs() / a.update_ratio;
        assert!(
            rel < 1e-6,
            "step {step}: update ratio {} vs {}",
            a.update_ratio,
            b.update_ratio
        );
    }
    let bits = |t: &Tensor| -> Vec<u32> {
        let t = t.to_dtype(DType::F32).unwrap().flatten_all().unwrap();
        let v: Vec<f32> = t.to_device(&Device::Cpu).unwrap().to_vec1().unwrap();
        v.iter().map(|x| x.to_bits()).collect()
    };
    for (c, g) in cpu_vars.iter().zip(&gpu_vars) {
        assert_eq!(
            bits(c.1.as_tensor()),
            bits(g.1.as_tensor()),
            "master {}",
            c.0
        );
    }
    for (c, g) in cpu_work.iter().zip(&gpu_work) {
        assert_eq!(
            bits(c.1.as_tensor()),
            bits(g.1.as_tensor()),
            "working {}",
            c.0
        );
    }
    for (c, g) in cpu.state_tensors().iter().zip(gpu_opt.state_tensors()) {
        assert_eq!(bits(&c.1), bits(&g.1), "{}", c.0);
    }
}

#[test]
fn state_slots_read_one_row_and_keep_a_steps_rows_aside() {
    use selfdistill::sampler::state_slots::{SavedState, StateSlots};
    let dir = fixture_named("tiny-qwen3_5");
    let ck = selfdistill::model::Checkpoint::open(dir.to_str().unwrap()).unwrap();
    let cfg = ck.config.clone();
    let dev = gpu();
    let mut slots = StateSlots::new_on(&cfg, 4, &dev).unwrap();
    assert_eq!(slots.padding_slot(), Some(4));
    // every slot a state of its own: slot s holds s + 1 everywhere
    let taken: Vec<usize> = (0..4).map(|_| slots.alloc().unwrap().unwrap()).collect();
    let per_layer: Vec<usize> = (0..cfg.num_layers())
        .map(|i| cfg.layer_cache(i).fixed_values())
        .collect();
    let filled = |v: f32| {
        SavedState::Device(
            per_layer
                .iter()
                .map(|&n| (n > 0).then(|| Tensor::full(v, (1, n), &dev).unwrap()))
                .collect(),
        )
    };
    for &s in &taken {
        slots.write(s, &filled(s as f32 + 1.0)).unwrap();
    }
    // `read` copies the row alone, and keeps it when the pool changes
    let SavedState::Device(rows) = slots.read(taken[2]).unwrap() else {
        panic!("GPU slots read to the host")
    };
    slots.write(taken[2], &filled(-7.0)).unwrap();
    for (row, &n) in rows.iter().zip(&per_layer) {
        let Some(row) = row else {
            assert_eq!(n, 0);
            continue;
        };
        assert_eq!(row.dims(), &[1, n]);
        // its own buffer of one row, not a view into a copy of the whole pool
        assert_eq!(row.layout().start_offset(), 0);
        let got = host(row);
        assert!(
            got.iter().all(|&x| x == taken[2] as f32 + 1.0),
            "{:?}",
            &got[..4]
        );
    }
    // a step's first rows kept aside and put back after the pool changed
    let step = vec![taken[3], taken[0], 4, 4];
    let ids: Vec<u32> = step.iter().map(|&s| s as u32).collect();
    let ids = Tensor::new(ids.as_slice(), &dev).unwrap();
    slots.set_step_rows(&step, ids, &[1; 4], None).unwrap();
    let saved = slots.save_step_rows(2).unwrap();
    assert_eq!(
        slots.step_rows_bytes(2),
        2 * 4 * per_layer.iter().sum::<usize>() as u64
    );
    slots.write(taken[3], &filled(0.5)).unwrap();
    slots.write(taken[0], &filled(0.25)).unwrap();
    slots.restore_step_rows(&saved).unwrap();
    for (s, want) in [
        (taken[3], taken[3] as f32 + 1.0),
        (taken[0], taken[0] as f32 + 1.0),
    ] {
        let SavedState::Device(rows) = slots.read(s).unwrap() else {
            panic!()
        };
        for row in rows.iter().flatten() {
            assert!(host(row).iter().all(|&x| x == want), "slot {s}");
        }
    }
    slots.forget_step_rows();
}
