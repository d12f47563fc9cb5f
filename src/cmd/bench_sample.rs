//! `pipeline bench sample`: the sampler's speed on a randomly initialised model of a given shape
//! (no weights needed): prefill and decode tokens/s at several batch sizes, generation of fixed
//! length (`ignore_eos`).
//!
//! A benchmark that prints figures, never a timed test. The whole batch's prompts fit one step's
//! token budget, so the first step is the prefill (it also samples each sequence's first token);
//! every later step is decode.

use std::time::Instant;

use anyhow::{bail, Result};
use candle_core::DType;
#[cfg(feature = "cuda")]
use candle_core::{Device, Tensor};

use crate::device::DeviceSpec;
use crate::jobs::sample::settings::{LogitsEngine, SampleDtype};
use crate::machine::{
    fma_peak, matmul_ceiling, packed_matmul_ceiling, packed_matmul_rate, read_bandwidth, CEILING_N,
};
use crate::model::clock;
use crate::model::init::{random_model, shape};
use crate::model::{LayerCache, LayerKind, ModelConfig, Transformer};
use crate::sampler::backend::GraphCounts;
use crate::sampler::engine::{Engine, EngineConfig, Request};
use crate::sampler::kv_cache::KvCache;
use crate::sampler::params::SamplingParams;
use crate::sampler::scheduler::SchedulerConfig;
use crate::sampler::state_slots::StateSlots;

#[derive(Debug, clap::Args)]
pub struct SampleBenchArgs {
    /// `tiny` (the fixture's shapes), `20m` (a ~20M-parameter Qwen3), `qwen3-0.6b`, `qwen3-4b`,
    /// `qwen2.5-1.5b` (Qwen2: q/k/v biases), `hybrid-20m` (a ~20M-parameter Qwen3.5: Gated
    /// DeltaNet and gated attention), `qwen3.5-0.8b` or `qwen3.5-4b`; `qwen2:NAME` is a Qwen3 shape as Qwen2,
    /// `gemma3:NAME` as Gemma 3 (and `gemma3-1b`).
    #[arg(long, default_value = "20m")]
    pub shape: String,
    /// Batch sizes (comma-separated).
    #[arg(long, default_value = "1,8,32,64")]
    pub batch: String,
    #[arg(long, default_value_t = 64)]
    pub prompt_len: usize,
    #[arg(long, default_value_t = 32)]
    pub new_tokens: usize,
    /// New tokens of a run split by op after each batch size's timed runs: the time between
    /// consecutive ops (CUDA events on a GPU, the wall clock on the CPU), by layer kind and op;
    /// 0 (the default) runs none.
    #[arg(long, default_value_t = 0)]
    pub split_tokens: usize,
    /// Runs per batch size; the best is reported (the machine's noise only ever slows a run).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Sampling temperature (0 = greedy, as `benches/hf_generate.py` does by default).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Top-k when sampling (0 = off; Qwen3's recommended settings use 20).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Top-p when sampling (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// `cpu`, or `cuda` / `cuda:N` (a binary built with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    pub device: DeviceSpec,
    /// Weights' dtype: `auto` (f32 on the CPU, bf16 on a GPU), `f32` or `bf16`.
    #[arg(long, value_enum, default_value = "auto")]
    pub dtype: SampleDtype,
    /// Keys and values in fp8 e4m3 (CUDA with bf16 weights).
    #[arg(long)]
    pub kv_fp8: bool,
    /// Also print the packed gemm's rate at each batch's decode shapes (CPU).
    #[arg(long)]
    pub gemm_rates: bool,
    /// `selfdistill` (ours) or `mistralrs` (mistral.rs with its own sampler, on the same
    /// weights written as a Hugging Face folder; a binary built with `--features mistralrs`).
    #[arg(long, value_enum, default_value = "selfdistill")]
    pub engine: LogitsEngine,
    /// Instead of timing: count what one step issues (kernel launches, device allocations,
    /// copies, waits) per layer kind and outside the layers, for a decode step at each batch and
    /// a prefill at the first; `--device cuda` counts a GPU's step on any machine.
    #[arg(long)]
    pub count: bool,
    /// With `--count`: one JSON object per phase and batch instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Run every GPU decode step eagerly instead of replaying CUDA graphs (the timed runs; the
    /// split's runs are eager anyway, since they time inside a step).
    #[arg(long)]
    pub enforce_eager: bool,
}

