//! Training attention on a GPU through the FlashAttention-2 kernels (`cuda::flash_attention`):
//! the whole packed step in one forward kernel and one backward kernel (plus the backward's
//! `rowsum(dO * O)` pass), instead of [`super::block`]'s candle ops per block of queries. A
//! candle op records the backward, as [`super::block`]'s does: its forward hands back the
//! output computed outside it, its backward calls the backward kernel with the saved
//! log-sum-exp. Knows nothing of layers.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Storage, Tensor};

use crate::cuda::flash_attention::{backward, forward, Saved};
use crate::model::clock;
use crate::model::cost::Cost;

/// Whether the kernels take this layer's inputs on this device.
pub fn supported(q: &Tensor) -> bool {
    q.device().is_cuda()
        && q.rank() == 3
        && crate::cuda::flash_attention::supported(q.dtype(), q.dims()[2])
}

/// Causal attention of `q` (T, Hq, D) over `k`, `v` (T, Hkv, D), sequences of `seq_lens` end to
/// end (`starts`: theirs on the device, `cuda::flash_attention::starts`), each to the `window`
/// keys ending at its query when given; differentiable in all three.
pub fn causal(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seq_lens: &[usize],
    starts: &Tensor,
    window: Option<usize>,
) -> Result<Tensor> {
    let (out, lse) = forward(
        &q.detach(),
        &k.detach(),
        &v.detach(),
        seq_lens,
        starts,
        window,
    )?;
    let op = Attach {
        out,
        lse,
        seq_lens: seq_lens.to_vec(),
        starts: starts.clone(),
        window,
    };
    q.apply_op3_arc(k, v, std::sync::Arc::new(Box::new(op)))
}

/// What [`causal`] issues, (forward, backward), read off the code above and the launchers
/// (inputs already contiguous and in bf16, as a layer hands them over; the starts uploaded by
/// the caller): the forward launches the kernel into two new buffers, and the op's forward
/// copies the output; the backward launches the delta pass into a new buffer, zeroes dQ,
/// launches the backward into dK and dV, and converts the three gradients to the inputs' dtype.
pub fn costs() -> (Cost, Cost) {
    let fwd = alloc(2) + Cost::in_place(1) + Cost::kernels(1);
    let bwd = alloc(1)
        + Cost::in_place(1)
        + Cost::kernels(1)
        + alloc(2)
        + Cost::in_place(1)
        + Cost::kernels(3);
    (fwd, bwd)
}

/// `n` device buffers allocated without a kernel.
fn alloc(n: u64) -> Cost {
    Cost {
        allocations: n,
        ..Cost::default()
    }
}

/// The op that gives the kernel's output a backward pass.
struct Attach {
    /// (T, Hq, D) bf16
    out: Tensor,
    /// (Hq, T) f32
    lse: Tensor,
    seq_lens: Vec<usize>,
    /// (sequences + 1) u32 on the device
    starts: Tensor,
    window: Option<usize>,
}

impl CustomOp3 for Attach {
    fn name(&self) -> &'static str {
        "flash-causal-attention"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("flash attention runs on a GPU only")
    }

    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (st, layout) = self.out.storage_and_layout();
        match &*st {
            Storage::Cuda(c) => Ok((c.try_clone(layout)?, self.out.shape().clone())),
            _ => candle_core::bail!("flash attention: the output is not on the GPU"),
        }
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // a timed run: the backward of what came after the attention ends here
        clock::mark_here("backward");
        let dtype = q.dtype();
        let saved = Saved {
            o: &self.out,
            lse: &self.lse,
            d_o: &grad.detach(),
        };
        let (dq, dk, dv) = backward(
            &q.detach(),
            &k.detach(),
            &v.detach(),
            saved,
            &self.seq_lens,
            &self.starts,
            self.window,
        )?;
        let grads = (
            Some(dq.to_dtype(dtype)?),
            Some(dk.to_dtype(dtype)?),
            Some(dv.to_dtype(dtype)?),
        );
        clock::mark_here("attend_backward");
        Ok(grads)
    }
}
