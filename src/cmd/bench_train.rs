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

use crate::model::clock;
use crate::model::layer_ops::Counts;
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
    /// With recompute: the last N layers keep their activations (the trainer's `kept_layers`;
    /// the budget printed counts them).
    #[arg(long, default_value_t = 0)]
    pub kept_layers: usize,
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
    if a.kept_layers > cfg.num_layers() {
        anyhow::bail!(
            "--kept-layers {}: the {} shape has {} layers",
            a.kept_layers,
            a.shape,
            cfg.num_layers()
        );
    }
    if a.kept_layers > 0 && (a.quick || a.count) {
        anyhow::bail!(
            "--kept-layers: for the timed configurations with recompute (not --quick or --count)"
        );
    }
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
    let mut b = Bench::new(a, cfg)?;
    let configs: &[(bool, bool)] = if a.quick {
        &[(false, true)]
    } else if a.recompute_only {
        &[(true, true)]
    } else {
        &[(false, false), (false, true), (true, false), (true, true)]
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
        b.measure(recompute, chunked)?;
    }
    let (recompute, chunked) = configs[configs.len() - 1];
    b.time_split(recompute, chunked)?;
    crate::outln!(
        "step peak: peak RSS (CPU) or used GPU memory after each phase (GPU) during a step, minus \
         before it; budget: what the trainer's printed budget says the step adds (the gradient \
         sums and the step's peak: fresh gradients, activations, logits, or the update's \
         temporaries); budget/measured: the printed total over weights, moments and the step \
         peak"
    );
    let s = b.settings(false, b.base.loss_chunk_tokens);
    let m = memory::budget_with(&b.cfg, b.params as u64, &s, b.share);
    crate::outln!(
        "resident: master weights {}, working copy {}, AdamW moments {}",
        crate::bytes::format_bytes(m.master),
        crate::bytes::format_bytes(m.working),
        crate::bytes::format_bytes(m.optimizer)
    );
    Ok(())
}

/// A random model of the shape with its optimizer and one synthetic batch, set up once for
/// every configuration the bench measures.
struct Bench<'a> {
    a: &'a TrainBenchArgs,
    cfg: crate::model::ModelConfig,
    base: TrainSettings,
    dev: Device,
    t: Trainable,
    opt: AdamW,
    batch: PackedBatch,
    params: usize,
    /// The batch's tokens, the share of them in the loss, and the loss's scale.
    tokens: usize,
    share: f64,
    scale: f64,
    /// The device's peak FLOP/s in the compute dtype (for MFU).
    ceiling: f64,
}

impl<'a> Bench<'a> {
    /// Builds the model and batch, and prints what the bench runs.
    fn new(a: &'a TrainBenchArgs, cfg: crate::model::ModelConfig) -> Result<Self> {
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
        let batch = PackedBatch::synthetic(a.rows, a.seq_len, cfg.vocab_size);
        let tokens = batch.tokens.len();
        let mut opt = AdamW::new(t.masters().to_vec(), AdamWConfig::default(), |_| true)?;
        opt.set_working(t.named_vars())?;
        opt.set_host(!composed);
        let ceiling = crate::train::memory::peak_flops(&dev, compute)?;
        crate::outln!(
            "train bench: shape {} ({:.1}M parameters, {compute:?} compute over f32 master \
             weights, {}{}), {} rows x {} tokens per step ({} prompt), AdamW; peak {:.1} GFLOP/s",
            a.shape,
            params as f64 / 1e6,
            crate::train::memory::device_name(&dev),
            if composed { ", device-generic ops" } else { "" },
            a.rows,
            a.seq_len,
            a.seq_len / 4,
            ceiling / 1e9
        );
        Ok(Bench {
            share: batch.loss_tokens() as f64 / tokens as f64,
            scale: 1.0 / batch.loss_tokens() as f64,
            a,
            cfg,
            base,
            dev,
            t,
            opt,
            batch,
            params,
            tokens,
            ceiling,
        })
    }

    /// The gradient options of a configuration.
    fn options(&self, recompute: bool, chunked: bool) -> GradOptions {
        GradOptions {
            loss_chunk_tokens: if chunked { self.a.loss_chunk_tokens } else { 0 },
            recompute,
            kept_layers: if recompute { self.a.kept_layers } else { 0 },
        }
    }

