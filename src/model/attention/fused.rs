//! Causal attention over packed sequences as one candle op with its own backward pass, for f32
//! on CPU: the (heads, L, L) scores and probabilities never exist as tensors.
//!
//! The composed version ([`super::attend_one`]) materialises the scores, adds a mask,
//! runs a softmax out of five ops and multiplies by V; its backward runs as many again, each a
//! single-threaded pass over an (H, L, L) tensor. Here one task per (sequence, KV head) computes
//! each query row's scores into a scratch row, softmaxes it and accumulates the output; the
//! backward recomputes the row's probabilities from q and k (as flash attention does) and
//! accumulates dQ, dK and dV. Tasks run on rayon; a task owns its KV head's rows of dK and dV,
//! so no two threads write one element. A sliding window (a query sees the `window` keys ending
//! at its own) zeroes the earlier keys' probabilities, in the backward too. The result and the
//! gradients equal the composed version's up to float summation order (tested).
//!
//! Knows nothing of caches, weights or training: q (T, Hq, D), k and v (T, Hkv, D) in, the
//! attention output (T, Hq, D) out, sequences laid end to end as `seq_lens` says.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use crate::model::cpu_op::{slice, view};
use crate::simd::SendPtr;

/// The op: which sequences the step packs, and the head layout.
#[derive(Debug, Clone)]
pub struct FusedCausal {
    seq_lens: Arc<Vec<usize>>,
    window: Option<usize>,
}

/// Causal attention of `q` (T, Hq, D) over `k`, `v` (T, Hkv, D) within each sequence of
/// `seq_lens`, a query seeing the `window` keys ending at its own when given (a sliding-window
/// layer); differentiable. f32 tensors on the CPU only (see [`crate::model::diff_ops::supported`]).
pub fn fused_causal(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seq_lens: &[usize],
    window: Option<usize>,
) -> Result<Tensor> {
    if window == Some(0) {
        candle_core::bail!("fused attention: a window of 0 keys")
    }
    let op = FusedCausal {
        seq_lens: Arc::new(seq_lens.to_vec()),
        window,
    };
    q.contiguous()?
        .apply_op3(&k.contiguous()?, &v.contiguous()?, op)
}

/// Dimensions shared by the forward and backward passes.
#[derive(Debug, Clone, Copy)]
struct Dims {
    hq: usize,
    hkv: usize,
    d: usize,
    scale: f32,
    /// The keys a query sees, ending at its own (`usize::MAX`: all earlier ones).
    window: usize,
}

impl Dims {
    fn of(
        q: &[usize],
        k: &[usize],
        v: &[usize],
        seq_lens: &[usize],
        window: Option<usize>,
    ) -> Result<Dims> {
        let (&[t, hq, d], &[tk, hkv, dk], &[tv, hv, dv]) = (q, k, v) else {
            candle_core::bail!("fused attention wants rank-3 q, k, v, got {q:?} {k:?} {v:?}")
        };
        let total: usize = seq_lens.iter().sum();
        if t != tk || t != tv || t != total || hkv != hv || d != dk || d != dv {
            candle_core::bail!(
                "fused attention: q {q:?}, k {k:?}, v {v:?} do not fit sequences of {total} tokens"
            )
        }
        if hkv == 0 || hq % hkv != 0 {
            candle_core::bail!("fused attention: {hq} query heads over {hkv} KV heads")
        }
        Ok(Dims {
            hq,
            hkv,
            d,
            scale: 1.0 / (d as f32).sqrt(),
            window: window.unwrap_or(usize::MAX),
        })
    }

    /// One task per (sequence start, length, KV head).
    fn tasks(&self, seq_lens: &[usize]) -> Vec<(usize, usize, usize)> {
        let mut tasks = Vec::with_capacity(seq_lens.len() * self.hkv);
        let mut start = 0;
        for &len in seq_lens {
            for g in 0..self.hkv {
                tasks.push((start, len, g));
            }
            start += len;
        }
        // The longest first: a causal task's work grows with its length squared.
        tasks.sort_by_key(|&(_, len, _)| std::cmp::Reverse(len));
        tasks
    }
}

