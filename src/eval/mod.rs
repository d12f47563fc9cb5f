//! Evaluation: eval set definitions (`evals/*.toml`) and `pipeline eval`. Each model samples
//! each set with the set's settings and the same seeds (so models differ only by their
//! weights), the samples are graded by the verifier, and the metrics of [`metrics`] are written
//! per model and set, with a summary table (pass@1 with its 95% interval, the change from the
//! first model, majority@n, pass@n, no answer, truncated, mean length; named as NeMo-Skills
//! names them).
//!
//! Output layout: `<out>/<model slug>/<set>/samples.parquet` (the completions schema, graded;
//! resumable like any sampling job) and `metrics.json` beside it, written once the samples are
//! complete; `<out>/metrics.json` and `<out>/eval.md` for the whole run.
//!
//! Knows nothing of pipeline stages; the sampling itself is `jobs::sample`.

pub mod against;
pub mod examples;
pub mod metrics;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::data::source::SourceSpec;
use crate::data::{hub, load_source};
use crate::jobs::sample::run::{engine_difference, run_jobs, JobSpec};
use crate::jobs::sample::settings::{KeyError, LogitsEngine, SampleOverrides, SampleSettings};
use metrics::{Outcome, SetMetrics};

/// One eval set: where its problems come from and how to sample them.
#[derive(Debug, Clone)]
pub struct EvalSet {
    pub name: String,
    /// The definition file.
    pub file: PathBuf,
    pub source: SourceSpec,
    /// The `[sample]` keys of the definition (any key of a config's `[sample]` but `model`).
    pub sample: toml::Table,
}

/// Groups of shipped sets that `--sets` and `[eval] sets` take by name: `math-core`, the small
/// and fast sets; `math-hard`, the competition sets papers report with many samples.
pub const GROUPS: &[(&str, &[&str])] = &[
    (
        "math-core",
        &["gsm8k_test", "math500", "amc23", "minerva_math"],
    ),
    (
        "math-hard",
        &["aime24", "aime25", "hmmt_feb25", "olympiadbench"],
    ),
];

/// Folders searched for `<name>.toml`: `$SELFDISTILL_EVALS`, `./evals`, and the `evals/` of the
/// repository the binary was built in (found from the executable's path, `target/<profile>/`).
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("SELFDISTILL_EVALS") {
        dirs.push(PathBuf::from(d));
    }
    dirs.push(PathBuf::from("evals"));
    if let Ok(exe) = std::env::current_exe() {
        if let Some(repo) = exe.ancestors().nth(3) {
            dirs.push(repo.join("evals"));
        }
    }
    dirs.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("evals"));
    dirs
}

impl EvalSet {
    /// A definition file.
    pub fn load(file: &Path) -> Result<EvalSet> {
        let origin = file.display().to_string();
        let text = crate::bytes::read_settings_file(file, "eval set definition")?;
        let mut table: toml::Table =
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
        for key in table.keys() {
            if key != "source" && key != "sample" {
                bail!("{origin}: unknown key `{key}` (an eval set has [source] and [sample])");
            }
        }
        let base = file.parent().unwrap_or(Path::new("."));
        let source = table
            .remove("source")
            .with_context(|| format!("{origin}: no [source] section"))?;
        let source = crate::data::source::source_from_toml(source, "source", base, &origin)
            .map_err(anyhow::Error::msg)?;
        let sample = match table.remove("sample") {
            Some(toml::Value::Table(t)) => t,
            Some(_) => bail!("{origin}: `sample` must be a table"),
            None => toml::Table::new(),
        };
        if sample.contains_key("model") {
            bail!("{origin}: `sample.model`: the model comes from `--model`, not the eval set");
        }
        let set = EvalSet {
            name: source.name.clone(),
            file: file.to_path_buf(),
            source,
            sample,
        };
        set.settings("model")?; // the [sample] keys are checked now, not after a model loads
        Ok(set)
    }

