//! The Gated DeltaNet's layer ops on candle (what `super::candle_ops::CandleOps` runs): its input
//! projections, the step's states from the backend, the conv update and the delta rule with its
//! gated norm, whose maths `model::layers::gated_deltanet` states. On any device, differentiable:
//! two forms of the delta rule, equal up to float rounding, [`delta_rule_recurrent`] (token by
//! token: decode) and [`delta_rule_chunked`] (chunks of [`CHUNK`] tokens in a few matmuls:
//! prompts and training), following transformers' `models/qwen3_5`
//! (`torch_chunk_gated_delta_rule`), in f32 whatever the model's dtype. Sampling on a GPU runs
//! the two kernels of `crate::cuda::gated_deltanet` instead (decode steps and prompts alike),
//! after one stacked input projection, on the states in place: in the backend's pool of state
//! slots when it has one, else in the step's copy.
//!
//! Each op declares the candle operations it issues, as the rest of the candle ops do. Knows
//! nothing of where states are kept (the backend's) or of weights' names.

use candle_core::{DType, Device, Result, Tensor, D};
use candle_nn::Linear;

use super::super::attention::AttentionBackend;
use super::super::config::LinearAttention;
use super::super::cost::{Cost, CountMode};
use super::super::ops::{cat_cost, copy_cost, project_counted, stack_linears, Exec, RmsNorm};
use crate::cuda::shapes::GdnShape;

/// Tokens per chunk of the chunked form (transformers' default).
pub const CHUNK: usize = 64;

/// Sequences of at most this many tokens in a step run the recurrent form.
const RECURRENT_MAX: usize = 1;

/// A Gated DeltaNet's input projections.
#[derive(Debug, Clone)]
pub struct CandleDeltaIn {
    pub qkv: Linear,
    pub z: Linear,
    pub b: Linear,
    pub a: Linear,
    /// For sampling through the GPU kernels: the four as one matrix, so that a step runs one
    /// matmul where it ran four, and the kernels read the rows' parts in place; the separate
    /// projections above become views of it.
    pub stacked: Option<Linear>,
}

impl CandleDeltaIn {
    /// Stacks the four projections into one matrix (the separate ones become views of it).
    pub fn stack(&mut self) -> Result<()> {
        if self.stacked.is_none() {
            let (all, v) = stack_linears(&[&self.qkv, &self.z, &self.b, &self.a])?;
            (self.qkv, self.z, self.b, self.a) =
                (v[0].clone(), v[1].clone(), v[2].clone(), v[3].clone());
            self.stacked = Some(all);
        }
        Ok(())
    }
}

/// What they give, in the model's dtype: qkv (T, conv_dim), z (T, value_dim), b and a (T, Hv).
#[derive(Debug, Clone)]
pub struct CandleDeltaRows {
    pub qkv: Tensor,
    pub z: Tensor,
    pub b: Tensor,
    pub a: Tensor,
}

/// A Gated DeltaNet's other weights, as stored.
#[derive(Debug, Clone)]
pub struct CandleDeltaNet {
    /// (conv_dim, 1, K).
    pub conv: Tensor,
    pub a_log: Tensor,
    pub dt_bias: Tensor,
    /// The gated output norm over a value head (a plain `w` scale, not zero-centred).
    pub norm: RmsNorm,
    pub shape: LinearAttention,
}

/// A layer's states for a step.
pub struct CandleDeltaState<'b> {
    backend: &'b mut dyn AttentionBackend,
    layer: usize,
    seq_lens: Vec<usize>,
    path: StatePath,
}

enum StatePath {
    /// Candle's ops, a sequence at a time: each sequence's state at the start (`None`: all
    /// zeros), then its conv inputs and heads' states at the end as the ops make them.
    Composed {
        start: Option<Tensor>,
        windows: Vec<Tensor>,
        heads: Vec<Tensor>,
    },
    /// The GPU's kernels on the step's states (f32), updated in place: rows `ids` of the
    /// backend's pool (`pooled`), or the step's own copy, row by sequence. `dry`: counting a
    /// GPU's step on a machine without one (the kernels' cost declared, their outputs zeros).
    /// The rows' ids and the sequence starts are read by the kernels' launch alone.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Kernels {
        shape: GdnShape,
        states: Tensor,
        ids: Option<Tensor>,
        starts: Option<Tensor>,
        pooled: bool,
        dry: bool,
    },
}

