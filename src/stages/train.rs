//! The train stage: fine-tunes the `[train]` base model on the filter stage's `sft.parquet` and
//! writes the trained model (Hugging Face layout) to `model/` in the stage dir.
//!
//! Checkpoints and `metrics.jsonl` live in `train_state/` beside it; a rerun of an interrupted
//! stage resumes from the newest checkpoint (the stage dir is keyed by the settings and inputs,
//! so a checkpoint found there belongs to this run). Knows nothing of the sampler.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::{output_file, Estimate, Plan, PlannedStage, StageOutput, MODEL_DIR, TRAIN_STATE_DIR};
use crate::store::{self, InputRef, OutputFile};
use crate::train::settings::TrainSettings;

/// Bump when the output for the same inputs changes.
pub const CODE_VERSION: u32 = 1;

fn model_name(s: &TrainSettings) -> Result<&str> {
    s.model
        .as_deref()
        .context("train.model is resolved when the config is read")
}

/// `mix`: with `[mix]`, the earlier rounds' filter stages it accumulates (empty without
/// `accumulate`) and the resolver for its sources.
pub fn plan(
    s: &TrainSettings,
    filter: &PlannedStage,
    workdir: &Path,
    facts: &super::ModelFacts,
    mix: Option<(&crate::config::MixConfig, &[&PlannedStage], &super::Resolve)>,
) -> Result<PlannedStage> {
    let model = facts.input.clone();
    let params = facts.config.num_params() as u64;
    let budget = crate::train::memory::budget(&facts.config, params, s);
    let dtype_bytes = crate::train::checkpoint::config_dtype(&facts.config).size_in_bytes() as u64;
    let mut inputs = vec![
        InputRef {
            name: "sft".into(),
            location: filter.dir.display().to_string(),
            hash: filter.key.clone(),
        },
        model,
    ];
    let mut config = serde_json::to_value(s)?;
    // a train stage without [mix] keeps the key it always had
    let mut rows = filter.estimate.rows;
    if let Some((m, earlier, resolve)) = mix {
        inputs.extend(super::mix::inputs(m, earlier, resolve)?);
        config["mix"] = serde_json::to_value(m)?;
        rows = super::mix::planned_rows(m, &filter.estimate, earlier);
    }
    let mut st = PlannedStage::new(
        super::StageKind::Train,
        workdir,
        CODE_VERSION,
        config,
        inputs,
    );
    let work = rows
        .zip(filter.estimate.row_tokens)
        .map(|(rows, per_row)| super::Work {
            tokens: rows * per_row * s.epochs,
            train: true,
            params,
            device: s.device,
            batch: 0,
            basis: format!(
                "at most {rows} SFT rows x {per_row} tokens (assumed) x {} epoch(s)",
                s.epochs
            ),
        });
    st.estimate = Estimate {
        disk_bytes: crate::train::memory::disk_bytes(
            params,
            dtype_bytes,
            s,
            rows.zip(filter.estimate.row_tokens)
                .map(|(r, t)| crate::train::memory::planned_steps(s, r, t)),
        ),
        work,
        cards: filter.estimate.cards.clone(),
        ..train_memory(s, &budget)
    };
    Ok(st)
}

/// Where a training run's memory goes: all of it on the host on the CPU; on a GPU, the budget
/// there, and on the host one tensor of the checkpoint or export at a time (the largest, in
/// f32) beside the data.
pub fn train_memory(s: &TrainSettings, budget: &crate::train::memory::Budget) -> Estimate {
    if s.on_gpu() {
        Estimate {
            memory_bytes: budget.host(),
            gpu_bytes: budget.total(s),
            ..Estimate::default()
        }
    } else {
        Estimate {
            memory_bytes: budget.total(s),
            ..Estimate::default()
        }
    }
}

pub fn run(
    s: &TrainSettings,
    cfg: &crate::config::Config,
    plan: &Plan,
    stage: &PlannedStage,
) -> Result<StageOutput> {
    let filter = plan.dep(stage, "sft")?;
    let model = match &stage.model {
        Some(m) => m.clone(),
        None => model_name(s)?.to_string(),
    };
    let (mut data, mut counts) = match &cfg.mix {
        Some(m) => {
            let (path, counts) = super::mix::build(m, cfg.sample.as_ref(), &model, plan, stage)?;
            (path, counts)
        }
        None => (filter.dir.join(super::SFT), Vec::new()),
    };
    let mut written = Vec::new();
    if cfg.mix.is_some() {
        let rows = counts.iter().find(|c| c.0 == "mix.rows").map_or(0, |c| c.1);
        written.push((data.clone(), rows));
    }
    // a teacher's rows that the student's tokenizer or template would read wrongly: as text
    let problems = plan.dep(filter, "data")?.dir.join(super::PROBLEMS);
    if let Some((path, n)) =
        super::student::prepare(&data, &problems, cfg.sample.as_ref(), &model, &stage.dir)?
    {
        counts.push(("rerendered_rows".into(), n));
        written.push((path.clone(), n));
        data = path;
    }
    let (summary, mut outputs) = train_into(stage, s.clone(), model, data)?;
    for (path, rows) in written {
        outputs.push(output_file(&stage.dir, &path, rows)?);
    }
    let mut all = vec![
        ("steps".into(), summary.steps),
        ("rows".into(), summary.rows as u64),
        ("tokens".into(), summary.tokens),
        ("tensors".into(), summary.tensors as u64),
        ("tensors_unchanged".into(), summary.tensors_unchanged as u64),
    ];
    all.append(&mut counts);
    Ok(StageOutput {
        outputs,
        counts: all,
        rows: summary.rows as u64,
    })
}

/// Trains `model` on the SFT rows in `data` into the stage dir's `model/` (state in
/// `train_state/`, resuming from its newest checkpoint); returns the summary and the model's
/// files as outputs. The pretrain stage trains through here too (the one import between
/// stages: see [`super`]).
pub(crate) fn train_into(
    stage: &PlannedStage,
    settings: crate::train::settings::TrainSettings,
    model: String,
    data: PathBuf,
) -> Result<(crate::train::trainer::TrainSummary, Vec<OutputFile>)> {
    let job = crate::train::trainer::TrainJob {
        settings,
        model,
        data,
        output: stage.dir.join(MODEL_DIR),
        state_dir: stage.dir.join(TRAIN_STATE_DIR),
        stop_after: None,
        progress_file: Some(stage.dir.join(store::PROGRESS)),
        tensorboard: Some(super::board::dir(stage)),
    };
    let summary = crate::train::trainer::run(&job)?;
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
