//! The training loop: loads the base model and the SFT rows, prints the memory budget, resumes
//! from the newest compatible checkpoint, runs the planned optimizer steps (micro-batches,
//! gradient accumulation, clipping, the LR schedule), logs every step to `metrics.jsonl` and
//! the progress line, checkpoints, and at the end exports the model, reloads it, and reports
//! how far each tensor moved (failing if the model did not change).
//!
//! Guards: a non-finite loss or gradient norm stops the run naming the step and the last good
//! checkpoint (no update is applied); a share of changed weights below `stall_share` for
//! `stall_steps` steps warns loudly. Knows nothing of stages or the CLI.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::DType;
use serde::Serialize;

use super::adamw::{AdamW, AdamWConfig, StateRounding};
use super::checkpoint::{self, TrainState};
use super::data::{micro_batches, plan_steps, read_sft, LoadReport};
use super::grads::{GradOptions, GradSums};
use super::loss::PackedBatch;
use super::schedule::Schedule;
use super::settings::{OptimizerState, TrainDtype, TrainOps, TrainSettings};
use super::Trainable;
use crate::model::Checkpoint;

/// One fine-tuning run.
#[derive(Debug, Clone)]
pub struct TrainJob {
    pub settings: TrainSettings,
    /// The base checkpoint (folder or hub id).
    pub model: String,
    /// The SFT Parquet.
    pub data: PathBuf,
    /// Where the trained model goes (Hugging Face layout).
    pub output: PathBuf,
    /// Checkpoints, `metrics.jsonl` and `change_report.json`.
    pub state_dir: PathBuf,
    /// Stop after this step with a checkpoint (no export); a rerun continues from it.
    pub stop_after: Option<u64>,
    /// Where to record the checkpointed step for `pipeline status` (a stage's progress file).
    pub progress_file: Option<PathBuf>,
    /// A folder for TensorBoard events of every logged step (rewritten at each checkpoint and at
    /// the end); `None`: `<state_dir>/tensorboard`.
    pub tensorboard: Option<PathBuf>,
}

