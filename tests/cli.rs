//! CLI tests: the real binary in a temp dir, for `run`, `status`, `grade`, `data inspect`,
//! `preflight`, bad configs and bad data.

mod common;

use std::path::Path;

use common::*;

fn gsm_fixture(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("gsm.jsonl");
    let rows = [
        r#"{"question": "What is 2+2?", "answer": "2+2=<<2+2=4>>4\n#### 4"}"#,
        r#"{"question": "What is 3*3?", "answer": "3*3=9\n#### 9"}"#,
        r#"{"question": "What is 10-7?", "answer": "I think 4.\n#### 3"}"#,
    ];
    std::fs::write(&p, rows.join("\n") + "\n").unwrap();
    p
}

#[test]
fn run_then_rerun_does_no_work_and_status_reports_done() {
    let dir = tempfile::tempdir().unwrap();
    let data = gsm_fixture(dir.path());
    let cfg = reference_config(dir.path(), "gsm8k", &data, "answer", 2);
    let cfg = cfg.to_str().unwrap();
    let o = run(&["run", "all", "--config", cfg], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    for stage in ["data ", "filter "] {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(stage))
            .unwrap();
        assert!(line.contains("will run"), "{out}");
    }
    assert!(out.contains("kept                   3"), "{out}");

    let work = dir.path().join("work");
    let manifests: Vec<_> = glob_manifests(&work);
    assert_eq!(manifests.len(), 2);
    let before: Vec<_> = manifests
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();

    let o = run(&["run", "all", "--config", cfg], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("--> data cached"), "{out}");
    assert!(out.contains("--> filter cached"), "{out}");
    assert!(!out.contains("==>"), "a stage ran again: {out}");
    let after: Vec<_> = manifests
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    assert_eq!(before, after);

    let o = run(&["status", "--workdir", "work"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert_eq!(out.matches(" done ").count(), 2, "{out}");

    // Changing a filter setting re-runs the filter only.
    let edited = std::fs::read_to_string(cfg)
        .unwrap()
        .replace("max_per_problem = 2", "max_per_problem = 1");
    std::fs::write(cfg, edited).unwrap();
    let o = run(&["run", "all", "--config", cfg], dir.path());
    let out = text(&o);
    assert!(out.contains("--> data cached"), "{out}");
    assert!(out.contains("==> filter"), "{out}");
}

fn glob_manifests(work: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(work.join("stages"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("manifest.json"))
        .filter(|p| p.exists())
        .collect();
    v.sort();
    v
}

#[test]
fn misspelled_key_fails_naming_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let data = gsm_fixture(dir.path());
    let cfg = reference_config(dir.path(), "gsm8k", &data, "answer", 2);
    let text_cfg = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("max_per_problem", "max_per_problme");
    std::fs::write(&cfg, text_cfg).unwrap();
    let o = run(
        &["run", "all", "--config", cfg.to_str().unwrap()],
        dir.path(),
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("t.toml:9:1: "), "{err}");
    assert!(
        err.contains("unknown key `max_per_problme` in [filter]"),
        "{err}"
    );
    assert!(err.contains("did you mean `max_per_problem`?"), "{err}");
    assert!(
        !dir.path().join("work").exists(),
        "a bad config must not start work"
    );
}

#[test]
fn malformed_data_line_fails_naming_it_and_marks_nothing_done() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("bad.jsonl");
    std::fs::write(
        &data,
        "{\"question\": \"a\", \"answer\": \"#### 1\"}\n{\"question\": oops}\n",
    )
    .unwrap();
    let cfg = reference_config(dir.path(), "gsm8k", &data, "answer", 2);
    let o = run(
        &["run", "all", "--config", cfg.to_str().unwrap()],
        dir.path(),
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bad.jsonl:2: malformed JSON"), "{err}");
    assert!(glob_manifests(&dir.path().join("work")).is_empty());
}

#[test]
fn a_second_run_on_a_locked_work_dir_names_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let data = gsm_fixture(dir.path());
    let cfg = reference_config(dir.path(), "gsm8k", &data, "answer", 2);
    let _held = selfdistill::store::WorkDir::lock(&dir.path().join("work")).unwrap();
    let o = run(
        &["run", "all", "--config", cfg.to_str().unwrap()],
        dir.path(),
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!(
            "in use by another pipeline (pid {} on ",
            std::process::id()
        )),
        "{err}"
    );
}

#[test]
fn preflight_checks_the_disk_budget() {
    let dir = tempfile::tempdir().unwrap();
    let data = gsm_fixture(dir.path());
    let cfg = reference_config(dir.path(), "gsm8k", &data, "answer", 2);
    let o = run(
        &["preflight", "--config", cfg.to_str().unwrap()],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("preflight ok"));
    let tight = std::fs::read_to_string(&cfg).unwrap().replace(
        "workdir = \"work\"",
        "workdir = \"work\"\ndisk_budget = \"10 B\"",
    );
    std::fs::write(&cfg, tight).unwrap();
    let o = run(
        &["preflight", "--config", cfg.to_str().unwrap()],
        dir.path(),
    );
    assert!(!o.status.success());
    assert!(
        text(&o).contains("over run.disk_budget = 10 B"),
        "{}",
        text(&o)
    );
    let typo = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("10 B", "10 GiBs");
    std::fs::write(&cfg, typo).unwrap();
    let o = run(
        &["preflight", "--config", cfg.to_str().unwrap()],
        dir.path(),
    );
    assert!(!o.status.success());
    assert!(text(&o).contains("`run.disk_budget`"), "{}", text(&o));
}

#[test]
fn grade_jsonl_writes_every_row_with_the_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("c.jsonl");
    std::fs::write(
        &input,
        concat!(
            "{\"id\": 1, \"gold\": \"\\\\frac{1}{2}\", \"out\": \"so \\\\boxed{0.5}\"}\n",
            "{\"id\": 2, \"gold\": \"7\", \"out\": \"The answer is 8.\"}\n",
            "{\"id\": 3, \"gold\": 27.0, \"out\": \"hmm\"}\n",
        ),
    )
    .unwrap();
    for out_name in ["g.jsonl", "g.parquet"] {
        let out = dir.path().join(out_name);
        let o = run(
            &[
                "grade",
                "--input",
                input.to_str().unwrap(),
                "--answer-field",
                "gold",
                "--completion-field",
                "out",
                "--output",
                out_name, // relative: the regression of a bare file name with no parent
            ],
            dir.path(),
        );
        assert!(o.status.success(), "{}", text(&o));
        assert!(text(&o).contains("accuracy: 1/3 = 33.33%"), "{}", text(&o));
        let rows = selfdistill::data::records::read_all_records(&out).unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].fields["correct"], serde_json::json!(true));
        assert_eq!(rows[1].fields["correct"], serde_json::json!(false));
        assert_eq!(rows[1].fields["extracted_answer"], serde_json::json!("8"));
        assert_eq!(rows[2].fields["reason"], serde_json::json!("no_answer"));
        assert_eq!(rows[2].fields["id"], serde_json::json!(3));
    }
    let o = run(
        &[
            "grade",
            "--input",
            input.to_str().unwrap(),
            "--answer-field",
            "gld",
            "--completion-field",
            "out",
        ],
        dir.path(),
    );
    assert!(!o.status.success());
    assert!(
        text(&o).contains("c.jsonl:1: no field `gld` (--answer-field); did you mean `gold`?"),
        "{}",
        text(&o)
    );
}

#[test]
fn grade_math500_reference_solutions_from_jsonl_and_parquet() {
    let Some(math) = shared("data/math500.jsonl") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("graded.parquet");
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
            out.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("accuracy: 500/500 = 100.00%"),
        "{}",
        text(&o)
    );
    // The Parquet we wrote grades the same when read back.
    let o = run(
        &[
            "grade",
            "--input",
            out.to_str().unwrap(),
            "--answer-field",
            "answer",
            "--completion-field",
            "solution",
        ],
        dir.path(),
    );
    assert!(
        text(&o).contains("accuracy: 500/500 = 100.00%"),
        "{}",
        text(&o)
    );
}

#[test]
fn inspect_shows_schema_rows_and_first_rows() {
    let Some(pq) = shared("data/math500_rl.parquet") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let o = run(
        &["data", "inspect", pq.to_str().unwrap(), "--rows", "2"],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("rows: 500"), "{out}");
    assert!(out.contains("problem: Utf8"), "{out}");
    assert!(out.contains("parquet-cpp-arrow"), "{out}");
    assert!(out.contains("[2] "), "{out}");
    let data = gsm_fixture(dir.path());
    let o = run(&["data", "inspect", data.to_str().unwrap()], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("rows: 3"), "{}", text(&o));
    assert!(text(&o).contains("question: Utf8"), "{}", text(&o));
}

