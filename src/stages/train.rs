//! The train stage: fine-tunes the `[train]` base model on the filter stage's `sft.parquet` and
//! writes the trained model (Hugging Face layout) to `model/` in the stage dir.
//!
//! Checkpoints and `metrics.jsonl` live in `train_state/` beside it; a rerun of an interrupted
//! stage resumes from the newest checkpoint (the stage dir is keyed by the settings and inputs,
//! so a checkpoint found there belongs to this run). Knows nothing of the sampler.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::{output_file, Estimate, Plan, PlannedStage, StageOutput};
use crate::store::{self, InputRef, OutputFile};
use crate::train::settings::TrainSettings;
use crate::train::trainer::{self, TrainJob, TrainSummary};

/// Bump when the output for the same inputs changes.
pub const CODE_VERSION: u32 = 1;
/// The trained model's folder in the stage dir.
pub const MODEL_DIR: &str = "model";
pub const STATE_DIR: &str = "train_state";

fn model_name(s: &TrainSettings) -> Result<&str> {
    s.model
        .as_deref()
        .context("train.model is resolved when the config is read")
}

pub fn plan(
    s: &TrainSettings,
    filter: &PlannedStage,
    workdir: &Path,
    facts: &super::ModelFacts,
) -> Result<PlannedStage> {
    let model = facts.input.clone();
    let params = crate::train::memory::param_count(&facts.config);
    let budget = crate::train::memory::budget(&facts.config, params, s);
    let dtype_bytes = crate::train::checkpoint::config_dtype(&facts.config).size_in_bytes() as u64;
    let inputs = vec![
        InputRef {
            name: "sft".into(),
            location: filter.dir.display().to_string(),
            hash: filter.key.clone(),
        },
        model,
    ];
    let config = serde_json::to_value(s)?;
    let mut st = PlannedStage::new("train", workdir, CODE_VERSION, config, inputs);
    st.estimate = Estimate {
        disk_bytes: crate::train::memory::disk_bytes(params, dtype_bytes, s),
        memory_bytes: budget.total(s),
    };
    Ok(st)
}

/// Trains `model` on the SFT rows in `data` into the stage dir's `model/` (state in
/// `train_state/`, resuming from its newest checkpoint); returns the summary and the model's
/// files as outputs. The pretrain stage trains through here too.
pub(super) fn train_into(
    stage: &PlannedStage,
    settings: TrainSettings,
    model: String,
    data: PathBuf,
) -> Result<(TrainSummary, Vec<OutputFile>)> {
    let job = TrainJob {
        settings,
        model,
        data,
        output: stage.dir.join(MODEL_DIR),
        state_dir: stage.dir.join(STATE_DIR),
        stop_after: None,
        progress_file: Some(stage.dir.join(store::PROGRESS)),
    };
    let summary = trainer::run(&job)?;
    summary.print(&job.output);
    let mut files: Vec<_> = std::fs::read_dir(&job.output)
        .with_context(|| format!("cannot read {}", job.output.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let outputs = files
        .iter()
        .map(|f| output_file(&stage.dir, f, 0))
        .collect::<Result<_>>()?;
    Ok((summary, outputs))
}

pub fn run(s: &TrainSettings, plan: &Plan, stage: &PlannedStage) -> Result<StageOutput> {
    let filter = plan.dep(stage, "sft")?;
    let model = match &stage.model {
        Some(m) => m.clone(),
        None => model_name(s)?.to_string(),
    };
    let data = filter.dir.join(super::filter::OUTPUT);
    let (summary, outputs) = train_into(stage, s.clone(), model, data)?;
    Ok(StageOutput {
        outputs,
        counts: vec![
            ("steps".into(), summary.steps),
            ("rows".into(), summary.rows as u64),
            ("tokens".into(), summary.tokens),
            ("tensors".into(), summary.tensors as u64),
            ("tensors_unchanged".into(), summary.tensors_unchanged as u64),
        ],
        rows: summary.rows as u64,
    })
}
