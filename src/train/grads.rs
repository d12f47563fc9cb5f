//! Gradients of one micro-batch, accumulated into the optimizer step's sums, with the two memory
//! savers: a chunked LM head + loss (the `[tokens, vocab]` logits never exist at once) and
//! per-layer activation recompute.
//!
//! The LM head and the cross-entropy are differentiated by hand, chunk by chunk:
//! `dL/dlogits = w * scale * (softmax - onehot)`, from which the hidden states' gradient and the
//! head weight's gradient follow by two matmuls. Everything upstream of the hidden states goes
//! through candle's autograd, driven by a surrogate `sum(hidden * dL/dhidden)` whose backward
//! is exactly the chain rule. With recompute, the forward keeps only each layer's input; the
//! backward reruns one layer at a time and drives it the same way; the last `kept_layers` keep
//! their activations instead, their backward one pass from the head down. Only completion positions
//! reach the head at all: prompt positions carry no loss.
//!
//! Knows nothing of the optimizer, schedules or files.

use candle_core::{DType, Tensor, Var};

use super::loss::PackedBatch;
use super::Trainable;
use crate::model::attention::CausalAttention;
use crate::model::clock;
use crate::model::cost::{backward_counted, Cost};
use crate::model::layer_ops::{Counts, Place};
use crate::model::ops::{cat_cost, matmul, matmul_cost, read_back, READ_BACK};
use crate::model::transformer::CountInto;

/// Adds `cost` at `place` to the counts, when counting.
fn note(counts: &mut Option<&mut Counts>, place: Place, what: &'static str, cost: Cost) {
    if let Some(c) = counts.as_deref_mut() {
        c.add(place, what, cost);
    }
}

/// candle's `scatter_add` and `index_add` on a GPU: a new buffer, a copy of the input into it,
/// then the kernel that adds.
const COPY_AND_ADD: Cost = Cost {
    launches: 2,
    allocations: 1,
    host_to_device: 0,
    device_to_host: 0,
    syncs: 0,
};

/// How gradients are computed (the result is the same either way, up to float order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GradOptions {
    /// Completion tokens per LM-head chunk; 0 = all at once.
    pub loss_chunk_tokens: usize,
    pub recompute: bool,
    /// With recompute: how many of the last layers keep their activations instead (their
    /// backward runs as one pass from the head down, as without recompute); the layers below
    /// recompute. At least the model's layers: none recomputes.
    pub kept_layers: usize,
}

/// A step's gradient sums, in [`Trainable::named_vars`] order (`None`: nothing added yet), f32
/// whatever the compute dtype (the optimizer's input).
pub struct GradSums(pub Vec<Option<Tensor>>);

impl GradSums {
    pub fn new(n: usize) -> GradSums {
        GradSums(vec![None; n])
    }

    /// Adds `g` to sum `i`; returns what that issued (to f32, the add).
    fn add(&mut self, i: usize, g: &Tensor) -> candle_core::Result<Cost> {
        let spent =
            Cost::kernels(u64::from(g.dtype() != DType::F32) + u64::from(self.0[i].is_some()));
        // no graph (a counted backward pass keeps one, which the sums would keep alive)
        let g = g.detach().to_dtype(DType::F32)?;
        self.0[i] = Some(match self.0[i].take() {
            Some(acc) => (acc + g)?,
            None => g,
        });
        Ok(spent)
    }

    /// The sums; a parameter that got no gradient is an error (it would silently not train).
    pub fn finish(self, names: &[(String, Var)]) -> anyhow::Result<Vec<Tensor>> {
        self.0
            .into_iter()
            .zip(names)
            .map(|(g, (name, _))| g.ok_or_else(|| anyhow::anyhow!("no gradient for {name}")))
            .collect()
    }
}

