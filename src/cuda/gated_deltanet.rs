//! Launchers for `kernels/gated_deltanet.cu`: a Gated DeltaNet decode step (one new token per
//! sequence) as two kernels over the step's gathered states, updated in place: the conv update
//! with SiLU, then gating, l2norm, the delta rule and the gated RMSNorm, reading and writing each
//! state once. Knows the kernels' layouts and which shapes they take, not the model: the layer
//! (`model::layers::gated_deltanet`) holds the maths' reference and decides when to call this.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::op::BackpropOp;
use candle_core::{bail, CudaStorage, DType, Result, Storage, Tensor};

use super::kernels::{checked, module_fn, tensor_ptr, GATED_DELTANET_PTX};
pub use super::shapes::GdnShape;

/// The inputs of a decode step, all (but `state`) in the model's dtype (f32 or bf16): the
/// projections `qkv` (B, conv_dim), `a`, `b` (B, nv), `z` (B, nv dv); the weights `conv_w`
/// (conv_dim, K), `a_log`, `dt_bias` (nv), `norm_w` (dv); `state` (B, values) f32, each row the
/// conv's last K-1 inputs then the heads' recurrent states, updated in place.
pub struct GdnStep<'a> {
    pub qkv: &'a Tensor,
    pub a: &'a Tensor,
    pub b: &'a Tensor,
    pub z: &'a Tensor,
    pub conv_w: &'a Tensor,
    pub a_log: &'a Tensor,
    pub dt_bias: &'a Tensor,
    pub norm_w: &'a Tensor,
    pub state: &'a Tensor,
}

/// Runs the step; returns the gated norm's output (B, nv dv) in the model's dtype, for the
/// layer's out projection.
pub fn decode_step(shape: &GdnShape, x: &GdnStep) -> Result<Tensor> {
    if !shape.supported() {
        bail!("gated deltanet kernels: shape {shape:?} not supported");
    }
    let (rows, c) = x.qkv.dims2()?;
    let dt = x.qkv.dtype();
    let name = match dt {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        other => bail!("gated deltanet kernels: {other:?} (f32 or bf16)"),
    };
    let (k, values) = (shape.conv_kernel, x.state.dim(1)?);
    let conv_len = (k - 1) * c;
    if c != shape.conv_dim()
        || x.state.dims() != [rows, conv_len + shape.nv * shape.dk * shape.dv]
        || x.state.dtype() != DType::F32
        || !x.state.is_contiguous()
    {
        bail!(
            "gated deltanet kernels: qkv {:?} / state {:?} {:?} do not match {shape:?}",
            x.qkv.dims(),
            x.state.dims(),
            x.state.dtype()
        );
    }
    let prep = |t: &Tensor| t.to_dtype(dt)?.contiguous();
    let (qkv, a, b, z) = (prep(x.qkv)?, prep(x.a)?, prep(x.b)?, prep(x.z)?);
    let (conv_w, a_log, dt_bias, norm_w) = (
        prep(x.conv_w)?,
        prep(x.a_log)?,
        prep(x.dt_bias)?,
        prep(x.norm_w)?,
    );
    let Storage::Cuda(cs) = &*x.state.storage_and_layout().0 else {
        bail!("gated deltanet kernels: the state is not on a CUDA device")
    };
    let dev = cs.device.clone();
    let stream = dev.cuda_stream();
    let load = |f: &str| module_fn(&dev, f, "selfdistill_gated_deltanet", GATED_DELTANET_PTX);
    // SAFETY: the conv kernel writes every element of `u` before the recurrent kernel reads it.
    let u = unsafe { dev.alloc::<f32>(rows * c)? };
    let u = Tensor::from_storage(
        Storage::Cuda(CudaStorage::wrap_cuda_slice(u, dev.clone())),
        (rows, c),
        BackpropOp::none(),
        false,
    );
    let out_len = rows * shape.nv * shape.dv;
    // SAFETY: the recurrent kernel writes every element of `y` (one per thread of part 0).
    let y_storage = match dt {
        DType::F32 => {
            CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<f32>(out_len)? }, dev.clone())
        }
        _ => {
            CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<half::bf16>(out_len)? }, dev.clone())
        }
    };
    let y = Tensor::from_storage(
        Storage::Cuda(y_storage),
        (rows, shape.nv * shape.dv),
        BackpropOp::none(),
        false,
    );
    let (qkv_p, state_p, conv_p, u_p) = (
        tensor_ptr(&qkv)?,
        tensor_ptr(x.state)?,
        tensor_ptr(&conv_w)?,
        tensor_ptr(&u)?,
    );
    let (rows_i, c_i, k_i, values_i) = (rows as i32, c as i32, k as i32, values as i64);
    let conv = load(&format!("gdn_conv_{name}"))?;
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
    // SAFETY (both launches): the arguments match the kernels' parameters in
    // kernels/gated_deltanet.cu (pointers as u64, int as i32, int64_t as i64, float as f32), the
    // shapes were checked above, and every tensor outlives the launch (stream order).
    checked(unsafe { l.launch(cfg) })?;

    let rec = load(&format!("gdn_recurrent_{name}_dk{}", shape.dk))?;
    let ptrs = [
        tensor_ptr(&a)?,
        tensor_ptr(&b)?,
        tensor_ptr(&z)?,
        tensor_ptr(&a_log)?,
        tensor_ptr(&dt_bias)?,
        tensor_ptr(&norm_w)?,
    ];
    let y_p = tensor_ptr(&y)?;
    let (nk_i, nv_i, dv_i) = (shape.nk as i32, shape.nv as i32, shape.dv as i32);
    let (conv_len_i, eps) = (conv_len as i64, shape.eps as f32);
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
    checked(unsafe { l.launch(cfg) })?;
    Ok(y)
}
