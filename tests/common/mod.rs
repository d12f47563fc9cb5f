//! Helpers for the CLI tests: run the real `pipeline` binary in a temp dir, write small configs
//! and data, find `../shared`.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `pipeline` binary under test: `$SELFDISTILL_PIPELINE` where set (a test executable carried
/// to another machine, where cargo's absolute path does not exist), else the one cargo built.
pub fn exe() -> PathBuf {
    std::env::var_os("SELFDISTILL_PIPELINE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_pipeline")))
}

pub fn bin() -> Command {
    Command::new(exe())
}

/// The read-only `shared/` folder: `$SELFDISTILL_SHARED` where set, else `../shared` beside the
/// checkout.
pub fn shared_root() -> PathBuf {
    std::env::var_os("SELFDISTILL_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared"))
}

pub fn shared(rel: &str) -> Option<PathBuf> {
    let p = shared_root().join(rel);
    if p.exists() {
        Some(p)
    } else {
        assert!(
            !std::env::var("SELFDISTILL_REQUIRE_SHARED").is_ok_and(|v| v == "1"),
            "{} is missing and SELFDISTILL_REQUIRE_SHARED=1",
            p.display()
        );
        eprintln!("skipped: {} is missing", p.display());
        None
    }
}

/// A copy of checkpoint folder `from` (its files; `expected/` and other folders left out) at
/// `to`, for tests that change or break one file of a model.
pub fn copy_checkpoint(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
        }
    }
}

pub fn run(args: &[&str], cwd: &Path) -> Output {
    bin()
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("spawn pipeline")
}

/// `problems.jsonl` in `dir`: `rows` problems `What is i + i?` with their answers.
pub fn toy_problems(dir: &Path, rows: usize) -> PathBuf {
    let p = dir.join("problems.jsonl");
    let lines: Vec<String> = (0..rows)
        .map(|i| {
            format!(
                "{{\"problem\": \"What is {i} + {i}?\", \"answer\": \"{}\"}}",
                2 * i
            )
        })
        .collect();
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
    p
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A config over a data file and a dataset-format completions file (reference solutions).
pub fn reference_config(
    dir: &Path,
    format: &str,
    data: &Path,
    completion_field: &str,
    chunk_rows: usize,
) -> PathBuf {
    let cfg = format!(
        r#"[run]
name = "t"
workdir = "work"
[[data.sources]]
name = "set"
format = "{format}"
path = "{data}"
[filter]
max_per_problem = 2
chunk_rows = {chunk_rows}
[filter.completions]
path = "{data}"
format = "{format}"
completion_field = "{completion_field}"
"#,
        data = data.display()
    );
    let p = dir.join("t.toml");
    std::fs::write(&p, cfg).unwrap();
    p
}

/// The folder of the stage the work dir's plan names `name` (a round's too: `filter-r2`; stage
/// folders are named by kind and key).
pub fn planned_stage_dir(work: &Path, name: &str) -> PathBuf {
    let plan: serde_json::Value =
        serde_json::from_slice(&std::fs::read(work.join("plan.json")).unwrap()).unwrap();
    let s = plan["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {plan}"));
    work.join("stages").join(s["dir"].as_str().unwrap())
}

/// The manifest of the stage the work dir's plan names `name`.
pub fn manifest_of(work: &Path, name: &str) -> serde_json::Value {
    let p = planned_stage_dir(work, name).join("manifest.json");
    serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap()
}

/// A count of a manifest.
pub fn manifest_count(m: &serde_json::Value, key: &str) -> u64 {
    m["counts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c[0] == key)
        .unwrap_or_else(|| panic!("no count {key}: {m}"))[1]
        .as_u64()
        .unwrap()
}

/// The folder of stage `name` in a work dir (the first `stages/<name>-*`).
pub fn stage_dir(work: &Path, name: &str) -> PathBuf {
    std::fs::read_dir(work.join("stages"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!("{name}-"))
        })
        .unwrap_or_else(|| panic!("no {name} stage in {}", work.display()))
}

/// The numbers of a work dir's report: everything above the stage table (which has wall times),
/// without the lines that give speeds.
pub fn report_numbers(workdir: &Path) -> String {
    let report = std::fs::read_to_string(workdir.join("report/report.md")).unwrap();
    report
        .split("## Stages")
        .next()
        .unwrap()
        .lines()
        .filter(|l| !l.contains("tokens/s"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `pipeline run all --config <config>` in `dir`, once per fault point, each run SIGKILLed at
/// its point (`SELFDISTILL_KILL_AT`) and resuming what the last left: fails naming a point no
/// run reached.
pub fn run_killed_at(dir: &Path, config: &str, points: &[&str]) {
    use std::os::unix::process::ExitStatusExt;
    for point in points {
        let o = bin()
            .args(["run", "all", "--config", config])
            .current_dir(dir)
            .env("SELFDISTILL_KILL_AT", point)
            .output()
            .expect("spawn pipeline");
        assert_eq!(
            o.status.signal(),
            Some(9),
            "{point} not reached: {}",
            text(&o)
        );
    }
}

/// A config that trains the fixture `model` on the graded reference solutions of the first 40
/// GSM8K problems of `data` (data + filter stages, no sampling), with `train` as the `[train]`
/// keys beside `model`.
pub fn gsm8k_train_config(
    name: &str,
    workdir: &str,
    data: &Path,
    model: &Path,
    train: &str,
) -> String {
    format!(
        r#"[run]
name = "{name}"
workdir = "{workdir}"
[[data.sources]]
name = "gsm8k"
format = "gsm8k"
path = "{data}"
limit = 40
[filter]
[filter.completions]
path = "{data}"
format = "gsm8k"
completion_field = "answer"
source = "gsm8k"
[train]
model = "{model}"
{train}"#,
        data = data.display(),
        model = model.display()
    )
}
