//! Operating a run on the tiny-qwen3 fixture: progress bars on a terminal and plain lines
//! elsewhere, each stage's log file, `status --json` while a sample stage runs and after it is
//! killed, and the sample stage sharded over three processes sharing a work dir.

mod common;

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{bin, manifest_count, manifest_of, run, shared, stage_dir, text, toy_problems};
use selfdistill::data::schema::{read_completions, Completion};

/// A data -> sample -> filter config over `rows` problems, `n` samples of `new` tokens each.
fn config(dir: &Path, model: &Path, rows: usize, n: u32, new: usize, seqs: usize, seed: u64) {
    let input = toy_problems(dir, rows);
    let cfg = format!(
        r#"[run]
workdir = "work"
[[data.sources]]
name = "toy"
format = "mapped"
path = "{}"
problem_field = "problem"
answer_field = "answer"
[sample]
model = "{}"
prompt_template = "raw"
n = {n}
temperature = 0.8
max_new_tokens = {new}
ignore_eos = true
max_num_seqs = {seqs}
seed = {seed}
[filter]
max_per_problem = 1
"#,
        input.display(),
        model.display()
    );
    std::fs::write(dir.join("p.toml"), cfg).unwrap();
}

fn rows(path: &Path) -> Vec<(String, i32, Option<Vec<i32>>)> {
    read_completions(path)
        .unwrap()
        .into_iter()
        .map(|c: Completion| (c.problem_id, c.sample_index, c.completion_token_ids))
        .collect()
}

/// Runs `args` with stderr on a new pseudo-terminal; returns what the terminal received.
fn on_a_terminal(args: &[&str], cwd: &Path) -> (bool, String) {
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two file descriptors into the given ints; the other arguments may
    // be null.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened and are owned here alone.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let mut child = bin()
        .args(args)
        .current_dir(cwd)
        .env("TERM", "xterm")
        .stdout(Stdio::null())
        .stderr(Stdio::from(slave))
        .spawn()
        .unwrap();
    // the parent's copy of the slave is gone (moved into the child's stdio): reading the master
    // ends with EIO once the child exits
    let fd = master.as_raw_fd();
    let reader = std::thread::spawn(move || {
        // SAFETY: `fd` stays open: `master` lives until the thread is joined below.
        let mut f = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match f.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
        out
    });
    let ok = child.wait().unwrap().success();
    let out = reader.join().unwrap();
    drop(master);
    (ok, String::from_utf8_lossy(&out).into_owned())
}

#[test]
fn bars_on_a_terminal_plain_lines_elsewhere_and_a_log_per_stage() {
    let Some(model) = shared("fixtures/tiny-qwen3") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), &model, 12, 2, 24, 4, 3);
    // not a terminal: plain lines, no cursor movement or colour
    let o = bin()
        .args(["run", "sample", "--config", "p.toml"])
        .env("SELFDISTILL_PROGRESS_EVERY", "0")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("sample: 24/24 samples"), "{err}");
    assert!(err.contains("INFO"), "{err}");
    assert!(!err.contains('\r') && !err.contains('\x1b'), "{err:?}");
    let log =
        std::fs::read_to_string(stage_dir(&dir.path().join("work"), "sample").join("stage.log"))
            .unwrap();
    assert!(log.contains("==> sample"), "{log}");
    assert!(log.contains("sample: 24/24 samples"), "{log}");
    assert!(log.contains("<-- sample done"), "{log}");

    // a terminal: a bar drawn in place (carriage returns, escape codes), the same figures
    let (ok, tty) = on_a_terminal(
        &["run", "sample", "--config", "p.toml", "--workdir", "tty"],
        dir.path(),
    );
    assert!(ok, "{tty}");
    assert!(tty.contains('\x1b') && tty.contains('\r'), "{tty:?}");
    assert!(tty.contains("/24 samples") && tty.contains("] "), "{tty:?}");
    // the periodic line goes to the stage's log only (the bar shows it)
    let tty_log =
        std::fs::read_to_string(stage_dir(&dir.path().join("tty"), "sample").join("stage.log"))
            .unwrap();
    assert!(tty_log.contains("sample: 24/24 samples"), "{tty_log}");
    assert!(!tty_log.contains('\x1b'), "{tty_log:?}");
    // -q: no bar on the terminal, no info lines
    let (ok, quiet) = on_a_terminal(
        &[
            "run",
            "sample",
            "--config",
            "p.toml",
            "--workdir",
            "q",
            "-q",
        ],
        dir.path(),
    );
    assert!(ok, "{quiet}");
    assert!(!quiet.contains("samples"), "{quiet:?}");
}

