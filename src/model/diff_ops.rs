//! RMS norm, RoPE and the SwiGLU and GeGLU products as single candle ops **with** backward
//! passes, for f32 on the CPU (training).
//!
//! candle's fused `rms_norm` and `rope` record no backward pass, so the model composes them from
//! elementary ops when it trains; on the CPU each of those ops is one single-threaded pass over
//! memory with a fresh allocation, and their backward passes are as many again: at small model
//! sizes they cost more than the matmuls. Each op here is one parallel pass forward and one
//! backward, with the gradients written out by hand (and tested against the composed ops).
//! Knows nothing of layers or weights' names.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::config::Activation;
use super::cpu_op::{slice, view};

/// Whether these ops run on `x` (f32 on the CPU); otherwise callers compose candle ops.
pub fn supported(x: &Tensor) -> bool {
    x.device().is_cpu() && x.dtype() == DType::F32
}

/// Rows per rayon task: enough work per task to pay for the hand-off.
fn rows_per_task(width: usize) -> usize {
    (16_384 / width.max(1)).max(1)
}

// ---------------------------------------------------------------------------------------------
// RMS norm
// ---------------------------------------------------------------------------------------------

struct RmsNormOp {
    eps: f32,
}

/// `x / sqrt(mean(x^2) + eps) * w` over the last dim; differentiable in `x` and `w`.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    x.contiguous()?
        .apply_op2(&w.contiguous()?, RmsNormOp { eps: eps as f32 })
}

impl CustomOp2 for RmsNormOp {
    fn name(&self) -> &'static str {
        "rms-norm-diff"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, w) = (slice(s1, l1)?, slice(s2, l2)?);
        let h = w.len();
        if l1.dims().last() != Some(&h) {
            candle_core::bail!("rms norm: weight of {h} for input {:?}", l1.dims());
        }
        let mut y = vec![0f32; x.len()];
        let chunk = rows_per_task(h) * h;
        y.par_chunks_mut(chunk)
            .zip(x.par_chunks(chunk))
            .for_each(|(ys, xs)| {
                for (yr, xr) in ys.chunks_mut(h).zip(xs.chunks(h)) {
                    let r = inv_rms(xr, self.eps);
                    for ((y, x), w) in yr.iter_mut().zip(xr).zip(w) {
                        *y = x * r * w;
                    }
                }
            });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let (xg, wg, gg) = (view(x)?, view(w)?, view(&grad)?);
        let (xv, wv, gv) = (xg.get()?, wg.get()?, gg.get()?);
        let h = wv.len();
        let mut dx = vec![0f32; xv.len()];
        let chunk = rows_per_task(h) * h;
        // dx = r * (g*w - x * r^2 * mean(g*w*x));  dw = sum over rows of g * x * r.
        let dw = dx
            .par_chunks_mut(chunk)
            .zip(xv.par_chunks(chunk).zip(gv.par_chunks(chunk)))
            .map(|(dxs, (xs, gs))| {
                let mut dw = vec![0f32; h];
                for ((dxr, xr), gr) in dxs.chunks_mut(h).zip(xs.chunks(h)).zip(gs.chunks(h)) {
                    let r = inv_rms(xr, self.eps);
                    let mut dot = 0f32;
                    for ((x, g), w) in xr.iter().zip(gr).zip(wv) {
                        dot += g * w * x;
                    }
                    let c = r * r * r * dot / h as f32;
                    for (i, ((dx, x), g)) in dxr.iter_mut().zip(xr).zip(gr).enumerate() {
                        *dx = r * g * wv[i] - c * x;
                        dw[i] += g * x * r;
                    }
                }
                dw
            })
            .reduce(
                || vec![0f32; h],
                |mut a, b| {
                    for (a, b) in a.iter_mut().zip(b) {
                        *a += b;
                    }
                    a
                },
            );
        Ok((
            Some(Tensor::from_vec(dx, x.shape(), x.device())?),
            Some(Tensor::from_vec(dw, w.shape(), w.device())?),
        ))
    }
}

#[inline]
fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    1.0 / (ss / x.len() as f32 + eps).sqrt()
}

// ---------------------------------------------------------------------------------------------
// RoPE
// ---------------------------------------------------------------------------------------------

struct RopeOp;

/// Rotates `x` (T, H, D) by `cos`, `sin` (T, D/2) in the `rotate_half` layout; differentiable
/// in `x` (the tables are constants).
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    x.contiguous()?
        .apply_op3(&cos.contiguous()?, &sin.contiguous()?, RopeOp)
}

