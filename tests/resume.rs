//! Crash tests: SIGKILL the filter stage midway (at an exact point, and from outside at an
//! arbitrary moment) and show that no stage looks done that is not, and that the next run
//! finishes with exactly the rows of an uninterrupted run.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use selfdistill::data::schema::{read_completions, Completion};

/// GSM8K train reference solutions, graded in 60 chunks of 128 rows.
fn setup(dir: &Path) -> Option<PathBuf> {
    let data = shared("data/gsm8k_train.jsonl")?;
    Some(reference_config(dir, "gsm8k", &data, "answer", 128))
}

fn filter_dir(work: &Path) -> PathBuf {
    stage_dir(work, "filter")
}

/// Every SFT row and every graded row, whole (all columns), in file order.
fn sft_rows(work: &Path) -> (Vec<Completion>, Vec<Completion>) {
    let dir = filter_dir(work);
    let mut parts: Vec<_> = std::fs::read_dir(dir.join("graded"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .collect();
    parts.sort();
    let graded = parts
        .iter()
        .flat_map(|p| read_completions(p).unwrap())
        .collect();
    let sft = read_completions(&dir.join("sft.parquet")).unwrap();
    (sft, graded)
}

fn uninterrupted(cfg: &Path) -> (Vec<Completion>, Vec<Completion>) {
    let dir = tempfile::tempdir().unwrap();
    let o = run(
        &[
            "run",
            "all",
            "--config",
            cfg.to_str().unwrap(),
            "--workdir",
            "clean",
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    sft_rows(&dir.path().join("clean"))
}

fn killed_at(point: &str, dir: &Path, cfg: &Path) {
    let o = bin()
        .args(["run", "all", "--config", cfg.to_str().unwrap()])
        .env(selfdistill::fault::ENV, point)
        .current_dir(dir)
        .output()
        .unwrap();
    assert_eq!(
        o.status.signal(),
        Some(9),
        "not killed at {point}: {}",
        text(&o)
    );
}

#[test]
fn sigkill_mid_chunk_then_resume_gives_the_uninterrupted_rows() {
    let dir = tempfile::tempdir().unwrap();
    let Some(cfg) = setup(dir.path()) else {
        return;
    };
    // Chunk 21 is written to its temp file but not yet renamed into place.
    killed_at("commit.part-00020.parquet", dir.path(), &cfg);
    let work = dir.path().join("work");
    let fdir = filter_dir(&work);
    assert!(
        !fdir.join("manifest.json").exists(),
        "a killed stage must not look done"
    );
    assert!(!fdir.join("sft.parquet").exists());
    assert!(fdir.join("graded/.part-00020.parquet.tmp").exists());
    assert!(!fdir.join("graded/part-00020.parquet").exists());
    let o = run(&["status", "--workdir", "work"], dir.path());
    assert!(text(&o).contains("stopped: 20/59 chunks"), "{}", text(&o));

    let o = run(
        &["run", "all", "--config", cfg.to_str().unwrap()],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("--> data cached"), "{out}");
    assert!(out.contains("resumed: 20 of 59 chunks"), "{out}");
    assert_eq!(sft_rows(&work), uninterrupted(&cfg));
}

#[test]
fn sigkill_before_the_manifest_leaves_the_stage_partial() {
    let dir = tempfile::tempdir().unwrap();
    let Some(cfg) = setup(dir.path()) else {
        return;
    };
    killed_at("filter.before_manifest", dir.path(), &cfg);
    let work = dir.path().join("work");
    assert!(filter_dir(&work).join("sft.parquet").exists());
    assert!(!filter_dir(&work).join("manifest.json").exists());
    let o = run(
        &["run", "all", "--config", cfg.to_str().unwrap()],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("resumed: 59 of 59 chunks"),
        "{}",
        text(&o)
    );
    assert_eq!(sft_rows(&work), uninterrupted(&cfg));
}

/// A SIGKILL from outside at whatever moment the filter has reached.
#[test]
fn external_sigkill_at_any_moment_never_leaves_a_false_done() {
    let dir = tempfile::tempdir().unwrap();
    let Some(cfg) = setup(dir.path()) else {
        return;
    };
    let expected = uninterrupted(&cfg);
    let work = dir.path().join("work");
    let mut child = bin()
        .args(["run", "all", "--config", cfg.to_str().unwrap()])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    // Wait until the filter has committed its first chunk, then kill.
    loop {
        let started = work.join("stages").exists()
            && std::fs::read_dir(work.join("stages"))
                .unwrap()
                .flatten()
                .any(|e| e.path().join("progress.json").exists());
        if started || t0.elapsed() > Duration::from_secs(120) {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let fdir = filter_dir(&work);
    if fdir.join("manifest.json").exists() {
        // Finished before the kill landed: then it must be complete.
        assert_eq!(sft_rows(&work), expected);
    }
    let o = run(
        &["run", "all", "--config", cfg.to_str().unwrap()],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(sft_rows(&work), expected);
}