impl CustomOp3 for FusedCausal {
    fn name(&self) -> &'static str {
        "fused-causal-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let dims = Dims::of(l1.dims(), l2.dims(), l3.dims(), &self.seq_lens, self.window)?;
        let (q, k, v) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let mut out = vec![0f32; q.len()];
        let ptr = SendPtr(out.as_mut_ptr());
        dims.tasks(&self.seq_lens)
            .into_par_iter()
            .for_each(|(start, len, g)| {
                // SAFETY: this task writes only the output rows of its sequence's tokens for the
                // query heads of KV head `g`; tasks differ in sequence or in `g`.
                unsafe { kernels::forward(q, k, v, ptr, dims, start, len, g) }
            });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // a timed run: the backward of what came after the attention ends here
        crate::model::clock::mark_here("backward");
        let dims = Dims::of(q.dims(), k.dims(), v.dims(), &self.seq_lens, self.window)?;
        let grad_res = grad_res.contiguous()?;
        let views = [view(q)?, view(k)?, view(v)?, view(res)?, view(&grad_res)?];
        let (qv, kv, vv, ov, gv) = (
            views[0].get()?,
            views[1].get()?,
            views[2].get()?,
            views[3].get()?,
            views[4].get()?,
        );
        let mut dq = vec![0f32; qv.len()];
        let mut dk = vec![0f32; kv.len()];
        let mut dv = vec![0f32; vv.len()];
        let ptrs = (
            SendPtr(dq.as_mut_ptr()),
            SendPtr(dk.as_mut_ptr()),
            SendPtr(dv.as_mut_ptr()),
        );
        dims.tasks(&self.seq_lens)
            .into_par_iter()
            .for_each(|(start, len, g)| {
                let ins = kernels::BwdInputs {
                    q: qv,
                    k: kv,
                    v: vv,
                    o: ov,
                    go: gv,
                };
                // SAFETY: this task writes only its sequence's rows of dQ for the query heads of
                // KV head `g`, and of dK and dV for head `g`; tasks differ in sequence or `g`.
                unsafe { kernels::backward(ins, ptrs, dims, start, len, g) }
            });
        let dev = q.device();
        let grads = (
            Some(Tensor::from_vec(dq, q.shape(), dev)?),
            Some(Tensor::from_vec(dk, k.shape(), dev)?),
            Some(Tensor::from_vec(dv, v.shape(), dev)?),
        );
        crate::model::clock::mark_here("attend_backward");
        Ok(grads)
    }
}

mod kernels {
    //! The per-task loops. A task first copies its keys and values dimension-major
    //! (`kt[c][j]`, `vt[c][j]`, rows padded to a multiple of [`CH`]), so that a row's scores,
    //! `dP`, and the updates of dK and dV are multiply-adds along the keys (vectors of keys, no
    //! horizontal sums), and its output and dQ are dot products along the keys. Compiled twice:
    //! with AVX2 and FMA enabled (chosen at run time when the CPU has them) and without.

    use super::{Dims, SendPtr};

    /// Keys per register block: four 8-lane accumulators.
    const CH: usize = 32;