    /// The trainer's settings for this batch (what its memory budget is computed from).
    fn settings(&self, recompute: bool, loss_chunk_tokens: usize) -> TrainSettings {
        TrainSettings {
            micro_batch_tokens: self.tokens,
            max_seq_len: self.a.seq_len,
            rows_per_step: Some(self.a.rows),
            recompute,
            kept_layers: (recompute && self.a.kept_layers > 0).then_some(self.a.kept_layers),
            loss_chunk_tokens,
            ..self.base.clone()
        }
    }

    /// The gradients of the batch, summed.
    fn gradients(&mut self, g: GradOptions) -> Result<Vec<candle_core::Tensor>> {
        let mut sums = GradSums::new(self.t.named_vars().len());
        self.t.accumulate(&self.batch, self.scale, g, &mut sums)?;
        sums.finish(self.t.named_vars())
    }

    /// One optimizer step on the batch.
    fn step(&mut self, g: GradOptions) -> Result<()> {
        let grads = self.gradients(g)?;
        self.opt.step(&grads, 1e-5, Some(1.0))?;
        Ok(())
    }

    /// A configuration's row: its memory peak against the budget, then its speed.
    fn measure(&mut self, recompute: bool, chunked: bool) -> Result<()> {
        let g = self.options(recompute, chunked);
        // Memory first: blocks of 64 KiB and more get their own mappings, returned to the OS
        // when freed, so that RSS follows what is live (glibc would otherwise keep freed blocks).
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: mallopt only changes allocator parameters.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 64 * 1024);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 64 * 1024);
        }
        let dev = self.dev.clone();
        let before = used_bytes(&dev);
        let peak = if dev.is_cpu() {
            reset_peak();
            self.step(g)?;
            status_bytes("VmHWM").unwrap_or(0)
        } else {
            // the driver's used memory after each phase (a GPU has no high-water mark to read)
            let grads = self.gradients(g)?;
            dev.synchronize()?;
            let after_backward = used_bytes(&dev);
            self.opt.step(&grads, 1e-5, Some(1.0))?;
            dev.synchronize()?;
            after_backward.max(used_bytes(&dev))
        }
        .saturating_sub(before);
        // Then speed, with the allocator as the trainer runs it.
        crate::train::tune_allocator();
        self.step(g)?; // warm-up
        dev.synchronize()?;
        let t0 = Instant::now();
        for _ in 0..self.a.steps {
            self.step(g)?;
        }
        dev.synchronize()?;
        let tps = self.tokens as f64 * self.a.steps as f64 / t0.elapsed().as_secs_f64();
        let s = self.settings(recompute, g.loss_chunk_tokens);
        let b = memory::budget_with(&self.cfg, self.params as u64, &s, self.share);
        // what a step allocates: the gradient sums and the step's transient peak
        let transient = b.grad_sums + b.transient(&s);
        // the whole peak: weights and moments (their sizes are exact) plus the step's
        let resident = b.master + b.working + b.optimizer;
        crate::outln!(
            "{:>9} {:>8} {:>10.0} {:>6.1}% {:>14} {:>14} {:>15.0}%",
            recompute,
            chunked,
            tps,
            100.0 * 6.0 * self.params as f64 * tps / self.ceiling,
            crate::bytes::format_bytes(peak),
            crate::bytes::format_bytes(transient),
            100.0 * (resident + transient) as f64 / (resident + peak).max(1) as f64
        );
        Ok(())
    }

    /// Where a step's time goes, for a configuration: one more step under the clock
    /// ([`clock`]: CUDA events on a GPU, the wall clock on the CPU), split by phase (forward,
    /// head, backward with its recompute, optimizer), layer kind and op, printed when it ends.
    fn time_split(&mut self, recompute: bool, chunked: bool) -> Result<()> {
        let dev = self.dev.clone();
        let g = self.options(recompute, chunked);
        let ((), split) = clock::timed(&dev, "forward", || -> Result<()> {
            let mut counts = Counts::timing();
            let mut sums = GradSums::new(self.t.named_vars().len());
            self.t
                .accumulate_counted(&self.batch, self.scale, g, &mut sums, Some(&mut counts))?;
            let grads = sums.finish(self.t.named_vars())?;
            clock::mark(None, "grad_sums");
            clock::phase("optimizer");
            self.opt.step(&grads, 1e-5, Some(1.0))?;
            Ok(())
        })?;
        crate::outln!(
            "time split of a step (recompute {recompute}, chunked {chunked}; {}; rows under 1% \
             summed):\n{}",
            if dev.is_cpu() {
                "wall time"
            } else {
                "CUDA events"
            },
            split.table(0.01)
        );
        Ok(())
    }
}
