//! Learning-rate schedules: linear warmup, then constant, linear or cosine decay to a floor.
//!
//! A pure function of the step, so a resumed run needs only the step number. Knows nothing of
//! the optimizer.

use super::settings::LrSchedule;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    pub kind: LrSchedule,
    pub lr: f64,
    pub warmup_steps: u64,
    pub min_lr_ratio: f64,
    pub total_steps: u64,
}

impl Schedule {
    /// The rate of optimizer step `step` (0-based): `lr * (step + 1) / warmup_steps` during
    /// warmup (never 0, so no step is wasted), then the decay over the remaining steps, reaching
    /// the floor `lr * min_lr_ratio` at the step after the last.
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let floor = self.min_lr_ratio;
        let span = self.total_steps.saturating_sub(self.warmup_steps).max(1);
        let p = ((step - self.warmup_steps) as f64 / span as f64).min(1.0);
        let f = match self.kind {
            LrSchedule::Constant => 1.0,
            LrSchedule::Linear => floor + (1.0 - floor) * (1.0 - p),
            LrSchedule::Cosine => {
                floor + (1.0 - floor) * 0.5 * (1.0 + (std::f64::consts::PI * p).cos())
            }
        };
        self.lr * f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_decay_to_the_floor() {
        let s = Schedule {
            kind: LrSchedule::Cosine,
            lr: 1.0,
            warmup_steps: 4,
            min_lr_ratio: 0.1,
            total_steps: 14,
        };
        let lrs: Vec<f64> = (0..15).map(|i| s.lr(i)).collect();
        assert_eq!(&lrs[..4], &[0.25, 0.5, 0.75, 1.0]);
        assert_eq!(lrs[4], 1.0);
        assert!((lrs[9] - 0.55).abs() < 1e-12, "half way: {}", lrs[9]);
        assert!(lrs[4..].windows(2).all(|w| w[1] < w[0]));
        assert!((lrs[14] - 0.1).abs() < 1e-12);
        let lin = Schedule {
            kind: LrSchedule::Linear,
            ..s
        };
        assert!((lin.lr(9) - 0.55).abs() < 1e-12);
        let c = Schedule {
            kind: LrSchedule::Constant,
            ..s
        };
        assert_eq!(c.lr(13), 1.0);
    }
}
