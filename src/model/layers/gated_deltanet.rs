//! The Gated DeltaNet layer kind (Qwen3.5's `linear_attention`): a linear-attention mixer whose
//! memory of a sequence is a fixed state instead of keys and values.
//!
//! ```text
//! c = in_proj_qkv(x)                      conv_dim = 2 * key_dim + value_dim channels
//! u = silu(causal depthwise conv_K(c))    the conv sees the last K-1 inputs of the state
//! q, k, v = split(u)                      q, k: (Hk, dk) l2-normalised, q / sqrt(dk), repeated
//!                                         to the Hv value heads (head h reads key head h / (Hv/Hk))
//! beta = sigmoid(in_proj_b(x))            g = -exp(A_log) * softplus(in_proj_a(x) + dt_bias)
//! S = S * exp(g);  S += k ⊗ beta (v - Sᵀk);  o = Sᵀq          per value head, S: (dk, dv)
//! y = out_proj(rmsnorm(o) * w * silu(in_proj_z(x)))            the norm per head over dv
//! ```
//! Two forms of the delta rule, equal up to float rounding: [`delta_rule_recurrent`] (token by
//! token: decode) and [`delta_rule_chunked`] (chunks of [`CHUNK`] tokens in a few matmuls:
//! prompts and training). Both are candle ops that record a backward pass; the math follows
//! transformers' `models/qwen3_5` (`torch_chunk_gated_delta_rule`), in f32 whatever the model's
//! dtype. A sequence's state (the conv inputs, then S) comes from and goes back to the caller's
//! backend, so a step may continue sequences. Knows nothing of where states are kept.

use candle_core::{DType, Device, Result, Tensor, D};
use candle_nn::{Linear, VarBuilder};

use super::super::attention::AttentionBackend;
use super::super::config::{LinearAttention, ModelConfig};
use super::super::cost::{Cost, CountMode};
use super::super::ops::{cat_cost, copy_cost, project_counted, stack_linears, Exec, RmsNorm};
use super::super::packed::{dropped, inv_rms, PackedLinear};
use super::weight_init::Init;
use crate::cuda::shapes::GdnShape;
use rayon::prelude::*;

/// Tokens per chunk of the chunked form (transformers' default).
pub const CHUNK: usize = 64;

/// Sequences of at most this many tokens in a step run the recurrent form.
const RECURRENT_MAX: usize = 1;

/// Every weight of the layer under `prefix` (`model.layers.N`): (name, shape, initial value).
pub fn weight_shapes(cfg: &ModelConfig, prefix: &str) -> Vec<(String, Vec<usize>, Init)> {
    let Some(l) = cfg.linear else {
        return Vec::new();
    };
    let (h, nv) = (cfg.hidden_size, l.num_value_heads);
    let p = |n: &str| format!("{prefix}.linear_attn.{n}");
    vec![
        (p("in_proj_qkv.weight"), vec![l.conv_dim(), h], Init::Normal),
        (p("in_proj_z.weight"), vec![l.value_dim(), h], Init::Normal),
        (p("in_proj_b.weight"), vec![nv, h], Init::Normal),
        (p("in_proj_a.weight"), vec![nv, h], Init::Normal),
        (
            p("conv1d.weight"),
            vec![l.conv_dim(), 1, l.conv_kernel],
            Init::Normal,
        ),
        // A = 4: a decay rate inside transformers' init range (0.01, 16)
        (p("A_log"), vec![nv], Init::Const(4f32.ln())),
        (p("dt_bias"), vec![nv], Init::Const(1.0)),
        (p("norm.weight"), vec![l.value_head_dim], Init::Const(1.0)),
        (p("out_proj.weight"), vec![h, l.value_dim()], Init::Normal),
    ]
}

/// A layer's Gated DeltaNet on the candle path.
#[derive(Debug, Clone)]
pub struct GatedDeltaNet {
    in_proj_qkv: Linear,
    in_proj_z: Linear,
    in_proj_b: Linear,
    in_proj_a: Linear,
    /// (conv_dim, 1, K), as stored.
    conv: Tensor,
    a_log: Tensor,
    dt_bias: Tensor,
    /// The gated output norm over a value head (a plain `w` scale, not zero-centred).
    norm: RmsNorm,
    out_proj: Linear,
    shape: LinearAttention,
}

impl GatedDeltaNet {
    /// From the layer's var builder (`model.layers.N`).
    pub fn new(cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        let Some(l) = cfg.linear else {
            candle_core::bail!("a Gated DeltaNet layer in a config without its linear_* shape")
        };
        let vb = vb.pp("linear_attn");
        let (h, nv) = (cfg.hidden_size, l.num_value_heads);
        let lin = |i, o, name| candle_nn::linear_no_bias(i, o, vb.pp(name));
        Ok(GatedDeltaNet {
            in_proj_qkv: lin(h, l.conv_dim(), "in_proj_qkv")?,
            in_proj_z: lin(h, l.value_dim(), "in_proj_z")?,
            in_proj_b: lin(h, nv, "in_proj_b")?,
            in_proj_a: lin(h, nv, "in_proj_a")?,
            conv: vb.get((l.conv_dim(), 1, l.conv_kernel), "conv1d.weight")?,
            a_log: vb.get(nv, "A_log")?,
            dt_bias: vb.get(nv, "dt_bias")?,
            norm: RmsNorm::new(l.value_head_dim, cfg.rms_norm_eps, false, vb.pp("norm"))?,
            out_proj: lin(l.value_dim(), h, "out_proj")?,
            shape: l,
        })
    }

