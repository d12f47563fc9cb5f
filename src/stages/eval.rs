//! The eval stage: evaluates the base model and every train stage's model (one per round, when
//! the pipeline trains) on the `[eval]` sets with the same seeds, and writes `metrics.json` and
//! `eval.md` (base vs trained, with deltas and 95% intervals) to the stage dir.
//!
//! Each model's evaluation is cached on its own, keyed by the model (the base's fingerprint, or
//! the key of the stage that made it), the set definitions and their data, the overrides and the verifier,
//! under `eval-cache/` beside the work dir: runs whose work dirs share a folder (the default
//! `runs/<name>`) evaluate a shared base model once. An interrupted evaluation resumes from its
//! samples; two runs evaluating the same model at once take turns (a lock file beside the
//! folder), the second finding it cached. Knows nothing of the trainer.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::{output_file, Estimate, Plan, PlannedStage, StageOutput};
pub use crate::eval::EvalConfig;
use crate::eval::{EvalResult, EvalSet};
use crate::store::{self, InputRef};

/// Bump when the output for the same inputs changes.
pub const CODE_VERSION: u32 = 1;
pub const TABLE: &str = "eval.md";
/// The examples and lengths of [`crate::eval::examples`], which the report shows.
pub const EXAMPLES: &str = "examples.json";
/// The label and input name of the teacher (`[sample] model`) when it is not the base model.
pub const TEACHER: &str = "teacher";

/// The rows of an eval set's files, or (not downloaded: preflight) of its card, which is then
/// added to `cards`.
fn set_rows(s: &EvalSet, cards: &mut Vec<String>) -> Option<u64> {
    let counted = crate::data::hub::resolve(&s.source.location)
        .ok()
        .and_then(|files| {
            files
                .iter()
                .map(|f| crate::data::count_rows(f))
                .sum::<Option<u64>>()
        });
    counted.or_else(|| {
        let c = crate::data::cards::card(&s.source.location)?;
        cards.push(s.source.location.describe());
        Some(c.rows)
    })
}

/// `teacher`: the model that sampled round 1's rows when it is not the base (the student), scored
/// beside it.
pub fn plan(
    e: &EvalConfig,
    base: &super::ModelFacts,
    teacher: Option<&super::ModelFacts>,
    sets: &[EvalSet],
    trained: &[&PlannedStage],
    workdir: &Path,
    resolve: &super::Resolve,
) -> Result<PlannedStage> {
    let mut inputs = vec![base.input.clone(), super::verifier_input()];
    if let Some(t) = teacher {
        inputs.push(InputRef {
            name: TEACHER.into(),
            ..t.input.clone()
        });
    }
    for t in trained {
        inputs.push(InputRef {
            name: format!("trained:{}", t.name),
            ..t.model_input()
        });
    }
    for s in sets {
        inputs.push(super::eval_set_input(s, resolve)?);
    }
    // memory: the sampler's estimate for the hungriest set (one model at a time); work: every
    // set's problems x n x the expected length, for every model
    let mut memory_bytes = 0;
    let mut gpu_bytes = 0;
    let models = 1 + teacher.is_some() as u64 + trained.len() as u64;
    let mut tokens = Some(0u64);
    let mut device = crate::device::DeviceSpec::Cpu;
    let mut batch = 0;
    let mut cards = Vec::new();
    for s in sets {
        let st = e.settings(s, &base.input.location)?;
        memory_bytes = memory_bytes.max(crate::jobs::sample::memory::host_memory_estimate(
            &st,
            &base.config,
            base.weight_bytes,
        )?);
        gpu_bytes = gpu_bytes.max(crate::jobs::sample::memory::gpu_memory_estimate(
            &st,
            &base.config,
        )?);
        let problems = set_rows(s, &mut cards).map(|r| match e.limit.or(s.source.limit) {
            Some(l) => r.min(l as u64),
            None => r,
        });
        let set_tokens = problems.map(|p| {
            p * st.params.n as u64 * super::expected_completion_tokens(st.params.max_new_tokens)
        });
        tokens = tokens.zip(set_tokens).map(|(a, b)| a + b * models);
        device = st.device;
        batch = st.max_num_seqs;
    }
    let config = serde_json::to_value(e)?;
    let mut st = PlannedStage::new(
        super::StageKind::Eval,
        workdir,
        CODE_VERSION,
        config,
        inputs,
    );
    st.deps = trained
        .iter()
        .map(|t| ("trained", t.name.clone()))
        .collect();
    st.estimate = Estimate {
        // each set's samples for each model (a row per sample, ~4 bytes a token)
        disk_bytes: tokens.map_or(0, |t| 4 * t + (64 << 10)),
        memory_bytes,
        gpu_bytes,
        cards,
        work: tokens.map(|tokens| super::Work {
            tokens,
            train: false,
            params: base.config.num_params() as u64,
            device,
            batch,
            basis: format!(
                "{} set(s) x {models} model(s): problems x n x half of max_new_tokens (assumed)",
                sets.len()
            ),
        }),
        ..Estimate::default()
    };
    Ok(st)
}

/// The cache folder shared by the runs beside `workdir`.
pub fn cache_root(workdir: &Path) -> PathBuf {
    let parent = workdir.parent().filter(|p| !p.as_os_str().is_empty());
    parent.unwrap_or(Path::new(".")).join("eval-cache")
}