    /// A set by name (`<name>.toml` in [`search_dirs`]) or by the path of a definition file.
    pub fn find(name_or_path: &str) -> Result<EvalSet> {
        let p = Path::new(name_or_path);
        if name_or_path.ends_with(".toml") || p.components().count() > 1 {
            return EvalSet::load(p);
        }
        let mut dirs = search_dirs();
        // the same folder reached twice (the cwd's evals/ is the repo's) is named once
        let mut seen = std::collections::HashSet::new();
        dirs.retain(|d| seen.insert(d.canonicalize().unwrap_or_else(|_| d.clone())));
        for d in &dirs {
            let f = d.join(format!("{name_or_path}.toml"));
            if f.is_file() {
                return EvalSet::load(&f);
            }
        }
        let known: std::collections::BTreeSet<String> = dirs
            .iter()
            .filter_map(|d| std::fs::read_dir(d).ok())
            .flatten()
            .filter_map(|e| {
                let n = e.ok()?.file_name().to_string_lossy().into_owned();
                n.strip_suffix(".toml").map(str::to_string)
            })
            .collect();
        bail!(
            "eval set `{name_or_path}`: no {name_or_path}.toml in {}; known sets: {}",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            if known.is_empty() {
                "none".into()
            } else {
                known.into_iter().collect::<Vec<_>>().join(", ")
            }
        )
    }

    /// The set's problems (downloading its hub files when needed), the first `limit` of them
    /// when given.
    pub fn problems(&self, limit: Option<usize>) -> Result<Vec<crate::data::schema::Problem>> {
        let what = || format!("eval set `{}` ({})", self.name, self.file.display());
        let files = hub::resolve(&self.source.location).with_context(what)?;
        let spec = SourceSpec {
            limit,
            ..self.source.clone()
        };
        let (problems, _) =
            load_source(&spec, &files, crate::data::BadRows::STRICT).with_context(what)?;
        Ok(problems)
    }

    /// The sampling settings of this set for `model`.
    pub fn settings(&self, model: &str) -> Result<SampleSettings> {
        let mut t = self.sample.clone();
        t.insert("model".into(), toml::Value::String(model.into()));
        let s = SampleSettings::from_table(&t).map_err(|e| match e.key() {
            Some(k) => anyhow::anyhow!("{}: `sample.{k}`: {}", self.file.display(), e.reason()),
            None => anyhow::anyhow!("{}: `sample`: {}", self.file.display(), e.reason()),
        })?;
        s.validate()
            .map_err(|e| anyhow::anyhow!("{}: `sample.{e}`", self.file.display()))?;
        Ok(s)
    }
}

/// The `[eval]` section of a config, and the flags of `pipeline eval`: which sets, whose base
/// model (the stage's; the command takes `--model`), how many problems, and what to override in
/// every set's sampling settings (any `[sample]` key but `model`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EvalConfig {
    /// Names of `evals/<name>.toml`, or paths of definition files (relative to the config).
    pub sets: Vec<String>,
    /// The base model; default: `[train].model`, else `[sample].model`.
    pub model: Option<String>,
    /// Only the first N problems of each set.
    pub limit: Option<usize>,
    /// Set over every set's `[sample]` keys.
    pub overrides: SampleOverrides,
}

/// The keys of `[eval]` that are its own; every other key is an override.
const EVAL_KEYS: [&str; 3] = ["sets", "model", "limit"];