/// The head and loss of `hidden` (T, H) (no graph) against `w` (V, H): returns the loss sum
/// (`sum weight * -log p(target)`), `d(scale * loss)/d hidden` (T, H, in the hidden states'
/// dtype) and `.../d w` (V, H, f32). `host`: f32 CPU data may take the packed gemm (else, and
/// on other devices, candle ops). What the candle ops issue is added to `spent`.
pub fn head_grads(
    hidden: &Tensor,
    w: &Tensor,
    b: &PackedBatch,
    scale: f64,
    chunk: usize,
    host: bool,
    spent: &mut Cost,
) -> candle_core::Result<(f64, Tensor, Tensor)> {
    let dev = hidden.device();
    let (t, _) = hidden.dims2()?;
    let sel: Vec<u32> = (0..t as u32)
        .filter(|&i| b.weights[i as usize] > 0.0)
        .collect();
    if sel.is_empty() {
        *spent += Cost::kernels(2);
        return Ok((0.0, hidden.zeros_like()?, w.zeros_like()?));
    }
    let chunk = if chunk == 0 { sel.len() } else { chunk };
    let views = (
        crate::model::cpu_op::host_view(hidden),
        crate::model::cpu_op::host_view(w),
    );
    if let (true, Some(hv), Some(wv)) = (host, views.0, views.1) {
        let (v, h) = w.dims2()?;
        let (loss, gh, gw) = head_grads_host(hv.get()?, wv.get()?, (v, h), &sel, b, scale, chunk)?;
        *spent += Cost::UPLOAD * 2;
        return Ok((
            loss,
            Tensor::from_vec(gh, hidden.shape(), dev)?,
            Tensor::from_vec(gw, w.shape(), dev)?,
        ));
    }
    head_grads_tensors(hidden, w, b, scale, &sel, chunk, spent)
}

/// [`head_grads`] from candle ops (any device and dtype), over the positions `sel` in chunks:
/// the logits in the compute dtype, the log-sum-exp and the logits' gradient in f32, the two
/// products back in the compute dtype, the head's gradient summed over chunks in f32. What it
/// issues is added to `spent`, line by line.
fn head_grads_tensors(
    hidden: &Tensor,
    w: &Tensor,
    b: &PackedBatch,
    scale: f64,
    sel: &[u32],
    chunk: usize,
    spent: &mut Cost,
) -> candle_core::Result<(f64, Tensor, Tensor)> {
    let dev = hidden.device();
    let (mm, low) = (
        matmul_cost(w),
        Cost::kernels(u64::from(w.dtype() != DType::F32)),
    );
    let mut gw = None;
    let mut losses = Vec::new();
    let mut gh_parts = Vec::new();
    let kernel = ce_kernel(hidden, w);
    for c in sel.chunks(chunk) {
        let targets: Vec<u32> = c.iter().map(|&i| b.targets[i as usize]).collect();
        let weights: Vec<f32> = c.iter().map(|&i| b.weights[i as usize]).collect();
        let (hc, l, g) = if kernel {
            ce_chunk_kernel(hidden, w, (c, &targets, &weights), scale, spent)?
        } else {
            let idx = Tensor::new(c, dev)?;
            let hc = hidden.index_select(&idx, 0)?; // (c, H)
            let logits = matmul(&hc, &w.t()?)?.to_dtype(DType::F32)?; // (c, V)
            *spent += Cost::UPLOAD + Cost::kernels(1) + mm + low;
            let (l, g) = ce_grad_tensors(logits, &targets, &weights, scale, spent)?;
            (hc, l, g)
        };
        *spent += Cost::kernels(u64::from(g.dtype() != w.dtype()));
        let g = g.to_dtype(w.dtype())?;
        losses.push(l);
        gh_parts.push(matmul(&g, w)?); // (c, H)
        let part = matmul(&g.t()?, &hc)?.to_dtype(DType::F32)?; // (V, H)
        *spent += mm + mm + low + Cost::kernels(u64::from(gw.is_some()));
        gw = match gw {
            None => Some(part),
            Some(acc) => Some((acc + part)?),
        };
    }
    let gh_sel = Tensor::cat(&gh_parts, 0)?;
    let all = Tensor::new(sel, dev)?;
    let gh = hidden.zeros_like()?.index_add(&all, &gh_sel, 0)?;
    if gh_parts.len() > 1 {
        *spent += cat_cost(gh_parts.len() as u64);
    }
    // the indices up, zeros, and the add (a copy of the zeros, then the rows added)
    *spent += Cost::UPLOAD + Cost::kernels(1) + COPY_AND_ADD;
    let gw = gw.expect("at least one chunk");
    // the chunks' losses, read back together: the micro-batch's one wait for the device
    let loss = read_back(&losses)?.into_iter().map(f64::from).sum();
    *spent += READ_BACK;
    Ok((loss, gh, gw))
}

