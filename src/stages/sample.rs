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
use crate::sampler::job::{run_settings, SampleSettings};
use crate::store::InputRef;

/// Bump when the output for the same inputs changes.
pub const CODE_VERSION: u32 = 1;
pub const OUTPUT: &str = "completions.parquet";

/// Prompt length assumed for the KV estimate before the prompts exist.
pub const ESTIMATE_PROMPT_TOKENS: usize = 512;

/// Host memory: on the CPU, the weights as computed (f32: a bf16 checkpoint doubles) plus the KV
/// cache (`kv_cache`, or max_num_seqs sequences of a 512-token prompt plus max_new_tokens); on a
/// GPU, the checkpoint as read (weights and cache live on the device, whose memory is checked
/// when the run starts: the default cache takes 90% of what the weights leave free).
pub(super) fn memory_estimate(s: &SampleSettings, model: &super::ModelFacts) -> Result<u64> {
    let stored = model.weight_bytes;
    let widen = match model.config.dtype.as_str() {
        "bfloat16" | "float16" => 2,
        _ => 1,
    };
    if s.max_new_tokens >= model.config.max_position_embeddings {
        anyhow::bail!(
            "sample.max_new_tokens = {} does not fit the model's context of {} tokens",
            s.max_new_tokens,
            model.config.max_position_embeddings
        );
    }
    if s.device != "cpu" {
        return Ok(stored);
    }
    let per_token = crate::sampler::kv_cache::KvCache::bytes_per_token(&model.config) as u64;
    let kv = match &s.kv_cache {
        Some(text) => {
            crate::bytes::parse_bytes(text).map_err(|e| anyhow::anyhow!("kv_cache: {e}"))?
        }
        None => {
            // the problems are not counted yet: as many as sequences
            let need = crate::sampler::job::KvNeed::new(ESTIMATE_PROMPT_TOKENS, s, s.max_num_seqs);
            (need.default_blocks * s.block_size) as u64 * per_token
        }
    };
    Ok(stored * widen + kv)
}

pub fn plan(
    s: &SampleSettings,
    data: &PlannedStage,
    workdir: &Path,
    facts: &super::ModelFacts,
) -> Result<PlannedStage> {
    let model = facts.input.clone();
    let memory_bytes = memory_estimate(s, facts)?;
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
    let mut st = PlannedStage::new("sample", workdir, CODE_VERSION, config, inputs);
    st.estimate = Estimate {
        disk_bytes: 64 << 20,
        memory_bytes,
    };
    Ok(st)
}

pub fn run(s: &SampleSettings, plan: &Plan, stage: &PlannedStage) -> Result<StageOutput> {
    let data = plan.dep(stage, "data")?;
    let problems = read_problems(&data.dir.join(super::data::OUTPUT))?;
    let out = stage.dir.join(OUTPUT);
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