impl EvalConfig {
    /// An `[eval]` table; the error names the key.
    pub fn from_table(t: &toml::Table) -> std::result::Result<EvalConfig, KeyError> {
        // one of the section's own keys, typed; the error names it
        fn own<T: serde::de::DeserializeOwned>(
            t: &toml::Table,
            key: &str,
        ) -> std::result::Result<Option<T>, KeyError> {
            t.get(key)
                .map(|v| v.clone().try_into())
                .transpose()
                .map_err(|e: toml::de::Error| KeyError::Value {
                    key: Some(key.into()),
                    message: e.message().trim().to_string(),
                })
        }
        let sets: Vec<String> = own(t, "sets")?.ok_or_else(|| KeyError::Value {
            key: Some("sets".into()),
            message: "missing: name at least one eval set".into(),
        })?;
        let model: Option<String> = own(t, "model")?;
        let limit: Option<usize> = own(t, "limit")?;
        if limit == Some(0) {
            return Err(KeyError::Value {
                key: Some("limit".into()),
                message: "0 evaluates no problem: give 1 or more, or leave it out for every \
                          problem of each set"
                    .into(),
            });
        }
        let rest: toml::Table = t
            .iter()
            .filter(|(k, _)| !EVAL_KEYS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let overrides = SampleOverrides::new(rest).map_err(|e| match e {
            KeyError::Unknown { key, mut valid } => {
                valid.retain(|k| k != "model");
                valid.splice(0..0, EVAL_KEYS.iter().map(|k| k.to_string()));
                KeyError::Unknown { key, valid }
            }
            e => e,
        })?;
        Ok(EvalConfig {
            sets,
            model,
            limit,
            overrides,
        })
    }

    /// The sets, resolved (names through [`search_dirs`], paths ending in `.toml` against
    /// `base`).
    pub fn load_sets(&self, base: &Path) -> Result<Vec<EvalSet>> {
        let mut names: Vec<&str> = Vec::new();
        for s in &self.sets {
            match GROUPS.iter().find(|(g, _)| g == s) {
                Some((_, members)) => names.extend(members.iter().copied()),
                None => names.push(s),
            }
        }
        let mut seen = std::collections::HashSet::new();
        names.retain(|n| seen.insert(*n));
        names
            .iter()
            .map(|s| {
                if s.ends_with(".toml") {
                    EvalSet::load(&crate::data::source::resolve(base, s))
                } else {
                    EvalSet::find(s)
                }
            })
            .collect()
    }

    /// A set's sampling settings for `model`, with the overrides.
    pub fn settings(&self, set: &EvalSet, model: &str) -> Result<SampleSettings> {
        let s = set.settings(model)?;
        let s = self
            .overrides
            .apply(&s)
            .map_err(|e| anyhow::anyhow!("eval set `{}` with the overrides: {e}", set.name))?;
        s.validate()
            .map_err(|e| anyhow::anyhow!("eval set `{}` with the overrides: {e}", set.name))?;
        Ok(s)
    }
}

/// The keys an eval stage's key has always hashed, in order: these are written even when unset
/// (as null); other overrides only when set, the ones of [`LATER_KEYS`] first. Frozen, so that
/// every existing eval stage keeps its key.
const ALWAYS_KEYS: [&str; 10] = [
    "n",
    "temperature",
    "top_p",
    "top_k",
    "max_new_tokens",
    "enable_thinking",
    "limit",
    "seed",
    "device",
    "max_num_seqs",
];
const LATER_KEYS: [&str; 7] = [
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "stop_token_ids",
    "logprobs",
    "engine",
];

/// The stage key's form of the section: `sets`, `model`, then [`ALWAYS_KEYS`], then the other
/// overrides that are set ([`LATER_KEYS`] first, the rest by name), each value as its field's
/// type writes it ([`SampleOverrides::typed_json`]).
impl Serialize for EvalConfig {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let value = |key: &str| -> serde_json::Value {
            if key == "limit" {
                return serde_json::json!(self.limit);
            }
            self.overrides
                .get(key)
                .map(|v| SampleOverrides::typed_json(key, v))
                .unwrap_or(serde_json::Value::Null)
        };
        let mut m = ser.serialize_map(None)?;
        m.serialize_entry("sets", &self.sets)?;
        m.serialize_entry("model", &self.model)?;
        for k in ALWAYS_KEYS {
            m.serialize_entry(k, &value(k))?;
        }
        for k in LATER_KEYS {
            if self.overrides.get(k).is_some() {
                m.serialize_entry(k, &value(k))?;
            }
        }
        for (k, _) in self.overrides.iter() {
            if !ALWAYS_KEYS.contains(&k.as_str()) && !LATER_KEYS.contains(&k.as_str()) {
                m.serialize_entry(k, &value(k))?;
            }
        }
        m.end()
    }
}

/// The metrics of one model on one set. The table names them as NeMo-Skills does:
/// `pass@1[avg-of-n]` (pass@1 as the mean over each problem's n samples, what papers report for
/// AIME and HMMT at n = 16 or more), `majority@n` (our `maj_at_n`) and `pass@n`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EvalResult {
    pub model: String,
    pub set: String,
    pub metrics: SetMetrics,
    /// Generated tokens per second of the sampling (0 when the samples were already complete).
    pub tokens_per_second: f64,
}

/// A folder name for a model: its last path component and a short hash of the whole string.
pub fn model_slug(model: &str) -> String {
    let base: String = Path::new(model.trim_end_matches('/'))
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let hash = crate::store::hash_json(&serde_json::Value::String(model.into()));
    format!("{base}-{}", &hash[..8])
}