#[test]
fn every_shipped_pipeline_config_validates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines");
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "toml") {
            selfdistill::config::Config::load(&e.path())
                .unwrap_or_else(|err| panic!("{}: {err}", e.path().display()));
            n += 1;
        }
    }
    assert!(n >= 1);
}

fn hub_config(dir: &Path) -> std::path::PathBuf {
    let cfg = r#"[run]
workdir = "work"
[[data.sources]]
name = "gsm"
format = "gsm8k"
path = "hf://openai/gsm8k/main/test-00000-of-00001.jsonl"
"#;
    let p = dir.join("hub.toml");
    std::fs::write(&p, cfg).unwrap();
    p
}

#[test]
fn hub_source_offline_says_what_to_download_and_where() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = hub_config(dir.path());
    let o = bin()
        .args(["run", "all", "--config", cfg.to_str().unwrap()])
        .env("HF_HOME", dir.path().join("hf"))
        .env("HF_HUB_OFFLINE", "1")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = text(&o);
    assert!(err.contains("not in the local cache"), "{err}");
    assert!(
        err.contains("hf download --repo-type dataset openai/gsm8k main/test-00000-of-00001.jsonl"),
        "{err}"
    );
    assert!(
        err.contains(&dir.path().join("hf/hub").display().to_string()),
        "{err}"
    );
}

#[test]
fn hub_source_reads_from_the_hugging_face_cache_layout() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = hub_config(dir.path());
    let repo = dir.path().join("hf/hub/datasets--openai--gsm8k");
    let snap = repo.join("snapshots/0123abcd/main");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123abcd").unwrap();
    std::fs::copy(
        gsm_fixture(dir.path()),
        snap.join("test-00000-of-00001.jsonl"),
    )
    .unwrap();
    let o = bin()
        .args(["run", "all", "--config", cfg.to_str().unwrap()])
        .env("HF_HOME", dir.path().join("hf"))
        .env("HF_HUB_OFFLINE", "1")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("3 problems from 3 rows"), "{}", text(&o));
}

#[test]
fn force_reruns_the_stage_and_the_ones_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = gsm_fixture(dir.path());
    let cfg = reference_config(dir.path(), "gsm8k", &data, "answer", 2);
    let cfg = cfg.to_str().unwrap();
    assert!(run(&["run", "all", "--config", cfg], dir.path())
        .status
        .success());
    let o = run(
        &["run", "all", "--config", cfg, "--force", "filter"],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("--> data cached"), "{out}");
    assert!(out.contains("==> filter"), "{out}");
    assert!(!dir.path().join("work/trash").exists());
    let o = run(
        &["run", "all", "--config", cfg, "--force", "data"],
        dir.path(),
    );
    let out = text(&o);
    assert!(
        out.contains("==> data") && out.contains("==> filter"),
        "{out}"
    );
    let o = run(
        &["run", "all", "--config", cfg, "--force", "evaluate"],
        dir.path(),
    );
    assert!(!o.status.success());
    assert!(
        text(&o).contains("--force evaluate: no such stage"),
        "{}",
        text(&o)
    );
    let o = run(
        &["run", "all", "--config", cfg, "--force", "train"],
        dir.path(),
    );
    assert!(!o.status.success());
    assert!(
        text(&o).contains("--force train: stage `train` is not in"),
        "{}",
        text(&o)
    );
}

/// A reference run in `dir` SIGKILLed while its filter stage commits its second part; returns
/// the work dir.
fn killed_in_the_filter(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::process::ExitStatusExt;
    let data = gsm_fixture(dir);
    let cfg = reference_config(dir, "gsm8k", &data, "answer", 1);
    let o = bin()
        .args(["run", "all", "--config", cfg.to_str().unwrap()])
        .env(selfdistill::fault::ENV, "commit.part-00002.parquet")
        .current_dir(dir)
        .output()
        .unwrap();
    assert_eq!(o.status.signal(), Some(9), "{}", text(&o));
    dir.join("work")
}

#[test]
fn status_shows_how_far_a_killed_stage_got_from_any_folder() {
    let dir = tempfile::tempdir().unwrap();
    let work = killed_in_the_filter(dir.path());
    // From another folder, with an absolute work dir.
    let o = run(
        &["status", "--workdir", work.to_str().unwrap()],
        Path::new("/"),
    );
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    let data_line = out.lines().find(|l| l.starts_with("data ")).unwrap();
    assert!(data_line.contains(" done "), "{out}");
    let filter_line = out.lines().find(|l| l.starts_with("filter ")).unwrap();
    assert!(filter_line.contains("stopped: 2/3 chunks"), "{out}");
}

/// A killed stage whose pid now belongs to another process (pids are reused) is stopped, not
/// running: no pipeline holds the work dir's lock.
#[test]
fn status_does_not_trust_a_reused_pid() {
    let dir = tempfile::tempdir().unwrap();
    let work = killed_in_the_filter(dir.path());
    // a live process that is not a pipeline takes the dead one's pid in every file
    let mut other = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let host = selfdistill::machine::hostname();
    std::fs::write(work.join(".lock"), format!("{}@{host}", other.id())).unwrap();
    let progress = stage_dir(&work, "filter").join("progress.json");
    let mut p: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&progress).unwrap()).unwrap();
    p["pid"] = other.id().into();
    std::fs::write(&progress, p.to_string()).unwrap();
    let o = run(&["status", "--workdir", work.to_str().unwrap()], dir.path());
    let _ = other.kill();
    let _ = other.wait();
    let out = text(&o);
    let filter_line = out.lines().find(|l| l.starts_with("filter ")).unwrap();
    assert!(filter_line.contains("stopped: "), "{out}");
}

