//! `pipeline bench attention`: decode attention over the paged KV cache alone, one token per
//! sequence at a fixed context, against the machine's bandwidth.
//!
//! On the CPU (`--device cpu`) it runs the sampler's own backend (`sampler::kv_cache`) over every
//! layer of the shape in turn, blocks handed out to the sequences in turn as decoding does, so
//! that the keys and values come from memory as in a real step, not from a cache that one layer
//! would fit; it prints time per layer, the KV bytes read per second against the measured read
//! bandwidth, and GFLOP/s. On a GPU it times one layer per kernel variant against the copy
//! bandwidth. A benchmark that prints figures, never a timed test; the cache holds random keys and
//! values.

use std::time::Instant;

use anyhow::{bail, Result};
#[cfg(feature = "cuda")]
use candle_core::{DType, Tensor};

use crate::model::config::LayerKind;
use crate::model::init::shape;

#[derive(Debug, clap::Args)]
pub struct AttentionBenchArgs {
    /// Model shape for the head counts and head_dim (see `bench sample --shape`).
    #[arg(long, default_value = "qwen3-4b")]
    pub shape: String,
    /// `cpu`, or `cuda` (a binary built with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    pub device: crate::device::DeviceSpec,
    /// Sequences decoding one token each.
    #[arg(long, default_value_t = 128)]
    pub batch: usize,
    /// Keys and values each sequence attends over (2,176: the mean context of a 128-token
    /// prompt generating 4,096 tokens).
    #[arg(long, default_value_t = 2176)]
    pub context: usize,
    /// Layers of cache the CPU run goes through in turn (default: the shape's; a GPU run times
    /// one).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// fp8 e4m3 keys and values (CUDA).
    #[arg(long)]
    pub kv_fp8: bool,
    /// Timed calls per variant (on the CPU: passes over every layer).
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
}

/// One decode token per sequence, at position `ctx - 1` (every table holds `ctx` positions).
fn decode_steps(
    tables: &[crate::sampler::block_pool::BlockTable],
    ctx: usize,
) -> Vec<crate::sampler::kv_cache::SeqStep<'_>> {
    tables
        .iter()
        .map(|t| crate::sampler::kv_cache::SeqStep {
            block_table: t,
            start_pos: ctx - 1,
            num_new: 1,
        })
        .collect()
}

/// The CPU cache this command may allocate, at most.
const CPU_CACHE_LIMIT: usize = 8 << 30;

pub fn run_attention(a: &AttentionBenchArgs) -> Result<()> {
    if a.device.is_cpu() {
        return run_cpu(a);
    }
    #[cfg(not(feature = "cuda"))]
    bail!(
        "--device {}: this binary was built without the cuda feature",
        a.device
    );
    #[cfg(feature = "cuda")]
    run_gpu(a)
}

