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
//! With a working copy (training in bf16), the variables here are the f32 master weights and
//! each update ends by writing the new master, rounded, into the model's bf16 variable.
//!
//! On f32 CPU data the update runs as three parallel passes in place; elsewhere (a GPU, or the
//! device-generic path on the CPU) it runs as candle ops over slices of at most [`SLICE`]
//! elements written back in place, so that its temporaries stay small next to the largest
//! tensor (Qwen3-4B's embedding is 1.6 GB in f32). The maths is written once ([`Step`]'s
//! methods, over f32 values and over tensors alike), so both give the same bits.
//!
//! Knows nothing of models or data: it sees named variables and gradients in the same order.

use candle_core::{CpuStorage, DType, InplaceOp2, InplaceOp3, Layout, Result, Tensor, Var};

use super::data::SplitMix;
use crate::model::cost::Cost;
use crate::model::cpu_op::{host_view, slice, slice_mut};
use crate::model::ops::{read_back, sum_all_wide, sum_all_wide_cost};

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

/// One parameter: the (master) variable, its moments, whether weight decay applies, and the
/// model's working copy when it computes in another dtype.
struct Slot {
    name: String,
    var: Var,
    m: Tensor,
    v: Tensor,
    decay: bool,
    working: Option<Var>,
}

pub struct AdamW {
    cfg: AdamWConfig,
    slots: Vec<Slot>,
    rounding: StateRounding,
    /// The dtype the model is stored in: "changed" is judged there.
    stored: DType,
    /// f32 CPU data may take the in-place host passes (off: candle ops everywhere).
    host: bool,
    /// Steps taken.
    pub step: u64,
    /// Parameters the last step updated by the fused GPU kernel (`kernels/adamw.cu`).
    pub last_fused: usize,
}

