//! Each section of a pipeline config checked and turned into its validated value, with errors
//! that name the file, the line and the key. Knows nothing of running stages.

use super::*;

/// The `[run]` section, validated.
pub(super) struct Run {
    pub(super) name: String,
    pub(super) workdir: PathBuf,
    pub(super) disk_budget_bytes: Option<u64>,
    pub(super) rounds: u32,
    pub(super) gpu_hour_price: Option<GpuPrice>,
    pub(super) train_from: TrainFrom,
    pub(super) resample_below: Option<f64>,
}

/// `[run]`: the name (default `default_name`), the work dir (default `runs/<name>`), the disk
/// budget and the number of rounds.
pub(super) fn validate_run(
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
pub(super) fn validate_eval(
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
pub(super) fn validate_train(
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

/// `pretrain.prompt_template`: `raw` or a Jinja file (a model built from scratch has no chat
/// template); a file as its resolved path.
fn pretrain_template(t: &str, base: &Path, origin: &str) -> Result<String, ConfigError> {
    let err = |key: &str, msg: String| ConfigError(format!("{origin}: `pretrain.{key}`: {msg}"));
    Ok(match t {
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
    })
}

/// The pretraining source must have solutions; the prompt template must be the sampler's and
/// every eval set's (the model learns one prompt format); the tokenizer covers the data stage's
/// and the eval sets' sources.
pub(super) fn validate_pretrain(
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
    let prompt_template = pretrain_template(&p.prompt_template, base, origin)?;
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
pub(super) fn validate_mix(
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

pub(super) fn validate_data(
    d: RawData,
    base: &Path,
    origin: &str,
) -> Result<DataConfig, ConfigError> {
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
pub(super) fn validate_sample(
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

/// `[filter.completions]`: a file to filter instead of the sample stage's completions.
fn filter_completions(
    c: Option<RawCompletions>,
    base: &Path,
    origin: &str,
    has_sample: bool,
) -> Result<Option<CompletionsSpec>, ConfigError> {
    let err = |key: &str, msg: &str| ConfigError(format!("{origin}: `filter.{key}`: {msg}"));
    Ok(match c {
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
    })
}

/// `filter.keep_pass_rate`: a window [min, max] within [0, 1].
fn pass_rate_window(v: Option<&[f64]>, origin: &str) -> Result<Option<(f64, f64)>, ConfigError> {
    let err = |key: &str, msg: &str| ConfigError(format!("{origin}: `filter.{key}`: {msg}"));
    Ok(match v {
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
    })
}

pub(super) fn validate_filter(
    f: RawFilter,
    base: &Path,
    origin: &str,
    has_sample: bool,
) -> Result<FilterConfig, ConfigError> {
    let err = |key: &str, msg: &str| ConfigError(format!("{origin}: `filter.{key}`: {msg}"));
    let completions = filter_completions(f.completions, base, origin, has_sample)?;
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
    let keep_pass_rate = pass_rate_window(f.keep_pass_rate.as_deref(), origin)?;
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
pub(super) fn check_completions_source(
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
