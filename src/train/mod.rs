//! Full fine-tuning in candle: the trainable model, the completion-only loss and AdamW.
//!
//! This first layer is what the rest of the trainer (packing, schedules, checkpoints, the
//! `train` stage) builds on, checked against PyTorch on the tiny fixture: every parameter's
//! gradient, and 8 AdamW steps. Knows nothing of Parquet, stages or the sampler.

pub mod adamw;
pub mod checkpoint;
pub mod data;
pub mod grads;
pub mod loss;
pub mod memory;
pub mod schedule;
pub mod settings;
pub mod trainer;

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};

use crate::model::{Checkpoint, ModelConfig, Transformer};

/// Tunes glibc's allocator for training: blocks up to 256 MiB come from the heap and freed
/// memory is kept for reuse. Every candle op allocates its output, and glibc would otherwise
/// map the big ones fresh each time and pay a page fault per 4 KiB to zero them (a fifth of a
/// CPU step's time, measured). Memory stays at the step's peak instead of dropping between ops.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

/// A model whose every weight is a [`Var`] in the compute dtype (the working copy the forward
/// and backward passes use), with the f32 master weights the optimizer updates, named as in the
/// checkpoint. Computing in f32, the master weights are the model's own variables.
pub struct Trainable {
    pub model: Transformer,
    pub varmap: VarMap,
    /// Every variable by checkpoint name, sorted: the optimizer's and the gradients' order.
    vars: Vec<(String, Var)>,
    /// The f32 master weights in the same order (the same variables when computing in f32).
    masters: Vec<(String, Var)>,
    /// Index in `vars` of the LM head's weight (the embedding when tied).
    head: usize,
    /// The checkpoint's tensors the text model does not use, which an export copies as they
    /// are (see [`ModelConfig::carried_prefixes`]); not loaded, not trained.
    pub carried: Vec<String>,
}

impl Trainable {
    /// Loads `ck` with every tensor as an f32 variable (bf16/f16 checkpoints are upcast: these
    /// are the master weights). Fails if a tensor the model needs is missing, or if the
    /// checkpoint has tensors the model does not use (they would silently not train).
    pub fn load(ck: &Checkpoint, device: &Device) -> Result<Trainable> {
        Trainable::load_as(ck, device, DType::F32)
    }

    /// [`Trainable::load`] computing in `compute` (below f32: a working copy beside the f32
    /// master weights, both on `device`).
    pub fn load_as(ck: &Checkpoint, device: &Device, compute: DType) -> Result<Trainable> {
        // SAFETY: read-only maps of the checkpoint files (see Checkpoint::load_transformer).
        let st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&ck.weights) }
            .with_context(|| format!("cannot map the weights of {}", ck.dir.display()))?;
        let names: Vec<String> = st.tensors().into_iter().map(|(n, _)| n).collect();
        let origin = ck.dir.display().to_string();
        Trainable::build(&ck.config, device, compute, &origin, &names, |name| {
            Ok(st.load(name, device)?)
        })
    }

    /// [`Trainable::load`] from tensors in memory (benchmarks, tests).
    pub fn from_tensors(
        cfg: &ModelConfig,
        tensors: &HashMap<String, Tensor>,
        device: &Device,
        compute: DType,
    ) -> Result<Trainable> {
        let names: Vec<String> = tensors.keys().cloned().collect();
        Trainable::build(cfg, device, compute, "in-memory weights", &names, |name| {
            Ok(tensors[name].to_device(device)?)
        })
    }

    /// Creates the variables from `cfg` in `compute`, fills each master with `get(name)` upcast
    /// to f32 and each working copy with it in `compute`, and refuses tensors among `names` that
    /// the model does not use.
    fn build(
        cfg: &ModelConfig,
        device: &Device,
        compute: DType,
        origin: &str,
        names: &[String],
        get: impl Fn(&str) -> Result<Tensor>,
    ) -> Result<Trainable> {
        if !matches!(compute, DType::F32 | DType::BF16 | DType::F16) {
            bail!("compute dtype {compute:?}: the trainer computes in f32, bf16 or f16");
        }
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, compute, device);
        let model = Transformer::new(cfg, vb)
            .with_context(|| format!("{origin} does not match its config.json"))?;
        let vars = varmap
            .data()
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?;
        let mut masters = HashMap::new();
        for (name, var) in vars.iter() {
            if !names.contains(name) {
                bail!("{origin}: no tensor {name}");
            }
            let t = get(name).with_context(|| format!("{origin}: tensor {name}"))?;
            let master = if compute == DType::F32 {
                var.clone()
            } else {
                Var::from_tensor(&t.to_dtype(DType::F32)?)?
            };
            var.set(&t.to_dtype(compute)?)
                .with_context(|| format!("{origin}: tensor {name}"))?;
            masters.insert(name.clone(), master);
        }
        let carried: Vec<String> = names
            .iter()
            .filter(|n| cfg.carried_prefixes().iter().any(|p| n.starts_with(p)))
            .cloned()
            .collect();
        let unused: Vec<&str> = names
            .iter()
            .filter(|n| {
                let tied_head = *n == "lm_head.weight" && cfg.tie_word_embeddings;
                !(vars.contains_key(*n) || tied_head || carried.contains(n))
            })
            .map(String::as_str)
            .collect();
        if !unused.is_empty() {
            bail!(
                "{origin}: tensors the model does not use (they would not train): {}",
                unused.join(", ")
            );
        }
        let mut sorted: Vec<(String, Var)> =
            vars.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        drop(vars);
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        let masters = sorted
            .iter()
            .map(|(n, _)| (n.clone(), masters[n].clone()))
            .collect();
        let head_id = model.lm_head_weight().id();
        let head = sorted
            .iter()
            .position(|(_, v)| v.as_tensor().id() == head_id)
            .context("the LM head's weight is not a variable")?;
        Ok(Trainable {
            model,
            varmap,
            vars: sorted,
            masters,
            head,
            carried,
        })
    }

    /// The model's variables (the working copy, in the compute dtype) by checkpoint name, sorted
    /// by name (a stable order for the gradients and the optimizer).
    pub fn named_vars(&self) -> &[(String, Var)] {
        &self.vars
    }

    /// The f32 master weights, in [`Trainable::named_vars`]' order.
    pub fn masters(&self) -> &[(String, Var)] {
        &self.masters
    }

    /// The dtype the model computes in.
    pub fn compute_dtype(&self) -> DType {
        self.vars.first().map_or(DType::F32, |(_, v)| v.dtype())
    }

    /// Where the model lives.
    pub fn device(&self) -> &Device {
        self.model.device()
    }

    /// Copies the master weights into the working copy (after a restore; the optimizer does it
    /// after each step).
    pub fn refresh_working(&self) -> Result<()> {
        for ((_, w), (_, m)) in self.vars.iter().zip(&self.masters) {
            if w.as_tensor().id() != m.as_tensor().id() {
                w.set(&m.as_tensor().to_dtype(w.dtype())?)?;
            }
        }
        Ok(())
    }

    /// Parameters in all.
    pub fn num_params(&self) -> usize {
        self.vars.iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// The master weights' current values by name.
    pub fn tensors(&self) -> HashMap<String, candle_core::Tensor> {
        self.masters()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests;
