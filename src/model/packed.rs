//! The CPU host path's pieces: weights packed for the batch-invariant matmul ([`crate::gemm`]),
//! and the row ops the host layer ops (`model::layer_ops::host_ops`) run in place over plain
//! `Vec<f32>`s where candle would allocate a tensor (and often start a parallel job) per op.
//!
//! Every op is per row, so a row's values do not depend on the other rows of the step (the
//! sampler's batch-invariance promise). Inference only: nothing here records a backward pass.
//! Knows nothing of layers or caches.

use std::sync::Arc;

use candle_core::{Result, Tensor};
use candle_nn::Linear;

use crate::gemm::PackedMatrix;

/// Residual-stream elements below which the row-wise ops run on the calling thread (8 rows of
/// a hidden size of 512: a decode step of a small model at batch 16 and up runs them in
/// parallel).
const PARALLEL_MIN: usize = 1 << 12;

/// A projection packed for the batch-invariant matmul: the sampler's promise that a sample's
/// tokens do not depend on batch size or composition rests on it (candle's gemm picks kernels
/// and blocking by the number of rows), and it is faster than candle's gemm for the few rows of
/// a decode step.
#[derive(Debug, Clone)]
pub struct PackedLinear {
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
pub(crate) fn dropped(l: &Linear) -> Result<Linear> {
    let k = l.weight().dim(1)?;
    let w = Tensor::zeros((0, k), l.weight().dtype(), l.weight().device())?;
    Ok(Linear::new(w, None))
}

/// The fewest rows a parallel job of a row-wise op takes for `len` residual-stream elements:
/// one (split as rayon likes) from [`PARALLEL_MIN`] on; below it, all (rayon runs the op on
/// the calling thread, unsplit).
pub(crate) fn min_rows(len: usize) -> usize {
    if len >= PARALLEL_MIN {
        1
    } else {
        usize::MAX
    }
}

/// `1 / sqrt(mean(x^2) + eps)`; the squares summed in eight lanes (plain multiply and add, which
/// vectorise without the FMA target feature).
pub(crate) fn inv_rms(x: &[f32], eps: f32) -> f32 {
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
pub(crate) fn norm_row(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let r = inv_rms(x, eps);
    for ((y, x), w) in y.iter_mut().zip(x).zip(w) {
        *y = x * r * w;
    }
}

/// [`norm_row`] in place.
pub(crate) fn norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let r = inv_rms(x, eps);
    for (x, w) in x.iter_mut().zip(w) {
        *x = *x * r * w;
    }
}

pub(crate) fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