/// Elements per slice of the candle-op update: a multiple of 4 (the stochastic rounding draws
/// 64 random bits per 4 values) small enough that the update's temporaries stay a few hundred
/// MB.
pub const SLICE: usize = 1 << 24;

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
                    m: Tensor::zeros(var.shape(), state_dtype, var.device())?,
                    v: Tensor::zeros(var.shape(), state_dtype, var.device())?,
                    name,
                    var,
                    working: None,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let opt = AdamW {
            cfg,
            slots,
            rounding,
            stored,
            host: true,
            step: 0,
            last_fused: 0,
        };
        if rounding != StateRounding::F32 {
            // the master weights start on the bf16 grid
            for i in 0..opt.slots.len() {
                let p = opt.round(opt.slots[i].var.as_tensor(), i, 0, 0)?;
                opt.slots[i].var.set(&p)?;
            }
        }
        Ok(opt)
    }

    /// The model's working copies, in the parameters' order: after each update, the new master
    /// weight in the copy's dtype is written into any that is not the master itself.
    pub fn set_working(&mut self, working: &[(String, Var)]) -> Result<()> {
        if working.len() != self.slots.len() {
            candle_core::bail!(
                "{} working copies for {} parameters",
                working.len(),
                self.slots.len()
            )
        }
        for (s, (name, w)) in self.slots.iter_mut().zip(working) {
            if *name != s.name || w.shape() != s.var.shape() {
                candle_core::bail!("working copy {name} does not match parameter {}", s.name)
            }
            s.working = (w.as_tensor().id() != s.var.as_tensor().id()).then(|| w.clone());
        }
        Ok(())
    }

    /// Off: candle ops on every device (the device-generic path): no in-place host passes on
    /// the CPU, no fused update kernel on a GPU.
    pub fn set_host(&mut self, on: bool) {
        self.host = on;
    }

    /// Keeps the moments in host memory (on: moved there now) while the weights stay on their
    /// device: each update brings a slice of them over and takes it back. For a GPU whose memory
    /// does not hold the moments beside everything else; on the CPU it changes nothing.
    pub fn set_offload(&mut self, on: bool) -> Result<()> {
        for s in &mut self.slots {
            let dev = if on {
                candle_core::Device::Cpu
            } else {
                s.var.device().clone()
            };
            s.m = s.m.to_device(&dev)?;
            s.v = s.v.to_device(&dev)?;
        }
        Ok(())
    }

    /// Global L2 norm of `grads` (f64 sum of per-tensor squares).
    pub fn grad_norm(grads: &[Tensor]) -> Result<f64> {
        norm(grads, true)
    }

    /// [`AdamW::grad_norm`] as this optimizer computes it (on the host passes or candle ops).
    pub fn norm_of(&self, grads: &[Tensor]) -> Result<f64> {
        norm(grads, self.host)
    }

    /// Clips to `max_norm` (if given) and applies one AdamW update at learning rate `lr`.
    /// `grads` are in the order of the parameters given to [`AdamW::new`].
    pub fn step(&mut self, grads: &[Tensor], lr: f64, max_norm: Option<f64>) -> Result<StepStats> {
        let grad_norm = self.norm_of(grads)?;
        crate::model::clock::mark(None, "grad_norm");
        let stats = self.step_with_norm(grads, grad_norm, lr, max_norm)?;
        crate::model::clock::mark(None, "update");
        Ok(stats)
    }

    /// [`AdamW::step`] with the gradients' global norm already computed by
    /// [`AdamW::norm_of`] (the trainer checks it before the update: one pass, not two).
    pub fn step_with_norm(
        &mut self,
        grads: &[Tensor],
        grad_norm: f64,
        lr: f64,
        max_norm: Option<f64>,
    ) -> Result<StepStats> {
        if grads.len() != self.slots.len() {
            candle_core::bail!(
                "{} gradients for {} parameters",
                grads.len(),
                self.slots.len()
            );
        }
        // torch: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1, always multiplied
        let clip = max_norm.map_or(1.0, |m| (m / (grad_norm + 1e-6)).min(1.0));
        self.step += 1;
        let t = self.step as i32;
        let (b1, b2) = (self.cfg.beta1, self.cfg.beta2);
        let bias1 = 1.0 - b1.powi(t);
        let bias2_sqrt = (1.0 - b2.powi(t)).sqrt();
        let total: usize = grads.iter().map(|g| g.elem_count()).sum();
        // each parameter's statistics, in order: the host's, or the device sums of its slices
        // (read back together once the update is issued: one wait for the device per step)
        let mut parts: Vec<Part<HostStats, Vec<Tensor>>> = Vec::with_capacity(grads.len());
        self.last_fused = 0;
        let host = Step {
            clip: max_norm.map(|_| clip as f32),
            b1: b1 as f32,
            one_b1: (1.0 - b1) as f32,
            b2: b2 as f32,
            one_b2: (1.0 - b2) as f32,
            inv_bias2_sqrt: (1.0 / bias2_sqrt) as f32,
            eps: self.cfg.eps as f32,
            step_size: (lr / bias1) as f32,
            decay_mul: None,
        };
        for (i, grad) in grads.iter().enumerate() {
            let s = &mut self.slots[i];
            let host = Step {
                decay_mul: (s.decay && self.cfg.weight_decay != 0.0)
                    .then_some((1.0 - lr * self.cfg.weight_decay) as f32),
                ..host
            };
            if self.rounding == StateRounding::F32 && self.host {
                if let Some(stats) = host.apply(s, grad, self.stored)? {
                    if let Some(w) = &s.working {
                        w.set(&s.var.as_tensor().to_dtype(w.dtype())?)?;
                    }
                    parts.push(Part::Host(stats));
                    continue;
                }
            }
            if self.host {
                if let Some(sums) = self.update_fused(i, grad, &host)? {
                    self.last_fused += 1;
                    parts.push(Part::Device(vec![sums]));
                    continue;
                }
            }
            parts.push(Part::Device(self.update_slices(i, grad, &host)?));
        }
        let device: Vec<Tensor> = parts
            .iter()
            .filter_map(|p| match p {
                Part::Device(sums) => Some(sums),
                Part::Host(_) => None,
            })
            .flatten()
            .cloned()
            .collect();
        let mut read = read_back(&device)?.into_iter().map(f64::from);
        let (mut upd_sq, mut par_sq, mut changed) = (0f64, 0f64, 0f64);
        for p in parts {
            match p {
                Part::Host(stats) => {
                    upd_sq += stats.upd_sq;
                    par_sq += stats.par_sq;
                    changed += stats.changed as f64;
                }
                Part::Device(sums) => {
                    // the parameter's own sums first (its slices', or its blocks' partial
                    // sums), then into the step's: the same f64 additions in order
                    let mut stats = HostStats::default();
                    let values: usize = sums.iter().map(Tensor::elem_count).sum();
                    for _ in 0..values / 3 {
                        let mut next = || read.next().unwrap_or(0.0);
                        stats.upd_sq += next();
                        stats.par_sq += next();
                        stats.changed += next() as f32 as usize;
                    }
                    upd_sq += stats.upd_sq;
                    par_sq += stats.par_sq;
                    changed += stats.changed as f64;
                }
            }
        }
        Ok(StepStats {
            grad_norm,
            update_ratio: (upd_sq / par_sq.max(1e-30)).sqrt(),
            changed_share: changed / total.max(1) as f64,
        })
    }

    /// One parameter's update on a GPU as one kernel (`kernels/adamw.cu`), where it takes it:
    /// f32 state (no rounding) on the weights' device, f32 weights and gradient, a bf16
    /// working copy or none. "The weights' device" is the same candle device (so the same
    /// stream), not another handle on the same GPU, whose stream would not be ordered with it. Returns the kernel's partial sums of the statistics (blocks x 3,
    /// on the device, in the order of [`Self::update_slices`]'s triples); `None` where it does
    /// not take the parameter (then the candle ops do). The same bits as the host passes.
    fn update_fused(&self, i: usize, grad: &Tensor, st: &Step) -> Result<Option<Tensor>> {
        let s = &self.slots[i];
        let p = s.var.as_tensor();
        let on_gpu = p.device().is_cuda()
            && s.m.device().same_device(p.device())
            && grad.device().same_device(p.device());
        let f32s = [p, &s.m, &s.v, grad]
            .iter()
            .all(|t| t.dtype() == DType::F32 && t.is_contiguous());
        let work_ok = s.working.as_ref().is_none_or(|w| {
            w.dtype() == DType::BF16
                && w.as_tensor().is_contiguous()
                && w.device().same_device(p.device())
        });
        let stored_ok = matches!(self.stored, DType::F32 | DType::BF16 | DType::F16);
        if self.rounding != StateRounding::F32
            || !on_gpu
            || !f32s
            || !work_ok
            || !stored_ok
            || grad.elem_count() != p.elem_count()
        {
            return Ok(None);
        }
        #[cfg(feature = "cuda")]
        {
            let k = crate::cuda::adamw::AdamStep {
                clip: st.clip,
                decay_mul: st.decay_mul,
                b1: st.b1,
                one_b1: st.one_b1,
                b2: st.b2,
                one_b2: st.one_b2,
                inv_bias2_sqrt: st.inv_bias2_sqrt,
                eps: st.eps,
                step_size: st.step_size,
                stored: self.stored,
            };
            let work = s.working.as_ref().map(|w| w.as_tensor());
            crate::cuda::adamw::update(p, &s.m, &s.v, grad, work, &k).map(Some)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = st;
            candle_core::bail!("a CUDA tensor in a build without the cuda feature")
        }
    }

    /// What [`Self::update_fused`] issues for a parameter of any size (the grid strides over
    /// it): the partial sums' zeroed buffer, the kernel, and their copy into the step's
    /// read-back.
    pub fn fused_update_cost() -> Cost {
        Cost::kernels(1) + Cost::in_place(2)
    }

    /// One parameter's update by candle ops (any device), slice by slice of [`SLICE`] elements
    /// of the flattened tensors, each written back in place (the master, the moments, the
    /// working copy). `clip`: the gradient's multiplier when clipping is on. Returns each
    /// slice's statistics as three sums on the device (the update's squares, the old weights'
    /// squares, the values that changed), for the step to read back with every other
    /// parameter's. What it issues is [`Self::update_cost`], declared beside it.
    fn update_slices(&self, i: usize, grad: &Tensor, st: &Step) -> Result<Vec<Tensor>> {
        let s = &self.slots[i];
        let n = s.var.elem_count();
        if grad.elem_count() != n {
            candle_core::bail!("{}: {} gradient values for {n}", s.name, grad.elem_count())
        }
        let (var, m_all, v_all) = (s.var.flatten_all()?, s.m.flatten_all()?, s.v.flatten_all()?);
        let working = s.working.as_ref().map(|w| w.flatten_all()).transpose()?;
        let state_dtype = s.m.dtype();
        let (dev, state_dev) = (s.var.device(), s.m.device());
        let grad = grad.to_dtype(DType::F32)?.flatten_all()?;
        let mut stats = Vec::new();
        let mut start = 0;
        while start < n {
            let len = SLICE.min(n - start);
            let g = st.grad(grad.narrow(0, start, len)?)?;
            let old = var.narrow(0, start, len)?;
            let m_old = m_all
                .narrow(0, start, len)?
                .to_device(dev)?
                .to_dtype(DType::F32)?;
            let v_old = v_all
                .narrow(0, start, len)?
                .to_device(dev)?
                .to_dtype(DType::F32)?;
            let m = st.first(&m_old, &g)?;
            let v = st.second(&v_old, &g)?;
            let new = self.round(&st.weight(&old, &m, &v)?, i, 0, start)?;
            let m = self.round(&m, i, 1, start)?;
            let v = self.round(&v, i, 2, start)?;
            let diff = (&new - &old)?;
            // detached: a sum kept for the read-back must not keep the slice's tensors alive
            // through the graph of the master weights
            stats.push(sum_all_wide(&diff.sqr()?)?.detach());
            stats.push(sum_all_wide(&old.sqr()?)?.detach());
            stats.push(
                sum_all_wide(
                    &new.to_dtype(self.stored)?
                        .ne(&old.to_dtype(self.stored)?)?
                        .to_dtype(DType::F32)?,
                )?
                .detach(),
            );
            drop(old);
            var.slice_set(&new, 0, start)?;
            m_all.slice_set(&m.to_dtype(state_dtype)?.to_device(state_dev)?, 0, start)?;
            v_all.slice_set(&v.to_dtype(state_dtype)?.to_device(state_dev)?, 0, start)?;
            if let Some(w) = &working {
                w.slice_set(&new.to_dtype(w.dtype())?, 0, start)?;
            }
            start += len;
        }
        Ok(stats)
    }

    /// What [`Self::update_slices`] issues for parameter `i` had it `numel` elements and a
    /// gradient in `grad_dtype` (the optimizer's cost at a model's real sizes, counted on a
    /// narrow one).
    pub fn update_cost(&self, i: usize, numel: usize, grad_dtype: DType, clip: bool) -> Cost {
        let mut spent = Cost::kernels(u64::from(grad_dtype != DType::F32));
        let mut start = 0;
        while start < numel {
            let len = SLICE.min(numel - start);
            spent += self.slice_cost(i, len, clip);
            start += len;
        }
        spent
    }

    /// What [`Self::update_slices`] issues for one slice of `len` elements of parameter `i`,
    /// line by line.
    fn slice_cost(&self, i: usize, len: usize, clip: bool) -> Cost {
        let s = &self.slots[i];
        let k = |on: bool| Cost::kernels(u64::from(on));
        let state_low = k(s.m.dtype() != DType::F32);
        let stored_low = k(self.stored != DType::F32);
        // a moment brought to the update's device and back (offloaded to the host)
        let (fetch, put_back) = if s.m.device().same_device(s.var.device()) {
            (Cost::default(), Cost::default())
        } else {
            (Cost::UPLOAD, Cost::DOWNLOAD)
        };
        let round = match self.rounding {
            StateRounding::F32 => Cost::default(),
            StateRounding::Bf16Nearest => Cost::kernels(2),
            StateRounding::Bf16Stochastic { .. } => Cost::DOWNLOAD + Cost::UPLOAD,
        };
        // each of the three sums is copied into the step's read-back (`ops::read_back`)
        let wide = sum_all_wide_cost(len) + Cost::in_place(1);
        // clip, decay; the moments fetched, to f32; m (3), v (4), the denominator (3), the
        // update (2), the new weight; each rounded; the statistics (three sums, kept on the
        // device); the weight and the moments written back, and the working copy
        let mut c = k(clip) + k(s.decay && self.cfg.weight_decay != 0.0);
        c += (fetch + state_low) * 2 + Cost::kernels(13) + round * 3;
        c += Cost::kernels(2) + wide;
        c += Cost::kernels(1) + wide;
        c += stored_low * 2 + Cost::kernels(2) + wide;
        c += Cost::in_place(1) + (state_low + put_back + Cost::in_place(1)) * 2;
        if let Some(w) = &s.working {
            c += k(w.dtype() != DType::F32) + Cost::in_place(1);
        }
        c
    }

    /// `x` (f32) on the state's grid: unchanged for f32 state, else bf16 values (as f32).
    /// `which` separates the weights (0) and the two moments (1, 2) in the rounding stream;
    /// `offset` (a multiple of 4) is where `x` starts in its tensor, so that a tensor rounded in
    /// slices draws the same bits as one rounded whole.
    fn round(&self, x: &Tensor, slot: usize, which: u64, offset: usize) -> Result<Tensor> {
        match self.rounding {
            StateRounding::F32 => Ok(x.clone()),
            StateRounding::Bf16Nearest => x.to_dtype(DType::BF16)?.to_dtype(DType::F32),
            StateRounding::Bf16Stochastic { seed } => {
                debug_assert_eq!(offset % 4, 0);
                let mut rng = SplitMix(
                    (seed
                        ^ self.step.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                        ^ ((slot as u64) << 20)
                        ^ (which << 60))
                        .wrapping_add((offset as u64 / 4).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
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

    /// Restores what [`AdamW::state_tensors`] saved, and the step count: `get(name)` gives a
    /// saved tensor (on any device: it is moved to the parameter's), one at a time.
    pub fn load_state(
        &mut self,
        mut get: impl FnMut(&str) -> Result<Option<Tensor>>,
        step: u64,
    ) -> Result<()> {
        for s in &mut self.slots {
            let dev = s.m.device().clone();
            for (key, slot) in [("exp_avg", &mut s.m), ("exp_avg_sq", &mut s.v)] {
                let name = format!("{key}.{}", s.name);
                let t = get(&name)?.ok_or_else(|| {
                    candle_core::Error::Msg(format!("optimizer state has no {name}"))
                })?;
                if t.shape() != slot.shape() {
                    candle_core::bail!("optimizer state {name}: shape {:?}", t.shape());
                }
                *slot = t.to_dtype(slot.dtype())?.to_device(&dev)?;
            }
        }
        self.step = step;
        Ok(())
    }
}

/// Global L2 norm of `grads`: f64 sums of f32 CPU data on the host (`host`), else per slice of
/// candle ops.
/// Its candle ops issue [`norm_cost`].
fn norm(grads: &[Tensor], host: bool) -> Result<f64> {
    // each gradient's sum of squares in order: the host's, or its slices' sums on the device
    // (read back together: one wait for the device)
    let mut parts: Vec<Part<f64, usize>> = Vec::with_capacity(grads.len());
    let mut device = Vec::new();
    for g in grads {
        let g = &g.contiguous()?;
        if host && g.device().is_cuda() && g.dtype() == DType::F32 {
            // a GPU's kernel: the partial sums of its blocks
            let partials = fused_sum_squares(g)?;
            parts.push(Part::Device(partials.elem_count()));
            device.push(partials);
            continue;
        }
        let view = host_view(g).filter(|_| host);
        match view {
            Some(view) => parts.push(Part::Host(
                chunked(view.get()?, |c| {
                    c.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>()
                })
                .into_iter()
                .sum::<f64>(),
            )),
            None => {
                let flat = g.flatten_all()?;
                let n = flat.elem_count();
                let mut start = 0;
                let mut slices = 0;
                while start < n {
                    let len = SLICE.min(n - start);
                    let part = flat.narrow(0, start, len)?.to_dtype(DType::F32)?;
                    device.push(sum_all_wide(&part.sqr()?)?.detach());
                    slices += 1;
                    start += len;
                }
                // one value a slice
                parts.push(Part::Device(slices));
            }
        };
    }
    let mut read = read_back(&device)?.into_iter().map(f64::from);
    let mut sq = 0f64;
    for p in parts {
        match p {
            Part::Host(s) => sq += s,
            Part::Device(values) => {
                for _ in 0..values {
                    sq += read.next().unwrap_or(0.0);
                }
            }
        }
    }
    Ok(sq.sqrt())
}

/// `crate::cuda::adamw::sum_squares` (a CUDA tensor exists only in a build with the feature).
fn fused_sum_squares(g: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    {
        crate::cuda::adamw::sum_squares(g)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = g;
        candle_core::bail!("a CUDA tensor in a build without the cuda feature")
    }
}

/// What [`AdamW::norm_of`] issues for one f32 gradient on a GPU: the partial sums' zeroed
/// buffer, the kernel, their copy into the read-back.
pub fn fused_norm_cost() -> Cost {
    Cost::kernels(1) + Cost::in_place(2)
}

/// A parameter's share of a sum: computed on the host, or still on the device (what is needed to
/// find it in the step's read-back).
enum Part<H, D> {
    Host(H),
    Device(D),
}

/// What [`norm`]'s candle ops issue for one slice of `len` elements in `dtype`: to f32, the
/// squares, their sum, copied into the read-back (`ops::READ_BACK`, once per norm).
fn norm_slice_cost(len: usize, dtype: DType) -> Cost {
    Cost::kernels(u64::from(dtype != DType::F32) + 1) + sum_all_wide_cost(len) + Cost::in_place(1)
}

/// What [`AdamW::norm_of`]'s candle ops issue for a gradient of `numel` elements in `dtype`.
pub fn norm_cost(numel: usize, dtype: DType) -> Cost {
    let mut spent = Cost::default();
    let mut start = 0;
    while start < numel {
        let len = SLICE.min(numel - start);
        spent += norm_slice_cost(len, dtype);
        start += len;
    }
    spent
}

/// Elements per parallel chunk of the host update.
const CHUNK: usize = 1 << 16;

/// `f` of each chunk of `xs`, on rayon's pool, in order (so that a sum over them does not
/// depend on how the pool split the work).
fn chunked<T: Send>(xs: &[f32], f: impl Fn(&[f32]) -> T + Sync + Send) -> Vec<T> {
    use rayon::prelude::*;
    xs.par_chunks(CHUNK).map(f).collect()
}

/// What AdamW's maths is written over, once ([`Step`]'s methods): f32 values (the host
/// passes) and f32 tensors (candle ops, any device). Both run the same IEEE f32 operations in
/// the same order, so both give the same bits.
trait Arith: Sized + Clone {
    type Error;
    /// `x * mul + add`, as candle's affine computes it in f32.
    fn affine(&self, mul: f32, add: f32) -> std::result::Result<Self, Self::Error>;
    fn plus(&self, o: &Self) -> std::result::Result<Self, Self::Error>;
    fn minus(&self, o: &Self) -> std::result::Result<Self, Self::Error>;
    fn over(&self, o: &Self) -> std::result::Result<Self, Self::Error>;
    fn square(&self) -> std::result::Result<Self, Self::Error>;
    fn root(&self) -> std::result::Result<Self, Self::Error>;
}

impl Arith for f32 {
    type Error = std::convert::Infallible;
    #[inline(always)]
    fn affine(&self, mul: f32, add: f32) -> std::result::Result<f32, Self::Error> {
        Ok(self * mul + add)
    }
    #[inline(always)]
    fn plus(&self, o: &f32) -> std::result::Result<f32, Self::Error> {
        Ok(self + o)
    }
    #[inline(always)]
    fn minus(&self, o: &f32) -> std::result::Result<f32, Self::Error> {
        Ok(self - o)
    }
    #[inline(always)]
    fn over(&self, o: &f32) -> std::result::Result<f32, Self::Error> {
        Ok(self / o)
    }
    #[inline(always)]
    fn square(&self) -> std::result::Result<f32, Self::Error> {
        Ok(self * self)
    }
    #[inline(always)]
    fn root(&self) -> std::result::Result<f32, Self::Error> {
        Ok(self.sqrt())
    }
}

impl Arith for Tensor {
    type Error = candle_core::Error;
    fn affine(&self, mul: f32, add: f32) -> Result<Tensor> {
        Tensor::affine(self, f64::from(mul), f64::from(add))
    }
    fn plus(&self, o: &Tensor) -> Result<Tensor> {
        self + o
    }
    fn minus(&self, o: &Tensor) -> Result<Tensor> {
        self - o
    }
    fn over(&self, o: &Tensor) -> Result<Tensor> {
        self.broadcast_div(o)
    }
    fn square(&self) -> Result<Tensor> {
        self.sqr()
    }
    fn root(&self) -> Result<Tensor> {
        self.sqrt()
    }
}

/// One step's constants, as f32 (candle's `tensor * f64` multiplies by the f64 cast to f32 and
/// adds 0, `tensor / f64` multiplies by the reciprocal, `tensor + f64` adds it), and the maths of
/// the update over them, written once for both the host passes and the candle ops.
#[derive(Clone, Copy)]
struct Step {
    decay_mul: Option<f32>,
    clip: Option<f32>,
    b1: f32,
    one_b1: f32,
    b2: f32,
    one_b2: f32,
    inv_bias2_sqrt: f32,
    eps: f32,
    step_size: f32,
}

/// What [`Step::apply`] saw of one tensor.
#[derive(Default, Clone, Copy)]
struct HostStats {
    upd_sq: f64,
    par_sq: f64,
    changed: usize,
}

impl Step {
    /// The f32-state update of one parameter in three parallel passes, in place (the tensor ops
    /// of [`AdamW::step`] make some twenty passes and allocate as many tensors), through the
    /// same maths, so the same bits. `None` (nothing done) unless the
    /// parameter, its gradient and moments are contiguous f32 on the CPU and the stored dtype is
    /// one "changed" can be judged in here.
    fn apply(&self, slot: &mut Slot, grad: &Tensor, stored: DType) -> Result<Option<HostStats>> {
        if !matches!(stored, DType::F32 | DType::BF16 | DType::F16) {
            return Ok(None);
        }
        let p = slot.var.as_tensor();
        let host = [p, grad, &slot.m, &slot.v]
            .iter()
            .all(|t| host_view(t).is_some());
        if !host || grad.elem_count() != p.elem_count() {
            return Ok(None);
        }
        slot.m.inplace_op2(
            grad,
            &Moment {
                step: *self,
                second: false,
            },
        )?;
        slot.v.inplace_op2(
            grad,
            &Moment {
                step: *self,
                second: true,
            },
        )?;
        let op = Update {
            step: *self,
            stored,
            stats: std::sync::Mutex::new(HostStats::default()),
        };
        p.inplace_op3(&slot.m, &slot.v, &op)?;
        let stats = *op.stats.lock().expect("stats lock");
        Ok(Some(stats))
    }

    /// The clipped gradient.
    #[inline(always)]
    fn grad<T: Arith>(&self, g: T) -> std::result::Result<T, T::Error> {
        match self.clip {
            Some(c) => g.affine(c, 0.0),
            None => Ok(g),
        }
    }

    /// The first moment: `b1 m + (1 - b1) g`.
    #[inline(always)]
    fn first<T: Arith>(&self, m: &T, g: &T) -> std::result::Result<T, T::Error> {
        m.affine(self.b1, 0.0)?.plus(&g.affine(self.one_b1, 0.0)?)
    }

    /// The second moment: `b2 v + (1 - b2) g^2`.
    #[inline(always)]
    fn second<T: Arith>(&self, v: &T, g: &T) -> std::result::Result<T, T::Error> {
        v.affine(self.b2, 0.0)?
            .plus(&g.square()?.affine(self.one_b2, 0.0)?)
    }

    /// The new weight from the old and the new moments: decayed, then less
    /// `step_size * m / (sqrt(v) / sqrt(bias2) + eps)`.
    #[inline(always)]
    fn weight<T: Arith>(&self, p: &T, m: &T, v: &T) -> std::result::Result<T, T::Error> {
        let decayed = match self.decay_mul {
            Some(d) => p.affine(d, 0.0)?,
            None => p.clone(),
        };
        let denom = v
            .root()?
            .affine(self.inv_bias2_sqrt, 0.0)?
            .affine(1.0, self.eps)?;
        decayed.minus(&m.over(&denom)?.affine(self.step_size, 0.0)?)
    }
}

/// `m = b1 m + (1 - b1) g` (or `v = b2 v + (1 - b2) g^2`) in place.
struct Moment {
    step: Step,
    second: bool,
}

impl InplaceOp2 for Moment {
    fn name(&self) -> &'static str {
        "adamw-moment"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        use rayon::prelude::*;
        let (m, g) = (slice_mut(s1, l1)?, slice(s2, l2)?);
        let st = self.step;
        m.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK))
            .for_each(|(m, g)| {
                for (m, &g) in m.iter_mut().zip(g) {
                    let Ok(g) = st.grad(g);
                    let Ok(new) = if self.second {
                        st.second(m, &g)
                    } else {
                        st.first(m, &g)
                    };
                    *m = new;
                }
            });
        Ok(())
    }
}

/// The parameter's update from the new moments, in place, with the statistics.
struct Update {
    step: Step,
    stored: DType,
    stats: std::sync::Mutex<HostStats>,
}

impl InplaceOp3 for Update {
    fn name(&self) -> &'static str {
        "adamw-update"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<()> {
        use rayon::prelude::*;
        let (p, m, v) = (slice_mut(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let st = self.step;
        let stored = self.stored;
        // per chunk, in order, so that the sums do not depend on how the pool split the work
        let parts: Vec<HostStats> = p
            .par_chunks_mut(CHUNK)
            .zip(m.par_chunks(CHUNK).zip(v.par_chunks(CHUNK)))
            .map(|(p, (m, v))| {
                let mut out = HostStats::default();
                for ((p, &m), &v) in p.iter_mut().zip(m).zip(v) {
                    let old = *p;
                    let Ok(new) = st.weight(&old, &m, &v);
                    *p = new;
                    let diff = f64::from(new - old);
                    out.upd_sq += diff * diff;
                    out.par_sq += f64::from(old) * f64::from(old);
                    out.changed += usize::from(match stored {
                        DType::BF16 => half::bf16::from_f32(new) != half::bf16::from_f32(old),
                        DType::F16 => half::f16::from_f32(new) != half::f16::from_f32(old),
                        _ => new != old,
                    });
                }
                out
            })
            .collect();
        let mut total = self.stats.lock().expect("stats lock");
        for part in parts {
            total.upd_sq += part.upd_sq;
            total.par_sq += part.par_sq;
            total.changed += part.changed;
        }
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

    /// The one-pass host update gives the tensor ops' bits: the same parameters stepped with
    /// contiguous gradients (host path) and with strided views of the same values (tensor path),
    /// with and without clipping and weight decay, over a stored dtype of f32 and of bf16.
    #[test]
    fn the_host_update_gives_the_tensor_path_bits() {
        let dev = candle_core::Device::Cpu;
        for (max_norm, stored) in [(Some(0.5), DType::F32), (None, DType::BF16)] {
            let run = |strided: bool| {
                let vars: Vec<Var> = (0..2)
                    .map(|s| {
                        let t = Tensor::randn(0f32, 1.0, (CHUNK / 64 + 3, 96), &dev).unwrap();
                        Var::from_tensor(&((t + s as f64).unwrap())).unwrap()
                    })
                    .collect();
                // the same values whichever path runs
                for (i, v) in vars.iter().enumerate() {
                    let n = v.elem_count();
                    let vals: Vec<f32> = (0..n)
                        .map(|j| ((j * 7 + i) % 13) as f32 * 0.1 - 0.6)
                        .collect();
                    v.set(&Tensor::from_vec(vals, v.shape(), &dev).unwrap())
                        .unwrap();
                }
                let params = vars
                    .iter()
                    .enumerate()
                    .map(|(i, v)| (format!("p{i}"), v.clone()))
                    .collect();
                let mut opt = AdamW::with_state(
                    params,
                    AdamWConfig::default(),
                    |n| n == "p0",
                    StateRounding::F32,
                    stored,
                )
                .unwrap();
                let mut stats = Vec::new();
                for step in 0..3 {
                    let grads: Vec<Tensor> = vars
                        .iter()
                        .map(|v| {
                            let (r, c) = v.dims2().unwrap();
                            let vals: Vec<f32> = (0..r * c)
                                .map(|j| ((j * 31 + step * 5) % 17) as f32 * 0.01 - 0.08)
                                .collect();
                            let g = Tensor::from_vec(vals, (r, c), &dev).unwrap();
                            if strided {
                                let t = g.t().unwrap().contiguous().unwrap().t().unwrap();
                                assert!(!t.is_contiguous());
                                t
                            } else {
                                g
                            }
                        })
                        .collect();
                    stats.push(opt.step(&grads, 1e-2, max_norm).unwrap());
                }
                let bits = |t: &Tensor| -> Vec<u32> {
                    t.flatten_all()
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap()
                        .iter()
                        .map(|x| x.to_bits())
                        .collect()
                };
                let state: Vec<Vec<u32>> = vars
                    .iter()
                    .map(|v| bits(v.as_tensor()))
                    .chain(opt.state_tensors().iter().map(|(_, t)| bits(t)))
                    .collect();
                (state, stats)
            };
            let (host, host_stats) = run(false);
            let (tensor, tensor_stats) = run(true);
            assert!(host == tensor, "parameters or moments differ ({stored:?})");
            for (a, b) in host_stats.iter().zip(&tensor_stats) {
                assert!((a.grad_norm - b.grad_norm).abs() <= 1e-6 * b.grad_norm);
                let rel = (a.update_ratio - b.update_ratio).abs() / b.update_ratio;
                // f64 sums here, f32 sums in candle's `sum_all`
                assert!(
                    rel <= 1e-3,
                    "update ratio {} vs {}",
                    a.update_ratio,
                    b.update_ratio
                );
                assert_eq!(a.changed_share, b.changed_share);
            }
        }
    }
}
