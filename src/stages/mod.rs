//! The plan and the runner: a validated config becomes an ordered list of stages, each keyed by a
//! hash of its config section, its inputs' hashes and its code version; `run` executes the ones
//! without a manifest, in order, and writes each manifest last.
//!
//! Stages live one per file (`data`, `pretrain`, `sample`, `filter`, `train`, `eval`)
//! and never import each other: they meet only through the files named in their inputs. This
//! module knows the order of stages and which stage reads which, not what they compute.
//!
//! With `run.rounds = R > 1`, sample -> filter -> train repeats R times, each round from the
//! model the round before trained, as stages named `sample-r1`, `filter-r1`, `train-r1`, ...;
//! with one round they are plain `sample`, `filter`, `train`.

pub mod cost;
pub mod data;
pub mod eval;
pub mod filter;
pub mod pretrain;
pub mod sample;
pub mod train;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::store::{self, InputRef, Manifest, OutputFile, WorkDir};

/// The kinds of stage, in pipeline order. A config's plan is the subsequence it configures
/// (sample, filter and train repeated per round).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StageKind {
    Data,
    Pretrain,
    Sample,
    Filter,
    Train,
    Eval,
}

impl StageKind {
    pub const ALL: [StageKind; 6] = [
        StageKind::Data,
        StageKind::Pretrain,
        StageKind::Sample,
        StageKind::Filter,
        StageKind::Train,
        StageKind::Eval,
    ];

    /// The kind's name: the stage's name in a one-round plan, the first part of its folder's
    /// name and of its key (so it must never change).
    pub fn as_str(self) -> &'static str {
        match self {
            StageKind::Data => "data",
            StageKind::Pretrain => "pretrain",
            StageKind::Sample => "sample",
            StageKind::Filter => "filter",
            StageKind::Train => "train",
            StageKind::Eval => "eval",
        }
    }

    pub fn parse(name: &str) -> Option<StageKind> {
        StageKind::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

impl std::fmt::Display for StageKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

pub use crate::config::PRETRAINED;

// The files stages write for the stages after them (and the report) to read: the only way
// stages meet. Each is written by the stage named beside it.
/// `data`: the problems (`data::schema::problems_schema`).
pub const PROBLEMS: &str = "problems.parquet";
/// `sample`: the completions (`data::schema::completions_schema`).
pub const COMPLETIONS: &str = "completions.parquet";
/// `filter`: the SFT rows (`data::schema::sft_schema`).
pub const SFT: &str = "sft.parquet";
/// `pretrain` and `train`: the model folder (Hugging Face layout).
pub const MODEL_DIR: &str = "model";
/// `pretrain` and `train`: checkpoints and `metrics.jsonl`.
pub const TRAIN_STATE_DIR: &str = "train_state";
/// `eval`: every model's metrics on every set.
pub const EVAL_METRICS: &str = "metrics.json";

/// One stage of a plan, with everything that determines its output already resolved.
#[derive(Debug, Clone)]
pub struct PlannedStage {
    /// Unique in the plan: the kind, with `-r<N>` in a multi-round plan.
    pub name: String,
    /// Which runner.
    pub kind: StageKind,
    /// The stages this one reads, by role (`data`, `completions`, `sft`, `model`, `trained`).
    pub deps: Vec<(&'static str, String)>,
    /// The model this stage loads (a folder or hub id), resolved: another stage's output folder
    /// when an earlier stage makes it.
    pub model: Option<String>,
    pub key: String,
    pub dir: PathBuf,
    pub code_version: u32,
    /// The stage's validated config section (hashed into the key, stored in the manifest).
    pub config: serde_json::Value,
    pub inputs: Vec<InputRef>,
    /// Local files this stage reads, by input name.
    pub files: Vec<(String, PathBuf)>,
    /// Rough figures for preflight.
    pub estimate: Estimate,
}

/// What a stage is expected to need, from its input sizes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Estimate {
    pub disk_bytes: u64,
    /// Host memory.
    pub memory_bytes: u64,
    /// GPU memory, for a stage that runs on one (0: none).
    #[serde(default)]
    pub gpu_bytes: u64,
    /// Rows the stage writes, where they can be counted or bounded before it runs (problems,
    /// samples, SFT rows).
    #[serde(default)]
    pub rows: Option<u64>,
    /// Tokens per written row (prompt and completion), for the stage that trains on them.
    #[serde(default)]
    pub row_tokens: Option<u64>,
    /// The compute the stage does, for the time and cost estimate ([`cost`]).
    #[serde(default)]
    pub work: Option<Work>,
}

/// Tokens a stage generates or trains on, and where.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Work {
    pub tokens: u64,
    /// Training (6 FLOPs per parameter and token) rather than generating.
    pub train: bool,
    pub params: u64,
    /// `cpu`, `cuda` or `cuda:N`.
    pub device: String,
    /// Sequences decoded at once (generation).
    pub batch: usize,
    /// How `tokens` was counted, said in the table.
    pub basis: String,
}

