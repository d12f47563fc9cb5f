//! AdamW over f32 variables, as `torch.optim.AdamW` computes it (decoupled weight decay applied
//! before the moment update, bias-corrected step), with gradient clipping by global norm as
//! `torch.nn.utils.clip_grad_norm_`.
//!
//! Knows nothing of models or data: it sees named variables and a gradient store.

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        }
    }
}

/// One parameter: the variable, its moments, whether weight decay applies.
struct Slot {
    name: String,
    var: Var,
    m: Tensor,
    v: Tensor,
    decay: bool,
}

pub struct AdamW {
    cfg: AdamWConfig,
    slots: Vec<Slot>,
    /// Steps taken.
    pub step: u64,
}

/// What a step did, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    /// Global gradient L2 norm before clipping.
    pub grad_norm: f64,
}

impl AdamW {
    /// `params` in a stable order; `decay(name)` says which get weight decay.
    pub fn new(
        params: Vec<(String, Var)>,
        cfg: AdamWConfig,
        decay: impl Fn(&str) -> bool,
    ) -> Result<AdamW> {
        let slots = params
            .into_iter()
            .map(|(name, var)| {
                Ok(Slot {
                    decay: decay(&name),
                    m: var.zeros_like()?,
                    v: var.zeros_like()?,
                    name,
                    var,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(AdamW {
            cfg,
            slots,
            step: 0,
        })
    }

    /// Global L2 norm of the gradients (f64 sum of per-tensor squares); a parameter without a
    /// gradient is an error (it would silently not train).
    pub fn grad_norm(&self, grads: &GradStore) -> Result<f64> {
        let mut sq = 0f64;
        for s in &self.slots {
            let g = grads
                .get(s.var.as_tensor())
                .ok_or_else(|| candle_core::Error::Msg(format!("no gradient for {}", s.name)))?;
            sq += f64::from(g.sqr()?.sum_all()?.to_scalar::<f32>()?);
        }
        Ok(sq.sqrt())
    }

    /// Clips to `max_norm` (if given) and applies one AdamW update at learning rate `lr`.
    pub fn step(&mut self, grads: &GradStore, lr: f64, max_norm: Option<f64>) -> Result<StepStats> {
        let grad_norm = self.grad_norm(grads)?;
        // torch: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1, always multiplied
        let clip = max_norm.map_or(1.0, |m| (m / (grad_norm + 1e-6)).min(1.0));
        self.step += 1;
        let t = self.step as i32;
        let (b1, b2) = (self.cfg.beta1, self.cfg.beta2);
        let bias1 = 1.0 - b1.powi(t);
        let bias2_sqrt = (1.0 - b2.powi(t)).sqrt();
        for s in &mut self.slots {
            let g = grads
                .get(s.var.as_tensor())
                .ok_or_else(|| candle_core::Error::Msg(format!("no gradient for {}", s.name)))?;
            let g = if max_norm.is_some() {
                (g * clip)?
            } else {
                g.clone()
            };
            let mut p = s.var.as_tensor().clone();
            if s.decay && self.cfg.weight_decay != 0.0 {
                p = (p * (1.0 - lr * self.cfg.weight_decay))?;
            }
            s.m = ((&s.m * b1)? + (&g * (1.0 - b1))?)?;
            s.v = ((&s.v * b2)? + (g.sqr()? * (1.0 - b2))?)?;
            let denom = ((s.v.sqrt()? / bias2_sqrt)? + self.cfg.eps)?;
            let update = (s.m.broadcast_div(&denom)? * (lr / bias1))?;
            s.var.set(&(p - update)?)?;
        }
        Ok(StepStats { grad_norm })
    }
}
