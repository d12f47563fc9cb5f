//! `pipeline eval` on the tiny-qwen3 fixture: a set defined in a TOML file, two names for the
//! same weights (so every metric must agree and the delta be zero), the files of the output
//! layout, and a rerun that reuses the samples.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use selfdistill::data::schema::read_completions;
use serde_json::Value;

/// The toy set: 10 sums, sampled raw, 3 samples each.
fn toy_set(dir: &std::path::Path) {
    let rows: Vec<String> = (0..10)
        .map(|i| format!("{{\"q\": \"What is {i} + {i}?\", \"a\": \"{}\"}}", 2 * i))
        .collect();
    std::fs::write(dir.join("toy.jsonl"), rows.join("\n") + "\n").unwrap();
    std::fs::write(
        dir.join("toy.toml"),
        "[source]\nname = \"toy\"\nformat = \"mapped\"\npath = \"toy.jsonl\"\n\
         problem_field = \"q\"\nanswer_field = \"a\"\n\
         [sample]\nprompt_template = \"raw\"\nn = 3\ntemperature = 0.8\nmax_new_tokens = 8\n\
         seed = 5\nkv_cache = \"4 MiB\"\n",
    )
    .unwrap();
}

#[test]
fn eval_stage_caches_and_shares_the_base_models_evaluation_across_runs() {
    let Some(model) = shared("fixtures/tiny-qwen3") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    toy_set(dir.path());
    let config = |name: &str, temperature: f32| {
        let p = dir.path().join(format!("{name}.toml"));
        std::fs::write(
            &p,
            format!(
                "[run]\nname = \"{name}\"\n[eval]\nsets = [\"toy.toml\"]\nmodel = \"{}\"\n\
                 temperature = {temperature}\n",
                model.display()
            ),
        )
        .unwrap();
        p
    };
    let a = config("a", 0.8);
    let o = run(&["run", "all", "--config", a.to_str().unwrap()], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("| toy | base ("), "{}", text(&o));
    let stage = stage_dir(&dir.path().join("runs/a"), "eval");
    let first = std::fs::read(stage.join("metrics.json")).unwrap();
    // the same run again: nothing to do
    let o = run(&["run", "all", "--config", a.to_str().unwrap()], dir.path());
    assert!(text(&o).contains("eval cached"), "{}", text(&o));
    // another run with the same base and settings reuses the base model's evaluation
    let b = config("b", 0.8);
    let o = run(&["run", "all", "--config", b.to_str().unwrap()], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("base model: cached"), "{}", text(&o));
    let stage_b = stage_dir(&dir.path().join("runs/b"), "eval");
    assert_eq!(std::fs::read(stage_b.join("metrics.json")).unwrap(), first);
    // another temperature evaluates again
    let c = config("c", 0.5);
    let o = run(&["run", "all", "--config", c.to_str().unwrap()], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains("base model: cached"), "{}", text(&o));
    // a bad set is an error that names the config key
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[eval]\nsets = [\"nope\"]\nmodel = \"x\"\n").unwrap();
    let o = run(
        &["run", "all", "--config", bad.to_str().unwrap()],
        dir.path(),
    );
    assert!(
        !o.status.success() && text(&o).contains("eval.sets"),
        "{}",
        text(&o)
    );
}