/// Whether the head's chunks take the cross-entropy kernel (`kernels/cross_entropy.cu`): on a
/// GPU, the hidden states and the head in one dtype the kernel takes.
fn ce_kernel(hidden: &Tensor, w: &Tensor) -> bool {
    #[cfg(feature = "cuda")]
    if hidden.device().is_cuda()
        && hidden.dtype() == w.dtype()
        && crate::cuda::cross_entropy::supported(w.dtype())
    {
        return true;
    }
    let _ = (hidden, w);
    false
}

/// One chunk of [`head_grads_tensors`] through the cross-entropy kernel: the chunk's rows,
/// targets and weights up in one copy; its hidden rows picked; the logits in the compute dtype
/// (no f32 copy), overwritten in place by their gradient; the rows' losses summed on the device.
/// Returns the hidden rows, the loss sum and the logits' gradient.
fn ce_chunk_kernel(
    hidden: &Tensor,
    w: &Tensor,
    (rows, targets, weights): (&[u32], &[u32], &[f32]),
    scale: f64,
    spent: &mut Cost,
) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    {
        use crate::cuda::kernels::tensor_ptr;
        let (v, _) = w.dims2()?;
        if let Some(t) = targets.iter().find(|&&t| t as usize >= v) {
            candle_core::bail!("target {t} is outside the vocabulary of {v}")
        }
        let n = rows.len();
        let words: Vec<u32> = rows
            .iter()
            .chain(targets)
            .copied()
            .chain(weights.iter().map(|w| w.to_bits()))
            .collect();
        let up = Tensor::new(words.as_slice(), hidden.device())?;
        let idx = up.narrow(0, 0, n)?;
        let hc = match crate::cuda::rows::gather(hidden, &idx)? {
            Some(hc) => hc,
            None => hidden.index_select(&idx, 0)?,
        };
        let logits = matmul(&hc, &w.t()?)?; // (c, V), the compute dtype
        let (tp, wp) = (
            tensor_ptr(&up.narrow(0, n, n)?)?,
            tensor_ptr(&up.narrow(0, 2 * n, n)?)?,
        );
        let losses = crate::cuda::cross_entropy::ce_grad_in_place(&logits, tp, wp, scale)?;
        // detached: kept until the micro-batch's read-back, it must hold no graph
        let loss = losses.sum_all()?.detach();
        // the upload, the rows, the logits, the kernel and its losses, their sum
        *spent += Cost::UPLOAD + Cost::kernels(1) + matmul_cost(w) + Cost::kernels(2);
        Ok((hc, loss, logits))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (hidden, w, rows, targets, weights, scale, spent);
        candle_core::bail!("the cross-entropy kernel needs the cuda feature")
    }
}

