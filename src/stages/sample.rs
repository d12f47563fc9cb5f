//! The sample stage: samples the data stage's problems with the `[sample]` settings and writes
//! `completions.parquet` (graded against the problems' gold answers).
//!
//! Resumes through the sampling job's committed parts (`completions.parquet.parts/` in the stage
//! dir). The key covers the settings, the problems (the data stage's key) and the checkpoint's
//! config, tokenizer and weight file sizes (hashing gigabytes of weights at every plan would cost
//! minutes; a changed checkpoint under the same name and sizes is not detected). Knows nothing of
//! the filter.

use std::path::Path;

use anyhow::Result;

use super::{output_file, stage_key, Estimate, Plan, PlannedStage, StageOutput};
use crate::data::schema::read_problems;
use crate::sampler::job::{run_settings, SampleSettings};
use crate::store::{self, InputRef};

/// Bump when the output for the same inputs changes.
pub const CODE_VERSION: u32 = 1;
pub const OUTPUT: &str = "completions.parquet";

/// A cheap fingerprint of a checkpoint folder: config and tokenizer contents, weight sizes.
fn model_input(model: &str) -> Result<InputRef> {
    let ck = crate::model::Checkpoint::open(model)?;
    let mut parts = vec![
        store::hash_file(&ck.dir.join("config.json"))?,
        store::hash_file(&ck.dir.join("tokenizer.json"))?,
    ];
    for w in &ck.weights {
        parts.push(format!(
            "{}:{}",
            w.file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default(),
            std::fs::metadata(w)?.len()
        ));
    }
    Ok(InputRef {
        name: "model".into(),
        location: ck.dir.display().to_string(),
        hash: store::hash_json(&serde_json::json!(parts)),
    })
}

pub fn plan(s: &SampleSettings, data: &PlannedStage, workdir: &Path) -> Result<PlannedStage> {
    let model = model_input(&s.model)?;
    let weights: u64 = crate::model::Checkpoint::open(&s.model)?
        .weights
        .iter()
        .filter_map(|w| std::fs::metadata(w).ok())
        .map(|m| m.len())
        .sum();
    let inputs = vec![
        InputRef {
            name: "problems".into(),
            location: data.dir.display().to_string(),
            hash: data.key.clone(),
        },
        model,
        super::verifier_input(),
    ];
    let config = serde_json::to_value(s)?;
    let key = stage_key("sample", CODE_VERSION, &config, &inputs);
    Ok(PlannedStage {
        name: "sample",
        dir: store::stage_dir(workdir, "sample", &key),
        key,
        code_version: CODE_VERSION,
        config,
        inputs,
        files: Vec::new(),
        // Weights in f32 (bf16 checkpoints double) and the KV cache; the output is small.
        estimate: Estimate {
            disk_bytes: 64 << 20,
            memory_bytes: weights * 2,
        },
    })
}

pub fn run(s: &SampleSettings, plan: &Plan, stage: &PlannedStage) -> Result<StageOutput> {
    let data = plan
        .get("data")
        .ok_or_else(|| anyhow::anyhow!("the sample stage needs the data stage"))?;
    let problems = read_problems(&data.dir.join(super::data::OUTPUT))?;
    let out = stage.dir.join(OUTPUT);
    let summary = run_settings(s, &problems, (0, 1), &out)?;
    crate::cmd::sample::print_summary(&summary, &out);
    let counts = vec![
        ("problems".to_string(), summary.problems as u64),
        ("samples".to_string(), summary.samples),
        ("correct".to_string(), summary.correct),
        ("prompt_tokens".to_string(), summary.prompt_tokens),
        ("generated_tokens".to_string(), summary.generated_tokens),
        ("preemptions".to_string(), summary.preemptions),
        ("samples_saved".to_string(), summary.samples_saved),
    ];
    Ok(StageOutput {
        outputs: vec![output_file(&stage.dir, &out, summary.samples)?],
        counts,
        rows: summary.samples,
    })
}
