//! Hugging Face checkpoints as they come: config, weights (single file or shards with the index),
//! tokenizer, chat template and EOS ids, from a local folder or a hub id.
//!
//! [`Checkpoint::open`] finds the files; [`Checkpoint::load_transformer`] builds the model on a
//! device, computing in f32 on CPU whatever the stored dtype. The model owns no cache and knows
//! nothing of scheduling or config files.

pub mod attention;
pub mod cards;
pub mod clock;
pub mod config;
pub mod cost;
pub mod cpu_op;
pub mod diff_ops;
pub mod host_linear;
pub mod init;
pub mod layer_ops;
pub mod layers;
pub mod ops;
mod packed;
pub mod tokenizer;
pub mod transformer;

#[cfg(test)]
mod candle_tests;
#[cfg(test)]
pub(crate) mod tests;

use std::path::{Path, PathBuf};

use crate::device::DeviceSpec;
use anyhow::{anyhow, bail, Context, Result};
use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use serde_json::Value;

pub use config::{Family, LayerCache, LayerKind, ModelConfig, RopeScaling};
pub use tokenizer::{ChatTemplate, Message, TextTokenizer};
pub use transformer::Transformer;

/// The files beside the weights that change what a checkpoint computes or how its text is
/// read and written: tokenizer, chat template, generation defaults.
pub const SIDE_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
];

/// The files of one checkpoint, all local.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// A local folder, or the snapshot folder a hub id resolved to.
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub weights: Vec<PathBuf>,
}

impl Checkpoint {
    /// A local folder, or a hub id (`Qwen/Qwen3-4B`, `hf://Qwen/Qwen3-4B`) fetched through the
    /// Hugging Face cache (offline: the cache only, with an error saying what to download).
    pub fn open(name: &str) -> Result<Checkpoint> {
        let local = Path::new(name);
        let dir = if local.is_dir() {
            local.to_path_buf()
        } else if local.exists() {
            bail!("{name} is a file; give the checkpoint's folder");
        } else if name.starts_with(['/', '.', '~']) || name.matches('/').count() > 1 {
            bail!("no checkpoint folder {name}");
        } else {
            hub_snapshot(name.strip_prefix("hf://").unwrap_or(name))?
        };
        let config = ModelConfig::load(&dir.join("config.json"))?;
        let weights = weight_files(&dir)?;
        Ok(Checkpoint {
            dir,
            config,
            weights,
        })
    }

    /// Builds the model with `dtype` activations on `device`.
    pub fn load_transformer(&self, device: &Device, dtype: DType) -> Result<Transformer> {
        // SAFETY: the safetensors files are memory-mapped read-only; like every mmap user we rely
        // on nobody truncating a checkpoint while it is loaded.
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&self.weights, dtype, device) }
            .with_context(|| format!("cannot map the weights of {}", self.dir.display()))?;
        Transformer::new(&self.config, vb)
            .with_context(|| format!("{} does not match its config.json", self.dir.display()))
    }

    /// Every file that defines this checkpoint, as it is read: `config.json`, the
    /// [`SIDE_FILES`] it has, the shard index and the weights (not READMEs, licences, or files
    /// the loader never reads).
    pub fn defining_files(&self) -> Vec<PathBuf> {
        let mut files = vec![self.dir.join("config.json")];
        let index = self.dir.join("model.safetensors.index.json");
        let side = SIDE_FILES.iter().map(|f| self.dir.join(f));
        files.extend(side.chain([index]).filter(|p| p.is_file()));
        files.extend(self.weights.iter().cloned());
        files
    }

    /// The content digest of [`Self::defining_files`] (memoised, see [`crate::digest`]).
    pub fn digest(&self) -> Result<crate::digest::FilesDigest> {
        crate::digest::files_digest(&self.dir.display().to_string(), &self.defining_files())
    }

    /// Checks, without reading tensor data, what would make loading fail: every weight file
    /// whole (its header's tensors fit in the file), every tensor the config needs present with
    /// as many values as the config implies (a config.json from another model size fails
    /// here), and `tokenizer.json` parsed. For preflight: a run it passes loads this model.
    pub fn verify(&self) -> Result<()> {
        let mut have: std::collections::HashMap<String, (Vec<usize>, PathBuf)> =
            std::collections::HashMap::new();
        for f in &self.weights {
            for (name, shape) in safetensors_shapes(f)? {
                have.insert(name, (shape, f.clone()));
            }
        }
        for (name, shape, _) in init::weight_shapes(&self.config) {
            let want: usize = shape.iter().product();
            match have.get(&name) {
                None => bail!(
                    "{}: no tensor `{name}`, which its config.json ({} layers, hidden_size {}) \
                     needs",
                    self.dir.display(),
                    self.config.num_layers(),
                    self.config.hidden_size
                ),
                Some((got, file)) if got.iter().product::<usize>() != want => bail!(
                    "{}: `{name}` is {got:?}, but config.json implies {shape:?} (hidden_size \
                     {}, vocab_size {}): the weights and config.json are of different models",
                    file.display(),
                    self.config.hidden_size,
                    self.config.vocab_size
                ),
                _ => {}
            }
        }
        self.tokenizer()?;
        Ok(())
    }

    pub fn tokenizer(&self) -> Result<TextTokenizer> {
        TextTokenizer::from_file(&self.dir.join("tokenizer.json"))
    }

    pub fn chat_template(&self) -> Result<ChatTemplate> {
        ChatTemplate::from_dir(&self.dir)
    }

    /// End-of-sequence ids: `generation_config.json`'s `eos_token_id` (an id or a list), else
    /// `config.json`'s.
    pub fn eos_token_ids(&self) -> Result<Vec<u32>> {
        for file in ["generation_config.json", "config.json"] {
            let p = self.dir.join(file);
            let Ok(text) = std::fs::read_to_string(&p) else {
                continue;
            };
            let v: Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", p.display()))?;
            match v.get("eos_token_id") {
                Some(Value::Number(n)) => return Ok(vec![id(n)?]),
                Some(Value::Array(a)) => {
                    return a
                        .iter()
                        .map(|x| {
                            x.as_u64()
                                .map(|n| n as u32)
                                .context("eos_token_id: not an id")
                        })
                        .collect()
                }
                _ => continue,
            }
        }
        Ok(Vec::new())
    }
}

