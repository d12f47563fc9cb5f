//! The transformer's weights packed for sampling on the CPU, and a decoder layer computed on host
//! slices around the packed matmul ([`crate::gemm`]): RMS norms, Qwen3's q/k norms, RoPE, the
//! residual adds and the SwiGLU product run in place over plain `Vec<f32>`s, where candle would
//! allocate a tensor (and often start a parallel job) per op. At a decode step's few rows those
//! ops, not the matmuls, were most of a layer's time.
//!
//! Every op is per row, so a row's values do not depend on the other rows of the step (the
//! sampler's batch-invariance promise). Inference only: nothing here records a backward pass.
//! Knows nothing of caches: attention goes through the caller's backend.

use std::sync::Arc;

use candle_core::{Result, Tensor};
use candle_nn::Linear;
use rayon::prelude::*;

use super::attention::AttentionBackend;
use crate::gemm::PackedMatrix;
use crate::simd::exp_sub_sum;

/// Residual-stream elements below which the row-wise ops run on the calling thread (8 rows of
/// a hidden size of 512: a decode step of a small model at batch 16 and up runs them in
/// parallel).
const PARALLEL_MIN: usize = 1 << 12;

/// A projection packed for the batch-invariant matmul: the sampler's promise that a sample's
/// tokens do not depend on batch size or composition rests on it (candle's gemm picks kernels
/// and blocking by the number of rows), and it is faster than candle's gemm for the few rows of
/// a decode step.
#[derive(Debug, Clone)]
pub(super) struct PackedLinear {
    pub w: Arc<PackedMatrix>,
    bias: Option<Vec<f32>>,
}

impl PackedLinear {
    /// Packs `l` (f32 on the CPU).
    pub fn new(l: &Linear) -> Result<Self> {
        let (n, k) = l.weight().dims2()?;
        let w = l.weight().contiguous()?.flatten_all()?.to_vec1::<f32>()?;
        Ok(PackedLinear {
            w: Arc::new(PackedMatrix::pack(&w, n, k)),
            bias: l.bias().map(|b| b.to_vec1::<f32>()).transpose()?,
        })
    }

    /// `x @ w.t() + b` for `m` rows of `x`.
    pub fn apply(&self, x: &[f32], m: usize) -> Vec<f32> {
        let mut y = vec![0f32; m * self.w.rows()];
        self.apply_into(x, m, &mut y);
        y
    }

    /// [`Self::apply`] into `y` (`m` rows of the output features; every value written).
    pub fn apply_into(&self, x: &[f32], m: usize, y: &mut [f32]) {
        let n = self.w.rows();
        crate::gemm::matmul(x, m, &self.w, y);
        if let Some(b) = &self.bias {
            for row in y[..m * n].chunks_mut(n) {
                for (v, b) in row.iter_mut().zip(b) {
                    *v += b;
                }
            }
        }
    }

    /// [`Self::apply`] on a (T, in) tensor.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (m, k) = x.dims2()?;
        if k != self.w.cols() {
            candle_core::bail!(
                "packed linear: input {:?}, weight ({}, {k})",
                x.dims(),
                self.w.rows()
            )
        }
        let y = self.apply(&host(x)?, m);
        Tensor::from_vec(y, (m, self.w.rows()), x.device())
    }
}

/// A tensor's values, row-major.
fn host(x: &Tensor) -> Result<Vec<f32>> {
    x.flatten_all()?.to_vec1::<f32>()
}

/// A placeholder for a weight that now lives packed: (0, in), so that any use of it fails on
/// shapes instead of computing with stale values; its memory is freed.
pub(super) fn dropped(l: &Linear) -> Result<Linear> {
    let k = l.weight().dim(1)?;
    let w = Tensor::zeros((0, k), l.weight().dtype(), l.weight().device())?;
    Ok(Linear::new(w, None))
}

/// A decoder layer packed for the CPU: its projections (q/k/v and gate/up stacked) and norms.
#[derive(Debug, Clone)]
pub(super) struct PackedLayer {
    pub qkv: PackedLinear,
    pub o: PackedLinear,
    pub gate_up: PackedLinear,
    pub down: PackedLinear,
    pub input_norm: Vec<f32>,
    pub post_norm: Vec<f32>,
    /// Qwen3's per-head norms of queries and keys.
    pub qk_norms: Option<(Vec<f32>, Vec<f32>)>,
    pub eps: f32,
}