/// The CPU backend's decode attention: every layer in turn, `iters` passes, best pass reported.
fn run_cpu(a: &AttentionBenchArgs) -> Result<()> {
    use crate::model::attention::AttentionBackend;
    use crate::sampler::block_pool::{BlockPool, BlockTable};
    use crate::sampler::kv_cache::{KvCache, PagedAttention};
    if a.kv_fp8 {
        bail!("--kv-fp8: the CPU cache is f32");
    }
    let mut cfg = shape(&a.shape)?;
    cfg.layer_kinds = vec![LayerKind::Attention; a.layers.unwrap_or(cfg.num_layers()).max(1)];
    let (b, ctx, bs) = (a.batch.max(1), a.context.max(1), a.block_size.max(1));
    let (hq, hkv, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let per_seq = ctx.div_ceil(bs);
    let num_blocks = b * per_seq;
    let bytes = num_blocks * bs * KvCache::bytes_per_token(&cfg);
    if bytes > CPU_CACHE_LIMIT {
        bail!(
            "the cache would take {:.1} GiB (limit {} GiB): lower --batch, --context or --layers",
            bytes as f64 / (1u64 << 30) as f64,
            CPU_CACHE_LIMIT >> 30
        );
    }
    let mut cache = KvCache::new(&cfg, bs, num_blocks);
    cache.fill_with(|i| ((i.wrapping_mul(2_654_435_761) >> 7) % 2001) as f32 / 1000.0 - 1.0);
    // blocks handed out to the sequences in turn, as decoding hands them out
    let mut pool = BlockPool::new(num_blocks);
    let mut tables = vec![BlockTable::default(); b];
    for blk in 0..per_seq {
        for t in &mut tables {
            let have = blk * bs;
            if t.reserve(&mut pool, have, (ctx - have).min(bs), bs)
                .is_none()
            {
                bail!("the cache is too small");
            }
        }
    }
    let seqs = decode_steps(&tables, ctx);
    let gen = |len: usize, seed: usize| -> Vec<f32> {
        (0..len)
            .map(|i| (((i + seed) * 7919 % 1009) as f32 - 504.0) / 504.0)
            .collect()
    };
    let (q, k, v) = (gen(b * hq * d, 1), gen(b * hkv * d, 2), gen(b * hkv * d, 3));
    let mut out = vec![0f32; b * hq * d];
    let layers = cfg.num_layers();
    let kv_bytes = (b * ctx * hkv * d * 2 * std::mem::size_of::<f32>()) as f64;
    let flops = (4 * b * ctx * hq * d) as f64;
    let bw = crate::machine::read_bandwidth();
    crate::outln!(
        "decode attention on the CPU ({} threads), {hq} heads / {hkv} KV heads of {d}, batch {b}, \
         context {ctx}, blocks of {bs}, {layers} layers in turn: {:.1} MB of KV per layer, \
         {:.0} MB in all; read bandwidth {:.1} GB/s",
        rayon::current_num_threads(),
        kv_bytes / 1e6,
        kv_bytes * layers as f64 / 1e6,
        bw / 1e9
    );
    let mut attn = PagedAttention::new(&mut cache, seqs);
    // a step runs on one of rayon's threads, as the engine's do
    let best = rayon::scope(|_| -> Result<f64> {
        let mut best = f64::INFINITY;
        for it in 0..a.iters.max(1) + 1 {
            let t = Instant::now();
            for layer in 0..layers {
                attn.attend_host(layer, &q, &k, &v, (b, hq, hkv, d), None, &mut out)?;
            }
            let s = t.elapsed().as_secs_f64() / layers as f64;
            if it > 0 {
                best = best.min(s); // the first pass warms up
            }
        }
        Ok(best)
    })?;
    crate::outln!(
        "{:>12} {:>10} {:>12} {:>10}",
        "us/layer",
        "KV GB/s",
        "of read bw",
        "GFLOP/s"
    );
    crate::outln!(
        "{:>12.1} {:>10.1} {:>11.1}% {:>10.1}",
        best * 1e6,
        kv_bytes / best / 1e9,
        100.0 * kv_bytes / best / bw,
        flops / best / 1e9
    );
    Ok(())
}

#[cfg(feature = "cuda")]
/// One layer's decode attention over the GPU paged cache, alone, for each kernel variant: time per
/// call and the KV bytes it reads per second against the device's copy bandwidth.
fn run_gpu(a: &AttentionBenchArgs) -> Result<()> {
    use crate::model::attention::AttentionBackend;
    use crate::sampler::block_pool::{BlockPool, BlockTable};
    use crate::sampler::gpu::paged::write_kv;
    use crate::sampler::gpu::{GpuKvCache, GpuPagedAttention, GpuStep};
    use crate::sampler::kv_cache::SeqStep;
    let mut cfg = shape(&a.shape)?;
    cfg.layer_kinds = vec![LayerKind::Attention];
    let dev = crate::model::open_device(a.device)?;
    let (bw, _) = super::bench_sample::gpu_ceilings(&dev)?;
    let (b, ctx, bs) = (a.batch, a.context.max(1), a.block_size.max(1));
    let (hq, hkv, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let per_seq = ctx.div_ceil(bs);
    let num_blocks = b * per_seq + 1;
    let mut cache = GpuKvCache::new(&cfg, bs, num_blocks, &dev, DType::BF16, a.kv_fp8)?;
    let mut pool = BlockPool::new(num_blocks);
    let mut tables = vec![BlockTable::default(); b];
    for t in &mut tables {
        if t.reserve(&mut pool, 0, ctx, bs).is_none() {
            bail!("the cache is too small");
        }
    }
    // fill every position with random keys and values, a sequence at a time
    for t in &tables {
        let fill = GpuStep::new(
            &cache,
            &[SeqStep {
                block_table: t,
                start_pos: 0,
                num_new: ctx,
            }],
            hq,
        )?;
        let k = Tensor::randn(0f32, 1.0, (ctx, hkv, d), &dev)?.to_dtype(DType::BF16)?;
        let v = Tensor::randn(0f32, 1.0, (ctx, hkv, d), &dev)?.to_dtype(DType::BF16)?;
        write_kv(&cache, &fill, 0, &k, &v)?;
    }
    let seqs = decode_steps(&tables, ctx);
    let step = GpuStep::new(&cache, &seqs, hq)?;
    let q = Tensor::randn(0f32, 1.0, (b, hq, d), &dev)?.to_dtype(DType::BF16)?;
    let k = Tensor::randn(0f32, 1.0, (b, hkv, d), &dev)?.to_dtype(DType::BF16)?;
    let v = Tensor::randn(0f32, 1.0, (b, hkv, d), &dev)?.to_dtype(DType::BF16)?;
    let kv_bytes = (b * ctx * hkv * d * 2 * GpuKvCache::elem_bytes(DType::BF16, a.kv_fp8)) as f64;
    crate::outln!(
        "decode attention, {} heads / {} KV heads of {d}, batch {b}, context {ctx}, KV {}: \
         {:.2} GB per call, {} partitions; copy ceiling {:.0} GB/s",
        hq,
        hkv,
        if a.kv_fp8 { "fp8" } else { "bf16" },
        kv_bytes / 1e9,
        step.num_parts(),
        bw / 1e9
    );
    // the default (v5), v4, and v5 with one or two rounds per stage
    let variants: &[Option<&'static str>] = if (hq / hkv, d) == (4, 128) && bs.is_power_of_two() {
        &[None, Some("_v4"), Some("_v5r1"), Some("_v5r2")]
    } else {
        &[None, Some("_v4")]
    };
    crate::outln!("default kernel: {}", cache.attn_kernel());
    crate::outln!(
        "{:>10} {:>10} {:>10} {:>12}",
        "variant",
        "ms/call",
        "GB/s",
        "of copy"
    );
    for &variant in variants {
        let mut att = GpuPagedAttention {
            seq_lens: Vec::new(),
            states: None,
            cache: &mut cache,
            step: &step,
            sync_timing: false,
            variant,
            seconds: 0.0,
            events: Vec::new(),
            spent: Default::default(),
        };
        for _ in 0..3 {
            att.attend(0, &q, &k, &v, None)?;
        }
        dev.synchronize()?;
        let t0 = Instant::now();
        for _ in 0..a.iters.max(1) {
            att.attend(0, &q, &k, &v, None)?;
        }
        dev.synchronize()?;
        let s = t0.elapsed().as_secs_f64() / a.iters.max(1) as f64;
        crate::outln!(
            "{:>10} {:>10.3} {:>10.0} {:>11.1}%",
            variant.unwrap_or("default"),
            s * 1e3,
            kv_bytes / s / 1e9,
            100.0 * kv_bytes / s / bw
        );
    }
    Ok(())
}
