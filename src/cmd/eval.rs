//! `pipeline eval`: evaluate one or more models on eval sets (`evals/*.toml`) with the same
//! seeds, and print and write the metrics (see `eval`). Parses flags; the work is in `eval`.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::eval::{self, EvalConfig};
use crate::jobs::sample::settings::SampleOverrides;
use crate::sampler::params::SamplingParams;

#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// A checkpoint folder or a hub id (repeatable; the first is the baseline of the deltas).
    #[arg(long = "model", required = true)]
    pub models: Vec<String>,
    /// Eval sets, comma-separated: names of `evals/<name>.toml`, paths of definition files, or
    /// the groups `math-core` (gsm8k_test, math500, amc23, minerva_math) and `math-hard`
    /// (aime24, aime25, hmmt_feb25, olympiadbench).
    #[arg(long, value_delimiter = ',', required = true)]
    pub sets: Vec<String>,
    /// Only the first N problems of each set.
    #[arg(long, value_parser = super::at_least_one::<usize>)]
    pub limit: Option<usize>,
    /// The sampling parameters: each one given here is set over every set's own (the rest
    /// keep the set's values, not these defaults).
    #[command(flatten)]
    pub params: SamplingParams,
    /// Chat template's `enable_thinking` (Qwen3), over the sets' own.
    #[arg(long)]
    pub enable_thinking: Option<bool>,
    /// `cpu`, or `cuda` / `cuda:N` (default: the set's, cpu).
    #[arg(long)]
    pub device: Option<crate::device::DeviceSpec>,
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    /// `selfdistill` (ours) or `mistralrs` (a binary built with `--features mistralrs`).
    #[arg(long, value_enum)]
    pub engine: Option<crate::jobs::sample::settings::LogitsEngine>,
    #[arg(long)]
    pub output: PathBuf,
}

/// `matches`: the subcommand's, which say which sampling flags the user typed.
pub fn run(a: &EvalArgs, matches: &clap::ArgMatches) -> Result<()> {
    let mut t = toml::Table::try_from(&a.params)?;
    t.retain(|k, _| super::typed(matches, k));
    let mut job = |key: &str, v: Option<toml::Value>| {
        if let Some(v) = v {
            t.insert(key.into(), v);
        }
    };
    job("enable_thinking", a.enable_thinking.map(Into::into));
    job("device", a.device.map(|d| d.to_string().into()));
    job("max_num_seqs", a.max_num_seqs.map(|n| (n as i64).into()));
    job("engine", a.engine.map(|e| e.as_str().into()));
    let cfg = EvalConfig {
        sets: a.sets.clone(),
        model: None,
        limit: a.limit,
        overrides: SampleOverrides::new(t).map_err(|e| anyhow::anyhow!("--{e}"))?,
    };
    let sets = cfg.load_sets(Path::new("."))?;
    eval::evaluate(&a.models, &sets, &cfg, &a.output, None)?;
    let examples = eval::write_examples(&a.models, &sets, &a.output)?;
    crate::outln!(
        "wrote {} (what the models wrote: {})",
        a.output.display(),
        examples.display()
    );
    Ok(())
}