/// The benchmark's prompt for sequence `b`: `len` tokens spread over the vocabulary (the same
/// for every engine).
fn bench_prompt(b: usize, len: usize, vocab: usize) -> Vec<u32> {
    (0..len)
        .map(|t| ((b * 7919 + t * 104_729) % vocab) as u32)
        .collect()
}

/// (prefill tokens/s, decode tokens/s, the decode steps' time split, the steps under CUDA
/// graphs) for `batch` requests of `prompt_len` tokens generating `new` tokens each. The split: with `split`, the decode steps
/// under the clock ([`clock`]: CUDA events on a GPU) by layer kind and op; else by the engine's
/// timers (synchronised between the parts of a step with `sync_timing`).
fn timed_run(
    model: &Transformer,
    batch: usize,
    prompt_len: usize,
    new: usize,
    a: &SampleBenchArgs,
    sync_timing: bool,
    split: bool,
) -> Result<(f64, f64, String, GraphCounts)> {
    let cfg = model.config();
    let block_size = 16;
    let per_seq = (prompt_len + new).div_ceil(block_size) + 1;
    let ecfg = EngineConfig {
        scheduler: SchedulerConfig {
            block_size,
            max_num_seqs: batch,
            max_num_batched_tokens: (batch * prompt_len).max(batch),
        },
        num_blocks: per_seq * batch,
        params: SamplingParams {
            max_new_tokens: new,
            ignore_eos: true,
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            ..SamplingParams::default()
        },
        eos_token_ids: Vec::new(),
        kv_fp8: a.kv_fp8,
        thinking: None,
    };
    let mut e = Engine::new(model, ecfg)?;
    e.sync_timing = sync_timing && !split;
    if a.enforce_eager {
        e.set_cuda_graphs(false)?;
    }
    for b in 0..batch {
        e.add(Request {
            problem_id: format!("bench/{b}"),
            prompt: bench_prompt(b, prompt_len, cfg.vocab_size),
            n: 1,
            settings: None,
        })?;
    }
    let t0 = Instant::now();
    e.step(None)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let first = e.stats.generated_tokens;
    let at_prefill = e.stats.time;
    let t1 = Instant::now();
    let by_op = if split {
        let ((), s) = clock::timed(model.device(), "decode", || -> Result<()> {
            while !e.is_idle() {
                e.step(None)?;
            }
            Ok(())
        })?;
        Some(s)
    } else {
        while !e.is_idle() {
            e.step(None)?;
        }
        None
    };
    let decode_s = t1.elapsed().as_secs_f64();
    let rates = (
        (batch * prompt_len) as f64 / prefill_s.max(1e-9),
        (e.stats.generated_tokens - first) as f64 / decode_s.max(1e-9),
    );
    if let Some(s) = by_op {
        let steps = new.saturating_sub(1).max(1) as f64;
        let split = format!(
            "{:.3} ms per decode step between the first and last marks ({:.3} ms host wall), by \
             op:\n{}",
            1e3 * s.marked / steps,
            1e3 * s.wall / steps,
            s.table(0.005)
        );
        return Ok((rates.0, rates.1, split, e.graph_counts()));
    }
    // the split of the decode steps alone
    let (t, p) = (e.stats.time, at_prefill);
    let share = |x: f64, y: f64| 100.0 * (x - y) / decode_s.max(1e-9);
    let split = format!(
        "decode step: layers {:.0}%, attention {:.0}%, lm_head {:.0}%, sampling {:.0}%, \
         scheduling {:.0}%",
        share(t.layers, p.layers),
        share(t.attention, p.attention),
        share(t.lm_head, p.lm_head),
        share(t.sampling, p.sampling),
        share(t.schedule, p.schedule)
    );
    Ok((rates.0, rates.1, split, e.graph_counts()))
}

