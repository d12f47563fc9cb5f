//! The `[train]` settings: every knob of a fine-tuning run, with defaults and range checks.
//!
//! The same struct is a config's `[train]` section, the file `pipeline train --config` reads,
//! and the flags of `pipeline train` (same names, same defaults); unknown keys are errors. Knows
//! nothing of models or data.

use serde::{Deserialize, Serialize};

/// How the learning rate moves over the run (after warmup).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum LrSchedule {
    Constant,
    Linear,
    Cosine,
}

/// Storage of the master weights and AdamW moments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerState {
    /// fp32 master weights and moments (16 bytes per parameter with the gradient): the default.
    F32,
    /// bf16 master weights and moments. Updates below half a bf16 quantum are lost with
    /// round-to-nearest: allowed only with `stochastic_rounding = true` or `allow_lossy_state`.
    Bf16,
}

impl OptimizerState {
    /// Bytes per parameter of the two AdamW moments.
    pub fn moment_bytes(self) -> u64 {
        match self {
            OptimizerState::F32 => 8,
            OptimizerState::Bf16 => 4,
        }
    }
}

/// The dtype the model is stored and exported in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum TrainDtype {
    /// The checkpoint's own dtype (`torch_dtype` / `dtype` of config.json).
    Auto,
    Float32,
    Bfloat16,
    Float16,
}

/// The dtype the forward and backward passes compute in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ComputeDtype {
    /// bf16 on a GPU, f32 on the CPU.
    Auto,
    F32,
    /// A bf16 working copy of the fp32 master weights; the loss's log-sum-exp, the gradient sums
    /// and AdamW stay f32.
    Bf16,
}