/// Samples, grades and scores every set with every model; writes the layout of the module doc.
/// Each model is loaded once: the sets whose settings share an engine
/// ([`engine_difference`]: normally all of them) run as one continuous batch, each request
/// with its set's sampling parameters, each set's samples and metrics what it gets alone.
pub fn evaluate(
    models: &[String],
    sets: &[EvalSet],
    ov: &EvalConfig,
    out: &Path,
    progress_file: Option<&Path>,
) -> Result<Vec<EvalResult>> {
    if models.is_empty() || sets.is_empty() {
        bail!("eval: give at least one --model and one set");
    }
    let mut problems = Vec::with_capacity(sets.len());
    for (i, set) in sets.iter().enumerate() {
        if let Some(other) = sets[..i].iter().find(|o| o.name == set.name) {
            bail!(
                "eval sets {} and {} are both named `{}`: their samples would share a folder",
                other.file.display(),
                set.file.display(),
                set.name
            );
        }
        let p = set.problems(ov.limit.or(set.source.limit))?;
        if p.iter().any(|p| p.gold_answer.is_empty()) {
            bail!("eval set `{}`: some problems have no gold answer", set.name);
        }
        problems.push(p);
    }
    // (set, model) -> result, reported in set order then model order
    let mut by_pair: HashMap<(usize, usize), EvalResult> = HashMap::new();
    for (mi, model) in models.iter().enumerate() {
        let runs = SetRuns::new(model, sets, ov, out, progress_file)?;
        for group in runs.groups() {
            let done = run_group(model, &group, sets, &problems, &runs, progress_file)?;
            for (i, r) in done {
                by_pair.insert((i, mi), r);
            }
        }
    }
    let mut results = Vec::with_capacity(by_pair.len());
    for i in 0..sets.len() {
        for mi in 0..models.len() {
            results.extend(by_pair.remove(&(i, mi)));
        }
    }
    crate::store::write_json_atomic(&out.join("metrics.json"), &results)?;
    let table = table(&results, models);
    crate::store::commit_file(&out.join("eval.md"), |tmp| Ok(std::fs::write(tmp, &table)?))?;
    crate::out!("{table}");
    Ok(results)
}

/// One model's sets as runs: each set's settings, folder and progress target.
struct SetRuns {
    settings: Vec<SampleSettings>,
    dirs: Vec<PathBuf>,
    targets: Vec<crate::progress::Target>,
}

impl SetRuns {
    fn new(
        model: &str,
        sets: &[EvalSet],
        ov: &EvalConfig,
        out: &Path,
        progress_file: Option<&Path>,
    ) -> Result<SetRuns> {
        let mut runs = SetRuns {
            settings: Vec::with_capacity(sets.len()),
            dirs: Vec::with_capacity(sets.len()),
            targets: Vec::with_capacity(sets.len()),
        };
        for set in sets {
            let dir = out.join(model_slug(model)).join(&set.name);
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            runs.settings.push(ov.settings(set, model)?);
            runs.dirs.push(dir);
            runs.targets.push(crate::progress::Target::new(
                format!("eval {} {}", set.name, model_slug(model)),
                progress_file.map(Path::to_path_buf),
            ));
        }
        Ok(runs)
    }

    /// The sets that can share an engine ([`engine_difference`]), in set order; on mistral.rs,
    /// which runs one job at a time, each set alone.
    fn groups(&self) -> Vec<Vec<usize>> {
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for (i, s) in self.settings.iter().enumerate() {
            let alone = s.engine == LogitsEngine::Mistralrs;
            match groups
                .iter_mut()
                .filter(|_| !alone)
                .find(|g| engine_difference(&self.settings[g[0]], s).is_none())
            {
                Some(g) => g.push(i),
                None => groups.push(vec![i]),
            }
        }
        groups
    }
}

