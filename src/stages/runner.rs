//! Running a plan: print it with each stage's state, then run every stage up to the target
//! that has no manifest, in order, each with its own log; the manifest is written last, so a
//! killed stage is resumed, never taken for done. Sharded runs sample their shard and stop.
//!
//! Knows nothing of what a stage computes: each kind's file runs it.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::stage::{stage_state, Plan, PlannedStage, StageKind, StageState};
use super::{cost, data, eval, filter, pretrain, sample, train};
use crate::config::Config;
use crate::store::{self, Manifest, WorkDir};

/// The `plan.json` that `status` reads.
#[derive(Debug, Serialize, Deserialize)]
pub struct PlanRecord {
    pub config: String,
    pub stages: Vec<PlanRecordStage>,
    /// The time and cost estimate of the stages this run had to do ([`cost`]).
    #[serde(default)]
    pub estimates: Vec<cost::StageCost>,
    /// `run.gpu_hour_price` of the GPU this run is on (the H100 assumed without one), for the
    /// report.
    #[serde(default)]
    pub gpu_hour_price: Option<f64>,
    /// The `--set` overrides the run was made with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<String>,
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
    let last = stop_index(cfg, &plan, target, shard, &names())?;
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
    let gpu = crate::train::memory::local_gpu();
    let price = cost::price_for(cfg.gpu_hour_price.as_ref(), gpu);
    let estimates = cost::estimate(&plan, gpu, price);
    write_plan_record(cfg, &wd.root, &plan, &estimates, price)?;
    print_plan(cfg, &plan, last, first_forced)?;
    if !estimates.is_empty() {
        crate::outln!("estimated time and cost (assumptions in each row; `pipeline preflight`):");
        for l in cost::table(&estimates, price) {
            crate::outln!("  {l}");
        }
    }
    // preflight's checks of disk, memory and GPU memory, before the first stage
    super::fit::check_run(cfg, &plan, |i, s| {
        i < last
            && (first_forced.is_some_and(|f| i >= f)
                || !matches!(stage_state(&s.dir), Ok(StageState::Done(_))))
    })?;
    let total = Instant::now();
    for (i, stage) in plan.stages.iter().enumerate().take(last) {
        let forced = first_forced.is_some_and(|f| i >= f);
        if cached_or_cleared(stage, forced)? {
            continue;
        }
        if let (Some(sh), StageKind::Sample) = (shard, stage.kind) {
            // the shards sample side by side: release the work dir, hold the shard's own lock
            drop(wd);
            let s = cfg.sample.as_ref().context("no [sample] section")?;
            let _log = crate::logging::stage_log(&sample::shard_dir(stage, sh).join(STAGE_LOG))?;
            sample::run_shard(s, &plan, stage, sh)?;
            let (_, present, n) = sample::shard_summary(&stage.dir).unwrap_or_default();
            crate::outln!(
                "shard {}/{} of {} done ({present} of {n} shards committed); a run without a \
                 shard joins them and goes on",
                sh.0,
                sh.1,
                stage.name
            );
            return Ok(false);
        }
        check_disk_budget(cfg, &wd.root, stage)?;
        run_stage(cfg, &plan, stage)?;
    }
    if let Some((i, n)) = shard {
        crate::outln!("shard {i}/{n}: nothing to sample, the sample stages are done");
        return Ok(false);
    }
    crate::outln!(
        "all done in {:.1}s; work dir {}",
        total.elapsed().as_secs_f64(),
        wd.root.display()
    );
    Ok(true)
}

/// The index past the last stage a run of `target` runs (a shard's run stops at the last sample
/// stage). `names`: the plan's stages, for the error.
fn stop_index(
    cfg: &Config,
    plan: &Plan,
    target: &Target,
    shard: Option<(usize, usize)>,
    names: &str,
) -> Result<usize> {
    let is = |s: &PlannedStage, x: &str| s.name == x || s.kind.as_str() == x;
    let mut last = match target {
        Target::All => plan.stages.len(),
        Target::Stage(s) => match plan.stages.iter().rposition(|p| is(p, s)) {
            Some(i) => i + 1,
            None => bail!("stage `{s}` is not in {} (its stages: {names})", cfg.origin),
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
    Ok(last)
}

/// The plan as `pipeline status` and `report` read it: its stages, keys and estimates.
fn write_plan_record(
    cfg: &Config,
    root: &Path,
    plan: &Plan,
    estimates: &[cost::StageCost],
    price: Option<f64>,
) -> Result<()> {
    store::write_json_atomic(
        &root.join(store::PLAN),
        &PlanRecord {
            estimates: estimates.to_vec(),
            gpu_hour_price: price,
            overrides: cfg.overrides.clone(),
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
    Ok(())
}

/// Whether `stage` is done and cached (said so); else its folder made ready to run: discarded
/// when `forced`, and a manifest whose outputs are damaged removed.
fn cached_or_cleared(stage: &PlannedStage, forced: bool) -> Result<bool> {
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
        crate::outln!(
            "--> {} cached ({} rows, {})",
            stage.name,
            m.rows,
            crate::bytes::format_bytes(m.bytes())
        );
        return Ok(true);
    }
    // A manifest whose outputs are damaged no longer marks the stage done.
    let stale = stage.dir.join(store::MANIFEST);
    if stale.exists() {
        std::fs::remove_file(&stale)
            .with_context(|| format!("cannot remove {}", stale.display()))?;
    }
    Ok(false)
}

/// `run.disk_budget` against what the work dir holds now plus what `stage` is estimated to add
/// (less what a partial run of it already wrote): checked before each stage, since the work
/// dir can fill after preflight (earlier stages writing more than estimated, other files).
fn check_disk_budget(cfg: &Config, root: &Path, stage: &PlannedStage) -> Result<()> {
    let Some(budget) = cfg.disk_budget_bytes else {
        return Ok(());
    };
    let held = store::dir_bytes(root);
    let need = stage
        .estimate
        .disk_bytes
        .saturating_sub(store::dir_bytes(&stage.dir));
    if held + need > budget {
        bail!(
            "run.disk_budget = {} in {}: the work dir {} holds {} and the {} stage needs about {} \
             more; raise the budget or free space (`pipeline preflight` prints each stage's \
             estimate)",
            crate::bytes::format_bytes(budget),
            cfg.origin,
            root.display(),
            crate::bytes::format_bytes(held),
            stage.name,
            crate::bytes::format_bytes(need)
        );
    }
    Ok(())
}

fn print_plan(cfg: &Config, plan: &Plan, last: usize, first_forced: Option<usize>) -> Result<()> {
    crate::outln!(
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
        crate::outln!(
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
            tracing::error!(
                target: "selfdistill::file_only",
                "{} failed: {}",
                stage.name,
                crate::logging::error_chain(&e)
            );
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
            cfg,
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
    super::board::write(stage, &manifest)?;
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