/// `y = rot(x)` with sign `s`: forward (s = 1) or its transpose, the backward (s = -1).
fn rotate(x: &[f32], cos: &[f32], sin: &[f32], dims: (usize, usize, usize), s: f32) -> Vec<f32> {
    let (_, h, d) = dims;
    let half = d / 2;
    let mut y = vec![0f32; x.len()];
    y.par_chunks_mut(h * d)
        .zip(x.par_chunks(h * d))
        .enumerate()
        .for_each(|(t, (yt, xt))| {
            let (c, sn) = (&cos[t * half..][..half], &sin[t * half..][..half]);
            for (yr, xr) in yt.chunks_mut(d).zip(xt.chunks(d)) {
                let (x1, x2) = xr.split_at(half);
                let (y1, y2) = yr.split_at_mut(half);
                for i in 0..half {
                    y1[i] = x1[i] * c[i] - s * x2[i] * sn[i];
                    y2[i] = x2[i] * c[i] + s * x1[i] * sn[i];
                }
            }
        });
    y
}

fn rope_dims(x: &[usize], cos: &[usize], sin: &[usize]) -> Result<(usize, usize, usize)> {
    let &[t, h, d] = x else {
        candle_core::bail!("rope wants (T, H, D), got {x:?}")
    };
    if cos != [t, d / 2] || sin != [t, d / 2] || d % 2 != 0 {
        candle_core::bail!("rope: tables {cos:?} {sin:?} for input {x:?}");
    }
    Ok((t, h, d))
}

