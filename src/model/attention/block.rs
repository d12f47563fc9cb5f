//! Causal attention for training on any device without the `(heads, L, L)` tensors:
//! FlashAttention's algorithm at the granularity of candle ops. Queries go in blocks of
//! [`BLOCK`] rows; a block's scores `(heads, B, keys so far)` exist only while the block is
//! computed. The forward keeps the output and each row's log-sum-exp; the backward recomputes
//! each block's probabilities from them (FlashAttention-2's backward), so what training keeps per
//! layer is the inputs, the output and one f32 per head and row.
//!
//! Every product is a candle matmul in the inputs' dtype (cuBLAS on a GPU, gemm on the CPU);
//! scores, softmax and their gradients are f32. The op records its own backward (a candle
//! [`CustomOp3`] whose forward hands back the output computed outside it), so it is the same code
//! on every device, and the CPU tests check it against PyTorch through the whole model. The fused
//! CPU kernel ([`super::fused`]) stays the CPU's fast path. Knows nothing of layers.

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CustomOp3, DType, Device, Layout, Result, Shape, Storage, Tensor, D,
};

use crate::model::clock;
use crate::model::cost::Cost;
use crate::model::ops::matmul;

/// Query rows per block: a block's f32 scores are `heads * BLOCK * L * 4` bytes (32 heads at
/// L = 4,096: 128 MiB).
pub const BLOCK: usize = 256;

/// Causal attention of `q` (L, Hq, D) over `k`, `v` (L, Hkv, D) of one sequence, in query
/// blocks of `block` rows; differentiable in `q`, `k` and `v`. Returns (L, Hq, D). With
/// `window` (a sliding-window layer), query i sees only the `window` keys ending at i.
pub fn causal(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    block: usize,
    window: Option<usize>,
) -> Result<Tensor> {
    let (l, hq, d) = q.dims3()?;
    let hkv = k.dim(1)?;
    if hq % hkv != 0 {
        candle_core::bail!("{hq} query heads over {hkv} KV heads")
    }
    let (qh, kh, vh) = heads_first(q, k, v)?;
    let scale = 1.0 / (d as f64).sqrt();
    let block = block.max(1);
    let mut outs = Vec::new();
    let mut lses = Vec::new();
    let mut s = 0;
    while s < l {
        let e = (s + block).min(l);
        let qb = qh.narrow(1, s, e - s)?;
        let scores = block_scores(&qb, &kh, s, e, scale, window)?; // (H, B, e) f32
        let max = scores.max_keepdim(D::Minus1)?;
        let p = scores.broadcast_sub(&max)?.exp()?;
        let sum = p.sum_keepdim(D::Minus1)?;
        let probs = p.broadcast_div(&sum)?.to_dtype(q.dtype())?;
        outs.push(matmul(&probs, &vh.narrow(1, 0, e)?)?); // (H, B, D)
        lses.push((max + sum.log()?)?); // (H, B, 1)
        s = e;
    }
    let out = Tensor::cat(&outs, 1)?.transpose(0, 1)?.contiguous()?; // (L, H, D)
    let op = Attach {
        out,
        lse: Tensor::cat(&lses, 1)?,
        block,
        scale,
        window,
        shape: (l, hq, hkv, d),
    };
    q.apply_op3_arc(k, v, std::sync::Arc::new(Box::new(op)))
}

/// What [`causal`] issues for one sequence of `l` tokens, forward and (in candle's backward
/// pass, through [`Attach`]) backward, read off the code above and below, line by line: the
/// forward's work runs with no graph and the backward is a custom op's, so no graph walk can
/// see either. `n_rep`: query heads per KV head; `low`: inputs below f32 (the scores convert);
/// `mm`: what one of our [`matmul`]s issues on this device ([`crate::model::ops::matmul_cost`]).
/// Assumes more than one head (a transpose of `(L, H, D)` copies unless `L` is 1).
pub fn costs(
    l: usize,
    n_rep: usize,
    block: usize,
    window: Option<usize>,
    low: bool,
    mm: Cost,
) -> (Cost, Cost) {
    use crate::model::ops::cat_cost;
    let k = |n: u64| Cost::kernels(n);
    let (t, low, rep) = (
        k(u64::from(l > 1)),
        k(u64::from(low)),
        k(u64::from(n_rep > 1)),
    );
    let block = block.max(1);
    let blocks = l.div_ceil(block) as u64;
    let cat = |n: u64| if n > 1 { cat_cost(n) } else { Cost::default() };
    let heads_first = t * 3 + rep * 2;
    // block_scores: the product, to f32, the scale, and the mask where one is needed
    let scores = |s: usize, e: usize| {
        let mut c = mm + low + k(1);
        if !(e - s == 1 && window.is_none_or(|w| w >= e)) {
            c += Cost::UPLOAD * 2 + k(1); // two position ranges, compared
            if window.is_some() {
                c += Cost::UPLOAD + k(2); // the window's reach, compared and multiplied
            }
            c += k(4); // zeros, -inf, the select, the add
        }
        c
    };
    let (mut fwd, mut bwd) = (heads_first, heads_first);
    // the backward: dO and O heads-first, D_i = rowsum(dO * O) in f32, the dK and dV sums
    bwd += t * 2 + low * 2 + k(2) + k(2);
    let mut s = 0;
    while s < l {
        let e = (s + block).min(l);
        // max, shift, exp, sum, divide, to the inputs' dtype, P V, log, max + log
        fwd += scores(s, e) + k(5) + low + mm + k(2);
        let pad = if e < l {
            k(1) + cat_cost(2)
        } else {
            Cost::default()
        };
        // P from the LSE (shift, exp); dV += P^T dO; dP = dO V^T; dS; dQ = dS K; dK += dS^T Q
        bwd += scores(s, e) + k(2);
        bwd += low + mm + low + pad + k(1);
        bwd += mm + low;
        bwd += k(3) + low;
        bwd += mm;
        bwd += mm + low + pad + k(1);
        s = e;
    }
    // the blocks' outputs and LSEs joined, the output heads-last, and handed to the op
    fwd += cat(blocks) + t + cat(blocks) + k(1);
    // dQ joined and heads-last; dK and dV summed over each KV head's queries, to the inputs'
    // dtype, heads-last; each added into its input's gradient by candle's backward
    bwd += cat(blocks) + t + (k(1) + low + t) * 2 + k(3);
    (fwd, bwd)
}