#[test]
fn eval_writes_samples_metrics_and_a_table_and_reuses_samples() {
    let Some(model) = shared("fixtures/tiny-qwen3") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    toy_set(dir.path());
    let m1 = model.to_str().unwrap().to_string();
    let m2 = format!("{m1}/.");
    let args = [
        "eval", "--model", &m1, "--model", &m2, "--sets", "toy.toml", "--output", "out",
    ];
    let o = run(&args, dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let out = dir.path().join("out");
    let all: Vec<Value> =
        serde_json::from_slice(&std::fs::read(out.join("metrics.json")).unwrap()).unwrap();
    assert_eq!(all.len(), 2);
    // same weights, same seeds: the same metrics under both names
    assert_eq!(all[0]["metrics"], all[1]["metrics"]);
    let m = &all[0]["metrics"];
    assert_eq!(
        (
            m["problems"].as_u64(),
            m["n"].as_u64(),
            m["samples"].as_u64()
        ),
        (Some(10), Some(3), Some(30))
    );
    assert_eq!(m["pass_at_k"].as_array().unwrap().len(), 3);
    // the no-answer share is the samples' own
    let slug = selfdistill::eval::model_slug(&m1);
    let samples = read_completions(&out.join(&slug).join("toy/samples.parquet")).unwrap();
    assert_eq!(samples.len(), 30);
    let none = samples
        .iter()
        .filter(|c| c.grade.as_ref().unwrap().extracted_answer.is_none())
        .count();
    assert!((m["no_answer"].as_f64().unwrap() - none as f64 / 30.0).abs() < 1e-12);
    let table = std::fs::read_to_string(out.join("eval.md")).unwrap();
    assert!(
        table.contains("| toy |") && table.contains("+0.0"),
        "{table}"
    );
    assert!(out.join(&slug).join("toy/metrics.json").is_file());
    // what the models wrote: lengths of both, examples with their whole texts; the same weights
    // change no verdict
    let ex = std::fs::read_to_string(out.join("examples.md")).unwrap();
    assert!(ex.contains("### toy: what the models wrote"), "{ex}");
    assert_eq!(ex.matches("| 30 | ").count(), 2, "{ex}");
    assert!(ex.contains("> What is "), "{ex}");
    assert!(
        !ex.contains("became right") && !ex.contains("became wrong"),
        "{ex}"
    );
    let links: Vec<&str> = ex
        .split("([whole text](")
        .skip(1)
        .map(|s| s.split(')').next().unwrap())
        .collect();
    assert!(!links.is_empty(), "{ex}");
    for l in links {
        let full = std::fs::read_to_string(out.join(l)).unwrap();
        assert!(
            full.contains("## Problem") && full.contains("## Completion"),
            "{full}"
        );
    }
    // a rerun reuses the samples and gives the same numbers
    let o = run(&args, dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let again: Vec<Value> =
        serde_json::from_slice(&std::fs::read(out.join("metrics.json")).unwrap()).unwrap();
    assert_eq!(again[0]["metrics"], all[0]["metrics"]);
    // an unknown set is an error that lists the known ones
    let o = run(
        &["eval", "--model", &m1, "--sets", "nope", "--output", "o2"],
        dir.path(),
    );
    assert!(!o.status.success());
    assert!(text(&o).contains("gsm8k_test"), "{}", text(&o));
}

/// Sets with different sampling settings (n, temperature, top-k, min-p, logprobs, seed,
/// max_new_tokens) sampled together, the model loaded once, give each set the samples and
/// metrics it gets alone.
#[test]
fn sets_sampled_together_give_what_each_gives_alone() {
    let Some(model) = shared("fixtures/tiny-qwen3") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    toy_set(dir.path());
    let toy = std::fs::read_to_string(dir.path().join("toy.toml")).unwrap();
    let variant = |name: &str, sample: &str| {
        let t = toy
            .replace(
                "n = 3\ntemperature = 0.8\nmax_new_tokens = 8\nseed = 5\n",
                sample,
            )
            .replace("name = \"toy\"", &format!("name = \"{name}\""));
        assert_ne!(t, toy);
        std::fs::write(dir.path().join(format!("{name}.toml")), t).unwrap();
    };
    variant(
        "greedy",
        "n = 2\ntemperature = 0.0\nmax_new_tokens = 5\nlogprobs = 2\n",
    );
    variant(
        "topk",
        "n = 4\ntemperature = 1.1\ntop_k = 20\nmin_p = 0.02\nmax_new_tokens = 11\nseed = 9\n",
    );
    let m = model.to_str().unwrap();
    let eval = |sets: &str, out: &str| {
        let o = run(
            &["eval", "--model", m, "--sets", sets, "--output", out],
            dir.path(),
        );
        assert!(o.status.success(), "{}", text(&o));
        text(&o)
    };
    let log = eval("toy.toml,greedy.toml,topk.toml", "together");
    let loads = log.matches("the model loaded once").count();
    assert_eq!(loads, 1, "{log}");
    assert!(log.contains("on toy, greedy, topk"), "{log}");
    let slug = selfdistill::eval::model_slug(m);
    for set in ["toy", "greedy", "topk"] {
        eval(&format!("{set}.toml"), &format!("alone-{set}"));
        let read = |out: &str| {
            let d = dir.path().join(out).join(&slug).join(set);
            let rows = read_completions(&d.join("samples.parquet")).unwrap();
            let metrics: Value =
                serde_json::from_slice(&std::fs::read(d.join("metrics.json")).unwrap()).unwrap();
            (rows, metrics)
        };
        let (together, m_together) = read("together");
        let (alone, m_alone) = read(&format!("alone-{set}"));
        assert_eq!(m_together["metrics"], m_alone["metrics"], "{set}");
        assert_eq!(together.len(), alone.len(), "{set}");
        assert!(!alone.is_empty());
        for (a, b) in together.iter().zip(&alone) {
            let what = format!("{set} {} sample {}", a.problem_id, a.sample_index);
            assert_eq!(
                (&a.problem_id, a.sample_index, &a.completion_token_ids),
                (&b.problem_id, b.sample_index, &b.completion_token_ids),
                "{what}"
            );
            assert_eq!(
                (&a.completion, &a.grade, &a.finish_reason, &a.sampling_hash),
                (&b.completion, &b.grade, &b.finish_reason, &b.sampling_hash),
                "{what}"
            );
            assert_eq!(a.logprobs.is_some(), set == "greedy", "{what}");
            let (x, y) = (a.cumulative_logprob.unwrap(), b.cumulative_logprob.unwrap());
            assert!((x - y).abs() < 1e-3, "{what}: {x} vs {y}");
        }
    }
}

/// `pipeline eval`'s sampling flags set only what they name over each set's own settings, a
/// flag typed at its default included (`--temperature 0` makes the set's 0.8 greedy); flags not
/// typed leave the set's values.
#[test]
fn eval_flags_override_only_the_keys_typed() {
    let Some(model) = shared("fixtures/tiny-qwen3") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    toy_set(dir.path());
    let m = model.to_str().unwrap();
    let samples = |extra: &[&str], out: &str| {
        let mut args = vec!["eval", "--model", m, "--sets", "toy.toml", "--output", out];
        args.extend(["--n", "2", "--limit", "4"]);
        args.extend(extra);
        let o = run(&args, dir.path());
        assert!(o.status.success(), "{}", text(&o));
        let slug = selfdistill::eval::model_slug(m);
        read_completions(&dir.path().join(out).join(slug).join("toy/samples.parquet")).unwrap()
    };
    let same_pairs = |rows: &[selfdistill::data::schema::Completion]| {
        assert_eq!(rows.len(), 8);
        rows.chunks(2)
            .filter(|p| p[0].completion_token_ids == p[1].completion_token_ids)
            .count()
    };
    let greedy = samples(&["--temperature", "0"], "greedy");
    assert_eq!(same_pairs(&greedy), 4);
    let set_temperature = samples(&[], "set");
    assert!(same_pairs(&set_temperature) < 4);
    let o = run(
        &[
            "eval", "--model", m, "--sets", "toy.toml", "--top-p", "0", "--output", "x",
        ],
        dir.path(),
    );
    assert!(!o.status.success());
    assert!(text(&o).contains("top_p must be in (0, 1]"), "{}", text(&o));
}

/// The shipped `evals/<name>.toml` written into `dir`, reading the copy of its data in
/// `../shared/data/<file>` instead of the hub (tests run offline).
fn local_set(dir: &std::path::Path, name: &str, file: &str) -> Option<()> {
    let data = shared(&format!("data/{file}"))?;
    let shipped =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("evals/{name}.toml"));
    let text: String = std::fs::read_to_string(shipped)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("split"))
        .map(|l| match l.starts_with("path = ") {
            true => format!("path = \"{}\"\n", data.display()),
            false => format!("{l}\n"),
        })
        .collect();
    std::fs::write(dir.join(format!("{name}.toml")), text).unwrap();
    Some(())
}

