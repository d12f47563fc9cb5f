//! The Gated DeltaNet's layer ops on the CPU sampler's host path (what
//! `super::host_ops::HostOps` runs, on its buffers),
//! the maths `model::layers::gated_deltanet` states: the four input projections stacked and
//! packed, the states lent in place by a backend that keeps them on the host (copied out and
//! back otherwise), the conv update and the recurrent form of the delta rule token by token on
//! each sequence's own state, so a row's values do not depend on the other rows of the step (the
//! sampler's batch-invariance promise). Sequences run in parallel, and a token's heads too when
//! their states are large. Inference only.
//!
//! Knows nothing of where states are kept or of weights' names.

use candle_core::{Device, Result, Tensor};
use rayon::prelude::*;

use super::super::attention::AttentionBackend;
use super::super::config::LinearAttention;
use super::super::cost::Cost;
use super::super::packed::inv_rms;

/// A Gated DeltaNet's other weights as host values.
#[derive(Debug, Clone)]
pub struct HostDeltaNet {
    /// (conv_dim, K), row-major.
    pub conv: Vec<f32>,
    /// `-exp(A_log)` per value head.
    pub rate: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// The gated norm's scale (dv).
    pub norm: Vec<f32>,
    pub eps: f32,
    pub shape: LinearAttention,
}

impl HostDeltaNet {
    /// The stacked projections' row: qkv | z | b | a.
    fn width(&self) -> usize {
        let l = self.shape;
        l.conv_dim() + l.value_dim() + 2 * l.num_value_heads
    }
}

/// A layer's states for a step: lent by the backend, or copied out of its tensors (and stored
/// back at the end).
pub enum HostDeltaState<'b> {
    Lent {
        seq_lens: Vec<usize>,
        states: Vec<&'b mut [f32]>,
    },
    Copied {
        seq_lens: Vec<usize>,
        /// (sequences, values), row-major.
        flat: Vec<f32>,
        values: usize,
        layer: usize,
        backend: &'b mut dyn AttentionBackend,
    },
}

impl HostDeltaState<'_> {
    /// The step's sequence lengths and each sequence's state.
    fn parts(&mut self) -> (&[usize], Vec<&mut [f32]>) {
        match self {
            HostDeltaState::Lent { seq_lens, states } => {
                (seq_lens, states.iter_mut().map(|s| &mut **s).collect())
            }
            HostDeltaState::Copied {
                seq_lens,
                flat,
                values,
                ..
            } => (seq_lens, flat.chunks_mut((*values).max(1)).collect()),
        }
    }
}