/// (L, H, D) inputs as heads-first (H, L, D), the KV heads repeated for their query heads; no
/// graph.
fn heads_first(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let n_rep = q.dim(1)? / k.dim(1)?;
    let first = |x: &Tensor| x.detach().transpose(0, 1)?.contiguous();
    Ok((
        first(q)?,
        repeat_kv(&first(k)?, n_rep)?.contiguous()?,
        repeat_kv(&first(v)?, n_rep)?.contiguous()?,
    ))
}

/// The f32 scores (H, e - s, e) of queries `s..e` over keys `0..e`, scaled and causally masked
/// (and to the `window` keys ending at each query).
fn block_scores(
    qb: &Tensor,
    kh: &Tensor,
    s: usize,
    e: usize,
    scale: f64,
    window: Option<usize>,
) -> Result<Tensor> {
    let kb = kh.narrow(1, 0, e)?;
    let scores = (matmul(qb, &kb.t()?)?.to_dtype(DType::F32)? * scale)?;
    if e - s == 1 && window.is_none_or(|w| w >= e) {
        return Ok(scores); // one query row, the last key: it sees every key
    }
    let mask = causal_mask(e - s, e, s, window, qb.device())?;
    scores.broadcast_add(&mask)
}

/// The op that gives the forward's output a backward pass: its forward returns `out` (computed
/// outside, with no graph), its backward recomputes each block from `lse`.
struct Attach {
    /// (L, Hq, D), contiguous.
    out: Tensor,
    /// (Hq, L, 1) f32: each row's log-sum-exp of the scaled scores.
    lse: Tensor,
    block: usize,
    scale: f64,
    window: Option<usize>,
    /// (L, Hq, Hkv, D)
    shape: (usize, usize, usize, usize),
}

impl Attach {
    fn out_shape(&self) -> Shape {
        let (l, hq, _, d) = self.shape;
        Shape::from((l, hq, d))
    }
}

