//! The embedded default's quick variant (`pipelines/tiny-arith-quick.toml`) end to end through
//! the real binary: pretrain a tiny model from scratch on the generated arithmetic, sample,
//! filter, fine-tune and evaluate; then a rerun that does nothing, and a change of the eval
//! temperature that re-runs only the eval stage. And a two-round miniature of it killed in every
//! stage, whose rerun must report the numbers of an uninterrupted run.

mod common;

use std::path::Path;
use std::time::Instant;

use common::*;
use serde_json::Value;

/// pass@1 of (set, model label prefix) in the eval stage's metrics.json.
fn pass1(metrics: &Value, set: &str, model: &str) -> f64 {
    metrics
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["set"] == set && r["model"].as_str().unwrap().starts_with(model))
        .unwrap_or_else(|| panic!("no {set} / {model} in {metrics}"))["metrics"]["pass_at_1"]
        ["value"]
        .as_f64()
        .unwrap()
}

/// The metrics of the eval stage of the work dir's current plan.
fn eval_metrics(work: &Path) -> Value {
    let dir = planned_stage_dir(work, "eval");
    serde_json::from_slice(&std::fs::read(dir.join("metrics.json")).unwrap()).unwrap()
}

#[test]
fn the_quick_default_pretrains_distills_and_evaluates_then_caches() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = root.join("pipelines/tiny-arith-quick.toml");
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let args = |cfg: &Path| {
        vec![
            "run".to_string(),
            "all".into(),
            "--config".into(),
            cfg.display().to_string(),
            "--workdir".into(),
            work.display().to_string(),
        ]
    };
    let go = |cfg: &Path| {
        let a = args(cfg);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let o = run(&a, root);
        assert!(o.status.success(), "{}", text(&o));
        text(&o)
    };

    // preflight's disk estimate, to hold against what the run writes
    let o = run(
        &[
            "preflight",
            "--config",
            config.to_str().unwrap(),
            "--workdir",
            work.to_str().unwrap(),
        ],
        root,
    );
    assert!(o.status.success(), "{}", text(&o));
    let planned = text(&o)
        .lines()
        .find_map(|l| {
            l.strip_prefix("needs ")?
                .split(" of disk")
                .next()
                .map(String::from)
        })
        .map(|b| selfdistill::bytes::parse_bytes(&b).unwrap())
        .unwrap_or_else(|| panic!("no disk estimate: {}", text(&o)));

    let out = go(&config);
    // What the run wrote, and at its peak one more checkpoint (written before the oldest kept
    // one is deleted): the estimate is within 1.5x of it either way.
    let used = selfdistill::store::dir_bytes(&work);
    let transient = walk(&work)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("step-")
        })
        .map(|p| selfdistill::store::dir_bytes(&p))
        .max()
        .unwrap_or(0);
    let peak = used + transient;
    let ratio = planned as f64 / peak as f64;
    assert!(
        (1.0 / 1.5..=1.5).contains(&ratio),
        "preflight planned {planned} bytes of disk; the run used {used} (peak {peak}): {ratio:.2}x"
    );
    for stage in ["data", "pretrain", "sample", "filter", "train", "eval"] {
        assert!(out.contains(&format!("<-- {stage} done")), "{stage}: {out}");
    }
    // The pretrained model loads as a Hugging Face checkpoint with its own tokenizer.
    let pretrained = stage_dir(&work, "pretrain").join("model");
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        assert!(pretrained.join(f).is_file(), "{f}");
    }
    // From nothing, it learned the problems it was pretrained on (a guess is right about 1
    // time in 90): the tokenizer, the prompt format and the checkpoint agree between the
    // pretrain stage and the sampler.
    let correct = out
        .lines()
        .find(|l| l.contains(" samples, ") && l.contains(" correct in this run;"))
        .and_then(|l| {
            l.split(" samples, ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse::<u32>()
                .ok()
        })
        .unwrap_or_else(|| panic!("no sampling summary: {out}"));
    assert!(correct >= 64, "{correct} of 256 samples correct: {out}");
    let metrics = eval_metrics(&work);
    for set in ["arith_easy", "arith_hard"] {
        for model in ["base", "trained"] {
            pass1(&metrics, set, model);
        }
    }
    let report = std::fs::read_to_string(work.join("report/report.md")).unwrap();
    for want in [
        "## Evaluation",
        "## Pretraining (pretrain)",
        "## Training (train)",
        "## Sampling (sample)",
        "| arith_hard | round 1",
        "| round 1 | ",
    ] {
        assert!(report.contains(want), "{want}:\n{report}");
    }

    // A second run does nothing.
    let t0 = Instant::now();
    let again = go(&config);
    assert!(!again.contains("==> "), "{again}");
    assert!(again.contains("pretrain cached") && again.contains("eval cached"));
    assert!(t0.elapsed().as_secs() < 20, "{:?}", t0.elapsed());

    // Another eval temperature re-runs only the eval stage.
    let hotter = quick_config(dir.path(), &[("[eval]\n", "[eval]\ntemperature = 0.9\n")]);
    let third = go(&hotter);
    let ran: Vec<&str> = third
        .lines()
        .filter_map(|l| l.split_once("==> ").map(|(_, rest)| rest))
        .collect();
    assert_eq!(ran.len(), 1, "{third}");
    assert!(ran[0].starts_with("eval "), "{third}");
    assert_ne!(eval_metrics(&work), metrics);
}

