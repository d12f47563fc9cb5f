//! What training writes: full-state checkpoints (master weights, AdamW moments, step, data
//! cursor, settings, versions) that a run resumes from bit for bit, and the final model in
//! Hugging Face layout, reloaded once written to prove it loads.
//!
//! A checkpoint is a folder `step-NNNNNNNN/` built under a temp name and renamed into place, so a
//! folder with that name is always whole. Knows nothing of the training loop.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use super::adamw::AdamW;
use super::settings::TrainSettings;
use super::Trainable;
use crate::model::{Checkpoint, SIDE_FILES};

/// The non-tensor part of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Optimizer steps taken.
    pub step: u64,
    pub total_steps: u64,
    /// Hash of everything that determines the run's numbers (settings, data, base model): a
    /// checkpoint resumes only a run with the same fingerprint.
    pub fingerprint: String,
    /// Data cursor: rows consumed (over all epochs) after `step` steps of the plan.
    pub rows_done: u64,
    pub epoch: u64,
    /// The stochastic-rounding and shuffle streams derive from (seed, step): nothing else to save.
    pub seed: u64,
    pub settings: TrainSettings,
    pub base_model: String,
    pub selfdistill_version: String,
    pub candle_version: String,
    pub last_loss: f64,
    pub written_unix: u64,
}

const WEIGHTS: &str = "weights.safetensors";
const OPTIMIZER: &str = "optimizer.safetensors";
const STATE: &str = "state.json";

fn step_dir(root: &Path, step: u64) -> PathBuf {
    root.join(format!("step-{step:08}"))
}

/// Writes a checkpoint of `t` and `opt` under `root` atomically, then deletes all but the
/// newest `keep`. Returns its folder.
pub fn save(
    root: &Path,
    t: &Trainable,
    opt: &AdamW,
    state: &TrainState,
    keep: usize,
) -> Result<PathBuf> {
    let dir = step_dir(root, state.step);
    let tmp = root.join(format!(".tmp-step-{:08}", state.step));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let save = |name: &str, tensors: HashMap<String, Tensor>| -> Result<()> {
        let p = tmp.join(name);
        candle_core::safetensors::save(&tensors, &p)
            .with_context(|| format!("cannot write {}", p.display()))?;
        std::fs::File::open(&p)?.sync_all()?;
        Ok(())
    };
    save(WEIGHTS, t.tensors())?;
    save(OPTIMIZER, opt.state_tensors().into_iter().collect())?;
    crate::store::write_json_atomic(&tmp.join(STATE), state)?;
    crate::store::sync_dir(&tmp)?;
    crate::fault::point("train.checkpoint_rename");
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::rename(&tmp, &dir).with_context(|| format!("cannot commit {}", dir.display()))?;
    crate::store::sync_dir(root)?;
    for (_, old) in list(root)?.into_iter().rev().skip(keep) {
        std::fs::remove_dir_all(&old)
            .with_context(|| format!("cannot delete old checkpoint {}", old.display()))?;
    }
    Ok(dir)
}