impl CustomOp3 for Attach {
    fn name(&self) -> &'static str {
        "block-causal-attention"
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
        let (st, layout) = self.out.storage_and_layout();
        match &*st {
            Storage::Cpu(c) => Ok((c.try_clone(layout)?, self.out_shape())),
            _ => candle_core::bail!("block attention: the output is not on the CPU"),
        }
    }

    #[cfg(feature = "cuda")]
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
            Storage::Cuda(c) => Ok((c.try_clone(layout)?, self.out_shape())),
            _ => candle_core::bail!("block attention: the output is not on the GPU"),
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
        let (l, hq, hkv, d) = self.shape;
        let dtype = q.dtype();
        let (qh, kh, vh) = heads_first(q, k, v)?;
        let go = grad.detach().transpose(0, 1)?.contiguous()?; // (H, L, D)
        let oh = self.out.transpose(0, 1)?.contiguous()?;
        // D_i = rowsum(dO * O), f32 (H, L, 1)
        let delta =
            (go.to_dtype(DType::F32)? * oh.to_dtype(DType::F32)?)?.sum_keepdim(D::Minus1)?;
        let mut dq = Vec::new();
        let mut dk = Tensor::zeros((hq, l, d), DType::F32, q.device())?;
        let mut dv = Tensor::zeros((hq, l, d), DType::F32, q.device())?;
        let mut s = 0;
        while s < l {
            let e = (s + self.block).min(l);
            let b = e - s;
            let qb = qh.narrow(1, s, b)?;
            let gb = go.narrow(1, s, b)?;
            let scores = block_scores(&qb, &kh, s, e, self.scale, self.window)?;
            let p = scores.broadcast_sub(&self.lse.narrow(1, s, b)?)?.exp()?; // (H, b, e) f32
            let kb = kh.narrow(1, 0, e)?;
            let vb = vh.narrow(1, 0, e)?;
            // dV[:e] += P^T dO
            let dv_b = matmul(&p.to_dtype(dtype)?.t()?, &gb)?.to_dtype(DType::F32)?;
            dv = (dv + dv_b.pad_with_zeros(1, 0, l - e)?)?;
            // dS = P * (dO V^T - D_i), times the scale
            let dp = matmul(&gb, &vb.t()?)?.to_dtype(DType::F32)?;
            let ds = (p * dp.broadcast_sub(&delta.narrow(1, s, b)?)?)?;
            let ds = (ds * self.scale)?.to_dtype(dtype)?;
            dq.push(matmul(&ds, &kb)?); // (H, b, D)
            let dk_b = matmul(&ds.t()?, &qb)?.to_dtype(DType::F32)?; // (H, e, D)
            dk = (dk + dk_b.pad_with_zeros(1, 0, l - e)?)?;
            s = e;
        }
        // back to (L, H, D); a KV head's gradient sums over its query heads
        let dq = Tensor::cat(&dq, 1)?.transpose(0, 1)?.contiguous()?;
        let n_rep = hq / hkv;
        let fold = |x: Tensor| -> Result<Tensor> {
            x.reshape((hkv, n_rep, l, d))?
                .sum(1)?
                .to_dtype(dtype)?
                .transpose(0, 1)?
                .contiguous()
        };
        let grads = (Some(dq), Some(fold(dk)?), Some(fold(dv)?));
        clock::mark_here("attend_backward");
        Ok(grads)
    }
}

/// (Hkv, L, D) -> (Hkv * n_rep, L, D), each KV head repeated for its query heads.
pub fn repeat_kv(x: &Tensor, n_rep: usize) -> Result<Tensor> {
    if n_rep == 1 {
        return Ok(x.clone());
    }
    let (hkv, l, d) = x.dims3()?;
    x.unsqueeze(1)?
        .expand((hkv, n_rep, l, d))?
        .reshape((hkv * n_rep, l, d))
}

/// Additive mask (Lq, Lk): query i (at absolute position `p = offset + i`) sees keys `0..=p`,
/// or with `window` the last `window` of them, `p + 1 - window..=p` (transformers' sliding
/// window: the query's own key counts). Built on `device` from two position ranges (no host
/// buffer: on a GPU, a host-built mask was an upload of Lq x Lk floats per block, per layer,
/// forward and backward, which took longer than the attention itself).
pub fn causal_mask(
    lq: usize,
    lk: usize,
    offset: usize,
    window: Option<usize>,
    device: &Device,
) -> Result<Tensor> {
    let rows = Tensor::arange(offset as u32, (offset + lq) as u32, device)?.reshape((lq, 1))?;
    let cols = Tensor::arange(0u32, lk as u32, device)?.reshape((1, lk))?;
    let mut seen = cols.broadcast_le(&rows)?; // (Lq, Lk) u8: key j <= query position
    if let Some(w) = window {
        // and j + w > position
        let reach = Tensor::arange(w as u32, (lk + w) as u32, device)?.reshape((1, lk))?;
        seen = (seen * reach.broadcast_gt(&rows)?)?;
    }
    let zero = Tensor::zeros((lq, lk), DType::F32, device)?;
    let masked = Tensor::full(f32::NEG_INFINITY, (lq, lk), device)?;
    seen.where_cond(&zero, &masked)
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::causal_mask;

    /// Query i at position offset + i sees keys 0..=offset + i: 0 there, -inf after.
    #[test]
    fn the_causal_mask_hides_only_later_keys() {
        let m: Vec<Vec<f32>> = causal_mask(3, 6, 2, None, &Device::Cpu)
            .unwrap()
            .to_vec2()
            .unwrap();
        for (i, row) in m.iter().enumerate() {
            for (j, &x) in row.iter().enumerate() {
                let want = if j <= 2 + i { 0.0 } else { f32::NEG_INFINITY };
                assert_eq!(x, want, "({i}, {j})");
            }
        }
    }

    /// With a window of 3, query i at position 2 + i sees keys 2 + i - 2 ..= 2 + i.
    #[test]
    fn a_window_hides_the_keys_before_it() {
        let m: Vec<Vec<f32>> = causal_mask(3, 6, 2, Some(3), &Device::Cpu)
            .unwrap()
            .to_vec2()
            .unwrap();
        for (i, row) in m.iter().enumerate() {
            for (j, &x) in row.iter().enumerate() {
                let p = 2 + i;
                let want = if j <= p && j + 3 > p {
                    0.0
                } else {
                    f32::NEG_INFINITY
                };
                assert_eq!(x, want, "({i}, {j})");
            }
        }
    }
}
