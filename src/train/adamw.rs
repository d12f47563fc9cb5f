//! AdamW over f32 variables, as `torch.optim.AdamW` computes it (decoupled weight decay applied
//! before the moment update, bias-corrected step), with gradient clipping by global norm as
//! `torch.nn.utils.clip_grad_norm_`.
//!
//! Master weights and moments are f32 by default. With bf16 state they are rounded to bf16
//! after every update, to nearest or stochastically (seeded by run seed, step and tensor, so a
//! resumed run rounds the same way). Each step reports what the diagnostics need: the gradient
//! norm, the update/parameter RMS ratio and the share of weights whose *stored* value (in the
//! model's dtype) changed, which is what catches updates lost below the dtype's quantum.
//!
//! Knows nothing of models or data: it sees named variables and gradients in the same order.

use candle_core::{DType, Result, Tensor, Var};

use super::data::SplitMix;

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

/// How master weights and moments are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateRounding {
    /// f32, no rounding.
    F32,
    /// bf16, round to nearest even.
    Bf16Nearest,
    /// bf16, stochastic rounding seeded by this.
    Bf16Stochastic { seed: u64 },
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
    rounding: StateRounding,
    /// The dtype the model is stored in: "changed" is judged there.
    stored: DType,
    /// Steps taken.
    pub step: u64,
}

/// What a step did, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    /// Global gradient L2 norm before clipping.
    pub grad_norm: f64,
    /// RMS of the applied update over RMS of the parameters (all tensors together).
    pub update_ratio: f64,
    /// Share of weights whose value in the stored dtype changed in this step.
    pub changed_share: f64,
}

impl AdamW {
    /// `params` in a stable order; `decay(name)` says which get weight decay.
    pub fn new(
        params: Vec<(String, Var)>,
        cfg: AdamWConfig,
        decay: impl Fn(&str) -> bool,
    ) -> Result<AdamW> {
        AdamW::with_state(params, cfg, decay, StateRounding::F32, DType::F32)
    }