/// Complete checkpoints under `root`, oldest first.
pub fn list(root: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let Ok(rd) = std::fs::read_dir(root) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for e in rd {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(n) = name
            .strip_prefix("step-")
            .and_then(|s| s.parse::<u64>().ok())
        {
            out.push((n, e.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// The newest checkpoint's state, if any.
pub fn latest(root: &Path) -> Result<Option<(PathBuf, TrainState)>> {
    let Some((_, dir)) = list(root)?.pop() else {
        return Ok(None);
    };
    let p = dir.join(STATE);
    let state: TrainState = serde_json::from_slice(
        &std::fs::read(&p).with_context(|| format!("cannot read {}", p.display()))?,
    )
    .with_context(|| format!("{} is not a training state", p.display()))?;
    Ok(Some((dir, state)))
}

/// Loads the weights and moments of checkpoint `dir` into `t` and `opt`.
pub fn restore(dir: &Path, state: &TrainState, t: &Trainable, opt: &mut AdamW) -> Result<()> {
    let dev = Device::Cpu;
    let w = candle_core::safetensors::load(dir.join(WEIGHTS), &dev)
        .with_context(|| format!("cannot read {}", dir.join(WEIGHTS).display()))?;
    for (name, var) in t.named_vars() {
        let v = w
            .get(name)
            .with_context(|| format!("{}: no tensor {name}", dir.display()))?;
        var.set(&v.to_device(var.device())?)
            .with_context(|| format!("{}: tensor {name}", dir.display()))?;
    }
    let o = candle_core::safetensors::load(dir.join(OPTIMIZER), &dev)
        .with_context(|| format!("cannot read {}", dir.join(OPTIMIZER).display()))?;
    opt.load_state(&o, state.step)
        .with_context(|| format!("{}: optimizer state", dir.display()))?;
    Ok(())
}

/// The dtype a checkpoint's config names.
pub fn checkpoint_dtype(ck: &Checkpoint) -> DType {
    config_dtype(&ck.config)
}

/// The dtype a config declares (`torch_dtype` / `dtype`); f32 when it declares none.
pub fn config_dtype(cfg: &crate::model::ModelConfig) -> DType {
    match cfg.dtype.as_str() {
        "bfloat16" => DType::BF16,
        "float16" => DType::F16,
        _ => DType::F32,
    }
}

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        _ => "float32",
    }
}

/// Largest shard written; bigger models get `model.safetensors.index.json`.
pub const MAX_SHARD_BYTES: u64 = 5_000_000_000;

/// Writes `t` as a Hugging Face checkpoint in `dtype` to `out` (the base model's config with the
/// dtype set, its tokenizer files, weights sharded above [`MAX_SHARD_BYTES`]), then reloads it
/// through [`Checkpoint`] and checks every tensor against what was written.
pub fn export(t: &Trainable, base: &Checkpoint, dtype: DType, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    for f in SIDE_FILES {
        // copied beside the weights when the base model has them
        let src = base.dir.join(f);
        if src.exists() {
            let bytes = std::fs::read(&src)?;
            crate::store::commit_file(&out.join(f), |tmp| Ok(std::fs::write(tmp, &bytes)?))?;
        }
    }
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(base.dir.join("config.json"))?)?;
    // the text model's dtype (a multimodal config's and its text_config's)
    if let Some(obj) = config.as_object_mut() {
        set_dtype(obj, dtype);
        if let Some(tc) = obj.get_mut("text_config").and_then(|v| v.as_object_mut()) {
            if tc.contains_key("dtype") || tc.contains_key("torch_dtype") {
                set_dtype(tc, dtype);
            }
        }
    }
    // weights, in name order, cut into shards: the trained ones in `dtype`, and the tensors
    // the text model does not use (a vision tower) as they were, byte for byte
    let mut tensors: Vec<(String, Tensor)> = t
        .named_vars()
        .iter()
        .map(|(n, v)| Ok((n.clone(), v.as_tensor().to_dtype(dtype)?)))
        .collect::<Result<_>>()?;
    if !t.carried.is_empty() {
        // SAFETY: read-only maps of the base checkpoint (see Checkpoint::load_transformer).
        let st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&base.weights) }
            .with_context(|| format!("cannot map the weights of {}", base.dir.display()))?;
        for name in &t.carried {
            tensors.push((name.clone(), st.load(name, &candle_core::Device::Cpu)?));
        }
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let mut shards: Vec<Vec<(String, Tensor)>> = vec![Vec::new()];
    let mut bytes = 0u64;
    for (n, x) in tensors {
        let b = (x.elem_count() * x.dtype().size_in_bytes()) as u64;
        if bytes + b > MAX_SHARD_BYTES && !shards.last().is_some_and(Vec::is_empty) {
            shards.push(Vec::new());
            bytes = 0;
        }
        bytes += b;
        shards.last_mut().expect("a shard").push((n, x));
    }
    let n = shards.len();
    // a previous export's weights must not survive beside this one's
    for old in crate::model::weight_files(out).unwrap_or_default() {
        std::fs::remove_file(&old)?;
    }
    let _ = std::fs::remove_file(out.join("model.safetensors.index.json"));
    let mut weight_map = serde_json::Map::new();
    let mut total = 0u64;
    for (i, shard) in shards.iter().enumerate() {
        let name = if n == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{n:05}.safetensors", i + 1)
        };
        let map: HashMap<String, Tensor> = shard.iter().cloned().collect();
        crate::store::commit_file(&out.join(&name), |tmp| {
            candle_core::safetensors::save(&map, tmp)?;
            std::fs::File::open(tmp)?.sync_all()?;
            Ok(())
        })?;
        for (t_name, x) in shard {
            weight_map.insert(t_name.clone(), name.clone().into());
            total += (x.elem_count() * x.dtype().size_in_bytes()) as u64;
        }
    }
    if n > 1 {
        crate::store::write_json_atomic(
            &out.join("model.safetensors.index.json"),
            &serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map}),
        )?;
    }
    // config.json last: a folder without it is not a checkpoint
    crate::store::write_json_atomic(&out.join("config.json"), &config)?;
    verify_export(t, out, dtype)
}

