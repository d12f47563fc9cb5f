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

use super::{output_file, Estimate, Plan, PlannedStage, StageOutput};
use crate::data::schema::read_problems;
use crate::jobs::sample::{run_settings, SampleSettings};
use crate::store::InputRef;

/// Bump when the output for the same inputs changes.
pub const CODE_VERSION: u32 = 1;

pub fn plan(
    s: &SampleSettings,
    data: &PlannedStage,
    workdir: &Path,
    facts: &super::ModelFacts,
) -> Result<PlannedStage> {
    let model = facts.input.clone();
    let memory_bytes =
        crate::jobs::sample::host_memory_estimate(s, &facts.config, facts.weight_bytes)?;
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
    let mut st = PlannedStage::new(
        super::StageKind::Sample,
        workdir,
        CODE_VERSION,
        config,
        inputs,
    );
    st.estimate = Estimate {
        disk_bytes: 64 << 20,
        memory_bytes,
        ..Estimate::default()
    };
    Ok(st)
}

pub fn run(s: &SampleSettings, plan: &Plan, stage: &PlannedStage) -> Result<StageOutput> {
    let data = plan.dep(stage, "data")?;
    let problems = read_problems(&data.dir.join(super::PROBLEMS))?;
    let out = stage.dir.join(super::COMPLETIONS);
    let mut s = s.clone();
    if let Some(m) = &stage.model {
        s.model = m.clone();
    }
    let summary = run_settings(&s, &problems, (0, 1), &out)?;
    summary.print(&out);
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