fn status_json(dir: &Path) -> serde_json::Value {
    let o = run(&["status", "--workdir", "work", "--json"], dir);
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn sample_status(v: &serde_json::Value) -> serde_json::Value {
    v["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "sample")
        .cloned()
        .unwrap()
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn status_json_follows_a_running_sample_stage_and_says_when_it_was_killed() {
    let Some(model) = shared("fixtures/tiny-qwen3") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // long enough to be watched: 480 samples of 300 tokens, 4 at a time
    config(dir.path(), &model, 60, 8, 300, 4, 3);
    let mut child = bin()
        .args(["run", "sample", "--config", "p.toml"])
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let mut seen: Vec<u64> = Vec::new();
    while seen.len() < 3 && start.elapsed() < Duration::from_secs(300) {
        std::thread::sleep(Duration::from_millis(300));
        if !dir.path().join("work/plan.json").exists() {
            continue;
        }
        let s = sample_status(&status_json(dir.path()));
        if s["state"] == "done" {
            break;
        }
        if s["state"] != "running" {
            continue;
        }
        let p = &s["progress"];
        assert_eq!(p["unit"], "samples", "{s}");
        assert_eq!(p["total"], 480, "{s}");
        assert_eq!(p["pid"], child.id(), "{s}");
        let done = p["done"].as_u64().unwrap();
        if seen.last() != Some(&done) {
            seen.push(done);
        }
    }
    assert!(
        seen.len() >= 3 && seen.windows(2).all(|w| w[0] < w[1]),
        "the progress did not move: {seen:?}"
    );
    // the run wrote its time estimate into the plan: 60 problems x 8 x half of 300 tokens
    let plan: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("work/plan.json")).unwrap()).unwrap();
    let est = &plan["estimates"][0];
    assert_eq!(
        (est["stage"].as_str(), est["tokens"].as_u64()),
        (Some("sample"), Some(72000))
    );
    assert!(est["seconds"].as_f64().unwrap() > 0.0, "{est}");
    // killed: the status says the process is gone
    kill(&mut child);
    let s = sample_status(&status_json(dir.path()));
    assert_eq!(s["state"], "stopped", "{s}");
    let note = s["note"].as_str().unwrap();
    assert!(
        note.contains(&format!("pid {} is gone", child.id())),
        "{note}"
    );
    let o = run(&["status", "--workdir", "work"], dir.path());
    let line = text(&o);
    assert!(line.contains("stopped: "), "{line}");
    assert!(line.contains("`pipeline run` resumes it"), "{line}");
    // and a run resumes it to the end
    let o = run(&["run", "sample", "--config", "p.toml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(sample_status(&status_json(dir.path()))["state"], "done");
}

fn deploy(script: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(script)
}

/// One node of a Slurm array (the shipped script; the array numbered from 1), or with `k8s`, a
/// pod of an Indexed Job.
fn shard_run(dir: &Path, work: &str, i: usize, n: usize, k8s: bool) -> Child {
    let mut c = if k8s {
        let mut c = bin();
        c.args(["run", "sample", "--config", "p.toml", "--workdir", work])
            .env("JOB_COMPLETION_INDEX", i.to_string())
            .env("SELFDISTILL_NUM_SHARDS", n.to_string());
        c
    } else {
        let mut c = std::process::Command::new("bash");
        c.arg(deploy("slurm-sample.sbatch"))
            .args(["p.toml", "--workdir", work])
            .env("PIPELINE", env!("CARGO_BIN_EXE_pipeline"))
            // an array submitted as --array=1-N: the shard is the task's place in it
            .env("SLURM_ARRAY_TASK_ID", (i + 1).to_string())
            .env("SLURM_ARRAY_TASK_MIN", "1")
            .env("SLURM_ARRAY_TASK_COUNT", n.to_string());
        c
    };
    c.current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_sample_stage_sharded_over_three_processes_equals_one_process() {
    let Some(model) = shared("fixtures/tiny-qwen3") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), &model, 30, 3, 16, 8, 5);
    let d = dir.path();
    let one = run(
        &["run", "sample", "--config", "p.toml", "--workdir", "one"],
        d,
    );
    assert!(one.status.success(), "{}", text(&one));

    // two of three nodes: their parts are committed, the stage is not done
    let children: Vec<Child> = (0..2).map(|i| shard_run(d, "work", i, 3, i == 1)).collect();
    for (i, c) in children.into_iter().enumerate() {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        assert!(
            text(&o).contains(&format!("shard {i}/3 of sample done")),
            "{}",
            text(&o)
        );
        // a shard's run stops after its part: no filter, no report
        assert!(!text(&o).contains("==> filter"), "{}", text(&o));
    }
    let sample = stage_dir(&d.join("work"), "sample");
    assert!(!sample.join("manifest.json").exists());
    let o = run(&["run", "all", "--config", "p.toml"], d);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("shard(s) 2 of 3 are not committed yet"),
        "{}",
        text(&o)
    );
    assert!(!sample.join("manifest.json").exists());

    // a shard sampled with other settings (another seed) is refused by the join
    std::fs::write(
        d.join("p.toml"),
        std::fs::read_to_string(d.join("p.toml"))
            .unwrap()
            .replace("seed = 5", "seed = 6"),
    )
    .unwrap();
    let o = shard_run(d, "other", 2, 3, false)
        .wait_with_output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let foreign = stage_dir(&d.join("other"), "sample").join("shards/2-of-3");
    let target = sample.join("shards/2-of-3");
    std::fs::rename(&foreign, &target).unwrap();
    std::fs::write(
        d.join("p.toml"),
        std::fs::read_to_string(d.join("p.toml"))
            .unwrap()
            .replace("seed = 6", "seed = 5"),
    )
    .unwrap();
    let o = run(&["run", "all", "--config", "p.toml"], d);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("was sampled for another stage key"),
        "{}",
        text(&o)
    );
    std::fs::remove_dir_all(&target).unwrap();

    // the third node, then the job after the array (the shipped script, with the array's
    // variables still set: it unsets them): joins them and goes on
    let o = shard_run(d, "work", 2, 3, false)
        .wait_with_output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let st = run(&["status", "--workdir", "work"], d);
    assert!(text(&st).contains("shards done"), "{}", text(&st));
    let o = std::process::Command::new("bash")
        .arg(deploy("slurm-rest.sbatch"))
        .arg("p.toml")
        .env("PIPELINE", env!("CARGO_BIN_EXE_pipeline"))
        .env("SLURM_ARRAY_TASK_ID", "0")
        .env("SLURM_ARRAY_TASK_COUNT", "3")
        .current_dir(d)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("joined 3 shards"), "{}", text(&o));
    assert!(text(&o).contains("<-- filter done"), "{}", text(&o));
    // every stage done: `--watch` prints once and returns
    let o = run(
        &["status", "--workdir", "work", "--watch", "0.2", "--json"],
        d,
    );
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["stages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["state"] == "done"),
        "{v}"
    );
    let joined = rows(&sample.join("completions.parquet"));
    let single = rows(&stage_dir(&d.join("one"), "sample").join("completions.parquet"));
    assert_eq!(joined.len(), 90);
    assert_eq!(joined, single);
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(sample.join("manifest.json")).unwrap()).unwrap();
    let counts: Vec<(String, u64)> = serde_json::from_value(m["counts"].clone()).unwrap();
    assert!(counts.contains(&("samples".into(), 90)), "{counts:?}");
    assert!(counts.contains(&("shards".into(), 3)), "{counts:?}");
    // a shard still sampling (its lock held) keeps `--force` from pulling its folder away
    let held = std::fs::File::open(sample.join("shards/0-of-3/.lock")).unwrap();
    held.try_lock().unwrap();
    let o = run(
        &["run", "all", "--config", "p.toml", "--force", "sample"],
        d,
    );
    assert!(!o.status.success());
    assert!(
        text(&o).contains("shard(s) 0/3 of it are being sampled now"),
        "{}",
        text(&o)
    );
    assert!(sample.join("manifest.json").exists());
}

