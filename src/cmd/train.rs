//! `pipeline train`: fine-tunes a checkpoint on an SFT Parquet file and writes the trained model
//! in Hugging Face layout.
//!
//! Settings come from `--config` (a file with a `[train]` table, e.g. a pipeline config, or the
//! bare keys) with a few flags on top; training state (checkpoints, `metrics.jsonl`) goes to
//! `--state-dir`, by default `OUTPUT/train_state`. Rerunning the same command resumes. Knows
//! nothing of stages; the work is in `train::trainer`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::train::settings::TrainSettings;
use crate::train::trainer::{self, TrainJob};

#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    /// The base model: a checkpoint folder or a hub id.
    #[arg(long)]
    pub model: String,
    /// The SFT rows (`prompt_token_ids`, `completion_token_ids`), as the filter stage writes them.
    #[arg(long)]
    pub data: PathBuf,
    /// A TOML file with the train settings: a `[train]` table, or the keys at the top level.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Where the trained model goes.
    #[arg(long)]
    pub output: PathBuf,
    /// Checkpoints and metrics (default: OUTPUT/train_state).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Overrides `max_steps`.
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// Overrides `lr`.
    #[arg(long)]
    pub lr: Option<f64>,
    /// Stop after this step (1 or more) with a checkpoint; the same command later continues
    /// from it.
    #[arg(long, value_parser = super::at_least_one::<u64>)]
    pub stop_after: Option<u64>,
    /// Overrides `device`: cpu, cuda or cuda:N.
    #[arg(long)]
    pub device: Option<crate::device::DeviceSpec>,
    /// Overrides `compute_dtype`: auto (bf16 on a GPU, f32 on the CPU), f32 or bf16.
    #[arg(long)]
    pub compute_dtype: Option<String>,
    /// Overrides `ops`: auto, or generic (the device-generic ops on the CPU too).
    #[arg(long)]
    pub ops: Option<String>,
}

/// Reads train settings from `path`: its `[train]` table, or the whole file.
pub fn read_settings(path: &Path) -> Result<TrainSettings> {
    let text = crate::bytes::read_settings_file(path, "train settings")?;
    let value: toml::Table =
        toml::from_str(&text).with_context(|| format!("{} is not valid TOML", path.display()))?;
    let table = match value.get("train") {
        Some(toml::Value::Table(t)) => t.clone(),
        Some(_) => anyhow::bail!("{}: `train` is not a table", path.display()),
        None => value,
    };
    let s: TrainSettings = table.try_into().map_err(|e: toml::de::Error| {
        anyhow::anyhow!(
            "{}: [train]: {}",
            path.display(),
            crate::config::plain_message(e.message().trim())
        )
    })?;
    s.validate()
        .map_err(|e| anyhow::anyhow!("{}: `train.{e}", path.display()))?;
    Ok(s)
}

pub fn run(a: &TrainArgs) -> Result<()> {
    let mut s = match &a.config {
        Some(p) => read_settings(p)?,
        None => TrainSettings::default(),
    };
    if let Some(m) = a.max_steps {
        s.max_steps = Some(m);
    }
    if let Some(lr) = a.lr {
        s.lr = lr;
    }
    if let Some(d) = a.device {
        s.device = d;
    }
    let value = |v: &str| toml::Value::String(v.to_string());
    if let Some(c) = &a.compute_dtype {
        s.compute_dtype = value(c)
            .try_into()
            .map_err(|_| anyhow::anyhow!("--compute-dtype `{c}`: use auto, f32 or bf16"))?;
    }
    if let Some(o) = &a.ops {
        s.ops = value(o)
            .try_into()
            .map_err(|_| anyhow::anyhow!("--ops `{o}`: use auto or generic"))?;
    }
    s.model = None;
    s.validate().map_err(|e| anyhow::anyhow!("--{e}"))?;
    let job = TrainJob {
        settings: s,
        model: a.model.clone(),
        data: a.data.clone(),
        output: a.output.clone(),
        state_dir: a
            .state_dir
            .clone()
            .unwrap_or_else(|| a.output.join("train_state")),
        stop_after: a.stop_after,
        progress_file: None,
        tensorboard: None,
    };
    let summary = trainer::run(&job)?;
    summary.print(&job.output);
    Ok(())
}