/// Sets a config object's dtype field (`dtype` where it has one, else `torch_dtype`).
fn set_dtype(obj: &mut serde_json::Map<String, serde_json::Value>, dtype: DType) {
    let key = if obj.contains_key("dtype") {
        "dtype"
    } else {
        "torch_dtype"
    };
    obj.insert(key.into(), dtype_name(dtype).into());
}

/// Reloads an export with our loader and compares every tensor with the trained values.
fn verify_export(t: &Trainable, out: &Path, dtype: DType) -> Result<()> {
    let ck = Checkpoint::open(&out.display().to_string())
        .with_context(|| format!("the exported model in {} does not open", out.display()))?;
    let back = Trainable::load(&ck, &Device::Cpu)
        .with_context(|| format!("the exported model in {} does not load", out.display()))?;
    let got = back.tensors();
    for (name, var) in t.named_vars() {
        let want = var.as_tensor().to_dtype(dtype)?.to_dtype(DType::F32)?;
        let g = got
            .get(name)
            .with_context(|| format!("the export lost {name}"))?;
        let diff = (g - want.to_device(g.device())?)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        if diff != 0.0 {
            bail!("the exported {name} reloads with a difference of {diff}");
        }
    }
    Ok(())
}

/// How far one tensor moved from the base model.
#[derive(Debug, Clone, Serialize)]
pub struct TensorChange {
    pub name: String,
    /// `|trained - base| / |base|` (L2).
    pub relative_change: f64,
    /// Share of elements whose value in the stored dtype differs from the base.
    pub changed_share: f64,
}

/// Every tensor's change from `base` (f32 master values of the base model) in `dtype`.
pub fn change_report(
    base: &HashMap<String, Tensor>,
    t: &Trainable,
    dtype: DType,
) -> Result<Vec<TensorChange>> {
    let mut out = Vec::new();
    for (name, var) in t.named_vars() {
        let b = base
            .get(name)
            .with_context(|| format!("no base tensor {name}"))?;
        let now = var.as_tensor();
        let d = (now - b)?.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
        let n = b.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
        let ne = now
            .to_dtype(dtype)?
            .ne(&b.to_dtype(dtype)?)?
            .to_dtype(DType::F32)?
            .sum_all()?
            .to_scalar::<f32>()? as f64;
        out.push(TensorChange {
            name: name.clone(),
            relative_change: (d / n.max(1e-30)).sqrt(),
            changed_share: ne / now.elem_count().max(1) as f64,
        });
    }
    Ok(out)
}
