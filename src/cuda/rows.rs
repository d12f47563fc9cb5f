//! Rows of a table picked by index on the GPU (`gather_rows_f32` of `kernels/state_slots.cu`,
//! a copy of 32-bit words): the sampler's embedding lookup, RoPE rows and sampling rows, whose
//! indices are already on the device in the step's upload. candle's `index_select` does the
//! same copy but uploads its index layout on every call; this uploads nothing. Knows nothing of
//! what the rows are.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::op::BackpropOp;
use candle_core::{CudaStorage, DType, Result, Storage, Tensor};

use super::kernels::{checked, module_fn, tensor_ptr, STATE_SLOTS_PTX};

/// `table` (rows, cols) at the u32 `ids` (n,), both on one CUDA device, as a new (n, cols)
/// tensor; `None` where the kernel does not take the table (not f32 or bf16, not contiguous, a
/// bf16 row of an odd length, or rows not on the boundary the kernel reads them by: 16 bytes
/// when a row is a multiple of 16 bytes, else 4), for the caller to fall back on candle. No gradient. The ids must lie below `rows`
/// (the caller checks them on the host).
pub fn gather(table: &Tensor, ids: &Tensor) -> Result<Option<Tensor>> {
    let (_, cols) = table.dims2()?;
    let n = ids.dims1()?;
    let bytes = cols * table.dtype().size_in_bytes();
    if !matches!(table.dtype(), DType::F32 | DType::BF16)
        || !table.is_contiguous()
        || !ids.is_contiguous()
        || ids.dtype() != DType::U32
        || !bytes.is_multiple_of(4)
    {
        return Ok(None);
    }
    let words = bytes / 4;
    let tp = tensor_ptr(table)?;
    // the kernel reads 16 bytes at a time where a row is a multiple of 4 words, else 4: the
    // table's rows must start on that boundary (a view at an odd bf16 offset would not)
    let align = if words.is_multiple_of(4) { 16 } else { 4 };
    if !tp.is_multiple_of(align) {
        return Ok(None);
    }
    let dev = table.device().as_cuda_device()?;
    if n == 0 {
        return Tensor::zeros((0, cols), table.dtype(), table.device()).map(Some);
    }
    let out = if table.dtype() == DType::F32 {
        // SAFETY: the kernel writes all n x cols values.
        CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<f32>(n * cols)? }, dev.clone())
    } else {
        // SAFETY: as above.
        CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<half::bf16>(n * cols)? }, dev.clone())
    };
    let out = Tensor::from_storage(Storage::Cuda(out), (n, cols), BackpropOp::none(), false);
    let f = module_fn(
        dev,
        "gather_rows_f32",
        "selfdistill_state_slots",
        STATE_SLOTS_PTX,
    )?;
    let (op, ip) = (tensor_ptr(&out)?, tensor_ptr(ids)?);
    let values = words as i64;
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&op).arg(&tp).arg(&ip).arg(&values);
    let cfg = LaunchConfig {
        grid_dim: (n as u32, (words / 4).div_ceil(256).clamp(1, 64) as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match `gather_rows_f32` in kernels/state_slots.cu (its values are
    // 32-bit words, copied unchanged: f32 values or pairs of bf16); `out` holds n rows of
    // `words` words, every id is below the table's rows (the caller's check), and the tensors
    // outlive the launch (stream order).
    checked(unsafe { b.launch(cfg) })?;
    Ok(Some(out))
}