pub fn run(a: &SampleBenchArgs) -> Result<()> {
    let cfg = shape(&a.shape)?;
    let batches: Vec<usize> = a
        .batch
        .split(',')
        .map(|b| b.trim().parse::<usize>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("--batch {}: {e}", a.batch))?;
    if a.json && !a.count {
        bail!("--json: only with --count");
    }
    if a.count {
        return super::bench_count::run(&a.shape, &cfg, a.device, &batches, a.prompt_len, a.json);
    }
    let dev = crate::model::open_device(a.device)?;
    let dtype = a
        .dtype
        .resolve(a.device)
        .map_err(|e| anyhow::anyhow!("--{e}"))?;
    match a.engine {
        LogitsEngine::Selfdistill => {}
        #[cfg(feature = "mistralrs")]
        LogitsEngine::Mistralrs => return run_mistralrs(a, &cfg, &batches, &dev, dtype),
        #[cfg(not(feature = "mistralrs"))]
        LogitsEngine::Mistralrs => {
            bail!("--engine mistralrs: this binary was built without the mistralrs feature")
        }
    }
    if !dev.is_cpu() {
        #[cfg(feature = "cuda")]
        return run_gpu(a, &cfg, &batches, &dev, dtype);
        #[cfg(not(feature = "cuda"))]
        bail!(
            "--device {}: this binary was built without the cuda feature",
            a.device
        );
    }
    if dtype != DType::F32 || a.kv_fp8 {
        bail!("the CPU sampler runs f32 weights and an f32 KV cache");
    }
    run_cpu(a, &cfg, &batches)
}

/// The CPU sampler's rates at each batch size, against this machine's matmul rate and roofline.
fn run_cpu(a: &SampleBenchArgs, cfg: &ModelConfig, batches: &[usize]) -> Result<()> {
    let mut model = random_model(cfg)?;
    model.set_fused_inference(true)?;
    crate::outln!(
        "shape {} ({:.1}M parameters, f32, {} threads), prompt {} tokens, {} new tokens, KV {} \
         bytes/token{}, temperature {} top-k {} top-p {}, best of {} runs",
        a.shape,
        cfg.num_params() as f64 / 1e6,
        rayon::current_num_threads(),
        a.prompt_len,
        a.new_tokens,
        KvCache::bytes_per_token(cfg),
        match StateSlots::bytes_per_seq(cfg) {
            0 => String::new(),
            b => format!(", recurrent state {b} bytes/sequence"),
        },
        a.temperature,
        a.top_k,
        a.top_p,
        a.repeat.max(1)
    );
    let (candle_rate, packed_rate) = (matmul_ceiling()?, packed_matmul_ceiling());
    let ceiling = candle_rate.max(packed_rate);
    // the peak is the best rate anything here reaches: a register-only multiply-add loop (AVX2)
    // can trail a gemm that uses wider vectors (AVX-512), and a roofline below a measured rate
    // would call a slow step fast
    let (peak, bw) = (fma_peak().max(ceiling), read_bandwidth());
    crate::outln!(
        "machine: multiply-add peak {:.1} GFLOP/s (the best of a multiply-add loop and the \
         gemms), memory read bandwidth {:.1} GB/s; matmul \
         ({2}x{2}x{2}, f32): candle's gemm {3:.1} GFLOP/s, the sampler's packed gemm {4:.1} GFLOP/s",
        peak / 1e9,
        bw / 1e9,
        CEILING_N,
        candle_rate / 1e9,
        packed_rate / 1e9
    );
    crate::outln!(
        "roofline: a decode step can go no faster than its FLOPs at the multiply-add peak, nor \
         than its bytes (every weight, {:.0} MB, plus each sequence's keys and values and its \
         recurrent state, read and written) at the read bandwidth",
        (cfg.num_params() * 4) as f64 / 1e6
    );
    crate::outln!(
        "{:>6} {:>14} {:>14} {:>16} {:>11} {:>15} {:>12}",
        "batch",
        "prefill tok/s",
        "decode tok/s",
        "decode GFLOP/s",
        "of matmul",
        "roofline tok/s",
        "of roofline"
    );
    let mut first_decode = None;
    for &b in batches {
        let (mut prefill, mut decode, mut split) = (0.0, 0.0, String::new());
        for _ in 0..a.repeat.max(1) {
            let (p, d, s, _) =
                timed_run(&model, b, a.prompt_len, a.new_tokens + 1, a, false, false)?;
            prefill = f64::max(prefill, p);
            if d > decode {
                (decode, split) = (d, s);
            }
        }
        let ctx = a.prompt_len + a.new_tokens / 2;
        let flops = decode * decode_flops_per_token(cfg, ctx);
        let roof = decode_roofline(cfg, b, ctx, peak, bw);
        crate::outln!(
            "{b:>6} {prefill:>14.1} {decode:>14.1} {:>16.1} {:>10.1}% {:>11.1} ({}) {:>11.1}%",
            flops / 1e9,
            100.0 * flops / ceiling,
            roof.0,
            if roof.1 { "FLOP" } else { "mem" },
            100.0 * decode / roof.0
        );
        crate::outln!("       {split}");
        if a.split_tokens > 0 {
            let (_, _, split, _) =
                timed_run(&model, b, a.prompt_len, a.split_tokens + 1, a, false, true)?;
            crate::outln!(
                "       time between ops (run of {} new tokens, wall clock): {split}",
                a.split_tokens
            );
        }
        remember(a, "cpu", cfg, b, decode);
        if a.gemm_rates {
            crate::outln!("       {}", decode_gemm_rates(cfg, b));
        }
        let base = *first_decode.get_or_insert((b, decode, roof.0));
        if b != base.0 {
            crate::outln!(
                "       decode at batch {b} = {:.1}x batch {} (their rooflines: {:.1}x)",
                decode / base.1,
                base.0,
                roof.0 / base.2
            );
        }
    }
    Ok(())
}

