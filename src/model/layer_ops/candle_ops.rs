//! The layer ops on candle, on any device: differentiable for training and the references
//! ([`Exec::Differentiable`], [`Exec::Composed`]), or through candle's fused kernels and
//! stacked projections for sampling ([`Exec::Sampling`]); the implementation each op picks is
//! [`super::super::ops`]'s one decision. The reference a CUDA implementation is checked against.
//!
//! Each op declares the candle operations it issues (a kernel launch and a new buffer each on a
//! GPU), by the branch it takes and its inputs' layout; the tests check the declarations of the
//! differentiable path against the graph candle records.
//!
//! Knows nothing of layer kinds, caches or weights' names.

use candle_core::{Module, Result, Tensor};
use candle_nn::Linear;

use super::super::attention::AttentionBackend;
use super::super::config::Activation;
use super::super::cost::CountMode;
use super::super::ops::{
    copy_cost, gated, project_counted, stack_linears, Exec, RmsNorm, RopeRows,
};
use super::candle_deltanet::{
    CandleDeltaIn, CandleDeltaNet, CandleDeltaRows, CandleDeltaState, Run,
};
use super::{AttnDims, Cost, LayerOps, Qkv};
use crate::cuda::shapes::QkvShape;

/// The candle implementation: how it computes, and what its calls have spent.
#[derive(Debug, Clone, Copy)]
pub struct CandleOps {
    pub exec: Exec,
    /// Whether (and for which device) this run counts.
    pub count: CountMode,
    spent: Cost,
}

impl CandleOps {
    /// The Gated DeltaNet's ops on this implementation's settings and tally.
    fn deltanet(&mut self) -> Run<'_> {
        Run {
            exec: self.exec,
            count: self.count,
            spent: &mut self.spent,
        }
    }

    pub fn new(exec: Exec) -> Self {
        CandleOps {
            exec,
            count: CountMode::Off,
            spent: Cost::default(),
        }
    }
}

/// An attention layer's q/k/v projections and per-head q/k norms (Qwen3, Qwen3.5, Gemma 3).
#[derive(Debug, Clone)]
pub struct CandleQkv {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    /// For sampling: q, k and v as one matrix, so that a step runs one matmul where it ran
    /// three; the separate projections above become views of it.
    pub stacked: Option<Linear>,
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
}

impl CandleQkv {
    /// Stacks q/k/v into one matrix (the separate ones become views of it), and fixes the q/k
    /// norms' scales, for sampling.
    pub fn stack(&mut self) -> Result<()> {
        for n in [&mut self.q_norm, &mut self.k_norm].into_iter().flatten() {
            n.freeze_scale()?;
        }
        if self.stacked.is_none() {
            let (qkv, v) = stack_linears(&[&self.q_proj, &self.k_proj, &self.v_proj])?;
            (self.q_proj, self.k_proj, self.v_proj) = (v[0].clone(), v[1].clone(), v[2].clone());
            self.stacked = Some(qkv);
        }
        Ok(())
    }
}

/// The MLP's gate and up projections.
#[derive(Debug, Clone)]
pub struct CandleGateUp {
    pub gate: Linear,
    pub up: Linear,
    /// For sampling: gate and up as one matrix (the two above become views of it).
    pub stacked: Option<Linear>,
}

impl CandleGateUp {
    /// Stacks gate and up into one matrix (the separate ones become views of it).
    pub fn stack(&mut self) -> Result<()> {
        if self.stacked.is_none() {
            let (gate_up, v) = stack_linears(&[&self.gate, &self.up])?;
            (self.gate, self.up) = (v[0].clone(), v[1].clone());
            self.stacked = Some(gate_up);
        }
        Ok(())
    }
}

impl CandleOps {
    /// Whether a sampling step runs our fused kernels on `x` (a GPU's step in f32 or bf16):
    /// `Some(dry)`, `dry` when counting a GPU's step on a machine without one (the kernels'
    /// cost declared, their outputs zeros); `None` for candle's ops.
    fn gpu_sampling(&self, x: &Tensor) -> Option<bool> {
        super::candle_deltanet::our_gpu_kernels(self.exec, self.count, x)
    }

