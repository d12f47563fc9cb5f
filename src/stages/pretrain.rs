//! The pretrain stage: a model from nothing. Builds a tokenizer covering the pretraining rows and
//! every source the run will sample or evaluate, writes a seeded Qwen3-shaped initial checkpoint
//! (`init/`), turns the source's problems and worked solutions into SFT rows (`rows.parquet`:
//! the prompt rendered as the sampler will render it, the solution as the completion), and trains
//! on them with the same trainer as the train stage, writing `model/` (Hugging Face layout).
//!
//! `init/` and `rows.parquet` are pure functions of the config and the source files, so an
//! interrupted stage rebuilds them identically and the trainer resumes from its newest
//! checkpoint in `train_state/`. Knows nothing of what the problems are about.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use super::{output_file, Estimate, ModelFacts, PlannedStage, StageOutput};
use crate::data::load_source;
use crate::data::schema::{write_completions, Completion};
use crate::jobs::sample::prompt::{build_prompts, PromptTemplate};
use crate::pretrain::{write_initial_checkpoint, PretrainConfig};

/// Bump when the output for the same inputs changes.
pub const CODE_VERSION: u32 = 1;
pub const INIT_DIR: &str = "init";
pub const ROWS: &str = "rows.parquet";

/// The vocabulary planned for before the corpus is read (it only sizes the estimates): a
/// generated corpus's closed vocabulary is far smaller.
const PLANNED_VOCAB: usize = 256;

/// Bytes of a source row (a JSON line: problem, solution and keys) per token of the row the
/// stage trains on, assumed for the time estimate (the generated arithmetic corpus: ~2.8).
const SOURCE_BYTES_PER_TOKEN: u64 = 3;

/// Input names: `source#i` for the pretraining files, `tokenizer:<name>#i` for the others.
fn source_inputs(p: &PretrainConfig, resolve: &super::Resolve) -> Result<super::LocationInputs> {
    let mut inputs = resolve.location("source", "pretrain.source", &p.source.location)?;
    for s in &p.tokenizer_sources {
        let what = format!("pretrain tokenizer source `{}`", s.name);
        inputs.extend(resolve.location(&format!("tokenizer:{}", s.name), &what, &s.location)?);
    }
    Ok(inputs)
}

/// The planned stage, and the facts of the model it will make (for the stages that use it).
pub fn plan(
    p: &PretrainConfig,
    workdir: &Path,
    resolve: &super::Resolve,
) -> Result<(PlannedStage, ModelFacts)> {
    let mut inputs = Vec::new();
    let mut files = Vec::new();
    let mut bytes = 0;
    // what the stage writes of its source: the rows it keeps (a limit keeps that share)
    let mut written = 0;
    // the pretraining rows, when the source can be counted
    let mut source_rows: Option<u64> = None;
    for (input, path, n) in source_inputs(p, resolve)? {
        bytes += n;
        if input.name.starts_with("source#") {
            let rows = path.as_deref().and_then(crate::data::count_rows);
            written += match (p.source.limit, rows) {
                (Some(l), Some(r)) if r > 0 => n * (l as u64).min(r) / r,
                _ => n,
            };
            if let Some(r) = rows {
                let kept = p.source.limit.map_or(r, |l| r.min(l as u64));
                source_rows = Some(source_rows.unwrap_or(0) + kept);
            }
        }
        if let Some(path) = path {
            files.push((input.name.clone(), path));
        }
        inputs.push(input);
    }
    let config = serde_json::to_value(p)?;
    let model_config =
        crate::model::ModelConfig::parse(&p.model.config_json(PLANNED_VOCAB).to_string())?;
    let params = model_config.num_params() as u64;
    let budget = crate::train::memory::budget(&model_config, params, &p.train);
    let mut st = PlannedStage::new(
        super::StageKind::Pretrain,
        workdir,
        CODE_VERSION,
        config,
        inputs,
    );
    st.files = files;
    let train = super::train::train_memory(&p.train, &budget);
    st.estimate = Estimate {
        // the initial and trained weights, the trainer's checkpoints, the rows
        disk_bytes: crate::train::memory::disk_bytes(params, 4, &p.train, None)
            + params * 4
            + written,
        memory_bytes: train.memory_bytes + bytes * 4,
        gpu_bytes: train.gpu_bytes,
        work: source_rows.filter(|&r| r > 0).map(|rows| {
            let row_tokens = (written / rows / SOURCE_BYTES_PER_TOKEN).max(1);
            let steps = crate::train::memory::planned_steps(&p.train, rows, row_tokens);
            let per_step = crate::train::memory::rows_per_step(&p.train, row_tokens);
            let trained = (steps * per_step).min(rows * p.train.epochs);
            super::Work {
                tokens: trained * row_tokens,
                train: true,
                params,
                device: p.train.device,
                batch: 0,
                basis: format!(
                    "{trained} rows ({steps} steps) x {row_tokens} tokens (a source row's bytes / \
                     {SOURCE_BYTES_PER_TOKEN}, assumed)"
                ),
            }
        }),
        ..Estimate::default()
    };
    let facts = ModelFacts {
        input: st.model_input(),
        weight_bytes: params * 4,
        config: model_config,
    };
    Ok((st, facts))
}