/// The completion length assumed before a run: half of `max_new_tokens`.
pub fn expected_completion_tokens(max_new_tokens: usize) -> u64 {
    (max_new_tokens as u64).div_ceil(2)
}

/// The prompt length assumed before the prompts are rendered (a math problem in a chat
/// template).
pub const ASSUMED_PROMPT_TOKENS: u64 = 150;

#[derive(Debug, Clone)]
pub struct Plan {
    pub workdir: PathBuf,
    pub stages: Vec<PlannedStage>,
}

/// Named counts, in the order a stage reports them (rules, reasons, skipped rows).
pub type Counts = Vec<(String, u64)>;

/// What a finished stage reports to the runner, which adds timing and writes the manifest.
pub struct StageOutput {
    pub outputs: Vec<OutputFile>,
    pub counts: Counts,
    pub rows: u64,
}

/// A stage's state on disk.
#[derive(Debug, Clone, PartialEq)]
pub enum StageState {
    Done(Box<Manifest>),
    Partial(Option<store::Progress>),
    NotStarted,
}

/// A stage is done when its manifest exists and every output it lists is there with its size.
pub fn stage_state(dir: &Path) -> Result<StageState> {
    if let Some(m) = store::read_manifest(dir)? {
        let intact = m
            .outputs
            .iter()
            .all(|o| std::fs::metadata(dir.join(&o.path)).is_ok_and(|md| md.len() == o.bytes));
        if intact {
            return Ok(StageState::Done(Box::new(m)));
        }
        return Ok(StageState::Partial(store::read_progress(dir)));
    }
    if dir.exists() {
        return Ok(StageState::Partial(store::read_progress(dir)));
    }
    Ok(StageState::NotStarted)
}

impl Plan {
    /// Resolves every input (downloading hub files when needed) and keys every stage.
    pub fn build(cfg: &Config, workdir: &Path) -> Result<Plan> {
        Plan::build_with(cfg, workdir, Resolve::default())
    }

