//! `pipeline train`: fine-tunes a checkpoint on an SFT Parquet file and writes the trained model
//! in Hugging Face layout.
//!
//! Settings come from `--config` (a file with a `[train]` table, e.g. a pipeline config, or the
//! bare keys) with every key typed as a flag on top (`--lr 2e-5`, `--compute-dtype bf16`: the
//! `[train]` keys' names and defaults); training state (checkpoints, `metrics.jsonl`) goes to
//! `--state-dir`, by default `OUTPUT/train_state`. Rerunning the same command resumes. Knows
//! nothing of stages; the work is in `train::trainer`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::train::settings::TrainSettings;
use crate::train::trainer::{self, TrainJob};

#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    /// The base model: a checkpoint folder or a hub id.
    #[arg(long)]
    pub model: String,
    /// The SFT rows (`prompt_token_ids`, `completion_token_ids`), as the filter stage writes them.
    #[arg(long)]
    pub data: PathBuf,
    /// A TOML file with the train settings: a `[train]` table, or the keys at the top level.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Where the trained model goes.
    #[arg(long)]
    pub output: PathBuf,
    /// Checkpoints and metrics (default: OUTPUT/train_state).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Stop after this step (1 or more) with a checkpoint; the same command later continues
    /// from it.
    #[arg(long, value_parser = super::at_least_one::<u64>)]
    pub stop_after: Option<u64>,
    /// The `[train]` settings, each one typed set over `--config`'s (the rest keep the file's
    /// values, or the defaults without a file).
    #[command(flatten)]
    pub settings: TrainSettings,
}

/// The `[train]` table of the file at `path`, or the whole file.
fn read_table(path: &Path) -> Result<toml::Table> {
    let text = crate::bytes::read_settings_file(path, "train settings")?;
    let value: toml::Table =
        toml::from_str(&text).with_context(|| format!("{} is not valid TOML", path.display()))?;
    match value.get("train") {
        Some(toml::Value::Table(t)) => Ok(t.clone()),
        Some(_) => anyhow::bail!("{}: `train` is not a table", path.display()),
        None => Ok(value),
    }
}

/// The settings of the file at `path` (or the defaults) with the keys of `flags` over them:
/// an error names the file and key, or the flag.
fn settings(path: Option<&Path>, flags: toml::Table) -> Result<TrainSettings> {
    let mut table = match path {
        Some(p) => read_table(p)?,
        None => toml::Table::new(),
    };
    let file = |e: &str| match path {
        Some(p) => format!("{}: [train]: {e}", p.display()),
        None => e.to_string(),
    };
    let typed: Vec<String> = flags.keys().cloned().collect();
    // a step size typed replaces the file's, whichever of the two keys it uses
    for (k, other) in [
        ("rows_per_step", "tokens_per_step"),
        ("tokens_per_step", "rows_per_step"),
    ] {
        if flags.contains_key(k) && !flags.contains_key(other) {
            table.remove(other);
        }
    }
    table.extend(flags);
    let s: TrainSettings = table.try_into().map_err(|e: toml::de::Error| {
        anyhow::anyhow!(file(&crate::config::plain_message(e.message().trim())))
    })?;
    s.validate().map_err(|e| {
        // the keys it names (its first word is its key's): the flags typed among them, else
        // the file's
        let words: Vec<&str> = e
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .collect();
        let flags: Vec<String> = typed
            .iter()
            .filter(|k| words.contains(&k.as_str()))
            .map(|k| format!("--{}", k.replace('_', "-")))
            .collect();
        match path {
            _ if !flags.is_empty() => anyhow::anyhow!("{}: {e}", flags.join(", ")),
            Some(p) => anyhow::anyhow!("{}: `train.{e}", p.display()),
            None => anyhow::anyhow!("{e}"),
        }
    })?;
    Ok(s)
}

/// The settings flags typed, as a `[train]` table (`--no-decay ""`: an empty list).
fn typed_flags(settings: &TrainSettings, matches: &clap::ArgMatches) -> Result<toml::Table> {
    let mut flags = toml::Table::try_from(settings)?;
    flags.retain(|k, _| super::typed(matches, k));
    if let Some(toml::Value::Array(names)) = flags.get_mut("no_decay") {
        names.retain(|n| n.as_str() != Some(""));
    }
    Ok(flags)
}

