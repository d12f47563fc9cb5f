//! The sample stage: samples the data stage's problems with the `[sample]` settings and writes
//! `completions.parquet` (graded against the problems' gold answers).
//!
//! Resumes through the sampling job's committed parts (`completions.parquet.parts/` in the stage
//! dir). The key covers the settings, the problems (the data stage's key) and the checkpoint's
//! config, tokenizer and weight file sizes (hashing gigabytes of weights at every plan would cost
//! minutes; a changed checkpoint under the same name and sizes is not detected). Knows nothing of
//! the filter.
//!
//! Sharded (one process per node of a Slurm array or Kubernetes indexed job, all sharing the work
//! dir): shard `i` of `n` samples its problems into `shards/<i>-of-<n>/` (resumable as above) and
//! commits `shard.json` last; the stage's run without a shard then joins every shard's file, in
//! the problems' order, into `completions.parquet` (refusing a missing shard, or shards sampled
//! with other settings) and adds their counts.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::{output_file, Counts, Estimate, Plan, PlannedStage, StageOutput};
use crate::data::schema::{read_problems, Problem};
use crate::jobs::sample::job::JobSummary;
use crate::jobs::sample::rationalize::{self, Rationalize, HINTED, RATIONALIZED};
use crate::jobs::sample::run::{JobSpec, Loaded};
use crate::jobs::sample::settings::SampleSettings;
use crate::jobs::sample::shard::{in_shard, merge_ordered};
use crate::store::{self, InputRef};

/// The folder of the shards' parts in the stage dir.
pub const SHARDS: &str = "shards";
/// Written last in a shard's folder: the shard is committed.
pub const SHARD_DONE: &str = "shard.json";

/// Bump when the output for the same inputs changes.
pub const CODE_VERSION: u32 = 1;
/// The dependency role of the round before's sample stage (`run.resample_below`).
pub const PREVIOUS: &str = "previous";
/// The key of the threshold in the stage's config.
const RESAMPLE_BELOW: &str = "resample_below";
/// The key of `[rationalize]` in the stage's config.
const RATIONALIZE: &str = "rationalize";

/// The stage's `[rationalize]`, when it rationalizes.
fn rationalize_of(stage: &PlannedStage) -> Result<Option<Rationalize>> {
    stage
        .config
        .get(RATIONALIZE)
        .map(|v| serde_json::from_value(v.clone()).context("the stage's [rationalize]"))
        .transpose()
}

/// The file of the stage's rationalized rows (STaR), when it rationalizes: the filter reads it
/// beside the completions.
pub fn rationalized_file(stage: &PlannedStage) -> Option<PathBuf> {
    stage
        .config
        .get(RATIONALIZE)
        .map(|_| stage.dir.join(RATIONALIZED))
}

/// The stage's problems: the data stage's, less (with `run.resample_below`) those the round
/// before solved in at least that share of their samples; and how many were left out.
fn stage_problems(plan: &Plan, stage: &PlannedStage) -> Result<(Vec<Problem>, u64)> {
    let data = plan.dep(stage, "data")?;
    let mut problems = read_problems(&data.dir.join(super::PROBLEMS))?;
    let Some(below) = stage.config.get(RESAMPLE_BELOW).and_then(|v| v.as_f64()) else {
        return Ok((problems, 0));
    };
    let prev = plan.dep(stage, PREVIOUS)?;
    let rows = crate::data::schema::read_completions(&prev.dir.join(super::COMPLETIONS))?;
    let rates = crate::data::schema::pass_rates(&rows);
    let before = problems.len();
    problems.retain(|p| match rates.get(p.problem_id.as_str()) {
        Some((n, c)) if *n > 0 => (*c as f64) / (*n as f64) < below,
        _ => true,
    });
    let skipped = (before - problems.len()) as u64;
    tracing::info!(
        "    resample: {} of {before} problems ({skipped} solved in at least {:.0}% of their \
         samples by {} are left out)",
        problems.len(),
        100.0 * below,
        prev.name
    );
    Ok((problems, skipped))
}