    /// [`LayerOps::add_rms_norm`] of a GPU's sampling step as one kernel (no sandwich norm);
    /// `None` elsewhere.
    fn fused_add_rms_norm(
        &mut self,
        x: &Tensor,
        y: &Tensor,
        y_norm: Option<&RmsNorm>,
        next: &RmsNorm,
    ) -> Result<Option<(Tensor, Tensor)>> {
        let Some(dry) = self.gpu_sampling(x) else {
            return Ok(None);
        };
        let dt = x.dtype();
        if y_norm.is_some()
            || next.offset
            || next.weight.dtype() != dt
            || y.dtype() != dt
            || x.rank() != 2
            || y.dims() != x.dims()
        {
            return Ok(None);
        }
        // one launch into the sum and the normed sum
        self.spent += Cost {
            launches: 1,
            allocations: 2,
            ..Cost::default()
        };
        if dry {
            return Ok(Some((x.zeros_like()?, x.zeros_like()?)));
        }
        #[cfg(feature = "cuda")]
        {
            crate::cuda::layer_ops::add_rms_norm(x, y, &next.weight, next.eps).map(Some)
        }
        #[cfg(not(feature = "cuda"))]
        {
            candle_core::bail!("the fused add and norm kernel needs a build with the cuda feature")
        }
    }

    /// [`LayerOps::gate_up_act`] of a GPU's sampling step as the stacked projection and one
    /// kernel; `None` elsewhere.
    fn fused_gate_up_act(
        &mut self,
        h: &Tensor,
        w: &CandleGateUp,
        act: Activation,
    ) -> Result<Option<Tensor>> {
        let (Some(dry), Some(gu)) = (self.gpu_sampling(h), w.stacked.as_ref()) else {
            return Ok(None);
        };
        self.spent += Cost::kernels(1 + u64::from(gu.bias().is_some()));
        let y = gu.forward(h)?;
        self.spent += Cost::kernels(1);
        if dry {
            return Tensor::zeros((y.dim(0)?, y.dim(1)? / 2), y.dtype(), y.device()).map(Some);
        }
        #[cfg(feature = "cuda")]
        {
            let gelu = act == Activation::GeluTanh;
            crate::cuda::layer_ops::gate_up_act(&y, gelu).map(Some)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = act;
            candle_core::bail!("the fused activation kernel needs a build with the cuda feature")
        }
    }

    /// [`LayerOps::qkv_rope`] of a GPU's sampling step as the stacked projection and one fused
    /// kernel (`crate::cuda::layer_ops::qkv_rope`), where it takes the shape; `None` elsewhere.
    /// Counting a GPU's step on a machine without one, the kernel's cost is declared and its
    /// outputs are zeros.
    fn fused_qkv_rope(
        &mut self,
        h: &Tensor,
        w: &CandleQkv,
        dims: AttnDims,
        rope: &RopeRows,
    ) -> Result<Option<Qkv<Tensor>>> {
        let (Some(dry), Some(stacked)) = (self.gpu_sampling(h), w.stacked.as_ref()) else {
            return Ok(None);
        };
        // norms and RoPE tables as the kernel takes them (one eps, the rows' dtype), else candle
        let dt = h.dtype();
        let norms = match (&w.q_norm, &w.k_norm) {
            (Some(q), Some(k))
                if !q.offset
                    && !k.offset
                    && q.eps == k.eps
                    && q.weight.dtype() == dt
                    && k.weight.dtype() == dt =>
            {
                Some((q, k))
            }
            (None, None) => None,
            _ => return Ok(None),
        };
        let (cos, sin) = rope.tables();
        if cos.dtype() != dt || sin.dtype() != dt {
            return Ok(None);
        }
        let shape = QkvShape {
            heads: dims.heads,
            kv_heads: dims.kv_heads,
            head_dim: dims.head_dim,
            rotary: 2 * cos.dim(1)?,
            gate: dims.gate,
            eps: norms.map_or(0.0, |n| n.0.eps),
            q_scale: dims.q_scale,
        };
        if !shape.supported() {
            return Ok(None);
        }
        self.spent += Cost::kernels(1 + u64::from(stacked.bias().is_some()));
        let y = stacked.forward(h)?;
        // one launch into q, k, v (and the gate)
        self.spent += Cost {
            launches: 1,
            allocations: 3 + u64::from(dims.gate),
            ..Cost::default()
        };
        let t = h.dim(0)?;
        if dry {
            let (hq, hkv, d) = (dims.heads, dims.kv_heads, dims.head_dim);
            let z = |dims: &[usize]| Tensor::zeros(dims, y.dtype(), y.device());
            return Ok(Some(Qkv {
                q: z(&[t, hq, d])?,
                k: z(&[t, hkv, d])?,
                v: z(&[t, hkv, d])?,
                gate: dims.gate.then(|| z(&[t, hq * d])).transpose()?,
            }));
        }
        #[cfg(feature = "cuda")]
        {
            let x = crate::cuda::layer_ops::QkvRopeIn {
                y: &y,
                norms: norms.map(|(q, k)| (&q.weight, &k.weight)),
                cos,
                sin,
            };
            let (q, k, v, gate) = crate::cuda::layer_ops::qkv_rope(&shape, &x)?;
            Ok(Some(Qkv { q, k, v, gate }))
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = sin;
            candle_core::bail!("the fused q/k/v kernel needs a build with the cuda feature")
        }
    }
}