/// The scalars of `metrics.jsonl` for TensorBoard (`train/loss`, `train/grad_norm`, `train/lr`,
/// `train/update_ratio`, `train/changed_share`, `train/tokens_per_second`), wall times counted
/// back from now by each step's elapsed seconds.
fn write_board(job: &TrainJob) -> Result<()> {
    let text = match std::fs::read_to_string(job.state_dir.join(METRICS)) {
        Ok(t) => t,
        Err(_) => return Ok(()),
    };
    let steps: Vec<Metrics> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let Some(last) = steps.last() else {
        return Ok(());
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let mut scalars = Vec::with_capacity(steps.len() * 6);
    for m in &steps {
        let wall_time = now - (last.elapsed_seconds - m.elapsed_seconds).max(0.0);
        for (tag, value) in [
            ("train/loss", m.loss),
            ("train/grad_norm", m.grad_norm),
            ("train/lr", m.lr),
            ("train/update_ratio", m.update_ratio),
            ("train/changed_share", m.changed_share),
            ("train/tokens_per_second", m.tokens_per_second),
        ] {
            scalars.push(crate::tensorboard::Scalar {
                tag: tag.into(),
                step: m.step as i64,
                value,
                wall_time,
            });
        }
    }
    let dir = job
        .tensorboard
        .clone()
        .unwrap_or_else(|| job.state_dir.join("tensorboard"));
    crate::tensorboard::write(&dir, &scalars)?;
    Ok(())
}

#[derive(Debug, Clone, Serialize)]
pub struct TrainSummary {
    pub steps: u64,
    /// Stopped at `stop_after` before the last step: nothing exported.
    pub stopped: bool,
    pub resumed_from: Option<u64>,
    pub rows: usize,
    pub tokens: u64,
    pub first_loss: Option<f64>,
    pub last_loss: f64,
    pub seconds: f64,
    pub tokens_per_second: f64,
    pub tensors: usize,
    pub tensors_unchanged: usize,
    pub median_relative_change: f64,
}

impl TrainSummary {
    /// The summary line of `pipeline train` and the train stage.
    pub fn print(&self, output: &Path) {
        let s = self;
        if s.stopped {
            tracing::info!(
                "stopped after step {} ({} tokens, {:.0} tok/s, {:.1}s); rerun to continue",
                s.steps,
                s.tokens,
                s.tokens_per_second,
                s.seconds
            );
            return;
        }
        tracing::info!(
            "trained {} steps on {} rows{}: loss {} -> {:.4}, {} tokens at {:.0} tok/s in {:.1}s; \
             {} of {} tensors changed (median relative change {:.2e}); wrote {}",
            s.steps,
            s.rows,
            s.resumed_from
                .map(|r| format!(" (resumed at step {r})"))
                .unwrap_or_default(),
            s.first_loss
                .map(|l| format!("{l:.4}"))
                .unwrap_or_else(|| "-".into()),
            s.last_loss,
            s.tokens,
            s.tokens_per_second,
            s.seconds,
            s.tensors - s.tensors_unchanged,
            s.tensors,
            s.median_relative_change,
            output.display()
        );
    }
}

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Metrics {
    pub step: u64,
    pub epoch: u64,
    /// Mean completion-token loss of the step.
    pub loss: f64,
    /// Before clipping.
    pub grad_norm: f64,
    pub lr: f64,
    pub update_ratio: f64,
    pub changed_share: f64,
    pub rows: usize,
    pub tokens: usize,
    pub completion_tokens: usize,
    pub tokens_per_second: f64,
    pub mfu: f64,
    pub elapsed_seconds: f64,
    pub eta_seconds: f64,
}

pub const METRICS: &str = "metrics.jsonl";
pub const CHANGE_REPORT: &str = "change_report.json";

/// The dtype the model is stored and exported in.
pub fn model_dtype(s: &TrainSettings, ck: &Checkpoint) -> DType {
    match s.dtype {
        TrainDtype::Auto => checkpoint::checkpoint_dtype(ck),
        TrainDtype::Float32 => DType::F32,
        TrainDtype::Bfloat16 => DType::BF16,
        TrainDtype::Float16 => DType::F16,
    }
}

/// Everything a checkpoint must agree on to resume this run.
fn fingerprint(s: &TrainSettings, ck: &Checkpoint, data: &Path) -> Result<String> {
    let mut v = serde_json::to_value(s)?;
    if let Some(o) = v.as_object_mut() {
        for k in [
            "model",
            "checkpoint_every",
            "keep_checkpoints",
            "stall_share",
            "stall_steps",
            "peak_tflops",
            // a run may continue on another device, or through the other ops' implementation, or
            // keeping another number of layers' activations (the same maths)
            "device",
            "ops",
            "kept_layers",
        ] {
            o.remove(k);
        }
    }
    Ok(crate::store::hash_json(&serde_json::json!({
        "settings": v,
        "data": crate::store::hash_file(data)?,
        "model": ck.digest()?.hex,
    })))
}

/// Keeps the lines of `metrics.jsonl` up to `step` (what a resumed run has already logged).
fn truncate_metrics(path: &Path, step: u64) -> Result<()> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    let kept: String = text
        .lines()
        .filter(|l| serde_json::from_str::<Metrics>(l).is_ok_and(|m| m.step <= step))
        .map(|l| format!("{l}\n"))
        .collect();
    crate::store::commit_file(path, |tmp| Ok(std::fs::write(tmp, kept.as_bytes())?))?;
    Ok(())
}

fn fmt_secs(s: f64) -> String {
    let s = s.max(0.0) as u64;
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, s % 3600 / 60)
    } else {
        format!("{}m{:02}s", s / 60, s % 60)
    }
}

/// The progress line's detail after a step: its loss, lr, rate and MFU, and the last
/// checkpoint.
fn progress_detail(m: &Metrics, ckpt: Option<u64>) -> String {
    let ckpt = ckpt.map(|c| format!("  last checkpoint: step {c}"));
    format!(
        "loss {:.4}  lr {:.2e}  {:.0} tok/s  MFU {:.1}%{}",
        m.loss,
        m.lr,
        m.tokens_per_second,
        100.0 * m.mfu,
        ckpt.unwrap_or_default()
    )
}

/// Keeps this machine's training rate of the model's size, for preflight's next estimates.
fn record_rate(p: &Prepared, tokens_per_second: f64) {
    let dev = p.t.model.device();
    crate::machine::record_train(&crate::machine::TrainRecord {
        device: if dev.is_cpu() {
            "cpu".into()
        } else {
            super::memory::device_name(dev)
        },
        params: p.params,
        tokens_per_second,
        unix: crate::store::now_unix(),
    });
}