/// Heads and head size of a layer: (query heads, KV heads, head_dim).
pub(super) type Heads = (usize, usize, usize);

impl PackedLayer {
    /// The layer on the residual stream `x` (T, hidden); `cos`, `sin` are the step's RoPE rows
    /// (T, D/2 each, row-major). Attention is the caller's backend, layer `index`.
    pub fn forward(
        &self,
        index: usize,
        x: &Tensor,
        rope: (&[f32], &[f32]),
        heads: Heads,
        attn: &mut dyn AttentionBackend,
    ) -> Result<Tensor> {
        let (t, hidden) = x.dims2()?;
        let mut xs = host(x)?;
        self.forward_host(index, &mut xs, t, rope, heads, attn)?;
        Tensor::from_vec(xs, (t, hidden), x.device())
    }

    /// [`Self::forward`] in place on host values: `xs` is the residual stream, `t` rows.
    pub fn forward_host(
        &self,
        index: usize,
        xs: &mut [f32],
        t: usize,
        rope: (&[f32], &[f32]),
        heads: Heads,
        attn: &mut dyn AttentionBackend,
    ) -> Result<()> {
        // this thread's buffers; fresh ones if they are in use (a step of another engine that
        // this thread picked up while waiting inside a step)
        BUFFERS.with(|b| match b.try_borrow_mut() {
            Ok(mut b) => self.forward_in(&mut b, index, xs, t, rope, heads, attn),
            Err(_) => self.forward_in(&mut Buffers::default(), index, xs, t, rope, heads, attn),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn forward_in(
        &self,
        b: &mut Buffers,
        index: usize,
        xs: &mut [f32],
        t: usize,
        (cos, sin): (&[f32], &[f32]),
        (hq, hkv, d): Heads,
        attn: &mut dyn AttentionBackend,
    ) -> Result<()> {
        let hidden = xs.len() / t.max(1);
        let Buffers {
            h,
            qkv,
            q,
            k,
            v,
            a,
            out,
        } = b;
        // Every op between the matmuls works row by row, in parallel once the step has a few
        // rows: run on one thread, it would leave the other workers to fall asleep until the
        // next matmul wakes them.
        let min = min_rows(xs.len());
        // attention block
        let h = sized(h, xs.len());
        rms_rows(xs, hidden, &self.input_norm, self.eps, h);
        let (nq, nkv) = (hq * d, hkv * d);
        let width = nq + 2 * nkv;
        let rows = sized(qkv, t * width);
        self.qkv.apply_into(h, t, rows);
        let half = d / 2;
        // Qwen3's q/k norms and RoPE on a row, then its queries, keys and values apart
        let rotate_row = |(ti, (((row, q), k), v)): (usize, RowParts)| {
            let (c, s) = (&cos[ti * half..][..half], &sin[ti * half..][..half]);
            for (head, v) in row[..nq + nkv].chunks_mut(d).enumerate() {
                if let Some((qn, kn)) = &self.qk_norms {
                    let w = if head < hq { qn } else { kn };
                    let r = inv_rms(v, self.eps);
                    for (v, w) in v.iter_mut().zip(w) {
                        *v = *v * r * w;
                    }
                }
                let (x1, x2) = v.split_at_mut(half);
                for i in 0..half {
                    let (a, b) = (x1[i], x2[i]);
                    x1[i] = a * c[i] - b * s[i];
                    x2[i] = b * c[i] + a * s[i];
                }
            }
            q.copy_from_slice(&row[..nq]);
            k.copy_from_slice(&row[nq..nq + nkv]);
            v.copy_from_slice(&row[nq + nkv..]);
        };
        let (q, k, v) = (sized(q, t * nq), sized(k, t * nkv), sized(v, t * nkv));
        rows.par_chunks_mut(width)
            .zip(q.par_chunks_mut(nq))
            .zip(k.par_chunks_mut(nkv))
            .zip(v.par_chunks_mut(nkv))
            .enumerate()
            .with_min_len(min)
            .for_each(rotate_row);
        let att = sized(a, t * nq);
        att.fill(0.0);
        attn.attend_host(index, q, k, v, (t, hq, hkv, d), att)?;
        let o = sized(out, xs.len());
        self.o.apply_into(att, t, o);
        // the residual add, then the MLP's norm of the sum
        let add_norm = |((x, o), h): ((&mut [f32], &[f32]), &mut [f32])| {
            add_into(x, o);
            norm_row(x, &self.post_norm, self.eps, h);
        };
        xs.par_chunks_mut(hidden)
            .zip(o.par_chunks(hidden))
            .zip(h.par_chunks_mut(hidden))
            .with_min_len(min)
            .for_each(add_norm);
        // MLP block (SwiGLU)
        let inter = self.gate_up.w.rows() / 2;
        let gu = sized(qkv, t * 2 * inter);
        self.gate_up.apply_into(h, t, gu);
        let act = sized(a, t * inter);
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
        act.par_chunks_mut(inter)
            .zip(gu.par_chunks(2 * inter))
            .with_min_len(min)
            .for_each(swiglu);
        let down = sized(out, xs.len());
        self.down.apply_into(act, t, down);
        xs.par_chunks_mut(hidden)
            .zip(down.par_chunks(hidden))
            .with_min_len(min)
            .for_each(|(x, o)| add_into(x, o));
        b.release_large();
        Ok(())
    }
}

/// The fewest rows a parallel job of a row-wise op takes for `len` residual-stream elements:
/// one (split as rayon likes) from [`PARALLEL_MIN`] on; below it, all (rayon runs the op on
/// the calling thread, unsplit).
fn min_rows(len: usize) -> usize {
    if len >= PARALLEL_MIN {
        1
    } else {
        usize::MAX
    }
}

/// A row of q|k|v and the rows of `q`, `k` and `v` it is split into.
type RowParts<'a> = (
    ((&'a mut [f32], &'a mut [f32]), &'a mut [f32]),
    &'a mut [f32],
);

/// A thread's buffers for [`PackedLayer::forward_host`], kept across layers and steps (up to
/// [`KEEP_BYTES`] each): a decode step's activations are tens to hundreds of KiB each, which a
/// fresh allocation per layer would map, fault in and zero every time.
#[derive(Default)]
struct Buffers {
    /// Normed rows (T, hidden).
    h: Vec<f32>,
    /// q|k|v rows (T, q + 2 kv), then gate|up rows (T, 2 inter).
    qkv: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// Attention output (T, q), then the SwiGLU product (T, inter).
    a: Vec<f32>,
    /// A projection back to the residual stream (T, hidden).
    out: Vec<f32>,
}

impl Buffers {
    /// Frees any buffer past [`KEEP_BYTES`]: a long prefill's activations (hundreds of MiB for
    /// a large model) are not kept for the rest of the thread's life; a decode step's are.
    fn release_large(&mut self) {
        for v in [
            &mut self.h,
            &mut self.qkv,
            &mut self.q,
            &mut self.k,
            &mut self.v,
            &mut self.a,
            &mut self.out,
        ] {
            if v.capacity() * std::mem::size_of::<f32>() > KEEP_BYTES {
                *v = Vec::new();
            }
        }
    }
}

/// The largest buffer [`Buffers`] keeps between layers.
const KEEP_BYTES: usize = 16 << 20;

thread_local! {
    static BUFFERS: std::cell::RefCell<Buffers> = std::cell::RefCell::default();
}

/// `v` as `n` values: its allocation kept, its old values left as they are (every user writes
/// every value it reads).
fn sized(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    v.resize(n, 0.0);
    &mut v[..n]
}

/// `1 / sqrt(mean(x^2) + eps)`; the squares summed in eight lanes (plain multiply and add, which
/// vectorise without the FMA target feature).
fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let mut lanes = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
    for c in chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l += v * v;
        }
    }
    1.0 / ((lanes.iter().sum::<f32>() + tail) / x.len() as f32 + eps).sqrt()
}

/// RMS norm of the row `x`, scaled by `w`, into `y`.
fn norm_row(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let r = inv_rms(x, eps);
    for ((y, x), w) in y.iter_mut().zip(x).zip(w) {
        *y = x * r * w;
    }
}

/// RMS norm of each row of `x` (rows of `width`), scaled by `w`, into `y`.
fn rms_rows(x: &[f32], width: usize, w: &[f32], eps: f32, y: &mut [f32]) {
    y.par_chunks_mut(width)
        .zip(x.par_chunks(width))
        .with_min_len(min_rows(x.len()))
        .for_each(|(yr, xr)| norm_row(xr, w, eps, yr));
}

fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