/// [`head_grads`] for f32 CPU data (`hidden` (T, H), `w` (V, H)): each chunk's three products
/// on the packed gemm, taking every operand as it is stored (the head is packed twice per call,
/// for the logits and for the hidden states' gradient), the loss gradient written over the
/// logits, and the weight's gradient summed in place.
fn head_grads_host(
    hidden: &[f32],
    w: &[f32],
    (v, h): (usize, usize),
    sel: &[u32],
    b: &PackedBatch,
    scale: f64,
    chunk: usize,
) -> candle_core::Result<(f64, Vec<f32>, Vec<f32>)> {
    use crate::gemm::{matmul, product, PackedMatrix, XLayout};
    let head = PackedMatrix::pack(w, v, h); // logits = hc @ w^T
    let head_t = PackedMatrix::pack_kn(w, v, h); // dhc = g @ w
    let mut gh = vec![0f32; hidden.len()];
    let mut gw = vec![0f32; v * h];
    let mut logits = vec![0f32; chunk.min(sel.len()) * v];
    let mut ghc = vec![0f32; chunk.min(sel.len()) * h];
    let mut loss = 0f64;
    for (n, c) in sel.chunks(chunk).enumerate() {
        let rows = c.len();
        let targets: Vec<u32> = c.iter().map(|&i| b.targets[i as usize]).collect();
        let weights: Vec<f32> = c.iter().map(|&i| b.weights[i as usize]).collect();
        let mut hc = Vec::with_capacity(rows * h);
        for &i in c {
            hc.extend_from_slice(&hidden[i as usize * h..][..h]);
        }
        let g = &mut logits[..rows * v];
        matmul(&hc, rows, &head, g);
        loss += ce_grad_in_place(g, &targets, &weights, scale)?;
        matmul(g, rows, &head_t, &mut ghc[..rows * h]);
        for (&i, row) in c.iter().zip(ghc.chunks(h)) {
            gh[i as usize * h..][..h].copy_from_slice(row);
        }
        // dw (V, H) += g^T (V, c) @ hc (c, H): g as stored is g^T transposed; hc^T packs from hc
        let hc_t = PackedMatrix::pack_kn(&hc, rows, h);
        product(g, XLayout::Transposed, v, &hc_t, &mut gw, n > 0);
    }
    Ok((loss, gh, gw))
}

/// `d(scale * loss)/d logits = weight * scale * (softmax - onehot)` of each row of `logits`
/// (c, V), and the rows' loss sum `sum weight * (logsumexp - logit[target])` (f32, on the
/// device: the caller reads the chunks' sums back together), from candle ops (any device and
/// dtype).
fn ce_grad_tensors(
    logits: Tensor,
    targets: &[u32],
    weights: &[f32],
    scale: f64,
    spent: &mut Cost,
) -> candle_core::Result<(Tensor, Tensor)> {
    let low = Cost::kernels(u64::from(logits.dtype() != DType::F32));
    // targets and weights up; max, shift, exp, sum, pick, log, subtract, weigh, sum; the loss
    // copied into the read-back; divide, -1s, the one-hot subtracted (a copy, then the
    // scatter), the weights scaled, applied
    *spent += Cost::UPLOAD * 2 + low + Cost::kernels(9) + low + Cost::in_place(1);
    *spent += Cost::kernels(2) + low + COPY_AND_ADD + Cost::kernels(2);
    let dev = logits.device().clone();
    let tg = Tensor::new(targets, &dev)?.unsqueeze(1)?;
    let wt = Tensor::new(weights, &dev)?
        .to_dtype(logits.dtype())?
        .unsqueeze(1)?;
    let shifted = logits.broadcast_sub(&logits.max_keepdim(1)?)?;
    drop(logits);
    let e = shifted.exp()?;
    let se = e.sum_keepdim(1)?; // (c, 1)
    let picked = shifted.gather(&tg, 1)?; // (c, 1)
    drop(shifted);
    let nll = (se.log()? - picked)?;
    // detached: kept until the micro-batch's read-back, it must hold no graph
    let loss = (nll * &wt)?.sum_all()?.to_dtype(DType::F32)?.detach();
    // softmax - onehot, times weight * scale
    let p = e.broadcast_div(&se)?;
    drop(e);
    let minus_one = Tensor::full(-1f32, (targets.len(), 1), &dev)?.to_dtype(p.dtype())?;
    let g = p
        .scatter_add(&tg, &minus_one, 1)?
        .broadcast_mul(&(wt * scale)?)?;
    Ok((loss, g))
}