/// Which implementation of the differentiable ops runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum TrainOps {
    /// Our CPU ops with hand-written backward passes for f32 on the CPU; elementary candle ops
    /// (and the query-blocked attention) on other devices and dtypes.
    Auto,
    /// The device-generic ops everywhere, the CPU too: what a GPU runs, so that it can be checked
    /// on a machine without one.
    Generic,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct TrainSettings {
    /// The base model for the `train` stage of `pipeline run` (default: `[sample].model`).
    /// `pipeline train` takes `--model` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(skip)]
    pub model: Option<String>,
    #[serde(default = "d_lr")]
    #[arg(long, default_value_t = d_lr())]
    pub lr: f64,
    #[serde(default = "d_betas")]
    #[arg(long, value_parser = parse_betas, default_value = "0.9,0.95")]
    pub betas: [f64; 2],
    #[serde(default = "d_eps")]
    #[arg(long, default_value_t = d_eps())]
    pub eps: f64,
    #[serde(default)]
    #[arg(long, default_value_t = Default::default())]
    pub weight_decay: f64,
    /// Tensors whose name contains one of these get no weight decay (default: norms and biases).
    #[serde(default = "d_no_decay")]
    #[arg(long, value_delimiter = ',', default_values_t = d_no_decay())]
    pub no_decay: Vec<String>,
    /// Clip the global gradient norm to this; 0 = off.
    #[serde(default = "d_clip")]
    #[arg(long, default_value_t = d_clip())]
    pub clip_grad_norm: f64,
    #[serde(default = "d_schedule")]
    #[arg(long, value_enum, default_value_t = d_schedule())]
    pub lr_schedule: LrSchedule,
    #[serde(default)]
    #[arg(long, default_value_t = Default::default())]
    pub warmup_steps: u64,
    /// The schedule decays to `lr * min_lr_ratio`.
    #[serde(default)]
    #[arg(long, default_value_t = Default::default())]
    pub min_lr_ratio: f64,
    #[serde(default = "d_epochs")]
    #[arg(long, default_value_t = d_epochs())]
    pub epochs: u64,
    /// Stop after this many optimizer steps (the schedule spans them); default: all epochs.
    #[serde(default)]
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// Rows per optimizer step (set this or `tokens_per_step`).
    #[serde(default)]
    #[arg(long)]
    pub rows_per_step: Option<usize>,
    /// Tokens (prompt + completion) per optimizer step: rows are added while they fit.
    #[serde(default)]
    #[arg(long)]
    pub tokens_per_step: Option<usize>,
    /// Tokens per forward/backward pass; a step accumulates gradients over its micro-batches.
    #[serde(default = "d_micro")]
    #[arg(long, default_value_t = d_micro())]
    pub micro_batch_tokens: usize,
    /// Longer rows are cut to this (completion tokens dropped from the end) and counted.
    #[serde(default = "d_max_seq")]
    #[arg(long, default_value_t = d_max_seq())]
    pub max_seq_len: usize,
    /// Pack several rows into one micro-batch (attention stays inside each row).
    #[serde(default = "d_true")]
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub packing: bool,
    #[serde(default = "d_true")]
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub shuffle: bool,
    #[serde(default)]
    #[arg(long, default_value_t = Default::default())]
    pub seed: u64,
    #[serde(default = "d_dtype")]
    #[arg(long, value_enum, default_value_t = d_dtype())]
    pub dtype: TrainDtype,
    /// Where the model trains: `cpu`, `cuda` or `cuda:N`.
    #[serde(default)]
    #[arg(long, default_value_t = Default::default())]
    pub device: crate::device::DeviceSpec,
    /// The forward and backward passes' dtype (the master weights and AdamW are f32 either way).
    #[serde(default = "d_compute")]
    #[arg(long, value_enum, default_value_t = d_compute())]
    pub compute_dtype: ComputeDtype,
    /// The ops' implementation: `auto`, or `generic` for the device-generic path everywhere.
    #[serde(default = "d_ops")]
    #[arg(long, value_enum, default_value_t = d_ops())]
    pub ops: TrainOps,
    #[serde(default = "d_state")]
    #[arg(long, value_enum, default_value_t = d_state())]
    pub optimizer_state: OptimizerState,
    /// Keep AdamW's moments in host memory (a GPU run whose device memory cannot hold them): each
    /// update moves them over in slices and back. Same numbers, PCIe time per step.
    #[serde(default)]
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub optimizer_offload: bool,
    /// With `optimizer_state = "bf16"`: round updates stochastically (unbiased, so small updates
    /// survive on average).
    #[serde(default)]
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub stochastic_rounding: bool,
    /// With `optimizer_state = "bf16"` and no stochastic rounding: run anyway (loud warning).
    #[serde(default)]
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub allow_lossy_state: bool,
    /// Recompute each layer's activations in the backward pass (memory for time).
    #[serde(default)]
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub recompute: bool,
    /// With recompute: how many of the last layers keep their activations instead of
    /// recomputing them (their backward runs in one pass, as without recompute). Unset: on a
    /// GPU, as many as the memory budget fits in 70% of the GPU's memory (and in what is free;
    /// the trainer says how many); on the CPU, none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub kept_layers: Option<usize>,
    /// Completion tokens per chunk of the LM head and loss; 0 = all at once.
    #[serde(default = "d_chunk")]
    #[arg(long, default_value_t = d_chunk())]
    pub loss_chunk_tokens: usize,
    /// Write a full checkpoint every N steps (and at the end); 0 = only at the end.
    #[serde(default = "d_ckpt")]
    #[arg(long, default_value_t = d_ckpt())]
    pub checkpoint_every: u64,
    /// Checkpoints kept on disk (the newest ones).
    #[serde(default = "d_keep")]
    #[arg(long, default_value_t = d_keep())]
    pub keep_checkpoints: usize,
    /// Warn when the share of weights whose stored value changed stays below this ...
    #[serde(default = "d_stall_share")]
    #[arg(long, default_value_t = d_stall_share())]
    pub stall_share: f64,
    /// ... for this many consecutive steps.
    #[serde(default = "d_stall_steps")]
    #[arg(long, default_value_t = d_stall_steps())]
    pub stall_steps: u64,
    /// The device's peak FLOP/s for MFU; default: the GPU's dense bf16 (or f32) peak from a table
    /// of known GPUs, or the CPU's matmul rate in the compute dtype, measured at start.
    #[serde(default)]
    #[arg(long)]
    pub peak_tflops: Option<f64>,
}