pub fn run(job: &TrainJob) -> Result<TrainSummary> {
    job.settings
        .validate()
        .map_err(|e| anyhow::anyhow!("train.{e}"))?;
    let t_start = Instant::now();
    super::tune_allocator();
    let mut p = Prepared::load(job)?;
    p.print_plan();
    let mut r = Resumed::open(job, &mut p)?;
    let (num_rows, resumed_from) = (p.rows.len(), r.from);
    let loop_start = Instant::now();
    let mut totals = Totals::default();
    let mut stalled = 0u64;
    let summary = |totals: &Totals, steps, stopped| TrainSummary {
        steps,
        stopped,
        resumed_from,
        rows: num_rows,
        tokens: totals.tokens,
        first_loss: totals.first_loss,
        last_loss: totals.last_loss,
        seconds: t_start.elapsed().as_secs_f64(),
        tokens_per_second: totals.tokens as f64 / loop_start.elapsed().as_secs_f64().max(1e-9),
        tensors: 0,
        tensors_unchanged: 0,
        median_relative_change: 0.0,
    };
    let mut tracker = crate::progress::Tracker::new("train", "steps", Some(p.total))
        .with_file(job.progress_file.clone())
        .resumed(r.start);
    let mut checkpointed = r.from;
    // a stop at or before the checkpoint resumed from: nothing to train now (the loop below
    // would pass the stop and train to the end)
    if let Some(k) = job
        .stop_after
        .filter(|&k| k <= r.start && r.start < p.total)
    {
        tracker.finish();
        tracing::info!(
            "--stop-after {k}: the run is already at step {} of {}; nothing trained (rerun \
             without it, or with a later step, to continue)",
            r.start,
            p.total
        );
        return Ok(summary(&totals, r.start, true));
    }
    for step in r.start..p.total {
        let m = p.step(&mut r, step, loop_start)?;
        writeln!(r.metrics, "{}", serde_json::to_string(&m)?)?;
        r.metrics.flush()?;
        totals.add(&m);
        p.print_step(&m, &mut stalled);
        let detail = |ckpt: Option<u64>| progress_detail(&m, ckpt);
        tracker.detail(detail(checkpointed));
        tracker.set(m.step);
        let done = step + 1;
        let stop = job.stop_after == Some(done) && done < p.total;
        let every = p.s.checkpoint_every;
        if stop || done == p.total || (every > 0 && done % every == 0) {
            p.checkpoint(&mut r, done, m.loss)?;
            write_board(job)?;
            checkpointed = Some(done);
            tracker.detail(detail(checkpointed));
            tracker.flush();
            crate::fault::point("train.after_checkpoint");
        }
        if stop {
            tracker.finish();
            tracing::info!(
                "stopped after step {done} of {} (--stop-after); rerun to continue",
                p.total
            );
            return Ok(summary(&totals, done, true));
        }
    }
    tracker.finish();
    let change = p.export()?;
    let done = summary(&totals, p.total, false);
    // this machine's rate, for preflight's next estimates (a run of a few seconds measures
    // mostly its start)
    if loop_start.elapsed().as_secs_f64() >= 5.0 && totals.tokens > 0 {
        record_rate(&p, done.tokens_per_second);
    }
    Ok(TrainSummary {
        tensors: change.tensors,
        tensors_unchanged: change.unchanged,
        median_relative_change: change.median,
        ..done
    })
}

/// What a run knows before its first step: data, plan, model, optimizer, schedule.
struct Prepared<'a> {
    job: &'a TrainJob,
    s: &'a TrainSettings,
    ck: Checkpoint,
    rows: Vec<super::data::SftRow>,
    /// The rows of each optimizer step.
    plan: Vec<Vec<usize>>,
    total: u64,
    /// The dtype the model is stored and exported in.
    dtype: DType,
    t: Trainable,
    params: u64,
    opt: AdamW,
    sched: Schedule,
    /// The device's matmul peak, for MFU (FLOP/s).
    peak: f64,
    /// The settings, data and base model a checkpoint must match.
    fingerprint: String,
    /// With recompute: the last layers that keep their activations ([`plan_kept_layers`]).
    kept_layers: usize,
}

