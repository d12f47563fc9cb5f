//! Our Parquet files read cleanly in pyarrow: runs the pipeline and the grade command, then reads
//! every file they wrote with `python3 tests/pyarrow_read.py`.
//!
//! Skips when python3 or pyarrow is missing, unless SELFDISTILL_REQUIRE_PYARROW=1 (CI sets it).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

fn pyarrow_available() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import pyarrow"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok && std::env::var("SELFDISTILL_REQUIRE_PYARROW").is_ok_and(|v| v == "1") {
        panic!("pyarrow is required (SELFDISTILL_REQUIRE_PYARROW=1) but `import pyarrow` fails");
    }
    ok
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            files_under(&p, out);
        } else if p.extension().is_some_and(|x| x == "parquet") {
            out.push(p);
        }
    }
}

#[test]
fn pyarrow_reads_every_parquet_file_we_write() {
    if !pyarrow_available() {
        eprintln!("skipped: pyarrow is not installed");
        return;
    }
    let Some(math) = shared("data/math500.jsonl") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cfg = reference_config(dir.path(), "math", &math, "solution", 200);
    let o = run(
        &["run", "all", "--config", cfg.to_str().unwrap()],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let graded = dir.path().join("graded.parquet");
    let o = run(
        &[
            "grade",
            "--input",
            math.to_str().unwrap(),
            "--answer-field",
            "answer",
            "--completion-field",
            "solution",
            "--output",
            graded.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));

    let mut files = vec![graded];
    files_under(&dir.path().join("work"), &mut files);
    assert_eq!(files.len(), 1 + 1 + 3 + 1, "{files:?}"); // grade, problems, 3 parts, sft
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pyarrow_read.py");
    let o = Command::new("python3")
        .arg(script)
        .args(&files)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let lines: Vec<Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), files.len());
    for l in &lines {
        assert_eq!(l["compression"], "ZSTD", "{l}");
        let path = l["path"].as_str().unwrap();
        if path.ends_with("sft.parquet") {
            // every reference solution but the one that states a false step (the filter's
            // arithmetic rule: test/algebra/351.json writes `(-4)^2 + 4 \cdot 1 \cdot (-1) = 20`)
            assert_eq!(l["rows"], 499);
            assert_eq!(l["columns"]["prompt_token_ids"], "list<item: int32>");
            assert_eq!(l["first"]["problem_id"], "set/test/precalculus/807.json");
        } else if path.ends_with("problems.parquet") {
            assert_eq!(l["rows"], 500);
        } else if path.ends_with("graded.parquet") {
            assert_eq!(l["columns"]["correct"], "bool");
            assert_eq!(l["first"]["correct"], true);
        } else {
            assert_eq!(l["columns"]["reason"], "string");
        }
    }
}