    /// [`Self::build`], finding inputs through `resolve`.
    pub fn build_with(cfg: &Config, workdir: &Path, resolve: Resolve) -> Result<Plan> {
        let mut stages: Vec<PlannedStage> = Vec::new();
        if let Some(d) = &cfg.data {
            stages.push(data::plan(d, workdir, &resolve)?);
        }
        let pretrained = match &cfg.pretrain {
            Some(p) => {
                let (stage, facts) = pretrain::plan(p, workdir, &resolve)?;
                stages.push(stage);
                Some(facts)
            }
            None => None,
        };
        // A model by name: the pretrain stage's, or a checkpoint / hub id.
        let facts = |name: &str| -> Result<ModelFacts> {
            if name == PRETRAINED {
                return pretrained
                    .clone()
                    .context("`@pretrain` names the pretrain stage's model: add [pretrain]");
            }
            resolve.facts(name)
        };
        let rounds = cfg.rounds.max(1);
        let named = |kind: &str, r: u32| {
            if rounds == 1 {
                kind.to_string()
            } else {
                format!("{kind}-r{r}")
            }
        };
        // The model the round before trained: (its folder, facts). Round 1 samples the [sample]
        // model and trains the [train] model (by default the same).
        let mut prev: Option<(String, ModelFacts)> = None;
        for r in 1..=rounds {
            let start =
                |configured: &str, stages: &[PlannedStage]| -> Result<(String, ModelFacts)> {
                    match &prev {
                        Some(p) => Ok(p.clone()),
                        None => Ok((model_path(stages, configured), facts(configured)?)),
                    }
                };
            let mut sampled = None;
            if let Some(s) = &cfg.sample {
                let data =
                    find(&stages, StageKind::Data).context("the sample stage needs [data]")?;
                let (model, mf) = start(&s.model, &stages)?;
                let mut st = sample::plan(s, data, workdir, &mf)?;
                st.name = named("sample", r);
                st.deps.push(("data", data.name.clone()));
                st.model = Some(model);
                sampled = Some(stages.len());
                stages.push(st);
            }
            if let Some(f) = &cfg.filter {
                let data =
                    find(&stages, StageKind::Data).context("the filter needs the data stage")?;
                let from = sampled.map(|i| &stages[i]);
                let mut st = filter::plan(f, data, from, workdir, &resolve)?;
                st.name = named("filter", r);
                st.deps.push(("data", data.name.clone()));
                if let Some(i) = sampled {
                    st.deps.push(("completions", stages[i].name.clone()));
                }
                stages.push(st);
            }
            if let Some(t) = &cfg.train {
                let filter = stages.last().filter(|s| s.kind == StageKind::Filter);
                let filter = filter.context("the train stage needs the filter stage")?;
                let configured = t.model.as_deref().context("train.model is unresolved")?;
                let (model, mf) = start(configured, &stages)?;
                let mut st = train::plan(t, filter, workdir, &mf)?;
                st.name = named("train", r);
                st.deps.push(("sft", filter.name.clone()));
                st.model = Some(model);
                prev = Some((
                    st.model_input().location,
                    ModelFacts {
                        input: st.model_input(),
                        ..mf
                    },
                ));
                stages.push(st);
            }
        }
        if let Some(e) = &cfg.eval {
            let base = facts(&e.base_model)?;
            let trained: Vec<&PlannedStage> = stages
                .iter()
                .filter(|s| s.kind == StageKind::Train)
                .collect();
            let mut st = eval::plan(&e.settings, &base, &e.sets, &trained, workdir, &resolve)?;
            st.model = Some(model_path(&stages, &e.base_model));
            stages.push(st);
        }
        if stages.is_empty() {
            bail!(
                "{} configures no stage: add a [data] section (see pipelines/reference.toml)",
                cfg.origin
            );
        }
        Ok(Plan {
            workdir: workdir.to_path_buf(),
            stages,
        })
    }

    /// The stage `stage` reads in `role`.
    pub fn dep(&self, stage: &PlannedStage, role: &str) -> Result<&PlannedStage> {
        let name = stage
            .deps
            .iter()
            .find(|(r, _)| *r == role)
            .map(|(_, n)| n.as_str())
            .with_context(|| format!("stage {} has no `{role}` input", stage.name))?;
        self.get(name)
            .with_context(|| format!("stage {} reads {name}, which is not planned", stage.name))
    }

    pub fn get(&self, name: &str) -> Option<&PlannedStage> {
        self.stages.iter().find(|s| s.name == name)
    }
}

/// The first planned stage of `kind`.
fn find(stages: &[PlannedStage], kind: StageKind) -> Option<&PlannedStage> {
    stages.iter().find(|s| s.kind == kind)
}

/// Where a model named in the config lives: the pretrain stage's output folder for
/// `@pretrain`, else the name itself (a folder or hub id).
fn model_path(stages: &[PlannedStage], model: &str) -> String {
    match find(stages, StageKind::Pretrain).filter(|_| model == PRETRAINED) {
        Some(s) => s.model_input().location,
        None => model.to_string(),
    }
}

impl PlannedStage {
    /// A stage with no dependencies and no model yet: the fields every `plan` fills.
    pub fn new(
        kind: StageKind,
        workdir: &Path,
        code_version: u32,
        config: serde_json::Value,
        inputs: Vec<InputRef>,
    ) -> PlannedStage {
        let key = stage_key(kind.as_str(), code_version, &config, &inputs);
        PlannedStage {
            name: kind.to_string(),
            kind,
            deps: Vec::new(),
            model: None,
            dir: store::stage_dir(workdir, kind.as_str(), &key),
            key,
            code_version,
            config,
            inputs,
            files: Vec::new(),
            estimate: Estimate::default(),
        }
    }

    /// This stage's model folder (pretrain and train stages) as a model input of later stages:
    /// fingerprinted by this stage's key, since the folder does not exist yet at planning.
    pub fn model_input(&self) -> InputRef {
        InputRef {
            name: "model".into(),
            location: self.dir.join(MODEL_DIR).display().to_string(),
            hash: self.key.clone(),
        }
    }
}

