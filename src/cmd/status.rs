//! `pipeline status`: a table of a work dir's stages (done / partial / not started), with key,
//! rows, bytes on disk, wall time, and how far a partial stage got.
//!
//! Reads `plan.json` (the last run's stages, in order) and every `stages/*` folder; takes no lock,
//! so it works while a run is going. Builds no plan and reads no inputs.

use std::collections::HashSet;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::bytes::format_bytes;
use crate::config::Config;
use crate::stages::{stage_state, PlanRecord, StageState};
use crate::store::{self, dir_bytes};

struct Row {
    stage: String,
    key: String,
    state: String,
    rows: String,
    bytes: String,
    wall: String,
}

pub fn run(workdir: Option<&Path>, cfg: Option<&Config>) -> Result<()> {
    let root = match (workdir, cfg) {
        (Some(w), _) => w.to_path_buf(),
        (None, Some(c)) => c.workdir.clone(),
        (None, None) => bail!("give --workdir DIR or --config FILE"),
    };
    if !root.exists() {
        bail!(
            "work dir {} does not exist (nothing has run there)",
            root.display()
        );
    }
    let plan_path = root.join(store::PLAN);
    let plan: Option<PlanRecord> = match std::fs::read(&plan_path) {
        Ok(b) => Some(
            serde_json::from_slice(&b)
                .with_context(|| format!("corrupt {}", plan_path.display()))?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", plan_path.display())),
    };
    let mut rows = Vec::new();
    let mut listed = HashSet::new();
    if let Some(p) = &plan {
        println!("work dir {} (last run: {})", root.display(), p.config);
        for s in &p.stages {
            let dir = root.join("stages").join(&s.dir);
            listed.insert(dir.file_name().map(|n| n.to_os_string()));
            rows.push(row(&s.name, &s.key, &dir)?);
        }
    } else {
        println!("work dir {}", root.display());
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
        let (stage, key) = name.rsplit_once('-').unwrap_or((&name, ""));
        let mut r = row(stage, key, &dir)?;
        r.state = format!("{} (not in the last plan)", r.state);
        rows.push(r);
    }
    print_table(&rows);
    Ok(())
}

fn row(stage: &str, key: &str, dir: &Path) -> Result<Row> {
    let key = key.get(..12).unwrap_or(key).to_string();
    let on_disk = format_bytes(dir_bytes(dir));
    Ok(match stage_state(dir)? {
        StageState::Done(m) => Row {
            stage: stage.into(),
            key,
            state: "done".into(),
            rows: m.rows.to_string(),
            bytes: on_disk,
            wall: format!("{:.1}s", m.wall_seconds),
        },
        StageState::Partial(p) => Row {
            stage: stage.into(),
            key,
            state: match p {
                Some(p) => format!(
                    "partial: {}/{} {}",
                    p.done,
                    p.total.map(|t| t.to_string()).unwrap_or("?".into()),
                    p.unit
                ),
                None => "partial".into(),
            },
            rows: "-".into(),
            bytes: on_disk,
            wall: "-".into(),
        },
        StageState::NotStarted => Row {
            stage: stage.into(),
            key,
            state: "not started".into(),
            rows: "-".into(),
            bytes: "-".into(),
            wall: "-".into(),
        },
    })
}

fn print_table(rows: &[Row]) {
    println!(
        "{:<11} {:<12} {:<34} {:>10} {:>10} {:>8}",
        "stage", "key", "state", "rows", "disk", "wall"
    );
    for r in rows {
        println!(
            "{:<11} {:<12} {:<34} {:>10} {:>10} {:>8}",
            r.stage, r.key, r.state, r.rows, r.bytes, r.wall
        );
    }
}