/// `previous`: with `run.resample_below`, the round before's sample stage and the threshold:
/// this stage samples only the problems that one solved in less than that share of samples.
/// `rationalize`: `[rationalize]`, a second pass over the problems left unsolved.
pub fn plan(
    s: &SampleSettings,
    data: &PlannedStage,
    workdir: &Path,
    facts: &super::ModelFacts,
    previous: Option<(&PlannedStage, f64)>,
    rationalize: Option<&Rationalize>,
) -> Result<PlannedStage> {
    let model = facts.input.clone();
    let memory_bytes =
        crate::jobs::sample::memory::host_memory_estimate(s, &facts.config, facts.weight_bytes)?;
    let mut inputs = vec![
        InputRef {
            name: "problems".into(),
            location: data.dir.display().to_string(),
            hash: data.key.clone(),
        },
        model,
        super::verifier_input(),
    ];
    let mut config = serde_json::to_value(s)?;
    // a stage that samples every problem keeps the key it always had
    if let Some((p, below)) = previous {
        inputs.push(InputRef {
            name: PREVIOUS.into(),
            location: p.dir.display().to_string(),
            hash: p.key.clone(),
        });
        config[RESAMPLE_BELOW] = serde_json::json!(below);
    }
    if let Some(r) = rationalize {
        config[RATIONALIZE] = serde_json::to_value(r)?;
    }
    // at most every problem is sampled again with the hint: its rows, as drawn and re-prompted
    let disk_share = 1.0
        + rationalize.map_or(0.0, |r| {
            2.0 * r.n.unwrap_or(s.params.n) as f64 / s.params.n.max(1) as f64
        });
    let mut st = PlannedStage::new(
        super::StageKind::Sample,
        workdir,
        CODE_VERSION,
        config,
        inputs,
    );
    let expected = super::expected_completion_tokens(s.params.max_new_tokens);
    let rows = data.estimate.rows.map(|p| p * s.params.n as u64);
    st.estimate = Estimate {
        // the committed parts and, at the join, the output beside them
        disk_bytes: (disk_share
            * (2 * rows.map_or(64 << 20, |r| {
                r * super::completion_row_bytes(
                    expected,
                    facts.config.vocab_size,
                    s.params.logprobs,
                )
            })) as f64) as u64,
        memory_bytes,
        gpu_bytes: crate::jobs::sample::memory::gpu_memory_estimate(s, &facts.config)?,
        rows,
        row_tokens: Some(
            data.estimate
                .row_tokens
                .map_or(super::ASSUMED_PROMPT_TOKENS, |t| {
                    t + super::ASSUMED_TEMPLATE_TOKENS
                })
                + expected,
        ),
        cards: data.estimate.cards.clone(),
        work: rows.map(|r| super::Work {
            tokens: r * expected,
            train: false,
            params: facts.config.num_params() as u64,
            device: s.device,
            batch: s.max_num_seqs,
            basis: format!(
                "{} problems x n {} x {expected} tokens (half of max_new_tokens, assumed){}",
                r / s.params.n.max(1) as u64,
                s.params.n,
                if rationalize.is_some() {
                    ", and the hinted pass over the problems left unsolved (not estimated)"
                } else {
                    ""
                }
            ),
        }),
    };
    Ok(st)
}

/// What a committed shard reports to the join.
#[derive(Debug, Serialize, Deserialize)]
pub struct ShardRecord {
    pub shard: (usize, usize),
    pub key: String,
    pub counts: Counts,
    pub rows: u64,
    pub wall_seconds: f64,
    pub host: String,
}

pub fn shard_dir(stage: &PlannedStage, (i, n): (usize, usize)) -> PathBuf {
    stage.dir.join(SHARDS).join(format!("{i}-of-{n}"))
}

/// The manifest count of the tokens the stage's last process generated (its throughput with
/// its wall time); `generated_tokens` counts the output's.
pub const COMPUTED_GENERATED_TOKENS: &str = "generated_tokens_this_process";

