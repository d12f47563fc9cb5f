//! Launchers for `kernels/flash_attention.cu`: FlashAttention-2's causal attention forward and
//! backward for training, over a packed step's sequences, bf16 inputs with f32 accumulation.
//! Knows the kernels' layouts, tiles and shared memory, not the model: the tiling's reference is
//! `model::attention::flash` (checked on the CPU), and `model::attention` decides when to call
//! this.

use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute_enum;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use candle_core::op::BackpropOp;
use candle_core::{bail, CudaDevice, CudaStorage, DType, Result, Storage, Tensor};

use super::kernels::{checked, module_fn, tensor_ptr, FLASH_ATTENTION_PTX};

const THREADS: u32 = 128;

/// Whether the kernels take inputs of `dtype` with heads of `d`.
pub fn supported(dtype: DType, d: usize) -> bool {
    dtype == DType::BF16 && matches!(d, 64 | 128 | 256)
}

/// The kernels' tiles for head_dim `d`: (forward query rows, keys), (backward query rows, keys),
/// as `FLASH(...)` in the .cu file instantiates them.
fn tiles(d: usize) -> ((usize, usize), (usize, usize)) {
    if d == 256 {
        ((64, 64), (64, 32))
    } else {
        ((64, 64), (64, 64))
    }
}

/// A padded shared row of `cols` bf16 or f32 values (`ld_h` / `ld_f` in the .cu file).
const fn ld_h(cols: usize) -> usize {
    cols + 8
}
const fn ld_f(cols: usize) -> usize {
    cols + 4
}

/// Dynamic shared memory of the forward (`fwd_shared` in the .cu file).
fn fwd_shared(d: usize) -> usize {
    let ((br, bc), _) = tiles(d);
    (br + 2 * bc) * ld_h(d) * 2 + br * ld_f(bc) * 4 + br * ld_f(d) * 4 + br * ld_h(bc) * 2
}

/// Dynamic shared memory of the backward (`bwd_shared` in the .cu file).
fn bwd_shared(d: usize) -> usize {
    let (_, (br, bc)) = tiles(d);
    2 * (bc + br) * ld_h(d) * 2
        + 2 * br * ld_f(bc) * 4
        + 2 * br * ld_h(bc) * 2
        + 2 * bc * ld_f(d) * 4
        + 2 * br * 4
        + 4 * 16 * 20 * 4
}

/// The step's shape, checked: (total tokens, Hq, Hkv, D).
fn check(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seq_lens: &[usize],
    st: &Tensor,
) -> Result<(usize, usize, usize, usize)> {
    if st.dims() != [seq_lens.len() + 1] || st.dtype() != DType::U32 || !st.is_contiguous() {
        bail!(
            "flash attention: starts {:?} {:?} for {} sequences",
            st.dims(),
            st.dtype(),
            seq_lens.len()
        );
    }
    let (t, hq, d) = q.dims3()?;
    let (tk, hkv, dk) = k.dims3()?;
    if !supported(q.dtype(), d)
        || k.dtype() != q.dtype()
        || v.dtype() != q.dtype()
        || tk != t
        || dk != d
        || v.dims() != k.dims()
        || hkv == 0
        || hq % hkv != 0
        || seq_lens.iter().sum::<usize>() != t
    {
        bail!(
            "flash attention: q {:?} {:?}, k {:?}, v {:?}, sequences {seq_lens:?} (bf16, head_dim \
             64, 128 or 256, query heads a multiple of the KV heads)",
            q.dims(),
            q.dtype(),
            k.dims(),
            v.dims()
        );
    }
    Ok((t, hq, hkv, d))
}

/// `t` contiguous, starting on 16 bytes (the kernels load 16 bytes at a time).
fn aligned(t: &Tensor) -> Result<Tensor> {
    let t = t.contiguous()?;
    if tensor_ptr(&t)? % 16 == 0 {
        return Ok(t);
    }
    t.copy()
}

fn cuda_device(t: &Tensor) -> Result<CudaDevice> {
    match &*t.storage_and_layout().0 {
        Storage::Cuda(c) => Ok(c.device.clone()),
        _ => bail!("flash attention: not a CUDA tensor"),
    }
}

/// A new tensor of `dims` and `dt` on `dev`, for a kernel to write every element of.
fn output(dev: &CudaDevice, dims: &[usize], dt: DType) -> Result<Tensor> {
    let n: usize = dims.iter().product();
    // SAFETY: each caller's kernel writes every element before anything reads it.
    let storage = match dt {
        DType::F32 => CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<f32>(n)? }, dev.clone()),
        _ => CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<half::bf16>(n)? }, dev.clone()),
    };
    Ok(Tensor::from_storage(
        Storage::Cuda(storage),
        dims,
        BackpropOp::none(),
        false,
    ))
}

