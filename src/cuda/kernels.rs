//! Our CUDA kernels as embedded PTX, and the few helpers that launch them on candle's stream:
//! loading a function by name and taking a tensor's device address. Knows nothing of what the
//! kernels compute (see `kernels/*.cu`).

use candle_core::cuda_backend::cudarc::driver::{
    sys, CudaFunction, CudaSlice, DevicePtr, DriverError,
};
use candle_core::{bail, CudaDevice, DType, Result, Storage, Tensor};

/// `kernels/paged_attention.cu`, compiled for compute_90 (JIT-compiled by the driver for the GPU
/// it runs on).
pub const PAGED_ATTENTION_PTX: &str =
    include_str!(concat!(env!("OUT_DIR"), "/paged_attention.ptx"));

/// `kernels/sampling.cu`, likewise.
pub const SAMPLING_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/sampling.ptx"));

/// `kernels/gated_deltanet.cu`, likewise.
pub const GATED_DELTANET_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/gated_deltanet.ptx"));

/// `kernels/flash_attention.cu`, likewise.
pub const FLASH_ATTENTION_PTX: &str =
    include_str!(concat!(env!("OUT_DIR"), "/flash_attention.ptx"));

/// `kernels/adamw.cu`, likewise.
pub const ADAMW_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/adamw.ptx"));

/// `kernels/cross_entropy.cu`, likewise.
pub const CROSS_ENTROPY_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/cross_entropy.ptx"));

/// `kernels/layer_ops.cu`, likewise.
pub const LAYER_OPS_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/layer_ops.ptx"));

/// `kernels/state_slots.cu`, likewise.
pub const STATE_SLOTS_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/state_slots.ptx"));

/// Loads `name` from the paged-attention module (the module is loaded once per device).
pub fn paged_fn(dev: &CudaDevice, name: &str) -> Result<CudaFunction> {
    module_fn(
        dev,
        name,
        "selfdistill_paged_attention",
        PAGED_ATTENTION_PTX,
    )
}

/// Loads `name` from the module `module` built from `ptx` (loaded once per device).
pub fn module_fn(dev: &CudaDevice, name: &str, module: &str, ptx: &str) -> Result<CudaFunction> {
    Ok(dev
        .get_or_load_custom_func(name, module, ptx)?
        .into_cuda_function())
}

/// A driver call's result as candle's error type, saying what was called.
pub fn driver<T>(what: &str, r: std::result::Result<T, impl std::fmt::Debug>) -> Result<T> {
    r.map_err(|e| candle_core::Error::Msg(format!("{what}: {e:?}")))
}

/// A launch's result as candle's error type.
pub fn checked<T>(r: std::result::Result<T, DriverError>) -> Result<()> {
    driver("kernel launch", r).map(|_| ())
}

/// A CUDA device for the sampler and the trainer: candle's, on a stream of its own (candle's
/// default is the legacy stream, which CUDA graphs cannot capture), with per-tensor event
/// tracking off. Every kernel we and candle launch runs on the device's one stream, so stream
/// order already orders them, and the events cudarc would record around each use of each buffer
/// (it tracks them once a context has a second stream) would cost host time per launch and are
/// not allowed inside a capture.
pub fn sampler_device(ordinal: usize) -> Result<candle_core::Device> {
    let dev = candle_core::Device::new_cuda_with_stream(ordinal)?;
    // SAFETY: see above; nothing here uses a second stream, and no buffer exists yet.
    unsafe { dev.as_cuda_device()?.disable_event_tracking() };
    if let Some(pool) = default_pool(dev.as_cuda_device()?)? {
        // the pool keeps what is freed (CUDA's default threshold of 0 hands it back to the
        // driver at every synchronisation, and the next step maps it again); `memory_info`
        // trims it before it counts free memory
        let mut keep = u64::MAX;
        // SAFETY: sets one u64 attribute of the device's default pool.
        let set = unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep as *mut u64).cast(),
            )
            .result()
        };
        if let Err(e) = set {
            tracing::warn!("the memory pool's release threshold could not be set ({e:?}): freed memory goes back to the driver at each synchronisation");
        }
    }
    Ok(dev)
}