/// The tokens a done sample stage's last process (or its shards) generated in its wall time:
/// [`COMPUTED_GENERATED_TOKENS`], or `generated_tokens` in manifests of older versions.
pub fn computed_generated_tokens(m: &store::Manifest) -> u64 {
    let count = |k: &str| m.counts.iter().find(|c| c.0 == k).map(|c| c.1);
    count(COMPUTED_GENERATED_TOKENS)
        .or_else(|| count("generated_tokens"))
        .unwrap_or(0)
}

fn counts(summary: &JobSummary) -> Counts {
    let mut counts = vec![
        ("problems".to_string(), summary.problems as u64),
        // the output's, resumed parts included (the tokens are this process's compute)
        ("samples".to_string(), summary.output.rows),
        ("correct".to_string(), summary.output.correct),
        // the output's tokens (a resumed run's earlier processes included), and this process's
        // compute, which its wall time is the time of
        ("prompt_tokens".to_string(), summary.output.prompt_tokens),
        (
            "generated_tokens".to_string(),
            summary.output.generated_tokens,
        ),
        (
            COMPUTED_GENERATED_TOKENS.to_string(),
            summary.generated_tokens,
        ),
    ];
    // mistral.rs does not say how often it preempted: no count rather than a zero.
    if let Some(p) = summary.preemptions {
        counts.push(("preemptions".to_string(), p));
    }
    counts.push(("samples_saved".to_string(), summary.samples_saved));
    counts
}

fn settings_for(s: &SampleSettings, stage: &PlannedStage) -> SampleSettings {
    let mut s = s.clone();
    if let Some(m) = &stage.model {
        s.model = m.clone();
    }
    s
}

/// Samples shard `shard` of the stage's problems into its folder and commits it.
pub fn run_shard(
    s: &SampleSettings,
    plan: &Plan,
    stage: &PlannedStage,
    shard: (usize, usize),
) -> Result<()> {
    let dir = shard_dir(stage, shard);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let lock = dir.join(".lock");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock)
        .with_context(|| format!("cannot open {}", lock.display()))?;
    match f.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => bail!(
            "shard {}/{} of {} is being sampled by another process (lock {})",
            shard.0,
            shard.1,
            stage.name,
            lock.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| {
                format!(
                    "cannot lock {} (shards need file locks that work across the nodes: on \
                     Lustre, mount with -o flock)",
                    lock.display()
                )
            })
        }
    }
    if dir.join(SHARD_DONE).is_file() {
        tracing::info!(
            "shard {}/{} of {} was already committed",
            shard.0,
            shard.1,
            stage.name
        );
        return Ok(());
    }
    let (mut problems, _) = stage_problems(plan, stage)?;
    let set = crate::jobs::sample::parts::problems_digest(&problems);
    problems.retain(|p| in_shard(&p.problem_id, shard));
    tracing::info!(
        "==> {} shard {}/{}: {} problems -> {} (pid {} on {})",
        stage.name,
        shard.0,
        shard.1,
        problems.len(),
        dir.display(),
        std::process::id(),
        crate::machine::hostname()
    );
    let out = dir.join(super::COMPLETIONS);
    let target = crate::progress::Target::new(
        format!("{} {}/{}", stage.name, shard.0, shard.1),
        Some(dir.join(store::PROGRESS)),
    );
    let t0 = std::time::Instant::now();
    let settings = settings_for(s, stage);
    // the passes share the loaded model
    let loaded = Loaded::open(&settings)?;
    let spec = JobSpec {
        settings: &settings,
        problems: &problems,
        shard,
        problem_set: Some(&set),
        output: &out,
        progress: &target,
    };
    let summary = loaded.run(&[spec], &target)?.remove(0);
    summary.print(&out);
    let mut counts = counts(&summary);
    if let Some(r) = rationalize_of(stage)? {
        let rs = rationalize::run(
            &loaded, &settings, &r, &problems, &out, &dir, shard, &target,
        )?;
        counts.extend(rs.counts());
    }
    crate::fault::point("sample.before_shard_commit");
    store::write_json_atomic(
        &dir.join(SHARD_DONE),
        &ShardRecord {
            shard,
            key: stage.key.clone(),
            counts,
            rows: summary.output.rows,
            wall_seconds: t0.elapsed().as_secs_f64(),
            host: crate::machine::hostname(),
        },
    )?;
    Ok(())
}

