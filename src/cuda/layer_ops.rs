//! Launchers for `kernels/layer_ops.cu`: the layer operations a sampling step runs as one kernel
//! where candle runs several. [`qkv_rope`]: the stacked q/k/v projection's rows into q, k, v
//! (and Qwen3.5's output gate), the per-head q/k norms, RoPE and the query scale;
//! [`add_rms_norm`]: the residual add and the next norm; [`gate_up_act`]: the gated MLP's
//! activation product on the stacked gate/up projection's rows. Knows the kernels' layouts and
//! which shapes they take, not the model: the candle layer ops (`model::layer_ops::candle_ops`)
//! hold the maths' reference and decide when to call this.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::op::BackpropOp;
use candle_core::{bail, CudaStorage, DType, Result, Storage, Tensor};

use super::kernels::{checked, module_fn, rows_ptr, tensor_ptr, LAYER_OPS_PTX};
pub use super::shapes::QkvShape;

/// What [`qkv_rope`] reads: the projection's rows `y` (T, W), a matrix or a view of some
/// columns of one; the norms' scales (D) with any offset applied, or none; RoPE's cos and sin
/// rows (T, R/2); all in the model's dtype (f32 or bf16).
pub struct QkvRopeIn<'a> {
    pub y: &'a Tensor,
    pub norms: Option<(&'a Tensor, &'a Tensor)>,
    pub cos: &'a Tensor,
    pub sin: &'a Tensor,
}

/// q (T, hq, D), k and v (T, hkv, D), the gate (T, hq D) of a gated layer.
pub type QkvOut = (Tensor, Tensor, Tensor, Option<Tensor>);

/// The kernels' name for `dt`.
fn dtype_name(dt: DType) -> Result<&'static str> {
    Ok(match dt {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        other => bail!("layer op kernels: {other:?} (f32 or bf16)"),
    })
}

/// `name` for `t`'s dtype, loaded on `t`'s device, and the device.
fn kernel(
    t: &Tensor,
    name: &str,
) -> Result<(
    candle_core::cuda_backend::cudarc::driver::CudaFunction,
    candle_core::CudaDevice,
)> {
    let Storage::Cuda(cs) = &*t.storage_and_layout().0 else {
        bail!("{name}: not on a CUDA device")
    };
    let dev = cs.device.clone();
    let full = format!("{name}_{}", dtype_name(t.dtype())?);
    let f = module_fn(&dev, &full, "selfdistill_layer_ops", LAYER_OPS_PTX)?;
    Ok((f, dev))
}

/// A new buffer of `dims` in `like`'s dtype and device for a kernel to write every element of.
fn output(like: &Tensor, dims: &[usize]) -> Result<Tensor> {
    let Storage::Cuda(cs) = &*like.storage_and_layout().0 else {
        bail!("layer op kernels: not on a CUDA device")
    };
    let dev = cs.device.clone();
    let n = dims.iter().product();
    // SAFETY: the kernel writes every element before anything reads it.
    let storage = match like.dtype() {
        DType::F32 => CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<f32>(n)? }, dev),
        _ => CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<half::bf16>(n)? }, dev),
    };
    Ok(Tensor::from_storage(
        Storage::Cuda(storage),
        dims,
        BackpropOp::none(),
        false,
    ))
}