fn id(n: &serde_json::Number) -> Result<u32> {
    n.as_u64()
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| anyhow!("eos_token_id {n} is not a token id"))
}

/// `model.safetensors`, or the shards named by `model.safetensors.index.json`.
/// Every tensor's name and shape in a safetensors file, from its header alone; an error naming
/// the file when the header is not one or the file is shorter than the tensors it describes.
pub fn safetensors_shapes(path: &Path) -> Result<Vec<(String, Vec<usize>)>> {
    use std::io::Read;
    let mut f =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let len = f.metadata()?.len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n).map_err(|_| {
        anyhow!(
            "{}: not a safetensors file (shorter than 8 bytes)",
            path.display()
        )
    })?;
    let n = u64::from_le_bytes(n);
    if n > 100 << 20 || 8 + n > len {
        bail!(
            "{}: not a safetensors file, or truncated (header of {n} bytes)",
            path.display()
        );
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header)?;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&header)
        .with_context(|| format!("{}: the safetensors header is not JSON", path.display()))?;
    let mut out = Vec::new();
    let mut end = 0u64;
    for (name, t) in header.iter().filter(|(k, _)| *k != "__metadata__") {
        let shape = t
            .get("shape")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_u64)
                    .map(|x| x as usize)
                    .collect()
            })
            .with_context(|| format!("{}: `{name}` has no shape", path.display()))?;
        if let Some(e) = t
            .get("data_offsets")
            .and_then(Value::as_array)
            .and_then(|o| o.get(1))
            .and_then(Value::as_u64)
        {
            end = end.max(e);
        }
        out.push((name.clone(), shape));
    }
    if 8 + n + end > len {
        bail!(
            "{}: truncated: its header describes {} of tensor data, the file holds {}",
            path.display(),
            crate::bytes::format_bytes(end),
            crate::bytes::format_bytes(len - 8 - n)
        );
    }
    Ok(out)
}

pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).with_context(|| {
        format!(
            "{} has neither model.safetensors nor model.safetensors.index.json",
            dir.display()
        )
    })?;
    let v: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", index.display()))?;
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .with_context(|| format!("{}: no weight_map", index.display()))?;
    let mut files: Vec<String> = map
        .values()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    files.sort();
    files.dedup();
    let paths: Vec<PathBuf> = files.iter().map(|f| dir.join(f)).collect();
    if let Some(missing) = paths.iter().find(|p| !p.exists()) {
        bail!(
            "{} names {}, which is missing",
            index.display(),
            missing.display()
        );
    }
    Ok(paths)
}

/// Downloads (or finds in the cache) the files of a hub model and returns its snapshot folder.
fn hub_snapshot(id: &str) -> Result<PathBuf> {
    use hf_hub::api::sync::ApiBuilder;
    let how = format!(
        "no local folder `{id}` and the hub cannot be reached: on a machine with internet run \
         `hf download {id} --local-dir DIR` and pass --model DIR"
    );
    let cache = hf_hub::Cache::from_env();
    let cached = cache.model(id.to_string());
    let offline = std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| v == "1");
    let get = |file: &str| -> Result<PathBuf> {
        if let Some(p) = cached.get(file) {
            return Ok(p);
        }
        if offline {
            bail!("{file} of {id} is not in the cache and HF_HUB_OFFLINE=1: {how}");
        }
        let api = ApiBuilder::from_env()
            .build()
            .map_err(|e| anyhow!("cannot start the hub client ({e}): {how}"))?;
        api.model(id.to_string())
            .get(file)
            .map_err(|e| anyhow!("cannot download {file} of {id} ({e}): {how}"))
    };
    let config = get("config.json")?;
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        get(f)?;
    }
    for f in ["generation_config.json", "chat_template.jinja"] {
        let _ = get(f); // optional files
    }
    let dir = config
        .parent()
        .context("a cached file has a folder")?
        .to_path_buf();
    if get("model.safetensors").is_err() {
        let index = get("model.safetensors.index.json")?;
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&index)?)?;
        if let Some(map) = v.get("weight_map").and_then(Value::as_object) {
            let mut shards: Vec<&str> = map.values().filter_map(Value::as_str).collect();
            shards.sort();
            shards.dedup();
            for s in shards {
                get(s)?;
            }
        }
    }
    Ok(dir)
}

/// The candle device of `spec` (a CUDA device needs a binary built with `--features cuda`).
pub fn open_device(spec: DeviceSpec) -> anyhow::Result<Device> {
    match spec.ordinal() {
        None => Ok(Device::Cpu),
        Some(n) => cuda_device(n),
    }
}

#[cfg(feature = "cuda")]
fn cuda_device(n: usize) -> anyhow::Result<Device> {
    Ok(crate::cuda::sampler_device(n)?)
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(_: usize) -> anyhow::Result<Device> {
    anyhow::bail!("this binary was built without the cuda feature (cargo build --features cuda)")
}