/// `log(1 + exp(x))` on a value (PyTorch's threshold: `x` above 20).
fn softplus_f32(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// A value head's state (values) from which the heads of one token run in parallel.
const PARALLEL_HEAD_STATE: usize = 4096;

impl HostDeltaNet {
    /// The states of layer `layer` for a step of `tokens` tokens.
    pub fn state<'b>(
        &self,
        layer: usize,
        tokens: usize,
        backend: &'b mut dyn AttentionBackend,
    ) -> Result<HostDeltaState<'b>> {
        let w = self;
        let values = w.shape.state_values();
        let st = if backend.lends_recurrent_host() {
            let lent = backend.lend_recurrent_host(layer, values)?;
            HostDeltaState::Lent {
                seq_lens: lent.seq_lens,
                states: lent.states,
            }
        } else {
            let step = backend.recurrent_state(layer, values)?;
            let n = step.seq_lens.len();
            let flat = match &step.state {
                Some(s) => s
                    .flatten_all()?
                    .to_dtype(candle_core::DType::F32)?
                    .to_vec1::<f32>()?,
                None => vec![0f32; n * values],
            };
            HostDeltaState::Copied {
                seq_lens: step.seq_lens,
                flat,
                values,
                layer,
                backend,
            }
        };
        let (seq_lens, states) = match &st {
            HostDeltaState::Lent { seq_lens, states } => (seq_lens, states.len()),
            HostDeltaState::Copied { seq_lens, flat, .. } => (seq_lens, flat.len() / values),
        };
        if seq_lens.iter().sum::<usize>() != tokens || states != seq_lens.len() {
            candle_core::bail!(
                "layer {layer}: {tokens} tokens, but the step's sequences bring {seq_lens:?}"
            )
        }
        Ok(st)
    }

    /// The conv update of the stacked projections' rows `x` into `u` (tokens x conv_dim).
    pub fn conv_update(&self, x: &[f32], u: &mut [f32], st: &mut HostDeltaState<'_>) {
        let w = self;
        let l = w.shape;
        let (cd, k, width) = (l.conv_dim(), l.conv_kernel, w.width());
        let (seq_lens, mut states) = st.parts();
        // the sequences' rows, outputs and states, apart
        let mut parts = Vec::with_capacity(seq_lens.len());
        let (mut rows_left, mut u_left) = (x, u);
        for (&len, state) in seq_lens.iter().zip(states.iter_mut()) {
            let (r, rest) = rows_left.split_at(len * width);
            let (o, rest_u) = std::mem::take(&mut u_left).split_at_mut(len * cd);
            parts.push((r, o, &mut state[..cd * (k - 1)]));
            (rows_left, u_left) = (rest, rest_u);
        }
        parts.into_par_iter().for_each(|(rows, u, window)| {
            for (row, u) in rows.chunks(width).zip(u.chunks_mut(cd)) {
                let x = &row[..cd];
                // the causal conv over the window (oldest first) and this input, then SiLU
                for (c, u) in u.iter_mut().enumerate() {
                    let w = &w.conv[c * k..][..k];
                    let mut acc = w[k - 1] * x[c];
                    for j in 0..k - 1 {
                        acc += w[j] * window[j * cd + c];
                    }
                    *u = acc / (1.0 + (-acc).exp());
                }
                window.copy_within(cd.., 0);
                window[(k - 2) * cd..].copy_from_slice(x);
            }
        });
    }

    /// The delta rule on the conv's output `u` (its q and k normed in place) with the gates of
    /// the stacked projections' rows `x`, into `y` (tokens x value_dim).
    pub fn delta_rule(&self, x: &[f32], u: &mut [f32], y: &mut [f32], st: &mut HostDeltaState<'_>) {
        let w = self;
        let l = w.shape;
        let (cd, vd, k, width) = (l.conv_dim(), l.value_dim(), l.conv_kernel, w.width());
        let (seq_lens, mut states) = st.parts();
        let mut parts = Vec::with_capacity(seq_lens.len());
        let (mut rows_left, mut u_left, mut y_left) = (x, u, y);
        for (&len, state) in seq_lens.iter().zip(states.iter_mut()) {
            let (r, rest) = rows_left.split_at(len * width);
            let (us, rest_u) = std::mem::take(&mut u_left).split_at_mut(len * cd);
            let (o, rest_y) = std::mem::take(&mut y_left).split_at_mut(len * vd);
            parts.push((r, us, o, &mut state[cd * (k - 1)..]));
            (rows_left, u_left, y_left) = (rest, rest_u, rest_y);
        }
        parts
            .into_par_iter()
            .for_each(|(rows, u, y, s)| sequence(w, rows, u, y, s));
    }
}

impl HostDeltaState<'_> {
    /// Hands the states back to a backend that did not lend them; what the backend's calls for
    /// them issued.
    pub fn store(self) -> Result<Cost> {
        match self {
            HostDeltaState::Lent { .. } => Ok(Cost::default()),
            HostDeltaState::Copied {
                seq_lens,
                flat,
                values,
                layer,
                backend,
            } => {
                let n = seq_lens.len();
                let state = Tensor::from_vec(flat, (n, values), &Device::Cpu)?;
                backend.store_recurrent_state(layer, state)?;
                Ok(backend.take_cost())
            }
        }
    }
}

/// One sequence's tokens through the delta rule: `rows` of the stacked projections (for z, b
/// and a), `u` the conv's output (tokens x conv_dim, its q and k normed in place), `y` (tokens x
/// value_dim) out, `s` the heads' states carried through.
fn sequence(w: &HostDeltaNet, rows: &[f32], u: &mut [f32], y: &mut [f32], s: &mut [f32]) {
    let l = w.shape;
    let (cd, vd, nv) = (l.conv_dim(), l.value_dim(), l.num_value_heads);
    let (dk, dv, per_key) = (l.key_head_dim, l.value_head_dim, nv / l.num_key_heads);
    let width = w.width();
    let q_scale = 1.0 / (dk as f32).sqrt();
    for ((row, u), y) in rows
        .chunks(width)
        .zip(u.chunks_mut(cd))
        .zip(y.chunks_mut(vd))
    {
        let (z, rest) = row[cd..].split_at(vd);
        let (bs, as_) = rest.split_at(nv);
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
        let (q, keys, v) = (&*q, &*keys, &*v);
        // each value head: its state and its slice of the output: in parallel when the heads'
        // states are large (a real model's: 16 KiB and up each)
        let head = |(hv, (sh, o)): (usize, (&mut [f32], &mut [f32]))| {
            let kh = hv / per_key;
            let (qh, kh) = (&q[kh * dk..][..dk], &keys[kh * dk..][..dk]);
            let vh = &v[hv * dv..][..dv];
            let beta = 1.0 / (1.0 + (-bs[hv]).exp());
            let decay = (w.rate[hv] * softplus_f32(as_[hv] + w.dt_bias[hv])).exp();
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
            let r = inv_rms(o, w.eps);
            for ((o, nw), z) in o.iter_mut().zip(&w.norm).zip(&z[hv * dv..][..dv]) {
                *o = *o * r * nw * (z / (1.0 + (-z).exp()));
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