/// The device's default memory pool (where cudarc's stream-ordered allocations come from), or
/// `None` for a device without memory pools (cudarc then allocates synchronously).
fn default_pool(dev: &CudaDevice) -> Result<Option<sys::CUmemoryPool>> {
    let ctx = dev.cuda_stream().context().clone();
    driver("CUDA context", ctx.bind_to_thread())?;
    let supported = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
        .unwrap_or(0);
    if supported == 0 {
        return Ok(None);
    }
    let mut pool = std::ptr::null_mut();
    // SAFETY: writes the pool's handle.
    unsafe {
        driver(
            "default memory pool",
            sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()).result(),
        )?
    };
    Ok(Some(pool))
}

/// Device address of the first element of `t`, which must be contiguous and on a CUDA device.
/// Valid while `t` lives; the kernels run on candle's stream, so stream order is the only
/// synchronisation they need.
pub fn tensor_ptr(t: &Tensor) -> Result<u64> {
    if !t.is_contiguous() {
        bail!("tensor_ptr: the tensor is not contiguous");
    }
    first_element(t)
}

/// Device address of the first row of the 2-D `t` and the elements from one row to the next:
/// `t` may be a view of some columns of a wider matrix (its elements adjacent within a row).
pub fn rows_ptr(t: &Tensor) -> Result<(u64, i64)> {
    let ((rows, cols), stride) = (t.dims2()?, t.stride());
    if cols > 1 && stride[1] != 1 {
        bail!("rows_ptr: a row's elements are not adjacent (strides {stride:?})");
    }
    let ld = if rows > 1 { stride[0] } else { cols };
    Ok((first_element(t)?, ld as i64))
}

fn first_element(t: &Tensor) -> Result<u64> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(c) = &*storage else {
        bail!("tensor_ptr: not a CUDA tensor")
    };
    let stream = c.device.cuda_stream();
    let off = (layout.start_offset() * t.dtype().size_in_bytes()) as u64;
    let base = match t.dtype() {
        DType::F32 => c.as_cuda_slice::<f32>()?.device_ptr(&stream).0,
        DType::BF16 => c.as_cuda_slice::<half::bf16>()?.device_ptr(&stream).0,
        DType::F16 => c.as_cuda_slice::<half::f16>()?.device_ptr(&stream).0,
        DType::I64 => c.as_cuda_slice::<i64>()?.device_ptr(&stream).0,
        DType::U32 => c.as_cuda_slice::<u32>()?.device_ptr(&stream).0,
        DType::U8 => c.as_cuda_slice::<u8>()?.device_ptr(&stream).0,
        other => bail!("tensor_ptr: dtype {other:?} is not used by our kernels"),
    };
    Ok(base + off)
}

/// Device address of a raw buffer.
pub fn slice_ptr<T>(dev: &CudaDevice, s: &CudaSlice<T>) -> u64 {
    s.device_ptr(&dev.cuda_stream()).0
}

/// (free, total) bytes of `dev`'s memory; what the memory pool holds unused is handed back to
/// the driver first (after the device's work is done), so that it counts as free.
pub fn memory_info(dev: &candle_core::Device) -> Result<(u64, u64)> {
    let cuda = dev.as_cuda_device()?;
    if let Some(pool) = default_pool(cuda)? {
        driver("synchronize", cuda.cuda_stream().synchronize())?;
        let ctx = cuda.cuda_stream().context().clone();
        // SAFETY: trims the device's default pool to what its live buffers use, and the graphs'
        // pool to what live graphs hold.
        unsafe {
            driver("memory pool trim", sys::cuMemPoolTrimTo(pool, 0).result())?;
            driver(
                "graph memory trim",
                sys::cuDeviceGraphMemTrim(ctx.cu_device()).result(),
            )?;
        }
    }
    let (free, total) = dev
        .as_cuda_device()?
        .cuda_stream()
        .context()
        .mem_get_info()
        .map_err(|e| candle_core::Error::Msg(format!("memory info: {e:?}")))?;
    Ok((free as u64, total as u64))
}

/// The CUDA device's name as the driver gives it (`NVIDIA H100 80GB HBM3`).
pub fn device_name(dev: &candle_core::Device) -> Result<String> {
    dev.as_cuda_device()?
        .cuda_stream()
        .context()
        .name()
        .map_err(|e| candle_core::Error::Msg(format!("device name: {e:?}")))
}