/// Share of the rows' tokens that carry loss (the completions).
fn loss_share(rows: &[super::data::SftRow]) -> f64 {
    let (loss, all): (usize, usize) = rows
        .iter()
        .map(|r| (r.completion.len(), r.len()))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    loss as f64 / all.max(1) as f64
}

/// Of the share of a GPU's memory the plan fills with kept activations: the budget is not yet
/// checked against a measured peak on a GPU (it was 26% under one), so 30% stays free.
const KEPT_LAYERS_MEMORY_SHARE: f64 = 0.7;

/// With recompute, how many of the last layers keep their activations: `kept_layers` when set
/// (at most the model's layers); else on a GPU as many as the memory budget fits in
/// [`KEPT_LAYERS_MEMORY_SHARE`] of its memory, on the CPU none.
fn plan_kept_layers(
    s: &TrainSettings,
    ck: &Checkpoint,
    params: u64,
    rows: &[super::data::SftRow],
    device: &candle_core::Device,
) -> Result<usize> {
    let layers = ck.config.num_layers();
    if !s.recompute {
        return Ok(0);
    }
    if let Some(k) = s.kept_layers {
        if k > layers {
            bail!("train.kept_layers = {k}: the model has {layers} layers");
        }
        return Ok(k);
    }
    let Some((free, total)) = gpu_memory(device)? else {
        return Ok(0);
    };
    let budget = super::memory::budget_with(&ck.config, params, s, loss_share(rows));
    // what another process holds is not ours to fill: at most what is free beside what this
    // run keeps resident (some of which it already holds)
    let limit = ((total as f64 * KEPT_LAYERS_MEMORY_SHARE) as u64).min(free + budget.resident());
    Ok(budget.kept_layers_within(s, limit))
}

/// A GPU's (free, total) memory in bytes; `None` for the CPU.
fn gpu_memory(device: &candle_core::Device) -> Result<Option<(u64, u64)>> {
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        return Ok(Some(crate::cuda::memory_info(device)?));
    }
    let _ = device;
    Ok(None)
}

/// Where a run starts: the restored checkpoint, and the metrics file it appends to.
struct Resumed {
    start: u64,
    from: Option<u64>,
    metrics: std::fs::File,
    checkpoints: PathBuf,
    /// The newest checkpoint, named when a step fails.
    last: Option<PathBuf>,
}

/// Sums over the steps this process ran.
#[derive(Default)]
struct Totals {
    tokens: u64,
    first_loss: Option<f64>,
    last_loss: f64,
}

impl Totals {
    fn add(&mut self, m: &Metrics) {
        self.tokens += m.tokens as u64;
        self.first_loss.get_or_insert(m.loss);
        self.last_loss = m.loss;
    }
}

/// How far the trained tensors moved from the base.
struct Change {
    tensors: usize,
    unchanged: usize,
    median: f64,
}

impl<'a> Prepared<'a> {
    fn load(job: &'a TrainJob) -> Result<Self> {
        let s = &job.settings;
        let ck = Checkpoint::open(&job.model)?;
        let tok = ck.tokenizer()?;
        let eos = ck.eos_token_ids()?.first().copied();
        let (rows, rep) = read_sft(&job.data, &tok, eos, s.max_seq_len)?;
        print_load(&job.data, &rep);
        let plan = plan_steps(&rows, s);
        let total = plan.len() as u64;
        let dtype = model_dtype(s, &ck);
        let device = crate::model::open_device(s.device)
            .with_context(|| format!("train.device = \"{}\"", s.device))?;
        let mut t = Trainable::load_as(&ck, &device, s.compute())?;
        t.model.set_composed(s.ops == TrainOps::Generic)?;
        let params = t.num_params() as u64;
        let opt = optimizer(s, &t, dtype)?;
        let sched = Schedule {
            kind: s.lr_schedule,
            lr: s.lr,
            warmup_steps: s.warmup_steps,
            min_lr_ratio: s.min_lr_ratio,
            total_steps: total,
        };
        let peak = match s.peak_tflops {
            Some(tf) => tf * 1e12,
            None => super::memory::peak_flops(&device, s.compute())?,
        };
        let fingerprint = fingerprint(s, &ck, &job.data)?;
        let kept_layers = plan_kept_layers(s, &ck, params, &rows, &device)?;
        Ok(Prepared {
            job,
            s,
            ck,
            rows,
            plan,
            total,
            dtype,
            t,
            params,
            opt,
            sched,
            peak,
            fingerprint,
            kept_layers,
        })
    }

