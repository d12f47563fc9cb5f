//! `pipeline bench train`: training tokens/s and peak memory of full fine-tuning steps on a
//! randomly initialised model of a given shape (no weights needed), for each combination of
//! activation recompute and chunked loss, beside the memory budget the trainer prints.
//!
//! A step is what the trainer runs: forward and backward over one packed micro-batch of
//! `--rows` rows of `--seq-len` tokens (the first quarter of each row is prompt, masked from the
//! loss), then AdamW. Peak memory is the process's peak RSS during the steps (reset through
//! `/proc/self/clear_refs` before each configuration), minus the RSS before them: what the step
//! itself adds on top of weights and optimizer state. On a GPU it is the device's used memory
//! (total less free, as the driver reports it, sampled after the forward, the backward and the
//! update) less what was used before the step. `benches/torch_train.py` runs the same steps in
//! PyTorch eager. A benchmark that prints figures, never a timed test.

use std::time::Instant;

use anyhow::Result;
use candle_core::Device;

use crate::train::settings::{ComputeDtype, TrainOps};

use crate::train::adamw::{AdamW, AdamWConfig};
use crate::train::grads::{GradOptions, GradSums};
use crate::train::loss::PackedBatch;
use crate::train::memory;
use crate::train::settings::TrainSettings;
use crate::train::Trainable;

#[derive(Debug, clap::Args)]
pub struct TrainBenchArgs {
    /// `tiny` (the fixture's shapes), `20m`, `50m` (a ~48M-parameter Qwen3), `qwen3-0.6b`,
    /// `qwen3-4b`, `qwen2.5-1.5b` (Qwen2: q/k/v biases), `hybrid-20m` or `qwen3.5-0.8b`;
    /// `qwen2:NAME` is a Qwen3 shape as Qwen2, `gemma3:NAME` as Gemma 3 (and `gemma3-1b`).
    #[arg(long, default_value = "50m")]
    pub shape: String,
    /// Rows per step.
    #[arg(long, default_value_t = 8)]
    pub rows: usize,
    #[arg(long, default_value_t = 256)]
    pub seq_len: usize,
    /// Timed steps per configuration (after one warm-up step).
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    /// Completion tokens per loss chunk in the chunked configurations.
    #[arg(long, default_value_t = 256)]
    pub loss_chunk_tokens: usize,
    /// Only the default configuration (no recompute, chunked loss).
    #[arg(long)]
    pub quick: bool,
    /// Only the configuration with recompute and the chunked loss (what a large model needs).
    #[arg(long, conflicts_with = "quick")]
    pub recompute_only: bool,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: crate::device::DeviceSpec,
    /// auto (bf16 on a GPU, f32 on the CPU), f32 or bf16.
    #[arg(long, default_value = "auto", value_parser = parse_compute)]
    pub compute_dtype: ComputeDtype,
    /// auto, or generic: the device-generic ops on the CPU too.
    #[arg(long, default_value = "auto", value_parser = parse_ops)]
    pub ops: TrainOps,
    /// Count instead of timing: what one micro-batch (`--rows` x `--seq-len`, forward and
    /// backward with activation recompute) and one optimizer step issue, by layer kind: kernel
    /// launches, device allocations, copies each way, syncs. `--device cuda` counts the GPU's
    /// path on this machine (no GPU needed).
    #[arg(long)]
    pub count: bool,
    /// With `--count`: one JSON object per phase instead of the table.
    #[arg(long, requires = "count")]
    pub json: bool,
}

fn parse_compute(s: &str) -> Result<ComputeDtype, String> {
    match s {
        "auto" => Ok(ComputeDtype::Auto),
        "f32" => Ok(ComputeDtype::F32),
        "bf16" => Ok(ComputeDtype::Bf16),
        _ => Err(format!("`{s}`: use auto, f32 or bf16")),
    }
}

fn parse_ops(s: &str) -> Result<TrainOps, String> {
    match s {
        "auto" => Ok(TrainOps::Auto),
        "generic" => Ok(TrainOps::Generic),
        _ => Err(format!("`{s}`: use auto or generic")),
    }
}

/// Bytes in use on `dev`: the process's RSS on the CPU, the device's used memory on a GPU.
fn used_bytes(dev: &Device) -> u64 {
    match dev {
        Device::Cpu => status_bytes("VmRSS").unwrap_or(0),
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => crate::cuda::memory_info(dev)
            .map(|(free, total)| total - free)
            .unwrap_or(0),
        _ => 0,
    }
}