/// [`ce_grad_tensors`] for f32 logits on the CPU: one parallel task per row (its max, then its
/// exponentials and their sum, vectorised, then the scaling), where the candle ops make a
/// dozen single-threaded passes over the (c, V) logits with as many temporaries.
/// The logits are overwritten by the gradient; returns the loss sum.
fn ce_grad_in_place(
    g: &mut [f32],
    targets: &[u32],
    weights: &[f32],
    scale: f64,
) -> candle_core::Result<f64> {
    use rayon::prelude::*;
    let rows = targets.len();
    if rows == 0 || !g.len().is_multiple_of(rows) {
        candle_core::bail!("{} logits for {rows} rows", g.len());
    }
    let v = g.len() / rows;
    let losses: Vec<candle_core::Result<f64>> = g
        .par_chunks_mut(v)
        .enumerate()
        .map(|(i, gr)| {
            let (t, w) = (targets[i] as usize, weights[i]);
            let Some(&picked) = gr.get(t) else {
                candle_core::bail!("target {t} is outside the vocabulary of {v}")
            };
            let max = crate::simd::lane_max(gr);
            let sum = crate::simd::exp_sub_sum(gr, max);
            let ws = (f64::from(w) * scale) as f32;
            let mul = ws / sum;
            for x in gr.iter_mut() {
                *x *= mul;
            }
            gr[t] -= ws;
            Ok(f64::from(w) * (f64::from(max) + f64::from(sum).ln() - f64::from(picked)))
        })
        .collect();
    let mut loss = 0f64;
    for l in losses {
        loss += l?;
    }
    Ok(loss)
}

impl Trainable {
    /// Adds the gradients of `scale * loss(b)` to `sums`; returns the batch's loss sum.
    pub fn accumulate(
        &self,
        b: &PackedBatch,
        scale: f64,
        opt: GradOptions,
        sums: &mut GradSums,
    ) -> anyhow::Result<f64> {
        self.accumulate_counted(b, scale, opt, sums, None)
    }

    /// [`Self::accumulate`], with what it issued added to `counts` when given: each layer's
    /// ops (both forward passes), its backward pass (candle's, walked; see
    /// [`backward_counted`], which needs its graph kept) and its gradients' sums at the layer;
    /// the inputs, the embedding, the norm, the head and loss, and their backward passes
    /// outside. Counts follow the recompute path (each layer's backward on its own); they are
    /// an error without it.
    pub fn accumulate_counted(
        &self,
        b: &PackedBatch,
        scale: f64,
        opt: GradOptions,
        sums: &mut GradSums,
        mut counts: Option<&mut Counts>,
    ) -> anyhow::Result<f64> {
        let dev = self.vars[0].1.device().clone();
        let tokens = Tensor::new(b.tokens.as_slice(), &dev)?;
        let positions = Tensor::new(b.positions.as_slice(), &dev)?;
        let m = &self.model;
        let mut attn = CausalAttention::with_composed(b.seq_lens.clone(), m.composed());
        let w = m.lm_head_weight().detach();
        let (chunk, host) = (opt.loss_chunk_tokens, !m.composed());
        let mut spent = Cost::default();
        let out = Place::Outside;
        let counting = counts.as_ref().is_some_and(|c| !c.timing);
        clock::phase("forward");
        note(&mut counts, out, "inputs", Cost::UPLOAD * 2);
        if !opt.recompute {
            if counting {
                anyhow::bail!("counts follow the recompute path (each layer's backward alone)");
            }
            let count = counts.as_deref_mut().map(|counts| CountInto {
                counts,
                as_cuda: false,
            });
            let hidden = m.forward_hidden_counted(&tokens, &positions, &mut attn, count)?;
            clock::phase("head");
            let (loss, gh, gw) =
                head_grads(&hidden.detach(), &w, b, scale, chunk, host, &mut spent)?;
            note(&mut counts, out, "head_loss", spent);
            clock::phase("backward");
            let store = (hidden * gh)?.sum_all()?.backward()?;
            note(&mut counts, out, "backward", Cost::default());
            self.take(&store, sums)?;
            sums.add(self.head, &gw)?;
            note(&mut counts, out, "grad_sums", Cost::default());
            return Ok(loss);
        }
        attn.count = counting;
        let layers = m.num_layers();
        let kept = opt.kept_layers.min(layers);
        if counting && kept > 0 {
            anyhow::bail!("counts follow the recompute path with no kept layers");
        }
        // Forward, keeping only the input of each layer that recomputes.
        let recomputed = layers - kept;
        let rope = m.rope_rows_counted(&positions, &mut spent)?;
        note(&mut counts, out, "rope_rows", std::mem::take(&mut spent));
        let mut xs = Vec::with_capacity(recomputed + 1);
        xs.push(m.embed_counted(&tokens, &mut spent)?.detach());
        note(&mut counts, out, "embedding", std::mem::take(&mut spent));
        for i in 0..recomputed {
            let x = m.layer_forward_counted(i, &xs[i], &rope, &mut attn, counts.as_deref_mut())?;
            xs.push(x.detach());
        }
        attn.take_backward_cost(); // this pass has no backward
                                   // The kept layers with their graph, from their input as a variable; the norm and the
                                   // head.
        let x = Var::from_tensor(
            &xs.pop()
                .expect("an input per recomputed layer, and one more"),
        )?;
        note(&mut counts, out, "input_var", Cost::kernels(1));
        let mut y = x.as_tensor().clone();
        for i in recomputed..layers {
            // (with kept layers only timing marks: exact counts follow the recompute path)
            y = m.layer_forward_counted(i, &y, &rope, &mut attn, counts.as_deref_mut())?;
        }
        clock::phase("head");
        let hidden = m.final_norm_counted(&y, &mut spent)?;
        note(&mut counts, out, "final_norm", std::mem::take(&mut spent));
        let (loss, gh, gw) = head_grads(&hidden.detach(), &w, b, scale, chunk, host, &mut spent)?;
        note(&mut counts, out, "head_loss", std::mem::take(&mut spent));
        note(&mut counts, out, "grad_sums", sums.add(self.head, &gw)?);
        clock::phase("backward");
        let (mut gx, c) = self.drive(&hidden, gh, &x, sums, counting)?;
        note(&mut counts, out, "final_norm_backward", c);
        drop((y, hidden));
        // Each recomputed layer again, last to first.
        for i in (0..recomputed).rev() {
            let place = Place::Layer(i, m.config().layer_kinds[i]);
            let x = Var::from_tensor(&xs.pop().expect("an input per layer"))?;
            note(&mut counts, place, "input_var", Cost::kernels(1));
            let y =
                m.layer_forward_counted(i, x.as_tensor(), &rope, &mut attn, counts.as_deref_mut())?;
            let (g, c) = self.drive(&y, gx, &x, sums, counting)?;
            gx = g;
            note(&mut counts, place, "backward", c);
            let attend = attn.take_backward_cost();
            if attend != Cost::default() {
                note(&mut counts, place, "attend_backward", attend);
            }
        }
        let e = m.embed_counted(&tokens, &mut spent)?;
        note(&mut counts, out, "embedding", spent);
        let (_, c) = self.backward_of(&e, gx, sums, counting)?;
        note(&mut counts, out, "embedding_backward", c);
        Ok(loss)
    }