/// Trains `model` on the SFT rows in `data` into the stage dir's `model/` (state in
/// `train_state/`, resuming from its newest checkpoint); returns the summary and the model's
/// files as outputs. The pretrain stage trains through here too.
pub(crate) fn train_into(
    stage: &PlannedStage,
    settings: crate::train::settings::TrainSettings,
    model: String,
    data: PathBuf,
) -> Result<(crate::train::trainer::TrainSummary, Vec<OutputFile>)> {
    let job = crate::train::trainer::TrainJob {
        settings,
        model,
        data,
        output: stage.dir.join(MODEL_DIR),
        state_dir: stage.dir.join(TRAIN_STATE_DIR),
        stop_after: None,
        progress_file: Some(stage.dir.join(store::PROGRESS)),
    };
    let summary = crate::train::trainer::run(&job)?;
    summary.print(&job.output);
    let mut files: Vec<_> = std::fs::read_dir(&job.output)
        .with_context(|| format!("cannot read {}", job.output.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let outputs = files
        .iter()
        .map(|f| output_file(&stage.dir, f, 0))
        .collect::<Result<_>>()?;
    Ok((summary, outputs))
}

/// The key of a stage: a hash over everything that determines its output. File locations are
/// left out (their content hashes are inputs), so a moved file or another spelling of its path
/// keeps the cache.
pub fn stage_key(
    name: &str,
    code_version: u32,
    config: &serde_json::Value,
    inputs: &[InputRef],
) -> String {
    let hashes: Vec<_> = inputs.iter().map(|i| (&i.name, &i.hash)).collect();
    store::hash_json(&serde_json::json!({
        "stage": name,
        "code_version": code_version,
        "config": without_locations(config),
        "inputs": hashes,
    }))
}

fn without_locations(v: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| k.as_str() != "location")
                .map(|(k, v)| (k.clone(), without_locations(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_locations).collect()),
        other => other.clone(),
    }
}

/// The verifier's source, compiled in: stages whose output depends on it take this as an input,
/// so any change to the verifier re-runs them.
const VERIFIER_SOURCES: [&str; 5] = [
    include_str!("../verify/mod.rs"),
    include_str!("../verify/extract.rs"),
    include_str!("../verify/normalize.rs"),
    include_str!("../verify/equiv.rs"),
    include_str!("../verify/expr.rs"),
];

/// The verifier as a stage input.
pub fn verifier_input() -> InputRef {
    InputRef {
        name: "verifier".into(),
        location: "built in".into(),
        hash: store::hash_json(&serde_json::json!(VERIFIER_SOURCES)),
    }
}

/// How planning finds its inputs. A model: its checkpoint (a hub id is downloaded when online),
/// or, in a `preflight` plan when the checkpoint cannot be had, the built-in card of a
/// well-known hub id ([`crate::model::cards`]): its config, and weights of its dtype's size. A
/// data file: its local path or hub file (downloaded when online), or, in a `preflight` plan
/// when a hub file cannot be had, a provisional input named by its location. Provisional stage
/// keys change once the real files are fingerprinted; a run never plans with them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Resolve {
    pub preflight: bool,
}

/// The end of a provisional input's location (see [`Resolve`]).
pub const NOT_DOWNLOADED: &str = "(not downloaded: planned)";

/// A data location's files as stage inputs named `<name>#i`, each with its path and size;
/// `None` for the path of a provisional hub input (see [`Resolve`]).
pub type LocationInputs = Vec<(InputRef, Option<PathBuf>, u64)>;

/// What planning needs of a model.
#[derive(Debug, Clone)]
pub struct ModelFacts {
    pub config: crate::model::ModelConfig,
    pub weight_bytes: u64,
    pub input: InputRef,
}

impl Resolve {
    /// The files of `location` as inputs named `<name>#i`; `what` names it in errors.
    pub fn location(
        &self,
        name: &str,
        what: &str,
        location: &crate::data::source::Location,
    ) -> Result<LocationInputs> {
        use crate::data::source::Location;
        match crate::data::hub::resolve(location) {
            Ok(files) => files
                .into_iter()
                .enumerate()
                .map(|(i, path)| {
                    let (input, bytes) = file_input(&format!("{name}#{i}"), &path)?;
                    Ok((input, Some(path), bytes))
                })
                .collect(),
            Err(_) if self.preflight && matches!(location, Location::Hub { .. }) => {
                let at = location.describe();
                Ok(vec![(
                    InputRef {
                        name: format!("{name}#0"),
                        location: format!("{at} {NOT_DOWNLOADED}"),
                        hash: store::hash_json(&serde_json::json!(["hub", at])),
                    },
                    None,
                    0,
                )])
            }
            Err(e) => Err(e.context(what.to_string())),
        }
    }