/// mistral.rs (its own sampler and scheduler) on the same random weights, written as a Hugging
/// Face folder under the temp dir (kept for the next run: the name carries a hash of the shape),
/// with the same prompts, lengths and best-of-`repeat` as ours.
#[cfg(feature = "mistralrs")]
fn run_mistralrs(
    a: &SampleBenchArgs,
    cfg: &ModelConfig,
    batches: &[usize],
    dev: &candle_core::Device,
    dtype: DType,
) -> Result<()> {
    use sha2::Digest;
    let json = crate::model::init::shape_json(&a.shape)?;
    let hash = hex::encode(sha2::Sha256::digest(json.as_bytes()));
    // in the run's dtype: a 4B shape in f32 is 16 GB to write before anything runs
    let dir = std::env::temp_dir().join(format!(
        "selfdistill-bench-{}-{dtype:?}-{}",
        a.shape,
        &hash[..12]
    ));
    if !dir.join("model.safetensors").is_file() {
        crate::model::init::write_random_hf(&a.shape, &dir, dtype)?;
    }
    let opts = crate::jobs::mistralrs::Options {
        model_dir: dir.clone(),
        device: dev.clone(),
        dtype,
        max_num_seqs: batches.iter().copied().max().unwrap_or(1),
        block_size: 16,
        kv_cache_bytes: None,
        kv_fp8: a.kv_fp8,
        context: a.prompt_len + a.new_tokens + 1,
    };
    let bench = crate::jobs::mistralrs::Bench::load(&opts)?;
    crate::outln!(
        "shape {} ({:.1}M parameters, {dtype:?}) on mistral.rs 0.8.1 ({}), prompt {} tokens, {} \
         new tokens, temperature {} top-k {} top-p {}, best of {} runs; weights in {}",
        a.shape,
        cfg.num_params() as f64 / 1e6,
        if dev.is_cpu() {
            "no paged attention on the CPU"
        } else {
            "paged attention"
        },
        a.prompt_len,
        a.new_tokens,
        a.temperature,
        a.top_k,
        a.top_p,
        a.repeat.max(1),
        dir.display()
    );
    if dev.is_cpu() {
        crate::outln!(
            "(mistral.rs 0.8.1 batches without paged attention, as on the CPU, give sequences \
             each other's KV caches: batched rows are its speed, not a correct run; see docs/mistralrs.md)"
        );
    }
    crate::outln!(
        "{:>6} {:>14} {:>14}",
        "batch",
        "prefill tok/s",
        "decode tok/s"
    );
    for &b in batches {
        let prompts: Vec<Vec<u32>> = (0..b)
            .map(|i| bench_prompt(i, a.prompt_len, cfg.vocab_size))
            .collect();
        let (mut prefill, mut decode) = (0.0f64, 0.0f64);
        for _ in 0..a.repeat.max(1) {
            let (p, d) = bench.run(&prompts, a.new_tokens + 1, a.temperature, a.top_k, a.top_p)?;
            prefill = prefill.max(p);
            decode = decode.max(d);
        }
        crate::outln!("{b:>6} {prefill:>14.1} {decode:>14.1}");
    }
    Ok(())
}

