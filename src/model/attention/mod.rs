//! Attention, the one operation every attention layer calls, and where each of its
//! implementations lives.
//!
//! A layer hands its rotated queries, keys and values for the tokens of a step to an
//! [`AttentionBackend`] (through [`super::layer_ops::LayerOps::attend`]); the backend decides
//! what they attend to. The maths is one: softmax(q k^T / sqrt(D) + causal or sliding-window
//! mask) v, grouped-query heads sharing their KV head, each sequence of a packed step on its own.
//! [`attend_one`] writes it plainly in candle ops (the reference every implementation is
//! checked against); the implementations differ in where keys come from and on what device:
//!
//! | implementation | keys from | device | backward |
//! |---|---|---|---|
//! | [`fused`] ([`CausalAttention`], f32) | the step itself | CPU host kernel | its own |
//! | `gpu_flash` ([`CausalAttention`], bf16) | the step itself | CUDA (`kernels/flash_attention.cu`) | its own kernel |
//! | [`block`] ([`CausalAttention`], composed) | the step itself | any (candle) | candle's, with a recompute |
//! | `sampler::kv_cache::PagedAttention` | the paged host cache | CPU host kernel | none |
//! | `sampler::window_ring` | a sliding window's ring | CPU host kernel | none |
//! | `sampler::gpu::paged::GpuPagedAttention` | the paged GPU cache | CUDA (`kernels/paged_attention.cu`) | none |
//!
//! [`flash`] is FlashAttention-2's tiling (query and key tiles, the online softmax, the backward
//! by key tiles) in plain Rust, checked against the definition on the CPU: what the training
//! attention kernels follow (issue 51), not a path any backend takes.
//!
//! The paged ones live with their caches (they read the sampler's block tables); one
//! conformance test (`sampler::attention_conformance`) runs every implementation a CPU has over
//! one table of shapes, GQA ratios, packed lengths and windows against [`attend_one`], and
//! `tests/cuda.rs` the GPU's against the host's. A recurrent layer (Gated DeltaNet) asks the
//! backend instead for each sequence's state at the start of the step and hands back the state at
//! its end ([`AttentionBackend::recurrent_state`]). Knows nothing of weights.

pub mod block;
pub mod flash;
pub mod fused;
#[cfg(feature = "cuda")]
pub mod gpu_flash;

use candle_core::{DType, Device, Result, Tensor, D};

use super::cost::Cost;

/// One layer's attention over this step's tokens.
///
/// ```text
/// q: (T, Hq, D)   k, v: (T, Hkv, D)   ->   (T, Hq, D)
/// ```
/// `T` is all tokens of the step, sequences laid end to end. `window`: a sliding-window layer's
/// window (a query sees the `window` keys ending at its own); `None` for full attention. A
/// backend without sliding windows refuses one, never ignores it.
pub trait AttentionBackend {
    fn attend(
        &mut self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        window: Option<usize>,
    ) -> Result<Tensor>;

    /// The step's sequences as recurrent layer `layer` sees them: each one's token count and the
    /// state it starts from (`values` f32 values per sequence, laid out by the layer).
    fn recurrent_state(&mut self, layer: usize, values: usize) -> Result<RecurrentStep>;

    /// What the backend's calls since the last take issued on its device (its kernels, buffers
    /// and copies), and zero from now on. This default declares nothing: right for the CPU
    /// sampler's host cache, which launches nothing; the GPU's paged backend declares its
    /// kernels, [`CausalAttention`] its candle ops when it counts.
    fn take_cost(&mut self) -> Cost {
        Cost::default()
    }

    /// The state each sequence of the step ends with, (sequences, values) f32: kept for the
    /// sequence's next step, or dropped by a backend that keeps none.
    fn store_recurrent_state(&mut self, layer: usize, state: Tensor) -> Result<()>;

    /// Recurrent layer `layer`'s states in the device memory they live in, for kernels that
    /// update them in place (`values` f32 values per sequence): a backend whose states are
    /// slots of a pool on the GPU gives the pool and the step's rows of it, and no copy is
    /// made either way ([`Self::recurrent_state`] and [`Self::store_recurrent_state`] are then
    /// not called for the layer). `None`, this default: the backend hands out and takes back
    /// copies.
    fn recurrent_pool(&mut self, layer: usize, values: usize) -> Result<Option<PoolStep>> {
        let _ = (layer, values);
        Ok(None)
    }

    /// Whether [`Self::lend_recurrent_host`] lends the states in place: a backend whose states
    /// are on the host says so, so that the CPU's packed layers skip the tensors.
    fn lends_recurrent_host(&self) -> bool {
        false
    }