/// A stage that ended with an error shows as failed, with the error and where its log is.
#[test]
fn status_says_why_a_stage_failed() {
    let dir = tempfile::tempdir().unwrap();
    let data = gsm_fixture(dir.path());
    let cfg = reference_config(dir.path(), "gsm8k", &data, "answer", 1);
    // the data stage fails on a malformed line
    let o = run(
        &["run", "data", "--config", cfg.to_str().unwrap()],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    std::fs::write(
        &data,
        "{\"question\": \"x\", \"answer\": \"#### 1\"}\nnot json\n",
    )
    .unwrap();
    let o = run(
        &["run", "all", "--config", cfg.to_str().unwrap()],
        dir.path(),
    );
    assert!(!o.status.success(), "{}", text(&o));
    let o = run(&["status", "--config", cfg.to_str().unwrap()], dir.path());
    let out = text(&o);
    assert!(
        out.lines()
            .any(|l| l.starts_with("data ") && l.contains(" failed ")),
        "{out}"
    );
    // the note under it: the error (file and line) and the log
    assert!(
        out.contains("gsm.jsonl:2: malformed JSON") && out.contains("stage.log"),
        "{out}"
    );
}

/// The filter over our completions schema: every rule, counted in the manifest.
#[test]
fn filter_applies_every_rule_to_a_completions_parquet() {
    use selfdistill::data::schema::*;
    let dir = tempfile::tempdir().unwrap();
    let data = gsm_fixture(dir.path());
    let problems = selfdistill::data::load_source(
        &selfdistill::data::source::SourceSpec {
            name: "set".into(),
            format: selfdistill::data::source::SourceFormat::Gsm8k,
            location: selfdistill::data::source::Location::Local(data.clone()),
            fields: selfdistill::data::source::FieldMap::preset(
                selfdistill::data::source::SourceFormat::Gsm8k,
            ),
            limit: None,
            allow_empty: false,
        },
        std::slice::from_ref(&data),
        selfdistill::data::BadRows::STRICT,
    )
    .unwrap()
    .0;
    let id = |i: usize| problems[i].problem_id.clone();
    let row = |pid: String, k: i32, text: &str, fin: &str, ntok: i32| Completion {
        problem_id: pid,
        sample_index: k,
        prompt: "q".into(),
        prompt_token_ids: Some(vec![1, 2]),
        completion: text.into(),
        completion_token_ids: Some(vec![5; ntok as usize]),
        finish_reason: Some(fin.into()),
        num_completion_tokens: Some(ntok),
        cumulative_logprob: Some(-1.0),
        seed: Some(k as i64),
        model: Some("m".into()),
        sampling_hash: Some("h".into()),
        grade: None,
        logprobs: None,
        rationalized: false,
    };
    let rows = vec![
        row(id(0), 0, "2+2 = 4, so \\boxed{4}", "stop", 8),
        row(id(0), 1, "2+2 = 4,  so \\boxed{4}", "stop", 8), // whitespace duplicate
        row(id(0), 2, "2+2 = 4.0, so \\boxed{4}", "stop", 8), // number duplicate
        row(id(0), 3, "two and two: \\boxed{4}", "stop", 8),
        row(id(0), 4, "4 it is: \\boxed{4}", "stop", 8), // over max_per_problem = 2
        row(id(1), 0, "\\boxed{9}", "length", 8),        // truncated
        row(id(1), 1, "\\boxed{8}", "stop", 8),          // incorrect
        row(id(1), 2, "no idea", "stop", 8),             // no answer
        row(id(1), 3, "\\boxed{9}", "stop", 2),          // too short (tokens)
        row(id(1), 4, "\\boxed{9} ...", "stop", 500),    // too long (tokens)
        row(id(2), 0, "\\boxed{3}", "stop", 8),
        row("other/1".into(), 0, "\\boxed{3}", "stop", 8), // unknown problem
    ];
    let comp = dir.path().join("completions.parquet");
    write_parquet_atomic(
        &comp,
        completions_schema(false, false),
        &[completions_batch(&rows, false, false).unwrap()],
    )
    .unwrap();
    let cfg = format!(
        r#"[run]
workdir = "work"
[[data.sources]]
name = "set"
format = "gsm8k"
path = "{}"
[filter]
max_per_problem = 2
min_completion_tokens = 4
max_completion_tokens = 100
chunk_rows = 5
[filter.completions]
path = "completions.parquet"
"#,
        data.display()
    );
    std::fs::write(dir.path().join("f.toml"), cfg).unwrap();
    let o = run(&["run", "all", "--config", "f.toml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let fdir = stage_dir(&dir.path().join("work"), "filter");
    let m: selfdistill::store::Manifest =
        serde_json::from_slice(&std::fs::read(fdir.join("manifest.json")).unwrap()).unwrap();
    let get = |k: &str| m.counts.iter().find(|(n, _)| n == k).map(|c| c.1);
    assert_eq!(get("input_rows"), Some(12));
    assert_eq!(get("removed.duplicate"), Some(2));
    assert_eq!(get("removed.over_max_per_problem"), Some(1));
    assert_eq!(get("removed.truncated"), Some(1));
    assert_eq!(get("removed.incorrect"), Some(1));
    assert_eq!(get("removed.no_answer"), Some(1));
    assert_eq!(get("removed.too_short"), Some(1));
    assert_eq!(get("removed.too_long"), Some(1));
    assert_eq!(get("removed.unknown_problem"), Some(1));
    assert_eq!(get("kept"), Some(3));
    let kept = read_completions(&fdir.join("sft.parquet")).unwrap();
    let got: Vec<(String, i32)> = kept
        .iter()
        .map(|r| (r.problem_id.clone(), r.sample_index))
        .collect();
    assert_eq!(got, vec![(id(0), 0), (id(0), 3), (id(2), 0)]);
    assert_eq!(kept[0].completion_token_ids.as_ref().map(Vec::len), Some(8));
    // The console shows what each rule removed.
    assert!(
        text(&o).contains("removed        2  duplicate"),
        "{}",
        text(&o)
    );
}

#[test]
fn token_bounds_on_text_without_tokens_are_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let data = gsm_fixture(dir.path());
    let cfg = reference_config(dir.path(), "gsm8k", &data, "answer", 2);
    let t = std::fs::read_to_string(&cfg).unwrap().replace(
        "chunk_rows = 2",
        "chunk_rows = 2\nmax_completion_tokens = 10",
    );
    std::fs::write(&cfg, t).unwrap();
    let o = run(
        &["run", "all", "--config", cfg.to_str().unwrap()],
        dir.path(),
    );
    assert!(!o.status.success());
    assert!(
        text(&o).contains("has rows without token counts"),
        "{}",
        text(&o)
    );
}

#[test]
fn misspelled_completion_field_is_an_error_not_empty_output() {
    let dir = tempfile::tempdir().unwrap();
    let data = gsm_fixture(dir.path());
    let cfg = reference_config(dir.path(), "gsm8k", &data, "answr", 2);
    let o = run(
        &["run", "all", "--config", cfg.to_str().unwrap()],
        dir.path(),
    );
    assert!(!o.status.success());
    assert!(
        text(&o).contains(
            "no field `answr` (filter.completions.completion_field); did you mean `answer`?"
        ),
        "{}",
        text(&o)
    );
}

/// Every shipped pipeline validates and plans on a user's machine: no network, an empty Hugging
/// Face cache, no `../shared` (the configs are copied away from it), no GPU. Hub models are
/// planned from their built-in cards and hub data files as provisional inputs.
#[test]
fn shipped_pipelines_pass_preflight_plan_only_offline_without_shared() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    // a clone at <tmp>/clone (its data/ linked in), with no `../shared` beside it
    let user = tempfile::tempdir().unwrap();
    let pipelines = user.path().join("clone/pipelines");
    std::fs::create_dir_all(&pipelines).unwrap();
    std::os::unix::fs::symlink(root.join("data"), user.path().join("clone/data")).unwrap();
    let hf_home = user.path().join("hf");
    let mut n = 0;
    let mut planned = 0;
    for e in std::fs::read_dir(root.join("pipelines")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "toml") {
            continue;
        }
        let toml = std::fs::read_to_string(&p).unwrap();
        assert!(
            !toml
                .lines()
                .any(|l| l.starts_with("path") && l.contains("shared/")),
            "{} reads ../shared, which users do not have",
            p.display()
        );
        let copy = pipelines.join(p.file_name().unwrap());
        std::fs::write(&copy, toml).unwrap();
        let o = bin()
            .args([
                "preflight",
                "--plan-only",
                "--config",
                copy.to_str().unwrap(),
            ])
            .current_dir(user.path())
            .env("HF_HUB_OFFLINE", "1")
            .env("HF_HOME", &hf_home)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}: {}", p.display(), text(&o));
        assert!(text(&o).contains("preflight ok"), "{}", text(&o));
        planned += text(&o).matches("not downloaded: planned").count();
        n += 1;
    }
    assert!(n >= 4, "{n} pipelines");
    assert!(planned >= 1, "no hub data file was planned");
    // the shipped eval sets read hub files too
    for e in std::fs::read_dir(root.join("evals")).unwrap() {
        let p = e.unwrap().path();
        let toml = std::fs::read_to_string(&p).unwrap();
        assert!(
            !toml
                .lines()
                .any(|l| l.starts_with("path") && l.contains("shared/")),
            "{} reads ../shared",
            p.display()
        );
    }
}