/// Whether a sampling step runs our GPU kernels on rows like `x` (sampling, on a GPU or counted
/// as one, in f32 or bf16): `Some(dry)`, `dry` when counting a GPU's step on a machine without
/// one (the kernels' cost declared, their outputs zeros); `None` for candle's ops. The one
/// decision every fused sampling op of the candle layer ops takes.
pub(super) fn our_gpu_kernels(exec: Exec, count: CountMode, x: &Tensor) -> Option<bool> {
    let dry = count == CountMode::AsCuda && !x.device().is_cuda();
    let gpu = exec == Exec::Sampling && (x.device().is_cuda() || dry);
    (gpu && matches!(x.dtype(), DType::F32 | DType::BF16)).then_some(dry)
}

/// The GPU kernels' shape for a layer, when they take it.
pub fn kernel_shape(w: &CandleDeltaNet) -> Option<GdnShape> {
    let l = w.shape;
    let shape = GdnShape {
        nk: l.num_key_heads,
        nv: l.num_value_heads,
        dk: l.key_head_dim,
        dv: l.value_head_dim,
        conv_kernel: l.conv_kernel,
        eps: w.norm.eps,
    };
    (shape.supported() && !w.norm.offset).then_some(shape)
}

/// A cast to f32 is an op below f32.
fn cast_cost(dtype: DType) -> Cost {
    Cost::kernels(u64::from(dtype != DType::F32))
}

/// Where the ops run and what they have spent (the candle implementation's state).
pub struct Run<'a> {
    pub exec: Exec,
    pub count: CountMode,
    pub spent: &'a mut Cost,
}

