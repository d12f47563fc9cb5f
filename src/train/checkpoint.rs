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
use crate::model::ops::sum_all_wide;
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
    let tmp = root.join(format!("{TMP_PREFIX}{:08}", state.step));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    let written = write_into(&tmp, t, opt, state);
    if let Err(e) = written {
        // a full disk must not stay full of a checkpoint that will never be committed
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
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

/// The files of a checkpoint in its temporary folder `tmp`, synced.
fn write_into(tmp: &Path, t: &Trainable, opt: &AdamW, state: &TrainState) -> Result<()> {
    std::fs::create_dir_all(tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
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
    crate::store::sync_dir(tmp)
}

/// The name prefix of a checkpoint being written.
const TMP_PREFIX: &str = ".tmp-step-";

/// Removes checkpoints left half-written under `root` by a process that died while writing
/// them (a full disk, a kill): they are never resumed from, and they hold the space the next
/// checkpoint needs. Returns how many.
pub fn remove_temporaries(root: &Path) -> Result<usize> {
    let Ok(rd) = std::fs::read_dir(root) else {
        return Ok(0);
    };
    let mut n = 0;
    for e in rd.flatten() {
        if e.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
            std::fs::remove_dir_all(e.path())
                .with_context(|| format!("cannot remove {}", e.path().display()))?;
            n += 1;
        }
    }
    Ok(n)
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

/// Loads the weights and moments of checkpoint `dir` into `t` and `opt`, one tensor at a time
/// from the mapped files onto the model's device (no second copy of the state in host memory),
/// then refreshes the model's working copy from the restored master weights.
pub fn restore(dir: &Path, state: &TrainState, t: &Trainable, opt: &mut AdamW) -> Result<()> {
    let map = |name: &str| {
        let p = dir.join(name);
        // SAFETY: read-only maps of files this run wrote and renamed into place.
        unsafe { candle_core::safetensors::MmapedSafetensors::new(&p) }
            .with_context(|| format!("cannot read {}", p.display()))
    };
    let w = map(WEIGHTS)?;
    for (name, var) in t.masters() {
        let v = w
            .load(name, var.device())
            .with_context(|| format!("{}: tensor {name}", dir.display()))?;
        var.set(&v.to_dtype(var.dtype())?)
            .with_context(|| format!("{}: tensor {name}", dir.display()))?;
    }
    t.refresh_working()?;
    let o = map(OPTIMIZER)?;
    let names: std::collections::HashSet<String> =
        o.tensors().into_iter().map(|(n, _)| n).collect();
    let dev = t.device().clone();
    opt.load_state(
        |name| {
            if !names.contains(name) {
                return Ok(None);
            }
            o.load(name, &dev).map(Some)
        },
        state.step,
    )
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
    // the text model does not use (a vision tower) as they were, byte for byte. Each tensor is
    // brought to the host and written on its own: no second copy of the model in memory.
    // SAFETY: read-only maps of the base checkpoint (see Checkpoint::load_transformer).
    let base_st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&base.weights) }
        .with_context(|| format!("cannot map the weights of {}", base.dir.display()))?;
    let mut entries: Vec<Entry> = t
        .masters()
        .iter()
        .map(|(n, v)| Entry {
            name: n.clone(),
            dtype: safetensors_dtype(dtype),
            shape: v.dims().to_vec(),
            bytes: (v.elem_count() * dtype.size_in_bytes()) as u64,
        })
        .collect();
    for name in &t.carried {
        let view = base_st.get(name)?;
        entries.push(Entry {
            name: name.clone(),
            dtype: format!("{:?}", view.dtype()),
            shape: view.shape().to_vec(),
            bytes: view.data().len() as u64,
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let masters: HashMap<&str, &candle_core::Var> =
        t.masters().iter().map(|(n, v)| (n.as_str(), v)).collect();
    let bytes_of = |name: &str| -> Result<Vec<u8>> {
        match masters.get(name) {
            Some(v) => tensor_bytes(&v.as_tensor().to_dtype(dtype)?),
            None => Ok(base_st.get(name)?.data().to_vec()),
        }
    };
    let mut shards: Vec<Vec<Entry>> = vec![Vec::new()];
    let mut bytes = 0u64;
    for e in entries {
        if bytes + e.bytes > MAX_SHARD_BYTES && !shards.last().is_some_and(Vec::is_empty) {
            shards.push(Vec::new());
            bytes = 0;
        }
        bytes += e.bytes;
        shards.last_mut().expect("a shard").push(e);
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
        crate::store::commit_file(&out.join(&name), |tmp| {
            write_safetensors(tmp, shard, &bytes_of)?;
            std::fs::File::open(tmp)?.sync_all()?;
            Ok(())
        })?;
        for e in shard {
            weight_map.insert(e.name.clone(), name.clone().into());
            total += e.bytes;
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

/// One tensor of a safetensors file being written.
struct Entry {
    name: String,
    /// The format's name of the dtype (`F32`, `BF16`, ...).
    dtype: String,
    shape: Vec<usize>,
    bytes: u64,
}

/// safetensors' name of `d`.
fn safetensors_dtype(d: DType) -> String {
    match d {
        DType::F32 => "F32",
        DType::BF16 => "BF16",
        DType::F16 => "F16",
        DType::F64 => "F64",
        DType::U8 => "U8",
        DType::U32 => "U32",
        DType::I64 => "I64",
        _ => "F32",
    }
    .into()
}

/// The little-endian bytes of `t` (any device), as safetensors stores them.
fn tensor_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let t = t.flatten_all()?.to_device(&Device::Cpu)?;
    Ok(match t.dtype() {
        DType::F32 => t
            .to_vec1::<f32>()?
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
        DType::BF16 => t
            .to_vec1::<half::bf16>()?
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
        DType::F16 => t
            .to_vec1::<half::f16>()?
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
        other => bail!("export: tensors in {other:?} are not written"),
    })
}

/// Writes a safetensors file of `entries` (in their order), asking `bytes_of(name)` for each
/// tensor's data while it writes: one tensor in memory at a time.
fn write_safetensors(
    path: &Path,
    entries: &[Entry],
    bytes_of: &dyn Fn(&str) -> Result<Vec<u8>>,
) -> Result<()> {
    use std::io::Write;
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut offset = 0u64;
    for e in entries {
        header.insert(
            e.name.clone(),
            serde_json::json!({
                "dtype": e.dtype,
                "shape": e.shape,
                "data_offsets": [offset, offset + e.bytes],
            }),
        );
        offset += e.bytes;
    }
    let mut json = serde_json::to_vec(&serde_json::Value::Object(header))?;
    // the data starts 8-byte aligned
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    let f =
        std::fs::File::create(path).with_context(|| format!("cannot write {}", path.display()))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 22, f);
    w.write_all(&(json.len() as u64).to_le_bytes())?;
    w.write_all(&json)?;
    for e in entries {
        let data = bytes_of(&e.name)?;
        if data.len() as u64 != e.bytes {
            bail!(
                "export: {} has {} bytes, not {}",
                e.name,
                data.len(),
                e.bytes
            );
        }
        w.write_all(&data)?;
    }
    w.flush()?;
    Ok(())
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

/// Reopens an export with our loader (config, tokenizer files, shard index) and compares every
/// tensor, read back one at a time, with the trained values in `dtype`: the same names, shapes
/// and bits.
fn verify_export(t: &Trainable, out: &Path, dtype: DType) -> Result<()> {
    let ck = Checkpoint::open(&out.display().to_string())
        .with_context(|| format!("the exported model in {} does not open", out.display()))?;
    // SAFETY: read-only maps of the files just written.
    let st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&ck.weights) }
        .with_context(|| format!("the exported model in {} does not load", out.display()))?;
    let names: std::collections::HashSet<String> =
        st.tensors().into_iter().map(|(n, _)| n).collect();
    if names.len() != t.masters().len() + t.carried.len() {
        bail!(
            "the export holds {} tensors, not {}",
            names.len(),
            t.masters().len() + t.carried.len()
        );
    }
    for (name, var) in t.masters() {
        if !names.contains(name) {
            bail!("the export lost {name}");
        }
        let want = var.as_tensor().to_dtype(dtype)?;
        let g = st.load(name, want.device())?;
        if g.dims() != want.dims() || g.dtype() != dtype {
            bail!(
                "the exported {name} reloads as {:?} {:?}",
                g.dtype(),
                g.dims()
            );
        }
        let differ = sum_all_wide(&g.ne(&want)?.to_dtype(DType::F32)?)?.to_scalar::<f32>()?;
        if differ != 0.0 {
            bail!("the exported {name} reloads with {differ} values changed");
        }
    }
    Ok(())
}

/// How far one tensor moved from the base model.
#[derive(Debug, Clone, Serialize)]
pub struct TensorChange {
    pub name: String,
    /// `|trained - base| / |base|` (L2); for a zero-centred norm weight (stored near 0, used as
    /// `1 + w`) against the scale it gives, `|trained - base| / |1 + base|`.
    pub relative_change: f64,
    /// Share of elements whose value in the stored dtype differs from the base.
    pub changed_share: f64,
}

/// Every tensor's change from the base checkpoint `base` (read one tensor at a time, as the
/// master weights started: upcast to f32) in `dtype`.
pub fn change_report(base: &Checkpoint, t: &Trainable, dtype: DType) -> Result<Vec<TensorChange>> {
    // SAFETY: read-only maps of the base checkpoint (see Checkpoint::load_transformer).
    let st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&base.weights) }
        .with_context(|| format!("cannot map the weights of {}", base.dir.display()))?;
    // what each weight is used as: itself, or 1 + itself (zero-centred norms)
    let offsets: std::collections::HashMap<String, f32> =
        crate::model::init::weight_shapes(&base.config)
            .into_iter()
            .map(|(name, _, init)| (name, init.scale_offset()))
            .collect();
    let mut out = Vec::new();
    for (name, var) in t.masters() {
        let now = var.as_tensor();
        let b = st
            .load(name, now.device())
            .with_context(|| format!("no base tensor {name}"))?
            .to_dtype(DType::F32)?;
        let d = sum_all_wide(&(now - &b)?.sqr()?)?.to_scalar::<f32>()? as f64;
        let used = (&b + offsets.get(name).copied().unwrap_or(0.0) as f64)?;
        let n = sum_all_wide(&used.sqr()?)?.to_scalar::<f32>()? as f64;
        let ne = sum_all_wide(
            &now.to_dtype(dtype)?
                .ne(&b.to_dtype(dtype)?)?
                .to_dtype(DType::F32)?,
        )?
        .to_scalar::<f32>()? as f64;
        out.push(TensorChange {
            name: name.clone(),
            relative_change: (d / n.max(1e-30)).sqrt(),
            changed_share: ne / now.elem_count().max(1) as f64,
        });
    }
    Ok(out)
}