/// The quick config with its relative paths made absolute, and `edits` applied (text, text).
fn quick_config(dir: &Path, edits: &[(&str, &str)]) -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut text = std::fs::read_to_string(root.join("pipelines/tiny-arith-quick.toml")).unwrap();
    text = text.replace("\"../", &format!("\"{}/", root.display()));
    for (from, to) in edits {
        assert!(text.contains(from), "{from}");
        text = text.replace(from, to);
    }
    let p = dir.join("mini.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// Two rounds of the quick default, SIGKILLed once in each stage (in the pretrain stage's
/// trainer, before its manifest, in each round's sampler, filter and trainer, in the eval), each
/// run resuming the last: the final report has the numbers of a run that was never killed.
#[test]
fn a_two_round_default_killed_in_every_stage_reports_what_an_unkilled_run_does() {
    let edits = [
        ("name = \"tiny-arith-quick\"", "name = \"mini\"\nrounds = 2"),
        ("limit = 30", "limit = 10"),
    ];
    // the same relative config path in both runs: the report names it
    let clean = tempfile::tempdir().unwrap();
    quick_config(clean.path(), &edits);
    let o = run(&["run", "all", "--config", "mini.toml"], clean.path());
    assert!(o.status.success(), "{}", text(&o));
    for stage in ["train-r2", "sample-r2", "eval"] {
        assert!(
            text(&o).contains(&format!("<-- {stage} done")),
            "{}",
            text(&o)
        );
    }
    let want = report_numbers(&clean.path().join("runs/mini"));
    assert!(want.contains("| arith_hard | round 2"), "{want}");

    let dir = tempfile::tempdir().unwrap();
    quick_config(dir.path(), &edits);
    run_killed_at(
        dir.path(),
        "mini.toml",
        &[
            // in pipeline order: each run gets one point further than the last
            "train.after_checkpoint:2",
            "pretrain.before_manifest",
            "sample.part",
            "filter-r1.before_manifest",
            "train.after_checkpoint",
            "sample-r2.before_manifest",
            "train-r2.before_manifest",
            "eval.before_manifest",
        ],
    );
    let o = run(&["run", "all", "--config", "mini.toml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(report_numbers(&dir.path().join("runs/mini")), want);
}

/// Every folder under `dir`, recursively.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().is_dir() {
            out.push(e.path());
            out.extend(walk(&e.path()));
        }
    }
    out
}

