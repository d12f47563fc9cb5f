//! `pipeline sample`: sample completions for the problems of a file with a local or hub model and
//! write the completions Parquet (graded when the file has gold answers).
//!
//! Parses the flags into a sampling job and prints the end summary; the work is in
//! `jobs::sample`. Knows nothing of stages.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use crate::data::source::{AnswerExtract, FieldMap, Location, SourceFormat, SourceSpec};
use crate::data::{hub, load_source};
use crate::jobs::sample::parts::parts_dir;
use crate::jobs::sample::run::run_settings;
use crate::jobs::sample::settings::SampleSettings;
use crate::jobs::sample::shard::{in_shard, resolve_shard};

#[derive(Debug, clap::Args)]
pub struct SampleArgs {
    /// Problems: JSONL or Parquet (or hf://owner/name/file).
    #[arg(long)]
    pub input: String,
    /// Dataset format of the input: gsm8k, math, aime, amc, or mapped (use the field flags).
    #[arg(long, default_value = "mapped")]
    pub format: String,
    #[arg(long, default_value = "problem")]
    pub problem_field: String,
    /// Gold answers: samples are graded and `--target-correct` can stop a problem early.
    #[arg(long)]
    pub answer_field: Option<String>,
    #[arg(long)]
    pub id_field: Option<String>,
    /// The sampling settings: the same names and defaults as a config's `[sample]` section.
    #[command(flatten)]
    pub settings: SampleSettings,
    /// This process's shard, I/N (also from SLURM_ARRAY_TASK_ID/COUNT or JOB_COMPLETION_INDEX).
    #[arg(long)]
    pub shard: Option<String>,
    /// Shard count with JOB_COMPLETION_INDEX (Kubernetes indexed Jobs).
    #[arg(long)]
    pub num_shards: Option<usize>,
    /// Only the first N problems.
    #[arg(long, value_parser = super::at_least_one::<usize>)]
    pub limit: Option<usize>,
    /// Skip malformed rows of the input (counted and said) instead of stopping at the first.
    #[arg(long)]
    pub skip_bad_rows: bool,
    #[arg(long)]
    pub output: PathBuf,
    /// Discard the samples committed for `--output` by an earlier run (a run with other
    /// settings, problems or model is refused rather than resumed into a mix).
    #[arg(long)]
    pub overwrite: bool,
}

fn source_spec(a: &SampleArgs) -> Result<SourceSpec> {
    let format: SourceFormat = serde_json::from_value(serde_json::Value::String(a.format.clone()))
        .with_context(|| {
            format!(
                "--format {}: use gsm8k, math, aime, amc or mapped",
                a.format
            )
        })?;
    let mut fields = FieldMap::preset(format);
    if format == SourceFormat::Mapped {
        fields.problem = vec![a.problem_field.clone()];
        fields.answer = a.answer_field.clone();
        fields.answer_extract = AnswerExtract::Field;
    }
    if let Some(f) = &a.id_field {
        fields.id = Some(f.clone());
    }
    let name = std::path::Path::new(&a.input)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "input".into());
    Ok(SourceSpec {
        name,
        format,
        location: Location::parse(&a.input, std::path::Path::new("."), None)
            .map_err(|e| anyhow::anyhow!("--input: {e}"))?,
        fields,
        limit: a.limit,
        allow_empty: false,
    })
}

pub fn run(a: &SampleArgs) -> Result<()> {
    let settings = &a.settings;
    if settings.target_correct.is_some() && a.answer_field.is_none() && a.format == "mapped" {
        bail!("--target-correct needs gold answers: give --answer-field");
    }
    settings
        .validate()
        .map_err(|e| anyhow::anyhow!("--{}", e.replacen('_', "-", 3)))?;
    let spec = source_spec(a)?;
    // before the model loads and hours of sampling: the output can be written
    if let crate::data::source::Location::Local(input) = &spec.location {
        crate::store::check_output_file(&a.output, &[input], "--output")?;
    } else {
        crate::store::check_output_file(&a.output, &[], "--output")?;
    }
    let files = hub::resolve(&spec.location)?;
    // Without an answer field a mapped source has no gold: load it with a stand-in, then clear.
    let mut spec_for_load = spec.clone();
    if spec_for_load.fields.answer.is_none() {
        spec_for_load.fields.answer = Some(a.problem_field.clone());
    }
    let bad_rows = crate::data::BadRows {
        skip: a.skip_bad_rows,
        how_to_skip: Some("pass --skip-bad-rows"),
    };
    let (mut problems, rep) = load_source(&spec_for_load, &files, bad_rows)?;
    if rep.bad_rows > 0 {
        tracing::warn!("{}: skipped {} malformed rows", a.input, rep.bad_rows);
    }
    if spec.fields.answer.is_none() {
        for p in &mut problems {
            p.gold_answer.clear();
        }
    }
    let shard = resolve_shard(a.shard.as_deref(), a.num_shards)?;
    let set = crate::jobs::sample::parts::problems_digest(&problems);
    if let Some(shard) = shard {
        problems.retain(|p| in_shard(&p.problem_id, shard));
        tracing::info!("shard {}/{}: {} problems", shard.0, shard.1, problems.len());
    }
    let label = match shard {
        Some((i, n)) => format!("sample {i}/{n}"),
        None => "sample".into(),
    };
    let progress = crate::progress::Target::new(label, None);
    if a.overwrite {
        let parts = parts_dir(&a.output);
        if parts.exists() {
            std::fs::remove_dir_all(&parts)
                .with_context(|| format!("cannot remove {}", parts.display()))?;
            tracing::info!(
                "--overwrite: discarded the samples committed in {}",
                parts.display()
            );
        }
    }
    let s = run_settings(
        settings,
        &problems,
        shard.unwrap_or((0, 1)),
        Some(&set),
        &a.output,
        &progress,
    )?;
    s.print(&a.output);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: SampleArgs,
    }

    /// The flags' defaults are the config's: `pipeline sample` with only the required flags
    /// samples like a `[sample]` section with only `model`.
    #[test]
    fn flag_defaults_are_the_config_defaults() {
        let cli = Cli::try_parse_from(["x", "--input", "p.jsonl", "--model", "m", "--output", "o"])
            .unwrap();
        let config: SampleSettings = toml::from_str("model = \"m\"").unwrap();
        assert_eq!(cli.args.settings, config);
    }
}