impl LayerOps for CandleOps {
    type Act = Tensor;
    type Norm = RmsNorm;
    type Linear = Linear;
    type Qkv = CandleQkv;
    type GateUp = CandleGateUp;
    type DeltaIn = CandleDeltaIn;
    type DeltaRows = CandleDeltaRows;
    type DeltaNet = CandleDeltaNet;
    type DeltaState<'b> = CandleDeltaState<'b>;

    fn rms_norm(&mut self, x: &Tensor, w: &RmsNorm) -> Result<Tensor> {
        w.forward_counted(x, self.exec, &mut self.spent)
    }

    fn add_rms_norm(
        &mut self,
        x: Tensor,
        y: Tensor,
        y_norm: Option<&RmsNorm>,
        next: &RmsNorm,
    ) -> Result<(Tensor, Tensor)> {
        if let Some(fused) = self.fused_add_rms_norm(&x, &y, y_norm, next)? {
            return Ok(fused);
        }
        let x = self.add(x, y, y_norm)?;
        let h = next.forward_counted(&x, self.exec, &mut self.spent)?;
        Ok((x, h))
    }

    fn add(&mut self, x: Tensor, y: Tensor, y_norm: Option<&RmsNorm>) -> Result<Tensor> {
        let y = match y_norm {
            Some(n) => n.forward_counted(&y, self.exec, &mut self.spent)?,
            None => y,
        };
        self.spent += Cost::kernels(1);
        x + y
    }

    fn qkv_rope(
        &mut self,
        h: Tensor,
        w: &CandleQkv,
        dims: AttnDims,
        rope: &RopeRows,
    ) -> Result<Qkv<Tensor>> {
        if let Some(fused) = self.fused_qkv_rope(&h, w, dims, rope)? {
            return Ok(fused);
        }
        let (exec, spent) = (self.exec, &mut self.spent);
        let AttnDims {
            heads: hq,
            kv_heads: hkv,
            head_dim: d,
            ..
        } = dims;
        let t = h.dim(0)?;
        let nq = hq * d * if dims.gate { 2 } else { 1 };
        let (q, k, v) = match (&w.stacked, exec) {
            (Some(qkv), Exec::Sampling) => {
                *spent += Cost::kernels(1 + u64::from(qkv.bias().is_some()));
                let y = qkv.forward(&h)?;
                let nkv = hkv * d;
                (
                    y.narrow(1, 0, nq)?,
                    y.narrow(1, nq, nkv)?,
                    y.narrow(1, nq + nkv, nkv)?,
                )
            }
            _ => (
                project_counted(&w.q_proj, &h, exec, spent)?,
                project_counted(&w.k_proj, &h, exec, spent)?,
                project_counted(&w.v_proj, &h, exec, spent)?,
            ),
        };
        // a reshape copies a strided view (the narrowed columns of several rows)
        *spent += copy_cost(&k) + copy_cost(&v);
        let k = k.reshape((t, hkv, d))?;
        let v = v.reshape((t, hkv, d))?;
        let (mut q, gate) = if dims.gate {
            // each head's rows: its query, then its gate
            *spent += copy_cost(&q);
            let qg = q.reshape((t, hq, 2 * d))?;
            let gate = qg.narrow(2, d, d)?;
            *spent += copy_cost(&gate);
            let gate = gate.reshape((t, hq * d))?;
            let q = qg.narrow(2, 0, d)?;
            *spent += copy_cost(&q);
            (q.contiguous()?, Some(gate))
        } else {
            *spent += copy_cost(&q);
            (q.reshape((t, hq, d))?, None)
        };
        let mut k = k;
        if let (Some(qn), Some(kn)) = (&w.q_norm, &w.k_norm) {
            q = qn.forward_counted(&q, exec, spent)?;
            k = kn.forward_counted(&k, exec, spent)?;
        }
        let mut q = rope.apply_counted(&q, exec, spent)?;
        if dims.q_scale != 1.0 {
            *spent += Cost::kernels(1);
            q = q.affine(dims.q_scale, 0.0)?;
        }
        let k = rope.apply_counted(&k, exec, spent)?;
        Ok(Qkv { q, k, v, gate })
    }