    pub struct BwdInputs<'a> {
        pub q: &'a [f32],
        pub k: &'a [f32],
        pub v: &'a [f32],
        pub o: &'a [f32],
        pub go: &'a [f32],
    }

    crate::simd::avx2_fma_dispatch! {
        /// # Safety
        /// `out` points to a buffer shaped like `q`, and no other thread writes the rows of this
        /// task (sequence `start..start + len`, the query heads of KV head `g`).
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn forward(
            q: &[f32],
            k: &[f32],
            v: &[f32],
            out: SendPtr,
            dims: Dims,
            start: usize,
            len: usize,
            g: usize,
        ) => generic forward_body
    }

    crate::simd::avx2_fma_dispatch! {
        /// # Safety
        /// The pointers point to buffers shaped like q, k and v, and no other thread writes this
        /// task's rows of them.
        pub unsafe fn backward(
            ins: BwdInputs,
            outs: (SendPtr, SendPtr, SendPtr),
            dims: Dims,
            start: usize,
            len: usize,
            g: usize,
        ) => generic backward_body
    }

    /// `a * b + c`, fused where the CPU has FMA (`F`), so that the portable build does not call
    /// a software `fmaf`.
    #[inline(always)]
    fn madd<const F: bool>(a: f32, b: f32, c: f32) -> f32 {
        if F {
            a.mul_add(b, c)
        } else {
            a * b + c
        }
    }

    /// `a · b` in eight lanes (vectorises; a serial sum would not).
    #[inline(always)]
    fn dot<const F: bool>(a: &[f32], b: &[f32]) -> f32 {
        let mut acc = [0f32; 8];
        let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
        let tail: f32 = ca
            .remainder()
            .iter()
            .zip(cb.remainder())
            .map(|(x, y)| x * y)
            .sum();
        for (x, y) in ca.zip(cb) {
            for j in 0..8 {
                acc[j] = madd::<F>(x[j], y[j], acc[j]);
            }
        }
        ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail
    }

    /// The task's rows of `x` (T, Hkv, D) at KV head `g`, dimension-major: `xt[c * lp + j]`;
    /// columns past `len` stay zero.
    fn transpose(x: &[f32], dims: Dims, start: usize, len: usize, g: usize, lp: usize) -> Vec<f32> {
        let d = dims.d;
        let mut xt = vec![0f32; d * lp];
        for j in 0..len {
            let row = &x[((start + j) * dims.hkv + g) * d..][..d];
            for (c, &val) in row.iter().enumerate() {
                xt[c * lp + j] = val;
            }
        }
        xt
    }

    /// `s[j] = sum_c a[c] * mt[c][j]` for the blocks of [`CH`] keys that cover `0..n`.
    #[inline(always)]
    fn times_rows<const F: bool>(a: &[f32], mt: &[f32], lp: usize, n: usize, s: &mut [f32]) {
        for j0 in (0..n).step_by(CH) {
            let mut acc = [0f32; CH];
            for (c, &ac) in a.iter().enumerate() {
                let m = &mt[c * lp + j0..][..CH];
                for l in 0..CH {
                    acc[l] = madd::<F>(ac, m[l], acc[l]);
                }
            }
            s[j0..j0 + CH].copy_from_slice(&acc);
        }
    }

    /// `out[c] = sum_{j < n} w[j] * x[j * stride + c]`: rows of `x` (keys or values in their
    /// token-major layout) weighted by `w`, in four interleaved chains of 16 columns.
    #[inline(always)]
    fn weighted_sum<const F: bool>(w: &[f32], x: &[f32], stride: usize, n: usize, out: &mut [f32]) {
        let d = out.len();
        let full = d / 16 * 16;
        for c0 in (0..full).step_by(16) {
            let mut acc = [[0f32; 16]; 4];
            let mut j = 0;
            while j + 4 <= n {
                for (ph, acc) in acc.iter_mut().enumerate() {
                    let row = &x[(j + ph) * stride + c0..][..16];
                    let wj = w[j + ph];
                    for l in 0..16 {
                        acc[l] = madd::<F>(wj, row[l], acc[l]);
                    }
                }
                j += 4;
            }
            for (jj, &wj) in w.iter().enumerate().take(n).skip(j) {
                let row = &x[jj * stride + c0..][..16];
                for l in 0..16 {
                    acc[0][l] = madd::<F>(wj, row[l], acc[0][l]);
                }
            }
            for l in 0..16 {
                out[c0 + l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
            }
        }
        for (c, o) in out.iter_mut().enumerate().skip(full) {
            let mut sum = 0f32;
            for (j, &wj) in w.iter().enumerate().take(n) {
                sum = madd::<F>(wj, x[j * stride + c], sum);
            }
            *o = sum;
        }
    }

    /// The four rows of length `lp` in `x`.
    fn block(x: &[f32], lp: usize) -> [&[f32]; 4] {
        [0, 1, 2, 3].map(|r| &x[r * lp..(r + 1) * lp])
    }

    /// `mt[c][j] += sum_r a[r][c] * w[r][j]` for `j < n32`: four rows' outer products added in
    /// one pass over `mt`.
    #[inline(always)]
    fn add_outer4<const F: bool>(
        a: [&[f32]; 4],
        w: [&[f32]; 4],
        mt: &mut [f32],
        lp: usize,
        n32: usize,
    ) {
        let w = w.map(|w| &w[..n32]);
        for c in 0..a[0].len() {
            let (a0, a1, a2, a3) = (a[0][c], a[1][c], a[2][c], a[3][c]);
            let m = &mut mt[c * lp..][..n32];
            // eight lanes at a time through a local array, so that the loop vectorises without
            // the compiler's runtime checks that `m` overlaps none of the four rows
            for (j0, mc) in (0..n32).step_by(8).zip(m.chunks_exact_mut(8)) {
                let rows = w.map(|w| &w[j0..j0 + 8]);
                let mut t = [0f32; 8];
                for l in 0..8 {
                    let x = madd::<F>(a0, rows[0][l], mc[l]);
                    let x = madd::<F>(a1, rows[1][l], x);
                    let x = madd::<F>(a2, rows[2][l], x);
                    t[l] = madd::<F>(a3, rows[3][l], x);
                }
                mc.copy_from_slice(&t);
            }
        }
    }

    /// Row `i`'s probabilities over keys `0..n` into `p[..n]` from the scaled query `qs`, and
    /// zeros in `p[n..n32]`.
    #[inline(always)]
    /// A query's probabilities over keys `0..n` into `p`: zero before `n - window` (a sliding
    /// window's earlier keys, whose scores are computed and dropped), and past `n`.
    fn probs<const F: bool>(
        qs: &[f32],
        kt: &[f32],
        lp: usize,
        n: usize,
        window: usize,
        p: &mut [f32],
    ) {
        let n32 = n.div_ceil(CH) * CH;
        times_rows::<F>(qs, kt, lp, n, p);
        let lo = n.saturating_sub(window);
        let max = crate::simd::lane_max(&p[lo..n]);
        let sum = crate::simd::exp_sub_sum(&mut p[lo..n], max);
        let inv = 1.0 / sum;
        for s in p[lo..n].iter_mut() {
            *s *= inv;
        }
        p[..lo].fill(0.0);
        p[n..n32].fill(0.0);
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn forward_body<const F: bool>(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        out: SendPtr,
        dims: Dims,
        start: usize,
        len: usize,
        g: usize,
    ) {
        let d = dims.d;
        let rep = dims.hq / dims.hkv;
        let lp = len.div_ceil(CH) * CH;
        let kt = transpose(k, dims, start, len, g, lp);
        let mut p = vec![0f32; lp];
        let mut qs = vec![0f32; d];
        for h in g * rep..(g + 1) * rep {
            for i in 0..len {
                let row = ((start + i) * dims.hq + h) * d;
                for (s, &x) in qs.iter_mut().zip(&q[row..row + d]) {
                    *s = x * dims.scale;
                }
                let n = i + 1;
                probs::<F>(&qs, &kt, lp, n, dims.window, &mut p);
                // SAFETY: `row..row + d` is this task's output row (the caller's promise).
                let dst = unsafe { std::slice::from_raw_parts_mut(out.get().add(row), d) };
                weighted_sum::<F>(&p, &v[(start * dims.hkv + g) * d..], dims.hkv * d, n, dst);
            }
        }
    }

    #[inline(always)]
    unsafe fn backward_body<const F: bool>(
        ins: BwdInputs,
        outs: (SendPtr, SendPtr, SendPtr),
        dims: Dims,
        start: usize,
        len: usize,
        g: usize,
    ) {
        let d = dims.d;
        let rep = dims.hq / dims.hkv;
        let lp = len.div_ceil(CH) * CH;
        let (kt, vt) = (
            transpose(ins.k, dims, start, len, g, lp),
            transpose(ins.v, dims, start, len, g, lp),
        );
        // rows go in blocks of four: dK and dV take the block's outer products in one pass
        let mut p = vec![0f32; 4 * lp];
        let mut ds = vec![0f32; 4 * lp];
        let mut qs = vec![0f32; d];
        let zeros = vec![0f32; d];
        let mut dkt = vec![0f32; d * lp];
        let mut dvt = vec![0f32; d * lp];
        let kv0 = (start * dims.hkv + g) * d;
        let stride = dims.hkv * d;
        for h in g * rep..(g + 1) * rep {
            for i0 in (0..len).step_by(4) {
                let rows = 4.min(len - i0);
                let n32 = (i0 + rows).div_ceil(CH) * CH;
                let mut qi = [&zeros[..]; 4];
                let mut goi = [&zeros[..]; 4];
                for r in 0..4 {
                    let (p, ds) = (&mut p[r * lp..][..lp], &mut ds[r * lp..][..lp]);
                    if r >= rows {
                        p[..n32].fill(0.0);
                        ds[..n32].fill(0.0);
                        continue;
                    }
                    let i = i0 + r;
                    let row = ((start + i) * dims.hq + h) * d;
                    qi[r] = &ins.q[row..row + d];
                    goi[r] = &ins.go[row..row + d];
                    for (s, &x) in qs.iter_mut().zip(qi[r]) {
                        *s = x * dims.scale;
                    }
                    let n = i + 1;
                    probs::<F>(&qs, &kt, lp, n, dims.window, p);
                    p[n.div_ceil(CH) * CH..n32].fill(0.0);
                    // dS_j = P_j (dP_j - dO_i · O_i), with dP_j = dO_i · V_j; the scale of the
                    // scores is folded in.
                    let delta = dot::<F>(goi[r], &ins.o[row..row + d]);
                    times_rows::<F>(goi[r], &vt, lp, n, ds);
                    for (dsj, &pj) in ds[..n32].iter_mut().zip(&p[..n32]) {
                        *dsj = pj * (*dsj - delta) * dims.scale;
                    }
                    // SAFETY: `row..row + d` is this task's row of dQ (the caller's promise).
                    let dq = unsafe { std::slice::from_raw_parts_mut(outs.0.get().add(row), d) };
                    weighted_sum::<F>(ds, &ins.k[kv0..], stride, n, dq);
                }
                add_outer4::<F>(qi, block(&ds, lp), &mut dkt, lp, n32);
                add_outer4::<F>(goi, block(&p, lp), &mut dvt, lp, n32);
            }
        }
        for j in 0..len {
            let kv_row = ((start + j) * dims.hkv + g) * d;
            // SAFETY: rows of KV head `g` in this sequence belong to this task only.
            let (dk, dv) = unsafe {
                (
                    std::slice::from_raw_parts_mut(outs.1.get().add(kv_row), d),
                    std::slice::from_raw_parts_mut(outs.2.get().add(kv_row), d),
                )
            };
            for c in 0..d {
                dk[c] = dkt[c * lp + j];
                dv[c] = dvt[c * lp + j];
            }
        }
    }
}