/// The shard folders of a stage: `(i, n, folder)`, sorted.
fn shard_folders(stage_dir: &Path) -> Result<Vec<(usize, usize, PathBuf)>> {
    let root = stage_dir.join(SHARDS);
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let parsed = name
            .split_once("-of-")
            .and_then(|(i, n)| Some((i.parse().ok()?, n.parse().ok()?)));
        match parsed {
            Some((i, n)) if e.path().is_dir() => out.push((i, n, e.path())),
            _ => {}
        }
    }
    out.sort();
    Ok(out)
}

/// The shards of a stage that a process is sampling now (their locks are held).
pub fn shards_running(stage_dir: &Path) -> Result<Vec<String>> {
    let mut busy = Vec::new();
    for (i, n, dir) in shard_folders(stage_dir)? {
        let Ok(f) = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join(".lock"))
        else {
            continue;
        };
        if let Err(std::fs::TryLockError::WouldBlock) = f.try_lock() {
            busy.push(format!("{i}/{n}"));
        }
    }
    Ok(busy)
}

/// The committed shards of a sharded stage folder and how many there should be (for `status`):
/// `None` when the stage was not sharded.
pub fn shard_summary(stage_dir: &Path) -> Option<(Vec<PathBuf>, usize, usize)> {
    let folders = shard_folders(stage_dir).ok()?;
    let n = folders.iter().map(|(_, n, _)| *n).max()?;
    let dirs: Vec<PathBuf> = folders
        .into_iter()
        .filter(|(_, m, _)| *m == n)
        .map(|(_, _, d)| d)
        .collect();
    let done = dirs.iter().filter(|d| d.join(SHARD_DONE).is_file()).count();
    Some((dirs, done, n))
}

pub fn run(s: &SampleSettings, plan: &Plan, stage: &PlannedStage) -> Result<StageOutput> {
    let (problems, skipped) = stage_problems(plan, stage)?;
    let out = stage.dir.join(super::COMPLETIONS);
    let resampled = stage.config.get(RESAMPLE_BELOW).is_some();
    if !shard_folders(&stage.dir)?.is_empty() {
        let mut o = join(stage, &problems, &out)?;
        if resampled {
            o.counts.push(("problems_skipped".into(), skipped));
        }
        return Ok(o);
    }
    let target =
        crate::progress::Target::new(stage.name.clone(), Some(stage.dir.join(store::PROGRESS)));
    let settings = settings_for(s, stage);
    // the passes share the loaded model
    let loaded = Loaded::open(&settings)?;
    let spec = JobSpec {
        settings: &settings,
        problems: &problems,
        shard: (0, 1),
        problem_set: None,
        output: &out,
        progress: &target,
    };
    let summary = loaded.run(&[spec], &target)?.remove(0);
    summary.print(&out);
    let mut counts = counts(&summary);
    if resampled {
        counts.push(("problems_skipped".into(), skipped));
    }
    let mut outputs = vec![output_file(&stage.dir, &out, summary.output.rows)?];
    if let Some(r) = rationalize_of(stage)? {
        let rs = rationalize::run(
            &loaded,
            &settings,
            &r,
            &problems,
            &out,
            &stage.dir,
            (0, 1),
            &target,
        )?;
        counts.extend(rs.counts());
        outputs.push(output_file(
            &stage.dir,
            &stage.dir.join(HINTED),
            rs.samples,
        )?);
        outputs.push(output_file(
            &stage.dir,
            &stage.dir.join(RATIONALIZED),
            rs.samples,
        )?);
    }
    Ok(StageOutput {
        outputs,
        counts,
        rows: summary.output.rows,
    })
}