/// With `[rationalize]`, each shard rationalizes its own unsolved problems and the join merges
/// the hinted and rationalized rows in the problems' order: the same files and counts as one
/// process (the random fixture solves almost nothing, so nearly every problem is rationalized).
#[test]
fn a_sharded_sample_stage_rationalizes_as_one_process_does() {
    let Some(model) = shared("fixtures/tiny-qwen3") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    config(d, &model, 12, 2, 8, 8, 3);
    let mut cfg = std::fs::read_to_string(d.join("p.toml")).unwrap();
    cfg.push_str("[rationalize]\nhint = \"{problem} The answer is {answer}.\"\nn = 3\n");
    std::fs::write(d.join("p.toml"), cfg).unwrap();
    let one = run(
        &["run", "sample", "--config", "p.toml", "--workdir", "one"],
        d,
    );
    assert!(one.status.success(), "{}", text(&one));
    for i in 0..2 {
        let o = run(
            &[
                "run",
                "sample",
                "--config",
                "p.toml",
                "--workdir",
                "two",
                "--shard",
                &format!("{i}/2"),
            ],
            d,
        );
        assert!(o.status.success(), "{}", text(&o));
    }
    let o = run(
        &["run", "sample", "--config", "p.toml", "--workdir", "two"],
        d,
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("joined 2 shards"), "{}", text(&o));
    let (a, b) = (
        stage_dir(&d.join("one"), "sample"),
        stage_dir(&d.join("two"), "sample"),
    );
    for f in [
        "completions.parquet",
        "hinted.parquet",
        "rationalized.parquet",
    ] {
        let (x, y) = (
            read_completions(&a.join(f)).unwrap(),
            read_completions(&b.join(f)).unwrap(),
        );
        assert!(!x.is_empty(), "{f}");
        assert_eq!(x, y, "{f}");
    }
    let m = |w: &str| manifest_of(&d.join(w), "sample");
    for key in [
        "rationalize.problems",
        "rationalize.samples",
        "rationalize.correct",
    ] {
        assert_eq!(
            manifest_count(&m("one"), key),
            manifest_count(&m("two"), key),
            "{key}"
        );
    }
    assert!(manifest_count(&m("one"), "rationalize.problems") >= 10);
}