    pub fn facts(&self, model: &str) -> Result<ModelFacts> {
        let err = match crate::model::Checkpoint::open(model) {
            Ok(ck) => {
                let weight_bytes = ck
                    .weights
                    .iter()
                    .filter_map(|w| std::fs::metadata(w).ok())
                    .map(|m| m.len())
                    .sum();
                return Ok(ModelFacts {
                    input: checkpoint_input(&ck)?,
                    config: ck.config,
                    weight_bytes,
                });
            }
            Err(e) => e,
        };
        match (self.preflight, crate::model::cards::card(model)) {
            (true, Some(config)) => {
                let config = config?;
                let bytes = crate::train::checkpoint::config_dtype(&config).size_in_bytes() as u64;
                Ok(ModelFacts {
                    weight_bytes: config.num_params() as u64 * bytes,
                    config,
                    input: InputRef {
                        name: "model".into(),
                        location: format!("{model} (built-in card: not downloaded)"),
                        hash: store::hash_json(&serde_json::json!(["card", model])),
                    },
                })
            }
            _ => Err(err),
        }
    }
}

/// A checkpoint folder as a stage input: the content digest of every file that defines it
/// (weights included; memoised, so an unchanged folder is not read again).
pub fn model_input(model: &str) -> Result<InputRef> {
    checkpoint_input(&crate::model::Checkpoint::open(model)?)
}

fn checkpoint_input(ck: &crate::model::Checkpoint) -> Result<InputRef> {
    Ok(InputRef {
        name: "model".into(),
        location: ck.dir.display().to_string(),
        hash: ck.digest()?.hex,
    })
}

/// A file input: its content hash and size.
pub fn file_input(name: &str, path: &Path) -> Result<(InputRef, u64)> {
    let hash = store::hash_file(path)?;
    let bytes = std::fs::metadata(path)?.len();
    Ok((
        InputRef {
            name: name.to_string(),
            location: path.display().to_string(),
            hash,
        },
        bytes,
    ))
}

/// The `plan.json` that `status` reads.
#[derive(Debug, Serialize, Deserialize)]
pub struct PlanRecord {
    pub config: String,
    pub stages: Vec<PlanRecordStage>,
    /// The time and cost estimate of the stages this run had to do ([`cost`]).
    #[serde(default)]
    pub estimates: Vec<cost::StageCost>,
    /// `run.gpu_hour_price`, for the report.
    #[serde(default)]
    pub gpu_hour_price: Option<f64>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct PlanRecordStage {
    pub name: String,
    /// A [`StageKind`]'s name (older plans: the stage's name).
    #[serde(default)]
    pub kind: String,
    pub key: String,
    /// The stage folder's name under `<workdir>/stages/`.
    pub dir: String,
}

/// Which stages `pipeline run` should bring up to date.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    All,
    Stage(String),
}

/// The log file each stage writes in its folder (appended across resumes).
pub const STAGE_LOG: &str = "stage.log";

