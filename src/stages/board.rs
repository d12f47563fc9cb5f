//! What each stage puts on TensorBoard, under `<workdir>/tensorboard/<stage name>/`: the train
//! and pretrain stages every logged step (their trainer writes it, see `train::trainer`), a
//! sample stage its round's throughput and pass rate (step = the round), the eval stage each
//! set's pass@1 per model (step = 0 for the base, then the round that trained the model). Pass
//! rates are in percent, as the report gives them.
//!
//! Written from the finished stage's counts and files, so a rerun writes the same scalars.
//! Knows the stages' outputs, not how they are computed.

use std::path::PathBuf;

use anyhow::Result;

use super::{PlannedStage, StageKind};
use crate::store::Manifest;
use crate::tensorboard::Scalar;

/// The stage's TensorBoard folder: `<workdir>/tensorboard/<stage name>`.
pub fn dir(stage: &PlannedStage) -> PathBuf {
    let workdir = stage
        .dir
        .parent()
        .and_then(|p| p.parent())
        .map(PathBuf::from)
        .unwrap_or_default();
    workdir.join("tensorboard").join(&stage.name)
}

/// The round a stage belongs to (`sample-r2` -> 2; a single round's `sample` -> 1).
fn round(name: &str) -> i64 {
    name.rsplit_once("-r")
        .and_then(|(_, r)| r.parse().ok())
        .unwrap_or(1)
}

/// Writes the scalars of a finished sample or eval stage (other stages write none here).
pub fn write(stage: &PlannedStage, m: &Manifest) -> Result<()> {
    let wall_time = m.finished_unix as f64;
    let count = |k: &str| m.counts.iter().find(|c| c.0 == k).map_or(0, |c| c.1);
    let scalar = |tag: String, step: i64, value: f64| Scalar {
        tag,
        step,
        value,
        wall_time,
    };
    let scalars = match stage.kind {
        StageKind::Sample => {
            let step = round(&stage.name);
            vec![
                scalar(
                    "sample/generated_tokens_per_second".into(),
                    step,
                    super::sample::computed_generated_tokens(m) as f64 / m.wall_seconds.max(1e-9),
                ),
                scalar(
                    "sample/pass_rate".into(),
                    step,
                    100.0 * count("correct") as f64 / count("samples").max(1) as f64,
                ),
            ]
        }
        StageKind::Eval => {
            let p = stage.dir.join(super::EVAL_METRICS);
            let results: Vec<crate::eval::EvalResult> =
                serde_json::from_slice(&std::fs::read(&p)?)?;
            results
                .iter()
                .map(|r| {
                    // `base (..)`, `trained (..)`, `trained-r2 (..)`
                    let label = r.model.split(" (").next().unwrap_or("");
                    let step = match label {
                        "base" => 0,
                        l => l
                            .strip_prefix("trained-r")
                            .and_then(|n| n.parse().ok())
                            .unwrap_or(1),
                    };
                    scalar(
                        format!("eval/{}/pass@1", r.set),
                        step,
                        100.0 * r.metrics.pass_at_1.value,
                    )
                })
                .collect()
        }
        _ => return Ok(()),
    };
    crate::tensorboard::write(&dir(stage), &scalars)?;
    Ok(())
}