    /// [`AdamW::new`] with the state's storage and the model's stored dtype.
    pub fn with_state(
        params: Vec<(String, Var)>,
        cfg: AdamWConfig,
        decay: impl Fn(&str) -> bool,
        rounding: StateRounding,
        stored: DType,
    ) -> Result<AdamW> {
        let state_dtype = match rounding {
            StateRounding::F32 => DType::F32,
            _ => DType::BF16,
        };
        let slots = params
            .into_iter()
            .map(|(name, var)| {
                Ok(Slot {
                    decay: decay(&name),
                    m: var.zeros_like()?.to_dtype(state_dtype)?,
                    v: var.zeros_like()?.to_dtype(state_dtype)?,
                    name,
                    var,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let opt = AdamW {
            cfg,
            slots,
            rounding,
            stored,
            step: 0,
        };
        if rounding != StateRounding::F32 {
            // the master weights start on the bf16 grid
            for i in 0..opt.slots.len() {
                let p = opt.round(opt.slots[i].var.as_tensor(), i, 0)?;
                opt.slots[i].var.set(&p)?;
            }
        }
        Ok(opt)
    }

    /// Global L2 norm of `grads` (f64 sum of per-tensor squares).
    pub fn grad_norm(grads: &[Tensor]) -> Result<f64> {
        let mut sq = 0f64;
        for g in grads {
            sq += f64::from(g.sqr()?.sum_all()?.to_scalar::<f32>()?);
        }
        Ok(sq.sqrt())
    }

    /// Clips to `max_norm` (if given) and applies one AdamW update at learning rate `lr`.
    /// `grads` are in the order of the parameters given to [`AdamW::new`].
    pub fn step(&mut self, grads: &[Tensor], lr: f64, max_norm: Option<f64>) -> Result<StepStats> {
        if grads.len() != self.slots.len() {
            candle_core::bail!(
                "{} gradients for {} parameters",
                grads.len(),
                self.slots.len()
            );
        }
        let grad_norm = AdamW::grad_norm(grads)?;
        // torch: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1, always multiplied
        let clip = max_norm.map_or(1.0, |m| (m / (grad_norm + 1e-6)).min(1.0));
        self.step += 1;
        let t = self.step as i32;
        let (b1, b2) = (self.cfg.beta1, self.cfg.beta2);
        let bias1 = 1.0 - b1.powi(t);
        let bias2_sqrt = (1.0 - b2.powi(t)).sqrt();
        let (mut upd_sq, mut par_sq, mut changed, mut total) = (0f64, 0f64, 0f64, 0usize);
        for (i, grad) in grads.iter().enumerate() {
            let g = if max_norm.is_some() {
                (grad * clip)?
            } else {
                grad.clone()
            };
            let s = &self.slots[i];
            let old = s.var.as_tensor().clone();
            let mut p = old.clone();
            if s.decay && self.cfg.weight_decay != 0.0 {
                p = (p * (1.0 - lr * self.cfg.weight_decay))?;
            }
            let m = ((s.m.to_dtype(DType::F32)? * b1)? + (&g * (1.0 - b1))?)?;
            let v = ((s.v.to_dtype(DType::F32)? * b2)? + (g.sqr()? * (1.0 - b2))?)?;
            let denom = ((v.sqrt()? / bias2_sqrt)? + self.cfg.eps)?;
            let update = (m.broadcast_div(&denom)? * (lr / bias1))?;
            let new = self.round(&(p - update)?, i, 0)?;
            let m = self.round(&m, i, 1)?;
            let v = self.round(&v, i, 2)?;
            let state_dtype = self.slots[i].m.dtype();
            let s = &mut self.slots[i];
            s.m = m.to_dtype(state_dtype)?;
            s.v = v.to_dtype(state_dtype)?;
            let diff = (&new - &old)?;
            upd_sq += f64::from(diff.sqr()?.sum_all()?.to_scalar::<f32>()?);
            par_sq += f64::from(old.sqr()?.sum_all()?.to_scalar::<f32>()?);
            let ne = new
                .to_dtype(self.stored)?
                .ne(&old.to_dtype(self.stored)?)?
                .to_dtype(DType::F32)?
                .sum_all()?
                .to_scalar::<f32>()?;
            changed += f64::from(ne);
            total += old.elem_count();
            s.var.set(&new)?;
        }
        Ok(StepStats {
            grad_norm,
            update_ratio: (upd_sq / par_sq.max(1e-30)).sqrt(),
            changed_share: changed / total.max(1) as f64,
        })
    }

    /// `x` (f32) on the state's grid: unchanged for f32 state, else bf16 values (as f32).
    /// `which` separates the weights (0) and the two moments (1, 2) in the rounding stream.
    fn round(&self, x: &Tensor, slot: usize, which: u64) -> Result<Tensor> {
        match self.rounding {
            StateRounding::F32 => Ok(x.clone()),
            StateRounding::Bf16Nearest => x.to_dtype(DType::BF16)?.to_dtype(DType::F32),
            StateRounding::Bf16Stochastic { seed } => {
                let mut rng = SplitMix(
                    seed ^ self.step.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                        ^ ((slot as u64) << 20)
                        ^ (which << 60),
                );
                let vals = x.flatten_all()?.to_vec1::<f32>()?;
                let mut out = Vec::with_capacity(vals.len());
                let mut bits = 0u64;
                for (j, v) in vals.into_iter().enumerate() {
                    if j % 4 == 0 {
                        bits = rng.next_u64();
                    }
                    let r = ((bits >> ((j % 4) * 16)) & 0xFFFF) as u32;
                    out.push(stochastic_bf16(v, r));
                }
                Tensor::from_vec(out, x.shape(), x.device())
            }
        }
    }

    /// The moments by parameter name (`exp_avg.NAME`, `exp_avg_sq.NAME`), for checkpoints.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        self.slots
            .iter()
            .flat_map(|s| {
                [
                    (format!("exp_avg.{}", s.name), s.m.clone()),
                    (format!("exp_avg_sq.{}", s.name), s.v.clone()),
                ]
            })
            .collect()
    }

    /// Restores what [`AdamW::state_tensors`] saved, and the step count.
    pub fn load_state(
        &mut self,
        state: &std::collections::HashMap<String, Tensor>,
        step: u64,
    ) -> Result<()> {
        for s in &mut self.slots {
            for (key, slot) in [("exp_avg", &mut s.m), ("exp_avg_sq", &mut s.v)] {
                let name = format!("{key}.{}", s.name);
                let t = state.get(&name).ok_or_else(|| {
                    candle_core::Error::Msg(format!("optimizer state has no {name}"))
                })?;
                if t.shape() != slot.shape() {
                    candle_core::bail!("optimizer state {name}: shape {:?}", t.shape());
                }
                *slot = t.to_dtype(slot.dtype())?;
            }
        }
        self.step = step;
        Ok(())
    }
}

/// Rounds `v` to bf16 by adding 16 random bits below the kept mantissa and truncating: the
/// result is one of the two neighbouring bf16 values, the nearer one more often, unbiased.
pub fn stochastic_bf16(v: f32, r: u32) -> f32 {
    if !v.is_finite() {
        return v;
    }
    let b = v.to_bits();
    let rounded = b.wrapping_add(r & 0xFFFF) & 0xFFFF_0000;
    let out = f32::from_bits(rounded);
    if out.is_finite() {
        out
    } else {
        f32::from_bits(b & 0xFFFF_0000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stochastic_rounding_is_unbiased_and_stays_on_the_grid() {
        let x = 1.0f32 + 1.0 / 1024.0; // a quarter of a bf16 quantum (1/128) above 1
        let mut rng = SplitMix(3);
        let n = 100_000;
        let mut sum = 0f64;
        for _ in 0..n {
            let r = stochastic_bf16(x, (rng.next_u64() & 0xFFFF) as u32);
            assert!(r == 1.0 || r == 1.0 + 1.0 / 128.0, "{r}");
            sum += f64::from(r);
        }
        let mean = sum / n as f64;
        assert!((mean - f64::from(x)).abs() < 2e-5, "mean {mean} vs {x}");
        assert_eq!(stochastic_bf16(-2.5, 0xFFFF), -2.5);
    }

    /// The failure this module exists to catch: with bf16 round-to-nearest state, a small update
    /// is lost every step and the weights never change; stochastic rounding keeps it on average.
    #[test]
    fn bf16_nearest_state_loses_small_updates_and_the_stats_say_so() {
        let dev = candle_core::Device::Cpu;
        let run = |rounding| {
            let var = Var::from_tensor(&Tensor::ones(4096, DType::F32, &dev).unwrap()).unwrap();
            let cfg = AdamWConfig {
                weight_decay: 0.0,
                ..AdamWConfig::default()
            };
            let mut opt = AdamW::with_state(
                vec![("w".into(), var.clone())],
                cfg,
                |_| false,
                rounding,
                DType::BF16,
            )
            .unwrap();
            let g = Tensor::ones(4096, DType::F32, &dev).unwrap();
            let mut last = None;
            for _ in 0..20 {
                last = Some(opt.step(std::slice::from_ref(&g), 1e-3, None).unwrap());
            }
            let mean = var
                .as_tensor()
                .mean_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            (last.unwrap(), mean)
        };
        let (stats, mean) = run(StateRounding::Bf16Nearest);
        assert_eq!(mean, 1.0, "lr 1e-3 is below half the bf16 quantum at 1.0");
        assert_eq!(stats.changed_share, 0.0);
        let (stats, mean) = run(StateRounding::Bf16Stochastic { seed: 1 });
        assert!((mean - 0.98).abs() < 2e-3, "20 steps of 1e-3: {mean}");
        assert!(stats.changed_share > 0.05, "{}", stats.changed_share);
        let (_, mean) = run(StateRounding::F32);
        assert!((mean - 0.98).abs() < 1e-4, "{mean}");
    }
}