#[cfg(feature = "cuda")]
/// The GPU benchmark: the two ceilings of the device, then for each batch size the decode rate
/// against the bandwidth roofline (weights plus every sequence's keys and values read once per
/// step, and its recurrent states read and written), and the step's time split from a second
/// run.
fn run_gpu(
    a: &SampleBenchArgs,
    cfg: &ModelConfig,
    batches: &[usize],
    dev: &Device,
    dtype: DType,
) -> Result<()> {
    let (bw, mm) = gpu_ceilings(dev)?;
    crate::outln!(
        "device ceilings: copy {:.0} GB/s (bytes read + written, 2 GiB tensor copy), bf16 matmul \
         {:.0} TFLOP/s (8192^3)",
        bw / 1e9,
        mm / 1e12
    );
    let mut model = crate::model::init::random_model_on(cfg, dev, dtype)?;
    model.set_fused_inference(true)?;
    let weight_bytes = (cfg.num_params() * dtype.size_in_bytes()) as f64;
    let kv_tok = crate::sampler::gpu::GpuKvCache::bytes_per_token(cfg, dtype, a.kv_fp8) as f64;
    crate::outln!(
        "shape {} ({:.2}B parameters, {dtype:?}, KV {} {} bytes/token), prompt {} tokens, {} new \
         tokens, ignore_eos, temperature {}",
        a.shape,
        cfg.num_params() as f64 / 1e9,
        if a.kv_fp8 { "fp8" } else { "as weights," },
        kv_tok,
        a.prompt_len,
        a.new_tokens,
        a.temperature
    );
    crate::outln!(
        "{:>6} {:>9} {:>8} {:>14} {:>14} {:>16} {:>12}",
        "batch",
        "KV blocks",
        "KV GiB",
        "prefill tok/s",
        "decode tok/s",
        "roofline tok/s",
        "of roofline"
    );
    for &b in batches {
        // as timed_run sizes the cache: blocks of 16 tokens, one spare per sequence
        let blocks = ((a.prompt_len + a.new_tokens + 1).div_ceil(16) + 1) * b;
        let kv_bytes = blocks as f64 * 16.0 * kv_tok;
        let states = (b * StateSlots::bytes_per_seq(cfg)) as f64;
        // the step's activations and logits besides: a GiB is ample at these batches
        let (free, _) = crate::cuda::memory_info(dev)?;
        if kv_bytes + states + (1u64 << 30) as f64 > free as f64 {
            crate::outln!(
                "{b:>6} skipped: its KV cache ({:.1} GiB) and recurrent state ({:.1} GiB) do not fit \
                 the {:.1} GiB the GPU has free",
                kv_bytes / (1u64 << 30) as f64,
                states / (1u64 << 30) as f64,
                free as f64 / (1u64 << 30) as f64
            );
            continue;
        }
        let (prefill, decode, _, graphs) =
            timed_run(&model, b, a.prompt_len, a.new_tokens + 1, a, false, false)?;
        // Decode step s (0-based) computes token prompt+1+s of every sequence and reads that
        // many keys and values per sequence, plus every weight once.
        let (p, n) = (a.prompt_len as f64, a.new_tokens as f64);
        let ctx_sum = b as f64 * (n * (p + 1.0) + n * (n - 1.0) / 2.0);
        // each step also reads and writes back every sequence's recurrent states
        let state = (b * state_bytes_per_step(cfg)) as f64;
        let bytes = n * (weight_bytes + state) + kv_tok * ctx_sum;
        let roofline = b as f64 * n / (bytes / bw);
        let kv_gib = kv_bytes / (1u64 << 30) as f64;
        crate::outln!(
            "{b:>6} {blocks:>9} {kv_gib:>8.1} {prefill:>14.0} {decode:>14.0} {roofline:>16.0} \
             {:>11.1}%   decode steps: {} replayed, {} captured, {} eager under a graph's plan",
            100.0 * decode / roofline,
            graphs.replayed,
            graphs.captured,
            graphs.eager
        );
        if !a.enforce_eager {
            // (the rates preflight prices jobs by are the default's, with graphs)
            remember(a, &crate::train::memory::device_name(dev), cfg, b, decode);
        }
        let short = a.new_tokens.min(256);
        let (_, _, split, _) = timed_run(&model, b, a.prompt_len, short + 1, a, true, false)?;
        crate::outln!(
            "       time (run of {short} new tokens, synchronised between the parts of a step, \
             attention by CUDA events): {split}"
        );
        if a.split_tokens > 0 {
            let (_, _, split, _) =
                timed_run(&model, b, a.prompt_len, a.split_tokens + 1, a, false, true)?;
            crate::outln!(
                "       time by CUDA events between ops (run of {} new tokens, no \
                 synchronisation inside a step): {split}",
                a.split_tokens
            );
        }
    }
    Ok(())
}

