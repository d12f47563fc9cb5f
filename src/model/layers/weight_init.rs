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
    /// A zero-centred RMS norm weight (Qwen3.5): stored as `w`, it scales by `1 + w`; starts at
    /// zero, a scale of one. What a weight's change is measured against differs (see
    /// [`Init::scale_offset`]).
    ZeroCentred,
}

impl Init {
    /// The value the weight starts at.
    pub fn value(&self) -> Option<f32> {
        match self {
            Init::Normal => None,
            Init::Const(c) => Some(*c),
            Init::ZeroCentred => Some(0.0),
        }
    }

    /// What the model adds to the stored weight before using it: 1 for a zero-centred norm,
    /// else 0.
    pub fn scale_offset(&self) -> f32 {
        match self {
            Init::ZeroCentred => 1.0,
            _ => 0.0,
        }
    }
}

/// The initial value of an RMS norm's weight: a scale of one.
pub fn norm_init(cfg: &ModelConfig) -> Init {
    if cfg.norm_offset {
        Init::ZeroCentred
    } else {
        Init::Const(1.0)
    }
}