impl CustomOp3 for RopeOp {
    fn name(&self) -> &'static str {
        "rope-diff"
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
        let dims = rope_dims(l1.dims(), l2.dims(), l3.dims())?;
        let y = rotate(slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?, dims, 1.0);
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dims = rope_dims(x.dims(), cos.dims(), sin.dims())?;
        let grad = grad.contiguous()?;
        let (gg, cg, sg) = (view(&grad)?, view(cos)?, view(sin)?);
        let dx = rotate(gg.get()?, cg.get()?, sg.get()?, dims, -1.0);
        Ok((
            Some(Tensor::from_vec(dx, x.shape(), x.device())?),
            None,
            None,
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Gated MLP products: SwiGLU and GeGLU
// ---------------------------------------------------------------------------------------------

/// `act(g) * u` for the MLP's activation.
struct GatedOp(Activation);

/// `silu(g) * u`; differentiable in both.
pub fn swiglu(g: &Tensor, u: &Tensor) -> Result<Tensor> {
    g.contiguous()?
        .apply_op2(&u.contiguous()?, GatedOp(Activation::Silu))
}

/// `gelu_tanh(g) * u` (Gemma's GeGLU); differentiable in both.
pub fn geglu(g: &Tensor, u: &Tensor) -> Result<Tensor> {
    g.contiguous()?
        .apply_op2(&u.contiguous()?, GatedOp(Activation::GeluTanh))
}

const SQRT_TWO_OVER_PI: f32 = 0.797_884_6;
const GELU_CUBIC: f32 = 0.044_715;

/// `tanh(x)` as `1 - 2 / (1 + e^2x)`, the exponential [`crate::simd::fast_exp`] with `FAST`.
#[inline(always)]
fn tanh<const FAST: bool>(x: f32) -> f32 {
    if !FAST {
        return x.tanh();
    }
    1.0 - 2.0 / (1.0 + crate::simd::fast_exp(2.0 * x))
}

/// `y = gelu_tanh(g) * u` on one chunk.
#[inline(always)]
fn geglu_fwd_body<const FAST: bool>(ys: &mut [f32], gs: &[f32], us: &[f32]) {
    for ((y, &g), u) in ys.iter_mut().zip(gs).zip(us) {
        let t = tanh::<FAST>(SQRT_TWO_OVER_PI * g * (1.0 + GELU_CUBIC * g * g));
        *y = 0.5 * g * (1.0 + t) * u;
    }
}

/// The gradients of `gelu_tanh(g) * u` on one chunk.
#[inline(always)]
fn geglu_bwd_body<const FAST: bool>(
    dgs: &mut [f32],
    dus: &mut [f32],
    gs: &[f32],
    us: &[f32],
    dys: &[f32],
) {
    for i in 0..gs
        .len()
        .min(dgs.len())
        .min(dus.len())
        .min(us.len())
        .min(dys.len())
    {
        let g = gs[i];
        let t = tanh::<FAST>(SQRT_TWO_OVER_PI * g * (1.0 + GELU_CUBIC * g * g));
        let gelu = 0.5 * g * (1.0 + t);
        let slope = 0.5 * (1.0 + t)
            + 0.5 * g * (1.0 - t * t) * SQRT_TWO_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * g * g);
        dus[i] = dys[i] * gelu;
        dgs[i] = dys[i] * us[i] * slope;
    }
}

crate::simd::avx2_fma_dispatch! {
    fn geglu_fwd_chunk(ys: &mut [f32], gs: &[f32], us: &[f32]) => generic geglu_fwd_body
}

crate::simd::avx2_fma_dispatch! {
    fn geglu_bwd_chunk(dgs: &mut [f32], dus: &mut [f32], gs: &[f32], us: &[f32], dys: &[f32])
        => generic geglu_bwd_body
}

/// `1 / (1 + e^-x)`; with `FAST` (the AVX2 build) the exponential is [`crate::simd::fast_exp`]
/// (within 2 ulp of libm), which vectorises where a call to libm's `expf` does not.
#[inline(always)]
fn sigmoid<const FAST: bool>(x: f32) -> f32 {
    let e = if FAST {
        crate::simd::fast_exp(-x)
    } else {
        (-x).exp()
    };
    1.0 / (1.0 + e)
}

/// `y = silu(g) * u` on one chunk.
#[inline(always)]
fn swiglu_fwd_body<const FAST: bool>(ys: &mut [f32], gs: &[f32], us: &[f32]) {
    for ((y, g), u) in ys.iter_mut().zip(gs).zip(us) {
        *y = g * sigmoid::<FAST>(*g) * u;
    }
}

/// The gradients of `silu(g) * u` on one chunk.
#[inline(always)]
fn swiglu_bwd_body<const FAST: bool>(
    dgs: &mut [f32],
    dus: &mut [f32],
    gs: &[f32],
    us: &[f32],
    dys: &[f32],
) {
    for i in 0..gs
        .len()
        .min(dgs.len())
        .min(dus.len())
        .min(us.len())
        .min(dys.len())
    {
        let s = sigmoid::<FAST>(gs[i]);
        let silu = gs[i] * s;
        dus[i] = dys[i] * silu;
        dgs[i] = dys[i] * us[i] * s * (1.0 + gs[i] * (1.0 - s));
    }
}

crate::simd::avx2_fma_dispatch! {
    fn swiglu_fwd_chunk(ys: &mut [f32], gs: &[f32], us: &[f32]) => generic swiglu_fwd_body
}

crate::simd::avx2_fma_dispatch! {
    fn swiglu_bwd_chunk(dgs: &mut [f32], dus: &mut [f32], gs: &[f32], us: &[f32], dys: &[f32])
        => generic swiglu_bwd_body
}

impl CustomOp2 for GatedOp {
    fn name(&self) -> &'static str {
        match self.0 {
            Activation::Silu => "swiglu-diff",
            Activation::GeluTanh => "geglu-diff",
        }
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (g, u) = (slice(s1, l1)?, slice(s2, l2)?);
        if l1.dims() != l2.dims() {
            candle_core::bail!("{}: {:?} vs {:?}", self.name(), l1.dims(), l2.dims());
        }
        let mut y = vec![0f32; g.len()];
        let chunk = match self.0 {
            Activation::Silu => swiglu_fwd_chunk,
            Activation::GeluTanh => geglu_fwd_chunk,
        };
        y.par_chunks_mut(16_384)
            .zip(g.par_chunks(16_384).zip(u.par_chunks(16_384)))
            .for_each(|(ys, (gs, us))| chunk(ys, gs, us));
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        g: &Tensor,
        u: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let (gg, ug, dg_) = (view(g)?, view(u)?, view(&grad)?);
        let (gv, uv, dy) = (gg.get()?, ug.get()?, dg_.get()?);
        let mut dg = vec![0f32; gv.len()];
        let mut du = vec![0f32; gv.len()];
        let chunk = match self.0 {
            Activation::Silu => swiglu_bwd_chunk,
            Activation::GeluTanh => geglu_bwd_chunk,
        };
        dg.par_chunks_mut(16_384)
            .zip(du.par_chunks_mut(16_384))
            .zip(gv.par_chunks(16_384).zip(uv.par_chunks(16_384)))
            .zip(dy.par_chunks(16_384))
            .for_each(|(((dgs, dus), (gs, us)), dys)| chunk(dgs, dus, gs, us, dys));
        Ok((
            Some(Tensor::from_vec(dg, g.shape(), g.device())?),
            Some(Tensor::from_vec(du, u.shape(), u.device())?),
        ))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor, Var, D};

    use crate::model::tests::max_abs_diff;

    fn var(shape: &[usize]) -> Var {
        Var::from_tensor(&Tensor::randn(0f32, 1.0, shape, &Device::Cpu).unwrap()).unwrap()
    }

    /// Runs `f` and `reference` on the same inputs, checks the outputs and each input's gradient
    /// under a random upstream gradient.
    fn check(what: &str, inputs: &[&Var], f: impl Fn() -> Tensor, reference: impl Fn() -> Tensor) {
        let (a, b) = (f(), reference());
        assert!(max_abs_diff(&a, &b) < 1e-5, "{what}: outputs differ");
        let up = Tensor::randn(0f32, 1.0, a.shape(), &Device::Cpu).unwrap();
        let ga = (a * &up).unwrap().sum_all().unwrap().backward().unwrap();
        let gb = (b * &up).unwrap().sum_all().unwrap().backward().unwrap();
        for (i, x) in inputs.iter().enumerate() {
            let (a, b) = (ga.get(x).unwrap(), gb.get(x).unwrap());
            // Relative to the largest gradient: a weight's gradient sums thousands of rows.
            let scale = max_abs_diff(b, &b.zeros_like().unwrap()).max(1.0);
            let d = max_abs_diff(a, b) / scale;
            assert!(
                d < 1e-5,
                "{what}: gradient of input {i} differs by {d} (relative)"
            );
        }
    }

    #[test]
    fn ops_match_the_composed_candle_ops_and_their_gradients() {
        // RMS norm over 3 dims of rows, many rows (several rayon tasks).
        let (x, w) = (var(&[300, 7, 64]), var(&[64]));
        check(
            "rms_norm",
            &[&x, &w],
            || super::rms_norm(&x, &w, 1e-6).unwrap(),
            || {
                let ms = x.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
                x.broadcast_div(&(ms + 1e-6).unwrap().sqrt().unwrap())
                    .unwrap()
                    .broadcast_mul(&w)
                    .unwrap()
            },
        );
        // RoPE against the rotate_half composition.
        let (t, h, d) = (11, 3, 16);
        let x = var(&[t, h, d]);
        let cos = Tensor::randn(0f32, 1.0, (t, d / 2), &Device::Cpu).unwrap();
        let sin = Tensor::randn(0f32, 1.0, (t, d / 2), &Device::Cpu).unwrap();
        check(
            "rope",
            &[&x],
            || super::rope(&x, &cos, &sin).unwrap(),
            || {
                let cf = Tensor::cat(&[&cos, &cos], 1).unwrap().unsqueeze(1).unwrap();
                let sf = Tensor::cat(&[&sin, &sin], 1).unwrap().unsqueeze(1).unwrap();
                let x1 = x.narrow(2, 0, d / 2).unwrap();
                let x2 = x.narrow(2, d / 2, d / 2).unwrap();
                let rot = Tensor::cat(&[&x2.neg().unwrap(), &x1], 2).unwrap();
                (x.broadcast_mul(&cf).unwrap() + rot.broadcast_mul(&sf).unwrap()).unwrap()
            },
        );
        // SwiGLU over more elements than one task.
        let (g, u) = (var(&[50, 700]), var(&[50, 700]));
        check(
            "swiglu",
            &[&g, &u],
            || super::swiglu(&g, &u).unwrap(),
            || (g.silu().unwrap() * u.as_tensor()).unwrap(),
        );
        // GeGLU against candle's gelu (the tanh form) and its backward, with inputs wide enough
        // for both tails of the tanh
        let (g, u) = (var(&[50, 700]), var(&[50, 700]));
        let g = Var::from_tensor(&(g.as_tensor() * 4.0).unwrap()).unwrap();
        check(
            "geglu",
            &[&g, &u],
            || super::geglu(&g, &u).unwrap(),
            || (g.gelu().unwrap() * u.as_tensor()).unwrap(),
        );
    }
}
