//! `pipeline status`: where a work dir's run stands. Each stage is done, running, stalled,
//! stopped, partial or not started, with how far it got (done / total, rate, ETA and what the
//! stage says about itself, from its `progress.json`), its rows, bytes on disk and wall time; a
//! sharded sample stage adds its shards' progress together. `--watch` redraws every few seconds,
//! `--json` prints the same for scripts.
//!
//! A stage is *stopped* when the process that wrote its progress is gone (checked on this host by
//! pid; on another host it cannot be), and *stalled* when its progress has not moved for
//! `--stall-after` seconds. Reads `plan.json` and every `stages/*` folder; takes no lock, so it
//! works while a run is going. Builds no plan and reads no inputs.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::bytes::format_bytes;
use crate::config::Config;
use crate::progress::fmt_secs;
use crate::stages::{stage_state, PlanRecord, StageState};
use crate::store::{self, dir_bytes, Progress};

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Override a config key, validated like the file: `--set train.lr=2e-5 --set sample.n=16`
    /// (dotted keys; `data.sources.0.limit` for an entry of a list). Without `--workdir` the
    /// run gets a work dir named with its overrides.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Take the work dir from this config (`run.workdir`, or `runs/<name>`).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Redraw every SECS seconds (default 5) until every stage of the last plan is done, or
    /// Ctrl-C.
    #[arg(long, num_args = 0..=1, default_missing_value = "5", value_name = "SECS")]
    pub watch: Option<f64>,
    /// Print the status as JSON (one object; with --watch, one per line).
    #[arg(long)]
    pub json: bool,
    /// Call a running stage stalled when its progress has not moved for this many seconds.
    #[arg(long, default_value_t = 600.0)]
    pub stall_after: f64,
}

/// The whole work dir.
#[derive(Debug, Serialize)]
pub struct Status {
    pub workdir: String,
    /// The config of the last run (from `plan.json`).
    pub config: Option<String>,
    pub stages: Vec<StageStatus>,
    pub now_unix: u64,
}

#[derive(Debug, Serialize)]
pub struct StageStatus {
    pub name: String,
    pub key: String,
    pub dir: String,
    /// `done`, `running`, `stalled`, `stopped`, `shards done` (waiting to be joined), `partial`
    /// or `not started`.
    pub state: String,
    pub in_last_plan: bool,
    pub rows: Option<u64>,
    pub bytes: u64,
    pub wall_seconds: Option<f64>,
    pub progress: Option<Progress>,
    /// Seconds since the progress last moved.
    pub progress_age_seconds: Option<u64>,
    /// Committed shards and the shard count, for a sharded sample stage.
    pub shards: Option<(usize, usize)>,
    /// Why the state is what it is, when that is not obvious.
    pub note: String,
}

pub fn run(a: &StatusArgs) -> Result<()> {
    let cfg = match (&a.config, &a.workdir) {
        (Some(p), w) => Some(super::load_config(Some(p.clone()), w.clone(), &a.set)?),
        (None, Some(_)) => None,
        // the embedded default's work dir, as `run all` with no config
        (None, None) => Some(super::load_config(None, None, &a.set)?),
    };
    show(a, cfg.as_ref())
}

/// The status of the work dir of `cfg` (or `--workdir`).
fn show(a: &StatusArgs, cfg: Option<&Config>) -> Result<()> {
    let root = match (&a.workdir, cfg) {
        (Some(w), _) => w.clone(),
        (None, Some(c)) => c.workdir.clone(),
        (None, None) => bail!("give --workdir DIR or --config FILE"),
    };
    if !root.exists() {
        bail!(
            "work dir {} does not exist (nothing has run there)",
            root.display()
        );
    }
    // a run writes its plan before its first stage; a folder without it or a stage is another
    // folder (a typo, the repository, a model), and an empty table would say "nothing wrong"
    if !root.join(crate::store::PLAN).is_file() && !root.join("stages").is_dir() {
        bail!(
            "{} is not the work dir of a run (no {} and no stages/ in it): give the folder a \
             `pipeline run` wrote, its --workdir or run.workdir",
            root.display(),
            crate::store::PLAN
        );
    }
    loop {
        let st = status(&root, a.stall_after)?;
        if a.json {
            let text = if a.watch.is_some() {
                serde_json::to_string(&st)?
            } else {
                serde_json::to_string_pretty(&st)?
            };
            crate::outln!("{text}");
        } else {
            if a.watch.is_some() {
                // clear the screen and go home, as `watch` does
                crate::out!("\x1b[2J\x1b[H");
            }
            print_status(&st);
        }
        let Some(every) = a.watch else {
            return Ok(());
        };
        let planned: Vec<&StageStatus> = st.stages.iter().filter(|s| s.in_last_plan).collect();
        if !planned.is_empty() && planned.iter().all(|s| s.state == "done") {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_secs_f64(
            every.clamp(0.2, 86400.0),
        ));
    }
}