fn d_lr() -> f64 {
    1e-5
}
fn d_betas() -> [f64; 2] {
    [0.9, 0.95]
}
fn d_eps() -> f64 {
    1e-8
}
fn d_no_decay() -> Vec<String> {
    vec!["norm".into(), "bias".into()]
}
fn d_clip() -> f64 {
    1.0
}
fn d_schedule() -> LrSchedule {
    LrSchedule::Cosine
}
fn d_epochs() -> u64 {
    1
}
fn d_micro() -> usize {
    4096
}
fn d_max_seq() -> usize {
    4096
}
fn d_true() -> bool {
    true
}
fn d_dtype() -> TrainDtype {
    TrainDtype::Auto
}
fn d_compute() -> ComputeDtype {
    ComputeDtype::Auto
}
fn d_ops() -> TrainOps {
    TrainOps::Auto
}
fn d_state() -> OptimizerState {
    OptimizerState::F32
}
fn d_chunk() -> usize {
    1024
}
fn d_ckpt() -> u64 {
    100
}
fn d_keep() -> usize {
    2
}
fn d_stall_share() -> f64 {
    1e-4
}
fn d_stall_steps() -> u64 {
    10
}

/// `--betas B1,B2`.
fn parse_betas(s: &str) -> Result<[f64; 2], String> {
    let v: Vec<f64> = s
        .split(',')
        .map(|b| b.trim().parse::<f64>().map_err(|e| format!("`{b}`: {e}")))
        .collect::<Result<_, _>>()?;
    <[f64; 2]>::try_from(v).map_err(|v| format!("two numbers, B1,B2 (got {})", v.len()))
}

impl Default for TrainSettings {
    fn default() -> Self {
        toml::from_str("").expect("defaults parse")
    }
}

impl TrainSettings {
    /// Range checks; the error starts with the key's name.
    pub fn validate(&self) -> Result<(), String> {
        let pos = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(format!("{name} must be a positive number, not {v}"))
            }
        };
        pos("lr", self.lr)?;
        pos("eps", self.eps)?;
        for (i, b) in self.betas.iter().enumerate() {
            if !(0.0..1.0).contains(b) {
                return Err(format!("betas[{i}] must be in [0, 1), not {b}"));
            }
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            return Err(format!(
                "weight_decay must be >= 0, not {}",
                self.weight_decay
            ));
        }
        if !(self.clip_grad_norm >= 0.0 && self.clip_grad_norm.is_finite()) {
            return Err(format!(
                "clip_grad_norm must be >= 0 (0 = off), not {}",
                self.clip_grad_norm
            ));
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return Err(format!(
                "min_lr_ratio must be in [0, 1], not {}",
                self.min_lr_ratio
            ));
        }
        if self.epochs == 0 {
            return Err("epochs must be at least 1".into());
        }
        if self.kept_layers.is_some() && !self.recompute {
            return Err(
                "kept_layers needs recompute = true (without it every layer keeps its \
                 activations)"
                    .into(),
            );
        }
        if self.max_steps == Some(0) {
            return Err("max_steps must be at least 1".into());
        }
        match (self.rows_per_step, self.tokens_per_step) {
            (Some(_), Some(_)) => {
                return Err("rows_per_step and tokens_per_step: set one of them, not both".into())
            }
            (Some(0), _) => return Err("rows_per_step must be at least 1".into()),
            (_, Some(0)) => return Err("tokens_per_step must be at least 1".into()),
            _ => {}
        }
        if self.max_seq_len < 2 {
            return Err("max_seq_len must be at least 2".into());
        }
        if self.micro_batch_tokens < self.max_seq_len {
            return Err(format!(
                "micro_batch_tokens ({}) must be at least max_seq_len ({}): a row is never split \
                 across micro-batches",
                self.micro_batch_tokens, self.max_seq_len
            ));
        }
        if self.keep_checkpoints == 0 {
            return Err("keep_checkpoints must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.stall_share) {
            return Err(format!(
                "stall_share must be in [0, 1], not {}",
                self.stall_share
            ));
        }
        if let Some(p) = self.peak_tflops {
            pos("peak_tflops", p)?;
        }
        if self.optimizer_offload && !self.on_gpu() {
            return Err(
                "optimizer_offload moves the moments from a GPU to the host: the run is on the \
                 CPU already (remove it, or set device = \"cuda\")"
                    .into(),
            );
        }
        if self.optimizer_state == OptimizerState::Bf16
            && !self.stochastic_rounding
            && !self.allow_lossy_state
        {
            return Err(
                "optimizer_state = \"bf16\" with round-to-nearest loses every update \
                        smaller than half a bf16 quantum (the weights silently stop changing): \
                        set stochastic_rounding = true, or allow_lossy_state = true to run anyway"
                    .into(),
            );
        }
        Ok(())
    }

    /// Rows per step when neither is set.
    pub fn step_size(&self) -> StepSize {
        match (self.rows_per_step, self.tokens_per_step) {
            (_, Some(t)) => StepSize::Tokens(t),
            (Some(r), _) => StepSize::Rows(r),
            (None, None) => StepSize::Rows(32),
        }
    }

    /// Whether the run computes on a GPU.
    pub fn on_gpu(&self) -> bool {
        self.device.is_cuda()
    }

    /// The compute dtype `auto` resolves to: bf16 on a GPU, f32 on the CPU.
    pub fn compute(&self) -> candle_core::DType {
        match (self.compute_dtype, self.on_gpu()) {
            (ComputeDtype::F32, _) | (ComputeDtype::Auto, false) => candle_core::DType::F32,
            (ComputeDtype::Bf16, _) | (ComputeDtype::Auto, true) => candle_core::DType::BF16,
        }
    }

    /// Whether a tensor gets weight decay.
    pub fn decays(&self, name: &str) -> bool {
        !self.no_decay.iter().any(|p| name.contains(p.as_str()))
    }
}