/// The q/k/v epilogue of an attention layer's sampling step, one launch.
pub fn qkv_rope(shape: &QkvShape, x: &QkvRopeIn) -> Result<QkvOut> {
    let QkvShape {
        heads: hq,
        kv_heads: hkv,
        head_dim: d,
        rotary: r,
        gate,
        ..
    } = *shape;
    let (t, w) = x.y.dims2()?;
    let dt = x.y.dtype();
    if !shape.supported() || w != shape.width() {
        bail!("qkv_rope: rows {:?} for {shape:?}", x.y.dims());
    }
    let same = |a: &Tensor, dims: &[usize]| a.dtype() == dt && a.dims() == dims;
    if !same(x.cos, &[t, r / 2]) || !same(x.sin, &[t, r / 2]) {
        bail!(
            "qkv_rope: RoPE rows {:?} {:?}, not ({t}, {}) {dt:?}",
            x.cos.dims(),
            x.cos.dtype(),
            r / 2
        );
    }
    if let Some((qn, kn)) = x.norms {
        if !same(qn, &[d]) || !same(kn, &[d]) {
            bail!(
                "qkv_rope: norm scales {:?} {:?}, not ({d}) {dt:?}",
                qn.dims(),
                kn.dims()
            );
        }
    }
    let q = output(x.y, &[t, hq, d])?;
    let k = output(x.y, &[t, hkv, d])?;
    let v = output(x.y, &[t, hkv, d])?;
    let g = gate.then(|| output(x.y, &[t, hq * d])).transpose()?;
    if t == 0 {
        return Ok((q, k, v, g));
    }
    let (cos, sin) = (x.cos.contiguous()?, x.sin.contiguous()?);
    let ((y_p, ld), cos_p, sin_p) = (rows_ptr(x.y)?, tensor_ptr(&cos)?, tensor_ptr(&sin)?);
    let (qn_p, kn_p) = match x.norms {
        Some((qn, kn)) => (tensor_ptr(qn)?, tensor_ptr(kn)?),
        None => (0, 0),
    };
    let outs = [
        tensor_ptr(&q)?,
        tensor_ptr(&k)?,
        tensor_ptr(&v)?,
        g.as_ref().map(tensor_ptr).transpose()?.unwrap_or(0),
    ];
    let (f, dev) = kernel(x.y, "qkv_rope")?;
    let stream = dev.cuda_stream();
    let mut l = stream.launch_builder(&f);
    l.arg(&y_p)
        .arg(&ld)
        .arg(&qn_p)
        .arg(&kn_p)
        .arg(&cos_p)
        .arg(&sin_p);
    for p in &outs {
        l.arg(p);
    }
    let ints = [hq as i32, hkv as i32, d as i32, r as i32, i32::from(gate)];
    for i in &ints {
        l.arg(i);
    }
    let (eps, q_scale) = (shape.eps as f32, shape.q_scale as f32);
    l.arg(&eps).arg(&q_scale);
    let blocks_y = hq + 2 * hkv + if gate { hq } else { 0 };
    let cfg = LaunchConfig {
        grid_dim: (t as u32, blocks_y as u32, 1),
        block_dim: (d as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match `qkv_rope_*` in kernels/layer_ops.cu (pointers as u64, a
    // missing norm or gate as 0, int as i32, int64_t as i64, float as f32); the shapes and
    // dtypes were checked above, and every tensor outlives the launch (stream order).
    checked(unsafe { l.launch(cfg) })?;
    Ok((q, k, v, g))
}

/// The residual add and the next norm of a sampling step, one launch: `(x + y, rmsnorm(x + y) *
/// w)` for rows `x`, `y` (T, H) and the norm's scale `w` (H) (any offset applied), in the model's
/// dtype.
pub fn add_rms_norm(x: &Tensor, y: &Tensor, w: &Tensor, eps: f64) -> Result<(Tensor, Tensor)> {
    let (t, h) = x.dims2()?;
    if y.dims() != [t, h] || w.dims() != [h] || y.dtype() != x.dtype() || w.dtype() != x.dtype() {
        bail!(
            "add_rms_norm: {:?} + {:?} normed by {:?}",
            x.dims(),
            y.dims(),
            w.dims()
        );
    }
    let (s, n) = (output(x, &[t, h])?, output(x, &[t, h])?);
    if t == 0 {
        return Ok((s, n));
    }
    let (x, y, w) = (x.contiguous()?, y.contiguous()?, w.contiguous()?);
    let ptrs = [
        tensor_ptr(&x)?,
        tensor_ptr(&y)?,
        tensor_ptr(&w)?,
        tensor_ptr(&s)?,
        tensor_ptr(&n)?,
    ];
    let (f, dev) = kernel(&x, "add_rms_norm")?;
    let stream = dev.cuda_stream();
    let mut l = stream.launch_builder(&f);
    for p in &ptrs {
        l.arg(p);
    }
    let (h_i, eps) = (h as i32, eps as f32);
    l.arg(&h_i).arg(&eps);
    let cfg = LaunchConfig {
        grid_dim: (t as u32, 1, 1),
        block_dim: (h.next_multiple_of(32).clamp(32, 1024) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match `add_rms_norm_*` in kernels/layer_ops.cu (pointers as u64,
    // int as i32, float as f32); the shapes and dtypes were checked above, the inputs made
    // contiguous, and every tensor outlives the launch (stream order).
    checked(unsafe { l.launch(cfg) })?;
    Ok((s, n))
}

/// The gated MLP's activation product of a sampling step, one launch: `act(g) * u` where `g`
/// and `u` are the two halves of the stacked gate/up projection's rows `y` (T, 2 I), a matrix
/// or a view of one; SiLU, or with `gelu` GELU's tanh approximation. Returns (T, I).
pub fn gate_up_act(y: &Tensor, gelu: bool) -> Result<Tensor> {
    let (t, w) = y.dims2()?;
    if !w.is_multiple_of(2) {
        bail!("gate_up_act: rows of {w} columns are not two halves");
    }
    let inter = w / 2;
    let out = output(y, &[t, inter])?;
    if t == 0 || inter == 0 {
        return Ok(out);
    }
    let y = if y.stride()[1] == 1 {
        y.clone()
    } else {
        y.contiguous()?
    };
    let ((y_p, ld), out_p) = (rows_ptr(&y)?, tensor_ptr(&out)?);
    let (f, dev) = kernel(&y, "gate_up_act")?;
    let stream = dev.cuda_stream();
    let mut l = stream.launch_builder(&f);
    let (inter_i, n, gelu_i) = (inter as i32, (t * inter) as i64, i32::from(gelu));
    l.arg(&y_p)
        .arg(&ld)
        .arg(&out_p)
        .arg(&inter_i)
        .arg(&n)
        .arg(&gelu_i);
    let cfg = LaunchConfig {
        grid_dim: ((t * inter).div_ceil(256).clamp(1, 65_535) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match `gate_up_act_*` in kernels/layer_ops.cu (pointers as u64,
    // int as i32, int64_t as i64); `y` holds t rows of 2 x inter elements `ld` apart, and every
    // tensor outlives the launch (stream order).
    checked(unsafe { l.launch(cfg) })?;
    Ok(out)
}