/// The sets papers report beside MATH-500 (AIME 2025, HMMT February 2025, Minerva Math,
/// OlympiadBench) load from their published files with every gold answer, and run end to end
/// through `pipeline eval` on the tiny fixture. Minerva's shipped set reads the hub's extracted
/// answers; the published JSONL here keeps them boxed in `solution` (its toml says how to read it).
#[test]
fn the_sets_papers_report_load_and_evaluate() {
    let Some(model) = shared("fixtures/tiny-qwen3") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sets = [
        ("aime25", "aime25.jsonl", 30, "aime25/0", "70"),
        ("hmmt_feb25", "hmmt_feb25.jsonl", 30, "hmmt_feb25/1", "103"),
        (
            "minerva_math",
            "minerva_math.jsonl",
            272,
            "minerva_math/0",
            "1.6",
        ),
        (
            "olympiadbench",
            "olympiadbench_math_en.jsonl",
            675,
            "olympiadbench/1606",
            "2",
        ),
    ];
    for (name, file, rows, first_id, first_gold) in sets {
        local_set(dir.path(), name, file).unwrap();
        let p = dir.path().join(format!("{name}.toml"));
        if name == "minerva_math" {
            let t = std::fs::read_to_string(&p)
                .unwrap()
                .replace(
                    "problem_field = \"question\"",
                    "problem_field = \"problem\"\nid_field = \"idx\"",
                )
                .replace(
                    "answer_field = \"answer\"",
                    "answer_field = \"solution\"\nanswer_extract = \"boxed\"",
                );
            std::fs::write(&p, t).unwrap();
        }
        let set = selfdistill::eval::EvalSet::load(&p).unwrap();
        let files = selfdistill::data::hub::resolve(&set.source.location).unwrap();
        let (problems, _) =
            selfdistill::data::load_source(&set.source, &files, selfdistill::data::BadRows::STRICT)
                .unwrap();
        assert_eq!(problems.len(), rows, "{name}");
        assert!(
            problems.iter().all(|p| !p.gold_answer.trim().is_empty()),
            "{name}"
        );
        assert!(
            problems.iter().all(|p| !p.gold_answer.starts_with('[')),
            "{name}: a list kept as JSON"
        );
        let first = &problems[0];
        assert_eq!(first.problem_id, first_id, "{name}");
        assert!(
            first.gold_answer.contains(first_gold),
            "{name}: gold {}",
            first.gold_answer
        );
    }
    let o = run(
        &[
            "eval",
            "--model",
            model.to_str().unwrap(),
            "--sets",
            "aime25.toml,hmmt_feb25.toml,minerva_math.toml,olympiadbench.toml",
            "--limit",
            "2",
            "--n",
            "2",
            "--max-new-tokens",
            "4",
            "--output",
            "out",
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let table = std::fs::read_to_string(dir.path().join("out/eval.md")).unwrap();
    for (name, ..) in sets {
        assert!(table.contains(&format!("| {name} |")), "{name}: {table}");
    }
}

/// A data -> filter (GSM8K reference solutions) -> train -> eval pipeline on the tiny fixture,
/// with extra `[filter]` and `[train]` keys; `None` without `../shared`. [`write_pipeline`]
/// writes it with its eval set.
fn pipeline_config(filter: &str, train: &str) -> Option<String> {
    let data = shared("data/gsm8k_train.jsonl")?;
    let model = shared("fixtures/tiny-qwen3")?;
    shared("data/math500.jsonl")?;
    Some(format!(
        r#"[run]
workdir = "work"
[[data.sources]]
name = "gsm8k"
format = "gsm8k"
path = "{data}"
limit = 24
[filter]
{filter}[filter.completions]
path = "{data}"
format = "gsm8k"
completion_field = "answer"
source = "gsm8k"
[train]
model = "{model}"
lr = 0.003
max_seq_len = 256
micro_batch_tokens = 1024
peak_tflops = 1.0
{train}[eval]
sets = ["math500.toml"]
n = 2
max_new_tokens = 8
limit = 6
"#,
        data = data.display(),
        model = model.display()
    ))
}

/// Writes `dir/f.toml` and the local MATH-500 set it evaluates on.
fn write_pipeline(dir: &std::path::Path, cfg: &str) {
    std::fs::write(dir.join("f.toml"), cfg).unwrap();
    local_set(dir, "math500", "math500.jsonl").unwrap();
}

/// data -> filter (reference solutions) -> train -> eval: the report shows base vs trained, the
/// training curves, the filter's counts and the stages, and `pipeline report` rebuilds it the same.
#[test]
fn run_all_writes_a_report_that_pipeline_report_rebuilds() {
    let Some(cfg) = pipeline_config("", "rows_per_step = 8\nmax_steps = 3\n") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    write_pipeline(dir.path(), &cfg);
    let o = run(&["run", "all", "--config", "f.toml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let report_dir = dir.path().join("work/report");
    let report = std::fs::read_to_string(report_dir.join("report.md")).unwrap();
    for want in [
        "## Evaluation",
        "| math500 | base |",
        "| math500 | round 1 |",
        "| round 1 | work/stages/train-",
        "| train | done |",
        "GPU hours: 0.000",
        "### pass@1 by level",
        "## Training",
        "3 steps; loss",
        "## Filter",
        "| kept | 24 |",
        "| train | done |",
        "## What the models wrote",
        "### math500: what the models wrote",
        "![math500: completion lengths](eval_lengths_math500.png)",
        "(dots: each step's loss; line: its exponential moving average, weight 0.5, debiased)",
    ] {
        assert!(report.contains(want), "{want} missing:\n{report}");
    }
    for png in [
        "loss_train.png",
        "lr_train.png",
        "levels_math500.png",
        "eval_lengths_math500.png",
    ] {
        let bytes = std::fs::read(report_dir.join(png)).unwrap();
        assert_eq!(&bytes[..4], b"\x89PNG", "{png}");
    }
    std::fs::remove_dir_all(&report_dir).unwrap();
    let o = run(&["report", "--workdir", "work"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(report_dir.join("report.md")).unwrap(),
        report
    );
    let o = run(&["report", "--workdir", "nowhere"], dir.path());
    assert!(
        !o.status.success() && text(&o).contains("no plan"),
        "{}",
        text(&o)
    );
}

/// Training data that contain eval problems: an eval set made of three GSM8K training problems
/// (one verbatim, one reformatted, one inside a longer text) is checked by the filter, which
/// drops those problems' rows, records the matches and counts them per set; the report says so
/// next to the set's score.
#[test]
fn run_all_drops_training_problems_that_are_eval_problems_and_says_so() {
    let Some(cfg) = pipeline_config("", "rows_per_step = 8\nmax_steps = 1\n") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cfg = cfg.replace(
        "sets = [\"math500.toml\"]",
        "sets = [\"math500.toml\", \"leak.toml\"]",
    );
    write_pipeline(dir.path(), &cfg);
    let train = shared("data/gsm8k_train.jsonl").unwrap();
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(train)
        .unwrap()
        .lines()
        .take(3)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let q = |i: usize| rows[i]["question"].as_str().unwrap().to_string();
    let a = |i: usize| rows[i]["answer"].as_str().unwrap().to_string();
    let leak = [
        (q(0), a(0)),
        (q(1).to_uppercase().replace(". ", " . "), a(1)),
        (format!("A warm-up first. {} Show your work.", q(2)), a(2)),
    ];
    let lines: Vec<String> = leak
        .iter()
        .map(|(q, a)| serde_json::json!({"question": q, "answer": a}).to_string())
        .collect();
    std::fs::write(dir.path().join("leak.jsonl"), lines.join("\n") + "\n").unwrap();
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("evals/gsm8k_test.toml");
    let set = std::fs::read_to_string(shipped)
        .unwrap()
        .replace("name = \"gsm8k_test\"", "name = \"leak\"")
        .replace(
            "path = \"hf://openai/gsm8k/main/test-00000-of-00001.parquet\"",
            "path = \"leak.jsonl\"",
        );
    assert!(set.contains("\"leak.jsonl\"") && set.contains("\"leak\""));
    std::fs::write(dir.path().join("leak.toml"), set).unwrap();

    let o = run(&["run", "all", "--config", "f.toml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let work = dir.path().join("work");
    let filter = stage_dir(&work, "filter");
    let manifest = manifest_of(&work, "filter");
    let count = |k: &str| manifest_count(&manifest, k);
    assert_eq!(count("contaminated.leak"), 3);
    assert_eq!(count("contaminated.math500"), 0);
    assert_eq!(count("removed.contaminated"), 3);
    assert_eq!(count("kept"), 21);
    let matches =
        selfdistill::data::records::read_all_records(&filter.join("contamination.parquet"))
            .unwrap();
    let kinds: Vec<&str> = matches
        .iter()
        .map(|r| r.fields["match"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["exact", "exact", "ngram"], "{matches:?}");
    assert!(matches.iter().all(|r| r.fields["eval_set"] == "leak"));
    // the SFT rows hold none of the three problems
    let dropped: Vec<&str> = matches
        .iter()
        .map(|r| r.fields["problem_id"].as_str().unwrap())
        .collect();
    let sft = selfdistill::data::records::read_all_records(&filter.join("sft.parquet")).unwrap();
    assert_eq!(sft.len(), 21);
    assert!(sft
        .iter()
        .all(|r| !dropped.contains(&r.fields["problem_id"].as_str().unwrap())));
    let report = std::fs::read_to_string(work.join("report/report.md")).unwrap();
    for want in [
        "| leak (overlap: 3 training problems dropped) | base |",
        "| math500 | base |",
        "**Training data overlapped leak**: 3 training problems matched its problems",
        "Decontamination (8-word n-grams and exact match) against math500 (0), leak (3): 3 \
         training problems matched, 3 rows dropped",
        "| removed: contaminated | 3 |",
    ] {
        assert!(report.contains(want), "{want} missing:\n{report}");
    }

    // evaluating on the training data itself: the filter fails and says why, nothing is done
    let all = std::fs::read_to_string(dir.path().join("leak.toml"))
        .unwrap()
        .replace("name = \"leak\"", "name = \"all\"")
        .replace(
            "path = \"leak.jsonl\"",
            &format!(
                "path = \"{}\"",
                shared("data/gsm8k_train.jsonl").unwrap().display()
            ),
        );
    std::fs::write(dir.path().join("all.toml"), all).unwrap();
    let cfg = cfg
        .replace(
            "sets = [\"math500.toml\", \"leak.toml\"]",
            "sets = [\"all.toml\"]",
        )
        .replace("workdir = \"work\"", "workdir = \"work2\"");
    std::fs::write(dir.path().join("g.toml"), cfg).unwrap();
    let o = run(&["run", "all", "--config", "g.toml"], dir.path());
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(
        out.contains("decontamination dropped every row that would have been kept (24 rows of 24")
            && out.contains("match all): the training data are the eval data")
            && out.contains("`filter.decontaminate = false`"),
        "{out}"
    );
    assert!(!stage_dir(&dir.path().join("work2"), "filter")
        .join("manifest.json")
        .exists());
}

/// What a report must repeat exactly after any kill: everything above the stage table, less
/// the lines with speeds (wall-clock dependent).
/// `pipeline run all` killed inside every stage (at its fault points, and from outside at
/// pseudo-random moments), then rerun: the same report numbers as a run that was never killed.
#[test]
fn run_all_killed_in_every_stage_then_rerun_gives_the_same_report() {
    let train = "rows_per_step = 4\nmax_steps = 5\ncheckpoint_every = 1\n";
    let Some(cfg) = pipeline_config("chunk_rows = 8\n", train) else {
        return;
    };
    // the uninterrupted run (its own folder: the eval cache lives beside the work dir)
    let clean = tempfile::tempdir().unwrap();
    write_pipeline(clean.path(), &cfg);
    let t0 = std::time::Instant::now();
    let o = run(&["run", "all", "--config", "f.toml"], clean.path());
    assert!(o.status.success(), "{}", text(&o));
    let total = t0.elapsed();
    let want = report_numbers(&clean.path().join("work"));
    assert!(
        want.contains("## Evaluation") && want.contains("## Training"),
        "{want}"
    );

    let dir = tempfile::tempdir().unwrap();
    write_pipeline(dir.path(), &cfg);
    run_killed_at(
        dir.path(),
        "f.toml",
        &[
            // in pipeline order: each run gets one point further than the last
            "data.before_manifest",
            "filter.chunk:2",
            "commit.sft.parquet",
            "filter.before_manifest",
            "train.after_checkpoint:2",
            "train.checkpoint_rename:2",
            "train.before_manifest",
            "sample.part",
            "eval.before_manifest",
        ],
    );
    let o = run(&["run", "all", "--config", "f.toml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(report_numbers(&dir.path().join("work")), want);
    // from outside, at moments spread over a run's length (fixed, so the test repeats)
    for frac in [0.13, 0.37, 0.61, 0.89] {
        for d in ["work", "eval-cache"] {
            std::fs::remove_dir_all(dir.path().join(d)).unwrap();
        }
        let mut child = bin()
            .args(["run", "all", "--config", "f.toml"])
            .current_dir(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(total.mul_f64(frac));
        let _ = child.kill();
        child.wait().unwrap();
        let o = run(&["run", "all", "--config", "f.toml"], dir.path());
        assert!(o.status.success(), "after a kill at {frac}: {}", text(&o));
        assert_eq!(
            report_numbers(&dir.path().join("work")),
            want,
            "after a kill at {frac}"
        );
    }
}

/// `pipeline run all` on the hybrid Qwen3.5 fixture: data -> sample (chat template, state slots)
/// -> filter -> train (the multimodal layout in and out) -> eval of the base and trained models.
#[test]
fn qwen3_5_runs_the_whole_pipeline() {
    let Some(model) = shared("fixtures/tiny-qwen3_5") else {
        return;
    };
    let (out, trained) = runs_the_whole_pipeline(&model, false);
    assert!(out.contains("recurrent state: 64 slots"), "{out}");
    // the trained model keeps the multimodal layout: the vision tower is still there
    let config = std::fs::read_to_string(trained.join("config.json")).unwrap();
    assert!(config.contains("Qwen3_5ForConditionalGeneration") && config.contains("vision_config"));
}

/// `pipeline run all` on the Qwen2 fixtures (tied fp32, and untied bf16 shards with one KV
/// head) and the Gemma 3 ones (text-only f32, and the multimodal layout in bf16 shards, both
/// with windows shorter than the prompts): the trained model is a checkpoint of its base's class
/// again. These random models end nearly every sample at max_new_tokens (truncated, so never
/// kept), so the filter grades the toy set's worked solutions instead of the samples.
#[test]
fn qwen2_and_gemma3_run_the_whole_pipeline() {
    for (name, class) in [
        ("qwen2-a", "Qwen2ForCausalLM"),
        ("qwen2-b", "Qwen2ForCausalLM"),
        ("gemma3-a", "Gemma3ForCausalLM"),
        ("gemma3-b", "Gemma3ForConditionalGeneration"),
    ] {
        let model = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        let (_, trained) = runs_the_whole_pipeline(&model, true);
        let config = std::fs::read_to_string(trained.join("config.json")).unwrap();
        assert!(config.contains(class), "{config}");
    }
}

/// data -> sample (chat template) -> filter -> train -> eval of the base and trained models on a
/// toy set of sums, with `model`; the filter keeps correct samples, or with `solutions` the
/// toy set's worked solutions. Returns the output and the trained model's folder.
fn runs_the_whole_pipeline(model: &Path, solutions: bool) -> (String, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    // sums of small numbers: the random fixture gets a few right by chance (seeded, so always
    // the same few)
    let rows: Vec<String> = (0..12)
        .map(|i| {
            let (a, b) = (i % 5, (i * 3) % 4);
            let c = a + b;
            format!(
                "{{\"q\": \"What is {a} + {b}?\", \"a\": \"{c}\", \"s\": \"{a} + {b} = {c}.\"}}"
            )
        })
        .collect();
    std::fs::write(dir.path().join("toy.jsonl"), rows.join("\n") + "\n").unwrap();
    std::fs::write(
        dir.path().join("toy.toml"),
        "[source]\nname = \"toy\"\nformat = \"mapped\"\npath = \"toy.jsonl\"\n\
         problem_field = \"q\"\nanswer_field = \"a\"\n\
         [sample]\nprompt_template = \"chat\"\nenable_thinking = false\nn = 2\n\
         temperature = 0.8\nmax_new_tokens = 8\nseed = 5\n",
    )
    .unwrap();
    let cfg = format!(
        r#"[run]
workdir = "work"
[[data.sources]]
name = "toy"
format = "mapped"
path = "toy.jsonl"
problem_field = "q"
answer_field = "a"
[sample]
model = "{}"
prompt_template = "chat"
enable_thinking = false
n = 8
temperature = 1.0
max_new_tokens = 12
seed = 1
[filter]
last_number_fallback = true
# the toy set is both the data and the eval set
decontaminate = false
{}
[train]
lr = 0.003
max_seq_len = 256
micro_batch_tokens = 1024
peak_tflops = 1.0
[eval]
sets = ["toy.toml"]
"#,
        model.display(),
        if solutions {
            "[filter.completions]\npath = \"toy.jsonl\"\nformat = \"math\"\n\
             completion_field = \"s\"\nsource = \"toy\""
        } else {
            ""
        }
    );
    std::fs::write(dir.path().join("q.toml"), cfg).unwrap();
    let o = run(&["run", "all", "--config", "q.toml"], dir.path());
    let out = text(&o);
    assert!(o.status.success(), "{}: {out}", model.display());
    for want in [
        "12 problems (0 resumed), 96 samples",
        "==> filter",
        "==> train",
        "==> eval",
    ] {
        assert!(out.contains(want), "{want} missing:\n{out}");
    }
    let report = std::fs::read_to_string(dir.path().join("work/report/report.md")).unwrap();
    assert!(
        report.contains("| toy | base |") && report.contains("| toy | round 1 |"),
        "{report}"
    );
    let trained = std::fs::read_dir(dir.path().join("work/stages"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("train-")
        })
        .unwrap()
        .join("model");
    // the folder outlives the test's temporary dir
    let keep = tempfile::tempdir().unwrap().keep().join("model");
    copy_checkpoint(&trained, &keep);
    (out, keep)
}

/// A teacher whose rows cannot be made the student's is refused before any stage runs, naming
/// both models and what is missing: the student (the tiny fixture with two vocabulary entries
/// swapped, so its rows are re-rendered from text) has no chat template for chat prompts. With
/// a raw prompt the same pair plans; the teacher's own tokenizer written out another way
/// (pretty-printed) is the same tokenizer, and nothing needs re-rendering.
#[test]
fn a_teacher_whose_rows_cannot_be_re_rendered_is_refused_before_sampling() {
    let (Some(teacher), Some(data)) = (
        shared("fixtures/tiny-qwen3"),
        shared("data/gsm8k_train.jsonl"),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // a copy of the teacher whose tokenizer files can be rewritten
    let copy = |name: &str| {
        let to = dir.path().join(name);
        copy_checkpoint(&teacher, &to);
        for f in ["tokenizer.json", "tokenizer_config.json"] {
            let p = to.join(f);
            let mut perm = std::fs::metadata(&p).unwrap().permissions();
            #[allow(clippy::permissions_set_readonly_false)]
            perm.set_readonly(false);
            std::fs::set_permissions(&p, perm).unwrap();
        }
        to
    };
    let student = copy("student");
    let tok_path = student.join("tokenizer.json");
    let mut tok: Value = serde_json::from_slice(&std::fs::read(&tok_path).unwrap()).unwrap();
    let vocab = tok["model"]["vocab"].as_object_mut().unwrap();
    let keys: Vec<String> = vocab.keys().take(2).cloned().collect();
    let (a, b) = (vocab[&keys[0]].clone(), vocab[&keys[1]].clone());
    vocab.insert(keys[0].clone(), b);
    vocab.insert(keys[1].clone(), a);
    std::fs::write(&tok_path, serde_json::to_vec(&tok).unwrap()).unwrap();
    let cfg_path = student.join("tokenizer_config.json");
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    cfg.as_object_mut().unwrap().remove("chat_template");
    std::fs::write(&cfg_path, serde_json::to_vec(&cfg).unwrap()).unwrap();
    let config = |template: &str| {
        std::fs::write(
            dir.path().join("t.toml"),
            format!(
                "[run]\nworkdir = \"work\"\n[[data.sources]]\nname = \"gsm8k\"\nformat = \"gsm8k\"\n\
                 path = \"{}\"\nlimit = 4\n[sample]\nmodel = \"{}\"\nprompt_template = \"{template}\"\n\
                 n = 1\nmax_new_tokens = 4\n[filter]\n[train]\nmodel = \"{}\"\n",
                data.display(),
                teacher.display(),
                student.display()
            ),
        )
        .unwrap();
    };
    config("chat");
    let o = run(&["run", "all", "--config", "t.toml"], dir.path());
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(
        out.contains("whose tokenizer or chat template differs from that of the trained model")
            && out.contains("student")
            && out.contains("sample.prompt_template = \"chat\" the prompts need its chat template"),
        "{out}"
    );
    // no stage ran
    let ran = std::fs::read_dir(dir.path().join("work/stages"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(ran, 0, "{out}");
    // raw prompts need no chat template: planned
    config("raw");
    let o = run(&["preflight", "--config", "t.toml"], dir.path());
    assert!(!text(&o).contains("differs from that"), "{}", text(&o));
    // the teacher's own tokenizer, pretty-printed: the same, nothing to re-render
    let same = copy("same");
    let tok_path = same.join("tokenizer.json");
    let tok: Value = serde_json::from_slice(&std::fs::read(&tok_path).unwrap()).unwrap();
    std::fs::write(&tok_path, serde_json::to_vec_pretty(&tok).unwrap()).unwrap();
    let rerender = |m: &std::path::Path| {
        selfdistill::stages::student::needs_rerender(
            teacher.to_str().unwrap(),
            m.to_str().unwrap(),
            None,
        )
    };
    assert_eq!(rerender(&same), Some(false));
    assert_eq!(rerender(&student), Some(true));
}