    /// Backward of `sum(out * seed)`: parameter gradients into `sums`, and the gradient of
    /// `input`; with what it issued when `counting` (the product and its sum, candle's backward
    /// pass, the sums).
    fn drive(
        &self,
        out: &Tensor,
        seed: Tensor,
        input: &Var,
        sums: &mut GradSums,
        counting: bool,
    ) -> anyhow::Result<(Tensor, Cost)> {
        let (store, spent) = self.backward_of(out, seed, sums, counting)?;
        let g = store
            .get(input.as_tensor())
            .ok_or_else(|| anyhow::anyhow!("no gradient reached a layer's input"))?
            .detach();
        Ok((g, spent))
    }

    /// [`Self::drive`]'s backward pass, its store kept for the caller.
    fn backward_of(
        &self,
        out: &Tensor,
        seed: Tensor,
        sums: &mut GradSums,
        counting: bool,
    ) -> anyhow::Result<(candle_core::backprop::GradStore, Cost)> {
        if !counting {
            let store = (out * seed)?.sum_all()?.backward()?;
            self.take(&store, sums)?;
            return Ok((store, Cost::default()));
        }
        // the seed as a variable, so that the backward's first products keep their graph (a
        // constant seed would get the same kernels, unseen)
        let seed = Var::from_tensor(&seed)?;
        let (store, backward) = backward_counted(&(out * seed.as_tensor())?.sum_all()?)?;
        let sums_cost = self.take(&store, sums)?;
        Ok((store, Cost::kernels(2) + backward + sums_cost))
    }

