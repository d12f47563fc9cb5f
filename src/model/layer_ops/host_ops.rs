//! The layer ops on the CPU sampler's host path: weights packed for the batch-invariant matmul
//! ([`crate::gemm`]) and the row ops of [`super::super::packed`], over plain `Vec<f32>`s where
//! candle would allocate a tensor (and often start a parallel job) per op. At a decode step's few
//! rows those ops, not the matmuls, were most of a layer's time.
//!
//! Every op is per row, so a row's values do not depend on the other rows of the step (the
//! sampler's batch-invariance promise). Activations' buffers come from a per-thread pool and go
//! back to it when an op is done with them, so a decode step allocates nothing once the pool has
//! grown to the step's sizes; an op declares an allocation only when the pool had to grow.
//! Inference only: nothing here records a backward pass.
//!
//! Knows nothing of layer kinds, caches or weights' names.

use std::cell::RefCell;

use candle_core::{Result, Tensor};
use candle_nn::Linear;
use rayon::prelude::*;

use super::super::attention::AttentionBackend;
use super::super::config::Activation;
use super::super::ops::{RmsNorm, RopeRows};
use super::super::packed::{
    add_into, dropped, inv_rms, min_rows, norm_in_place, norm_row, PackedLinear,
};
use super::candle_ops::{CandleGateUp, CandleQkv};
use super::host_deltanet::{HostDeltaNet, HostDeltaState};
use super::{AttnDims, Cost, LayerOps, Qkv};
use crate::simd::exp_sub_sum;

/// A buffer of the pool: the first `len` values of a vector that never shrinks, so that a
/// buffer serving ops of different sizes is not zeroed again each time it grows back.
#[derive(Debug, Default)]
pub struct Buf {
    v: Vec<f32>,
    len: usize,
}

impl std::ops::Deref for Buf {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.v[..self.len]
    }
}

impl std::ops::DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.v[..self.len]
    }
}

/// Rows of activations on the host: `rows` rows of `data.len() / rows` values, row-major.
#[derive(Debug)]
pub struct HostAct {
    pub data: Buf,
    pub rows: usize,
}

impl HostAct {
    /// The values of a (T, width) f32 tensor.
    pub fn from_tensor(x: &Tensor) -> Result<Self> {
        let (rows, _) = x.dims2()?;
        let v = x.flatten_all()?.to_vec1::<f32>()?;
        let len = v.len();
        Ok(HostAct {
            data: Buf { v, len },
            rows,
        })
    }

    /// As a (T, width) tensor on the CPU.
    pub fn into_tensor(self) -> Result<Tensor> {
        let width = self.width();
        let Buf { mut v, len } = self.data;
        v.truncate(len);
        Tensor::from_vec(v, (self.rows, width), &candle_core::Device::Cpu)
    }

    pub fn width(&self) -> usize {
        self.data.len() / self.rows.max(1)
    }
}

/// An RMS norm's scale on the host.
#[derive(Debug, Clone)]
pub struct HostNorm {
    pub w: Vec<f32>,
    pub eps: f32,
}

impl HostNorm {
    pub fn pack(n: &RmsNorm) -> Result<Self> {
        Ok(HostNorm {
            w: n.scale()?.to_vec1()?,
            eps: n.eps as f32,
        })
    }
}

/// An attention layer's q/k/v stacked and packed, and the per-head q/k norms' scales.
#[derive(Debug, Clone)]
pub struct HostQkv {
    qkv: PackedLinear,
    qk_norms: Option<(Vec<f32>, Vec<f32>)>,
    eps: f32,
}

impl HostQkv {
    /// Packs `w` (stacking it first); its candle weights are dropped.
    pub fn pack(w: &mut CandleQkv) -> Result<Self> {
        w.stack()?;
        let Some(qkv) = w.stacked.take() else {
            candle_core::bail!("pack: projections not stacked")
        };
        let packed = HostQkv {
            qkv: PackedLinear::new(&qkv)?,
            qk_norms: match (&w.q_norm, &w.k_norm) {
                (Some(q), Some(k)) => Some((q.scale()?.to_vec1()?, k.scale()?.to_vec1()?)),
                _ => None,
            },
            eps: w.q_norm.as_ref().map_or(0.0, |n| n.eps as f32),
        };
        for l in [&mut w.q_proj, &mut w.k_proj, &mut w.v_proj] {
            *l = dropped(l)?;
        }
        Ok(packed)
    }
}

/// Packs a projection; its candle weight is dropped.
pub fn pack_linear(l: &mut Linear) -> Result<PackedLinear> {
    let p = PackedLinear::new(l)?;
    *l = dropped(l)?;
    Ok(p)
}

