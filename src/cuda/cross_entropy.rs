//! Launcher for `kernels/cross_entropy.cu`: a chunk of logits rows becomes, in place, the
//! gradient of the weighted cross-entropy (times the loss scale), and each row's loss lands in
//! a new f32 buffer: one launch where candle ran about fifteen (a max, a shift, exponentials, a
//! sum, a gather, a log, the softmax, a one-hot scatter, the weights) with an f32 copy of the
//! logits and as many temporaries. Knows the kernel's layout, not the loss: `train::grads`
//! holds the maths' reference (`ce_grad_tensors`) and decides when to call this.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::op::BackpropOp;
use candle_core::{bail, CudaStorage, DType, Result, Storage, Tensor};

use super::kernels::{checked, module_fn, tensor_ptr, CROSS_ENTROPY_PTX};

/// Whether the kernel takes logits of this dtype.
pub fn supported(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::BF16)
}

/// Overwrites `logits` (c, V), contiguous f32 or bf16 on a CUDA device and held by no one
/// else, with `d(scale * loss)/d logits` for rows whose targets and weights are the device's
/// u32 and f32 values at `targets` and `weights` (c each; every target below V: the caller
/// checks them on the host). Returns each row's `weight * -log p(target)`, (c,) f32.
pub fn ce_grad_in_place(logits: &Tensor, targets: u64, weights: u64, scale: f64) -> Result<Tensor> {
    let (c, v) = logits.dims2()?;
    if !supported(logits.dtype()) || !logits.is_contiguous() {
        bail!(
            "cross-entropy kernel: logits {:?} {:?}, contiguous f32 or bf16 wanted",
            logits.dims(),
            logits.dtype()
        )
    }
    let dev = logits.device().as_cuda_device()?;
    // SAFETY: the kernel writes every row's loss.
    let loss = unsafe { dev.alloc::<f32>(c.max(1))? };
    let loss = Tensor::from_storage(
        Storage::Cuda(CudaStorage::wrap_cuda_slice(loss, dev.clone())),
        c.max(1),
        BackpropOp::none(),
        false,
    )
    .narrow(0, 0, c)?;
    if c == 0 {
        return Ok(loss);
    }
    let name = if logits.dtype() == DType::F32 {
        "ce_grad_f32"
    } else {
        "ce_grad_bf16"
    };
    let f = module_fn(dev, name, "selfdistill_cross_entropy", CROSS_ENTROPY_PTX)?;
    let (lp, op) = (tensor_ptr(logits)?, tensor_ptr(&loss)?);
    let vocab = v as i64;
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&lp)
        .arg(&vocab)
        .arg(&targets)
        .arg(&weights)
        .arg(&scale)
        .arg(&op);
    let cfg = LaunchConfig {
        grid_dim: (c as u32, 1, 1),
        block_dim: (1024, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match `ce_grad_*` in kernels/cross_entropy.cu (pointers as u64,
    // the vocabulary as int64, the scale as double); the logits hold c x V values and nothing
    // else reads them until the kernel is done (stream order), the targets and weights c
    // values each, every target below V (the caller's check).
    checked(unsafe { b.launch(cfg) })?;
    Ok(loss)
}