/// The stage keys of the embedded default, of every shipped pipeline and of a config that sets
/// every `[sample]` key and `[eval]` override, as `preflight
/// --plan-only` prints them on a user's machine (no network, an empty Hugging Face cache), equal
/// `tests/stage-keys.txt`: a refactor that changes a key makes every user's cached stage run
/// again. A change that means to change keys rewrites the file with `SELFDISTILL_WRITE_KEYS=1`
/// and says why in its commit.
#[test]
fn stage_keys_of_the_embedded_default_and_every_shipped_pipeline_stay_the_same() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let user = tempfile::tempdir().unwrap();
    let clone = user.path().join("clone");
    std::fs::create_dir_all(clone.join("pipelines")).unwrap();
    for d in ["data", "evals"] {
        std::os::unix::fs::symlink(root.join(d), clone.join(d)).unwrap();
    }
    let mut configs: Vec<(String, Option<std::path::PathBuf>)> = vec![("<embedded>".into(), None)];
    let mut files: Vec<_> = std::fs::read_dir(root.join("pipelines"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    // every [sample] key and [eval] override set (not a pipeline to run)
    files.push(root.join("tests/fixtures/stage-keys.toml"));
    for p in files {
        let copy = clone.join("pipelines").join(p.file_name().unwrap());
        std::fs::copy(&p, &copy).unwrap();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        configs.push((name, Some(copy)));
    }
    let mut got = String::new();
    for (i, (name, config)) in configs.iter().enumerate() {
        let mut cmd = bin();
        cmd.args(["preflight", "--plan-only", "--workdir"])
            .arg(user.path().join(format!("work{i}")));
        if let Some(c) = config {
            cmd.arg("--config").arg(c);
        }
        let o = cmd
            .current_dir(&clone)
            .env("HF_HUB_OFFLINE", "1")
            .env("HF_HOME", user.path().join("hf"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{name}: {}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let mut table = false;
        for line in out.lines() {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.first() == Some(&"stage") && cols.get(1) == Some(&"key") {
                table = true;
                continue;
            }
            if table && cols.len() >= 3 && cols[1].len() == 12 {
                got.push_str(&format!("{name} {} {}\n", cols[0], cols[1]));
            } else if table {
                table = false;
            }
        }
    }
    let golden = root.join("tests/stage-keys.txt");
    if std::env::var_os("SELFDISTILL_WRITE_KEYS").is_some() {
        std::fs::write(&golden, &got).unwrap();
    }
    let want = std::fs::read_to_string(&golden).unwrap();
    assert!(got.lines().count() >= 20, "too few stages planned:\n{got}");
    assert_eq!(
        got, want,
        "stage keys changed (left: now, right: tests/stage-keys.txt)"
    );
}

/// `preflight --plan-only --gpu` checks a GPU train stage against the named GPU: the shipped
/// Qwen3-4B run (bf16 compute, fp32 master weights and moments, recompute, 4,096 tokens per
/// micro-batch) fits an H100; without recompute it does not, and the refusal names the stage,
/// both sizes and the GPU; an unknown GPU name is an error that lists the known ones.
#[test]
fn preflight_checks_the_train_stage_against_a_named_gpu() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let toml = std::fs::read_to_string(root.join("pipelines/qwen3-4b-gsm8k.toml")).unwrap();
    let fits = dir.path().join("fits.toml");
    std::fs::write(&fits, &toml).unwrap();
    let too_big = dir.path().join("too-big.toml");
    std::fs::write(
        &too_big,
        toml.replace("recompute = true", "recompute = false"),
    )
    .unwrap();
    let preflight = |cfg: &std::path::Path, gpu: &str| {
        bin()
            .args(["preflight", "--plan-only", "--gpu", gpu, "--config"])
            .arg(cfg)
            .current_dir(dir.path())
            .env("HF_HUB_OFFLINE", "1")
            .env("HF_HOME", dir.path().join("hf"))
            .output()
            .unwrap()
    };
    let o = preflight(&fits, "h100");
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("GPU memory: NVIDIA H100 80GB: 74.5 GiB"),
        "{}",
        text(&o)
    );
    let o = preflight(&too_big, "h100");
    assert!(!o.status.success());
    let out = text(&o);
    assert!(
        out.contains("the train stage needs about")
            && out.contains("NVIDIA H100 80GB has 74.5 GiB"),
        "{out}"
    );
    // a bigger GPU takes the same run
    assert!(preflight(&too_big, "b200").status.success());
    // compared with others, a GPU it does not fit is marked, not failed; none fitting fails
    let o = preflight(&too_big, "h100,b200");
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("GPU memory: NVIDIA H100 80GB: 74.5 GiB: does not fit (train needs")
            && out.contains("GPU memory: NVIDIA B200 180GB: 167.6 GiB: every GPU stage fits"),
        "{out}"
    );
    let h100 = out
        .lines()
        .skip_while(|l| !l.starts_with("the job on each GPU"))
        .find(|l| l.contains("NVIDIA H100"))
        .unwrap();
    assert!(h100.contains("does not fit: train needs"), "{h100}");
    let o = preflight(&too_big, "h100,40GB");
    assert!(!o.status.success());
    assert!(
        text(&o).contains("the GPU stages fit on none of"),
        "{}",
        text(&o)
    );
    let o = preflight(&fits, "h1000");
    assert!(!o.status.success());
    assert!(text(&o).contains("h100, h200, b200"), "{}", text(&o));
}

/// The trainer's printed memory budget against the peak a step measures (`bench train`, its
/// own process: peak RSS over weights and moments) on a CPU shape, through our CPU ops and the
/// device-generic ones: within 15% of the whole peak.
#[test]
fn the_train_memory_budget_is_within_15_percent_of_the_measured_peak() {
    let dir = tempfile::tempdir().unwrap();
    for ops in ["auto", "generic"] {
        let o = run(
            &[
                "bench",
                "train",
                "--shape",
                "20m",
                "--rows",
                "4",
                "--seq-len",
                "128",
                "--steps",
                "1",
                "--quick",
                "--ops",
                ops,
            ],
            dir.path(),
        );
        assert!(o.status.success(), "{}", text(&o));
        let out = text(&o);
        let row = out
            .lines()
            .find(|l| l.trim_start().starts_with("false") && l.trim_end().ends_with('%'))
            .unwrap_or_else(|| panic!("no result row: {out}"));
        let ratio: f64 = row
            .split_whitespace()
            .last()
            .unwrap()
            .trim_end_matches('%')
            .parse()
            .unwrap();
        assert!(
            (85.0..=115.0).contains(&ratio),
            "ops {ops}: the budget is {ratio}% of the measured peak: {row}"
        );
    }
}

/// A GPU sample stage: preflight refuses it on a GPU whose memory cannot hold the weights and
/// the least KV cache, and on one that can, prints each stage's tokens, throughput, time, GPU
/// hours and cost at `run.gpu_hour_price`.
#[test]
fn preflight_refuses_a_gpu_sample_stage_that_does_not_fit_and_prints_time_and_cost() {
    let Some(math) = shared("data/math500.jsonl") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("s.toml");
    std::fs::write(
        &cfg,
        format!(
            "[run]\nname = \"s\"\ngpu_hour_price = 3.0\n[[data.sources]]\nname = \"math500\"\n\
             format = \"math\"\npath = \"{}\"\n[sample]\nmodel = \"Qwen/Qwen3-4B\"\nn = 4\n\
             max_new_tokens = 4096\ndevice = \"cuda\"\nmax_num_seqs = 128\n",
            math.display()
        ),
    )
    .unwrap();
    let preflight = |gpu: &str| {
        bin()
            .args(["preflight", "--plan-only", "--gpu", gpu, "--config"])
            .arg(&cfg)
            .current_dir(dir.path())
            .env("HF_HUB_OFFLINE", "1")
            .env("HF_HOME", dir.path().join("hf"))
            .env("SELFDISTILL_CACHE_DIR", dir.path().join("cache"))
            .output()
            .unwrap()
    };
    let o = preflight("8GB");
    assert!(!o.status.success());
    let out = text(&o);
    assert!(
        out.contains("the sample stage needs about") && out.contains("max_num_seqs"),
        "{out}"
    );
    let o = preflight("h100");
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    // 500 problems x 4 samples x half of 4,096 tokens
    let row = out
        .lines()
        .find(|l| l.trim_start().starts_with("sample ") && l.contains("4096000"))
        .unwrap_or_else(|| panic!("no sample row with 4096000 tokens: {out}"));
    assert!(row.contains("NVIDIA H100 80GB"), "{row}");
    assert!(row.contains("500 problems x n 4 x 2048 tokens"), "{row}");
    let cols: Vec<&str> = row.split_whitespace().collect();
    let (rate, hours, cost): (f64, f64, f64) = (
        cols[2].parse().unwrap(),
        cols[4].parse().unwrap(),
        cols[5].parse().unwrap(),
    );
    // the H100's measured Qwen3-4B rate at batch 128 (11,015 tok/s), for a model of about
    // that size
    assert!(rate > 1000.0 && rate < 20000.0, "{row}");
    assert!((hours - 4096000.0 / rate / 3600.0).abs() < 0.01, "{row}");
    assert!((cost - 3.0 * hours).abs() < 0.02, "{row}");
    assert!(out.contains("at 3 per GPU-hour"), "{out}");
}

