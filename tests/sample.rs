//! `pipeline sample` on the tiny-qwen3 fixture: the completions Parquet, seeded results that do
//! not depend on batch size or sharding, and resume after a SIGKILL.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

use common::*;
use selfdistill::data::schema::{read_completions, Completion};

fn problems(dir: &Path) -> PathBuf {
    let p = dir.join("problems.jsonl");
    let rows: Vec<String> = (0..20)
        .map(|i| {
            format!(
                "{{\"problem\": \"What is {i} + {i}?\", \"answer\": \"{}\"}}",
                2 * i
            )
        })
        .collect();
    std::fs::write(&p, rows.join("\n") + "\n").unwrap();
    p
}

fn sample(dir: &Path, extra: &[&str], out: &str) -> std::process::Output {
    sample_with_env(dir, extra, out, None)
}

/// `pipeline sample` on the 20 toy problems, with an optional environment variable.
fn sample_with_env(
    dir: &Path,
    extra: &[&str],
    out: &str,
    env: Option<(&str, &str)>,
) -> std::process::Output {
    let model = shared("fixtures/tiny-qwen3").unwrap();
    let input = problems(dir);
    let mut args = vec![
        "sample",
        "--model",
        model.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--answer-field",
        "answer",
        "--prompt-template",
        "raw",
        "--n",
        "2",
        "--temperature",
        "0.8",
        "--top-p",
        "0.95",
        "--max-new-tokens",
        "8",
        "--seed",
        "7",
        "--kv-cache",
        "4 MiB",
        "--output",
        out,
    ];
    args.extend_from_slice(extra);
    let mut cmd = bin();
    cmd.args(&args).current_dir(dir);
    if let Some((k, v)) = env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn key(rows: &[Completion]) -> Vec<(String, i32, Option<Vec<i32>>)> {
    let mut v: Vec<_> = rows
        .iter()
        .map(|r| {
            (
                r.problem_id.clone(),
                r.sample_index,
                r.completion_token_ids.clone(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn sample_writes_graded_completions_independent_of_batch_size_and_shards() {
    if shared("fixtures/tiny-qwen3").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let o = sample(dir.path(), &["--max-num-seqs", "64"], "a.parquet");
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("20 problems (0 resumed), 40 samples"),
        "{}",
        text(&o)
    );
    let a = read_completions(&dir.path().join("a.parquet")).unwrap();
    assert_eq!(a.len(), 40);
    assert!(a
        .iter()
        .all(|r| r.grade.is_some() && r.finish_reason.is_some()));
    assert_eq!(a[0].sample_index, 0);
    assert_eq!(a[1].sample_index, 1);
    assert_eq!(a[0].prompt, "What is 0 + 0?");
    assert!(!dir.path().join("a.parquet.parts").exists());

    let o = sample(dir.path(), &["--max-num-seqs", "1"], "b.parquet");
    assert!(o.status.success(), "{}", text(&o));
    let b = read_completions(&dir.path().join("b.parquet")).unwrap();
    assert_eq!(key(&a), key(&b));

    for i in 0..3 {
        let out = format!("s{i}.parquet");
        let o = sample(dir.path(), &["--shard", &format!("{i}/3")], &out);
        assert!(o.status.success(), "{}", text(&o));
    }
    let merge = |files: &[&str]| {
        let mut args = vec!["merge", "--output", "merged.parquet"];
        args.extend_from_slice(files);
        run(&args, dir.path())
    };
    let o = merge(&["s0.parquet", "s2.parquet"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("incomplete shard set: missing shard(s) 1 of 3"),
        "{}",
        text(&o)
    );
    let o = merge(&["s0.parquet", "s0.parquet", "s2.parquet"]);
    assert!(text(&o).contains("shard 0/3 given twice"), "{}", text(&o));
    let o = merge(&["s0.parquet", "s1.parquet", "s2.parquet"]);
    assert!(o.status.success(), "{}", text(&o));
    let merged = read_completions(&dir.path().join("merged.parquet")).unwrap();
    assert_eq!(key(&a), key(&merged));
    let o = merge(&["s0.parquet", "s1.parquet", "a.parquet"]);
    assert!(!o.status.success());
}

#[test]
fn sigkill_mid_run_then_resume_gives_the_uninterrupted_rows() {
    if shared("fixtures/tiny-qwen3").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let o = sample(dir.path(), &[], "clean.parquet");
    assert!(o.status.success(), "{}", text(&o));
    let o = sample_with_env(
        dir.path(),
        &[],
        "killed.parquet",
        Some((selfdistill::fault::ENV, "sample.part:1")),
    );
    assert_eq!(o.status.signal(), Some(9), "{}", text(&o));
    assert!(!dir.path().join("killed.parquet").exists());
    let o = sample(dir.path(), &[], "killed.parquet");
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        !text(&o).contains("(0 resumed)") && text(&o).contains(" resumed)"),
        "{}",
        text(&o)
    );
    let clean = read_completions(&dir.path().join("clean.parquet")).unwrap();
    let resumed = read_completions(&dir.path().join("killed.parquet")).unwrap();
    assert_eq!(key(&clean), key(&resumed));
    assert_eq!(clean.len(), resumed.len());
}

#[test]
fn run_all_samples_then_filters_and_caches_every_stage() {
    let Some(model) = shared("fixtures/tiny-qwen3") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let input = problems(dir.path());
    let cfg = format!(
        r#"[run]
workdir = "work"
[[data.sources]]
name = "toy"
format = "mapped"
path = "{}"
problem_field = "problem"
answer_field = "answer"
limit = 6
[sample]
model = "{}"
prompt_template = "raw"
n = 2
temperature = 0.8
max_new_tokens = 8
seed = 3
[filter]
max_per_problem = 1
"#,
        input.display(),
        model.display()
    );
    std::fs::write(dir.path().join("p.toml"), &cfg).unwrap();
    let o = run(&["run", "all", "--config", "p.toml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("==> sample"), "{out}");
    assert!(out.contains("6 problems (0 resumed), 12 samples"), "{out}");
    assert!(out.contains("input_rows            12"), "{out}");
    // the report has the sampler's figures and the length histogram
    let report = std::fs::read_to_string(dir.path().join("work/report/report.md")).unwrap();
    assert!(report.contains("6 problems, 12 samples"), "{report}");
    assert!(
        report.contains("## Filter") && report.contains("lengths_sample.png"),
        "{report}"
    );
    assert!(dir.path().join("work/report/lengths_sample.png").is_file());
    let o = run(&["run", "all", "--config", "p.toml"], dir.path());
    let out = text(&o);
    assert!(out.contains("--> sample cached"), "{out}");
    assert!(out.contains("--> filter cached"), "{out}");
    let o = run(&["status", "--workdir", "work"], dir.path());
    assert_eq!(text(&o).matches(" done ").count(), 3, "{}", text(&o));
    // A misspelled sampling key names the closest one.
    std::fs::write(
        dir.path().join("p.toml"),
        cfg.replace("temperature", "temprature"),
    )
    .unwrap();
    let o = run(&["run", "all", "--config", "p.toml"], dir.path());
    assert!(!o.status.success());
    assert!(
        text(&o).contains("did you mean `temperature`?"),
        "{}",
        text(&o)
    );
}

#[test]
fn preflight_counts_the_kv_cache_and_the_context() {
    let Some(model) = shared("fixtures/tiny-qwen3") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let input = problems(dir.path());
    let cfg = |seqs: usize, new: usize| {
        format!(
            "[run]\nworkdir = \"work\"\n[[data.sources]]\nname = \"toy\"\nformat = \"mapped\"\n\
             path = \"{}\"\nproblem_field = \"problem\"\nanswer_field = \"answer\"\n[sample]\n\
             model = \"{}\"\nmax_num_seqs = {seqs}\nmax_new_tokens = {new}\n",
            input.display(),
            model.display()
        )
    };
    std::fs::write(dir.path().join("ok.toml"), cfg(4, 100)).unwrap();
    let o = run(&["preflight", "--config", "ok.toml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    // 10M sequences of 612 tokens at 8 KiB each: far more memory than any machine has.
    std::fs::write(dir.path().join("big.toml"), cfg(10_000_000, 100)).unwrap();
    let o = run(&["preflight", "--config", "big.toml"], dir.path());
    assert!(!o.status.success());
    assert!(text(&o).contains("of memory but"), "{}", text(&o));
    std::fs::write(dir.path().join("long.toml"), cfg(4, 5000)).unwrap();
    let o = run(&["preflight", "--config", "long.toml"], dir.path());
    assert!(!o.status.success());
    assert!(
        text(&o).contains("does not fit the model's context of 1024"),
        "{}",
        text(&o)
    );
}
