//! Gradients of one micro-batch, accumulated into the optimizer step's sums, with the two memory
//! savers: a chunked LM head + loss (the `[tokens, vocab]` logits never exist at once) and
//! per-layer activation recompute.
//!
//! The LM head and the cross-entropy are differentiated by hand, chunk by chunk:
//! `dL/dlogits = w * scale * (softmax - onehot)`, from which the hidden states' gradient and the
//! head weight's gradient follow by two matmuls. Everything upstream of the hidden states goes
//! through candle's autograd, driven by a surrogate `sum(hidden * dL/dhidden)` whose backward
//! is exactly the chain rule. With recompute, the forward keeps only each layer's input; the
//! backward reruns one layer at a time and drives it the same way. Only completion positions
//! reach the head at all: prompt positions carry no loss.
//!
//! Knows nothing of the optimizer, schedules or files.

use candle_core::{DType, Tensor, Var};

use super::loss::PackedBatch;
use super::Trainable;
use crate::model::attention::CausalAttention;

/// How gradients are computed (the result is the same either way, up to float order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GradOptions {
    /// Completion tokens per LM-head chunk; 0 = all at once.
    pub loss_chunk_tokens: usize,
    pub recompute: bool,
}

/// A step's gradient sums, in [`Trainable::named_vars`] order (`None`: nothing added yet).
pub struct GradSums(pub Vec<Option<Tensor>>);

impl GradSums {
    pub fn new(n: usize) -> GradSums {
        GradSums(vec![None; n])
    }

    fn add(&mut self, i: usize, g: &Tensor) -> candle_core::Result<()> {
        self.0[i] = Some(match self.0[i].take() {
            Some(acc) => (acc + g)?,
            None => g.clone(),
        });
        Ok(())
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
/// (`sum weight * -log p(target)`), `d(scale * loss)/d hidden` (T, H) and `.../d w` (V, H).
pub fn head_grads(
    hidden: &Tensor,
    w: &Tensor,
    b: &PackedBatch,
    scale: f64,
    chunk: usize,
) -> candle_core::Result<(f64, Tensor, Tensor)> {
    let dev = hidden.device();
    let (t, _) = hidden.dims2()?;
    let sel: Vec<u32> = (0..t as u32)
        .filter(|&i| b.weights[i as usize] > 0.0)
        .collect();
    let mut gw = w.zeros_like()?;
    if sel.is_empty() {
        return Ok((0.0, hidden.zeros_like()?, gw));
    }
    let chunk = if chunk == 0 { sel.len() } else { chunk };
    let mut loss = 0f64;
    let mut gh_parts = Vec::new();
    for c in sel.chunks(chunk) {
        let idx = Tensor::new(c, dev)?;
        let targets: Vec<u32> = c.iter().map(|&i| b.targets[i as usize]).collect();
        let weights: Vec<f32> = c.iter().map(|&i| b.weights[i as usize]).collect();
        let tg = Tensor::new(targets.as_slice(), dev)?.unsqueeze(1)?;
        let wt = Tensor::new(weights.as_slice(), dev)?
            .to_dtype(hidden.dtype())?
            .unsqueeze(1)?;
        let hc = hidden.index_select(&idx, 0)?; // (c, H)
        let logits = hc.matmul(&w.t()?)?; // (c, V)
        let shifted = logits.broadcast_sub(&logits.max_keepdim(1)?)?;
        drop(logits);
        let e = shifted.exp()?;
        let se = e.sum_keepdim(1)?; // (c, 1)
        let picked = shifted.gather(&tg, 1)?; // (c, 1)
        drop(shifted);
        let nll = (se.log()? - picked)?;
        loss += f64::from(
            (nll * &wt)?
                .sum_all()?
                .to_dtype(DType::F32)?
                .to_scalar::<f32>()?,
        );
        // softmax - onehot, times weight * scale
        let p = e.broadcast_div(&se)?;
        drop(e);
        let minus_one = Tensor::full(-1f32, (c.len(), 1), dev)?.to_dtype(p.dtype())?;
        let g = p
            .scatter_add(&tg, &minus_one, 1)?
            .broadcast_mul(&(wt * scale)?)?;
        gh_parts.push(g.matmul(w)?); // (c, H)
        gw = (gw + g.t()?.matmul(&hc)?)?; // (V, H)
    }
    let gh_sel = Tensor::cat(&gh_parts, 0)?;
    let all = Tensor::new(sel.as_slice(), dev)?;
    let gh = hidden.zeros_like()?.index_add(&all, &gh_sel, 0)?;
    Ok((loss, gh, gw))
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
        let dev = self.vars[0].1.device().clone();
        let tokens = Tensor::new(b.tokens.as_slice(), &dev)?;
        let positions = Tensor::new(b.positions.as_slice(), &dev)?;
        let mut attn = CausalAttention::new(b.seq_lens.clone());
        let m = &self.model;
        let w = m.lm_head_weight().detach();
        if !opt.recompute {
            let hidden = m.forward_hidden(&tokens, &positions, &mut attn)?;
            let (loss, gh, gw) = head_grads(&hidden.detach(), &w, b, scale, opt.loss_chunk_tokens)?;
            let store = (hidden * gh)?.sum_all()?.backward()?;
            self.take(&store, sums)?;
            sums.add(self.head, &gw)?;
            return Ok(loss);
        }
        // Forward, keeping only each layer's input.
        let rope = m.rope_rows(&positions)?;
        let layers = m.num_layers();
        let mut xs = Vec::with_capacity(layers + 1);
        xs.push(m.embed(&tokens)?.detach());
        for i in 0..layers {
            let x = m.layer_forward(i, &xs[i], &rope, &mut attn)?.detach();
            xs.push(x);
        }
        // The norm and the head.
        let x = Var::from_tensor(&xs.pop().expect("layers + 1 inputs"))?;
        let hidden = m.final_norm(x.as_tensor())?;
        let (loss, gh, gw) = head_grads(&hidden.detach(), &w, b, scale, opt.loss_chunk_tokens)?;
        sums.add(self.head, &gw)?;
        let mut gx = self.drive(&(hidden * gh)?, &x, sums)?;
        // Each layer again, last to first.
        for i in (0..layers).rev() {
            let x = Var::from_tensor(&xs.pop().expect("an input per layer"))?;
            let out = m.layer_forward(i, x.as_tensor(), &rope, &mut attn)?;
            gx = self.drive(&(out * gx)?, &x, sums)?;
        }
        let e = m.embed(&tokens)?;
        let store = (e * gx)?.sum_all()?.backward()?;
        self.take(&store, sums)?;
        Ok(loss)
    }

    /// Backward of `sum(product)`: parameter gradients into `sums`, and the gradient of `input`.
    fn drive(&self, product: &Tensor, input: &Var, sums: &mut GradSums) -> anyhow::Result<Tensor> {
        let store = product.sum_all()?.backward()?;
        self.take(&store, sums)?;
        Ok(store
            .get(input.as_tensor())
            .ok_or_else(|| anyhow::anyhow!("no gradient reached a layer's input"))?
            .clone())
    }

    fn take(
        &self,
        store: &candle_core::backprop::GradStore,
        sums: &mut GradSums,
    ) -> anyhow::Result<()> {
        for (i, (_, v)) in self.vars.iter().enumerate() {
            if let Some(g) = store.get(v.as_tensor()) {
                sums.add(i, g)?;
            }
        }
        Ok(())
    }
}
