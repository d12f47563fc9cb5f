//! The SFT loss: next-token cross-entropy on completion tokens only (prompt tokens masked),
//! summed; the caller divides by the completion tokens of the optimizer step
//! (`sft_reference.json`'s definition), so that gradient accumulation and packing do not change
//! what a token weighs.
//!
//! [`PackedBatch`] lays rows (prompt, completion) end to end; attention stays inside each row
//! (the caller gives `seq_lens` to the attention backend). Knows nothing of the optimizer.

use candle_core::{DType, Device, Result, Tensor, D};

/// Rows laid end to end, with each position's next-token target and loss weight.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedBatch {
    pub tokens: Vec<u32>,
    /// Position within its own row (RoPE restarts at 0 for every row).
    pub positions: Vec<u32>,
    pub seq_lens: Vec<usize>,
    /// The next token of the same row (0 where there is none; its weight is 0).
    pub targets: Vec<u32>,
    /// 1 where the target is a completion token, else 0.
    pub weights: Vec<f32>,
}

impl PackedBatch {
    /// Packs `(prompt_ids, completion_ids)` rows.
    pub fn pack(rows: &[(&[u32], &[u32])]) -> PackedBatch {
        let mut b = PackedBatch {
            tokens: Vec::new(),
            positions: Vec::new(),
            seq_lens: Vec::new(),
            targets: Vec::new(),
            weights: Vec::new(),
        };
        for (prompt, completion) in rows {
            let row: Vec<u32> = prompt.iter().chain(completion.iter()).copied().collect();
            let n = row.len();
            for (i, &t) in row.iter().enumerate() {
                b.tokens.push(t);
                b.positions.push(i as u32);
                let next = row.get(i + 1).copied();
                b.targets.push(next.unwrap_or(0));
                // the target at i is token i+1: a completion token when i + 1 >= prompt.len()
                let w = next.is_some() && i + 1 >= prompt.len();
                b.weights.push(if w { 1.0 } else { 0.0 });
            }
            b.seq_lens.push(n);
        }
        b
    }

    /// Tokens the loss counts.
    /// `rows` rows of `seq_len` made-up tokens below `vocab`, the first quarter of each prompt
    /// (masked from the loss): the benchmarks' batch.
    pub fn synthetic(rows: usize, seq_len: usize, vocab: usize) -> PackedBatch {
        let prompt = seq_len / 4;
        let rows: Vec<(Vec<u32>, Vec<u32>)> = (0..rows)
            .map(|r| {
                let tok = |i: usize| ((r * 7919 + i * 104_729) % vocab) as u32;
                (
                    (0..prompt).map(tok).collect(),
                    (prompt..seq_len).map(tok).collect(),
                )
            })
            .collect();
        let refs: Vec<(&[u32], &[u32])> = rows
            .iter()
            .map(|(p, c)| (p.as_slice(), c.as_slice()))
            .collect();
        PackedBatch::pack(&refs)
    }

    pub fn loss_tokens(&self) -> usize {
        self.weights.iter().filter(|&&w| w > 0.0).count()
    }
}

/// Sum over positions of `weight * -log_softmax(logits)[target]`, from differentiable ops
/// (candle's `log_softmax` is max / sub / exp / sum / log, each with a backward pass).
/// `logits` (T, V); returns a scalar.
pub fn weighted_ce_sum(logits: &Tensor, targets: &[u32], weights: &[f32]) -> Result<Tensor> {
    let dev: &Device = logits.device();
    let t = Tensor::new(targets, dev)?.unsqueeze(1)?;
    let w = Tensor::new(weights, dev)?.to_dtype(logits.dtype())?;
    let logp = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    let picked = logp.gather(&t, 1)?.squeeze(1)?; // (T,)
    (picked.neg()? * w)?.sum_all()?.to_dtype(DType::F32)
}