/// `VmHWM` / `VmRSS` of this process in bytes (Linux).
fn status_bytes(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

pub fn run(a: &TrainBenchArgs) -> Result<()> {
    let cfg = crate::model::init::shape(&a.shape)?;
    if a.count {
        let c = super::bench_count::TrainCount {
            shape: &a.shape,
            device: a.device,
            ops: a.ops,
            compute_dtype: a.compute_dtype,
            rows: a.rows,
            seq_len: a.seq_len,
            loss_chunk_tokens: a.loss_chunk_tokens,
            json: a.json,
        };
        return super::bench_count::run_train(&c, &cfg);
    }
    let base = TrainSettings {
        device: a.device,
        compute_dtype: a.compute_dtype,
        ops: a.ops,
        ..TrainSettings::default()
    };
    base.validate().map_err(|e| anyhow::anyhow!("--{e}"))?;
    let dev = crate::model::open_device(a.device)?;
    let compute = base.compute();
    let weights = crate::model::init::random_weights(&cfg)?;
    let mut t = Trainable::from_tensors(&cfg, &weights, &dev, compute)?;
    drop(weights);
    t.model.set_composed(a.ops == TrainOps::Generic)?;
    let composed = t.model.composed();
    let params = t.num_params();
    let prompt = a.seq_len / 4;
    let batch = PackedBatch::synthetic(a.rows, a.seq_len, cfg.vocab_size);
    let tokens = batch.tokens.len();
    let share = batch.loss_tokens() as f64 / tokens as f64;
    let scale = 1.0 / batch.loss_tokens() as f64;
    let mut opt = AdamW::new(t.masters().to_vec(), AdamWConfig::default(), |_| true)?;
    opt.set_working(t.named_vars())?;
    opt.set_host(!composed);
    let ceiling = crate::train::memory::peak_flops(&dev, compute)?;
    crate::outln!(
        "train bench: shape {} ({:.1}M parameters, {compute:?} compute over f32 master weights, \
         {}{}), {} rows x {} tokens per step ({} prompt), AdamW; peak {:.1} GFLOP/s",
        a.shape,
        params as f64 / 1e6,
        crate::train::memory::device_name(&dev),
        if composed { ", device-generic ops" } else { "" },
        a.rows,
        a.seq_len,
        prompt,
        ceiling / 1e9
    );
    let configs: &[(bool, bool)] = if a.quick {
        &[(false, true)]
    } else if a.recompute_only {
        &[(true, true)]
    } else {
        &[(false, false), (false, true), (true, false), (true, true)]
    };
    let gopt = |recompute: bool, chunked: bool| GradOptions {
        loss_chunk_tokens: if chunked { a.loss_chunk_tokens } else { 0 },
        recompute,
    };
    let step = |opt: &mut AdamW, g: GradOptions| -> Result<()> {
        let mut sums = GradSums::new(t.named_vars().len());
        t.accumulate(&batch, scale, g, &mut sums)?;
        let grads = sums.finish(t.named_vars())?;
        opt.step(&grads, 1e-5, Some(1.0))?;
        Ok(())
    };
    crate::outln!(
        "{:>9} {:>8} {:>10} {:>7} {:>14} {:>14} {:>16}",
        "recompute",
        "chunked",
        "tokens/s",
        "MFU",
        "step peak",
        "budget",
        "budget/measured"
    );
    // Each configuration's row is printed as soon as it is measured: a large shape that runs out
    // of memory in a later configuration still leaves the earlier figures.
    for &(recompute, chunked) in configs {
        let g = gopt(recompute, chunked);
        // Memory first: blocks of 64 KiB and more get their own mappings, returned to the OS
        // when freed, so that RSS follows what is live (glibc would otherwise keep freed blocks).
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: mallopt only changes allocator parameters.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 64 * 1024);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 64 * 1024);
        }
        let before = used_bytes(&dev);
        let peak = if dev.is_cpu() {
            reset_peak();
            step(&mut opt, g)?;
            status_bytes("VmHWM").unwrap_or(0)
        } else {
            // the driver's used memory after each phase (a GPU has no high-water mark to read)
            let mut sums = GradSums::new(t.named_vars().len());
            t.accumulate(&batch, scale, g, &mut sums)?;
            dev.synchronize()?;
            let after_backward = used_bytes(&dev);
            let grads = sums.finish(t.named_vars())?;
            opt.step(&grads, 1e-5, Some(1.0))?;
            dev.synchronize()?;
            after_backward.max(used_bytes(&dev))
        }
        .saturating_sub(before);
        // Then speed, with the allocator as the trainer runs it.
        crate::train::tune_allocator();
        step(&mut opt, g)?; // warm-up
        dev.synchronize()?;
        let t0 = Instant::now();
        for _ in 0..a.steps {
            step(&mut opt, g)?;
        }
        dev.synchronize()?;
        let tps = tokens as f64 * a.steps as f64 / t0.elapsed().as_secs_f64();
        let s = TrainSettings {
            micro_batch_tokens: tokens,
            max_seq_len: a.seq_len,
            rows_per_step: Some(a.rows),
            recompute,
            loss_chunk_tokens: g.loss_chunk_tokens,
            ..base.clone()
        };
        let b = memory::budget_with(&cfg, params as u64, &s, share);
        // what a step allocates: the gradient sums and the step's transient peak
        let transient = b.grad_sums + b.transient(&s);
        // the whole peak: weights and moments (their sizes are exact) plus the step's
        let resident = b.master + b.working + b.optimizer;
        crate::outln!(
            "{:>9} {:>8} {:>10.0} {:>6.1}% {:>14} {:>14} {:>15.0}%",
            recompute,
            chunked,
            tps,
            100.0 * 6.0 * params as f64 * tps / ceiling,
            crate::bytes::format_bytes(peak),
            crate::bytes::format_bytes(transient),
            100.0 * (resident + transient) as f64 / (resident + peak).max(1) as f64
        );
    }
    // Where a step's time goes (the last configuration). A forward alone is timed only without
    // recompute: with it, a forward outside the recompute path would hold every layer's
    // activations (what recompute exists to avoid, ~36 GiB at Qwen3-4B x 4,096 tokens).
    {
        let (recompute, chunked) = configs[configs.len() - 1];
        let fwd = if recompute {
            None
        } else {
            let toks = candle_core::Tensor::new(batch.tokens.as_slice(), &dev)?;
            let pos = candle_core::Tensor::new(batch.positions.as_slice(), &dev)?;
            let mut attn = crate::model::attention::CausalAttention::with_composed(
                batch.seq_lens.clone(),
                composed,
            );
            let t0 = Instant::now();
            let h = t.model.forward_hidden(&toks, &pos, &mut attn)?;
            dev.synchronize()?;
            drop(h);
            Some(t0.elapsed().as_secs_f64())
        };
        let t0 = Instant::now();
        let mut sums = GradSums::new(t.named_vars().len());
        t.accumulate(&batch, scale, gopt(recompute, chunked), &mut sums)?;
        dev.synchronize()?;
        let fwd_bwd = t0.elapsed().as_secs_f64();
        let grads = sums.finish(t.named_vars())?;
        let t0 = Instant::now();
        opt.step(&grads, 1e-5, Some(1.0))?;
        dev.synchronize()?;
        let adam = t0.elapsed().as_secs_f64();
        let fwd = fwd.map_or("forward not timed alone under recompute".into(), |f| {
            format!("forward {f:.2}s")
        });
        crate::outln!(
            "time split of a step: {fwd}, forward + head + backward {fwd_bwd:.2}s, AdamW \
             {adam:.2}s"
        );
    }
    crate::outln!(
        "step peak: peak RSS (CPU) or used GPU memory after each phase (GPU) during a step, minus \
         before it; budget: what the trainer's printed budget says the step adds (the gradient \
         sums and the step's peak: fresh gradients, activations, logits, or the update's \
         temporaries); budget/measured: the printed total over weights, moments and the step \
         peak"
    );
    let s = TrainSettings {
        micro_batch_tokens: tokens,
        max_seq_len: a.seq_len,
        rows_per_step: Some(a.rows),
        ..base
    };
    let b = memory::budget_with(&cfg, params as u64, &s, share);
    crate::outln!(
        "resident: master weights {}, working copy {}, AdamW moments {}",
        crate::bytes::format_bytes(b.master),
        crate::bytes::format_bytes(b.working),
        crate::bytes::format_bytes(b.optimizer)
    );
    Ok(())
}