    /// Each sequence's state of recurrent layer `layer` (`values` f32 values), lent in place to
    /// update, and the step's sequence lengths: a backend that says it
    /// [`Self::lends_recurrent_host`]. Others keep their states as tensors
    /// ([`Self::recurrent_state`], [`Self::store_recurrent_state`]); this default refuses.
    fn lend_recurrent_host(&mut self, layer: usize, values: usize) -> Result<HostStates<'_>> {
        let _ = values;
        candle_core::bail!("layer {layer}: this backend keeps no recurrent state on the host")
    }

    /// [`Self::attend`] on host values (f32, row-major), for the CPU's packed layers: `q`
    /// (T x Hq x D), `k` and `v` (T x Hkv x D) into `out` (T x Hq x D). A backend whose cache is
    /// on the host overrides it to skip the tensors; this default builds them.
    #[allow(clippy::too_many_arguments)]
    fn attend_host(
        &mut self,
        layer: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        (t, hq, hkv, d): AttnShape,
        window: Option<usize>,
        out: &mut [f32],
    ) -> Result<()> {
        let dev = Device::Cpu;
        let q = Tensor::from_slice(q, (t, hq, d), &dev)?;
        let k = Tensor::from_slice(k, (t, hkv, d), &dev)?;
        let v = Tensor::from_slice(v, (t, hkv, d), &dev)?;
        let a = self
            .attend(layer, &q, &k, &v, window)?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        if a.len() != out.len() {
            candle_core::bail!("attention gave {} values for {}", a.len(), out.len())
        }
        out.copy_from_slice(&a);
        Ok(())
    }
}

/// The states a backend lends ([`AttentionBackend::lend_recurrent_host`]).
pub struct HostStates<'a> {
    /// Tokens each sequence brings, in the order they are laid end to end.
    pub seq_lens: Vec<usize>,
    /// Each sequence's state (f32), to update in place.
    pub states: Vec<&'a mut [f32]>,
}

/// What a recurrent layer needs of a step.
#[derive(Debug, Clone)]
pub struct RecurrentStep {
    /// Tokens each sequence brings, in the order they are laid end to end.
    pub seq_lens: Vec<usize>,
    /// Each sequence's state at the start of the step, (sequences, values) f32; `None` when
    /// every sequence starts from zeros.
    pub state: Option<Tensor>,
}

/// A step's rows of a pool of recurrent states on a device
/// ([`AttentionBackend::recurrent_pool`]).
#[derive(Debug, Clone)]
pub struct PoolStep {
    /// Tokens each sequence brings, in the order they are laid end to end.
    pub seq_lens: Vec<usize>,
    /// The layer's pool, (slots, values) f32 (a new sequence's slot holds zeros).
    pub pool: Tensor,
    /// (sequences) u32 on the pool's device: each sequence's slot, distinct.
    pub ids: Tensor,
    /// (sequences + 1) u32 on the pool's device, the running sums of `seq_lens` from 0: where
    /// each sequence's tokens start; `None` when each brings one token.
    pub starts: Option<Tensor>,
}

/// The running sums of `seq_lens` from 0, as the kernels take sequence starts (u32); `None`
/// when every sequence brings one token.
pub fn seq_starts(seq_lens: &[usize]) -> Option<Vec<u32>> {
    if seq_lens.iter().all(|&n| n == 1) {
        return None;
    }
    let mut at = 0u32;
    let mut out = Vec::with_capacity(seq_lens.len() + 1);
    out.push(0);
    for &n in seq_lens {
        at += n as u32;
        out.push(at);
    }
    Some(out)
}

/// A step's attention shape: (tokens, query heads, KV heads, head_dim).
pub type AttnShape = (usize, usize, usize, usize);

/// Causal attention within each sequence of a packed step; no cache.
#[derive(Debug, Clone)]
pub struct CausalAttention {
    /// Lengths of the sequences laid end to end in the step.
    pub seq_lens: Vec<usize>,
    /// Elementary candle ops on the CPU (the device-generic training path), not the fused CPU
    /// kernel. A GPU in bf16 takes the flash kernels either way.
    pub composed: bool,
    /// Declare what each call issues (the block attention's; the fused CPU kernel is one op
    /// each way, its backward pass host code): forward through
    /// [`AttentionBackend::take_cost`], backward through [`CausalAttention::take_backward_cost`].
    pub count: bool,
    spent: Cost,
    backward: Cost,
    /// The sequences' starts on the GPU for the flash kernels, uploaded at the first call.
    #[cfg(feature = "cuda")]
    starts: Option<Tensor>,
}

impl CausalAttention {
    pub fn new(seq_lens: Vec<usize>) -> Self {
        Self::with_composed(seq_lens, false)
    }

    /// [`CausalAttention::new`] on the device-generic path (`composed`) or not.
    pub fn with_composed(seq_lens: Vec<usize>, composed: bool) -> Self {
        CausalAttention {
            seq_lens,
            composed,
            count: false,
            spent: Cost::default(),
            backward: Cost::default(),
            #[cfg(feature = "cuda")]
            starts: None,
        }
    }

