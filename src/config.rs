//! Pipeline configs: TOML in `pipelines/` becomes a validated [`Config`] in one place, before any
//! work starts.
//!
//! Raw structs mirror the TOML and reject unknown keys; [`Config::from_toml`] turns them into plain
//! validated values (paths resolved against the config file's folder, sizes parsed, enums checked).
//! An error names the file, the line and the key, and for a misspelled key the closest valid one.
//! This module knows nothing about running stages or the work dir's contents.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::bytes::parse_bytes;
use crate::data::source::{resolve, source_from_toml, Location, RawSource, SourceSpec};
use crate::eval::EvalConfig;
use crate::jobs::sample::rationalize::Rationalize;
use crate::jobs::sample::settings::KeyError;
use crate::jobs::sample::settings::SampleSettings;
use crate::names::closest;
use crate::train::settings::TrainSettings;

pub use toml_errors::plain_message;
use toml_errors::*;
use validate::*;

/// A config error, already phrased for a person: it names the file and, where known, line and key.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

// ---------------------------------------------------------------------------------------------
// Raw TOML
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    run: RawRun,
    data: Option<RawData>,
    pretrain: Option<RawPretrain>,
    // [sample] and [eval] are read from tables (see `read_section`)
    sample: Option<toml::Table>,
    filter: Option<RawFilter>,
    train: Option<TrainSettings>,
    eval: Option<toml::Table>,
    mix: Option<RawMix>,
    rationalize: Option<Rationalize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMix {
    #[serde(default)]
    accumulate: bool,
    #[serde(default)]
    seed: u64,
    #[serde(default)]
    sources: Vec<toml::Table>,
}

/// Which model each round's train stage starts from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrainFrom {
    /// The model the round before trained (expert iteration, STaR).
    #[default]
    Previous,
    /// The `[train]` model, every round (ReST-EM).
    Base,
}

/// `[mix]`: what each round trains on besides its own kept rows.
#[derive(Debug, Clone, Serialize)]
pub struct MixConfig {
    /// Earlier rounds' kept rows join each round's.
    pub accumulate: bool,
    /// Seeds the draw of source rows.
    pub seed: u64,
    pub sources: Vec<MixSource>,
}

/// A source of worked solutions mixed into every round's training rows.
#[derive(Debug, Clone, Serialize)]
pub struct MixSource {
    pub source: SourceSpec,
    /// Rows drawn per round: this share of the round's own (and accumulated) rows.
    pub share: f64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRun {
    name: Option<String>,
    workdir: Option<String>,
    disk_budget: Option<String>,
    rounds: Option<u32>,
    gpu_hour_price: Option<GpuPrice>,
    #[serde(default)]
    train_from: TrainFrom,
    resample_below: Option<f64>,
}

/// `run.gpu_hour_price`: one price for every GPU, or a price per GPU kind
/// (`{ h100 = 2.5, h200 = 3.6, b200 = 6.0 }`, the names of `--gpu`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GpuPrice {
    Flat(f64),
    ByKind(std::collections::BTreeMap<String, f64>),
}

