//! A layer weight's initial value ([`Init`]), shared by the mixers' weight lists and the random
//! initialiser (`model::init`).
//!
//! Knows nothing of layers' shapes: each layer kind lists its own weights.

use crate::model::config::ModelConfig;

/// A weight's initial value (see `model::init`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Normal(0, the init's standard deviation).
    Normal,
    Const(f32),
}

/// The initial value of an RMS norm's weight: a scale of one.
pub fn norm_init(cfg: &ModelConfig) -> Init {
    Init::Const(if cfg.norm_offset { 0.0 } else { 1.0 })
}