/// The texts of the problems of `spec` read from `files`: problem, solution and answer.
fn texts_of(
    spec: &crate::data::source::SourceSpec,
    files: &[PathBuf],
    out: &mut Vec<String>,
) -> Result<()> {
    let (problems, _) = load_source(spec, files, crate::data::BadRows::STRICT)?;
    for p in problems {
        out.push(p.problem);
        out.extend(p.solution);
        out.push(p.gold_answer);
    }
    Ok(())
}

pub fn run(p: &PretrainConfig, stage: &PlannedStage) -> Result<StageOutput> {
    let files_of = |prefix: &str| -> Vec<PathBuf> {
        stage
            .files
            .iter()
            .filter(|(n, _)| n.rsplit_once('#').map(|(a, _)| a) == Some(prefix))
            .map(|(_, f)| f.clone())
            .collect()
    };
    // 1) the pretraining problems, each with its worked solution
    let (problems, rep) =
        load_source(&p.source, &files_of("source"), crate::data::BadRows::STRICT)?;
    if let Some(bad) = problems.iter().find(|q| q.solution.is_none()) {
        bail!(
            "pretrain.source `{}`: row {} ({}) has no solution to learn from (set solution_field)",
            p.source.name,
            bad.source_row,
            bad.problem_id
        );
    }
    tracing::info!(
        "    {} problems with solutions <- {}",
        rep.problems,
        p.source.location.describe()
    );

    // 2) the tokenizer's corpus and the initial checkpoint
    let mut corpus = Vec::new();
    for q in &problems {
        corpus.push(q.problem.clone());
        corpus.extend(q.solution.clone());
        corpus.push(q.gold_answer.clone());
    }
    for s in &p.tokenizer_sources {
        texts_of(s, &files_of(&format!("tokenizer:{}", s.name)), &mut corpus)?;
    }
    let init = stage.dir.join(INIT_DIR);
    write_initial_checkpoint(&init, &p.model, corpus.iter().map(String::as_str), p.seed)?;
    let ck = crate::model::Checkpoint::open(&init.display().to_string())?;
    let tok = ck.tokenizer()?;
    let unknown = corpus
        .iter()
        .filter(|t| tok.encode(t).is_ok_and(|ids| ids.contains(&1)))
        .count();
    if unknown > 0 {
        bail!("the built tokenizer leaves {unknown} texts of the corpus with unknown pieces");
    }

    // 3) the SFT rows, prompts rendered as the sampler renders them
    let template = PromptTemplate::parse(&p.prompt_template, None, None)?;
    if matches!(template, PromptTemplate::Chat { .. }) {
        bail!("pretrain.prompt_template: a model built from scratch has no chat template");
    }
    let prompts = build_prompts(&problems, &template, None, &tok)?;
    let rows: Vec<Completion> = problems
        .iter()
        .zip(prompts)
        .map(|(q, (prompt, _))| {
            Completion::text(
                q.problem_id.clone(),
                prompt,
                q.solution.clone().unwrap_or_default(),
                None,
            )
        })
        .collect();
    let rows_path = stage.dir.join(ROWS);
    write_completions(&rows_path, &rows, false)?;

    // 4) train
    let mut settings = p.train.clone();
    let init = init.display().to_string();
    settings.model = Some(init.clone());
    let (summary, model_files) =
        super::train::train_into(stage, settings, init, rows_path.clone())?;
    let mut outputs = vec![output_file(&stage.dir, &rows_path, rows.len() as u64)?];
    outputs.extend(model_files);
    Ok(StageOutput {
        outputs,
        counts: vec![
            ("problems".into(), rows.len() as u64),
            ("vocab".into(), ck.config.vocab_size as u64),
            ("steps".into(), summary.steps),
            ("tokens".into(), summary.tokens),
            ("tensors_unchanged".into(), summary.tensors_unchanged as u64),
        ],
        rows: rows.len() as u64,
    })
}