    fn print_plan(&self) {
        let s = self.s;
        tracing::info!(
            "train: {} ({} parameters, stored as {:?}), {} rows, {} steps over {} epoch(s)",
            self.ck.dir.display(),
            self.params,
            self.dtype,
            self.rows.len(),
            self.total,
            s.epochs
        );
        tracing::info!(
            "device {} ({}), computing in {:?} over f32 master weights{}; MFU against {:.1} \
             TFLOP/s",
            s.device,
            super::memory::device_name(self.t.device()),
            s.compute(),
            if self.t.model.composed() {
                ", device-generic ops"
            } else {
                ""
            },
            self.peak / 1e12
        );
        let share = loss_share(&self.rows);
        let budget = super::memory::budget_with(&self.ck.config, self.params, s, share);
        tracing::info!(
            "memory budget on the {} (micro_batch_tokens {}, max_seq_len {}):",
            if s.on_gpu() { "GPU" } else { "host" },
            s.micro_batch_tokens,
            s.max_seq_len
        );
        for l in budget.lines(s) {
            tracing::info!("{l}");
        }
        if s.recompute {
            let layers = self.ck.config.num_layers();
            let k = self.kept_layers;
            tracing::info!(
                "recompute: the last {k} of {layers} layers keep their activations ({}; total {} \
                 with them), the {} below recompute theirs",
                if s.kept_layers.is_some() {
                    "kept_layers"
                } else {
                    "as many as fit the budget"
                },
                crate::bytes::format_bytes(budget.total_kept(s, k)),
                layers - k
            );
        }
    }

    /// The epoch of `step` (steps never span epochs: count epoch boundaries in the plan).
    fn epoch_of(&self, step: u64) -> u64 {
        let done: usize = self.plan[..step as usize].iter().map(Vec::len).sum();
        (done / self.rows.len()) as u64
    }

    /// Optimizer step `step` (0-based): its micro-batches' gradients, the guards, the update.
    fn step(&mut self, r: &mut Resumed, step: u64, loop_start: Instant) -> Result<Metrics> {
        let (s, rows) = (self.s, &self.rows);
        let t0 = Instant::now();
        let rows_of_step = &self.plan[step as usize];
        let completion: usize = rows_of_step.iter().map(|&i| rows[i].completion.len()).sum();
        let tokens: usize = rows_of_step.iter().map(|&i| rows[i].len()).sum();
        let gopt = GradOptions {
            loss_chunk_tokens: s.loss_chunk_tokens,
            recompute: s.recompute,
            kept_layers: self.kept_layers,
        };
        let scale = 1.0 / completion as f64;
        let mut sums = GradSums::new(self.t.named_vars().len());
        let mut loss_sum = 0f64;
        for mb in micro_batches(rows_of_step, rows, s) {
            let refs: Vec<(&[u32], &[u32])> = mb
                .iter()
                .map(|&i| (rows[i].prompt.as_slice(), rows[i].completion.as_slice()))
                .collect();
            let b = PackedBatch::pack(&refs);
            loss_sum += self.t.accumulate(&b, scale, gopt, &mut sums)?;
        }
        let loss = loss_sum / completion as f64;
        let last_good = || {
            r.last
                .as_ref()
                .map(|p| format!("the last good checkpoint is {}", p.display()))
                .unwrap_or_else(|| "no checkpoint was written yet".into())
        };
        if !loss.is_finite() {
            bail!(
                "step {}: the loss is {loss}; stopped without applying the update ({})",
                step + 1,
                last_good()
            );
        }
        let grads = sums.finish(self.t.named_vars())?;
        let gn = self.opt.norm_of(&grads)?;
        if !gn.is_finite() {
            bail!(
                "step {}: the gradient norm is {gn}; stopped without applying the update ({})",
                step + 1,
                last_good()
            );
        }
        let lr = self.sched.lr(step);
        let clip = (s.clip_grad_norm > 0.0).then_some(s.clip_grad_norm);
        let st = self.opt.step_with_norm(&grads, gn, lr, clip)?;
        drop(grads);
        let secs = t0.elapsed().as_secs_f64();
        let elapsed = loop_start.elapsed().as_secs_f64();
        let per_step = elapsed / (step + 1 - r.start) as f64;
        let tps = tokens as f64 / secs;
        Ok(Metrics {
            step: step + 1,
            epoch: self.epoch_of(step),
            loss,
            grad_norm: st.grad_norm,
            lr,
            update_ratio: st.update_ratio,
            changed_share: st.changed_share,
            rows: rows_of_step.len(),
            tokens,
            completion_tokens: completion,
            tokens_per_second: tps,
            mfu: 6.0 * self.params as f64 * tps / self.peak,
            elapsed_seconds: elapsed,
            eta_seconds: per_step * (self.total - step - 1) as f64,
        })
    }

