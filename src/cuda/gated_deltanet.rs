//! Launchers for `kernels/gated_deltanet.cu`: a Gated DeltaNet decode step (one new token per
//! sequence) as two kernels over the step's gathered states, updated in place, one per layer op:
//! the conv update with SiLU ([`conv_step`]), then gating, l2norm, the delta rule and the gated
//! RMSNorm ([`recurrent_step`]), reading and writing each state once. Knows the kernels' layouts
//! and which shapes they take, not the model: the candle layer ops
//! (`model::layer_ops::candle_deltanet`) hold the maths' reference and decide when to call this.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::op::BackpropOp;
use candle_core::{bail, CudaStorage, DType, Result, Storage, Tensor};

use super::kernels::{checked, module_fn, tensor_ptr, GATED_DELTANET_PTX};
pub use super::shapes::GdnShape;

/// The inputs of the recurrent kernel, all (but `u` and `state`) in the model's dtype (f32 or
/// bf16): the conv's output `u` (B, conv_dim) f32 ([`conv_step`]); the projections `a`, `b`
/// (B, nv), `z` (B, nv dv); the weights `a_log`, `dt_bias` (nv), `norm_w` (dv); `state`
/// (B, values) f32, each row the conv's last K-1 inputs then the heads' recurrent states, the
/// latter updated in place.
pub struct GdnRecurrent<'a> {
    pub u: &'a Tensor,
    pub a: &'a Tensor,
    pub b: &'a Tensor,
    pub z: &'a Tensor,
    pub a_log: &'a Tensor,
    pub dt_bias: &'a Tensor,
    pub norm_w: &'a Tensor,
    pub state: &'a Tensor,
}

/// The kernels' name for the model's dtype.
fn dtype_name(dt: DType) -> Result<&'static str> {
    Ok(match dt {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        other => bail!("gated deltanet kernels: {other:?} (f32 or bf16)"),
    })
}

/// Checks `state` against the shape for `rows` sequences.
fn check_state(shape: &GdnShape, rows: usize, state: &Tensor) -> Result<()> {
    if !shape.supported() {
        bail!("gated deltanet kernels: shape {shape:?} not supported");
    }
    let conv_len = (shape.conv_kernel - 1) * shape.conv_dim();
    if state.dims() != [rows, conv_len + shape.nv * shape.dk * shape.dv]
        || state.dtype() != DType::F32
        || !state.is_contiguous()
    {
        bail!(
            "gated deltanet kernels: state {:?} {:?} does not match {shape:?} at {rows} rows",
            state.dims(),
            state.dtype()
        );
    }
    Ok(())
}

/// A new (rows, cols) buffer of `dt` on `state`'s device, for a kernel to write every element
/// of.
fn output(state: &Tensor, rows: usize, cols: usize, dt: DType) -> Result<Tensor> {
    let Storage::Cuda(cs) = &*state.storage_and_layout().0 else {
        bail!("gated deltanet kernels: the state is not on a CUDA device")
    };
    let dev = cs.device.clone();
    // SAFETY: each caller's kernel writes every element before anything reads it.
    let storage = match dt {
        DType::F32 => CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<f32>(rows * cols)? }, dev),
        _ => CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<half::bf16>(rows * cols)? }, dev),
    };
    Ok(Tensor::from_storage(
        Storage::Cuda(storage),
        (rows, cols),
        BackpropOp::none(),
        false,
    ))
}