    /// The block's output (T, hidden) for the normed input `h` (T, hidden): layer `index`,
    /// whose sequences and states the backend gives.
    pub fn forward(
        &self,
        index: usize,
        h: &Tensor,
        exec: Exec,
        backend: &mut dyn AttentionBackend,
    ) -> Result<Tensor> {
        self.forward_counted(
            index,
            h,
            exec,
            backend,
            &mut Cost::default(),
            CountMode::Off,
        )
    }

    /// [`Self::forward`], adding the candle operations (and kernels) it issues to `spent`.
    /// `count`: whether the run counts (the delta rule's count walks a graph: only then), and
    /// whether it counts a GPU's step on a machine without one, where the GPU would run the
    /// decode kernels (see [`Self::decode_kernels`]'s `dry`).
    pub fn forward_counted(
        &self,
        index: usize,
        h: &Tensor,
        exec: Exec,
        backend: &mut dyn AttentionBackend,
        spent: &mut Cost,
        count: CountMode,
    ) -> Result<Tensor> {
        let l = self.shape;
        let step = backend.recurrent_state(index, l.state_values())?;
        let t = h.dim(0)?;
        if step.seq_lens.iter().sum::<usize>() != t {
            candle_core::bail!(
                "layer {index}: {t} tokens, but the step's sequences bring {:?}",
                step.seq_lens
            )
        }
        // decode steps on a GPU, for sampling only: the kernels record no backward pass
        let decode = exec == Exec::Sampling && step.seq_lens.iter().all(|&n| n == 1);
        if let Some(shape) = self.decode_shape().filter(|_| decode) {
            let dry = count == CountMode::AsCuda && !h.device().is_cuda();
            if h.device().is_cuda() || dry {
                let (y, state) = self.decode_kernels(shape, h, &step, exec, spent, dry)?;
                backend.store_recurrent_state(index, state)?;
                return project_counted(&self.out_proj, &y, exec, spent);
            }
        }
        let dtype = h.dtype();
        // a cast to f32 is an op below f32
        let cast = Cost::kernels(u64::from(dtype != DType::F32));
        let f32 = |x: Tensor| x.to_dtype(DType::F32);
        let qkv = f32(project_counted(&self.in_proj_qkv, h, exec, spent)?)?;
        // the gate stays in the model's dtype
        let z = project_counted(&self.in_proj_z, h, exec, spent)?;
        let b = f32(project_counted(&self.in_proj_b, h, exec, spent)?)?;
        let beta = candle_nn::ops::sigmoid(&b)?;
        let a = f32(project_counted(&self.in_proj_a, h, exec, spent)?)?;
        let rate = f32(self.a_log.clone())?.exp()?.neg()?; // -exp(A_log)
        let g = softplus(&a.broadcast_add(&f32(self.dt_bias.clone())?)?)?.broadcast_mul(&rate)?;
        let conv_w = f32(self.conv.squeeze(1)?)?.t()?; // (K, conv_dim)
                                                       // six casts; sigmoid; exp, neg; add, softplus, multiply
        *spent += cast * 6 + Cost::kernels(1 + 2 + 2 + SOFTPLUS_OPS);
        let (conv_len, k1) = (l.conv_dim() * (l.conv_kernel - 1), l.conv_kernel - 1);
        let (mut outs, mut states) = (Vec::new(), Vec::new());
        let mut start = 0;
        for (s, &len) in step.seq_lens.iter().enumerate() {
            let (conv0, s0) = match &step.state {
                Some(st) => {
                    let row = st.get(s)?;
                    (
                        row.narrow(0, 0, conv_len)?.reshape((k1, l.conv_dim()))?,
                        Some(
                            row.narrow(0, conv_len, l.state_values() - conv_len)?
                                .reshape((l.num_value_heads, l.key_head_dim, l.value_head_dim))?,
                        ),
                    )
                }
                None => {
                    *spent += Cost::kernels(1);
                    (
                        Tensor::zeros((k1, l.conv_dim()), DType::F32, h.device())?,
                        None,
                    )
                }
            };
            let x = qkv.narrow(0, start, len)?;
            let padded = Tensor::cat(&[&conv0, &x], 0)?; // (K-1+L, conv_dim)
            let mut conv = padded.narrow(0, 0, len)?.broadcast_mul(&conv_w.get(0)?)?;
            for j in 1..l.conv_kernel {
                conv = (conv + padded.narrow(0, j, len)?.broadcast_mul(&conv_w.get(j)?)?)?;
            }
            let u = candle_nn::ops::silu(&conv)?;
            // the join; K products and K-1 sums; SiLU
            *spent += cat_cost(2) + Cost::kernels(2 * l.conv_kernel as u64);
            let (q, k, v) = self.split_heads(&u, spent)?;
            let (g_s, beta_s) = (
                g.narrow(0, start, len)?.t()?,
                beta.narrow(0, start, len)?.t()?,
            );
            *spent += copy_cost(&g_s) + copy_cost(&beta_s);
            let (g_s, beta_s) = (g_s.contiguous()?, beta_s.contiguous()?); // (Hv, L)
            if count != CountMode::Off {
                *spent += delta_rule_cost(len, s0.is_some())?;
            }
            let (o, s1) = if len <= RECURRENT_MAX {
                delta_rule_recurrent(&q, &k, &v, &g_s, &beta_s, s0.as_ref())?
            } else {
                delta_rule_chunked(&q, &k, &v, &g_s, &beta_s, s0.as_ref())?
            };
            // (Hv, L, dv) -> (L, Hv, dv) in the model's dtype; the gated norm per head
            let o = o.transpose(0, 1)?;
            *spent += copy_cost(&o) + cast;
            let o = o.contiguous()?.to_dtype(dtype)?;
            let z_s =
                z.narrow(0, start, len)?
                    .reshape((len, l.num_value_heads, l.value_head_dim))?;
            let normed = self.norm.forward_counted(&o, exec, spent)?;
            let y = (normed * candle_nn::ops::silu(&z_s)?)?;
            outs.push(y.reshape((len, l.value_dim()))?);
            let conv1 = padded.narrow(0, len, k1)?.flatten_all()?;
            states.push(Tensor::cat(&[&conv1, &s1.flatten_all()?], 0)?);
            // SiLU, the gate's product; the state's join
            *spent += Cost::kernels(2) + cat_cost(2);
            start += len;
        }
        let n = outs.len() as u64;
        let y = Tensor::cat(&outs, 0)?;
        backend.store_recurrent_state(index, Tensor::stack(&states, 0)?)?;
        // (a join of one tensor is the tensor)
        if n > 1 {
            *spent += cat_cost(n) * 2;
        }
        project_counted(&self.out_proj, &y, exec, spent)
    }