/// A closed stdout (`| head -1`) ends the output, not the program: `pipeline run all` runs
/// every stage and exits 0, and `preflight` and `data inspect` exit 0 without a panic.
#[test]
fn a_closed_stdout_ends_the_output_not_the_run() {
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let data = gsm_fixture(dir.path());
    let cfg = reference_config(dir.path(), "gsm8k", &data, "answer", 2);
    let cfg = cfg.to_str().unwrap();
    let data = data.to_str().unwrap();
    for args in [
        vec!["preflight", "--config", cfg],
        vec!["data", "inspect", data, "--rows", "3"],
        vec!["run", "all", "--config", cfg],
    ] {
        let mut child = bin()
            .args(&args)
            .current_dir(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // the reader goes away before the first line (the child is still starting): every
        // write to stdout meets a closed pipe
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // every stage of the run finished
    assert_eq!(glob_manifests(&dir.path().join("work")).len(), 2);
}

/// A run whose report cannot be written (here `report` is a file, not a folder; a full disk
/// does the same) exits non-zero and says so, its stages staying done; `pipeline report`
/// writes the report once it can.
#[test]
fn a_report_that_cannot_be_written_fails_the_run_not_its_stages() {
    let dir = tempfile::tempdir().unwrap();
    let data = gsm_fixture(dir.path());
    let cfg = reference_config(dir.path(), "gsm8k", &data, "answer", 2);
    let cfg = cfg.to_str().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("report"), "in the way").unwrap();
    let o = run(&["run", "all", "--config", cfg], dir.path());
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("every stage is done, but the report could not be written"),
        "{}",
        text(&o)
    );
    assert_eq!(glob_manifests(&work).len(), 2);
    std::fs::remove_file(work.join("report")).unwrap();
    let o = run(&["report", "--workdir", "work"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(work.join("report/report.md").is_file());
}

/// An empty data file is an error naming the source and the file, not a finished 0-row data
/// stage; `allow_empty = true` in the source allows it.
#[test]
fn an_empty_source_is_an_error_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("empty.jsonl");
    std::fs::write(&data, "").unwrap();
    let cfg = reference_config(dir.path(), "gsm8k", &data, "answer", 2);
    let o = run(
        &["run", "all", "--config", cfg.to_str().unwrap()],
        dir.path(),
    );
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("source `set` (") && text(&o).contains("empty.jsonl) has no rows"),
        "{}",
        text(&o)
    );
    assert!(glob_manifests(&dir.path().join("work")).is_empty());
    let toml = std::fs::read_to_string(&cfg).unwrap();
    let allowed = toml.replacen("name = \"set\"", "name = \"set\"\nallow_empty = true", 1);
    std::fs::write(&cfg, allowed).unwrap();
    let o = run(
        &["run", "all", "--config", cfg.to_str().unwrap()],
        dir.path(),
    );
    let data_stage = glob_manifests(&dir.path().join("work"));
    assert!(!data_stage.is_empty(), "{}", text(&o));
}

/// `scripts/gpu-acceptance.sh` (what a lent GPU runs, issue 35) works before a GPU is lent: its
/// speed and job parts on the CPU with tiny shapes, through the real binary, including the
/// SIGKILLed runs that resume, and `bench checkpoint` writes a folder the jobs load.
#[test]
fn the_gpu_acceptance_script_runs_its_parts_on_the_cpu() {
    let Some(math) = shared("data/math500.jsonl") else {
        return;
    };
    let shared_dir = math.parent().unwrap().parent().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = std::process::Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gpu-acceptance.sh"))
        .args(["speed", "job"])
        .env("OUT", &out)
        .env("WORK", dir.path())
        .env("DEVICE", "cpu")
        .env("SMALL", "1")
        .env("PIPELINE", exe())
        .env("SHARED", shared_dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let summary = std::fs::read_to_string(out.join("summary.txt")).unwrap();
    for step in [
        "bench sample tiny: ok",
        "bench sample hybrid-20m: ok",
        "bench train tiny: ok",
        "job-a, SIGKILLed after the first part: ok (exit 137)",
        "job-a, resumed: ok (exit 0)",
        "job-b, SIGKILLed after the first checkpoint: ok (exit 137)",
        "job-b, resumed: ok (exit 0)",
    ] {
        assert!(summary.contains(step), "no `{step}` in:\n{summary}");
    }
    let job = std::fs::read_to_string(out.join("job.log")).unwrap();
    assert!(
        job.contains("decode tok/s") || job.contains("done"),
        "{job}"
    );
}

/// Preflight refuses what would fail a run at its start, each naming the file: a truncated
/// weight file, a config.json of another model size, a tokenizer.json that does not parse, a
/// chat template with a syntax error (the config samples with `chat`), and a work dir that
/// cannot be written; the untouched fixture passes.
#[test]
fn preflight_refuses_a_broken_checkpoint_or_an_unwritable_work_dir() {
    let Some(fixture) = shared("fixtures/tiny-qwen3_5") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let problems = toy_problems(dir.path(), 4);
    let check = |name: &str, workdir: &str, spoil: &dyn Fn(&Path)| {
        let model = dir.path().join(name);
        copy_checkpoint(&fixture, &model);
        spoil(&model);
        let cfg = dir.path().join(format!("{name}.toml"));
        std::fs::write(
            &cfg,
            format!(
                r#"[run]
workdir = "{workdir}"
[[data.sources]]
name = "toy"
format = "mapped"
path = "{}"
problem_field = "problem"
answer_field = "answer"
[sample]
model = "{}"
prompt_template = "chat"
n = 1
max_new_tokens = 4
"#,
                problems.display(),
                model.display()
            ),
        )
        .unwrap();
        run(
            &["preflight", "--config", cfg.to_str().unwrap()],
            dir.path(),
        )
    };
    let o = check("whole", "work", &|_| {});
    assert!(o.status.success(), "{}", text(&o));
    let expect = |o: std::process::Output, what: &[&str]| {
        assert!(!o.status.success(), "{}", text(&o));
        for w in what {
            assert!(text(&o).contains(w), "no `{w}` in {}", text(&o));
        }
    };
    expect(
        check("cut", "work", &|m| {
            let w = m.join("model.safetensors");
            let len = std::fs::metadata(&w).unwrap().len();
            let f = std::fs::OpenOptions::new().write(true).open(&w).unwrap();
            f.set_len(len - 1000).unwrap();
        }),
        &["cut/model.safetensors", "truncated"],
    );
    expect(
        check("resized", "work", &|m| {
            let p = m.join("config.json");
            let mut c: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            let t = if c.get("text_config").is_some() {
                &mut c["text_config"]
            } else {
                &mut c
            };
            let h = t["hidden_size"].as_u64().unwrap();
            t["hidden_size"] = (h * 2).into();
            std::fs::write(&p, c.to_string()).unwrap();
        }),
        &["resized", "different models"],
    );
    expect(
        check("tok", "work", &|m| {
            std::fs::write(m.join("tokenizer.json"), "{\"not\": \"a tokenizer\"}").unwrap()
        }),
        &["tok/tokenizer.json"],
    );
    expect(
        check("tmpl", "work", &|m| {
            std::fs::write(m.join("chat_template.jinja"), "{% if messages %}unclosed").unwrap()
        }),
        &["tmpl/chat_template.jinja", "does not parse"],
    );
    // /proc takes no files, whoever runs the test (root writes through mode bits)
    expect(
        check("ro", "/proc/selfdistill-preflight/work", &|_| {}),
        &["cannot be written"],
    );
}

/// `pipeline run` checks `run.disk_budget` before each stage against what the work dir holds
/// then (preflight only sees the plan): a work dir that filled up after the plan refuses the
/// next stage with the figures, and nothing of that stage is marked done.
#[test]
fn run_checks_the_disk_budget_before_each_stage() {
    let dir = tempfile::tempdir().unwrap();
    let data = gsm_fixture(dir.path());
    let cfg = reference_config(dir.path(), "gsm8k", &data, "answer", 1);
    let text_of = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text_of.replace("[run]\n", "[run]\ndisk_budget = \"2 MiB\"\n"),
    )
    .unwrap();
    let o = run(
        &["run", "data", "--config", cfg.to_str().unwrap()],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    // something else fills the work dir
    std::fs::write(dir.path().join("work/big.bin"), vec![0u8; 3 << 20]).unwrap();
    let o = run(
        &["run", "all", "--config", cfg.to_str().unwrap()],
        dir.path(),
    );
    assert!(!o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(
        out.contains("run.disk_budget = 2.0 MiB") && out.contains("the filter stage needs"),
        "{out}"
    );
    let filter_done = std::fs::read_dir(dir.path().join("work/stages"))
        .unwrap()
        .flatten()
        .any(|e| {
            e.file_name().to_string_lossy().starts_with("filter-")
                && e.path().join("manifest.json").exists()
        });
    assert!(!filter_done, "{out}");
}

/// A FIFO given as a data file is refused at once (it would block preflight's hash forever).
#[test]
fn a_fifo_as_a_data_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("in.jsonl");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let cfg = reference_config(dir.path(), "gsm8k", &fifo, "answer", 1);
    let o = run(
        &["preflight", "--config", cfg.to_str().unwrap()],
        dir.path(),
    );
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("in.jsonl: not a regular file"),
        "{}",
        text(&o)
    );
}