impl Run<'_> {
    /// Whether the GPU's kernels run this layer for rows like `x`: sampling, on a GPU or
    /// counted as one, in f32 or bf16 (the stacked input projection goes with them).
    fn gpu_kernels(&self, x: &Tensor) -> bool {
        our_gpu_kernels(self.exec, self.count, x).is_some()
    }

    pub fn deltanet_in(&mut self, h: Tensor, w: &CandleDeltaIn) -> Result<CandleDeltaRows> {
        let kernels = self.gpu_kernels(&h);
        let (exec, spent) = (self.exec, &mut *self.spent);
        if let (Some(all), true) = (&w.stacked, kernels) {
            // one matmul; the kernels read each part of its rows in place
            let y = project_counted(all, &h, exec, spent)?;
            let mut at = 0;
            let mut part = |l: &Linear| -> Result<Tensor> {
                let n = l.weight().dim(0)?;
                at += n;
                y.narrow(1, at - n, n)
            };
            return Ok(CandleDeltaRows {
                qkv: part(&w.qkv)?,
                z: part(&w.z)?,
                b: part(&w.b)?,
                a: part(&w.a)?,
            });
        }
        Ok(CandleDeltaRows {
            qkv: project_counted(&w.qkv, &h, exec, spent)?,
            z: project_counted(&w.z, &h, exec, spent)?,
            b: project_counted(&w.b, &h, exec, spent)?,
            a: project_counted(&w.a, &h, exec, spent)?,
        })
    }

    pub fn deltanet_state<'b>(
        &mut self,
        layer: usize,
        x: &CandleDeltaRows,
        w: &CandleDeltaNet,
        backend: &'b mut dyn AttentionBackend,
    ) -> Result<CandleDeltaState<'b>> {
        let l = w.shape;
        let t = x.qkv.dim(0)?;
        let check = |seq_lens: &[usize]| -> Result<()> {
            if seq_lens.iter().sum::<usize>() != t {
                candle_core::bail!(
                    "layer {layer}: {t} tokens, but the step's sequences bring {seq_lens:?}"
                )
            }
            Ok(())
        };
        // sampling on a GPU: the kernels record no backward pass
        let dry = self.count == CountMode::AsCuda && !x.qkv.device().is_cuda();
        let kernels = kernel_shape(w).filter(|_| self.gpu_kernels(&x.qkv));
        if let Some(shape) = kernels {
            if let Some(p) = backend.recurrent_pool(layer, l.state_values())? {
                *self.spent += backend.take_cost();
                check(&p.seq_lens)?;
                return Ok(CandleDeltaState {
                    backend,
                    layer,
                    seq_lens: p.seq_lens,
                    path: StatePath::Kernels {
                        shape,
                        states: p.pool,
                        ids: Some(p.ids),
                        starts: p.starts,
                        pooled: true,
                        dry,
                    },
                });
            }
        }
        let step = backend.recurrent_state(layer, l.state_values())?;
        *self.spent += backend.take_cost();
        check(&step.seq_lens)?;
        let path = match kernels {
            Some(shape) => {
                // the kernels update the states in place: a copy unless it is the step's own
                let states = match &step.state {
                    Some(s) => {
                        *self.spent += cast_cost(s.dtype()) + copy_cost(s);
                        s.to_dtype(DType::F32)?.contiguous()?
                    }
                    None => {
                        *self.spent += Cost::kernels(1);
                        Tensor::zeros(
                            (step.seq_lens.len(), l.state_values()),
                            DType::F32,
                            x.qkv.device(),
                        )?
                    }
                };
                let starts = super::super::attention::seq_starts(&step.seq_lens);
                if starts.is_some() {
                    *self.spent += Cost::UPLOAD;
                }
                let starts = starts
                    .map(|s| Tensor::new(s.as_slice(), x.qkv.device()))
                    .transpose()?;
                StatePath::Kernels {
                    shape,
                    states,
                    ids: None,
                    starts,
                    pooled: false,
                    dry,
                }
            }
            None => StatePath::Composed {
                start: step.state,
                windows: Vec::new(),
                heads: Vec::new(),
            },
        };
        Ok(CandleDeltaState {
            backend,
            layer,
            seq_lens: step.seq_lens,
            path,
        })
    }

    pub fn conv_update(
        &mut self,
        x: &CandleDeltaRows,
        w: &CandleDeltaNet,
        st: &mut CandleDeltaState<'_>,
    ) -> Result<Tensor> {
        let l = w.shape;
        let (conv_len, k1) = (l.conv_dim() * (l.conv_kernel - 1), l.conv_kernel - 1);
        let seqs = st.seq_lens.len();
        let (start, windows) = match &mut st.path {
            StatePath::Kernels { .. } => {
                *self.spent += Cost::kernels(1);
                return conv_kernel(&st.path, seqs, &x.qkv, &w.conv);
            }
            StatePath::Composed { start, windows, .. } => (start.as_ref(), windows),
        };
        let spent = &mut *self.spent;
        let cast = cast_cost(x.qkv.dtype());
        let qkv = x.qkv.to_dtype(DType::F32)?;
        let conv_w = w.conv.squeeze(1)?.to_dtype(DType::F32)?.t()?; // (K, conv_dim)
        *spent += cast * 2;
        let n = st.seq_lens.len();
        let conv = |padded: &Tensor, len: usize, spent: &mut Cost| -> Result<Tensor> {
            // padded: (.., K-1+L, conv_dim); K products and K-1 sums; SiLU
            let d = padded.rank() - 2;
            let mut conv = padded.narrow(d, 0, len)?.broadcast_mul(&conv_w.get(0)?)?;
            for j in 1..l.conv_kernel {
                conv = (conv + padded.narrow(d, j, len)?.broadcast_mul(&conv_w.get(j)?)?)?;
            }
            *spent += Cost::kernels(2 * l.conv_kernel as u64);
            candle_nn::ops::silu(&conv)
        };
        // sequences of one length (a decode step, rows of a batch): all at once
        if let Some(&len) = st
            .seq_lens
            .first()
            .filter(|_| n > 1 && st.seq_lens.iter().all(|&m| m == st.seq_lens[0]))
        {
            let conv0 = match start {
                Some(st) => {
                    let view = st.narrow(1, 0, conv_len)?;
                    *spent += copy_cost(&view);
                    view.reshape((n, k1, l.conv_dim()))?
                }
                None => {
                    *spent += Cost::kernels(1);
                    Tensor::zeros((n, k1, l.conv_dim()), DType::F32, qkv.device())?
                }
            };
            *spent += cat_cost(2);
            let x = qkv.reshape((n, len, l.conv_dim()))?;
            let padded = Tensor::cat(&[&conv0, &x], 1)?; // (n, K-1+L, conv_dim)
            let u = conv(&padded, len, spent)?;
            let ends = padded.narrow(1, len, k1)?;
            for s in 0..n {
                windows.push(ends.get(s)?.flatten_all()?);
            }
            return u.reshape((n * len, l.conv_dim()));
        }
        let mut outs = Vec::with_capacity(n);
        let mut at = 0;
        for (s, &len) in st.seq_lens.iter().enumerate() {
            let conv0 = match start {
                Some(st) => st
                    .get(s)?
                    .narrow(0, 0, conv_len)?
                    .reshape((k1, l.conv_dim()))?,
                None => {
                    *spent += Cost::kernels(1);
                    Tensor::zeros((k1, l.conv_dim()), DType::F32, qkv.device())?
                }
            };
            let padded = Tensor::cat(&[&conv0, &qkv.narrow(0, at, len)?], 0)?; // (K-1+L, conv_dim)
            *spent += cat_cost(2);
            outs.push(conv(&padded, len, spent)?);
            windows.push(padded.narrow(0, len, k1)?.flatten_all()?);
            at += len;
        }
        if n > 1 {
            *spent += cat_cost(n as u64);
        }
        Tensor::cat(&outs, 0)
    }

    pub fn delta_rule(
        &mut self,
        u: Tensor,
        x: CandleDeltaRows,
        w: &CandleDeltaNet,
        st: &mut CandleDeltaState<'_>,
    ) -> Result<Tensor> {
        let l = w.shape;
        let seqs = st.seq_lens.len();
        let (start, heads) = match &mut st.path {
            StatePath::Kernels { .. } => {
                *self.spent += Cost::kernels(1);
                return recurrent_kernel(&st.path, seqs, &u, &x, w);
            }
            StatePath::Composed { start, heads, .. } => (start.as_ref(), heads),
        };
        let (exec, count, spent) = (self.exec, self.count, &mut *self.spent);
        let dtype = x.z.dtype();
        let cast = cast_cost(dtype);
        let f32 = |x: &Tensor| x.to_dtype(DType::F32);
        let beta = candle_nn::ops::sigmoid(&f32(&x.b)?)?;
        let rate = f32(&w.a_log)?.exp()?.neg()?; // -exp(A_log)
        let g = softplus(&f32(&x.a)?.broadcast_add(&f32(&w.dt_bias)?)?)?.broadcast_mul(&rate)?;
        // four casts; sigmoid; exp, neg; add, softplus, multiply
        *spent += cast * 4 + Cost::kernels(1 + 2 + 2 + SOFTPLUS_OPS);
        let conv_len = l.conv_dim() * (l.conv_kernel - 1);
        let mut outs = Vec::with_capacity(st.seq_lens.len());
        let mut at = 0;
        for (s, &len) in st.seq_lens.iter().enumerate() {
            let s0 = match start {
                Some(st) => Some(
                    st.get(s)?
                        .narrow(0, conv_len, l.state_values() - conv_len)?
                        .reshape((l.num_value_heads, l.key_head_dim, l.value_head_dim))?,
                ),
                None => None,
            };
            let (q, k, v) = split_heads(l, &u.narrow(0, at, len)?, spent)?;
            let (g_s, beta_s) = (g.narrow(0, at, len)?.t()?, beta.narrow(0, at, len)?.t()?);
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
                x.z.narrow(0, at, len)?
                    .reshape((len, l.num_value_heads, l.value_head_dim))?;
            let normed = w.norm.forward_counted(&o, exec, spent)?;
            let y = (normed * candle_nn::ops::silu(&z_s)?)?;
            outs.push(y.reshape((len, l.value_dim()))?);
            heads.push(s1.flatten_all()?);
            // SiLU, the gate's product
            *spent += Cost::kernels(2);
            at += len;
        }
        if outs.len() > 1 {
            *spent += cat_cost(outs.len() as u64);
        }
        Tensor::cat(&outs, 0)
    }

    pub fn store_deltanet_state(&mut self, st: CandleDeltaState<'_>) -> Result<()> {
        let CandleDeltaState {
            backend,
            layer,
            path,
            ..
        } = st;
        let state = match path {
            // the kernels wrote the states where the backend keeps them
            StatePath::Kernels { pooled: true, .. } => return Ok(()),
            StatePath::Kernels { states, .. } => states,
            StatePath::Composed { windows, heads, .. } => {
                let rows = windows
                    .iter()
                    .zip(&heads)
                    .map(|(c, s)| Tensor::cat(&[c, s], 0))
                    .collect::<Result<Vec<_>>>()?;
                // each sequence's join, and the stack of them
                *self.spent += cat_cost(2) * rows.len() as u64;
                if rows.len() > 1 {
                    *self.spent += cat_cost(rows.len() as u64);
                }
                Tensor::stack(&rows, 0)?
            }
        };
        backend.store_recurrent_state(layer, state)?;
        *self.spent += backend.take_cost();
        Ok(())
    }
}

