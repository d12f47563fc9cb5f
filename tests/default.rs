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
    let want = count(&s, "correct") as f64 / count(&s, "samples") as f64;
    assert!((rate - want).abs() < 1e-6, "{rate} vs {want}");
    for set in ["arith_hard", "arith_easy"] {
        let pts = got[&dirs[3]][format!("eval/{set}/pass@1")]
            .as_array()
            .unwrap();
        let steps: Vec<i64> = pts.iter().map(|p| p[0].as_i64().unwrap()).collect();
        assert_eq!(steps, [0, 1], "{set}");
    }
}