/// Packs the MLP's gate and up as one matrix (gate rows, then up rows); the candle weights are
/// dropped.
pub fn pack_gate_up(w: &mut CandleGateUp) -> Result<PackedLinear> {
    w.stack()?;
    let Some(mut gate_up) = w.stacked.take() else {
        candle_core::bail!("pack: gate/up not stacked")
    };
    for l in [&mut w.gate, &mut w.up] {
        *l = dropped(l)?;
    }
    pack_linear(&mut gate_up)
}

/// The largest buffer the pool keeps between steps: a long prefill's activations (hundreds of
/// MiB for a large model) are not kept for the rest of the thread's life; a decode step's are.
const KEEP_BYTES: usize = 16 << 20;

thread_local! {
    static POOL: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// The host implementation: this thread's pool of buffers (taken for the ops' life: a step of
/// another engine that this thread picks up while waiting inside a step starts a pool of its
/// own), and what its calls have spent.
pub struct HostOps {
    pool: Vec<Vec<f32>>,
    spent: Cost,
}

impl Default for HostOps {
    fn default() -> Self {
        Self::new()
    }
}

impl HostOps {
    pub fn new() -> Self {
        HostOps {
            pool: POOL.with(|p| std::mem::take(&mut *p.borrow_mut())),
            spent: Cost::default(),
        }
    }

    /// A buffer of `n` values from the pool (its old values left as they are: every op writes
    /// every value it reads).
    fn buf(&mut self, n: usize) -> Buf {
        // the smallest that holds `n`, else the largest (to grow): each buffer keeps to the
        // sizes it served, so the pool settles after a step or two
        let fits = (0..self.pool.len())
            .filter(|&i| self.pool[i].capacity() >= n)
            .min_by_key(|&i| self.pool[i].capacity());
        let largest = (0..self.pool.len()).max_by_key(|&i| self.pool[i].capacity());
        let mut v = match fits.or(largest) {
            Some(i) => self.pool.swap_remove(i),
            None => Vec::new(),
        };
        if v.capacity() < n {
            self.spent.allocations += 1;
        }
        if v.len() < n {
            v.resize(n, 0.0);
        }
        Buf { v, len: n }
    }

    /// Gives a buffer back to the pool.
    fn give(&mut self, b: Buf) {
        self.pool.push(b.v);
    }

    /// Gives `a`'s buffer back to the pool.
    pub fn recycle(&mut self, a: HostAct) {
        self.give(a.data);
    }
}

impl Drop for HostOps {
    fn drop(&mut self) {
        let mut pool = std::mem::take(&mut self.pool);
        pool.retain(|v| v.capacity() * std::mem::size_of::<f32>() <= KEEP_BYTES);
        POOL.with(|p| {
            let mut p = p.borrow_mut();
            if p.is_empty() {
                *p = pool;
            }
        });
    }
}

/// Row by row: the sandwich norm of `y` (with `y_norm`), `x += y`, then (with `next`) the next
/// norm of `x` into `y`.
fn add_rows(x: &mut HostAct, y: &mut HostAct, y_norm: Option<&HostNorm>, next: Option<&HostNorm>) {
    let (width, min) = (x.width(), min_rows(x.data.len()));
    x.data
        .par_chunks_mut(width)
        .zip(y.data.par_chunks_mut(width))
        .with_min_len(min)
        .for_each(|(x, y)| {
            if let Some(n) = y_norm {
                norm_in_place(y, &n.w, n.eps);
            }
            add_into(x, y);
            if let Some(n) = next {
                norm_row(x, &n.w, n.eps, y);
            }
        });
}

/// GELU's tanh approximation (`gelu_pytorch_tanh`), as candle's `gelu` computes it.
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_TWO_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_TWO_OVER_PI * x * (1.0 + 0.044_715 * x * x)).tanh())
}

impl LayerOps for HostOps {
    type Act = HostAct;
    type Norm = HostNorm;
    type Linear = PackedLinear;
    type Qkv = HostQkv;
    type GateUp = PackedLinear;
    type DeltaIn = PackedLinear;
    type DeltaRows = HostAct;
    type DeltaNet = HostDeltaNet;
    type DeltaState<'b> = HostDeltaState<'b>;

    fn rms_norm(&mut self, x: &HostAct, w: &HostNorm) -> Result<HostAct> {
        let (width, min) = (x.width(), min_rows(x.data.len()));
        let mut out = self.buf(x.data.len());
        out.par_chunks_mut(width)
            .zip(x.data.par_chunks(width))
            .with_min_len(min)
            .for_each(|(y, x)| norm_row(x, &w.w, w.eps, y));
        Ok(HostAct {
            data: out,
            rows: x.rows,
        })
    }