/// The kernels' view of a step's states (`path` is [`StatePath::Kernels`]).
#[cfg(feature = "cuda")]
fn gdn_step(
    path: &StatePath,
    seqs: usize,
) -> Result<(GdnShape, crate::cuda::gated_deltanet::GdnStep<'_>)> {
    let StatePath::Kernels {
        shape,
        states,
        ids,
        starts,
        ..
    } = path
    else {
        candle_core::bail!("the Gated DeltaNet kernels on composed states")
    };
    let step = crate::cuda::gated_deltanet::GdnStep {
        states,
        ids: ids.as_ref(),
        starts: starts.as_ref(),
        seqs,
    };
    Ok((*shape, step))
}

/// The GPU kernels' shape, and whether they only count (`path` is [`StatePath::Kernels`]).
fn kernel_path(path: &StatePath) -> Result<(GdnShape, bool)> {
    match path {
        StatePath::Kernels { shape, dry, .. } => Ok((*shape, *dry)),
        StatePath::Composed { .. } => {
            candle_core::bail!("the Gated DeltaNet kernels on composed states")
        }
    }
}

/// The conv kernel of a GPU step on `qkv` (T, conv_dim) of `seqs` sequences: its output
/// (T, conv_dim) f32, each sequence's conv inputs moved on in place.
fn conv_kernel(path: &StatePath, seqs: usize, qkv: &Tensor, conv: &Tensor) -> Result<Tensor> {
    let (shape, dry) = kernel_path(path)?;
    if dry {
        return Tensor::zeros((qkv.dim(0)?, shape.conv_dim()), DType::F32, qkv.device());
    }
    #[cfg(feature = "cuda")]
    {
        let (shape, step) = gdn_step(path, seqs)?;
        crate::cuda::gated_deltanet::conv_step(&shape, qkv, &conv.squeeze(1)?, &step)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (seqs, conv);
        candle_core::bail!("the Gated DeltaNet kernels need a build with the cuda feature")
    }
}

