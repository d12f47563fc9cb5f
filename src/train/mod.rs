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

/// A model whose every weight is a [`Var`] (f32 master weights), named as in the checkpoint.
pub struct Trainable {
    pub model: Transformer,
    pub varmap: VarMap,
    /// Every variable by checkpoint name, sorted: the optimizer's and the gradients' order.
    vars: Vec<(String, Var)>,
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
        // SAFETY: read-only maps of the checkpoint files (see Checkpoint::load_transformer).
        let st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&ck.weights) }
            .with_context(|| format!("cannot map the weights of {}", ck.dir.display()))?;
        let names: Vec<String> = st.tensors().into_iter().map(|(n, _)| n).collect();
        let origin = ck.dir.display().to_string();
        Trainable::build(&ck.config, device, &origin, &names, |name| {
            Ok(st.load(name, device)?)
        })
    }

    /// [`Trainable::load`] from tensors in memory (benchmarks, tests).
    pub fn from_tensors(
        cfg: &ModelConfig,
        tensors: &HashMap<String, Tensor>,
        device: &Device,
    ) -> Result<Trainable> {
        let names: Vec<String> = tensors.keys().cloned().collect();
        Trainable::build(cfg, device, "in-memory weights", &names, |name| {
            Ok(tensors[name].to_device(device)?)
        })
    }

    /// Creates the variables from `cfg`, fills each with `get(name)` upcast to f32, and refuses
    /// tensors among `names` that the model does not use.
    fn build(
        cfg: &ModelConfig,
        device: &Device,
        origin: &str,
        names: &[String],
        get: impl Fn(&str) -> Result<Tensor>,
    ) -> Result<Trainable> {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, device);
        let model = Transformer::new(cfg, vb)
            .with_context(|| format!("{origin} does not match its config.json"))?;
        let vars = varmap
            .data()
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?;
        for (name, var) in vars.iter() {
            if !names.contains(name) {
                bail!("{origin}: no tensor {name}");
            }
            let t = get(name).with_context(|| format!("{origin}: tensor {name}"))?;
            var.set(&t.to_dtype(DType::F32)?)
                .with_context(|| format!("{origin}: tensor {name}"))?;
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
        let head_id = model.lm_head_weight().id();
        let head = sorted
            .iter()
            .position(|(_, v)| v.as_tensor().id() == head_id)
            .context("the LM head's weight is not a variable")?;
        Ok(Trainable {
            model,
            varmap,
            vars: sorted,
            head,
            carried,
        })
    }

    /// The variables by checkpoint name, sorted by name (a stable order for the optimizer).
    pub fn named_vars(&self) -> &[(String, Var)] {
        &self.vars
    }

    /// Parameters in all.
    pub fn num_params(&self) -> usize {
        self.vars.iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// The current values by name.
    pub fn tensors(&self) -> HashMap<String, candle_core::Tensor> {
        self.named_vars()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests;
