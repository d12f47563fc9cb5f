//! The paged KV cache on CPU and the attention backend that reads it: the reference
//! implementation the CUDA kernels are tested against.
//!
//! ```text
//! per layer:  k, v : [num_blocks * block_size slots][Hkv][D]   (f32)
//! a step:     tokens of several sequences end to end; sequence s brings num_new tokens
//!             starting at position start_pos, and its block table maps positions to slots
//! ```
//! `PagedAttention::attend` (1) writes the step's keys and values into their slots, then
//! (2) lets each new token attend over its sequence's keys at positions `0..=pos`, read through
//! the block table. Knows nothing of scheduling or sampling; the caller reserves the slots
//! (see `block_pool`) and copies shared blocks before they are written.

use candle_core::{DType, Result, Tensor};
use rayon::prelude::*;

use super::block_pool::{BlockId, BlockTable};
use crate::model::attention::AttentionBackend;
use crate::model::ModelConfig;

#[derive(Debug, Clone)]
pub struct KvCache {
    pub block_size: usize,
    pub num_blocks: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvCache {
    pub fn new(cfg: &ModelConfig, block_size: usize, num_blocks: usize) -> KvCache {
        let per_layer = num_blocks * block_size * cfg.num_kv_heads * cfg.head_dim;
        KvCache {
            block_size,
            num_blocks,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            k: vec![vec![0.0; per_layer]; cfg.num_layers],
            v: vec![vec![0.0; per_layer]; cfg.num_layers],
        }
    }

    /// Bytes one token's keys and values take over all layers (f32).
    pub fn bytes_per_token(cfg: &ModelConfig) -> usize {
        2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * std::mem::size_of::<f32>()
    }

    /// How many blocks fit in `bytes`.
    pub fn blocks_for_budget(cfg: &ModelConfig, block_size: usize, bytes: u64) -> usize {
        let per_block = (Self::bytes_per_token(cfg) * block_size).max(1) as u64;
        (bytes / per_block) as usize
    }

    fn row(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Copies every layer's keys and values of block `src` into `dst` (copy on write).
    pub fn copy_block(&mut self, src: BlockId, dst: BlockId) {
        let n = self.block_size * self.row();
        let (s, d) = (src.0 as usize * n, dst.0 as usize * n);
        for layer in self.k.iter_mut().chain(self.v.iter_mut()) {
            if s + n <= layer.len() && d + n <= layer.len() {
                layer.copy_within(s..s + n, d);
            }
        }
    }
}

/// One sequence's share of a step.
#[derive(Debug, Clone, Copy)]
pub struct SeqStep<'a> {
    pub block_table: &'a BlockTable,
    /// Position of the first new token (= tokens already in the cache).
    pub start_pos: usize,
    pub num_new: usize,
}

/// Attention over the paged cache for one step.
pub struct PagedAttention<'a> {
    pub cache: &'a mut KvCache,
    pub seqs: Vec<SeqStep<'a>>,
}

fn to_vec(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
}

impl AttentionBackend for PagedAttention<'_> {
    fn attend(&mut self, layer: usize, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let (t, hq, d) = q.dims3()?;
        let (q, k, v) = (to_vec(q)?, to_vec(k)?, to_vec(v)?);
        let bs = self.cache.block_size;
        let row = self.cache.row();
        // 1. write the step's keys and values into their slots
        let mut tok = 0;
        for s in &self.seqs {
            for i in 0..s.num_new {
                let slot = s
                    .block_table
                    .slot(s.start_pos + i, bs)
                    .ok_or_else(|| candle_core::Error::Msg("slot not reserved".into()))?;
                let src = (tok + i) * row..(tok + i + 1) * row;
                let dst = slot * row..(slot + 1) * row;
                if let (Some(kc), Some(vc)) =
                    (self.cache.k.get_mut(layer), self.cache.v.get_mut(layer))
                {
                    if let (Some(kd), Some(ks)) = (kc.get_mut(dst.clone()), k.get(src.clone())) {
                        kd.copy_from_slice(ks);
                    }
                    if let (Some(vd), Some(vs)) = (vc.get_mut(dst), v.get(src)) {
                        vd.copy_from_slice(vs);
                    }
                }
            }
            tok += s.num_new;
        }
        if tok != t {
            return Err(candle_core::Error::Msg(format!(
                "step has {t} tokens but its sequences bring {tok}"
            )));
        }
        // 2. each new token attends over its sequence's cached keys, in parallel over tokens
        let (kc, vc) = match (self.cache.k.get(layer), self.cache.v.get(layer)) {
            (Some(k), Some(v)) => (k.as_slice(), v.as_slice()),
            _ => {
                return Err(candle_core::Error::Msg(format!(
                    "no layer {layer} in the cache"
                )))
            }
        };
        let mut jobs = Vec::with_capacity(t);
        for s in &self.seqs {
            for i in 0..s.num_new {
                jobs.push((s.block_table, s.start_pos + i));
            }
        }
        let hkv = self.cache.num_kv_heads;
        let geom = Geom { hq, hkv, d, bs };
        let mut out = vec![0f32; t * hq * d];
        out.par_chunks_mut(hq * d)
            .zip(jobs.par_iter())
            .enumerate()
            .for_each_init(Vec::new, |scores, (ti, (o, (table, pos)))| {
                let qrow = q.get(ti * hq * d..(ti + 1) * hq * d).unwrap_or(&[]);
                attend_token(qrow, kc, vc, table, *pos, &geom, scores, o);
            });
        Tensor::from_vec(out, (t, hq, d), &candle_core::Device::Cpu)
    }
}

struct Geom {
    hq: usize,
    hkv: usize,
    d: usize,
    bs: usize,
}

/// One token's attention over positions `0..=pos`, all heads, into `out` (Hq * D). `scores` is
/// a reused buffer (one per worker thread), so the decode loop allocates nothing here.
#[allow(clippy::too_many_arguments)]
fn attend_token(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    table: &BlockTable,
    pos: usize,
    g: &Geom,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let row = g.hkv * g.d;
    let scale = 1.0 / (g.d as f32).sqrt();
    let group = g.hq / g.hkv.max(1);
    scores.clear();
    scores.resize(pos + 1, 0.0);
    for h in 0..g.hq {
        let kvh = h / group.max(1);
        let qh = q.get(h * g.d..(h + 1) * g.d).unwrap_or(&[]);
        let mut max = f32::NEG_INFINITY;
        for (p, sc) in scores.iter_mut().enumerate() {
            let Some(slot) = table.slot(p, g.bs) else {
                continue;
            };
            let base = slot * row + kvh * g.d;
            let kk = kc.get(base..base + g.d).unwrap_or(&[]);
            *sc = qh.iter().zip(kk).map(|(a, b)| a * b).sum::<f32>() * scale;
            max = max.max(*sc);
        }
        let mut sum = 0f32;
        for sc in scores.iter_mut() {
            *sc = (*sc - max).exp();
            sum += *sc;
        }
        let oh = out.get_mut(h * g.d..(h + 1) * g.d).unwrap_or(&mut []);
        oh.fill(0.0);
        for (p, sc) in scores.iter().enumerate() {
            let Some(slot) = table.slot(p, g.bs) else {
                continue;
            };
            let base = slot * row + kvh * g.d;
            let vv = vc.get(base..base + g.d).unwrap_or(&[]);
            let w = sc / sum;
            for (o, x) in oh.iter_mut().zip(vv) {
                *o += w * x;
            }
        }
    }
}
