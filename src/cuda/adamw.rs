//! Launchers for `kernels/adamw.cu`: one parameter's AdamW update with f32 master weights and
//! moments as one kernel, in place, with the step's statistics as per-block partial sums
//! ([`update`]); a gradient's sum of squares for the global norm the same way
//! ([`sum_squares`]).
//! Knows the kernel's layout, not the optimizer: `train::adamw` holds the maths' reference (its
//! host passes, which this kernel equals bit for bit) and decides when to call this.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::{bail, DType, Result, Tensor};

use super::kernels::{checked, module_fn, tensor_ptr, ADAMW_PTX};

/// A step's constants, as `train::adamw`'s `Step` holds them.
#[derive(Debug, Clone, Copy)]
pub struct AdamStep {
    /// The gradient's clip multiplier, when clipping.
    pub clip: Option<f32>,
    /// The weight's decay multiplier, when it decays.
    pub decay_mul: Option<f32>,
    pub b1: f32,
    pub one_b1: f32,
    pub b2: f32,
    pub one_b2: f32,
    pub inv_bias2_sqrt: f32,
    pub eps: f32,
    pub step_size: f32,
    /// The dtype "changed" is judged in: f32, bf16 or f16.
    pub stored: DType,
}

/// Most blocks one update launches: four per SM of a 132-SM GPU, so that the partial sums read
/// back stay small (at most 3 x 528 values a parameter).
const MAX_BLOCKS: usize = 528;

/// The blocks an update of `n` elements launches (each thread takes 8 elements at least).
pub fn blocks(n: usize) -> usize {
    n.div_ceil(256 * 8).clamp(1, MAX_BLOCKS)
}

/// Updates the master weights `p`, the moments `m` and `v` (f32, contiguous, one device) in
/// place from the gradient `g` (f32), and the working copy `work` (bf16) when given. Returns the
/// partial sums (blocks x 3 f32: the update's squares, the old weights' squares, the weights
/// whose stored value changed), for the step's one read-back.
pub fn update(
    p: &Tensor,
    m: &Tensor,
    v: &Tensor,
    g: &Tensor,
    work: Option<&Tensor>,
    st: &AdamStep,
) -> Result<Tensor> {
    let n = p.elem_count();
    let f32s = [p, m, v, g];
    if f32s
        .iter()
        .any(|t| t.dtype() != DType::F32 || t.elem_count() != n || !t.is_contiguous())
    {
        bail!("adamw kernel: the weights, moments and gradient must be contiguous f32 of {n}");
    }
    if work.is_some_and(|w| w.dtype() != DType::BF16 || w.elem_count() != n) {
        bail!("adamw kernel: the working copy must be bf16 of {n}");
    }
    let stored: i32 = match st.stored {
        DType::F32 => 0,
        DType::BF16 => 1,
        DType::F16 => 2,
        other => bail!("adamw kernel: a model stored in {other:?}"),
    };
    let nb = blocks(n);
    let partials = Tensor::zeros(nb * 3, DType::F32, p.device())?;
    if n == 0 {
        return Ok(partials);
    }
    let ptrs = [
        tensor_ptr(p)?,
        tensor_ptr(m)?,
        tensor_ptr(v)?,
        tensor_ptr(g)?,
        work.map(tensor_ptr).transpose()?.unwrap_or(0),
        tensor_ptr(&partials)?,
    ];
    let dev = p.device().as_cuda_device()?;
    let f = module_fn(dev, "adamw_f32", "selfdistill_adamw", ADAMW_PTX)?;
    let stream = dev.cuda_stream();
    let mut l = stream.launch_builder(&f);
    for q in &ptrs {
        l.arg(q);
    }
    let n_i = n as i64;
    let (clip, has_clip) = (st.clip.unwrap_or(1.0), i32::from(st.clip.is_some()));
    let (decay, has_decay) = (
        st.decay_mul.unwrap_or(1.0),
        i32::from(st.decay_mul.is_some()),
    );
    l.arg(&n_i)
        .arg(&clip)
        .arg(&has_clip)
        .arg(&decay)
        .arg(&has_decay);
    let fs = [
        st.b1,
        st.one_b1,
        st.b2,
        st.one_b2,
        st.inv_bias2_sqrt,
        st.eps,
        st.step_size,
    ];
    for x in &fs {
        l.arg(x);
    }
    l.arg(&stored);
    let cfg = LaunchConfig {
        grid_dim: (nb as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match `adamw_f32` in kernels/adamw.cu (pointers as u64, a missing
    // working copy as 0, int64_t as i64, float as f32, int as i32); every tensor was checked to
    // hold n contiguous elements of its dtype, `partials` holds blocks x 3, and they outlive the
    // launch (stream order).
    checked(unsafe { l.launch(cfg) })?;
    Ok(partials)
}

/// The sum of squares of the f32 gradient `g` (contiguous) as per-block partial sums (blocks
/// f32, each summed in f64), for the global norm's one read-back.
pub fn sum_squares(g: &Tensor) -> Result<Tensor> {
    let n = g.elem_count();
    if g.dtype() != DType::F32 || !g.is_contiguous() {
        bail!("sum_squares kernel: the gradient must be contiguous f32");
    }
    let nb = blocks(n);
    let partials = Tensor::zeros(nb, DType::F32, g.device())?;
    if n == 0 {
        return Ok(partials);
    }
    let (g_p, out_p, n_i) = (tensor_ptr(g)?, tensor_ptr(&partials)?, n as i64);
    let dev = g.device().as_cuda_device()?;
    let f = module_fn(dev, "sum_squares_f32", "selfdistill_adamw", ADAMW_PTX)?;
    let stream = dev.cuda_stream();
    let mut l = stream.launch_builder(&f);
    l.arg(&g_p).arg(&out_p).arg(&n_i);
    let cfg = LaunchConfig {
        grid_dim: (nb as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match `sum_squares_f32` in kernels/adamw.cu (pointers as u64,
    // int64_t as i64); `g` holds n contiguous f32, `partials` one value a block, and both
    // outlive the launch (stream order).
    checked(unsafe { l.launch(cfg) })?;
    Ok(partials)
}