/// Joins the committed shards into the stage's output, in the problems' order.
fn join(
    stage: &PlannedStage,
    problems: &[crate::data::schema::Problem],
    out: &Path,
) -> Result<StageOutput> {
    let folders = shard_folders(&stage.dir)?;
    let mut ns: Vec<usize> = folders.iter().map(|(_, n, _)| *n).collect();
    ns.sort_unstable();
    ns.dedup();
    if ns.len() > 1 {
        bail!(
            "{}: shards of different counts ({}) in {}: run every shard with the same count, \
             and remove the folders of the other",
            stage.name,
            ns.iter()
                .map(|n| format!("of {n}"))
                .collect::<Vec<_>>()
                .join(", "),
            stage.dir.join(SHARDS).display()
        );
    }
    let n = ns[0];
    let mut inputs = Vec::new();
    let mut missing = Vec::new();
    let mut records = Vec::new();
    for i in 0..n {
        let dir = stage.dir.join(SHARDS).join(format!("{i}-of-{n}"));
        match std::fs::read(dir.join(SHARD_DONE)) {
            Ok(bytes) => {
                let r: ShardRecord = serde_json::from_slice(&bytes)
                    .with_context(|| format!("corrupt {}", dir.join(SHARD_DONE).display()))?;
                if r.key != stage.key {
                    bail!(
                        "{} was sampled for another stage key ({}, not {})",
                        dir.display(),
                        r.key,
                        stage.key
                    );
                }
                records.push(r);
                inputs.push(dir.join(super::COMPLETIONS));
            }
            Err(_) => missing.push(i.to_string()),
        }
    }
    if !missing.is_empty() {
        bail!(
            "{}: shard(s) {} of {n} are not committed yet (in {}): run them (`pipeline run \
             sample --shard I/{n}`, or the Slurm / Kubernetes job in deploy/), then run again",
            stage.name,
            missing.join(", "),
            stage.dir.join(SHARDS).display()
        );
    }
    let order: Vec<String> = problems.iter().map(|p| p.problem_id.clone()).collect();
    let rows = merge_ordered(&inputs, out, Some(&order))?;
    let mut outputs = vec![output_file(&stage.dir, out, rows as u64)?];
    if rationalize_of(stage)?.is_some() {
        // each shard rationalized its own problems
        for name in [HINTED, RATIONALIZED] {
            let files: Vec<PathBuf> = inputs.iter().map(|f| f.with_file_name(name)).collect();
            let path = stage.dir.join(name);
            let n = concat_ordered(&files, &path, &order)?;
            outputs.push(output_file(&stage.dir, &path, n)?);
        }
    }
    let mut counts: Counts = Vec::new();
    for r in &records {
        for (name, v) in &r.counts {
            match counts.iter_mut().find(|(n, _)| n == name) {
                Some((_, c)) => *c += v,
                None => counts.push((name.clone(), *v)),
            }
        }
    }
    counts.push(("shards".into(), n as u64));
    counts.push((
        "shard_seconds".into(),
        records.iter().map(|r| r.wall_seconds).sum::<f64>().round() as u64,
    ));
    tracing::info!("joined {n} shards: {rows} rows -> {}", out.display());
    Ok(StageOutput {
        outputs,
        counts,
        rows: rows as u64,
    })
}

/// The graded rows of `files` in one file, in the order of `problem_ids` (then sample index).
fn concat_ordered(files: &[PathBuf], out: &Path, problem_ids: &[String]) -> Result<u64> {
    use crate::data::schema::{read_completions, write_completions};
    let at: std::collections::HashMap<&str, usize> = problem_ids
        .iter()
        .enumerate()
        .map(|(i, p)| (p.as_str(), i))
        .collect();
    let mut rows = Vec::new();
    for f in files {
        rows.extend(read_completions(f)?);
    }
    rows.sort_by_key(|r| {
        (
            at.get(r.problem_id.as_str()).copied().unwrap_or(usize::MAX),
            r.sample_index,
        )
    });
    write_completions(out, &rows, true)
}
