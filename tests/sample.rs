//! `pipeline sample` on the tiny-qwen3 fixture: the completions Parquet, seeded results that do
//! not depend on batch size or sharding, and resume after a SIGKILL.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

use common::*;
use selfdistill::data::schema::{read_completions, Completion};

fn problems(dir: &Path) -> PathBuf {
    toy_problems(dir, 20)
}

fn sample(dir: &Path, extra: &[&str], out: &str) -> std::process::Output {
    sample_with_env(dir, extra, out, None)
}

/// The arguments of `pipeline sample` on the 20 toy problems with the fixture model, raw
/// prompts and gold answers, writing `out`; the sampling settings are the caller's.
fn toy_args(dir: &Path, out: &str) -> Vec<String> {
    let model = shared("fixtures/tiny-qwen3").unwrap();
    let input = problems(dir);
    let mut args = vec!["sample".to_string(), "--model".into()];
    args.push(model.to_str().unwrap().into());
    args.extend(["--input".into(), input.to_str().unwrap().to_string()]);
    for a in [
        "--answer-field",
        "answer",
        "--prompt-template",
        "raw",
        "--output",
        out,
    ] {
        args.push(a.into());
    }
    args
}

/// `pipeline sample` on the 20 toy problems, with an optional environment variable.
fn sample_with_env(
    dir: &Path,
    extra: &[&str],
    out: &str,
    env: Option<(&str, &str)>,
) -> std::process::Output {
    let mut cmd = bin();
    cmd.args(toy_args(dir, out))
        .args([
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
        ])
        .args(extra)
        .current_dir(dir);
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
    // a shard of other problems (here the first 10 only) with the same settings is refused
    let o = sample(
        dir.path(),
        &["--shard", "1/3", "--limit", "10"],
        "t1.parquet",
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = merge(&["s0.parquet", "t1.parquet", "s2.parquet"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("t1.parquet was sampled from other problems than"),
        "{}",
        text(&o)
    );
}

/// A run that stops before its first committed part (killed in its first problems, or failing
/// after its settings were recorded) holds nothing: a retry with other settings runs, it is not
/// refused as a mix.
#[test]
fn a_retry_before_any_committed_part_may_change_its_settings() {
    if shared("fixtures/tiny-qwen3").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kill = Some((selfdistill::fault::ENV, "commit.part-000000.parquet:1"));
    let o = sample_with_env(dir.path(), &[], "k.parquet", kill);
    assert_eq!(o.status.signal(), Some(9), "{}", text(&o));
    assert!(dir.path().join("k.parquet.parts/run.json").is_file());
    let o = sample(dir.path(), &["--top-k", "5"], "k.parquet");
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("(0 resumed), 40 samples"), "{}", text(&o));
    let o = sample(dir.path(), &["--top-k", "5"], "clean.parquet");
    assert!(o.status.success(), "{}", text(&o));
    let clean = read_completions(&dir.path().join("clean.parquet")).unwrap();
    let retried = read_completions(&dir.path().join("k.parquet")).unwrap();
    assert_eq!(key(&clean), key(&retried));
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
    // the summary (and a stage's manifest) counts the whole output, resumed parts included
    let rows = format!("({} rows, ", clean.len());
    assert!(text(&o).contains(&rows), "no `{rows}` in {}", text(&o));
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

/// A checkpoint is keyed by its content: the same folder with one weight changed (same sizes)
/// re-runs the stages that read it; the unchanged folder stays cached.
#[test]
fn rewritten_weights_in_the_same_folder_rerun_the_sample_stage() {
    let Some(fixture) = shared("fixtures/tiny-qwen3") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    copy_checkpoint(&fixture, &model);
    let input = problems(dir.path());
    let cfg = format!(
        "[run]\nworkdir = \"work\"\n[[data.sources]]\nname = \"toy\"\nformat = \"mapped\"\n\
         path = \"{}\"\nproblem_field = \"problem\"\nanswer_field = \"answer\"\nlimit = 2\n\
         [sample]\nmodel = \"{}\"\nprompt_template = \"raw\"\nn = 1\nmax_new_tokens = 4\n",
        input.display(),
        model.display()
    );
    std::fs::write(dir.path().join("p.toml"), cfg).unwrap();
    let cache = dir.path().join("cache");
    let run_all = || {
        let o = bin()
            .args(["run", "all", "--config", "p.toml"])
            .current_dir(dir.path())
            .env("SELFDISTILL_CACHE_DIR", &cache)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        text(&o)
    };
    assert!(run_all().contains("==> sample"));
    assert!(run_all().contains("--> sample cached"));
    // Flip one bit of the last weight (the end of the file is tensor data): same size.
    let weights = model.join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    std::fs::write(&weights, &bytes).unwrap();
    let out = run_all();
    assert!(out.contains("==> sample"), "{out}");
    assert!(run_all().contains("--> sample cached"));
}

/// `pipeline sample` on the toy problems with the default KV cache (sized by the job).
fn sample_default_kv(dir: &Path, extra: &[&str], out: &str) -> std::process::Output {
    bin()
        .args(toy_args(dir, out))
        .args(["--max-new-tokens", "24", "--seed", "11"])
        .args(extra)
        .current_dir(dir)
        .output()
        .unwrap()
}

/// Any max_num_seqs with any n: the default KV cache holds the prompts whose samples wait plus
/// a running sequence, and the tokens are those of a large batch. A cache too small for that is
/// an error naming `kv_cache` before any sampling.
#[test]
fn max_num_seqs_below_n_gives_the_large_batch_tokens() {
    if shared("fixtures/tiny-qwen3").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let o = sample_default_kv(
        dir.path(),
        &["--n", "4", "--temperature", "0.8", "--max-num-seqs", "64"],
        "a.parquet",
    );
    assert!(o.status.success(), "{}", text(&o));
    let a = read_completions(&dir.path().join("a.parquet")).unwrap();
    assert_eq!(a.len(), 80);
    for seqs in ["1", "3"] {
        let out = format!("b{seqs}.parquet");
        let o = sample_default_kv(
            dir.path(),
            &["--n", "4", "--temperature", "0.8", "--max-num-seqs", seqs],
            &out,
        );
        assert!(o.status.success(), "max_num_seqs {seqs}: {}", text(&o));
        let b = read_completions(&dir.path().join(&out)).unwrap();
        assert_eq!(key(&a), key(&b), "max_num_seqs {seqs}");
    }
    let o = sample_default_kv(
        dir.path(),
        &["--n", "4", "--max-num-seqs", "8", "--kv-cache", "16 KiB"],
        "c.parquet",
    );
    assert!(!o.status.success());
    assert!(
        text(&o).contains("kv_cache = \"16 KiB\" holds") && text(&o).contains("lower max_num_seqs"),
        "{}",
        text(&o)
    );
    assert!(!dir.path().join("c.parquet").exists());
}

/// `--logprobs K`: per-token columns that agree with the cumulative logprob, alternatives in
/// order with the greedy token first; without it no such columns. Penalties and stop token ids
/// reach the engine from the command line.
#[test]
fn logprobs_penalties_and_stop_token_ids_from_the_command_line() {
    if shared("fixtures/tiny-qwen3").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let greedy = ["--n", "1", "--temperature", "0"];
    let o = sample_default_kv(
        dir.path(),
        &[&greedy[..], &["--logprobs", "3"]].concat(),
        "lp.parquet",
    );
    assert!(o.status.success(), "{}", text(&o));
    let rows = read_completions(&dir.path().join("lp.parquet")).unwrap();
    for r in &rows {
        let lp = r.logprobs.as_ref().expect("logprobs columns");
        let ids = r.completion_token_ids.as_ref().unwrap();
        assert_eq!(lp.token.len(), ids.len());
        let sum: f64 = lp.token.iter().map(|x| f64::from(x.unwrap())).sum();
        assert!(
            (sum - r.cumulative_logprob.unwrap()).abs() < 1e-3,
            "{sum} vs {r:?}"
        );
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(lp.top_ids[i].len(), 3);
            // greedy: the chosen token is the most likely one, with the same logprob
            assert_eq!(lp.top_ids[i][0], *id);
            assert_eq!(lp.top[i][0], lp.token[i].unwrap());
            assert!(lp.top[i].windows(2).all(|w| w[0] >= w[1]));
        }
    }
    // the same tokens without logprobs, and no logprob columns
    let o = sample_default_kv(dir.path(), &greedy, "plain.parquet");
    assert!(o.status.success(), "{}", text(&o));
    let plain = read_completions(&dir.path().join("plain.parquet")).unwrap();
    assert_eq!(key(&plain), key(&rows));
    assert!(plain.iter().all(|r| r.logprobs.is_none()));
    // a stop token id: the first generated token of problem 0 ends every sample that draws it
    let first = plain[0].completion_token_ids.as_ref().unwrap()[0].to_string();
    let o = sample_default_kv(
        dir.path(),
        &[&greedy[..], &["--stop-token-ids", &first]].concat(),
        "stop.parquet",
    );
    assert!(o.status.success(), "{}", text(&o));
    let stopped = read_completions(&dir.path().join("stop.parquet")).unwrap();
    assert_eq!(
        stopped[0].completion_token_ids.as_deref(),
        Some(&[first.parse().unwrap()][..])
    );
    assert_eq!(stopped[0].finish_reason.as_deref(), Some("stop"));
    // a strong repetition penalty changes the greedy completions
    let o = sample_default_kv(
        dir.path(),
        &[
            &greedy[..],
            &["--repetition-penalty", "5", "--frequency-penalty", "-0.5"],
        ]
        .concat(),
        "pen.parquet",
    );
    assert!(o.status.success(), "{}", text(&o));
    let pen = read_completions(&dir.path().join("pen.parquet")).unwrap();
    assert_ne!(key(&pen), key(&plain));
    let o = sample_default_kv(
        dir.path(),
        &[&greedy[..], &["--logprobs", "21"]].concat(),
        "x.parquet",
    );
    assert!(!o.status.success());
    assert!(
        text(&o).contains("logprobs must be at most 20"),
        "{}",
        text(&o)
    );
}

/// `pipeline sample` of the hybrid Qwen3.5 fixture (multimodal layout, chat template): the same
/// rows at max_num_seqs 1 and 64, and with a KV cache so small that samples are preempted (their
/// recurrent state rebuilt from zeros).
#[test]
fn qwen3_5_samples_are_independent_of_batch_size_and_preemption() {
    let Some(model) = shared("fixtures/tiny-qwen3_5") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let input = problems(dir.path());
    let run_with = |extra: &[&str], out: &str| {
        let mut cmd = bin();
        cmd.args(["sample", "--model", model.to_str().unwrap()])
            .args([
                "--input",
                input.to_str().unwrap(),
                "--answer-field",
                "answer",
            ])
            .args([
                "--prompt-template",
                "chat",
                "--n",
                "3",
                "--max-new-tokens",
                "24",
            ])
            .args(["--temperature", "0.8", "--seed", "7", "--output", out])
            .args(extra)
            .current_dir(dir.path());
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        (text(&o), read_completions(&dir.path().join(out)).unwrap())
    };
    let (log, a) = run_with(&["--max-num-seqs", "64"], "a.parquet");
    assert!(log.contains("recurrent state: 64 slots"), "{log}");
    assert_eq!(a.len(), 60);
    let (_, b) = run_with(&["--max-num-seqs", "1"], "b.parquet");
    assert_eq!(key(&a), key(&b));
    let (log, c) = run_with(
        &["--max-num-seqs", "8", "--kv-cache", "200KiB"],
        "c.parquet",
    );
    assert!(!log.contains("preemptions 0,"), "no preemption: {log}");
    assert_eq!(key(&a), key(&c));
    // the samples of a problem differ (their own seeds), and the text decodes
    assert_ne!(a[0].completion_token_ids, a[1].completion_token_ids);
}

/// `--truncate-prompt-tokens K` keeps the last K tokens of each prompt (vLLM's left
/// truncation): the prompt ids written are the tail of the whole prompt's, the prompt text is
/// theirs, and the sampling hash tells the runs apart.
#[test]
fn truncate_prompt_tokens_keeps_the_tail_of_each_prompt() {
    if shared("fixtures/tiny-qwen3").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let o = sample(dir.path(), &[], "whole.parquet");
    assert!(o.status.success(), "{}", text(&o));
    let o = sample(
        dir.path(),
        &["--truncate-prompt-tokens", "3"],
        "tail.parquet",
    );
    assert!(o.status.success(), "{}", text(&o));
    let whole = read_completions(&dir.path().join("whole.parquet")).unwrap();
    let tail = read_completions(&dir.path().join("tail.parquet")).unwrap();
    assert_eq!(whole.len(), tail.len());
    let mut shortened = 0;
    for (w, t) in whole.iter().zip(&tail) {
        let (w_ids, t_ids) = (
            w.prompt_token_ids.clone().unwrap(),
            t.prompt_token_ids.clone().unwrap(),
        );
        assert_eq!(t_ids[..], w_ids[w_ids.len().saturating_sub(3)..]);
        assert!(
            w.prompt.ends_with(&t.prompt),
            "{:?} {:?}",
            w.prompt,
            t.prompt
        );
        shortened += usize::from(w_ids.len() > 3);
        assert_ne!(w.sampling_hash, t.sampling_hash);
    }
    assert!(shortened > 0, "no prompt was longer than 3 tokens");
    let o = sample(
        dir.path(),
        &["--truncate-prompt-tokens", "0"],
        "zero.parquet",
    );
    assert!(!o.status.success());
    assert!(
        text(&o).contains("--truncate-prompt-tokens must be at least 1"),
        "{}",
        text(&o)
    );
}

/// A run killed after its first committed part, rerun with other settings or other problems,
/// is refused with what differs and how to start over, never resumed into a mix; `--overwrite`
/// starts over; the same settings resume.
#[test]
fn a_resume_with_other_settings_or_problems_is_refused_not_mixed() {
    if shared("fixtures/tiny-qwen3").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kill = Some((selfdistill::fault::ENV, "sample.part:1"));
    let o = sample_with_env(dir.path(), &[], "k.parquet", kill);
    assert_eq!(o.status.signal(), Some(9), "{}", text(&o));
    // another top_k and a repetition penalty: refused, naming both
    let o = sample(
        dir.path(),
        &["--top-k", "5", "--repetition-penalty", "1.2"],
        "k.parquet",
    );
    assert!(!o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("top_k: 0 -> 5") && t.contains("repetition_penalty: unset -> 1.2"),
        "{t}"
    );
    assert!(t.contains("--overwrite"), "{t}");
    // other problems (a shorter list): refused, naming the problems
    let o = sample(dir.path(), &["--limit", "5"], "k.parquet");
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("problems: "), "{}", text(&o));
    // nothing was mixed in: the same settings resume to the clean run's rows
    let o = sample(dir.path(), &[], "k.parquet");
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains("(0 resumed)"), "{}", text(&o));
    let o = sample(dir.path(), &[], "clean.parquet");
    assert!(o.status.success(), "{}", text(&o));
    let clean = read_completions(&dir.path().join("clean.parquet")).unwrap();
    let resumed = read_completions(&dir.path().join("k.parquet")).unwrap();
    assert_eq!(key(&clean), key(&resumed));
    // killed again, then --overwrite starts over with the new settings
    let o = sample_with_env(dir.path(), &[], "w.parquet", kill);
    assert_eq!(o.status.signal(), Some(9), "{}", text(&o));
    let o = sample(dir.path(), &["--top-k", "5", "--overwrite"], "w.parquet");
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("(0 resumed), 40 samples"), "{}", text(&o));
    let rows = read_completions(&dir.path().join("w.parquet")).unwrap();
    let hashes: std::collections::HashSet<_> =
        rows.iter().map(|r| r.sampling_hash.clone()).collect();
    assert_eq!((rows.len(), hashes.len()), (40, 1));
}

/// A `--max-new-tokens` past the model's context is refused naming the context, before a KV
/// cache is sized for it (the error blamed the KV memory).
#[test]
fn a_length_past_the_context_names_the_context() {
    if shared("fixtures/tiny-qwen3").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let o = bin()
        .args(toy_args(dir.path(), "o.parquet"))
        .args(["--max-new-tokens", "1099511627776"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("max_new_tokens = 1099511627776 does not fit the context of")
            && t.contains("(1024 tokens"),
        "{t}"
    );
    assert!(!t.contains("KV cache"), "{t}");
}