    /// The step's line (a debug event: `-v`; every step is in `metrics.jsonl`, and the progress
    /// bar or line shows the latest), and the warning when the weights stop changing for
    /// `stall_steps` steps (`stalled` counts them).
    fn print_step(&self, m: &Metrics, stalled: &mut u64) {
        let s = self.s;
        tracing::debug!(
            "step {}/{}  loss {:.4}  grad norm {:.3}  lr {:.2e}  update/param {:.1e}  \
             changed {:.2}%  {:.0} tok/s  MFU {:.1}%  ETA {}",
            m.step,
            self.total,
            m.loss,
            m.grad_norm,
            m.lr,
            m.update_ratio,
            100.0 * m.changed_share,
            m.tokens_per_second,
            100.0 * m.mfu,
            fmt_secs(m.eta_seconds)
        );
        if m.changed_share >= s.stall_share {
            *stalled = 0;
            return;
        }
        *stalled += 1;
        if *stalled == s.stall_steps {
            tracing::warn!(
                "for {stalled} steps fewer than {:.4}% of the weights changed their \
                 stored ({:?}) value: the updates are below the dtype's resolution or the \
                 learning rate is too small; the model is not learning (lr {:.2e}, update/param \
                 {:.1e})",
                100.0 * s.stall_share,
                self.dtype,
                m.lr,
                m.update_ratio
            );
        }
    }

    /// A checkpoint after `done` steps, and the stage's progress file.
    fn checkpoint(&self, r: &mut Resumed, done: u64, loss: f64) -> Result<()> {
        let s = self.s;
        let state = TrainState {
            step: done,
            total_steps: self.total,
            fingerprint: self.fingerprint.clone(),
            rows_done: self.plan[..done as usize]
                .iter()
                .map(|r| r.len() as u64)
                .sum(),
            epoch: self.epoch_of(done - 1),
            seed: s.seed,
            settings: s.clone(),
            base_model: self.ck.dir.display().to_string(),
            selfdistill_version: env!("CARGO_PKG_VERSION").into(),
            candle_version: "0.10.2".into(),
            last_loss: loss,
            written_unix: crate::store::now_unix(),
        };
        let saved = checkpoint::save(
            &r.checkpoints,
            &self.t,
            &self.opt,
            &state,
            s.keep_checkpoints,
        )?;
        r.last = Some(saved);
        Ok(())
    }

    /// Exports the model, reloads it, and reports how far every tensor moved (an error if none
    /// did).
    fn export(&self) -> Result<Change> {
        let (job, dtype) = (self.job, self.dtype);
        checkpoint::export(&self.t, &self.ck, dtype, &job.output)?;
        let report = checkpoint::change_report(&self.ck, &self.t, dtype)?;
        crate::store::write_json_atomic(&job.state_dir.join(CHANGE_REPORT), &report)?;
        let unchanged: Vec<&str> = report
            .iter()
            .filter(|c| c.changed_share == 0.0)
            .map(|c| c.name.as_str())
            .collect();
        let mut rel: Vec<f64> = report.iter().map(|c| c.relative_change).collect();
        rel.sort_by(f64::total_cmp);
        let median = rel.get(rel.len() / 2).copied().unwrap_or(0.0);
        tracing::info!(
            "tensor change from the base ({dtype:?}): median {median:.2e}, min {:.2e}, max \
             {:.2e}; {} of {} tensors unchanged; report in {}",
            rel.first().copied().unwrap_or(0.0),
            rel.last().copied().unwrap_or(0.0),
            unchanged.len(),
            report.len(),
            job.state_dir.join(CHANGE_REPORT).display()
        );
        if unchanged.len() == report.len() {
            bail!(
                "training did not change the model: no weight of any tensor differs from the \
                 base in {dtype:?} after {} steps (see {})",
                self.total,
                job.state_dir.join(METRICS).display()
            );
        }
        if !unchanged.is_empty() {
            tracing::warn!(
                "{} tensors did not change at all: {}",
                unchanged.len(),
                unchanged.join(", ")
            );
        }
        Ok(Change {
            tensors: report.len(),
            unchanged: unchanged.len(),
            median,
        })
    }
}