/// The sets `group` (indices into `sets`, `problems` and `runs`) of `model` sampled as one run,
/// the model loaded once; each set's metrics, written beside its samples.
fn run_group(
    model: &str,
    group: &[usize],
    sets: &[EvalSet],
    problems: &[Vec<crate::data::schema::Problem>],
    runs: &SetRuns,
    progress_file: Option<&Path>,
) -> Result<Vec<(usize, EvalResult)>> {
    let samples: Vec<PathBuf> = group
        .iter()
        .map(|&i| runs.dirs[i].join("samples.parquet"))
        .collect();
    let specs: Vec<JobSpec> = group
        .iter()
        .zip(&samples)
        .map(|(&i, out)| JobSpec {
            settings: &runs.settings[i],
            problems: &problems[i],
            shard: (0, 1),
            problem_set: None,
            output: out,
            progress: &runs.targets[i],
        })
        .collect();
    let names: Vec<&str> = group.iter().map(|&i| sets[i].name.as_str()).collect();
    tracing::info!(
        "eval: {model} on {} ({} problems), the model loaded once",
        names.join(", "),
        group.iter().map(|&i| problems[i].len()).sum::<usize>()
    );
    let overall = crate::progress::Target::new(
        format!("eval {}", model_slug(model)),
        progress_file.map(Path::to_path_buf),
    );
    let summaries = run_jobs(&specs, &overall)?;
    let mut done = Vec::with_capacity(group.len());
    for ((&i, samples), summary) in group.iter().zip(&samples).zip(summaries) {
        let levels: HashMap<&str, &str> = problems[i]
            .iter()
            .filter_map(|p| Some((p.problem_id.as_str(), p.level.as_deref()?)))
            .collect();
        let outcomes = outcomes(samples, &levels)?;
        let m = metrics::compute(&outcomes, runs.settings[i].params.seed);
        let r = EvalResult {
            model: model.to_string(),
            set: sets[i].name.clone(),
            metrics: m,
            tokens_per_second: summary.generated_tokens as f64 / summary.seconds.max(1e-9),
        };
        crate::store::write_json_atomic(&runs.dirs[i].join("metrics.json"), &r)?;
        done.push((i, r));
    }
    Ok(done)
}

/// `<out>/examples.md` (and its `examples/` files): what each model wrote on each set, from the
/// samples [`evaluate`] wrote there (see [`examples`]).
pub fn write_examples(models: &[String], sets: &[EvalSet], out: &Path) -> Result<PathBuf> {
    let samples: Vec<_> = sets
        .iter()
        .flat_map(|set| {
            models.iter().map(move |m| {
                let p = out
                    .join(model_slug(m))
                    .join(&set.name)
                    .join("samples.parquet");
                (set.name.clone(), m.clone(), p)
            })
        })
        .collect();
    let ex = examples::select(&samples, &problem_texts(sets)?, 0)?;
    let md: String = examples::render(&ex, out, "examples", &|m: &str| m.to_string())?
        .into_iter()
        .map(|(_, table, examples)| table + &examples)
        .collect();
    let path = out.join("examples.md");
    crate::store::commit_file(&path, |tmp| {
        Ok(std::fs::write(
            tmp,
            format!("# What the models wrote\n\n{md}"),
        )?)
    })?;
    Ok(path)
}

/// Every problem's text by id, of every set.
pub fn problem_texts(sets: &[EvalSet]) -> Result<HashMap<String, String>> {
    let mut out = HashMap::new();
    for set in sets {
        for p in set.problems(None)? {
            out.insert(p.problem_id, p.problem);
        }
    }
    Ok(out)
}

/// The graded samples of a completions file as metric outcomes.
pub fn outcomes(samples: &Path, levels: &HashMap<&str, &str>) -> Result<Vec<Outcome>> {
    let rows = crate::data::schema::read_completions(samples)?;
    rows.into_iter()
        .map(|c| {
            let Some(g) = c.grade else {
                bail!(
                    "{}: sample {} of {} is not graded",
                    samples.display(),
                    c.sample_index,
                    c.problem_id
                )
            };
            Ok(Outcome {
                level: levels.get(c.problem_id.as_str()).map(|l| l.to_string()),
                problem_id: c.problem_id,
                sample_index: c.sample_index,
                answer: g
                    .extracted_answer
                    .map(|a| crate::verify::normalize::normalize_answer(&a)),
                correct: g.correct,
                truncated: matches!(
                    c.finish_reason.as_deref(),
                    Some("length" | "thinking_budget")
                ),
                completion_tokens: c.num_completion_tokens.unwrap_or(0).max(0) as u64,
            })
        })
        .collect()
}