/// `matches`: the subcommand's, which say which settings flags the user typed.
pub fn run(a: &TrainArgs, matches: &clap::ArgMatches) -> Result<()> {
    let mut s = settings(a.config.as_deref(), typed_flags(&a.settings, matches)?)?;
    s.model = None;
    let job = TrainJob {
        settings: s,
        model: a.model.clone(),
        data: a.data.clone(),
        output: a.output.clone(),
        state_dir: a
            .state_dir
            .clone()
            .unwrap_or_else(|| a.output.join("train_state")),
        stop_after: a.stop_after,
        progress_file: None,
        tensorboard: None,
    };
    let summary = trainer::run(&job)?;
    summary.print(&job.output);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, FromArgMatches};

    /// `pipeline train` with these arguments after `--model m --data d --output o`: its
    /// settings.
    fn parse(args: &[&str]) -> Result<TrainSettings> {
        let cmd = TrainArgs::augment_args(clap::Command::new("train"));
        let base = ["train", "--model", "m", "--data", "d", "--output", "o"];
        let m = cmd
            .try_get_matches_from(base.iter().chain(args))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let a = TrainArgs::from_arg_matches(&m)?;
        settings(a.config.as_deref(), typed_flags(&a.settings, &m)?)
    }

    #[test]
    fn every_train_key_is_a_flag_with_its_default() {
        let flags: Vec<String> = TrainSettings::augment_args(clap::Command::new("keys"))
            .get_arguments()
            .map(|a| a.get_id().to_string())
            .collect();
        let mut keys: Vec<String> = toml::Table::try_from(TrainSettings::default())
            .unwrap()
            .keys()
            .cloned()
            .collect();
        // (the options without a default, and `model`, which `--model` gives)
        keys.extend(
            [
                "max_steps",
                "rows_per_step",
                "tokens_per_step",
                "peak_tflops",
                "kept_layers",
            ]
            .map(String::from),
        );
        let (mut flags_sorted, mut keys_sorted) = (flags.clone(), keys);
        flags_sorted.sort();
        keys_sorted.sort();
        assert_eq!(flags_sorted, keys_sorted);
        // untyped, every flag is the default
        assert_eq!(parse(&[]).unwrap(), TrainSettings::default());
    }

    #[test]
    fn typed_flags_go_over_the_file_and_the_rest_keep_its_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        std::fs::write(
            &path,
            "[train]\nlr = 3e-5\nepochs = 2\nrecompute = true\nlr_schedule = \"linear\"\n",
        )
        .unwrap();
        let p = path.to_str().unwrap();
        let s = parse(&["--config", p]).unwrap();
        assert_eq!((s.lr, s.epochs, s.recompute), (3e-5, 2, true));
        let s = parse(&[
            "--config",
            p,
            "--lr",
            "1e-4",
            "--packing",
            "false",
            "--betas",
            "0.8,0.9",
            "--compute-dtype",
            "bf16",
            "--no-decay",
            "norm,bias,embed",
            "--max-steps",
            "7",
        ])
        .unwrap();
        assert_eq!((s.lr, s.epochs, s.recompute), (1e-4, 2, true));
        assert_eq!(s.lr_schedule, crate::train::settings::LrSchedule::Linear);
        assert!(!s.packing);
        assert_eq!(s.betas, [0.8, 0.9]);
        assert_eq!(s.compute_dtype, crate::train::settings::ComputeDtype::Bf16);
        assert_eq!(s.no_decay, ["norm", "bias", "embed"]);
        assert_eq!(s.max_steps, Some(7));
        // a bool either way, bare for true; an empty list; a step size replacing the file's
        std::fs::write(&path, "[train]\nrecompute = true\nrows_per_step = 8\n").unwrap();
        let s = parse(&["--config", p, "--recompute", "false", "--no-decay", ""]).unwrap();
        assert!(!s.recompute);
        assert!(s.no_decay.is_empty());
        assert_eq!(s.rows_per_step, Some(8));
        let s = parse(&[
            "--config",
            p,
            "--stochastic-rounding",
            "--tokens-per-step",
            "512",
        ]);
        let s = s.unwrap();
        assert!(s.stochastic_rounding && s.recompute);
        assert_eq!((s.rows_per_step, s.tokens_per_step), (None, Some(512)));
    }

    #[test]
    fn a_bad_setting_names_its_flag_or_its_file() {
        let e = parse(&["--lr=-1"]).unwrap_err().to_string();
        assert!(e.starts_with("--lr: lr must be a positive number"), "{e}");
        let e = parse(&["--max-steps", "0"]).unwrap_err().to_string();
        assert!(e.starts_with("--max-steps: max_steps"), "{e}");
        // a message naming two keys names the flag typed among them
        let e = parse(&["--max-seq-len", "8192"]).unwrap_err().to_string();
        assert!(e.starts_with("--max-seq-len: micro_batch_tokens"), "{e}");
        let e = parse(&["--betas", "0.9"]).unwrap_err().to_string();
        assert!(e.contains("--betas") && e.contains("B1,B2"), "{e}");
        let e = parse(&["--compute-dtype", "f16"]).unwrap_err().to_string();
        assert!(e.contains("--compute-dtype") && e.contains("bf16"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        std::fs::write(&path, "[train]\nepochs = 0\n").unwrap();
        let e = parse(&["--config", path.to_str().unwrap(), "--lr", "1e-4"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("t.toml") && e.contains("epochs"), "{e}");
        std::fs::write(&path, "[train]\nlr_schedule = \"cosin\"\n").unwrap();
        let e = parse(&["--config", path.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("t.toml") && e.contains("cosin"), "{e}");
    }
}
