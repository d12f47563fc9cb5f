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
        let err = |key: &str, msg: String| ConfigError(format!("{origin}: `{key}`: {msg}"));
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
        if sample.is_some() && data.is_none() {
            return Err(err(
                "sample",
                "the sampler samples the problems of the data stage: add a [data] section".into(),
            ));
        }
        if filter.is_some() && data.is_none() {
            return Err(err(
                "filter",
                "the filter grades against the problems' gold answers: add a [data] section".into(),
            ));
        }
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
        if run.rounds > 1 && (sample.is_none() || train.is_none()) {
            return Err(err(
                "run.rounds",
                format!(
                    "{} rounds repeat sample -> filter -> train: add [sample] and [train]",
                    run.rounds
                ),
            ));
        }
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
            if run.rounds < 2 || sample.is_none() {
                return Err(err(
                    "run.resample_below",
                    "acts from round 2 on: set run.rounds = 2 or more, with [sample]".into(),
                ));
            }
        }
        let mix = raw
            .mix
            .map(|m| validate_mix(m, base, origin, train.is_some(), run.rounds))
            .transpose()?;
        if let Some(r) = &raw.rationalize {
            if sample.is_none() {
                return Err(ConfigError(format!(
                    "{origin}: `rationalize`: samples the problems the sample stage left \
                     unsolved again, with a hint: add a [sample] section"
                )));
            }
            r.validate()
                .map_err(|e| ConfigError(format!("{origin}: `rationalize.{e}")))?;
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

/// The most `run.rounds` a config may ask for: a bound, so that a typo of a huge count is an error
/// instead of a plan that grows without end.
pub const MAX_ROUNDS: u32 = 100;

/// The `[run]` section, validated.
struct Run {
    name: String,
    workdir: PathBuf,
    disk_budget_bytes: Option<u64>,
    rounds: u32,
    gpu_hour_price: Option<GpuPrice>,
    train_from: TrainFrom,
    resample_below: Option<f64>,
}

/// `[run]`: the name (default `default_name`), the work dir (default `runs/<name>`), the disk
/// budget and the number of rounds.
fn validate_run(
    raw: RawRun,
    base: &Path,
    origin: &str,
    default_name: &str,
) -> Result<Run, ConfigError> {
    let err = |key: &str, msg: String| ConfigError(format!("{origin}: `{key}`: {msg}"));
    let name = raw.name.unwrap_or_else(|| default_name.to_string());
    if name.is_empty() || name.contains(['/', '\\']) {
        return Err(err(
            "run.name",
            "must be a non-empty name without slashes".into(),
        ));
    }
    let workdir = match raw.workdir {
        Some(w) => resolve(base, &w),
        None => PathBuf::from("runs").join(&name),
    };
    let disk_budget_bytes = match raw.disk_budget {
        Some(s) => Some(parse_bytes(&s).map_err(|e| err("run.disk_budget", e.to_string()))?),
        None => None,
    };
    let rounds = raw.rounds.unwrap_or(1);
    if rounds == 0 {
        return Err(err("run.rounds", "must be at least 1".into()));
    }
    if rounds > MAX_ROUNDS {
        return Err(err(
            "run.rounds",
            format!(
                "{rounds} rounds: at most {MAX_ROUNDS} (each round samples, filters and trains \
                 a whole model; published recipes stop within a handful)"
            ),
        ));
    }
    let prices: Vec<(String, f64)> = match &raw.gpu_hour_price {
        None => Vec::new(),
        Some(GpuPrice::Flat(p)) => vec![("run.gpu_hour_price".into(), *p)],
        Some(GpuPrice::ByKind(t)) => {
            let known: Vec<String> = crate::train::memory::GPUS
                .iter()
                .map(|(k, _)| k.to_string())
                .collect();
            for k in t.keys() {
                if !known.contains(k) {
                    let hint = crate::names::closest(k, &known)
                        .map(|c| format!("did you mean `{c}`? "))
                        .unwrap_or_default();
                    return Err(err(
                        &format!("run.gpu_hour_price.{k}"),
                        format!("not a GPU kind ({hint}known: {})", known.join(", ")),
                    ));
                }
            }
            t.iter()
                .map(|(k, p)| (format!("run.gpu_hour_price.{k}"), *p))
                .collect()
        }
    };
    for (key, p) in prices {
        if !p.is_finite() || p < 0.0 {
            return Err(err(
                &key,
                format!("must be a price of one GPU-hour, 0 or more, got {p}"),
            ));
        }
    }
    Ok(Run {
        name,
        workdir,
        disk_budget_bytes,
        rounds,
        gpu_hour_price: raw.gpu_hour_price,
        train_from: raw.train_from,
        resample_below: raw.resample_below,
    })
}

/// The sets must load and their settings validate with the overrides; the base model defaults
/// to the trainer's, then the sampler's.
fn validate_eval(
    e: EvalConfig,
    base: &Path,
    origin: &str,
    train: Option<&TrainSettings>,
    sample: Option<&SampleSettings>,
    has_pretrain: bool,
) -> Result<EvalPlan, ConfigError> {
    let err = |key: &str, msg: String| ConfigError(format!("{origin}: `eval.{key}`: {msg}"));
    if e.sets.is_empty() {
        return Err(err("sets", "is empty: name at least one eval set".into()));
    }
    let model = match (&e.model, train.and_then(|t| t.model.clone()), sample) {
        (Some(m), _, _) => {
            let local = base.join(m);
            if local.exists() {
                local.display().to_string()
            } else {
                m.clone()
            }
        }
        (None, Some(m), _) => m,
        (None, None, Some(s)) => s.model.clone(),
        (None, None, None) if has_pretrain => PRETRAINED.to_string(),
        (None, None, None) => {
            return Err(err(
                "model",
                "missing (no [train] or [sample] section to take it from)".into(),
            ))
        }
    };
    let sets = e
        .load_sets(base)
        .map_err(|x| err("sets", format!("{x:#}")))?;
    for s in &sets {
        e.settings(s, &model)
            .map_err(|x| err("sets", format!("{x:#}")))?;
    }
    Ok(EvalPlan {
        settings: e,
        base_model: model,
        sets,
    })
}

/// Range checks; the base model defaults to the sampler's, and a local folder resolves against
/// the config's folder.
fn validate_train(
    mut t: TrainSettings,
    base: &Path,
    origin: &str,
    sample: Option<&SampleSettings>,
    has_filter: bool,
    has_pretrain: bool,
) -> Result<TrainSettings, ConfigError> {
    t.validate()
        .map_err(|e| ConfigError(format!("{origin}: `train.{e}")))?;
    if !has_filter {
        return Err(ConfigError(format!(
            "{origin}: `train`: the trainer learns from the filter stage's SFT rows: add a \
             [filter] section"
        )));
    }
    let model = match (t.model.take(), sample) {
        (Some(_), _) if has_pretrain => {
            return Err(ConfigError(format!(
                "{origin}: `train.model`: with [pretrain], the trainer starts from the pretrained \
                 model: remove the key"
            )))
        }
        (Some(m), _) => m,
        (None, Some(s)) => s.model.clone(),
        (None, None) if has_pretrain => PRETRAINED.to_string(),
        (None, None) => {
            return Err(ConfigError(format!(
                "{origin}: `train.model`: missing (no [sample] section to take it from)"
            )))
        }
    };
    let local = base.join(&model);
    t.model = Some(if local.exists() {
        local.display().to_string()
    } else {
        model
    });
    Ok(t)
}

/// The pretraining source must have solutions; the prompt template must be the sampler's and
/// every eval set's (the model learns one prompt format); the tokenizer covers the data stage's
/// and the eval sets' sources.
fn validate_pretrain(
    p: RawPretrain,
    base: &Path,
    origin: &str,
    data: Option<&DataConfig>,
    sample: Option<&SampleSettings>,
    eval: Option<&EvalPlan>,
    mix: Option<&MixConfig>,
) -> Result<crate::pretrain::PretrainConfig, ConfigError> {
    let err = |key: &str, msg: String| ConfigError(format!("{origin}: `pretrain.{key}`: {msg}"));
    let source =
        source_from_toml(p.source, "pretrain.source", base, origin).map_err(ConfigError)?;
    if source.fields.solution.is_none() {
        return Err(err(
            "source",
            "the rows learned from need worked solutions: set solution_field".into(),
        ));
    }
    p.model
        .validate("pretrain.model")
        .map_err(|e| ConfigError(format!("{origin}: `{e}`")))?;
    let mut train = p.train;
    if train.model.is_some() {
        return Err(err(
            "train.model",
            "the pretrain stage trains its own initial checkpoint: remove the key".into(),
        ));
    }
    train
        .validate()
        .map_err(|e| ConfigError(format!("{origin}: `pretrain.train.{e}")))?;
    train.model = None;
    let prompt_template = match p.prompt_template.as_str() {
        "raw" => "raw".to_string(),
        "chat" => {
            return Err(err(
                "prompt_template",
                "a model built from scratch has no chat template: use raw or a Jinja file".into(),
            ))
        }
        f => {
            let path = resolve(base, f);
            if !path.is_file() {
                return Err(err(
                    "prompt_template",
                    format!("`{f}` is not raw or an existing file"),
                ));
            }
            path.display().to_string()
        }
    };
    if let Some(s) = sample {
        if s.prompt_template != prompt_template {
            return Err(ConfigError(format!(
                "{origin}: `sample.prompt_template` = `{}` differs from `pretrain.prompt_template` \
                 = `{prompt_template}`: the model only knows the format it was pretrained on",
                s.prompt_template
            )));
        }
    }
    let mut tokenizer_sources: Vec<SourceSpec> =
        data.map(|d| d.sources.clone()).unwrap_or_default();
    if let Some(e) = eval {
        for set in &e.sets {
            let st = set
                .settings(PRETRAINED)
                .map_err(|x| err("prompt_template", format!("{x:#}")))?;
            let theirs = match st.prompt_template.as_str() {
                "raw" | "chat" => st.prompt_template.clone(),
                f => resolve(set.file.parent().unwrap_or(Path::new(".")), f)
                    .display()
                    .to_string(),
            };
            if theirs != prompt_template {
                return Err(err(
                    "prompt_template",
                    format!(
                        "`{prompt_template}`, but eval set `{}` ({}) prompts with `{theirs}`: the \
                         model only knows the format it was pretrained on",
                        set.name,
                        set.file.display()
                    ),
                ));
            }
            let mut src = set.source.clone();
            src.name = format!("eval-{}", set.name);
            tokenizer_sources.push(src);
        }
    }
    // rows mixed into training must tokenize too (the pretraining source already does)
    for m in mix.map(|m| m.sources.as_slice()).unwrap_or_default() {
        if m.source.location != source.location {
            let mut src = m.source.clone();
            src.name = format!("mix-{}", m.source.name);
            tokenizer_sources.push(src);
        }
    }
    Ok(crate::pretrain::PretrainConfig {
        source,
        tokenizer_sources,
        prompt_template,
        model: p.model,
        seed: p.seed,
        train,
    })
}

/// `[mix]`: sources of worked solutions with shares in [0, 1]; `accumulate` needs rounds to
/// accumulate over; the section needs a train stage to feed.
fn validate_mix(
    m: RawMix,
    base: &Path,
    origin: &str,
    has_train: bool,
    rounds: u32,
) -> Result<MixConfig, ConfigError> {
    let err = |key: &str, msg: String| ConfigError(format!("{origin}: `mix.{key}`: {msg}"));
    if !has_train {
        return Err(ConfigError(format!(
            "{origin}: `mix`: mixes rows into training: add a [train] section"
        )));
    }
    if m.accumulate && rounds < 2 {
        return Err(err(
            "accumulate",
            "keeps earlier rounds' rows, but run.rounds is 1: set run.rounds = 2 or more".into(),
        ));
    }
    if !m.accumulate && m.sources.is_empty() {
        return Err(ConfigError(format!(
            "{origin}: `mix`: mixes nothing: set accumulate = true or add [[mix.sources]]"
        )));
    }
    let mut sources: Vec<MixSource> = Vec::new();
    for (i, mut t) in m.sources.into_iter().enumerate() {
        let key = format!("sources.{i}");
        let share = match t.remove("share") {
            Some(toml::Value::Float(f)) => f,
            Some(toml::Value::Integer(n)) => n as f64,
            Some(v) => return Err(err(&format!("{key}.share"), format!("a number, got {v}"))),
            None => {
                return Err(err(
                    &format!("{key}.share"),
                    "missing: the share of the round's rows drawn from this source".into(),
                ))
            }
        };
        if !(0.0..=1.0).contains(&share) || !share.is_finite() {
            return Err(err(
                &format!("{key}.share"),
                format!("must be in [0, 1], got {share}"),
            ));
        }
        let source = source_from_toml(toml::Value::Table(t), &format!("mix.{key}"), base, origin)
            .map_err(ConfigError)?;
        if source.fields.solution.is_none() {
            return Err(err(
                &key,
                "the rows mixed in need worked solutions: set solution_field".into(),
            ));
        }
        if sources.iter().any(|s| s.source.name == source.name) {
            return Err(err(
                &format!("{key}.name"),
                format!("`{}` is named twice", source.name),
            ));
        }
        sources.push(MixSource { source, share });
    }
    Ok(MixConfig {
        accumulate: m.accumulate,
        seed: m.seed,
        sources,
    })
}

fn validate_data(d: RawData, base: &Path, origin: &str) -> Result<DataConfig, ConfigError> {
    if d.sources.is_empty() {
        return Err(ConfigError(format!(
            "{origin}: `data.sources` is empty: add at least one [[data.sources]]"
        )));
    }
    let mut sources: Vec<SourceSpec> = Vec::new();
    for (i, s) in d.sources.into_iter().enumerate() {
        let key = format!("data.sources[{i}] ({})", s.name);
        if sources.iter().any(|o| o.name == s.name) {
            return Err(ConfigError(format!(
                "{origin}: `{key}.name`: two sources are named `{}`",
                s.name
            )));
        }
        sources.push(s.validate(&key, base, origin).map_err(ConfigError)?);
    }
    Ok(DataConfig {
        sources,
        skip_bad_rows: d.skip_bad_rows,
    })
}

/// A source section (`[[data.sources]]`, or an eval set's `[source]`) as a resolved spec; `key`
/// names it in errors.
/// Range checks, and local paths (model folder, prompt template file) made relative to the
/// config's folder when they exist there.
fn validate_sample(
    mut s: SampleSettings,
    base: &Path,
    origin: &str,
    has_pretrain: bool,
) -> Result<SampleSettings, ConfigError> {
    match (s.model.is_empty(), has_pretrain) {
        (true, true) => s.model = PRETRAINED.to_string(),
        (true, false) => {
            return Err(ConfigError(format!(
                "{origin}: `sample.model`: missing (a checkpoint folder or a hub id)"
            )))
        }
        (false, true) => {
            return Err(ConfigError(format!(
                "{origin}: `sample.model`: with [pretrain], the sampler uses the pretrained \
                 model: remove the key"
            )))
        }
        (false, false) => {}
    }
    s.validate()
        .map_err(|e| ConfigError(format!("{origin}: `sample.{e}")))?;
    let local = base.join(&s.model);
    if local.exists() {
        s.model = local.display().to_string();
    }
    if !matches!(s.prompt_template.as_str(), "chat" | "raw") {
        let p = resolve(base, &s.prompt_template);
        if !p.exists() {
            return Err(ConfigError(format!(
                "{origin}: `sample.prompt_template`: `{}` is not chat, raw or an existing file",
                s.prompt_template
            )));
        }
        s.prompt_template = p.display().to_string();
        crate::jobs::sample::prompt::PromptTemplate::from_settings(&s)
            .map_err(|e| ConfigError(format!("{origin}: {e:#}")))?;
    }
    Ok(s)
}

fn validate_filter(
    f: RawFilter,
    base: &Path,
    origin: &str,
    has_sample: bool,
) -> Result<FilterConfig, ConfigError> {
    let err = |key: &str, msg: &str| ConfigError(format!("{origin}: `filter.{key}`: {msg}"));
    let completions = match f.completions {
        None if has_sample => None,
        None => {
            return Err(err(
                "completions",
                "missing: the filter reads the sample stage's completions, or a file \
                 ([filter.completions] path = ...); add one of them",
            ))
        }
        Some(c) => {
            let location = Location::parse(&c.path, base, None)
                .map_err(|e| err("completions.path", &e.to_string()))?;
            if c.format != CompletionsFormat::Completions && c.completion_field.is_none() {
                return Err(err(
                    "completions.completion_field",
                    "a dataset-format completions file needs the field that holds the text \
                     (e.g. \"solution\")",
                ));
            }
            Some(CompletionsSpec {
                location,
                format: c.format,
                completion_field: c.completion_field,
                source: c.source,
            })
        }
    };
    if f.max_per_problem == Some(0) {
        return Err(err(
            "max_per_problem",
            "0 would drop everything; omit the key to keep all",
        ));
    }
    for (lo, hi, name) in [
        (
            f.min_completion_tokens,
            f.max_completion_tokens,
            "min_completion_tokens",
        ),
        (
            f.min_completion_chars,
            f.max_completion_chars,
            "min_completion_chars",
        ),
    ] {
        if let (Some(lo), Some(hi)) = (lo, hi) {
            if lo > hi {
                return Err(err(name, &format!("{lo} is above the maximum {hi}")));
            }
        }
    }
    let chunk_rows = f.chunk_rows.unwrap_or(DEFAULT_CHUNK_ROWS);
    if chunk_rows == 0 {
        return Err(err("chunk_rows", "must be at least 1"));
    }
    let ngram = f
        .decontaminate_ngram
        .unwrap_or(crate::data::decontaminate::DEFAULT_NGRAM);
    if ngram == 0 {
        return Err(err(
            "decontaminate_ngram",
            "must be at least 1 (open-r1 uses 8)",
        ));
    }
    if !f.decontaminate && (!f.decontaminate_against.is_empty() || f.decontaminate_ngram.is_some())
    {
        let key = if f.decontaminate_against.is_empty() {
            "decontaminate_ngram"
        } else {
            "decontaminate_against"
        };
        return Err(err(
            key,
            "set, but `decontaminate = false` turns decontamination off; drop one of them",
        ));
    }
    let against = crate::eval::against::Against::resolve(&f.decontaminate_against, base)
        .map_err(|e| err("decontaminate_against", &format!("{e:#}")))?;
    let keep_pass_rate = match f.keep_pass_rate.as_deref() {
        None => None,
        Some(&[lo, hi]) if (0.0..=1.0).contains(&lo) && (0.0..=1.0).contains(&hi) => {
            if lo > hi {
                return Err(err(
                    "keep_pass_rate",
                    &format!("[{lo}, {hi}] is an empty window: the minimum is above the maximum"),
                ));
            }
            Some((lo, hi))
        }
        Some(v) => {
            return Err(err(
                "keep_pass_rate",
                &format!("must be [min, max] with both in [0, 1], got {v:?}"),
            ))
        }
    };
    Ok(FilterConfig {
        completions,
        max_per_problem: f.max_per_problem,
        dedup: f.dedup,
        min_completion_tokens: f.min_completion_tokens,
        max_completion_tokens: f.max_completion_tokens,
        min_completion_chars: f.min_completion_chars,
        max_completion_chars: f.max_completion_chars,
        last_number_fallback: f.last_number_fallback,
        thinking: f.thinking,
        chunk_rows,
        decontaminate: f.decontaminate,
        decontaminate_ngram: ngram,
        decontaminate_against: f.decontaminate_against,
        against,
        keep_pass_rate,
        check_arithmetic: f.check_arithmetic,
    })
}

/// A dataset-format completions file takes its problem ids from one data source.
fn check_completions_source(
    f: &FilterConfig,
    d: &DataConfig,
    origin: &str,
) -> Result<(), ConfigError> {
    let Some(c) = &f.completions else {
        return Ok(());
    };
    if c.format == CompletionsFormat::Completions {
        return Ok(());
    }
    let names: Vec<String> = d.sources.iter().map(|s| s.name.clone()).collect();
    match &c.source {
        None if names.len() == 1 => Ok(()),
        None => Err(ConfigError(format!(
            "{origin}: `filter.completions.source`: missing; name the data source whose ids \
             these rows carry (one of {})",
            names.join(", ")
        ))),
        Some(s) if names.contains(s) => Ok(()),
        Some(s) => Err(ConfigError(format!(
            "{origin}: `filter.completions.source`: no data source is named `{s}`{} (sources: {})",
            closest(s, &names)
                .map(|b| format!("; did you mean `{b}`?"))
                .unwrap_or_default(),
            names.join(", ")
        ))),
    }
}

/// Reads a section the raw parse kept as a table: [`SampleSettings`] flattens the sampling
/// parameters in, and serde's errors from inside a flattened struct name neither the key nor
/// its line. `read` names the key; this finds its line.
fn read_section<T>(
    text: &str,
    origin: &str,
    section: &str,
    t: &toml::Table,
    read: impl Fn(&toml::Table) -> Result<T, KeyError>,
) -> Result<T, ConfigError> {
    read(t).map_err(|e| {
        let at = match e.key().and_then(|k| key_position(text, section, k)) {
            Some((line, col)) => format!("{origin}:{line}:{col}: "),
            None => format!("{origin}: "),
        };
        ConfigError(match &e {
            KeyError::Value {
                key: Some(k),
                message,
            } => format!("{at}`{section}.{k}`: {message}"),
            KeyError::Value { key: None, message } => format!("{at}[{section}]: {message}"),
            KeyError::Unknown { .. } => format!("{at}{}", e.reason_in(Some(section))),
        })
    })
}

/// Where `key` is set in the `[section]` of `text`: (line, column), from 1.
fn key_position(text: &str, section: &str, key: &str) -> Option<(usize, usize)> {
    let mut inside = false;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with('[') {
            inside = header_name(t).as_deref() == Some(section);
            continue;
        }
        let name = t.split('=').next().unwrap_or("").trim().trim_matches('"');
        if inside && t.contains('=') && name == key {
            return Some((i + 1, line.len() - t.len() + 1));
        }
    }
    None
}

