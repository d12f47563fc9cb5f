//! Full fine-tuning in candle: the trainable model, the completion-only loss and AdamW.
//!
//! This first layer is what the rest of the trainer (packing, schedules, checkpoints, the
//! `train` stage) builds on, checked against PyTorch on the tiny fixture: every parameter's
//! gradient, and 8 AdamW steps. Knows nothing of Parquet, stages or the sampler.

pub mod adamw;
pub mod loss;

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Var};
use candle_nn::{VarBuilder, VarMap};

use crate::model::{Checkpoint, Transformer};

/// A model whose every weight is a [`Var`] (f32 master weights), named as in the checkpoint.
pub struct Trainable {
    pub model: Transformer,
    pub varmap: VarMap,
}

impl Trainable {
    /// Loads `ck` with every tensor as an f32 variable (bf16/f16 checkpoints are upcast: these
    /// are the master weights). Fails if a tensor the model needs is missing, or if the
    /// checkpoint has tensors the model does not use (they would silently not train).
    pub fn load(ck: &Checkpoint, device: &Device) -> Result<Trainable> {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, device);
        let model = Transformer::new(&ck.config, vb)
            .with_context(|| format!("{} does not match its config.json", ck.dir.display()))?;
        // SAFETY: read-only maps of the checkpoint files (see Checkpoint::load_transformer).
        let st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&ck.weights) }
            .with_context(|| format!("cannot map the weights of {}", ck.dir.display()))?;
        let vars = varmap
            .data()
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?;
        for (name, var) in vars.iter() {
            let t = st
                .load(name, device)
                .with_context(|| format!("{}: no tensor {name}", ck.dir.display()))?;
            var.set(&t.to_dtype(DType::F32)?)
                .with_context(|| format!("{}: tensor {name}", ck.dir.display()))?;
        }
        let unused: Vec<String> = st
            .tensors()
            .into_iter()
            .map(|(n, _)| n)
            .filter(|n| {
                let tied_head = n == "lm_head.weight" && ck.config.tie_word_embeddings;
                !(vars.contains_key(n) || tied_head)
            })
            .collect();
        if !unused.is_empty() {
            bail!(
                "{}: tensors the model does not use (they would not train): {}",
                ck.dir.display(),
                unused.join(", ")
            );
        }
        drop(vars);
        Ok(Trainable { model, varmap })
    }

    /// The variables by checkpoint name, sorted by name (a stable order for the optimizer).
    pub fn named_vars(&self) -> Vec<(String, Var)> {
        let data = self.varmap.data().lock().expect("varmap lock");
        let mut v: Vec<(String, Var)> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// The current values by name.
    pub fn tensors(&self) -> HashMap<String, candle_core::Tensor> {
        self.named_vars()
            .into_iter()
            .map(|(k, v)| (k, v.as_tensor().clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests;