/// The recurrent kernel of a GPU step: the gated norm's output (T, value_dim) in the model's
/// dtype, the heads' states updated in place.
fn recurrent_kernel(
    path: &StatePath,
    seqs: usize,
    u: &Tensor,
    x: &CandleDeltaRows,
    w: &CandleDeltaNet,
) -> Result<Tensor> {
    let (shape, dry) = kernel_path(path)?;
    if dry {
        return Tensor::zeros((u.dim(0)?, shape.nv * shape.dv), x.z.dtype(), u.device());
    }
    #[cfg(feature = "cuda")]
    {
        use crate::cuda::gated_deltanet::{recurrent_step, GdnRecurrent};
        let (shape, step) = gdn_step(path, seqs)?;
        let r = GdnRecurrent {
            u,
            a: &x.a,
            b: &x.b,
            z: &x.z,
            a_log: &w.a_log,
            dt_bias: &w.dt_bias,
            norm_w: &w.norm.weight,
        };
        recurrent_step(&shape, &r, &step)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (seqs, w);
        candle_core::bail!("the Gated DeltaNet kernels need a build with the cuda feature")
    }
}

/// The conv's output (L, conv_dim) as heads-first f32 q, k (Hv, L, dk), l2-normalised, q
/// scaled by 1/sqrt(dk), both repeated to the value heads, and v (Hv, L, dv).
fn split_heads(
    l: LinearAttention,
    u: &Tensor,
    spent: &mut Cost,
) -> Result<(Tensor, Tensor, Tensor)> {
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
    use crate::model::tests::max_abs_diff;

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
}