    /// The GPU decode kernels' shape for this layer, when they take it.
    fn decode_shape(&self) -> Option<GdnShape> {
        let l = self.shape;
        let shape = GdnShape {
            nk: l.num_key_heads,
            nv: l.num_value_heads,
            dk: l.key_head_dim,
            dv: l.value_head_dim,
            conv_kernel: l.conv_kernel,
            eps: self.norm.eps,
        };
        (shape.supported() && !self.norm.offset).then_some(shape)
    }

    /// A decode step (one token per sequence) through the GPU kernels of
    /// `crate::cuda::gated_deltanet`, the same maths as [`Self::forward`]'s loop: the gated norm's
    /// output (B, value_dim) and the new states (B, values). `dry`: counting a GPU's step on a
    /// machine without one: everything but the kernels runs, their cost is declared, and their
    /// outputs are zeros.
    #[allow(clippy::too_many_arguments)]
    fn decode_kernels(
        &self,
        shape: GdnShape,
        h: &Tensor,
        step: &super::super::attention::RecurrentStep,
        exec: Exec,
        spent: &mut Cost,
        dry: bool,
    ) -> Result<(Tensor, Tensor)> {
        let l = self.shape;
        let rows = h.dim(0)?;
        // the kernels update the state in place: a copy unless it is the step's own
        let state = match &step.state {
            Some(s) => {
                *spent += Cost::kernels(u64::from(s.dtype() != DType::F32)) + copy_cost(s);
                s.to_dtype(DType::F32)?.contiguous()?
            }
            None => {
                *spent += Cost::kernels(1);
                Tensor::zeros((rows, l.state_values()), DType::F32, h.device())?
            }
        };
        let qkv = project_counted(&self.in_proj_qkv, h, exec, spent)?;
        let a = project_counted(&self.in_proj_a, h, exec, spent)?;
        let b = project_counted(&self.in_proj_b, h, exec, spent)?;
        let z = project_counted(&self.in_proj_z, h, exec, spent)?;
        // the conv kernel and the recurrent one, each into a new buffer
        *spent += Cost::kernels(2);
        if dry {
            let y = Tensor::zeros((rows, l.value_dim()), h.dtype(), h.device())?;
            return Ok((y, state));
        }
        #[cfg(feature = "cuda")]
        {
            use crate::cuda::gated_deltanet::{decode_step, GdnStep};
            let x = GdnStep {
                qkv: &qkv,
                a: &a,
                b: &b,
                z: &z,
                conv_w: &self.conv.squeeze(1)?,
                a_log: &self.a_log,
                dt_bias: &self.dt_bias,
                norm_w: &self.norm.weight,
                state: &state,
            };
            Ok((decode_step(&shape, &x)?, state))
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (shape, qkv, a, b, z);
            candle_core::bail!(
                "the Gated DeltaNet decode kernels need a build with the cuda feature"
            )
        }
    }