    /// Adds the store's parameter gradients to `sums`; returns what that issued.
    fn take(
        &self,
        store: &candle_core::backprop::GradStore,
        sums: &mut GradSums,
    ) -> anyhow::Result<Cost> {
        let mut spent = Cost::default();
        for (i, (_, v)) in self.vars.iter().enumerate() {
            if let Some(g) = store.get(v.as_tensor()) {
                spent += sums.add(i, g)?;
            }
        }
        Ok(spent)
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::{ce_grad_in_place, ce_grad_tensors, head_grads, head_grads_tensors};
    use crate::model::cost::Cost;
    use crate::model::tests::max_abs_diff;
    use crate::train::loss::PackedBatch;

    /// The one-pass CPU loss and gradient equal the candle ops', for a vocabulary that is not a
    /// multiple of the eight lanes, large and small logits, and rows of different weights.
    #[test]
    fn host_cross_entropy_equals_the_composed_ops() {
        let (rows, v) = (5, 203);
        let logits: Vec<f32> = (0..rows * v)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * if i % 7 == 0 { 0.9 } else { 0.05 })
            .collect();
        let targets = [0u32, 202, 17, 101, 5];
        let weights = [1.0f32, 0.5, 2.0, 1.0, 1.0];
        let scale = 0.125;
        let mut gh = logits.clone();
        let lh = ce_grad_in_place(&mut gh, &targets, &weights, scale).unwrap();
        let t = Tensor::from_vec(logits, (rows, v), &Device::Cpu).unwrap();
        let (lt, gt) = ce_grad_tensors(t, &targets, &weights, scale, &mut Cost::default()).unwrap();
        let gt = gt.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let lt = f64::from(lt.to_scalar::<f32>().unwrap());
        assert!((lh - lt).abs() <= 1e-5 * lt.abs(), "loss {lh} vs {lt}");
        let worst = gh
            .iter()
            .zip(&gt)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-7, "gradients differ by {worst}");
        // the target's entry is where the one-hot lands
        assert!(gh[202 + v] < 0.0 && gh[0] < 0.0);
        assert!(ce_grad_in_place(&mut [0.0; 6], &[3, 7], &[1.0, 1.0], 1.0).is_err());
    }

    /// The head on the packed gemm gives the loss and both gradients of the candle ops, chunked
    /// and not, with
    /// positions that carry no loss in between.
    #[test]
    fn host_head_equals_the_candle_head() {
        let (t, h, v) = (40, 24, 203);
        let dev = Device::Cpu;
        let hidden = Tensor::randn(0f32, 1.0, (t, h), &dev).unwrap();
        let w = Tensor::randn(0f32, 0.5, (v, h), &dev).unwrap();
        let b = PackedBatch {
            tokens: vec![0; t],
            positions: (0..t as u32).collect(),
            seq_lens: vec![t],
            targets: (0..t as u32).map(|i| i * 7 % v as u32).collect(),
            weights: (0..t).map(|i| if i % 5 == 1 { 0.0 } else { 1.0 }).collect(),
        };
        for chunk in [0, 7, 16] {
            let (la, gha, gwa) =
                head_grads(&hidden, &w, &b, 0.25, chunk, true, &mut Cost::default()).unwrap();
            let sel: Vec<u32> = (0..t as u32)
                .filter(|&i| b.weights[i as usize] > 0.0)
                .collect();
            let c = if chunk == 0 { sel.len() } else { chunk };
            let (lb, ghb, gwb) =
                head_grads_tensors(&hidden, &w, &b, 0.25, &sel, c, &mut Cost::default()).unwrap();
            assert!(
                (la - lb).abs() <= 1e-5 * lb.abs(),
                "chunk {chunk}: loss {la} vs {lb}"
            );
            assert!(
                max_abs_diff(&gha, &ghb) < 1e-5,
                "chunk {chunk}: hidden gradient"
            );
            assert!(
                max_abs_diff(&gwa, &gwb) < 1e-5,
                "chunk {chunk}: head gradient"
            );
            // positions without loss get no gradient
            let row = gha.get(1).unwrap().abs().unwrap().sum_all().unwrap();
            assert_eq!(row.to_scalar::<f32>().unwrap(), 0.0);
        }
    }
}