/// Two rounds of the quick default with `[mix]` (earlier rounds' rows and half as many
/// pretraining rows again) and `run.train_from = "base"`: round 2 trains the pretrained model,
/// on its own kept rows, round 1's, and the drawn share of the pretraining rows, all counted in
/// its manifest and the report.
#[test]
fn mix_accumulates_and_replays_and_rounds_can_start_from_the_base() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let cfg = quick_config(
        dir.path(),
        &[
            (
                "name = \"tiny-arith-quick\"",
                "name = \"mini\"\nrounds = 2\ntrain_from = \"base\"\nresample_below = 1.0",
            ),
            ("limit = 30", "limit = 10"),
        ],
    );
    let mut toml = std::fs::read_to_string(&cfg).unwrap();
    toml.push_str(&format!(
        "\n[mix]\naccumulate = true\n[[mix.sources]]\nname = \"replay\"\nformat = \"arith\"\n\
         path = \"{}/data/arith/pretrain.jsonl\"\nshare = 0.5\n",
        root.display()
    ));
    std::fs::write(&cfg, toml).unwrap();
    let o = run(&["run", "all", "--config", "mini.toml"], dir.path());
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let work = dir.path().join("runs/mini");
    let dir_of = |name: &str| planned_stage_dir(&work, name);
    let manifest = |name: &str| manifest_of(&work, name);
    let count = manifest_count;
    let kept = |name: &str| count(&manifest(name), "kept");
    let (k1, k2) = (kept("filter-r1"), kept("filter-r2"));
    let t2 = manifest("train-r2");
    assert_eq!(count(&t2, "mix.round_rows"), k2);
    assert_eq!(count(&t2, "mix.earlier_rows"), k1);
    let replay = ((k1 + k2) as f64 * 0.5).round() as u64;
    assert_eq!(count(&t2, "mix.source.replay"), replay);
    assert_eq!(count(&t2, "mix.rows"), k1 + k2 + replay);
    let rows = selfdistill::data::schema::read_completions(&dir_of("train-r2").join("mix.parquet"))
        .unwrap();
    assert_eq!(rows.len() as u64, k1 + k2 + replay);
    assert_eq!(
        rows.iter()
            .filter(|r| r.model.as_deref() == Some("mix:replay"))
            .count() as u64,
        replay
    );
    let t1 = manifest("train-r1");
    assert_eq!(count(&t1, "mix.earlier_rows"), 0);
    // round 2 starts from the pretrained model, not round 1's
    let pretrain = dir_of("pretrain").join("model");
    let model_of = |m: &Value| {
        m["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == "model")
            .unwrap()["location"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(pretrain.ends_with(model_of(&t2)), "{}", model_of(&t2));
    assert_eq!(model_of(&t1), model_of(&t2));
    // round 2 sampled only the problems round 1 did not solve in every sample
    let s1 = manifest("sample-r1");
    let s2 = manifest("sample-r2");
    let r1 = selfdistill::data::schema::read_completions(
        &dir_of("sample-r1").join("completions.parquet"),
    )
    .unwrap();
    let always = selfdistill::data::schema::pass_rates(&r1)
        .values()
        .filter(|(n, c)| n == c)
        .count() as u64;
    assert_eq!(count(&s2, "problems_skipped"), always);
    assert_eq!(count(&s2, "problems") + always, count(&s1, "problems"));
    let report = std::fs::read_to_string(work.join("report/report.md")).unwrap();
    assert!(report.contains("Problems by pass rate"), "{report}");
    if always > 0 {
        assert!(
            report.contains(&format!(
                "Resampling (`run.resample_below`): {always} problems"
            )),
            "{report}"
        );
    }
    assert!(
        report.contains(&format!(
            "Training rows (`[mix]`): {} in all: {k2} kept this round, {k1} kept in earlier rounds, {replay} from replay.",
            k1 + k2 + replay
        )),
        "{report}"
    );
}

/// `pipeline compare` of two quick runs that differ in one key (given with `--set`): each set's
/// pass@1 for both, the one key that differs (in every stage whose section holds it), the cost
/// rows, and the chart.
#[test]
fn compare_shows_two_runs_and_the_keys_they_differ_in() {
    let dir = tempfile::tempdir().unwrap();
    quick_config(dir.path(), &[("limit = 30", "limit = 10")]);
    for extra in [&[][..], &["--set", "eval.temperature=1.0"][..]] {
        let mut args = vec!["run", "all", "--config", "mini.toml"];
        args.extend_from_slice(extra);
        let o = run(&args, dir.path());
        assert!(o.status.success(), "{}", text(&o));
    }
    let runs: Vec<String> = std::fs::read_dir(dir.path().join("runs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("tiny-arith-quick"))
        .collect();
    assert_eq!(runs.len(), 2, "{runs:?}");
    let a = format!("runs/{}", "tiny-arith-quick");
    let b = format!("runs/{}", "tiny-arith-quick+eval.temperature=1.0");
    let o = run(&["compare", &a, &b, "--output", "cmp"], dir.path());
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for want in [
        "## arith_hard: pass@1[avg-of-n] (95% CI)",
        "| model | tiny-arith-quick | tiny-arith-quick+eval.temperature=1.0 |",
        "| base | ",
        "| round 1 | ",
        "## Config keys that differ",
        "| eval.temperature | null | 1.0 |",
        "| GPU hours | 0.000 | 0.000 |",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    // only the eval key differs
    let differ = out
        .split("## Config keys that differ")
        .nth(1)
        .unwrap()
        .split("## Cost")
        .next()
        .unwrap();
    // the header, its rule and one row
    assert_eq!(differ.matches("\n| ").count(), 3, "{differ}");
    let png = std::fs::read(dir.path().join("cmp/compare.png")).unwrap();
    assert_eq!(&png[..4], b"\x89PNG");
    let o = run(&["compare", &a, "nowhere", "--output", "cmp"], dir.path());
    assert!(
        !o.status.success() && text(&o).contains("no plan"),
        "{}",
        text(&o)
    );
    tensorboard_reads_the_runs_events(&dir.path().join(&a));
}

/// TensorBoard's own loader (which checks every record's CRC) reads the run's event files:
/// every trainer step's loss, the sample stage's pass rate, each eval set's pass@1 per model.
/// Skips without the `tensorboard` package unless SELFDISTILL_REQUIRE_TENSORBOARD=1 (CI).
fn tensorboard_reads_the_runs_events(work: &Path) {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import tensorboard"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            !std::env::var("SELFDISTILL_REQUIRE_TENSORBOARD").is_ok_and(|v| v == "1"),
            "tensorboard is required (SELFDISTILL_REQUIRE_TENSORBOARD=1) but does not import"
        );
        eprintln!("skipped: the tensorboard package is not installed");
        return;
    }
    let board = work.join("tensorboard");
    let dirs: Vec<String> = ["pretrain", "sample", "train", "eval"]
        .iter()
        .map(|s| board.join(s).display().to_string())
        .collect();
    let o = std::process::Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tensorboard_read.py"))
        .args(&dirs)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let got: Value = serde_json::from_slice(&o.stdout).unwrap();
    let manifest = |name: &str| manifest_of(work, name);
    let count = manifest_count;
    for (stage, dir) in [("pretrain", &dirs[0]), ("train", &dirs[2])] {
        let steps = count(&manifest(stage), "steps") as usize;
        for tag in [
            "train/loss",
            "train/lr",
            "train/grad_norm",
            "train/tokens_per_second",
        ] {
            let pts = got[dir][tag]
                .as_array()
                .unwrap_or_else(|| panic!("{dir} {tag}: {got}"));
            assert_eq!(pts.len(), steps, "{stage} {tag}");
            assert_eq!(pts[0][0], 1);
        }
    }
    let s = manifest("sample");
    let rate = got[&dirs[1]]["sample/pass_rate"][0][1].as_f64().unwrap();
    // in percent, as the report gives it; an event holds an f32
    let want = 100.0 * count(&s, "correct") as f64 / count(&s, "samples") as f64;
    assert!(
        (rate - want).abs() <= want * f64::from(f32::EPSILON),
        "{rate} vs {want}"
    );
    for set in ["arith_hard", "arith_easy"] {
        let pts = got[&dirs[3]][format!("eval/{set}/pass@1")]
            .as_array()
            .unwrap();
        let steps: Vec<i64> = pts.iter().map(|p| p[0].as_i64().unwrap()).collect();
        assert_eq!(steps, [0, 1], "{set}");
    }
}

/// STaR's rationalization on the quick default: the problems no sample solved are sampled again
/// with the answer in the prompt (`hinted.parquet`); the same rows, under the prompt without the
/// hint, are `rationalized.parquet`, and the correct ones reach `sft.parquet` marked
/// `rationalized`, counted in the manifests and the report. A run killed inside the hinted pass
/// resumes to the same SFT file.
#[test]
fn star_rationalizes_the_unsolved_problems_under_their_original_prompts() {
    use selfdistill::data::schema::{pass_rates, read_completions};
    let edits = [
        ("name = \"tiny-arith-quick\"", "name = \"mini\""),
        ("limit = 30", "limit = 10"),
        (
            "[train]",
            "[rationalize]\nhint = \"{problem} (answer: {answer})\"\nn = 8\n\n[train]",
        ),
        // the rationales' way through the filter: the arithmetic-step rule would drop them
        // all (given the answer, the pretrained model writes it after false steps)
        ("[filter]", "[filter]\ncheck_arithmetic = false"),
    ];
    let dir = tempfile::tempdir().unwrap();
    quick_config(dir.path(), &edits);
    let o = run(&["run", "all", "--config", "mini.toml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let work = dir.path().join("runs/mini");
    let sample = planned_stage_dir(&work, "sample");
    let first = read_completions(&sample.join("completions.parquet")).unwrap();
    assert!(first.iter().all(|r| !r.rationalized));
    let rates = pass_rates(&first);
    let mut unsolved: Vec<&String> = rates
        .iter()
        .filter(|(_, (n, c))| *n > 0 && *c == 0)
        .map(|(id, _)| id)
        .collect();
    unsolved.sort();
    assert!(!unsolved.is_empty(), "every problem was solved: {rates:?}");
    let hinted = read_completions(&sample.join("hinted.parquet")).unwrap();
    let rationalized = read_completions(&sample.join("rationalized.parquet")).unwrap();
    let mut ids: Vec<&String> = hinted.iter().map(|r| &r.problem_id).collect();
    ids.dedup();
    ids.sort();
    assert_eq!(ids, unsolved);
    assert_eq!(hinted.len(), 8 * unsolved.len());
    assert_eq!(rationalized.len(), hinted.len());
    for (h, r) in hinted.iter().zip(&rationalized) {
        let g = h.grade.as_ref().unwrap();
        assert!(
            h.prompt.contains(&format!("(answer: {})", g.gold_answer)),
            "{}",
            h.prompt
        );
        // the same sample, under the prompt the first pass gave the problem
        let orig = first.iter().find(|f| f.problem_id == r.problem_id).unwrap();
        assert!(r.rationalized && !h.rationalized);
        assert_eq!(r.prompt, orig.prompt);
        assert_eq!(r.prompt_token_ids, orig.prompt_token_ids);
        assert!(!r.prompt.contains("(answer:"));
        assert_eq!(
            (&r.completion, &r.completion_token_ids, r.sample_index),
            (&h.completion, &h.completion_token_ids, h.sample_index)
        );
        assert_eq!(r.grade, h.grade);
    }
    let correct = rationalized
        .iter()
        .filter(|r| r.grade.as_ref().unwrap().correct)
        .count() as u64;
    let m = manifest_of(&work, "sample");
    assert_eq!(
        manifest_count(&m, "rationalize.problems"),
        unsolved.len() as u64
    );
    assert_eq!(
        manifest_count(&m, "rationalize.samples"),
        hinted.len() as u64
    );
    assert_eq!(manifest_count(&m, "rationalize.correct"), correct);
    // the seeded run has correct rationales (2 of 104 when written): the rest needs some
    assert!(correct > 0, "no hinted sample was correct");
    let sft = read_completions(&planned_stage_dir(&work, "filter").join("sft.parquet")).unwrap();
    let marked: Vec<_> = sft.iter().filter(|r| r.rationalized).collect();
    let kept = manifest_count(&manifest_of(&work, "filter"), "kept_rationalized");
    assert_eq!(marked.len() as u64, kept);
    assert!(kept > 0 && kept <= correct, "{kept} of {correct}");
    for r in &marked {
        assert!(unsolved.contains(&&r.problem_id) && !r.prompt.contains("(answer:"));
    }
    let report = std::fs::read_to_string(work.join("report/report.md")).unwrap();
    assert!(
        report.contains(&format!(
            "Rationalization (`[rationalize]`): the {} problems without a correct sample",
            unsolved.len()
        )),
        "{report}"
    );
    assert!(
        report.contains(&format!("{kept} of them rationalized")),
        "{report}"
    );

    // killed in the hinted pass (the first pass commits 8 parts of 8 problems): the same rows
    let again = tempfile::tempdir().unwrap();
    quick_config(again.path(), &edits);
    run_killed_at(again.path(), "mini.toml", &["sample.part:9"]);
    let o = run(&["run", "all", "--config", "mini.toml"], again.path());
    assert!(o.status.success(), "{}", text(&o));
    let sft2 = read_completions(
        &planned_stage_dir(&again.path().join("runs/mini"), "filter").join("sft.parquet"),
    )
    .unwrap();
    assert_eq!(sft2, sft);
}

/// The losses of a training run's `metrics.jsonl`, step by step.
fn losses(metrics: &Path) -> Vec<f64> {
    std::fs::read_to_string(metrics)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["loss"]
                .as_f64()
                .unwrap()
        })
        .collect()
}

/// A teacher that is not the student, with its own vocabulary and chat template: the teacher
/// (the quick default's pretrained model, its chat template giving the raw problem it learned
/// from) samples, and the student (another tiny checkpoint whose tokenizer gives every piece
/// another id, with a `Question: ... Answer:` template) trains on the kept rows re-rendered from
/// their text: its prompts in its own template, no token id of the teacher's, the teacher's
/// end-of-text dropped. Its losses equal a direct `pipeline train` on that text built here, and
/// the eval scores the teacher, the base student and the trained student.
#[test]
fn a_teacher_with_another_tokenizer_trains_the_student_on_re_rendered_text() {
    use selfdistill::data::schema::{
        completions_batch, completions_schema, read_completions, read_problems,
        write_parquet_atomic, Completion,
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    quick_config(dir.path(), &[]);
    let o = run(&["run", "pretrain", "--config", "mini.toml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let teacher = dir.path().join("teacher");
    copy_checkpoint(
        &planned_stage_dir(&dir.path().join("runs/tiny-arith-quick"), "pretrain").join("model"),
        &teacher,
    );
    std::fs::write(
        teacher.join("chat_template.jinja"),
        "{{ messages[-1]['content'] }}",
    )
    .unwrap();
    // the student: new pieces, most frequent, take the first ids, so every arithmetic piece has
    // another id than the teacher's
    let student = dir.path().join("student");
    let mut texts = vec![
        "zebra yak quail ".repeat(500),
        "Question: Answer:".to_string(),
    ];
    for f in ["pretrain.jsonl", "eval_easy.jsonl"] {
        let body = std::fs::read_to_string(root.join("data/arith").join(f)).unwrap();
        for line in body.lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            for k in ["problem", "solution"] {
                texts.push(v[k].as_str().unwrap().to_string());
            }
        }
    }
    let shape = selfdistill::pretrain::ModelShape {
        hidden_size: 32,
        intermediate_size: 64,
        num_layers: 1,
        num_heads: 2,
        num_kv_heads: 1,
        head_dim: 16,
        max_position_embeddings: 512,
        rope_theta: 10_000.0,
        init_std: 0.02,
    };
    selfdistill::pretrain::write_initial_checkpoint(
        &student,
        &shape,
        texts.iter().map(|t| t.as_str()),
        1,
    )
    .unwrap();
    std::fs::write(
        student.join("chat_template.jinja"),
        "Question: {{ messages[-1]['content'] }}\nAnswer:",
    )
    .unwrap();
    let train = "lr = 1e-3\nbetas = [0.9, 0.95]\nweight_decay = 0.0\nwarmup_steps = 0\n\
                 epochs = 1\nrows_per_step = 8\nmax_seq_len = 512\nseed = 0\n";
    std::fs::write(
        dir.path().join("ts.toml"),
        format!(
            "[run]\nname = \"ts\"\n[[data.sources]]\nname = \"arith\"\nformat = \"arith\"\n\
             path = \"{root}/data/arith/pretrain.jsonl\"\nlimit = 16\n[sample]\n\
             model = \"{teacher}\"\nprompt_template = \"chat\"\nn = 4\ntemperature = 1.0\n\
             top_p = 1.0\ntop_k = 0\nmax_new_tokens = 160\nseed = 0\n[filter]\ndedup = \"none\"\n\
             decontaminate_ngram = 16\n[train]\nmodel = \"{student}\"\n{train}[eval]\n\
             sets = [\"{root}/evals/arith_easy.toml\"]\nlimit = 4\n",
            root = root.display(),
            teacher = teacher.display(),
            student = student.display(),
        ),
    )
    .unwrap();
    let o = run(&["run", "all", "--config", "ts.toml"], dir.path());
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let work = dir.path().join("runs/ts");
    let sft = read_completions(&planned_stage_dir(&work, "filter").join("sft.parquet")).unwrap();
    assert!(sft.len() > 8, "{} rows kept", sft.len());
    let train_dir = planned_stage_dir(&work, "train");
    let rows = read_completions(&train_dir.join("student.parquet")).unwrap();
    assert_eq!(rows.len(), sft.len());
    assert_eq!(
        manifest_count(&manifest_of(&work, "train"), "rerendered_rows"),
        sft.len() as u64
    );
    let problems =
        read_problems(&planned_stage_dir(&work, "data").join("problems.parquet")).unwrap();
    let stok =
        selfdistill::model::TextTokenizer::from_file(&student.join("tokenizer.json")).unwrap();
    let mut direct = Vec::new();
    for (s, r) in sft.iter().zip(&rows) {
        let p = problems
            .iter()
            .find(|p| p.problem_id == r.problem_id)
            .unwrap();
        // the teacher saw the raw problem; the student's rows are in its own template
        assert_eq!(s.prompt, p.problem);
        assert_eq!(r.prompt, format!("Question: {}\nAnswer:", p.problem));
        assert_eq!(
            (&r.prompt_token_ids, &r.completion_token_ids),
            (&None, &None)
        );
        assert_eq!(format!("{}<|endoftext|>", r.completion), s.completion);
        // the teacher's ids are not the student's for the same text
        let ids: Vec<i32> = stok
            .encode(&r.completion)
            .unwrap()
            .iter()
            .map(|&t| t as i32)
            .collect();
        assert!(
            !ids.contains(&1),
            "unknown pieces for the student: {}",
            r.completion
        );
        assert_ne!(
            Some(&ids[..]),
            s.completion_token_ids.as_deref().map(|t| &t[..t.len() - 1])
        );
        direct.push(Completion::text(
            p.problem_id.clone(),
            format!("Question: {}\nAnswer:", p.problem),
            s.completion.trim_end_matches("<|endoftext|>").to_string(),
            None,
        ));
    }
    // a direct `pipeline train` on the re-rendered text, made here: the same losses
    let file = dir.path().join("direct.parquet");
    write_parquet_atomic(
        &file,
        completions_schema(false, false),
        &[completions_batch(&direct, false, false).unwrap()],
    )
    .unwrap();
    std::fs::write(dir.path().join("train.toml"), format!("[train]\n{train}")).unwrap();
    let o = run(
        &[
            "train",
            "--model",
            student.to_str().unwrap(),
            "--data",
            "direct.parquet",
            "--config",
            "train.toml",
            "--output",
            "direct",
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let stage_losses = losses(&train_dir.join("train_state/metrics.jsonl"));
    assert!(!stage_losses.is_empty());
    assert_eq!(
        losses(&dir.path().join("direct/train_state/metrics.jsonl")),
        stage_losses
    );
    // the teacher, the base student and the trained student are scored
    let metrics = eval_metrics(&work);
    let models: Vec<&str> = metrics
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["model"].as_str().unwrap())
        .collect();
    for label in ["base (", "teacher (", "trained ("] {
        assert!(models.iter().any(|m| m.starts_with(label)), "{models:?}");
    }
}