/// Rewrites a TOML/serde error as `file:line:col: message`, adding the closest valid key or value.
fn toml_error(text: &str, origin: &str, e: &toml::de::Error) -> ConfigError {
    let (line, col) = e.span().map(|s| line_col(text, s.start)).unwrap_or((0, 0));
    let msg = plain_message(e.message().trim());
    let section = e.span().and_then(|s| enclosing_table(text, s.start));
    let mut out = if line > 0 {
        format!("{origin}:{line}:{col}: ")
    } else {
        format!("{origin}: ")
    };
    if let Some((bad, valid)) = parse_unknown(&msg) {
        let what = if msg.starts_with("unknown variant") {
            "value"
        } else {
            "key"
        };
        out.push_str(&format!("unknown {what} `{bad}`"));
        if let Some(sec) = section {
            out.push_str(&format!(" in [{sec}]"));
        }
        if let Some(best) = closest(&bad, &valid) {
            out.push_str(&format!("; did you mean `{best}`?"));
        }
        out.push_str(&format!(" (valid: {})", valid.join(", ")));
    } else {
        out.push_str(&msg);
        if let Some(sec) = section {
            out.push_str(&format!(" (in [{sec}])"));
        }
    }
    ConfigError(out)
}

/// A serde message in a config writer's words: serde names the Rust type it wanted
/// ("expected struct TrainSettings"), which a config writer never wrote; it wanted a table.
pub fn plain_message(msg: &str) -> String {
    const STRUCT: &str = "expected struct ";
    let mut out = msg.to_string();
    while let Some(i) = out.find(STRUCT) {
        let rest = &out[i + STRUCT.len()..];
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        out.replace_range(i..i + STRUCT.len() + end, "expected a table of keys");
    }
    out
}