/// `pipeline sample`'s error for a malformed input row says how this command skips such rows
/// (`--skip-bad-rows`), not a config key it does not read; with the flag the row is skipped.
#[test]
fn sample_says_how_it_skips_malformed_rows() {
    let Some(model) = shared("fixtures/tiny-qwen3") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        "{\"question\": \"What is 1+1?\", \"answer\": \"#### 2\"}\nnot json\n",
    )
    .unwrap();
    let args = |extra: &[&str]| {
        let mut a = vec![
            "sample",
            "--model",
            model.to_str().unwrap(),
            "--input",
            "in.jsonl",
            "--format",
            "gsm8k",
            "--prompt-template",
            "raw",
            "--max-new-tokens",
            "2",
            "--output",
            "out.parquet",
        ];
        a.extend_from_slice(extra);
        run(&a, dir.path())
    };
    let o = args(&[]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("in.jsonl:2") && text(&o).contains("pass --skip-bad-rows"),
        "{}",
        text(&o)
    );
    assert!(!text(&o).contains("data.skip_bad_rows"), "{}", text(&o));
    let o = args(&["--skip-bad-rows"]);
    assert!(o.status.success(), "{}", text(&o));
}

/// An unknown eval set names each folder and each known set once.
#[test]
fn an_unknown_eval_set_lists_each_set_once() {
    let dir = tempfile::tempdir().unwrap();
    let o = run(
        &[
            "eval",
            "--model",
            "/nonexistent",
            "--sets",
            "nosuchset",
            "--output",
            "ev",
        ],
        Path::new(env!("CARGO_MANIFEST_DIR")),
    );
    let _ = dir;
    assert!(!o.status.success());
    let out = text(&o);
    let line = out
        .lines()
        .find(|l| l.contains("known sets"))
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(line.matches("math500").count(), 1, "{line}");
    let dirs = line.split("known sets").next().unwrap();
    assert_eq!(dirs.matches("evals").count(), 1, "{line}");
}

/// A work dir path that is not UTF-8 is refused up front, by name (it used to fail stages later
/// with "no checkpoint folder" for a folder that existed).
#[test]
fn a_work_dir_that_is_not_utf8_is_refused_up_front() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let data = gsm_fixture(dir.path());
    let cfg = reference_config(dir.path(), "gsm8k", &data, "answer", 1);
    let work = dir.path().join(std::ffi::OsStr::from_bytes(b"w\xffork"));
    for cmd in ["run", "preflight"] {
        let mut c = bin();
        c.arg(cmd);
        if cmd == "run" {
            c.arg("all");
        }
        let o = c
            .args(["--config", cfg.to_str().unwrap(), "--workdir"])
            .arg(&work)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(!o.status.success(), "{cmd}: {}", text(&o));
        assert!(text(&o).contains("not valid UTF-8"), "{cmd}: {}", text(&o));
        assert!(!work.exists(), "{cmd} created it");
    }
}