    /// Row by row: (the sandwich norm of `y`), `x += y`, then the next norm of `x` into `y`'s
    /// buffer.
    fn add_rms_norm(
        &mut self,
        mut x: HostAct,
        mut y: HostAct,
        y_norm: Option<&HostNorm>,
        next: &HostNorm,
    ) -> Result<(HostAct, HostAct)> {
        add_rows(&mut x, &mut y, y_norm, Some(next));
        Ok((x, y))
    }

    fn add(
        &mut self,
        mut x: HostAct,
        mut y: HostAct,
        y_norm: Option<&HostNorm>,
    ) -> Result<HostAct> {
        add_rows(&mut x, &mut y, y_norm, None);
        self.recycle(y);
        Ok(x)
    }

    fn qkv_rope(
        &mut self,
        h: HostAct,
        w: &HostQkv,
        dims: AttnDims,
        rope: &RopeRows,
    ) -> Result<Qkv<HostAct>> {
        let Some((cos, sin)) = &rope.host else {
            candle_core::bail!("packed attention: RoPE rows not on the host")
        };
        let t = h.rows;
        let AttnDims {
            heads: hq,
            kv_heads: hkv,
            head_dim: d,
            gate: gated,
            ..
        } = dims;
        let q_scale = dims.q_scale as f32;
        let min = min_rows(h.data.len());
        let (nq, nkv) = (hq * d, hkv * d);
        // a head's query rows, then (gated) its gate's
        let q_rows = if gated { 2 * d } else { d };
        let width = hq * q_rows + 2 * nkv;
        let mut rows = self.buf(t * width);
        w.qkv.apply_into(&h.data, t, &mut rows);
        self.recycle(h);
        let half = cos.len() / t.max(1);
        let (mut q, mut k, mut v) = (self.buf(t * nq), self.buf(t * nkv), self.buf(t * nkv));
        // (ungated: one unused value per row, so that every row has its chunk)
        let gw = if gated { nq } else { 1 };
        let mut gate = self.buf(t * gw);
        // the per-head norms and RoPE on one head's vector
        let rotate = |x: &mut [f32], norm: Option<&Vec<f32>>, c: &[f32], s: &[f32]| {
            if let Some(n) = norm {
                let r = inv_rms(x, w.eps);
                for (x, n) in x.iter_mut().zip(n) {
                    *x = *x * r * n;
                }
            }
            let (x1, x2) = x[..2 * half].split_at_mut(half);
            for i in 0..half {
                let (a, b) = (x1[i], x2[i]);
                x1[i] = a * c[i] - b * s[i];
                x2[i] = b * c[i] + a * s[i];
            }
        };
        let row_job = |(ti, ((((row, q), k), v), g)): (usize, RowParts)| {
            let (c, s) = (&cos[ti * half..][..half], &sin[ti * half..][..half]);
            let norms = w.qk_norms.as_ref();
            for (hd, qh) in q.chunks_mut(d).enumerate() {
                qh.copy_from_slice(&row[hd * q_rows..][..d]);
                rotate(qh, norms.map(|n| &n.0), c, s);
                if q_scale != 1.0 {
                    qh.iter_mut().for_each(|x| *x *= q_scale);
                }
                if gated {
                    g[hd * d..][..d].copy_from_slice(&row[hd * q_rows + d..][..d]);
                }
            }
            let keys = &row[hq * q_rows..];
            k.copy_from_slice(&keys[..nkv]);
            for kh in k.chunks_mut(d) {
                rotate(kh, norms.map(|n| &n.1), c, s);
            }
            v.copy_from_slice(&keys[nkv..]);
        };
        rows.par_chunks_mut(width)
            .zip(q.par_chunks_mut(nq))
            .zip(k.par_chunks_mut(nkv))
            .zip(v.par_chunks_mut(nkv))
            .zip(gate.par_chunks_mut(gw))
            .enumerate()
            .with_min_len(min)
            .for_each(row_job);
        self.give(rows);
        let act = |data| HostAct { data, rows: t };
        let gate = if gated {
            Some(act(gate))
        } else {
            self.give(gate);
            None
        };
        Ok(Qkv {
            q: act(q),
            k: act(k),
            v: act(v),
            gate,
        })
    }

    fn attend(
        &mut self,
        layer: usize,
        q: HostAct,
        k: HostAct,
        v: HostAct,
        dims: AttnDims,
        window: Option<usize>,
        backend: &mut dyn AttentionBackend,
    ) -> Result<HostAct> {
        let t = q.rows;
        let AttnDims {
            heads: hq,
            kv_heads: hkv,
            head_dim: d,
            ..
        } = dims;
        let mut out = self.buf(t * hq * d);
        out.fill(0.0);
        let shape = (t, hq, hkv, d);
        backend.attend_host(layer, &q.data, &k.data, &v.data, shape, window, &mut out)?;
        self.spent += backend.take_cost();
        for a in [q, k, v] {
            self.recycle(a);
        }
        Ok(HostAct { data: out, rows: t })
    }