/// The status of the work dir at `root`.
pub fn status(root: &Path, stall_after: f64) -> Result<Status> {
    let plan_path = root.join(store::PLAN);
    let plan: Option<PlanRecord> = match std::fs::read(&plan_path) {
        Ok(b) => Some(
            serde_json::from_slice(&b)
                .with_context(|| format!("corrupt {}", plan_path.display()))?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", plan_path.display())),
    };
    // the last run's pid, when it ran on this host (`pid@host`; older files: a bare pid)
    let here = crate::machine::hostname();
    let lock_pid = std::fs::read_to_string(root.join(".lock"))
        .ok()
        .and_then(|s| {
            let (pid, host) = s
                .trim()
                .split_once('@')
                .unwrap_or((s.trim(), here.as_str()));
            pid.parse::<u32>().ok().filter(|_| host == here)
        });
    // the pid in the lock file may have been reused by another process since: a lock no
    // process holds means no pipeline is there, whatever runs under that pid now
    let lock_free = store::lock_held(&root.join(".lock")) == Some(false);
    let mut stages = Vec::new();
    let mut listed = HashSet::new();
    if let Some(p) = &plan {
        for s in &p.stages {
            let dir = root.join("stages").join(&s.dir);
            listed.insert(dir.file_name().map(|n| n.to_os_string()));
            stages.push(stage(
                &s.name,
                &s.key,
                &dir,
                true,
                lock_pid,
                lock_free,
                stall_after,
            )?);
        }
    }
    let mut others: Vec<_> = std::fs::read_dir(root.join("stages"))
        .map(|it| it.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    others.sort();
    for dir in others {
        if listed.contains(&dir.file_name().map(|n| n.to_os_string())) {
            continue;
        }
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (name, key) = name.rsplit_once('-').unwrap_or((&name, ""));
        stages.push(stage(
            name,
            key,
            &dir,
            false,
            lock_pid,
            lock_free,
            stall_after,
        )?);
    }
    Ok(Status {
        workdir: root.display().to_string(),
        config: plan.map(|p| p.config),
        stages,
        now_unix: store::now_unix(),
    })
}

/// A sharded stage's shards as read once: (committed, progress) each, the committed count and
/// the shard count.
struct Shards {
    parts: Vec<(bool, Option<Progress>)>,
    done: usize,
    n: usize,
}

impl Shards {
    fn read(dir: &Path) -> Option<Shards> {
        let (dirs, done, n) = crate::stages::sample::shard_summary(dir)?;
        let parts = dirs
            .iter()
            .map(|d| {
                let committed = d.join(crate::stages::sample::SHARD_DONE).is_file();
                (committed, store::read_progress(d))
            })
            .collect();
        Some(Shards { parts, done, n })
    }

    /// The shards' progress added up: counts and rates add up (the rate of the shards still
    /// sampling: a committed or silent shard adds nothing), the newest update counts, and a
    /// shard not started yet has no total (so neither has the sum).
    fn progress(&self) -> Option<Progress> {
        let parts: Vec<&Progress> = self.parts.iter().filter_map(|(_, p)| p.as_ref()).collect();
        let first = parts.first()?;
        let started = parts.len() == self.n;
        let total = parts.iter().map(|p| p.total).sum::<Option<u64>>();
        let done: u64 = parts.iter().map(|p| p.done).sum();
        let now = store::now_unix();
        let rate: f64 = self
            .parts
            .iter()
            .filter(|(committed, _)| !committed)
            .filter_map(|(_, p)| p.as_ref())
            .filter(|p| now.saturating_sub(p.updated_unix) < 60)
            .filter_map(|p| p.rate)
            .sum();
        let live: Vec<&&Progress> = parts.iter().filter(|p| p.pid.is_some()).collect();
        Some(Progress {
            done,
            total: total.filter(|_| started),
            unit: first.unit.clone(),
            rate: (rate > 0.0).then_some(rate),
            eta_seconds: total
                .filter(|_| started && rate > 0.0)
                .map(|t| t.saturating_sub(done) as f64 / rate),
            label: first.label.clone(),
            detail: format!("{} of {} shards reporting", parts.len(), self.n),
            started_unix: parts.iter().map(|p| p.started_unix).min().unwrap_or(0),
            updated_unix: parts.iter().map(|p| p.updated_unix).max().unwrap_or(0),
            // which processes: see the shards' own files
            pid: (live.len() == 1).then(|| live[0].pid).flatten(),
            host: String::new(),
        })
    }

    /// Whether the writers of the shards still to commit are alive: `Some(false)` only when
    /// every one is known gone.
    fn alive(&self) -> Option<bool> {
        let here = crate::machine::hostname();
        let mut any_unknown = false;
        for (_, p) in self.parts.iter().filter(|(committed, _)| !committed) {
            match p {
                Some(Progress {
                    pid: Some(pid),
                    host,
                    ..
                }) if *host == here => {
                    if crate::machine::pid_alive(*pid) {
                        return Some(true);
                    }
                }
                _ => any_unknown = true,
            }
        }
        (!any_unknown).then_some(false)
    }
}

impl StageStatus {
    /// A stage's row before its state is read: its short key and the bytes its folder holds.
    fn new(name: &str, key: &str, dir: &Path, in_last_plan: bool) -> StageStatus {
        StageStatus {
            name: name.into(),
            key: key.get(..12).unwrap_or(key).to_string(),
            dir: dir.display().to_string(),
            state: String::new(),
            in_last_plan,
            rows: None,
            bytes: dir_bytes(dir),
            wall_seconds: None,
            progress: None,
            progress_age_seconds: None,
            shards: None,
            note: String::new(),
        }
    }
}

fn stage(
    name: &str,
    key: &str,
    dir: &Path,
    in_last_plan: bool,
    lock_pid: Option<u32>,
    lock_free: bool,
    stall_after: f64,
) -> Result<StageStatus> {
    let mut st = StageStatus::new(name, key, dir, in_last_plan);
    match stage_state(dir)? {
        StageState::Done(m) => {
            st.state = "done".into();
            st.rows = Some(m.rows);
            st.wall_seconds = Some(m.wall_seconds);
            return Ok(st);
        }
        StageState::NotStarted => {
            st.state = "not started".into();
            return Ok(st);
        }
        StageState::Partial(_) => {}
    }
    let sharded = Shards::read(dir);
    let (progress, shards) = match &sharded {
        Some(sh) => (sh.progress(), Some((sh.done, sh.n))),
        None => (store::read_progress(dir), None),
    };
    st.shards = shards;
    let now = store::now_unix();
    let age = progress
        .as_ref()
        .filter(|p| p.updated_unix > 0)
        .map(|p| now.saturating_sub(p.updated_unix));
    st.progress_age_seconds = age;
    let here = crate::machine::hostname();
    // who wrote the progress, and is it still there
    let (pid, alive) = writer(
        progress.as_ref(),
        sharded.as_ref(),
        &here,
        lock_pid,
        lock_free,
    );
    let host = progress
        .as_ref()
        .map(|p| p.host.clone())
        .filter(|h| !h.is_empty() && *h != here)
        .map(|h| format!(" on {h}"))
        .unwrap_or_default();
    let pid_text = pid.map(|p| format!("pid {p}{host}")).unwrap_or_else(|| {
        if shards.is_some() {
            "every shard's process".into()
        } else {
            "the run".into()
        }
    });
    let stale = age.is_some_and(|a| a as f64 > stall_after);
    if let Some((done, n)) = shards.filter(|(done, n)| done == n) {
        st.state = "shards done".into();
        st.note = format!(
            "all {n} shards are committed ({done} of {n}): a `pipeline run` without a shard \
             joins them and goes on"
        );
        st.progress = progress;
        return Ok(st);
    }
    // a dead writer, but the work dir's lock is held by a live run here: it resumed the stage
    // and has not written its progress yet (loading a model)
    let resumer = lock_pid.filter(|&p| {
        alive == Some(false)
            && Some(p) != pid
            && shards.is_none()
            && !lock_free
            && crate::machine::pid_alive(p)
    });
    if let Some(p) = resumer {
        st.note = format!("resumed by pid {p}; its progress is not written yet");
        st.state = "running".into();
        st.progress = progress;
        return Ok(st);
    }
    let (state, note) = liveness(alive, stale, age, &pid_text, progress.as_ref());
    (st.state, st.note) = (state.into(), note);
    // a stage that ended with an error says which, not only that its process is gone
    if matches!(st.state.as_str(), "stopped" | "partial") {
        if let Some(why) = last_failure(dir) {
            st.state = "failed".into();
            st.note = format!(
                "{why} (log: {}); `pipeline run` retries it",
                dir.join(crate::stages::STAGE_LOG).display()
            );
        }
    }
    st.progress = progress;
    Ok(st)
}

/// Who wrote a partial stage's progress (its pid) and whether it is alive (`None`: cannot tell
/// from here): the shards' processes, the writer on this host (alive while a pipeline holds the
/// work dir, not a reused pid), or the work dir's lock holder.
fn writer(
    progress: Option<&Progress>,
    sharded: Option<&Shards>,
    here: &str,
    lock_pid: Option<u32>,
    lock_free: bool,
) -> (Option<u32>, Option<bool>) {
    match (progress, sharded) {
        (_, Some(sh)) => (progress.and_then(|p| p.pid), sh.alive()),
        (
            Some(Progress {
                pid: Some(pid),
                host,
                ..
            }),
            None,
        ) if host == here => (
            Some(*pid),
            Some(crate::machine::pid_alive(*pid) && !lock_free),
        ),
        (Some(Progress { pid: Some(pid), .. }), None) => (Some(*pid), None),
        _ => (
            lock_pid,
            lock_pid.map(|p| crate::machine::pid_alive(p) && !lock_free),
        ),
    }
}

/// A partial stage's state and note from its writer's liveness (`alive`), whether its progress
/// is `stale` and how old (`age`, seconds), and who wrote it (`pid_text`).
fn liveness(
    alive: Option<bool>,
    stale: bool,
    age: Option<u64>,
    pid_text: &str,
    progress: Option<&Progress>,
) -> (&'static str, String) {
    match alive {
        Some(false) => (
            "stopped",
            format!(
                "{pid_text} is gone{}: `pipeline run` resumes it",
                age.map(|a| format!(", progress last moved {} ago", fmt_secs(a as f64)))
                    .unwrap_or_default()
            ),
        ),
        _ if stale => (
            "stalled",
            format!(
                "no progress for {} ({pid_text}{}): stalled, or dead on a host this machine \
                 cannot check",
                fmt_secs(age.unwrap_or(0) as f64),
                if alive == Some(true) {
                    ", still running"
                } else {
                    ""
                }
            ),
        ),
        Some(true) => ("running", String::new()),
        None if progress.is_some_and(|p| p.pid.is_some()) => (
            "running",
            format!("{pid_text}: cannot check from this host"),
        ),
        None => ("partial", String::new()),
    }
}

/// The error a stage's last attempt ended with: the stage log's last line when it is the
/// runner's `<stage> failed: <error>`.
fn last_failure(dir: &Path) -> Option<String> {
    let log = std::fs::read_to_string(dir.join(crate::stages::STAGE_LOG)).ok()?;
    let last = log.lines().rev().find(|l| !l.trim().is_empty())?;
    let (_, why) = last.split_once(" failed: ")?;
    Some(why.trim().to_string())
}

/// `done/total unit`, rate, ETA and detail.
fn progress_text(p: &Progress) -> String {
    let total = p.total.map(|t| format!("/{t}")).unwrap_or_default();
    let mut parts = vec![format!("{}{total} {}", p.done, p.unit)];
    if let Some(r) = p.rate {
        parts.push(if r >= 10.0 {
            format!("{r:.0}/s")
        } else {
            format!("{r:.2}/s")
        });
    }
    if let Some(e) = p.eta_seconds {
        parts.push(format!("ETA {}", fmt_secs(e)));
    }
    parts.join(", ")
}

pub fn print_status(st: &Status) {
    match &st.config {
        Some(c) => crate::outln!("work dir {} (last run: {c})", st.workdir),
        None => crate::outln!("work dir {}", st.workdir),
    }
    crate::outln!(
        "{:<11} {:<12} {:<44} {:>10} {:>10} {:>8}",
        "stage",
        "key",
        "state",
        "rows",
        "disk",
        "wall"
    );
    for s in &st.stages {
        let mut state = s.state.clone();
        if let Some(p) = &s.progress {
            state = format!("{state}: {}", progress_text(p));
        }
        if let Some((done, n)) = s.shards {
            state = format!("{state}; shards {done}/{n} committed");
        }
        if !s.in_last_plan {
            state = format!("{state} (not in the last plan)");
        }
        crate::outln!(
            "{:<11} {:<12} {:<44} {:>10} {:>10} {:>8}",
            s.name,
            s.key,
            state,
            s.rows.map(|r| r.to_string()).unwrap_or("-".into()),
            if s.state == "not started" {
                "-".into()
            } else {
                format_bytes(s.bytes)
            },
            s.wall_seconds
                .map(|w| format!("{w:.1}s"))
                .unwrap_or("-".into())
        );
        let detail = s
            .progress
            .as_ref()
            .map(|p| {
                [p.label.as_str(), p.detail.as_str()]
                    .into_iter()
                    .filter(|x| !x.is_empty())
                    .collect::<Vec<_>>()
                    .join(": ")
            })
            .filter(|d| !d.is_empty());
        if let Some(d) = detail {
            crate::outln!("{:<11} {d}", "");
        }
        if !s.note.is_empty() {
            crate::outln!("{:<11} {}", "", s.note);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stage folder whose progress was written by `pid` on `host`, `age` seconds ago.
    fn stage_with(root: &Path, pid: u32, host: &str, age: u64) -> StageStatus {
        let dir = root.join("stages/sample-0123456789abcdef");
        std::fs::create_dir_all(&dir).unwrap();
        let now = store::now_unix();
        let p = Progress {
            done: 3,
            total: Some(10),
            unit: "samples".into(),
            started_unix: now - age - 5,
            updated_unix: now - age,
            pid: Some(pid),
            host: host.into(),
            ..Progress::default()
        };
        store::write_json_atomic(&dir.join(store::PROGRESS), &p).unwrap();
        stage("sample", "0123456789abcdef", &dir, true, None, false, 600.0).unwrap()
    }

    #[test]
    fn running_stalled_and_unknowable_from_the_writer_and_the_age() {
        let root = tempfile::tempdir().unwrap();
        let here = crate::machine::hostname();
        let me = std::process::id();
        // this process, fresh: running
        assert_eq!(stage_with(root.path(), me, &here, 1).state, "running");
        // this process, but nothing moved for 20 minutes: stalled, and said to be alive
        let s = stage_with(root.path(), me, &here, 1200);
        assert_eq!(s.state, "stalled");
        assert!(s.note.contains("no progress for 20m00s") && s.note.contains("still running"));
        // another host: cannot be checked; fresh is running, old is stalled
        let s = stage_with(root.path(), 1, "elsewhere", 1);
        assert_eq!(s.state, "running");
        assert!(s.note.contains("on elsewhere"), "{}", s.note);
        assert_eq!(
            stage_with(root.path(), 1, "elsewhere", 3600).state,
            "stalled"
        );
        // a pid that is not alive here: stopped
        let s = stage_with(root.path(), u32::MAX - 1, &here, 1);
        assert_eq!(s.state, "stopped");
        // a live pid, but no process holds the work dir's lock (the pid was reused): stopped
        let dir = root.path().join("stages/sample-0123456789abcdef");
        let s = stage(
            "sample",
            "0123456789abcdef",
            &dir,
            true,
            Some(me),
            true,
            600.0,
        )
        .unwrap();
        assert_eq!(s.state, "stopped", "{}", s.note);
    }
}