    /// What the backward passes of the calls since the last take will issue (declared when
    /// `count`), and zero from now on.
    pub fn take_backward_cost(&mut self) -> Cost {
        std::mem::take(&mut self.backward)
    }
}

impl AttentionBackend for CausalAttention {
    /// The fused CPU kernel (f32 on the CPU); on a GPU in bf16 at head_dim 64, 128 or 256 the
    /// FlashAttention-2 kernels ([`gpu_flash`]); the block attention (every device) otherwise.
    fn attend(
        &mut self,
        _layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        window: Option<usize>,
    ) -> Result<Tensor> {
        if !self.composed && super::diff_ops::supported(q) {
            if self.count {
                self.spent += Cost::kernels(1);
                self.backward += Cost::kernels(1);
            }
            return fused::fused_causal(q, k, v, &self.seq_lens, window);
        }
        #[cfg(feature = "cuda")]
        if gpu_flash::supported(q) {
            if self.starts.is_none() {
                self.starts = Some(crate::cuda::flash_attention::starts(&self.seq_lens, q)?);
                if self.count {
                    self.spent += Cost::UPLOAD;
                }
            }
            if self.count {
                let (f, b) = gpu_flash::costs();
                self.spent += f;
                self.backward += b;
            }
            let starts = self.starts.as_ref().expect("set above");
            return gpu_flash::causal(q, k, v, &self.seq_lens, starts, window);
        }
        let block = block::BLOCK;
        let mut outs = Vec::with_capacity(self.seq_lens.len());
        let mut start = 0;
        for &len in &self.seq_lens {
            let q = q.narrow(0, start, len)?;
            let k = k.narrow(0, start, len)?;
            let v = v.narrow(0, start, len)?;
            if self.count {
                let n_rep = q.dim(1)? / k.dim(1)?.max(1);
                let low = q.dtype() != DType::F32;
                let mm = super::ops::matmul_cost(&q);
                let (f, b) = block::costs(len, n_rep, block, window, low, mm);
                self.spent += f;
                self.backward += b;
            }
            outs.push(block::causal(&q, &k, &v, block, window)?);
            start += len;
        }
        if self.count && outs.len() > 1 {
            self.spent += super::ops::cat_cost(outs.len() as u64);
        }
        Tensor::cat(&outs, 0)
    }

    fn take_cost(&mut self) -> Cost {
        std::mem::take(&mut self.spent)
    }

    /// Every sequence starts here, from zeros.
    fn recurrent_state(&mut self, _layer: usize, _values: usize) -> Result<RecurrentStep> {
        Ok(RecurrentStep {
            seq_lens: self.seq_lens.clone(),
            state: None,
        })
    }

    /// Nothing is kept: the sequences end with the step.
    fn store_recurrent_state(&mut self, _layer: usize, _state: Tensor) -> Result<()> {
        Ok(())
    }
}

/// Attention of `q` (Lq, Hq, D) over `k`, `v` (Lk, Hkv, D) with an additive `mask` (Lq, Lk,
/// f32). Grouped-query heads share their KV head. Returns (Lq, Hq, D). Below f32 the scores are
/// masked and normalised in f32, as transformers' eager attention does, and the probabilities
/// multiply `v` in the inputs' dtype.
pub fn attend_one(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
    let (_, hq, d) = q.dims3()?;
    let (_, hkv, _) = k.dims3()?;
    // (L, H, D) -> (H, L, D)
    let q = q.transpose(0, 1)?.contiguous()?;
    let k = block::repeat_kv(&k.transpose(0, 1)?.contiguous()?, hq / hkv)?;
    let v = block::repeat_kv(&v.transpose(0, 1)?.contiguous()?, hq / hkv)?;
    let scale = 1.0 / (d as f64).sqrt();
    // (H, Lq, D) x (H, D, Lk) -> (H, Lq, Lk)
    let dtype = q.dtype();
    let mut scores = (q.matmul(&k.t()?)? * scale)?.to_dtype(DType::F32)?;
    if let Some(m) = mask {
        scores = scores.broadcast_add(m)?;
    }
    let probs = softmax_last(&scores)?.to_dtype(dtype)?;
    // (H, Lq, Lk) x (H, Lk, D) -> (H, Lq, D) -> (Lq, H, D)
    probs.matmul(&v)?.transpose(0, 1)?.contiguous()
}

/// Softmax over the last dim from differentiable ops. The max is detached: softmax does not
/// depend on the shift, so its gradient through the max is zero in exact arithmetic, and
/// candle's backward of `max` (a mask of the maxima over the whole score tensor) would cost
/// several passes over the largest activation of the layer.
pub fn softmax_last(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    let sum = e.sum_keepdim(D::Minus1)?;
    e.broadcast_div(&sum)
}