/// The summary table (Markdown): one block per set, one row per model; the change in pass@1 is
/// against the first model.
pub fn table(results: &[EvalResult], models: &[String]) -> String {
    let mut s = String::from(
        "| set | model | pass@1[avg-of-n] (95% CI) | vs first | majority@n | pass@n | no answer | truncated | mean tokens |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    let pct = |x: f64| format!("{:.1}", 100.0 * x);
    let mut sets: Vec<&str> = Vec::new();
    for r in results {
        if !sets.contains(&r.set.as_str()) {
            sets.push(&r.set);
        }
    }
    for set in sets {
        let first = models
            .first()
            .and_then(|m| results.iter().find(|r| r.set == set && &r.model == m));
        for r in results.iter().filter(|r| r.set == set) {
            let m = &r.metrics;
            let delta = match first {
                Some(f) if f.model != r.model => {
                    format!(
                        "{:+.1}",
                        100.0 * (m.pass_at_1.value - f.metrics.pass_at_1.value)
                    )
                }
                _ => "-".into(),
            };
            let pass_n = m.pass_at_k.last().map_or(0.0, |p| p.1);
            s.push_str(&format!(
                "| {set} | {} | {} ({}-{}) | {delta} | {} | {} (n={}) | {} | {} | {:.0} |\n",
                r.model,
                pct(m.pass_at_1.value),
                pct(m.pass_at_1.lo),
                pct(m.pass_at_1.hi),
                pct(m.maj_at_n.value),
                pct(pass_n),
                m.n,
                pct(m.no_answer),
                pct(m.truncated),
                m.mean_completion_tokens
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_sets_load_and_their_settings_validate() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("evals");
        let mut names = Vec::new();
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                let set = EvalSet::load(&p).unwrap_or_else(|e| panic!("{}: {e:#}", p.display()));
                assert_eq!(p.file_stem().unwrap().to_string_lossy(), set.name);
                set.settings("some/model").unwrap();
                names.push(set.name);
            }
        }
        names.sort();
        for want in ["aime24", "amc23", "gsm8k_test", "math500"] {
            assert!(
                names.iter().any(|n| n == want),
                "{want} missing from {names:?}"
            );
        }
        // every group names shipped sets only, and `--sets` expands a group in place
        for (group, members) in GROUPS {
            for m in *members {
                assert!(names.iter().any(|n| n == m), "{group}: {m} is not shipped");
            }
        }
        let cfg = EvalConfig {
            sets: vec!["math500".into(), "math-hard".into(), "aime24".into()],
            ..EvalConfig::default()
        };
        let got: Vec<String> = cfg
            .load_sets(Path::new("."))
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(
            got,
            ["math500", "aime24", "aime25", "hmmt_feb25", "olympiadbench"]
        );
    }

    #[test]
    fn bad_definitions_name_the_file_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x.toml");
        let write = |text: &str| std::fs::write(&f, text).unwrap();
        write("[source]\nname = \"x\"\nformat = \"gsm8k\"\npath = \"a.jsonl\"\n[sample]\ntemprature = 1\n");
        let e = format!("{:#}", EvalSet::load(&f).unwrap_err());
        assert!(e.contains("x.toml") && e.contains("temprature"), "{e}");
        write("[source]\nname = \"x\"\nformat = \"gsm8k\"\npath = \"a.jsonl\"\n[sample]\ntop_p = 2.0\n");
        let e = format!("{:#}", EvalSet::load(&f).unwrap_err());
        assert!(e.contains("x.toml") && e.contains("top_p"), "{e}");
        write("[source]\nname = \"x\"\nformat = \"gsm8k\"\npath = \"a.jsonl\"\n[sample]\nmodel = \"m\"\n");
        let e = format!("{:#}", EvalSet::load(&f).unwrap_err());
        assert!(e.contains("sample.model"), "{e}");
        write("[sorce]\n");
        let e = format!("{:#}", EvalSet::load(&f).unwrap_err());
        assert!(e.contains("sorce"), "{e}");
        let e = format!("{:#}", EvalSet::find("no_such_set").unwrap_err());
        assert!(e.contains("no_such_set") && e.contains("gsm8k_test"), "{e}");
    }

    #[test]
    fn slugs_are_folder_safe_and_distinct() {
        let a = model_slug("runs/a/train/model");
        let b = model_slug("runs/b/train/model");
        assert!(a.starts_with("model-") && a != b);
        assert!(model_slug("Qwen/Qwen3-4B").starts_with("Qwen3-4B-"));
    }
}