/// What an optimizer step gathers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepSize {
    Rows(usize),
    Tokens(usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_values_name_their_key() {
        let s = TrainSettings::default();
        s.validate().unwrap();
        assert_eq!(s.step_size(), StepSize::Rows(32));
        assert!(s.decays("model.layers.0.mlp.up_proj.weight"));
        assert!(!s.decays("model.layers.0.input_layernorm.weight"));
        let bad: TrainSettings = toml::from_str("lr = -1.0").unwrap();
        assert!(bad.validate().unwrap_err().starts_with("lr "));
        let bad: TrainSettings = toml::from_str("optimizer_state = \"bf16\"").unwrap();
        assert!(bad.validate().unwrap_err().contains("stochastic_rounding"));
        let ok: TrainSettings =
            toml::from_str("optimizer_state = \"bf16\"\nstochastic_rounding = true").unwrap();
        ok.validate().unwrap();
        let bad: TrainSettings = toml::from_str("rows_per_step = 2\ntokens_per_step = 9").unwrap();
        assert!(bad.validate().is_err());
        let bad: TrainSettings =
            toml::from_str("max_seq_len = 4096\nmicro_batch_tokens = 100").unwrap();
        assert!(bad
            .validate()
            .unwrap_err()
            .starts_with("micro_batch_tokens"));
        assert!(toml::from_str::<TrainSettings>("learning_rate = 1e-5").is_err());
        let bad = toml::from_str::<TrainSettings>("device = \"gpu\"").unwrap_err();
        assert!(
            bad.message()
                .contains("must be cpu, cuda or cuda:N, got `gpu`"),
            "{bad}"
        );
        assert!(toml::from_str::<TrainSettings>("compute_dtype = \"fp8\"").is_err());
        let gpu: TrainSettings = toml::from_str("device = \"cuda:1\"").unwrap();
        gpu.validate().unwrap();
        assert_eq!(gpu.compute(), candle_core::DType::BF16);
        assert_eq!(s.compute(), candle_core::DType::F32);
    }

    /// `pipelines/reference.toml` documents every key, and its commented example parses.
    #[test]
    fn the_reference_config_documents_every_train_key() {
        let text = include_str!("../../pipelines/reference.toml");
        let block: String = text
            .lines()
            .skip_while(|l| *l != "# [train]")
            .skip(1)
            .take_while(|l| l.starts_with("# "))
            .map(|l| format!("{}\n", &l[2..]))
            .collect();
        let table: toml::Table = toml::from_str(&block).unwrap();
        let parsed: TrainSettings = toml::from_str(&block).unwrap();
        assert_eq!(parsed.model.as_deref(), Some("Qwen/Qwen3-4B"));
        let all = TrainSettings {
            model: Some(String::new()),
            max_steps: Some(1),
            rows_per_step: Some(1),
            tokens_per_step: Some(1),
            peak_tflops: Some(1.0),
            kept_layers: Some(1),
            ..TrainSettings::default()
        };
        let json = serde_json::to_value(&all).unwrap();
        for key in json.as_object().unwrap().keys() {
            let documented = table.contains_key(key) || block.contains(&format!("{key} = "));
            assert!(documented, "reference.toml does not document train.{key}");
        }
    }
}
