//! The training memory budget, printed before step 1 and checked by `pipeline preflight`:
//! weights, gradients, optimizer state, activations at `max_seq_len` with and without recompute,
//! and the logits with and without the chunked loss.
//!
//! Activations are counted from what the differentiable forward keeps per token and layer
//! (norm intermediates, projections, RoPE, attention scores and probabilities, the SwiGLU
//! intermediates), in the compute dtype. Knows nothing of devices.

use super::settings::{OptimizerState, TrainSettings};
use crate::model::{LayerKind, ModelConfig};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub weights: u64,
    pub grads: u64,
    pub optimizer: u64,
    pub activations: u64,
    pub activations_recompute: u64,
    pub logits: u64,
    pub logits_chunked: u64,
}

impl Budget {
    /// What the configured run holds at its peak.
    pub fn total(&self, s: &TrainSettings) -> u64 {
        let act = if s.recompute {
            self.activations_recompute
        } else {
            self.activations
        };
        let logits = if s.loss_chunk_tokens > 0 {
            self.logits_chunked
        } else {
            self.logits
        };
        // the step's gradient sums, plus one micro-batch's fresh gradients while they are added
        self.weights + 2 * self.grads + self.optimizer + act + logits
    }

    pub fn lines(&self, s: &TrainSettings) -> Vec<String> {
        use crate::bytes::format_bytes as f;
        let mark = |on: bool| if on { "  <- this run" } else { "" };
        let chunked = s.loss_chunk_tokens > 0;
        vec![
            format!("  weights (f32 master)          {}", f(self.weights)),
            format!("  gradients (sum + micro-batch) {}", f(2 * self.grads)),
            format!("  optimizer state (m, v)        {}", f(self.optimizer)),
            format!(
                "  activations                   {}{}",
                f(self.activations),
                mark(!s.recompute)
            ),
            format!(
                "  activations with recompute    {}{}",
                f(self.activations_recompute),
                mark(s.recompute)
            ),
            format!(
                "  logits, all at once           {}{}",
                f(self.logits),
                mark(!chunked)
            ),
            format!(
                "  logits, chunked               {}{}",
                f(self.logits_chunked),
                mark(chunked)
            ),
            format!("  total                         {}", f(self.total(s))),
        ]
    }
}

/// The budget of training `cfg` (with `params` parameters) under `s`, computing in f32.
pub fn budget(cfg: &ModelConfig, params: u64, s: &TrainSettings) -> Budget {
    let f = 4u64; // bytes per computed value (CPU computes in f32)
    let tokens = s.micro_batch_tokens as u64;
    let seq = s.max_seq_len as u64;
    let (h, i) = (cfg.hidden_size as u64, cfg.intermediate_size as u64);
    let (hq, hkv, d) = (
        cfg.num_heads as u64,
        cfg.num_kv_heads as u64,
        cfg.head_dim as u64,
    );
    let v = cfg.vocab_size as u64;
    // Values the differentiable forward keeps per token in a layer of `kind`: two RMS norms
    // (3h each), o_proj and residuals (4h), SwiGLU (4i), and the mixer's own; plus 25% for what
    // the allocator holds beyond that (measured by `pipeline bench train`).
    let per_token_layer = |kind: LayerKind| {
        let mixer = match kind {
            // q/k/v, their norms (3 each) and RoPE (4 each), the attention's head-major copies,
            // GQA expansion, output and its transpose (6 hq d), scores / scaled / masked /
            // shifted / exp / probabilities and the backward's temporaries over the row
            // (8 hq seq)
            LayerKind::Attention => {
                let gate = if cfg.attention_gate { 3 * hq * d } else { 0 };
                (hq + 2 * hkv) * d + 7 * (hq + hkv) * d + 6 * hq * d + 8 * hq * seq + gate
            }
            // Gated DeltaNet (an estimate, not yet measured): the projections, conv and SiLU
            // (4 conv_dim), the heads' normalised, repeated and chunked copies (6 Hv (dk + dv)),
            // the chunk's decay, L and T matrices and the substitution's rows (4 Hv C), the
            // gated norm (6 value_dim)
            LayerKind::GatedDeltaNet => cfg.linear.map_or(0, |l| {
                let (nv, dk, dv) = (
                    l.num_value_heads as u64,
                    l.key_head_dim as u64,
                    l.value_head_dim as u64,
                );
                let c = crate::model::layers::gated_deltanet::CHUNK as u64;
                4 * l.conv_dim() as u64 + 6 * nv * (dk + dv) + 4 * nv * c + 6 * l.value_dim() as u64
            }),
        };
        (10 * h + 4 * i + mixer) * 125 / 100
    };
    let layer_bytes = |kind| per_token_layer(kind) * tokens * f;
    let all_layers: u64 = cfg.layer_kinds.iter().map(|k| layer_bytes(*k)).sum();
    let largest_layer = cfg
        .layer_kinds
        .iter()
        .map(|k| layer_bytes(*k))
        .max()
        .unwrap_or(0);
    let layers = cfg.num_layers() as u64;
    let state = match s.optimizer_state {
        OptimizerState::F32 => 8,
        OptimizerState::Bf16 => 4,
    };
    let chunk = if s.loss_chunk_tokens == 0 {
        tokens
    } else {
        (s.loss_chunk_tokens as u64).min(tokens)
    };
    // The head over `rows` positions: through candle ops, logits, exp and probabilities /
    // gradient, three (rows, vocab) values; on the CPU's packed gemm, the logits (the gradient
    // overwrites them) and the head weight packed twice. Whichever is more.
    let head = |rows: u64| (3 * rows * v).max(rows * v + 2 * v * h) * f;
    Budget {
        weights: params * 4,
        grads: params * 4,
        optimizer: params * state,
        activations: all_layers + 2 * h * tokens * f,
        activations_recompute: (layers + 1) * h * tokens * f + largest_layer,
        logits: head(tokens),
        logits_chunked: head(chunk),
    }
}

/// Disk a run writes: the export in `dtype_bytes`, and `keep` checkpoints of master weights and
/// moments.
pub fn disk_bytes(params: u64, dtype_bytes: u64, s: &TrainSettings) -> u64 {
    let state = match s.optimizer_state {
        OptimizerState::F32 => 8,
        OptimizerState::Bf16 => 4,
    };
    params * dtype_bytes + (s.keep_checkpoints as u64 + 1) * params * (4 + state)
}