/// `bench sample`'s multiply-add peak is never below a rate the machine measured in the same
/// run (its roofline would otherwise call a slow step fast).
#[test]
fn bench_sample_peak_is_at_least_every_measured_rate() {
    let dir = tempfile::tempdir().unwrap();
    let o = run(
        &[
            "bench",
            "sample",
            "--shape",
            "tiny",
            "--batch",
            "1",
            "--new-tokens",
            "2",
            "--repeat",
            "1",
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    let line = out.lines().find(|l| l.starts_with("machine:")).unwrap();
    let rates: Vec<f64> = line
        .split(" GFLOP/s")
        .filter_map(|s| s.rsplit(' ').next()?.parse().ok())
        .collect();
    assert_eq!(rates.len(), 3, "{line}");
    assert!(rates[0] >= rates[1] && rates[0] >= rates[2], "{line}");
}

/// `pipeline data decontaminate`: MATH-500 as a training file (pyarrow's Parquet, each problem
/// behind a prompt prefix) against three of its problems in a JSONL file: the three are found
/// by n-gram, and so is a fourth problem that shares an 8-word phrase of the answer format
/// ("where r > 0 and 0 <= theta < 2 pi"); the other 496 rows are written to --output with the
/// input's schema, the matches to --matches; a JSONL training file keeps its lines verbatim.
#[test]
fn data_decontaminate_prints_the_overlap_and_writes_the_rest() {
    let (Some(train), Some(math)) = (
        shared("data/math500_rl.parquet"),
        shared("data/math500.jsonl"),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = std::fs::read_to_string(&math)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let held: Vec<&str> = [0, 9, 99].iter().map(|&i| lines[i].as_str()).collect();
    std::fs::write(dir.path().join("held.jsonl"), held.join("\n") + "\n").unwrap();
    let o = run(
        &[
            "data",
            "decontaminate",
            "--train",
            train.to_str().unwrap(),
            "--against",
            "held.jsonl",
            "--output",
            "kept.parquet",
            "--matches",
            "m.parquet",
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    for want in [
        "500 training problems (field `problem`) against 1 set(s), 8-grams",
        "| held.jsonl | 3 | 4 | 0 | 4 |",
        "4 of 500 training problems (0.80%) match an eval problem",
        "kept 496 rows -> kept.parquet",
        "4 matches -> m.parquet",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    let kept =
        selfdistill::data::records::read_all_records(&dir.path().join("kept.parquet")).unwrap();
    assert_eq!(kept.len(), 496);
    let keys: Vec<&String> = kept[0].fields.keys().collect();
    assert_eq!(keys, ["problem", "answer"]);
    let m = selfdistill::data::records::read_all_records(&dir.path().join("m.parquet")).unwrap();
    let rows: Vec<&str> = m
        .iter()
        .map(|r| r.fields["problem_id"].as_str().unwrap())
        .collect();
    assert_eq!(rows, ["1", "10", "100", "467"]);
    assert!(m.iter().all(|r| r.fields["match"] == "ngram"));

    // JSONL in, JSONL out, lines verbatim; a wrong output format and an unknown set are refused
    std::fs::write(dir.path().join("t.jsonl"), lines[..20].join("\n") + "\n").unwrap();
    let o = run(
        &[
            "data",
            "decontaminate",
            "--train",
            "t.jsonl",
            "--against",
            "held.jsonl",
            "--ngram",
            "13",
            "--output",
            "k.jsonl",
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let k = std::fs::read_to_string(dir.path().join("k.jsonl")).unwrap();
    let want: Vec<&str> = lines[..20]
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 0 && *i != 9)
        .map(|(_, l)| l.as_str())
        .collect();
    assert_eq!(k, want.join("\n") + "\n");
    let o = run(
        &[
            "data",
            "decontaminate",
            "--train",
            "t.jsonl",
            "--against",
            "held.jsonl",
            "--output",
            "k.parquet",
        ],
        dir.path(),
    );
    assert!(
        !o.status.success() && text(&o).contains("the input's format"),
        "{}",
        text(&o)
    );
    let o = run(
        &[
            "data",
            "decontaminate",
            "--train",
            "t.jsonl",
            "--against",
            "aime42",
        ],
        dir.path(),
    );
    assert!(
        !o.status.success() && text(&o).contains("eval set `aime42`"),
        "{}",
        text(&o)
    );
}

/// Every shipped real job is planned offline (nothing downloaded: the hub data from their
/// built-in cards, the model from its card): preflight prints each stage's time, GPU hours and
/// cost, says which rows came from a card, and with `--gpu h100,h200,b200` one row per GPU at
/// that GPU's price from the config's price table.
#[test]
fn preflight_plans_every_shipped_real_job_offline_with_time_and_cost_per_gpu() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    for job in [
        "qwen3-4b-gsm8k",
        "qwen3.5-4b-gsm8k",
        "eval-only",
        "sample-only",
    ] {
        let o = bin()
            .args([
                "preflight",
                "--plan-only",
                "--gpu",
                "h100,h200,b200",
                "--config",
            ])
            .arg(repo.join(format!("pipelines/{job}.toml")))
            .args(["--workdir", "w"])
            .current_dir(dir.path())
            .env("HF_HUB_OFFLINE", "1")
            .env("HF_HOME", dir.path().join("hf"))
            .env("SELFDISTILL_CACHE_DIR", dir.path().join("cache"))
            .output()
            .unwrap();
        let out = text(&o);
        assert!(o.status.success(), "{job}: {out}");
        assert!(
            out.contains("rows from built-in cards: hf://"),
            "{job}: {out}"
        );
        let total = out
            .lines()
            .find(|l| l.trim_start().starts_with("total:"))
            .unwrap_or_else(|| panic!("{job}: no total: {out}"));
        assert!(
            total.contains("GPU hours, cost") && total.contains("at 2.99 per GPU-hour"),
            "{job}: {total}"
        );
        let rows: Vec<&str> = out
            .lines()
            .skip_while(|l| !l.starts_with("the job on each GPU"))
            .skip(2)
            .take(3)
            .collect();
        assert_eq!(rows.len(), 3, "{job}: {out}");
        for (row, (gpu, price)) in rows
            .iter()
            .zip([("H100", 2.99), ("H200", 3.79), ("B200", 5.99)])
        {
            assert!(row.contains(gpu), "{job}: {row}");
            let cols: Vec<&str> = row.split_whitespace().collect();
            // name (3 words), time, GPU hours, price, cost
            let hours: f64 = cols[4].parse().unwrap();
            let (p, cost): (f64, f64) = (cols[5].parse().unwrap(), cols[6].parse().unwrap());
            assert!(hours > 0.0 && (p - price).abs() < 1e-9, "{job}: {row}");
            assert!(
                (cost - p * hours).abs() < 0.02 + 0.01 * cost,
                "{job}: {row}"
            );
        }
        assert!(out.contains("fastest"), "{job}: {out}");
    }
}

/// `--set KEY=VALUE` gives the stage keys of the file with the key written in it, a work dir
/// named with the overrides, and clear errors for an unknown key or a wrong type.
#[test]
fn set_overrides_a_key_as_if_written_in_the_file() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let toml = std::fs::read_to_string(repo.join("pipelines/qwen3-4b-gsm8k.toml")).unwrap();
    let file = dir.path().join("q.toml");
    std::fs::write(&file, &toml).unwrap();
    let written = dir.path().join("w.toml");
    std::fs::write(
        &written,
        toml.replacen("\nlr = 1e-5", "\nlr = 2e-5", 1)
            .replacen("\nn = 8", "\nn = 16", 1),
    )
    .unwrap();
    let preflight = |cfg: &Path, extra: &[&str]| {
        let o = bin()
            .args(["preflight", "--plan-only", "--config"])
            .arg(cfg)
            .args(extra)
            .current_dir(dir.path())
            .env("HF_HUB_OFFLINE", "1")
            .env("HF_HOME", dir.path().join("hf"))
            .output()
            .unwrap();
        (o.status.success(), text(&o))
    };
    let keys = |out: &str| -> Vec<String> {
        out.lines()
            .skip_while(|l| !l.starts_with("stage "))
            .skip(1)
            .take_while(|l| !l.starts_with("needs "))
            .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
            .collect()
    };
    let (ok, base) = preflight(&file, &[]);
    assert!(ok, "{base}");
    let (ok, set) = preflight(&file, &["--set", "train.lr=2e-5", "--set", "sample.n=16"]);
    assert!(ok, "{set}");
    let (ok, w) = preflight(&written, &[]);
    assert!(ok, "{w}");
    assert_eq!(keys(&set), keys(&w), "{set}\n{w}");
    assert_ne!(keys(&set), keys(&base));
    assert_eq!(keys(&set).len(), 5, "{set}");
    assert!(
        set.contains("runs/qwen3-4b-gsm8k+train.lr=2e-5+sample.n=16"),
        "{set}"
    );
    for (extra, want) in [
        ("train.lrr=1", "--set train.lrr=1 (over"),
        ("sample.n=many", "--set sample.n=many (over"),
        ("train.lr", "expected KEY=VALUE"),
    ] {
        let (ok, out) = preflight(&file, &["--set", extra]);
        assert!(!ok && out.contains(want), "{extra}: {out}");
    }
    let (_, out) = preflight(&file, &["--set", "train.lrr=1"]);
    assert!(out.contains("did you mean `lr`?"), "{out}");
}

/// A Gemma 3 pipeline planned from its card (not downloaded): on the CPU preflight passes; on a
/// GPU it fails before anything runs, naming why (our GPU kernels have no window ring) and what
/// to do instead.
#[test]
fn preflight_plans_gemma3_from_its_card_and_refuses_our_gpu_sampler_for_it() {
    let dir = tempfile::tempdir().unwrap();
    toy_problems(dir.path(), 4);
    let config = |device: &str| {
        format!(
            "[run]\nworkdir = \"w\"\n[[data.sources]]\nname = \"toy\"\nformat = \"math\"\n\
             path = \"problems.jsonl\"\n[sample]\nmodel = \"google/gemma-3-1b-it\"\n\
             prompt_template = \"chat\"\nn = 4\nmax_new_tokens = 2048\n{device}\n"
        )
    };
    let preflight = |name: &str, text: String| {
        std::fs::write(dir.path().join(name), text).unwrap();
        bin()
            .args(["preflight", "--plan-only", "--config", name])
            .current_dir(dir.path())
            .env("HF_HUB_OFFLINE", "1")
            .env("HF_HOME", dir.path().join("hf"))
            .output()
            .unwrap()
    };
    let o = preflight("cpu.toml", config(""));
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("preflight ok"), "{}", text(&o));
    let o = preflight("gpu.toml", config("device = \"cuda\"\ndtype = \"bf16\""));
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("sliding-window layers run in our CPU sampler only")
            && text(&o).contains("device = \"cpu\""),
        "{}",
        text(&o)
    );
}

/// `pipeline ARGS` in `cwd`, killed if it runs past `secs` (a hang fails the test instead of
/// hanging it).
fn run_within(args: &[&str], cwd: &Path, secs: u64) -> std::process::Output {
    let mut child = bin()
        .args(args)
        .current_dir(cwd)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed().as_secs() >= secs {
            child.kill().unwrap();
            let o = child.wait_with_output().unwrap();
            panic!("pipeline {args:?} ran past {secs} s: {}", text(&o));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// A directory or a device where a file is read is refused at once: `data inspect` of a folder
/// spun forever, `--config /dev/zero` read without end.
#[test]
fn a_directory_or_a_device_where_a_file_goes_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let o = run_within(&["data", "inspect", "."], dir.path(), 20);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(": a directory, not a file"),
        "{}",
        text(&o)
    );
    for cmd in ["preflight", "run", "status"] {
        let o = run_within(&[cmd, "--config", "/dev/zero"], dir.path(), 20);
        assert!(!o.status.success(), "{}", text(&o));
        assert!(
            text(&o).contains("config: /dev/zero: not a regular file"),
            "{cmd}: {}",
            text(&o)
        );
    }
    let big = dir.path().join("big.toml");
    std::fs::write(&big, "#".repeat(5 << 20)).unwrap();
    let o = run_within(&["preflight", "--config", "big.toml"], dir.path(), 20);
    assert!(
        text(&o).contains("larger than any settings file"),
        "{}",
        text(&o)
    );
}

/// `data arith` with a huge `per_level` is an error (it aborted on the allocation, exit 134),
/// and a split named with `..` writes nothing outside `--output`.
#[test]
fn arith_specs_are_bounded_and_stay_in_their_folder() {
    let dir = tempfile::tempdir().unwrap();
    let spec = |name: &str, per_level: &str| {
        format!(
            "seed = 1\n[[levels]]\nsteps = 2\nstart_min = 10\nmin = 10\nmax = 99\nmax_change = 9\n\
             [[splits]]\nname = \"{name}\"\nlevels = [1]\nper_level = {per_level}\n"
        )
    };
    std::fs::create_dir(dir.path().join("out")).unwrap();
    for (name, per_level, want) in [
        ("train", "4000000000000000000", "more than 1000000 problems"),
        ("../escape", "3", "a split name is a file name"),
    ] {
        std::fs::write(dir.path().join("spec.toml"), spec(name, per_level)).unwrap();
        let o = run_within(
            &["data", "arith", "--spec", "spec.toml", "--output", "out"],
            dir.path(),
            60,
        );
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(text(&o).contains(want), "{}", text(&o));
    }
    assert!(!dir.path().join("escape.jsonl").exists());
    std::fs::write(dir.path().join("spec.toml"), spec("ok", "3")).unwrap();
    let o = run(
        &["data", "arith", "--spec", "spec.toml", "--output", "out"],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(dir.path().join("out/ok.jsonl").is_file());
}

/// `pipeline run` makes preflight's checks before its first stage: a KV cache larger than the
/// memory is refused before pretraining (it aborted after it), and nothing is marked done.
#[test]
fn run_refuses_what_preflight_refuses_before_the_first_stage() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("w");
    let o = run_within(
        &[
            "run",
            "all",
            "--workdir",
            work.to_str().unwrap(),
            "--set",
            "sample.kv_cache=\"1 TiB\"",
        ],
        root,
        120,
    );
    assert!(!o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("this run would not fit, so no stage was started"),
        "{t}"
    );
    assert!(t.contains("of memory but"), "{t}");
    assert!(!t.contains("==> "), "a stage started: {t}");
    assert!(glob_manifests(&work).is_empty());
    // preflight says the same
    let o = run_within(
        &[
            "preflight",
            "--workdir",
            work.to_str().unwrap(),
            "--set",
            "sample.kv_cache=\"1 TiB\"",
        ],
        root,
        120,
    );
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("of memory but"), "{}", text(&o));
}

/// Counts of nothing are refused where they are given: `eval.limit = 0` (it ran every stage and
/// then failed), a source's `limit = 0`, `--limit 0`, `--stop-after 0` (it trained every step).
#[test]
fn a_count_of_zero_is_refused_where_it_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let o = run(&["preflight", "--plan-only", "--set", "eval.limit=0"], root);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("`eval.limit`") && text(&o).contains("0 evaluates no problem"),
        "{}",
        text(&o)
    );
    let o = run(
        &[
            "preflight",
            "--plan-only",
            "--set",
            "data.sources.0.limit=0",
        ],
        root,
    );
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("0 reads no problem"), "{}", text(&o));
    for args in [
        &[
            "eval",
            "--model",
            "m",
            "--sets",
            "gsm8k_test",
            "--limit",
            "0",
            "--output",
            "o",
        ][..],
        &[
            "sample",
            "--model",
            "m",
            "--input",
            "p.jsonl",
            "--limit",
            "0",
            "--output",
            "o.parquet",
        ],
        &[
            "train",
            "--model",
            "m",
            "--data",
            "d.parquet",
            "--output",
            "o",
            "--stop-after",
            "0",
        ],
    ] {
        let o = run(args, dir.path());
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains("`0`: give 1 or more"), "{}", text(&o));
    }
}