/// From serde's "unknown field `x`, expected one of `a`, `b`" takes `x` and `[a, b]`.
fn parse_unknown(msg: &str) -> Option<(String, Vec<String>)> {
    let rest = msg
        .strip_prefix("unknown field ")
        .or_else(|| msg.strip_prefix("unknown variant "))?;
    let mut ticks = rest.split('`').skip(1).step_by(2).map(str::to_string);
    let bad = ticks.next()?;
    Some((bad, ticks.collect()))
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map(|i| offset - i).unwrap_or(offset + 1);
    (line, col)
}

/// The table that holds the key at `offset`: the nearest `[table]` / `[[array]]` header above
/// its line, or, when the key is itself in a header (`[filtr]`, `[filter.completionz]`), the
/// header's parent (`None` at the top level).
fn enclosing_table(text: &str, offset: usize) -> Option<String> {
    let before = text.get(..offset)?;
    let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    let line = text.get(line_start..)?.lines().next().unwrap_or("");
    if let Some(name) = header_name(line) {
        return name.rsplit_once('.').map(|(parent, _)| parent.to_string());
    }
    text.get(..line_start)?.lines().rev().find_map(header_name)
}

fn header_name(line: &str) -> Option<String> {
    let t = line.trim();
    t.strip_prefix("[[")
        .and_then(|r| r.split("]]").next())
        .or_else(|| t.strip_prefix('[').and_then(|r| r.split(']').next()))
        .map(|s| s.trim().to_string())
}

pub mod overrides;
#[cfg(test)]
mod tests;
