//! `pipeline bench train`: training tokens/s and peak memory of full fine-tuning steps on a
//! randomly initialised model of a given shape (no weights needed), for each combination of
//! activation recompute and chunked loss, beside the memory budget the trainer prints.
//!
//! A step is what the trainer runs: forward and backward over one packed micro-batch of
//! `--rows` rows of `--seq-len` tokens (the first quarter of each row is prompt, masked from the
//! loss), then AdamW. Peak memory is the process's peak RSS during the steps (reset through
//! `/proc/self/clear_refs` before each configuration), minus the RSS before them: what the step
//! itself adds on top of weights and optimizer state. `benches/torch_train.py` runs the same
//! steps in PyTorch eager. A benchmark that prints figures, never a timed test.

use std::time::Instant;

use anyhow::Result;
use candle_core::Device;

use crate::train::adamw::{AdamW, AdamWConfig};
use crate::train::grads::{GradOptions, GradSums};
use crate::train::loss::PackedBatch;
use crate::train::memory;
use crate::train::settings::TrainSettings;
use crate::train::Trainable;

#[derive(Debug, clap::Args)]
pub struct TrainBenchArgs {
    /// `tiny` (the fixture's shapes), `20m`, `50m` (a ~48M-parameter Qwen3) or `qwen3-0.6b`.
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
    let weights = crate::model::init::random_weights(&cfg)?;
    let t = Trainable::from_tensors(&cfg, &weights, &Device::Cpu)?;
    drop(weights);
    let params = t.num_params();
    let prompt = a.seq_len / 4;
    let rows: Vec<(Vec<u32>, Vec<u32>)> = (0..a.rows)
        .map(|r| {
            let tok = |i: usize| ((r * 7919 + i * 104_729) % cfg.vocab_size) as u32;
            (
                (0..prompt).map(tok).collect(),
                (prompt..a.seq_len).map(tok).collect(),
            )
        })
        .collect();
    let refs: Vec<(&[u32], &[u32])> = rows
        .iter()
        .map(|(p, c)| (p.as_slice(), c.as_slice()))
        .collect();
    let batch = PackedBatch::pack(&refs);
    let tokens = batch.tokens.len();
    let scale = 1.0 / batch.loss_tokens() as f64;
    let mut opt = AdamW::new(t.named_vars().to_vec(), AdamWConfig::default(), |_| true)?;
    let ceiling = crate::machine::cpu_matmul_ceiling()?;
    println!(
        "train bench: shape {} ({:.1}M parameters, f32, {} threads), {} rows x {} tokens per \
         step ({} prompt), AdamW; matmul ceiling {:.1} GFLOP/s",
        a.shape,
        params as f64 / 1e6,
        rayon::current_num_threads(),
        a.rows,
        a.seq_len,
        prompt,
        ceiling / 1e9
    );
    let configs: &[(bool, bool)] = if a.quick {
        &[(false, true)]
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
    // Memory first: blocks of 64 KiB and more get their own mappings, returned to the OS when
    // freed, so that RSS follows what is live (glibc would otherwise keep freed blocks around).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 * 1024);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 * 1024);
    }
    let mut peaks = Vec::new();
    for &(recompute, chunked) in configs {
        let g = gopt(recompute, chunked);
        let before = status_bytes("VmRSS").unwrap_or(0);
        reset_peak();
        step(&mut opt, g)?;
        let peak = status_bytes("VmHWM").unwrap_or(0).saturating_sub(before);
        peaks.push(peak);
    }
    // Then speed, with the allocator as the trainer runs it.
    crate::train::tune_allocator();
    let mut speed = Vec::new();
    for &(recompute, chunked) in configs {
        step(&mut opt, gopt(recompute, chunked))?; // warm-up
        let t0 = Instant::now();
        for _ in 0..a.steps {
            step(&mut opt, gopt(recompute, chunked))?;
        }
        speed.push(tokens as f64 * a.steps as f64 / t0.elapsed().as_secs_f64());
    }
    // Where a step's time goes (default configuration).
    {
        let dev = Device::Cpu;
        let toks = candle_core::Tensor::new(batch.tokens.as_slice(), &dev)?;
        let pos = candle_core::Tensor::new(batch.positions.as_slice(), &dev)?;
        let mut attn = crate::model::attention::CausalAttention::new(batch.seq_lens.clone());
        let t0 = Instant::now();
        let h = t.model.forward_hidden(&toks, &pos, &mut attn)?;
        let fwd = t0.elapsed().as_secs_f64();
        drop(h);
        let t0 = Instant::now();
        let mut sums = GradSums::new(t.named_vars().len());
        t.accumulate(&batch, scale, gopt(false, true), &mut sums)?;
        let fwd_bwd = t0.elapsed().as_secs_f64();
        let grads = sums.finish(t.named_vars())?;
        let t0 = Instant::now();
        opt.step(&grads, 1e-5, Some(1.0))?;
        let adam = t0.elapsed().as_secs_f64();
        println!(
            "time split of a step: forward {fwd:.2}s, forward + head + backward {fwd_bwd:.2}s, \
             AdamW {adam:.2}s"
        );
    }
    println!(
        "{:>9} {:>8} {:>10} {:>7} {:>14} {:>14}",
        "recompute", "chunked", "tokens/s", "MFU", "step peak", "budget"
    );
    for ((&(recompute, chunked), tps), peak) in configs.iter().zip(speed).zip(peaks) {
        let g = gopt(recompute, chunked);
        let s = TrainSettings {
            micro_batch_tokens: tokens,
            max_seq_len: a.seq_len,
            recompute,
            loss_chunk_tokens: g.loss_chunk_tokens,
            ..TrainSettings::default()
        };
        let b = memory::budget(&cfg, params as u64, &s);
        let transient = b.total(&s) - b.weights - b.optimizer;
        println!(
            "{:>9} {:>8} {:>10.0} {:>6.1}% {:>14} {:>14}",
            recompute,
            chunked,
            tps,
            100.0 * 6.0 * params as f64 * tps / ceiling,
            crate::bytes::format_bytes(peak),
            crate::bytes::format_bytes(transient)
        );
    }
    println!(
        "step peak: peak RSS during the steps minus RSS before them; budget: the trainer's \
         printed budget less weights and optimizer state (gradients, activations, logits)"
    );
    Ok(())
}