    fn attend(
        &mut self,
        layer: usize,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        dims: AttnDims,
        window: Option<usize>,
        backend: &mut dyn AttentionBackend,
    ) -> Result<Tensor> {
        let t = q.dim(0)?;
        let a = backend.attend(layer, &q, &k, &v, window)?;
        self.spent += backend.take_cost() + copy_cost(&a);
        a.reshape((t, dims.heads * dims.head_dim))
    }

    fn gate_mul(&mut self, a: Tensor, gate: Tensor) -> Result<Tensor> {
        self.spent += Cost::kernels(2);
        a * candle_nn::ops::sigmoid(&gate)?
    }

    fn linear(&mut self, x: Tensor, w: &Linear) -> Result<Tensor> {
        project_counted(w, &x, self.exec, &mut self.spent)
    }

    fn gate_up_act(&mut self, h: Tensor, w: &CandleGateUp, act: Activation) -> Result<Tensor> {
        if let Some(fused) = self.fused_gate_up_act(&h, w, act)? {
            return Ok(fused);
        }
        let (exec, spent) = (self.exec, &mut self.spent);
        let (g, u) = match (&w.stacked, exec) {
            (Some(gu), Exec::Sampling) => {
                *spent += Cost::kernels(1);
                let y = gu.forward(&h)?;
                let i = y.dim(1)? / 2;
                (y.narrow(1, 0, i)?, y.narrow(1, i, i)?)
            }
            _ => (
                project_counted(&w.gate, &h, exec, spent)?,
                project_counted(&w.up, &h, exec, spent)?,
            ),
        };
        gated(&g, &u, act, exec, spent)
    }

    fn deltanet_in(&mut self, h: Tensor, w: &CandleDeltaIn) -> Result<CandleDeltaRows> {
        self.deltanet().deltanet_in(h, w)
    }

    fn deltanet_state<'b>(
        &mut self,
        layer: usize,
        x: &CandleDeltaRows,
        w: &CandleDeltaNet,
        backend: &'b mut dyn AttentionBackend,
    ) -> Result<CandleDeltaState<'b>> {
        self.deltanet().deltanet_state(layer, x, w, backend)
    }

    fn conv_update(
        &mut self,
        x: &CandleDeltaRows,
        w: &CandleDeltaNet,
        state: &mut CandleDeltaState<'_>,
    ) -> Result<Tensor> {
        self.deltanet().conv_update(x, w, state)
    }

    fn delta_rule(
        &mut self,
        u: Tensor,
        x: CandleDeltaRows,
        w: &CandleDeltaNet,
        state: &mut CandleDeltaState<'_>,
    ) -> Result<Tensor> {
        self.deltanet().delta_rule(u, x, w, state)
    }

    fn store_deltanet_state(&mut self, state: CandleDeltaState<'_>) -> Result<()> {
        self.deltanet().store_deltanet_state(state)
    }

    fn take_cost(&mut self) -> Cost {
        std::mem::take(&mut self.spent)
    }
}