/// Runs the plan: prints it, then runs every stage up to `target` that has no manifest.
/// `force` re-runs the named stage and every stage after it.
///
/// With `shard = Some((i, n))` (one node of a Slurm array or a Kubernetes indexed job), the run
/// brings the stages before the first sample stage that is not done up to date (waiting for the
/// work dir while another process holds it, so they run once), then samples shard `i` of `n`
/// of that stage as a committed part of it and stops: a later run without a shard joins the
/// parts and goes on. Returns whether the plan is done up to `target` (a shard's run is not).
pub fn run(
    cfg: &Config,
    target: &Target,
    force: &[String],
    shard: Option<(usize, usize)>,
) -> Result<bool> {
    if shard.is_some() && !force.is_empty() {
        bail!("--force cannot be used by a shard's run: force the stage in a run without a shard");
    }
    let wd = match shard {
        Some(_) => WorkDir::lock_waiting(&cfg.workdir)?,
        None => WorkDir::lock(&cfg.workdir)?,
    };
    store::clear_trash(&wd.root)?;
    let plan = Plan::build(cfg, &wd.root)?;
    let names = || {
        plan.stages
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    for f in force {
        if StageKind::parse(f).is_none() && plan.get(f).is_none() {
            bail!("--force {f}: no such stage (stages: {})", names());
        }
    }
    // a kind names all its rounds: run up to the last, force from the first
    let is = |s: &PlannedStage, x: &str| s.name == x || s.kind.as_str() == x;
    let mut last = match target {
        Target::All => plan.stages.len(),
        Target::Stage(s) => match plan.stages.iter().rposition(|p| is(p, s)) {
            Some(i) => i + 1,
            None => bail!(
                "stage `{s}` is not in {} (its stages: {})",
                cfg.origin,
                names()
            ),
        },
    };
    if let Some((i, n)) = shard {
        // a shard's run never goes past the last sample stage
        match plan
            .stages
            .iter()
            .rposition(|p| p.kind == StageKind::Sample)
        {
            Some(k) => last = last.min(k + 1),
            None => bail!(
                "shard {i}/{n}: {} has no sample stage to shard (only sampling is sharded)",
                cfg.origin
            ),
        }
    }
    for f in force {
        if !plan.stages.iter().any(|s| is(s, f)) {
            bail!("--force {f}: stage `{f}` is not in {}", cfg.origin);
        }
    }
    let first_forced = plan
        .stages
        .iter()
        .position(|s| force.iter().any(|f| is(s, f)));
    // GPU stages: estimated for an H100 unless this machine has a known GPU (preflight --gpu
    // names another)
    let estimates = cost::estimate(&plan, crate::train::memory::local_gpu(), cfg.gpu_hour_price);
    store::write_json_atomic(
        &wd.root.join(store::PLAN),
        &PlanRecord {
            estimates: estimates.clone(),
            gpu_hour_price: cfg.gpu_hour_price,
            config: cfg.origin.clone(),
            stages: plan
                .stages
                .iter()
                .map(|s| PlanRecordStage {
                    name: s.name.clone(),
                    kind: s.kind.to_string(),
                    key: s.key.clone(),
                    dir: s
                        .dir
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                })
                .collect(),
        },
    )?;
    print_plan(cfg, &plan, last, first_forced)?;
    if !estimates.is_empty() {
        println!("estimated time and cost (assumptions in each row; `pipeline preflight`):");
        for l in cost::table(&estimates, cfg.gpu_hour_price) {
            println!("  {l}");
        }
    }
    let total = Instant::now();
    for (i, stage) in plan.stages.iter().enumerate().take(last) {
        let forced = first_forced.is_some_and(|f| i >= f);
        if forced && stage.dir.exists() {
            // shards sample without the work dir's lock: never pull their folder away
            let busy = sample::shards_running(&stage.dir)?;
            if !busy.is_empty() {
                bail!(
                    "--force {}: shard(s) {} of it are being sampled now; stop them first",
                    stage.name,
                    busy.join(", ")
                );
            }
            store::discard_dir(&stage.dir)?;
        }
        if let StageState::Done(m) = stage_state(&stage.dir)? {
            println!(
                "--> {} cached ({} rows, {})",
                stage.name,
                m.rows,
                crate::bytes::format_bytes(m.bytes())
            );
            continue;
        }
        // A manifest whose outputs are damaged no longer marks the stage done.
        let stale = stage.dir.join(store::MANIFEST);
        if stale.exists() {
            std::fs::remove_file(&stale)
                .with_context(|| format!("cannot remove {}", stale.display()))?;
        }
        if let (Some(sh), StageKind::Sample) = (shard, stage.kind) {
            // the shards sample side by side: release the work dir, hold the shard's own lock
            drop(wd);
            let s = cfg.sample.as_ref().context("no [sample] section")?;
            let _log = crate::logging::stage_log(&sample::shard_dir(stage, sh).join(STAGE_LOG))?;
            sample::run_shard(s, &plan, stage, sh)?;
            let (_, present, n) = sample::shard_summary(&stage.dir).unwrap_or_default();
            println!(
                "shard {}/{} of {} done ({present} of {n} shards committed); a run without a \
                 shard joins them and goes on",
                sh.0, sh.1, stage.name
            );
            return Ok(false);
        }
        run_stage(cfg, &plan, stage)?;
    }
    if let Some((i, n)) = shard {
        println!("shard {i}/{n}: nothing to sample, the sample stages are done");
        return Ok(false);
    }
    println!(
        "all done in {:.1}s; work dir {}",
        total.elapsed().as_secs_f64(),
        wd.root.display()
    );
    Ok(true)
}

fn print_plan(cfg: &Config, plan: &Plan, last: usize, first_forced: Option<usize>) -> Result<()> {
    println!(
        "plan for {} (work dir {}):",
        cfg.origin,
        plan.workdir.display()
    );
    for (i, s) in plan.stages.iter().enumerate() {
        let state = if i >= last {
            "not requested".to_string()
        } else if first_forced.is_some_and(|f| i >= f) {
            "forced: will run".to_string()
        } else {
            match stage_state(&s.dir)? {
                StageState::Done(_) => "cache hit".to_string(),
                StageState::Partial(Some(p)) => format!(
                    "partial ({} of {} {}): will resume",
                    p.done,
                    p.total.map(|t| t.to_string()).unwrap_or("?".into()),
                    p.unit
                ),
                StageState::Partial(None) => "partial: will resume".to_string(),
                StageState::NotStarted => "will run".to_string(),
            }
        };
        let inputs: Vec<String> = s
            .inputs
            .iter()
            .map(|i| format!("{}={}", i.name, i.location))
            .collect();
        println!(
            "  {:<11} {}  {:<30} inputs: {}",
            s.name,
            s.key.get(..12).unwrap_or(&s.key),
            state,
            inputs.join(", ")
        );
    }
    Ok(())
}

fn run_stage(cfg: &Config, plan: &Plan, stage: &PlannedStage) -> Result<()> {
    std::fs::create_dir_all(&stage.dir)
        .with_context(|| format!("cannot create {}", stage.dir.display()))?;
    let _log = crate::logging::stage_log(&stage.dir.join(STAGE_LOG))?;
    tracing::info!(
        "==> {} -> {} (pid {} on {})",
        stage.name,
        stage.dir.display(),
        std::process::id(),
        crate::machine::hostname()
    );
    match run_logged(cfg, plan, stage) {
        Ok(()) => Ok(()),
        Err(e) => {
            // the stage's log ends with why it stopped (main prints it on stderr)
            tracing::error!(target: "selfdistill::file_only", "{} failed: {e:#}", stage.name);
            Err(e)
        }
    }
}

fn run_logged(cfg: &Config, plan: &Plan, stage: &PlannedStage) -> Result<()> {
    let t0 = Instant::now();
    let out = match stage.kind {
        StageKind::Data => data::run(cfg.data.as_ref().context("no [data] section")?, stage)?,
        StageKind::Pretrain => pretrain::run(
            cfg.pretrain.as_ref().context("no [pretrain] section")?,
            stage,
        )?,
        StageKind::Sample => sample::run(
            cfg.sample.as_ref().context("no [sample] section")?,
            plan,
            stage,
        )?,
        StageKind::Filter => filter::run(
            cfg.filter.as_ref().context("no [filter] section")?,
            cfg,
            plan,
            stage,
        )?,
        StageKind::Train => train::run(
            cfg.train.as_ref().context("no [train] section")?,
            plan,
            stage,
        )?,
        StageKind::Eval => {
            let e = cfg.eval.as_ref().context("no [eval] section")?;
            eval::run(&e.settings, &e.base_model, &e.sets, plan, stage)?
        }
    };
    let wall_seconds = t0.elapsed().as_secs_f64();
    let manifest = Manifest {
        stage: stage.name.clone(),
        key: stage.key.clone(),
        code_version: stage.code_version,
        config: stage.config.clone(),
        inputs: stage.inputs.clone(),
        outputs: out.outputs,
        counts: out.counts,
        rows: out.rows,
        wall_seconds,
        finished_unix: store::now_unix(),
    };
    crate::fault::point(&format!("{}.before_manifest", stage.name));
    store::write_json_atomic(&stage.dir.join(store::MANIFEST), &manifest)?;
    tracing::info!(
        "<-- {} done: {} rows, {} in {:.2}s",
        stage.name,
        manifest.rows,
        crate::bytes::format_bytes(manifest.bytes()),
        wall_seconds
    );
    Ok(())
}

/// Describes an output file for a manifest.
pub fn output_file(dir: &Path, path: &Path, rows: u64) -> Result<OutputFile> {
    Ok(OutputFile {
        path: path.strip_prefix(dir).unwrap_or(path).display().to_string(),
        bytes: std::fs::metadata(path)
            .with_context(|| format!("missing output {}", path.display()))?
            .len(),
        rows,
    })
}