/// Outputs are checked before the work: `grade` and `merge` refuse an output that is one of
/// their inputs (the input was overwritten), `sample` an output that is a directory (found
/// only after sampling); `grade` of a file without rows says so and fails.
#[test]
fn outputs_that_would_replace_an_input_or_are_folders_are_refused_first() {
    let dir = tempfile::tempdir().unwrap();
    let data = gsm_fixture(dir.path());
    let before = std::fs::read(&data).unwrap();
    let o = run(
        &[
            "grade",
            "--input",
            "gsm.jsonl",
            "--answer-field",
            "answer",
            "--completion-field",
            "answer",
            "--output",
            "./gsm.jsonl",
        ],
        dir.path(),
    );
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("is the input"), "{}", text(&o));
    assert_eq!(std::fs::read(&data).unwrap(), before);
    let o = run(&["merge", "--output", "gsm.jsonl", "gsm.jsonl"], dir.path());
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("is the input"), "{}", text(&o));
    assert_eq!(std::fs::read(&data).unwrap(), before);
    std::fs::create_dir(dir.path().join("out")).unwrap();
    let input = toy_problems(dir.path(), 3);
    let o = run(
        &[
            "sample",
            "--model",
            "no-such-model",
            "--input",
            input.to_str().unwrap(),
            "--output",
            "out",
        ],
        dir.path(),
    );
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("--output out: an existing directory"),
        "{}",
        text(&o)
    );
    std::fs::write(dir.path().join("empty.jsonl"), "").unwrap();
    let o = run(
        &[
            "grade",
            "--input",
            "empty.jsonl",
            "--answer-field",
            "a",
            "--completion-field",
            "c",
        ],
        dir.path(),
    );
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("has no rows: nothing to grade"),
        "{}",
        text(&o)
    );
}

/// `status` on a folder that no run wrote is an error, not an empty table.
#[test]
fn status_of_a_folder_that_is_no_run_fails() {
    let dir = tempfile::tempdir().unwrap();
    let o = run(&["status", "--workdir", "."], dir.path());
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("is not the work dir of a run"),
        "{}",
        text(&o)
    );
}

/// Preflight of the embedded default estimates the pretrain stage too (its longest), and takes
/// training rates from this machine's finished training runs once there is one (issue 47): the
/// first estimate says its rate is assumed, the next one names the run it measured.
#[test]
fn preflight_estimates_pretraining_and_takes_training_rates_from_this_machine() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let preflight = || {
        let o = bin()
            .arg("preflight")
            .current_dir(dir.path())
            .env("SELFDISTILL_CACHE_DIR", &cache)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        text(&o)
    };
    let rows = |out: &str, stage: &str| -> String {
        let at = out
            .find("time and cost of the stages")
            .expect("a time table");
        out[at..]
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{stage} ")))
            .unwrap_or_else(|| panic!("no {stage} row in:\n{out}"))
            .to_string()
    };
    let out = preflight();
    let pre = rows(&out, "pretrain");
    assert!(pre.contains("steps) x") && pre.contains("assumed"), "{pre}");
    assert!(
        rows(&out, "train-r1").contains("GFLOP/s (assumed)"),
        "{out}"
    );
    // a finished run of a model of about the default's size (0.9M parameters) on this machine
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::write(
        cache.join("train-rates.jsonl"),
        "{\"device\":\"cpu\",\"params\":1000000,\"tokens_per_second\":10000.0,\"unix\":1}\n",
    )
    .unwrap();
    let out = preflight();
    for stage in ["pretrain", "train-r1", "train-r2"] {
        let row = rows(&out, stage);
        assert!(row.contains("a training run on this machine"), "{row}");
    }
}

/// Budgets of a training micro-batch and an optimizer step on the GPU's path (`bench train
/// --count --device cuda`, counted on this machine), per layer kind and whole: upper bounds
/// at today's counts, which the GPU work lowers. Each phase prints one JSON object with every
/// field of the table.
#[test]
fn a_gpu_training_step_keeps_within_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    // (shape, rows, seq-len, [(phase, where, launches, allocations, host to device, syncs)])
    type Budget = (&'static str, &'static str, u64, u64, u64, u64);
    let cases: [(&str, &str, &str, &[Budget]); 2] = [
        (
            "qwen3-4b",
            "2",
            "256",
            &[
                ("micro_batch", "attention", 22_428, 22_644, 432, 0),
                // one wait a micro-batch, two a step (the norm's sums, the update's statistics,
                // read back together: each sum's copy into the read-back is a launch, which
                // replaced a wait)
                ("micro_batch", "step", 22_572, 22_790, 441, 1),
                // each gradient's share of the norm and each parameter's update one kernel
                // (`kernels/adamw.cu`), with its partial sums' buffer and their copy
                ("optimizer_step", "attention", 2_376, 792, 0, 0),
                ("optimizer_step", "step", 2_388, 798, 0, 2),
            ],
        ),
        (
            "qwen3.5-4b",
            "1",
            "64",
            &[
                ("micro_batch", "attention", 4_720, 4_704, 48, 0),
                ("micro_batch", "gated_deltanet", 99_480, 99_384, 0, 0),
                ("micro_batch", "step", 104_322, 104_212, 54, 1),
                ("optimizer_step", "gated_deltanet", 2_016, 672, 0, 0),
                ("optimizer_step", "step", 2_556, 854, 0, 2),
            ],
        ),
    ];
    for (shape, rows, seq_len, budgets) in cases {
        let o = run(
            &[
                "bench",
                "train",
                "--count",
                "--json",
                "--device",
                "cuda",
                "--shape",
                shape,
                "--rows",
                rows,
                "--seq-len",
                seq_len,
            ],
            dir.path(),
        );
        assert!(o.status.success(), "{}", text(&o));
        let phases: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(phases.len(), 2, "{}", text(&o));
        for &(phase, place, launches, allocations, h2d, syncs) in budgets {
            let p = phases
                .iter()
                .find(|p| p["phase"] == phase)
                .unwrap_or_else(|| panic!("{shape}: no {phase}"));
            assert_eq!(p["shape"], shape);
            let c = if place == "step" {
                &p["step"]
            } else {
                p["layers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|l| l["kind"] == place)
                    .unwrap_or_else(|| panic!("{shape} {phase}: no {place} layers"))
            };
            let got = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("no {k} in {c}"));
            for (k, budget) in [
                ("launches", launches),
                ("allocations", allocations),
                ("host_to_device", h2d),
                ("syncs", syncs),
            ] {
                assert!(
                    got(k) <= budget,
                    "{shape} {phase} {place}: {k} {} over the budget {budget}",
                    got(k)
                );
            }
            assert!(
                got("launches") > 0,
                "{shape} {phase} {place}: nothing counted"
            );
        }
    }
}