/// Kernel `name` of the module, allowed `shared` bytes of dynamic shared memory (above 48 KiB a
/// kernel must ask for it).
fn kernel(dev: &CudaDevice, name: &str, shared: usize) -> Result<CudaFunction> {
    let f = module_fn(
        dev,
        name,
        "selfdistill_flash_attention",
        FLASH_ATTENTION_PTX,
    )?;
    if shared > 0 {
        checked(f.set_attribute(
            CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            shared as i32,
        ))?;
    }
    Ok(f)
}

/// The sequences' starts and the end (n + 1 values, u32) on `q`'s device: what [`forward`] and
/// [`backward`] take, uploaded once per step by their caller.
pub fn starts(seq_lens: &[usize], q: &Tensor) -> Result<Tensor> {
    let mut s = Vec::with_capacity(seq_lens.len() + 1);
    let mut at = 0u32;
    s.push(at);
    for &l in seq_lens {
        at += l as u32;
        s.push(at);
    }
    Tensor::new(s, q.device())
}

fn window_arg(window: Option<usize>) -> Result<i32> {
    match window {
        None => Ok(0),
        Some(0) => bail!("flash attention: a window of 0 keys sees nothing"),
        Some(w) => Ok(w as i32),
    }
}

/// Causal attention of `q` (T, Hq, D) over `k`, `v` (T, Hkv, D), sequences of `seq_lens` end to
/// end (`st`: their [`starts`]): (output (T, Hq, D) bf16, log-sum-exp (Hq, T) f32). No graph.
pub fn forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seq_lens: &[usize],
    st: &Tensor,
    window: Option<usize>,
) -> Result<(Tensor, Tensor)> {
    let (t, hq, hkv, d) = check(q, k, v, seq_lens, st)?;
    if t == 0 {
        let o = Tensor::zeros((0, hq, d), DType::BF16, q.device())?;
        return Ok((o, Tensor::zeros((hq, 0), DType::F32, q.device())?));
    }
    let (q, k, v) = (aligned(q)?, aligned(k)?, aligned(v)?);
    let dev = cuda_device(&q)?;
    let o = output(&dev, &[t, hq, d], DType::BF16)?;
    let lse = output(&dev, &[hq, t], DType::F32)?;
    let shared = fwd_shared(d);
    let f = kernel(&dev, &format!("flash_fwd_d{d}"), shared)?;
    let ptrs = [
        tensor_ptr(&q)?,
        tensor_ptr(&k)?,
        tensor_ptr(&v)?,
        tensor_ptr(&o)?,
        tensor_ptr(&lse)?,
        tensor_ptr(st)?,
    ];
    let (t_i, hq_i, hkv_i) = (t as i32, hq as i32, hkv as i32);
    let scale_log2 = std::f32::consts::LOG2_E / (d as f32).sqrt();
    let w = window_arg(window)?;
    let stream = dev.cuda_stream();
    let mut l = stream.launch_builder(&f);
    for p in &ptrs {
        l.arg(p);
    }
    l.arg(&t_i).arg(&hq_i).arg(&hkv_i).arg(&scale_log2).arg(&w);
    let ((br, _), _) = tiles(d);
    let longest = seq_lens.iter().copied().max().unwrap_or(0);
    let cfg = LaunchConfig {
        grid_dim: (
            longest.div_ceil(br).max(1) as u32,
            hq as u32,
            seq_lens.len().max(1) as u32,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: shared as u32,
    };
    // SAFETY: the arguments match flash_fwd_d{d} in kernels/flash_attention.cu (pointers as u64,
    // int as i32, float as f32), the shapes were checked above, the rows are 16-byte aligned,
    // and every tensor outlives the launch (stream order).
    checked(unsafe { l.launch(cfg) })?;
    Ok((o, lse))
}

/// The forward's saved values and the output's gradient.
pub struct Saved<'a> {
    /// (T, Hq, D) bf16
    pub o: &'a Tensor,
    /// (Hq, T) f32
    pub lse: &'a Tensor,
    /// (T, Hq, D) bf16
    pub d_o: &'a Tensor,
}