    /// `a * sigmoid(g)`, as `a / (1 + exp(-g))`.
    fn gate_mul(&mut self, mut a: HostAct, gate: HostAct) -> Result<HostAct> {
        let (width, min) = (a.width(), min_rows(a.data.len()));
        a.data
            .par_chunks_mut(width)
            .zip(gate.data.par_chunks(width))
            .with_min_len(min)
            .for_each(|(o, g)| {
                for (o, g) in o.iter_mut().zip(g) {
                    *o /= 1.0 + (-g).exp();
                }
            });
        self.recycle(gate);
        Ok(a)
    }

    fn linear(&mut self, x: HostAct, w: &PackedLinear) -> Result<HostAct> {
        let t = x.rows;
        let mut out = self.buf(t * w.w.rows());
        w.apply_into(&x.data, t, &mut out);
        self.recycle(x);
        Ok(HostAct { data: out, rows: t })
    }

    fn gate_up_act(&mut self, h: HostAct, w: &PackedLinear, act: Activation) -> Result<HostAct> {
        let (t, min) = (h.rows, min_rows(h.data.len()));
        let inter = w.w.rows() / 2;
        let mut gu = self.buf(t * 2 * inter);
        w.apply_into(&h.data, t, &mut gu);
        self.recycle(h);
        let mut out = self.buf(t * inter);
        let swiglu = |(a, g): (&mut [f32], &[f32])| {
            let (g, u) = g.split_at(inter);
            // a = exp(-g), then g * sigmoid(g) * u
            for (a, g) in a.iter_mut().zip(g) {
                *a = -g;
            }
            exp_sub_sum(a, 0.0);
            for ((a, g), u) in a.iter_mut().zip(g).zip(u) {
                *a = g / (1.0 + *a) * u;
            }
        };
        let geglu = |(a, g): (&mut [f32], &[f32])| {
            let (g, u) = g.split_at(inter);
            for ((a, g), u) in a.iter_mut().zip(g).zip(u) {
                *a = gelu_tanh(*g) * u;
            }
        };
        let rows = out
            .par_chunks_mut(inter)
            .zip(gu.par_chunks(2 * inter))
            .with_min_len(min);
        match act {
            Activation::Silu => rows.for_each(swiglu),
            Activation::GeluTanh => rows.for_each(geglu),
        }
        self.give(gu);
        Ok(HostAct { data: out, rows: t })
    }

    fn deltanet_in(&mut self, h: HostAct, w: &PackedLinear) -> Result<HostAct> {
        self.linear(h, w)
    }

    fn deltanet_state<'b>(
        &mut self,
        layer: usize,
        x: &HostAct,
        w: &HostDeltaNet,
        backend: &'b mut dyn AttentionBackend,
    ) -> Result<HostDeltaState<'b>> {
        w.state(layer, x.rows, backend)
    }

    fn conv_update(
        &mut self,
        x: &HostAct,
        w: &HostDeltaNet,
        state: &mut HostDeltaState<'_>,
    ) -> Result<HostAct> {
        let mut u = self.buf(x.rows * w.shape.conv_dim());
        w.conv_update(&x.data, &mut u, state);
        Ok(HostAct {
            data: u,
            rows: x.rows,
        })
    }

    fn delta_rule(
        &mut self,
        mut u: HostAct,
        x: HostAct,
        w: &HostDeltaNet,
        state: &mut HostDeltaState<'_>,
    ) -> Result<HostAct> {
        let mut y = self.buf(x.rows * w.shape.value_dim());
        w.delta_rule(&x.data, &mut u.data, &mut y, state);
        let rows = x.rows;
        self.recycle(u);
        self.recycle(x);
        Ok(HostAct { data: y, rows })
    }

    fn store_deltanet_state(&mut self, state: HostDeltaState<'_>) -> Result<()> {
        self.spent += state.store()?;
        Ok(())
    }

    fn take_cost(&mut self) -> Cost {
        std::mem::take(&mut self.spent)
    }
}

/// A row of the stacked projections, the rows of `q`, `k` and `v` it is split into, and the
/// row of gates (one unused value when ungated).
type RowParts<'a> = (
    (
        ((&'a mut [f32], &'a mut [f32]), &'a mut [f32]),
        &'a mut [f32],
    ),
    &'a mut [f32],
);