    /// The conv's output (L, conv_dim) as heads-first f32 q, k (Hv, L, dk), l2-normalised, q
    /// scaled by 1/sqrt(dk), both repeated to the value heads, and v (Hv, L, dv).
    fn split_heads(&self, u: &Tensor, spent: &mut Cost) -> Result<(Tensor, Tensor, Tensor)> {
        let l = self.shape;
        let len = u.dim(0)?;
        let (nk, nv, dk, dv) = (
            l.num_key_heads,
            l.num_value_heads,
            l.key_head_dim,
            l.value_head_dim,
        );
        let mut heads = |x: Tensor| -> Result<Tensor> {
            // (L, Hk, dk) -> (L, Hv, dk): each key head serves Hv/Hk consecutive value heads
            *spent += copy_cost(&x) + Cost::kernels(L2NORM_OPS);
            let x = l2norm(&x.reshape((len, nk, dk))?)?;
            let x = x.unsqueeze(2)?.expand((len, nk, nv / nk, dk))?;
            *spent += copy_cost(&x);
            let x = x.reshape((len, nv, dk))?.transpose(0, 1)?;
            *spent += copy_cost(&x);
            x.contiguous()
        };
        let q = (heads(u.narrow(1, 0, l.key_dim())?)? * (1.0 / (dk as f64).sqrt()))?;
        let k = heads(u.narrow(1, l.key_dim(), l.key_dim())?)?;
        let v = u.narrow(1, 2 * l.key_dim(), l.value_dim())?;
        *spent += Cost::kernels(1) + copy_cost(&v);
        let v = v.reshape((len, nv, dv))?.transpose(0, 1)?;
        *spent += copy_cost(&v);
        Ok((q, k, v.contiguous()?))
    }
}

impl GatedDeltaNet {
    /// The host path's packed weights; the candle weights are dropped.
    pub fn pack(&mut self) -> Result<HostGatedDeltaNet> {
        let l = self.shape;
        let parts = [
            &self.in_proj_qkv,
            &self.in_proj_z,
            &self.in_proj_b,
            &self.in_proj_a,
        ];
        let (stacked, _) = stack_linears(&parts)?;
        let host = HostGatedDeltaNet {
            proj: PackedLinear::new(&stacked)?,
            out: PackedLinear::new(&self.out_proj)?,
            conv: self.conv.squeeze(1)?.flatten_all()?.to_vec1()?,
            rate: self.a_log.exp()?.neg()?.to_vec1()?,
            dt_bias: self.dt_bias.to_vec1()?,
            norm: self.norm.scale()?.to_vec1()?,
            eps: self.norm.eps as f32,
            shape: l,
        };
        for p in [
            &mut self.in_proj_qkv,
            &mut self.in_proj_z,
            &mut self.in_proj_b,
            &mut self.in_proj_a,
            &mut self.out_proj,
        ] {
            *p = dropped(p)?;
        }
        Ok(host)
    }
}

/// A layer's Gated DeltaNet on the CPU host path: the four input projections stacked and packed,
/// the output projection packed, the rest as host values. Each sequence runs the recurrent form
/// token by token on its own state, so a row's values do not depend on the other rows of the
/// step (the sampler's batch-invariance promise). Inference only.
#[derive(Debug, Clone)]
pub struct HostGatedDeltaNet {
    /// in_proj_qkv | in_proj_z | in_proj_b | in_proj_a, by rows.
    proj: PackedLinear,
    out: PackedLinear,
    /// (conv_dim, K), row-major.
    conv: Vec<f32>,
    /// `-exp(A_log)` per value head.
    rate: Vec<f32>,
    dt_bias: Vec<f32>,
    /// The gated norm's scale (dv).
    norm: Vec<f32>,
    eps: f32,
    shape: LinearAttention,
}

impl HostGatedDeltaNet {
    /// The lengths of the two work buffers [`Self::forward`] takes for `t` rows: the stacked
    /// projections' rows and the gated norm's output.
    pub fn buffer_lens(&self, t: usize) -> (usize, usize) {
        let l = self.shape;
        let width = l.conv_dim() + l.value_dim() + 2 * l.num_value_heads;
        (t * width, t * l.value_dim())
    }