/// The backward of [`forward`]: (dq (T, Hq, D), dk, dv (T, Hkv, D)), all f32. No graph.
pub fn backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    s: Saved<'_>,
    seq_lens: &[usize],
    st: &Tensor,
    window: Option<usize>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (t, hq, hkv, d) = check(q, k, v, seq_lens, st)?;
    if s.o.dims() != q.dims() || s.d_o.dims() != q.dims() || s.lse.dims() != [hq, t] {
        bail!(
            "flash attention backward: o {:?}, dO {:?}, lse {:?} for q {:?}",
            s.o.dims(),
            s.d_o.dims(),
            s.lse.dims(),
            q.dims()
        );
    }
    if t == 0 {
        let z = |h: usize| Tensor::zeros((0, h, d), DType::F32, q.device());
        return Ok((z(hq)?, z(hkv)?, z(hkv)?));
    }
    let (q, k, v) = (aligned(q)?, aligned(k)?, aligned(v)?);
    let (o, d_o) = (s.o.contiguous()?, aligned(&s.d_o.to_dtype(DType::BF16)?)?);
    let lse = s.lse.to_dtype(DType::F32)?.contiguous()?;
    let dev = cuda_device(&q)?;
    let stream = dev.cuda_stream();
    let (t_i, hq_i, hkv_i, d_i) = (t as i32, hq as i32, hkv as i32, d as i32);
    // delta = rowsum(dO * O), one warp per (token, head)
    let delta = output(&dev, &[hq, t], DType::F32)?;
    let f = kernel(&dev, "flash_bwd_delta", 0)?;
    let (dop, op, dp) = (tensor_ptr(&d_o)?, tensor_ptr(&o)?, tensor_ptr(&delta)?);
    let mut l = stream.launch_builder(&f);
    l.arg(&dop).arg(&op).arg(&dp).arg(&t_i).arg(&hq_i).arg(&d_i);
    let cfg = LaunchConfig {
        grid_dim: ((t * hq).div_ceil(8).max(1) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match flash_bwd_delta's (pointers as u64, int as i32); dO and O are
    // (T, Hq, D) contiguous, delta (Hq, T).
    checked(unsafe { l.launch(cfg) })?;
    let dq = Tensor::zeros((t, hq, d), DType::F32, q.device())?;
    let dk = output(&dev, &[t, hkv, d], DType::F32)?;
    let dv = output(&dev, &[t, hkv, d], DType::F32)?;
    let shared = bwd_shared(d);
    let f = kernel(&dev, &format!("flash_bwd_d{d}"), shared)?;
    let ptrs = [
        tensor_ptr(&q)?,
        tensor_ptr(&k)?,
        tensor_ptr(&v)?,
        tensor_ptr(&d_o)?,
        tensor_ptr(&lse)?,
        tensor_ptr(&delta)?,
        tensor_ptr(&dq)?,
        tensor_ptr(&dk)?,
        tensor_ptr(&dv)?,
        tensor_ptr(st)?,
    ];
    let scale = 1.0 / (d as f32).sqrt();
    let w = window_arg(window)?;
    let mut l = stream.launch_builder(&f);
    for p in &ptrs {
        l.arg(p);
    }
    l.arg(&t_i).arg(&hq_i).arg(&hkv_i).arg(&scale).arg(&w);
    let (_, (_, bc)) = tiles(d);
    let longest = seq_lens.iter().copied().max().unwrap_or(0);
    let cfg = LaunchConfig {
        grid_dim: (
            longest.div_ceil(bc).max(1) as u32,
            hkv as u32,
            seq_lens.len().max(1) as u32,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: shared as u32,
    };
    // SAFETY: the arguments match flash_bwd_d{d} in kernels/flash_attention.cu, the shapes were
    // checked above, dq is zeroed (the kernel adds to it), dk and dv are written whole (every
    // key of every sequence belongs to one program), and every tensor outlives the launch.
    checked(unsafe { l.launch(cfg) })?;
    Ok((dq, dk, dv))
}

#[cfg(test)]
mod tests {
    /// The shared memory the launchers ask for fits a Hopper SM (227 KiB), at every head_dim.
    #[test]
    fn the_tiles_fit_shared_memory() {
        for d in [64, 128, 256] {
            assert!(super::fwd_shared(d) <= 227 * 1024, "forward at {d}");
            assert!(super::bwd_shared(d) <= 227 * 1024, "backward at {d}");
        }
        // two forward programs per SM at head_dim 128 (228 KiB, 1 KiB reserved per program)
        assert!(2 * (super::fwd_shared(128) + 1024) <= 228 * 1024);
    }
}