#[cfg(feature = "cuda")]
/// (copy bandwidth in bytes/s counting reads and writes, bf16 matmul FLOP/s) on `dev`, each
/// the best of several timed runs after a warm-up.
pub(super) fn gpu_ceilings(dev: &Device) -> Result<(f64, f64)> {
    let n = 1usize << 30;
    let x = Tensor::randn(0f32, 1.0, n, dev)?.to_dtype(DType::BF16)?;
    let time = |f: &dyn Fn() -> Result<Tensor>| -> Result<f64> {
        std::hint::black_box(f()?);
        dev.synchronize()?;
        let mut best = f64::INFINITY;
        for _ in 0..10 {
            let t = Instant::now();
            let y = f()?;
            dev.synchronize()?;
            best = best.min(t.elapsed().as_secs_f64());
            drop(y);
        }
        Ok(best)
    };
    let copy_s = time(&|| Ok(x.copy()?))?;
    drop(x);
    let m = 8192;
    let a = Tensor::randn(0f32, 1.0, (m, m), dev)?.to_dtype(DType::BF16)?;
    let b = Tensor::randn(0f32, 1.0, (m, m), dev)?.to_dtype(DType::BF16)?;
    let mm_s = time(&|| Ok(a.matmul(&b)?))?;
    Ok(((4 * n) as f64 / copy_s, 2.0 * (m * m * m) as f64 / mm_s))
}

/// Keeps a measured decode rate for preflight's time estimate (`machine::bench_records`).
fn remember(a: &SampleBenchArgs, device: &str, cfg: &ModelConfig, batch: usize, decode: f64) {
    crate::machine::record_bench(&crate::machine::BenchRecord {
        device: device.into(),
        params: cfg.num_params() as u64,
        batch,
        decode_tokens_per_second: decode,
        prompt_len: a.prompt_len,
        new_tokens: a.new_tokens,
        unix: crate::store::now_unix(),
    });
}