    /// The block's output for the normed rows `h` (T, hidden) into `out`: layer `index`, whose
    /// sequences and states the backend gives. `rows` and `y` are work buffers of
    /// [`Self::buffer_lens`].
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        index: usize,
        h: &[f32],
        t: usize,
        rows: &mut [f32],
        y: &mut [f32],
        out: &mut [f32],
        backend: &mut dyn AttentionBackend,
    ) -> Result<()> {
        let l = self.shape;
        let width = l.conv_dim() + l.value_dim() + 2 * l.num_value_heads;
        self.proj.apply_into(h, t, rows);
        // each sequence's state, lent in place where the backend keeps it on the host
        let mut run = |seq_lens: &[usize], states: &mut [&mut [f32]]| -> Result<()> {
            if seq_lens.iter().sum::<usize>() != t || states.len() != seq_lens.len() {
                candle_core::bail!(
                    "layer {index}: {t} tokens, but the step's sequences bring {seq_lens:?}"
                )
            }
            // the sequences' rows, outputs and states, apart
            let mut parts = Vec::with_capacity(seq_lens.len());
            let (mut rows_left, mut y_left) = (&*rows, &mut *y);
            for (&len, state) in seq_lens.iter().zip(states.iter_mut()) {
                let (r, rest) = rows_left.split_at(len * width);
                let (o, rest_y) = std::mem::take(&mut y_left).split_at_mut(len * l.value_dim());
                parts.push((r, o, &mut **state));
                (rows_left, y_left) = (rest, rest_y);
            }
            parts
                .into_par_iter()
                .for_each(|(r, o, state)| self.sequence(r, o, state));
            Ok(())
        };
        backend.with_recurrent_host(index, l.state_values(), &mut run)?;
        self.out.apply_into(y, t, out);
        Ok(())
    }

    /// One sequence's tokens: `rows` of the stacked projections in, `y` (tokens x value_dim)
    /// out, `state` (the conv's last K-1 inputs, then S) carried through.
    fn sequence(&self, rows: &[f32], y: &mut [f32], state: &mut [f32]) {
        let l = self.shape;
        let (cd, vd, nv, k) = (
            l.conv_dim(),
            l.value_dim(),
            l.num_value_heads,
            l.conv_kernel,
        );
        let (dk, dv, per_key) = (l.key_head_dim, l.value_head_dim, nv / l.num_key_heads);
        let width = cd + vd + 2 * nv;
        let (window, s) = state.split_at_mut(cd * (k - 1));
        let mut u = vec![0f32; cd];
        let q_scale = 1.0 / (dk as f32).sqrt();
        for (row, y) in rows.chunks(width).zip(y.chunks_mut(vd)) {
            let (x, rest) = row.split_at(cd);
            let (z, rest) = rest.split_at(vd);
            let (bs, as_) = rest.split_at(nv);
            // the causal conv over the window (oldest first) and this input, then SiLU
            for (c, u) in u.iter_mut().enumerate() {
                let w = &self.conv[c * k..][..k];
                let mut acc = w[k - 1] * x[c];
                for j in 0..k - 1 {
                    acc += w[j] * window[j * cd + c];
                }
                *u = acc / (1.0 + (-acc).exp());
            }
            window.copy_within(cd.., 0);
            window[(k - 2) * cd..].copy_from_slice(x);
            let (q, kv) = u.split_at_mut(l.key_dim());
            let (keys, v) = kv.split_at_mut(l.key_dim());
            for head in q.chunks_mut(dk) {
                let r = (head.iter().map(|x| x * x).sum::<f32>() + 1e-6)
                    .sqrt()
                    .recip()
                    * q_scale;
                head.iter_mut().for_each(|x| *x *= r);
            }
            for head in keys.chunks_mut(dk) {
                let r = (head.iter().map(|x| x * x).sum::<f32>() + 1e-6)
                    .sqrt()
                    .recip();
                head.iter_mut().for_each(|x| *x *= r);
            }
            // each value head on its own slice of the state and of the output: in parallel
            // when the heads' states are large (a real model's: 16 KiB and up each)
            let head = |(hv, (sh, o)): (usize, (&mut [f32], &mut [f32]))| {
                let kh = hv / per_key;
                let (qh, kh) = (&q[kh * dk..][..dk], &keys[kh * dk..][..dk]);
                let vh = &v[hv * dv..][..dv];
                let beta = 1.0 / (1.0 + (-bs[hv]).exp());
                let decay = (self.rate[hv] * softplus_f32(as_[hv] + self.dt_bias[hv])).exp();
                // S *= exp(g); o = S^T k for now (what the state remembers of k)
                o.fill(0.0);
                for (srow, &ki) in sh.chunks_mut(dv).zip(kh) {
                    for (sv, m) in srow.iter_mut().zip(o.iter_mut()) {
                        *sv *= decay;
                        *m += *sv * ki;
                    }
                }
                // delta = beta (v - S^T k); S += k delta^T; o = S^T q
                // (on the stack for a real model's head size: this runs per token and head)
                let (mut stack, mut heap) = ([0f32; 256], Vec::new());
                let delta: &mut [f32] = if dv <= stack.len() {
                    &mut stack[..dv]
                } else {
                    heap.resize(dv, 0.0);
                    &mut heap
                };
                for ((d, m), vj) in delta.iter_mut().zip(o.iter()).zip(vh) {
                    *d = (vj - m) * beta;
                }
                o.fill(0.0);
                for ((srow, &ki), &qi) in sh.chunks_mut(dv).zip(kh).zip(qh) {
                    for ((sv, d), o) in srow.iter_mut().zip(delta.iter()).zip(o.iter_mut()) {
                        *sv += ki * d;
                        *o += *sv * qi;
                    }
                }
                // the gated norm: rmsnorm(o) * w * silu(z)
                let r = inv_rms(o, self.eps);
                for ((o, w), z) in o.iter_mut().zip(&self.norm).zip(&z[hv * dv..][..dv]) {
                    *o = *o * r * w * (z / (1.0 + (-z).exp()));
                }
            };
            let heads = s.par_chunks_mut(dk * dv).zip(y.par_chunks_mut(dv));
            if dk * dv >= PARALLEL_HEAD_STATE {
                heads.enumerate().for_each(head);
            } else {
                heads.enumerate().with_min_len(nv).for_each(head);
            }
        }
    }
}

