//! The train stage and `pipeline train` through the real binary: a pipeline that trains the tiny
//! fixture on graded reference solutions, SIGKILLed right after a checkpoint and in the middle of
//! writing one, resumes to bit-identical weights; bad settings fail naming file and key.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

use common::*;

/// data + filter over 40 GSM8K problems, then 4 training steps of the tiny fixture.
fn setup(dir: &Path) -> Option<PathBuf> {
    let data = shared("data/gsm8k_train.jsonl")?;
    let model = shared("fixtures/tiny-qwen3")?;
    let cfg = gsm8k_train_config(
        "t",
        "work",
        &data,
        &model,
        "lr = 0.003
rows_per_step = 8
max_steps = 4
warmup_steps = 1
max_seq_len = 256
micro_batch_tokens = 1024
loss_chunk_tokens = 100
checkpoint_every = 1
peak_tflops = 1.0
",
    );
    let p = dir.join("t.toml");
    std::fs::write(&p, cfg).unwrap();
    Some(p)
}

fn trained_weights(work: &Path) -> Vec<u8> {
    std::fs::read(stage_dir(work, "train").join("model/model.safetensors")).unwrap()
}

#[test]
fn sigkilled_training_resumes_to_the_uninterrupted_weights() {
    let dir = tempfile::tempdir().unwrap();
    let Some(cfg) = setup(dir.path()) else { return };
    let cfg = cfg.to_str().unwrap();
    let o = run(
        &["run", "all", "--config", cfg, "--workdir", "clean"],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("memory budget"), "{out}");
    assert!(out.contains("train: 4/4 steps"), "{out}");
    let want = trained_weights(&dir.path().join("clean"));

    for (point, resumed_at) in [
        ("train.after_checkpoint:2", 2),
        ("train.checkpoint_rename:3", 2),
    ] {
        let work = format!("w{resumed_at}{}", point.len());
        let o = bin()
            .args(["run", "all", "--config", cfg, "--workdir", &work])
            .env(selfdistill::fault::ENV, point)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert_eq!(o.status.signal(), Some(9), "{point}: {}", text(&o));
        let tdir = stage_dir(&dir.path().join(&work), "train");
        assert!(!tdir.join("manifest.json").exists(), "{point}");
        assert!(!tdir.join("model/model.safetensors").exists(), "{point}");
        let o = run(&["status", "--workdir", &work], dir.path());
        assert!(
            text(&o).contains(&format!("last checkpoint: step {resumed_at}")),
            "{point}: {}",
            text(&o)
        );
        let o = run(
            &["run", "all", "--config", cfg, "--workdir", &work],
            dir.path(),
        );
        assert!(o.status.success(), "{point}: {}", text(&o));
        assert!(
            text(&o).contains(&format!("(step {resumed_at} of 4)")),
            "{point}: {}",
            text(&o)
        );
        assert!(
            trained_weights(&dir.path().join(&work)) == want,
            "{point}: resumed weights differ from the uninterrupted run"
        );
    }
}

#[test]
fn train_command_rejects_unknown_keys_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let Some(model) = shared("fixtures/tiny-qwen3") else {
        return;
    };
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[train]\nlearning_rate = 0.1\n").unwrap();
    let o = run(
        &[
            "train",
            "--model",
            model.to_str().unwrap(),
            "--data",
            "missing.parquet",
            "--config",
            bad.to_str().unwrap(),
            "--output",
            "out",
        ],
        dir.path(),
    );
    assert!(!o.status.success());
    let out = text(&o);
    assert!(
        out.contains("bad.toml") && out.contains("learning_rate"),
        "{out}"
    );
    assert!(!dir.path().join("out").exists());
}