/// The packed gemm's rate at one decode step's shapes for `batch` rows: each projection of a
/// layer and the LM head, as a printable line.
fn decode_gemm_rates(cfg: &ModelConfig, batch: usize) -> String {
    let (h, i, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let shapes = [
        ("qkv", (cfg.num_heads + 2 * cfg.num_kv_heads) * d, h),
        ("o", h, cfg.num_heads * d),
        ("gate_up", 2 * i, h),
        ("down", h, i),
        ("lm_head", cfg.vocab_size, h),
    ];
    let rates: Vec<String> = shapes
        .iter()
        .map(|&(name, n, k)| {
            format!(
                "{name} {n}x{k} {:.0}",
                packed_matmul_rate(batch, n, k) / 1e9
            )
        })
        .collect();
    format!("packed gemm GFLOP/s at {batch} rows: {}", rates.join(", "))
}

/// The fastest decode at `batch` sequences of context `ctx` that the machine allows, in tokens/s,
/// and whether FLOPs (not bytes) bound it: a step takes at least its FLOPs over the multiply-add
/// peak `peak`, and at least the bytes it must read (every f32 weight once, each sequence's
/// cached keys and values, and its recurrent state read and written) over the read bandwidth
/// `bw`.
fn decode_roofline(cfg: &ModelConfig, batch: usize, ctx: usize, peak: f64, bw: f64) -> (f64, bool) {
    let compute = batch as f64 * decode_flops_per_token(cfg, ctx) / peak;
    let state = state_bytes_per_step(cfg);
    let bytes =
        (cfg.num_params() * 4 + batch * (ctx * KvCache::bytes_per_token(cfg) + state)) as f64;
    let memory = bytes / bw;
    (batch as f64 / compute.max(memory), compute >= memory)
}

/// Bytes of a sequence's fixed state (f32) one decode step must move: a recurrent layer's state
/// is read and written back once; a sliding layer's ring of the window's keys and values is read
/// (and one row of it written).
fn state_bytes_per_step(cfg: &ModelConfig) -> usize {
    let ring: usize = (0..cfg.num_layers())
        .filter(|&l| matches!(cfg.layer_cache(l), LayerCache::Window { .. }))
        .map(|l| cfg.layer_cache(l).fixed_values() * 4)
        .sum();
    2 * (StateSlots::bytes_per_seq(cfg) - ring) + ring
}

/// FLOPs of one decode token at context length `ctx`: every weight matrix once (lm_head
/// included), plus attention's q·k and p·v over the context (a sliding layer's window) and
/// the state's work in recurrent ones.
fn decode_flops_per_token(cfg: &ModelConfig, ctx: usize) -> f64 {
    let (h, i, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let per_layer = |kind: LayerKind| match kind {
        LayerKind::Attention | LayerKind::SlidingAttention => {
            let gate = if cfg.attention_gate { cfg.num_heads } else { 0 };
            let proj = h * d * (cfg.num_heads * 2 + gate + cfg.num_kv_heads * 2);
            // a sliding layer attends over its window at most
            let seen = match (kind, cfg.sliding_window) {
                (LayerKind::SlidingAttention, Some(w)) => ctx.min(w),
                _ => ctx,
            };
            2 * proj + 4 * seen * cfg.num_heads * d
        }
        // the projections, the conv, and the state's decay, read, update and read-out
        LayerKind::GatedDeltaNet => cfg.linear.map_or(0, |l| {
            let proj = h * (l.conv_dim() + 2 * l.value_dim() + 2 * l.num_value_heads);
            let state = l.num_value_heads * l.key_head_dim * l.value_head_dim;
            2 * proj + 2 * l.conv_dim() * l.conv_kernel + 8 * state
        }),
    };
    let layers: usize = cfg
        .layer_kinds
        .iter()
        .map(|k| per_layer(*k) + 2 * 3 * h * i)
        .sum();
    (layers + 2 * cfg.vocab_size * h) as f64
}