/// The models an eval stage scores: (label, location, fingerprint): the base model, a teacher
/// that is not the student, and each trained one.
fn models_of(
    stage: &PlannedStage,
    plan: &Plan,
    base_model: &str,
) -> Result<Vec<(String, String, String)>> {
    let fingerprint = |name: &str| -> Result<String> {
        Ok(stage
            .inputs
            .iter()
            .find(|i| i.name == name)
            .with_context(|| format!("eval stage without its `{name}` input"))?
            .hash
            .clone())
    };
    let base_model = stage.model.as_deref().unwrap_or(base_model);
    let mut models = vec![(
        "base".to_string(),
        base_model.to_string(),
        fingerprint("model")?,
    )];
    if let Some(t) = stage.inputs.iter().find(|i| i.name == TEACHER) {
        models.push((TEACHER.to_string(), t.location.clone(), t.hash.clone()));
    }
    for (_, name) in stage.deps.iter().filter(|(role, _)| *role == "trained") {
        let t = plan
            .get(name)
            .with_context(|| format!("the eval stage reads {name}, which is not planned"))?;
        let dir = t.dir.join(super::MODEL_DIR);
        // `train` -> "trained", `train-r2` -> "trained-r2"
        let label = format!("trained{}", &name["train".len()..]);
        models.push((
            label,
            dir.display().to_string(),
            fingerprint(&format!("trained:{name}"))?,
        ));
    }
    Ok(models)
}

pub fn run(
    e: &EvalConfig,
    base_model: &str,
    sets: &[EvalSet],
    plan: &Plan,
    stage: &PlannedStage,
) -> Result<StageOutput> {
    let shared: Vec<&InputRef> = stage
        .inputs
        .iter()
        .filter(|i| i.name.starts_with("set:") || i.name == "verifier")
        .collect();
    let models = models_of(stage, plan, base_model)?;
    let root = cache_root(&plan.workdir);
    let mut results = Vec::new();
    // (set, "label (model)", samples file), set by set, for the examples
    let mut samples = Vec::new();
    let mut reused = 0u64;
    for (label, model, fp) in &models {
        let key = store::hash_json(&serde_json::json!({
            "code_version": CODE_VERSION,
            "model": fp,
            "inputs": shared.iter().map(|i| (&i.name, &i.hash)).collect::<Vec<_>>(),
            "config": stage.config,
        }));
        let dir = root.join(&key[..16]);
        // another run evaluating the same model waits here, then finds it cached
        let _lock = store::lock_waiting(
            &root.join(format!("{}.lock", &key[..16])),
            &format!("the evaluation of the {label} model"),
        )?;
        let done = dir.join(super::EVAL_METRICS);
        if done.is_file() {
            tracing::info!("eval: {label} model: cached in {}", dir.display());
            reused += 1;
        } else {
            crate::eval::evaluate(
                std::slice::from_ref(model),
                sets,
                e,
                &dir,
                Some(&stage.dir.join(store::PROGRESS)),
            )?;
        }
        // read back in both cases, so that a cached and a fresh evaluation give the same bytes
        let bytes =
            std::fs::read(&done).with_context(|| format!("cannot read {}", done.display()))?;
        let mut rs: Vec<EvalResult> = serde_json::from_slice(&bytes)
            .with_context(|| format!("{}: unreadable", done.display()))?;
        for r in &mut rs {
            // the samples are under the name the cached evaluation was made with, which may
            // be another run's path to the same weights
            let file = dir
                .join(crate::eval::model_slug(&r.model))
                .join(&r.set)
                .join("samples.parquet");
            samples.push((r.set.clone(), format!("{label} ({model})"), file));
            r.model = format!("{label} ({})", r.model);
        }
        results.extend(rs);
    }
    // what the models wrote: examples and lengths, for the report
    samples.sort_by_key(|(set, ..)| sets.iter().position(|s| &s.name == set));
    let problems = crate::eval::problem_texts(sets)?;
    let examples = crate::eval::examples::select(&samples, &problems, 0)?;
    store::write_json_atomic(&stage.dir.join(EXAMPLES), &examples)?;
    store::write_json_atomic(&stage.dir.join(super::EVAL_METRICS), &results)?;
    let labels: Vec<String> = results.iter().map(|r| r.model.clone()).collect();
    let table = crate::eval::table(&results, &labels);
    store::commit_file(&stage.dir.join(TABLE), |tmp| {
        Ok(std::fs::write(tmp, &table)?)
    })?;
    crate::outln!("{table}");
    Ok(StageOutput {
        outputs: vec![
            output_file(
                &stage.dir,
                &stage.dir.join(super::EVAL_METRICS),
                results.len() as u64,
            )?,
            output_file(&stage.dir, &stage.dir.join(TABLE), 0)?,
            output_file(
                &stage.dir,
                &stage.dir.join(EXAMPLES),
                examples.examples.len() as u64,
            )?,
        ],
        counts: vec![
            ("models".into(), models.len() as u64),
            ("sets".into(), sets.len() as u64),
            ("model_evals_reused".into(), reused),
        ],
        rows: results.len() as u64,
    })
}