impl Resumed {
    /// Restores the newest checkpoint of a run with the same fingerprint (an error for another
    /// run's), and opens `metrics.jsonl` cut to the restored step (or fresh).
    fn open(job: &TrainJob, p: &mut Prepared) -> Result<Resumed> {
        std::fs::create_dir_all(&job.state_dir)
            .with_context(|| format!("cannot create {}", job.state_dir.display()))?;
        let checkpoints = job.state_dir.join("checkpoints");
        let removed = checkpoint::remove_temporaries(&checkpoints)?;
        if removed > 0 {
            tracing::info!(
                "removed {removed} half-written checkpoint(s) in {}",
                checkpoints.display()
            );
        }
        let metrics_path = job.state_dir.join(METRICS);
        let mut start = 0u64;
        let mut from = None;
        if let Some((dir, state)) = checkpoint::latest(&checkpoints)? {
            if state.fingerprint != p.fingerprint {
                bail!(
                    "{} was written by a run with other settings, data or base model; move it \
                     away (or use another output) to start over",
                    dir.display()
                );
            }
            checkpoint::restore(&dir, &state, &p.t, &mut p.opt)?;
            start = state.step;
            from = Some(start);
            tracing::info!(
                "resumed from {} (step {start} of {})",
                dir.display(),
                p.total
            );
            truncate_metrics(&metrics_path, start)?;
        } else if metrics_path.exists() {
            std::fs::remove_file(&metrics_path)?;
        }
        let metrics = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&metrics_path)
            .with_context(|| format!("cannot open {}", metrics_path.display()))?;
        let last = checkpoint::list(&checkpoints)?.pop().map(|(_, p)| p);
        Ok(Resumed {
            start,
            from,
            metrics,
            checkpoints,
            last,
        })
    }
}

/// AdamW over the model's variables with the state precision the settings ask for (warning
/// when it is lossy).
fn optimizer(s: &TrainSettings, t: &Trainable, dtype: DType) -> Result<AdamW> {
    let rounding = match (s.optimizer_state, s.stochastic_rounding) {
        (OptimizerState::F32, _) => StateRounding::F32,
        (OptimizerState::Bf16, true) => StateRounding::Bf16Stochastic { seed: s.seed },
        (OptimizerState::Bf16, false) => {
            tracing::warn!(
                "optimizer_state = \"bf16\" with round-to-nearest: every update smaller \
                 than half a bf16 quantum is lost and weights may silently stop changing \
                 (allow_lossy_state = true). Watch `changed_share` in {METRICS}."
            );
            StateRounding::Bf16Nearest
        }
    };
    let cfg = AdamWConfig {
        beta1: s.betas[0],
        beta2: s.betas[1],
        eps: s.eps,
        weight_decay: s.weight_decay,
    };
    let mut opt = AdamW::with_state(t.masters().to_vec(), cfg, |n| s.decays(n), rounding, dtype)?;
    opt.set_working(t.named_vars())?;
    opt.set_host(s.ops != TrainOps::Generic);
    opt.set_offload(s.optimizer_offload)?;
    if rounding != StateRounding::F32 {
        // the master weights start on the bf16 grid: so does the working copy
        t.refresh_working()?;
    }
    Ok(opt)
}

fn print_load(path: &Path, r: &LoadReport) {
    tracing::info!(
        "data: {} rows from {} ({} tokens, {} completion tokens; {} tokenized from text, {} cut \
         to max_seq_len, {} dropped: prompt too long)",
        r.rows,
        path.display(),
        r.tokens,
        r.completion_tokens,
        r.tokenized,
        r.truncated,
        r.dropped
    );
}