/// A value head's state (values) from which the heads of one token run in parallel.
const PARALLEL_HEAD_STATE: usize = 4096;

/// `log(1 + exp(x))` on a value (PyTorch's threshold: `x` above 20).
fn softplus_f32(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// The candle operations of [`l2norm`]: square, sum, + eps, sqrt, divide.
const L2NORM_OPS: u64 = 5;

/// The candle operations of [`softplus`]: relu, abs, neg, exp, + 1, log, sum.
const SOFTPLUS_OPS: u64 = 7;

/// What the delta rule issues for a sequence of `len` tokens (the recurrent form for one token,
/// the chunked form for more), with or without a state to start from: the buffers of the graph
/// candle records for a run on small inputs of the same length (the count depends on the length
/// and the chunking, not on the head sizes), each one operation. Counted once per (length,
/// state) and kept. The chunked form's constants (its masks, identity and zero padding) are
/// outside the graph and not counted: a lower bound there, of prompts only.
pub fn delta_rule_cost(len: usize, with_state: bool) -> Result<Cost> {
    thread_local! {
        static KNOWN: std::cell::RefCell<std::collections::HashMap<(usize, bool), Cost>> =
            std::cell::RefCell::default();
    }
    if let Some(c) = KNOWN.with(|k| k.borrow().get(&(len, with_state)).copied()) {
        return Ok(c);
    }
    let dev = Device::Cpu;
    let (nv, dk, dv) = (2, 2, 3);
    let var = |shape: &[usize]| candle_core::Var::zeros(shape, DType::F32, &dev);
    let (q, k, v) = (
        var(&[nv, len, dk])?,
        var(&[nv, len, dk])?,
        var(&[nv, len, dv])?,
    );
    let (g, beta, s0) = (var(&[nv, len])?, var(&[nv, len])?, var(&[nv, dk, dv])?);
    let s0 = with_state.then_some(s0.as_tensor());
    let (o, s) = if len <= RECURRENT_MAX {
        delta_rule_recurrent(&q, &k, &v, &g, &beta, s0)?
    } else {
        delta_rule_chunked(&q, &k, &v, &g, &beta, s0)?
    };
    // (the zero state a run without one starts from is a constant, outside the graph)
    let zero_state = Cost::kernels(u64::from(!with_state && len <= RECURRENT_MAX));
    let c = super::super::cost::graph_cost(&[&o, &s]) + zero_state;
    KNOWN.with(|k| k.borrow_mut().insert((len, with_state), c));
    Ok(c)
}

/// `x * rsqrt(sum(x^2) + 1e-6)` over the last dim.
fn l2norm(x: &Tensor) -> Result<Tensor> {
    x.broadcast_div(&(x.sqr()?.sum_keepdim(D::Minus1)? + 1e-6)?.sqrt()?)
}

/// `log(1 + exp(x))`, as `max(x, 0) + log(1 + exp(-|x|))` (no overflow).
fn softplus(x: &Tensor) -> Result<Tensor> {
    x.relu()? + (x.abs()?.neg()?.exp()? + 1.0)?.log()?
}

/// The zero state (Hv, dk, dv) of `k`: (Hv, L, dk) and `v`: (Hv, L, dv).
fn zero_state(k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let (nv, _, dk) = k.dims3()?;
    Tensor::zeros((nv, dk, v.dim(2)?), DType::F32, k.device())
}

/// The gated delta rule token by token. `q`, `k`: (Hv, L, dk); `v`: (Hv, L, dv); `g`, `beta`:
/// (Hv, L); `s0`: (Hv, dk, dv) or zeros. Returns the outputs (Hv, L, dv) and the final state.
pub fn delta_rule_recurrent(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    s0: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let mut s = match s0 {
        Some(s) => s.clone(),
        None => zero_state(k, v)?,
    };
    let len = q.dim(1)?;
    let mut outs = Vec::with_capacity(len);
    for t in 0..len {
        let (q_t, k_t, v_t) = (q.narrow(1, t, 1)?, k.narrow(1, t, 1)?, v.narrow(1, t, 1)?);
        let decay = g.narrow(1, t, 1)?.exp()?.unsqueeze(2)?; // (Hv, 1, 1)
        s = s.broadcast_mul(&decay)?;
        let remembered = k_t.matmul(&s)?; // (Hv, 1, dv)
        let delta = (v_t - remembered)?.broadcast_mul(&beta.narrow(1, t, 1)?.unsqueeze(2)?)?;
        s = (s + k_t.transpose(1, 2)?.matmul(&delta)?)?;
        outs.push(q_t.matmul(&s)?);
    }
    Ok((Tensor::cat(&outs, 1)?, s))
}

/// The gated delta rule in chunks of [`CHUNK`] tokens (the sequence zero-padded to whole
/// chunks: a padded token has k = v = 0 and g = 0, so it leaves the state as it is). Same
/// arguments and results as [`delta_rule_recurrent`].
pub fn delta_rule_chunked(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    s0: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let (nv, len, dk) = q.dims3()?;
    let dv = v.dim(2)?;
    let c = CHUNK.min(len.max(1));
    let chunks = len.div_ceil(c);
    let pad = chunks * c - len;
    let dev = q.device();
    let padded = |x: &Tensor| -> Result<Tensor> {
        if pad == 0 {
            return Ok(x.clone());
        }
        let mut shape = x.dims().to_vec();
        shape[1] = pad;
        Tensor::cat(&[x, &Tensor::zeros(shape, DType::F32, dev)?], 1)
    };
    let in_chunks = |x: &Tensor, d: usize| padded(x)?.reshape((nv, chunks, c, d));
    let beta = padded(beta)?.reshape((nv, chunks, c, 1))?;
    let (q, k, v) = (in_chunks(q, dk)?, in_chunks(k, dk)?, in_chunks(v, dv)?);
    let k_beta = k.broadcast_mul(&beta)?;
    let v_beta = v.broadcast_mul(&beta)?;
    // cumulative log decay within each chunk, and the pairwise decay exp(gc_i - gc_j), j <= i
    let gc = padded(g)?.reshape((nv, chunks, c))?.cumsum(2)?;
    let lower = causal(c, 0, dev)?; // j <= i
    let strict = causal(c, 1, dev)?; // j < i
    let diff = gc.unsqueeze(3)?.broadcast_sub(&gc.unsqueeze(2)?)?;
    // (j > i: gc_i - gc_j >= 0 since g <= 0; zeroed before exp, so nothing overflows)
    let decay = diff.broadcast_mul(&lower)?.exp()?.broadcast_mul(&lower)?;
    // T = (I + L)^-1 for L = strict_lower(k_beta k^T * decay)
    let l = k_beta
        .matmul(&k.transpose(2, 3)?)?
        .mul(&decay)?
        .broadcast_mul(&strict)?;
    let t = unit_lower_inverse(&(l.broadcast_add(&Tensor::eye(c, DType::F32, dev)?))?)?;
    let values = t.matmul(&v_beta)?;
    let k_cumdecay = t.matmul(&k_beta.broadcast_mul(&gc.exp()?.unsqueeze(3)?)?)?;
    let mut s = match s0 {
        Some(s) => s.clone(),
        None => Tensor::zeros((nv, dk, dv), DType::F32, dev)?,
    };
    let mut outs = Vec::with_capacity(chunks);
    for i in 0..chunks {
        let at = |x: &Tensor| x.narrow(1, i, 1)?.squeeze(1);
        let (q_i, k_i, gc_i) = (at(&q)?, at(&k)?, at(&gc)?);
        let within = q_i.matmul(&k_i.transpose(1, 2)?)?.mul(&at(&decay)?)?;
        let v_new = (at(&values)? - at(&k_cumdecay)?.matmul(&s)?)?;
        let from_state = q_i.broadcast_mul(&gc_i.exp()?.unsqueeze(2)?)?.matmul(&s)?;
        outs.push((from_state + within.matmul(&v_new)?)?);
        let last = gc_i.narrow(1, c - 1, 1)?; // (Hv, 1)
        let k_decayed = k_i.broadcast_mul(&last.broadcast_sub(&gc_i)?.exp()?.unsqueeze(2)?)?;
        s = (s.broadcast_mul(&last.exp()?.unsqueeze(2)?)?
            + k_decayed.transpose(1, 2)?.matmul(&v_new)?)?;
    }
    let o = Tensor::cat(&outs, 1)?.narrow(1, 0, len)?;
    Ok((o, s))
}

/// The inverse of unit lower-triangular matrices `m` (..., n, n), by halves:
/// `[[A, 0], [B, D]]^-1 = [[A^-1, 0], [-D^-1 B A^-1, D^-1]]`. Exact like forward substitution,
/// and its backward pass keeps O(n^2 log n) values per matrix where substitution row by row keeps
/// O(n^3).
fn unit_lower_inverse(m: &Tensor) -> Result<Tensor> {
    let n = m.dim(D::Minus1)?;
    if n == 1 {
        return m.ones_like();
    }
    let h = n / 2;
    let rows = |x: &Tensor, at, len| x.narrow(D::Minus2, at, len);
    let (top, bottom) = (rows(m, 0, h)?, rows(m, h, n - h)?);
    let a = unit_lower_inverse(&top.narrow(D::Minus1, 0, h)?.contiguous()?)?;
    let d = unit_lower_inverse(&bottom.narrow(D::Minus1, h, n - h)?.contiguous()?)?;
    let b = bottom.narrow(D::Minus1, 0, h)?.contiguous()?;
    let c = d.matmul(&b)?.matmul(&a)?.neg()?;
    let mut shape = a.dims().to_vec();
    shape[a.rank() - 1] = n - h;
    let zeros = Tensor::zeros(shape, a.dtype(), a.device())?;
    let upper = Tensor::cat(&[&a, &zeros], D::Minus1)?;
    let lower = Tensor::cat(&[&c, &d], D::Minus1)?;
    Tensor::cat(&[&upper, &lower], D::Minus2)
}

/// (C, C) f32: 1 where `j + shift <= i`, else 0 (`shift` 0: causal; 1: strictly causal).
fn causal(c: usize, shift: usize, dev: &Device) -> Result<Tensor> {
    let m: Vec<f32> = (0..c * c)
        .map(|n| if n % c + shift <= n / c { 1.0 } else { 0.0 })
        .collect();
    Tensor::from_vec(m, (c, c), dev)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::attention::RecurrentStep;
    use crate::model::tests::{fixture_named, max_abs_diff};

    /// Inputs as the layer makes them: unit keys and queries (queries scaled), decays g <= 0,
    /// beta in (0, 1), and a non-zero starting state.
    fn inputs(nv: usize, len: usize, dk: usize, dv: usize) -> [Tensor; 6] {
        let dev = Device::Cpu;
        let r = |shape: &[usize]| Tensor::randn(0f32, 1.0, shape, &dev).unwrap();
        let q = (l2norm(&r(&[nv, len, dk])).unwrap() * (1.0 / (dk as f64).sqrt())).unwrap();
        let k = l2norm(&r(&[nv, len, dk])).unwrap();
        let v = r(&[nv, len, dv]);
        let g = (softplus(&r(&[nv, len])).unwrap() * -0.3).unwrap();
        let beta = candle_nn::ops::sigmoid(&r(&[nv, len])).unwrap();
        let s0 = (r(&[nv, dk, dv]) * 0.5).unwrap();
        [q, k, v, g, beta, s0]
    }

    #[test]
    fn chunked_and_recurrent_forms_agree() {
        // one partial chunk, whole chunks, and whole chunks plus a padded one; dk != dv
        for len in [5, 2 * CHUNK, 2 * CHUNK + 7] {
            let [q, k, v, g, beta, s0] = inputs(3, len, 8, 12);
            for s0 in [None, Some(&s0)] {
                let (o_r, s_r) = delta_rule_recurrent(&q, &k, &v, &g, &beta, s0).unwrap();
                let (o_c, s_c) = delta_rule_chunked(&q, &k, &v, &g, &beta, s0).unwrap();
                assert_eq!(o_r.dims(), &[3, len, 12]);
                assert_eq!(o_c.dims(), o_r.dims());
                let (d_o, d_s) = (max_abs_diff(&o_r, &o_c), max_abs_diff(&s_r, &s_c));
                assert!(
                    d_o < 1e-4 && d_s < 1e-4,
                    "len {len}: outputs {d_o}, states {d_s}"
                );
            }
        }
    }

    /// A backend with one sequence whose state it keeps between steps.
    struct Keep {
        len: usize,
        state: Option<Tensor>,
    }

    impl AttentionBackend for Keep {
        fn attend(
            &mut self,
            _: usize,
            _: &Tensor,
            _: &Tensor,
            _: &Tensor,
            _: Option<usize>,
        ) -> Result<Tensor> {
            unreachable!("no attention layer here")
        }
        fn recurrent_state(&mut self, _: usize, values: usize) -> Result<RecurrentStep> {
            if let Some(s) = &self.state {
                assert_eq!(s.dims(), &[1, values]);
            }
            Ok(RecurrentStep {
                seq_lens: vec![self.len],
                state: self.state.clone(),
            })
        }
        fn store_recurrent_state(&mut self, _: usize, state: Tensor) -> Result<()> {
            self.state = Some(state);
            Ok(())
        }
    }

    #[test]
    fn a_step_continues_where_the_last_ended() {
        let Some(dir) = fixture_named("tiny-qwen3_5") else {
            return;
        };
        let ck = crate::model::Checkpoint::open(dir.to_str().unwrap()).unwrap();
        // SAFETY: the fixture is read-only for the test's life.
        let vb = unsafe {
            VarBuilder::from_mmaped_safetensors(&ck.weights, DType::F32, &Device::Cpu).unwrap()
        };
        let layer = GatedDeltaNet::new(&ck.config, vb.pp("model.language_model.layers.0")).unwrap();
        let h = Tensor::randn(0f32, 1.0, (20, ck.config.hidden_size), &Device::Cpu).unwrap();
        let run = |parts: &[usize]| -> (Tensor, Tensor) {
            let mut b = Keep {
                len: 0,
                state: None,
            };
            let mut outs = Vec::new();
            let mut start = 0;
            for &n in parts {
                b.len = n;
                let x = h.narrow(0, start, n).unwrap();
                outs.push(layer.forward(0, &x, Exec::Differentiable, &mut b).unwrap());
                start += n;
            }
            (Tensor::cat(&outs, 0).unwrap(), b.state.unwrap())
        };
        let (whole, state) = run(&[20]);
        // a prefill in two chunks, and a prefill followed by decode steps (the recurrent form)
        for parts in [&[13, 7][..], &[16, 1, 1, 1, 1]] {
            let (got, s) = run(parts);
            assert!(max_abs_diff(&whole, &got) < 1e-5, "{parts:?}");
            assert!(max_abs_diff(&state, &s) < 1e-5, "{parts:?}");
        }
    }
}