/// The conv update of a decode step: `qkv` (B, conv_dim) and the conv's weights `conv_w`
/// (conv_dim, K) in the model's dtype; returns SiLU of the conv (B, conv_dim) f32 and moves the
/// conv inputs of `state` on in place.
pub fn conv_step(
    shape: &GdnShape,
    qkv: &Tensor,
    conv_w: &Tensor,
    state: &Tensor,
) -> Result<Tensor> {
    let (rows, c) = qkv.dims2()?;
    let dt = qkv.dtype();
    let name = dtype_name(dt)?;
    check_state(shape, rows, state)?;
    if c != shape.conv_dim() {
        bail!(
            "gated deltanet kernels: qkv {:?} does not match {shape:?}",
            qkv.dims()
        );
    }
    let prep = |t: &Tensor| t.to_dtype(dt)?.contiguous();
    let (qkv, conv_w) = (prep(qkv)?, prep(conv_w)?);
    let u = output(state, rows, c, DType::F32)?;
    let Storage::Cuda(cs) = &*state.storage_and_layout().0 else {
        bail!("gated deltanet kernels: the state is not on a CUDA device")
    };
    let dev = cs.device.clone();
    let stream = dev.cuda_stream();
    let (qkv_p, state_p, conv_p, u_p) = (
        tensor_ptr(&qkv)?,
        tensor_ptr(state)?,
        tensor_ptr(&conv_w)?,
        tensor_ptr(&u)?,
    );
    let k = shape.conv_kernel;
    let (rows_i, c_i, k_i, values_i) = (rows as i32, c as i32, k as i32, state.dim(1)? as i64);
    let conv = module_fn(
        &dev,
        &format!("gdn_conv_{name}"),
        "selfdistill_gated_deltanet",
        GATED_DELTANET_PTX,
    )?;
    let mut l = stream.launch_builder(&conv);
    l.arg(&qkv_p)
        .arg(&state_p)
        .arg(&conv_p)
        .arg(&u_p)
        .arg(&rows_i)
        .arg(&c_i)
        .arg(&k_i)
        .arg(&values_i);
    let n = rows * c;
    let cfg = LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 8192) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match the kernel's parameters in kernels/gated_deltanet.cu
    // (pointers as u64, int as i32, int64_t as i64), the shapes were checked above, and every
    // tensor outlives the launch (stream order).
    checked(unsafe { l.launch(cfg) })?;
    Ok(u)
}

/// Gating, l2norm, the delta rule and the gated RMSNorm of a decode step; returns the gated
/// norm's output (B, nv dv) in the model's dtype, for the layer's out projection.
pub fn recurrent_step(shape: &GdnShape, x: &GdnRecurrent) -> Result<Tensor> {
    let (rows, c) = x.u.dims2()?;
    let dt = x.z.dtype();
    let name = dtype_name(dt)?;
    check_state(shape, rows, x.state)?;
    if c != shape.conv_dim() || x.u.dtype() != DType::F32 || !x.u.is_contiguous() {
        bail!(
            "gated deltanet kernels: u {:?} {:?} does not match {shape:?}",
            x.u.dims(),
            x.u.dtype()
        );
    }
    let prep = |t: &Tensor| t.to_dtype(dt)?.contiguous();
    let (a, b, z) = (prep(x.a)?, prep(x.b)?, prep(x.z)?);
    let (a_log, dt_bias, norm_w) = (prep(x.a_log)?, prep(x.dt_bias)?, prep(x.norm_w)?);
    let y = output(x.state, rows, shape.nv * shape.dv, dt)?;
    let Storage::Cuda(cs) = &*x.state.storage_and_layout().0 else {
        bail!("gated deltanet kernels: the state is not on a CUDA device")
    };
    let dev = cs.device.clone();
    let stream = dev.cuda_stream();
    let rec = module_fn(
        &dev,
        &format!("gdn_recurrent_{name}_dk{}", shape.dk),
        "selfdistill_gated_deltanet",
        GATED_DELTANET_PTX,
    )?;
    let ptrs = [
        tensor_ptr(&a)?,
        tensor_ptr(&b)?,
        tensor_ptr(&z)?,
        tensor_ptr(&a_log)?,
        tensor_ptr(&dt_bias)?,
        tensor_ptr(&norm_w)?,
    ];
    let (u_p, state_p, y_p) = (tensor_ptr(x.u)?, tensor_ptr(x.state)?, tensor_ptr(&y)?);
    let (nk_i, nv_i, dv_i, c_i) = (shape.nk as i32, shape.nv as i32, shape.dv as i32, c as i32);
    let conv_len = (shape.conv_kernel - 1) * c;
    let (values_i, conv_len_i, eps) = (x.state.dim(1)? as i64, conv_len as i64, shape.eps as f32);
    let mut l = stream.launch_builder(&rec);
    l.arg(&u_p);
    for p in &ptrs {
        l.arg(p);
    }
    l.arg(&state_p)
        .arg(&y_p)
        .arg(&nk_i)
        .arg(&nv_i)
        .arg(&dv_i)
        .arg(&c_i)
        .arg(&values_i)
        .arg(&conv_len_i)
        .arg(&eps);
    let threads = shape.dv * shape.parts();
    let cfg = LaunchConfig {
        grid_dim: (rows as u32, shape.nv as u32, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: (4 * (2 * shape.dk + shape.parts() * shape.dv + threads)) as u32,
    };
    // SAFETY: the arguments match the kernel's parameters in kernels/gated_deltanet.cu
    // (pointers as u64, int as i32, int64_t as i64, float as f32), the shapes were checked
    // above, and every tensor outlives the launch (stream order).
    checked(unsafe { l.launch(cfg) })?;
    Ok(y)
}