impl GpuPrice {
    /// The price of an hour of `gpu` (a name of `train::memory::GPUS`, e.g. `h100`); `None`
    /// when the table has no price for it.
    pub fn for_gpu(&self, gpu: &str) -> Option<f64> {
        match self {
            GpuPrice::Flat(p) => Some(*p),
            GpuPrice::ByKind(t) => t.get(gpu).copied(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPretrain {
    source: toml::Value,
    #[serde(default = "raw_template")]
    prompt_template: String,
    model: crate::pretrain::ModelShape,
    #[serde(default)]
    seed: u64,
    train: TrainSettings,
}

fn raw_template() -> String {
    "raw".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawData {
    sources: Vec<RawSource>,
    #[serde(default)]
    skip_bad_rows: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFilter {
    completions: Option<RawCompletions>,
    max_per_problem: Option<usize>,
    #[serde(default)]
    dedup: Dedup,
    min_completion_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    min_completion_chars: Option<u64>,
    max_completion_chars: Option<u64>,
    #[serde(default)]
    last_number_fallback: bool,
    #[serde(default)]
    thinking: bool,
    chunk_rows: Option<usize>,
    #[serde(default = "yes")]
    decontaminate: bool,
    decontaminate_ngram: Option<usize>,
    #[serde(default)]
    decontaminate_against: Vec<String>,
    keep_pass_rate: Option<Vec<f64>>,
    #[serde(default = "yes")]
    check_arithmetic: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCompletions {
    path: String,
    #[serde(default = "default_completions_format")]
    format: CompletionsFormat,
    /// For dataset formats: which field holds the completion text.
    completion_field: Option<String>,
    /// For dataset formats: the data source whose problem ids these rows carry.
    source: Option<String>,
}

fn default_completions_format() -> CompletionsFormat {
    CompletionsFormat::Completions
}

// ---------------------------------------------------------------------------------------------
// Validated config
// ---------------------------------------------------------------------------------------------

/// How the filter treats duplicate completions of one problem.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dedup {
    /// Keep every copy.
    None,
    /// Drop byte-identical copies.
    Exact,
    /// Drop copies equal after collapsing whitespace and normalising numbers (the default).
    #[default]
    Normalized,
}

/// The layout of a completions file the filter reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompletionsFormat {
    /// Our completions Parquet schema (what the sampler writes).
    Completions,
    /// A dataset file whose solutions are graded as completions (reference solutions, audits).
    Gsm8k,
    Math,
    Aime,
    Amc,
}

#[derive(Debug, Clone, Serialize)]
pub struct CompletionsSpec {
    pub location: Location,
    pub format: CompletionsFormat,
    pub completion_field: Option<String>,
    /// For dataset formats: the data source (by name) whose field map gives the problem ids.
    pub source: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DataConfig {
    pub sources: Vec<SourceSpec>,
    pub skip_bad_rows: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct FilterConfig {
    pub completions: Option<CompletionsSpec>,
    pub max_per_problem: Option<usize>,
    pub dedup: Dedup,
    pub min_completion_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub min_completion_chars: Option<u64>,
    pub max_completion_chars: Option<u64>,
    pub last_number_fallback: bool,
    pub thinking: bool,
    pub chunk_rows: usize,
    /// Drop the training problems that match a problem of an eval set of the config or of
    /// `decontaminate_against` (see `data::decontaminate`).
    pub decontaminate: bool,
    /// Words per n-gram.
    pub decontaminate_ngram: usize,
    /// Eval set names, groups, definitions or data files, as written.
    pub decontaminate_against: Vec<String>,
    /// `decontaminate_against`, resolved (their content is a stage input, not their form).
    #[serde(skip)]
    pub against: Vec<crate::eval::against::Against>,
    /// Keep only problems whose pass rate (correct samples over graded samples) lies in
    /// `[min, max]`; left out of the key when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_pass_rate: Option<(f64, f64)>,
    /// Drop correct completions that state a false numeric equality on the way
    /// ([`crate::verify::steps`]: `33 + 8 = 91`); on by default.
    pub check_arithmetic: bool,
}

/// The model name that stands for the pretrain stage's model in `[sample]`, `[train]` and
/// `[eval]` (set when those sections name no model and the config has a `[pretrain]`).
pub const PRETRAINED: &str = "@pretrain";

/// A validated pipeline config.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it came from: a file path, or `<embedded default>`.
    pub origin: String,
    pub name: String,
    pub workdir: PathBuf,
    pub disk_budget_bytes: Option<u64>,
    /// Times sample -> filter -> train repeats, each round from the last round's model.
    pub rounds: u32,
    /// What one GPU-hour costs (`run.gpu_hour_price`, in the user's currency), for every GPU or
    /// per GPU kind: preflight and the report turn GPU hours into cost with it.
    pub gpu_hour_price: Option<GpuPrice>,
    pub data: Option<DataConfig>,
    pub pretrain: Option<crate::pretrain::PretrainConfig>,
    pub sample: Option<SampleSettings>,
    pub filter: Option<FilterConfig>,
    /// `model` is always set (from `[sample].model` when the section leaves it out).
    pub train: Option<TrainSettings>,
    pub eval: Option<EvalPlan>,
    /// The `--set KEY=VALUE` overrides applied over the file, as typed ([`overrides`]).
    pub overrides: Vec<String>,
    /// Where each round's training starts (`run.train_from`).
    pub train_from: TrainFrom,
    /// Rounds after the first sample only the problems the round before solved in less than
    /// this share of their samples (`run.resample_below`).
    pub resample_below: Option<f64>,
    pub mix: Option<MixConfig>,
    /// STaR's rationalization: the problems no sample solved are sampled again with the answer
    /// as a hint (`[rationalize]`).
    pub rationalize: Option<Rationalize>,
}

/// The `[eval]` section with its base model and sets resolved.
#[derive(Debug, Clone)]
pub struct EvalPlan {
    pub settings: EvalConfig,
    pub base_model: String,
    pub sets: Vec<crate::eval::EvalSet>,
}

pub const DEFAULT_CHUNK_ROWS: usize = 4096;

/// The embedded default pipeline: `pipelines/tiny-arith.toml`, compiled in.
pub const EMBEDDED_DEFAULT: &str = include_str!("../pipelines/tiny-arith.toml");

impl Config {
    /// The embedded default (a tiny model pretrained and self-distilled on generated arithmetic).
    /// Its relative paths (data/arith/, evals/) resolve against `pipelines/` of the current
    /// folder when it is this repository, else against the repository the binary was built from.
    pub fn embedded_default() -> Result<Config, ConfigError> {
        let (text, origin, base, name) = Config::embedded_source()?;
        Config::from_toml(text, origin, &base, name)
    }

    /// The embedded default's text, origin, base folder and default name.
    pub fn embedded_source(
    ) -> Result<(&'static str, &'static str, PathBuf, &'static str), ConfigError> {
        let here = Path::new("pipelines");
        let base = if here.join("tiny-arith.toml").is_file() {
            here.to_path_buf()
        } else {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines")
        };
        if !base.join("../data/arith/spec.toml").is_file() {
            return Err(ConfigError(format!(
                "the embedded default reads data/arith/ and evals/ of the repository; neither \
                 ./pipelines nor {} has them: run from the repository or pass --config",
                base.display()
            )));
        }
        Ok((
            EMBEDDED_DEFAULT,
            "<embedded default: pipelines/tiny-arith.toml>",
            base,
            "tiny-arith",
        ))
    }

    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let (text, origin, base, stem) = Config::file_source(path)?;
        Config::from_toml(&text, &origin, &base, &stem)
    }

    /// A config file's text, origin, base folder and default name (its stem).
    pub fn file_source(path: &Path) -> Result<(String, String, PathBuf, String), ConfigError> {
        let text = crate::bytes::read_settings_file(path, "config")
            .map_err(|e| ConfigError(format!("{e:#}")))?;
        let base = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "run".into());
        Ok((text, path.display().to_string(), base, stem))
    }

    /// Parses `text` (named `origin` in errors); relative paths resolve against `base`.
    pub fn from_toml(
        text: &str,
        origin: &str,
        base: &Path,
        default_name: &str,
    ) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| toml_error(text, origin, &e))?;
        let run = validate_run(raw.run, base, origin, default_name)?;
        let data = raw
            .data
            .map(|d| validate_data(d, base, origin))
            .transpose()?;
        let has_pretrain = raw.pretrain.is_some();
        let sample = raw
            .sample
            .map(|t| read_section(text, origin, "sample", &t, SampleSettings::from_table))
            .transpose()?
            .map(|s| validate_sample(s, base, origin, has_pretrain))
            .transpose()?;
        let filter = raw
            .filter
            .map(|f| validate_filter(f, base, origin, sample.is_some()))
            .transpose()?;
        needs_data(data.is_some(), sample.is_some(), filter.is_some(), origin)?;
        if let (Some(f), Some(d)) = (&filter, &data) {
            check_completions_source(f, d, origin)?;
        }
        let train = raw
            .train
            .map(|t| {
                validate_train(
                    t,
                    base,
                    origin,
                    sample.as_ref(),
                    filter.is_some(),
                    has_pretrain,
                )
            })
            .transpose()?;
        check_rounds(&run, sample.is_some(), train.is_some(), origin)?;
        let eval = raw
            .eval
            .map(|t| read_section(text, origin, "eval", &t, EvalConfig::from_table))
            .transpose()?
            .map(|e| {
                validate_eval(
                    e,
                    base,
                    origin,
                    train.as_ref(),
                    sample.as_ref(),
                    has_pretrain,
                )
            })
            .transpose()?;
        check_round_keys(&run, sample.is_some(), origin)?;
        let mix = raw
            .mix
            .map(|m| validate_mix(m, base, origin, train.is_some(), run.rounds))
            .transpose()?;
        if let Some(r) = &raw.rationalize {
            check_rationalize(r, sample.is_some(), origin)?;
        }
        let pretrain = match raw.pretrain {
            Some(p) => Some(validate_pretrain(
                p,
                base,
                origin,
                data.as_ref(),
                sample.as_ref(),
                eval.as_ref(),
                mix.as_ref(),
            )?),
            None => None,
        };
        Ok(Config {
            origin: origin.to_string(),
            name: run.name,
            workdir: run.workdir,
            disk_budget_bytes: run.disk_budget_bytes,
            rounds: run.rounds,
            gpu_hour_price: run.gpu_hour_price,
            data,
            pretrain,
            sample,
            filter,
            train,
            eval,
            overrides: Vec::new(),
            train_from: run.train_from,
            resample_below: run.resample_below,
            mix,
            rationalize: raw.rationalize,
        })
    }
}

/// The sample and filter stages read the data stage's problems.
fn needs_data(data: bool, sample: bool, filter: bool, origin: &str) -> Result<(), ConfigError> {
    let err = |key: &str, msg: &str| Err(ConfigError(format!("{origin}: `{key}`: {msg}")));
    if sample && !data {
        return err(
            "sample",
            "the sampler samples the problems of the data stage: add a [data] section",
        );
    }
    if filter && !data {
        return err(
            "filter",
            "the filter grades against the problems' gold answers: add a [data] section",
        );
    }
    Ok(())
}

/// `run.rounds` against the stages that rounds repeat.
fn check_rounds(
    run: &validate::Run,
    sample: bool,
    train: bool,
    origin: &str,
) -> Result<(), ConfigError> {
    let err = |key: &str, msg: String| ConfigError(format!("{origin}: `{key}`: {msg}"));
    if run.rounds > 1 && (!sample || !train) {
        return Err(err(
            "run.rounds",
            format!(
                "{} rounds repeat sample -> filter -> train: add [sample] and [train]",
                run.rounds
            ),
        ));
    }
    Ok(())
}

/// `run.train_from` and `run.resample_below`, which act from round 2 on.
fn check_round_keys(run: &validate::Run, sample: bool, origin: &str) -> Result<(), ConfigError> {
    let err = |key: &str, msg: String| ConfigError(format!("{origin}: `{key}`: {msg}"));
    if run.train_from == TrainFrom::Base && run.rounds < 2 {
        return Err(err(
            "run.train_from",
            "\"base\" differs from \"previous\" only from round 2 on: set run.rounds = 2 \
             or more, or remove the key"
                .into(),
        ));
    }
    if let Some(r) = run.resample_below {
        if !(r > 0.0 && r <= 1.0) {
            return Err(err(
                "run.resample_below",
                format!(
                    "must be in (0, 1]: a round samples the problems the round before \
                     solved in less than this share of their samples; got {r}"
                ),
            ));
        }
        if run.rounds < 2 || !sample {
            return Err(err(
                "run.resample_below",
                "acts from round 2 on: set run.rounds = 2 or more, with [sample]".into(),
            ));
        }
    }
    Ok(())
}

/// `[rationalize]` resamples what the sample stage left unsolved.
fn check_rationalize(r: &Rationalize, sample: bool, origin: &str) -> Result<(), ConfigError> {
    if !sample {
        return Err(ConfigError(format!(
            "{origin}: `rationalize`: samples the problems the sample stage left unsolved again, \
             with a hint: add a [sample] section"
        )));
    }
    r.validate()
        .map_err(|e| ConfigError(format!("{origin}: `rationalize.{e}")))
}

/// The most `run.rounds` a config may ask for: a bound, so that a typo of a huge count is an error
/// instead of a plan that grows without end.
pub const MAX_ROUNDS: u32 = 100;

pub mod overrides;
#[cfg(test)]
mod tests;
mod toml_errors;
mod validate;
