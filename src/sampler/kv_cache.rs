//! The paged KV cache on CPU and the attention backend that reads it: the reference
//! implementation the CUDA kernels are tested against.
//!
//! ```text
//! per layer:  k, v : [num_blocks][Hkv][block_size][D]   (f32; vLLM's head-major block layout)
//! slot s = block * block_size + offset: head h's row at ((block * Hkv + h) * block_size + offset) * D
//! a step:     tokens of several sequences end to end; sequence s brings num_new tokens
//!             starting at position start_pos, and its block table maps positions to slots
//! ```
//! `PagedAttention::attend` (1) writes the step's keys and values into their slots, then
//! (2) lets each new token attend over its sequence's keys at positions `0..=pos`, read through
//! the block table, one block's run of rows per KV head at a time (each is contiguous). Knows nothing of scheduling or sampling; the caller reserves the slots
//! (see `block_pool`) and copies shared blocks before they are written.

use candle_core::{DType, Result, Tensor};
use rayon::prelude::*;

use super::block_pool::{BlockId, BlockTable};
use crate::model::attention::AttentionBackend;
use crate::model::ModelConfig;
use crate::simd::{dot_portable as dot, exp_sub_sum};

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
    /// Wall time spent in [`AttentionBackend::attend`], summed over layers.
    pub seconds: f64,
}

fn to_vec(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
}

impl AttentionBackend for PagedAttention<'_> {
    fn attend(&mut self, layer: usize, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let t0 = std::time::Instant::now();
        let out = self.attend_inner(layer, q, k, v);
        self.seconds += t0.elapsed().as_secs_f64();
        out
    }
}

impl<'a> PagedAttention<'a> {
    pub fn new(cache: &'a mut KvCache, seqs: Vec<SeqStep<'a>>) -> Self {
        PagedAttention {
            cache,
            seqs,
            seconds: 0.0,
        }
    }

    fn attend_inner(&mut self, layer: usize, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let (t, hq, _) = q.dims3()?;
        let (q, k, v) = (to_vec(q)?, to_vec(k)?, to_vec(v)?);
        let bs = self.cache.block_size;
        let row = self.cache.row();
        // 1. write the step's keys and values into their slots
        let (hkv, d) = (self.cache.num_kv_heads, self.cache.head_dim);
        let mut tok = 0;
        for s in &self.seqs {
            for i in 0..s.num_new {
                let slot = s
                    .block_table
                    .slot(s.start_pos + i, bs)
                    .ok_or_else(|| candle_core::Error::Msg("slot not reserved".into()))?;
                let (block, off) = (slot / bs, slot % bs);
                let (kc, vc) = match (self.cache.k.get_mut(layer), self.cache.v.get_mut(layer)) {
                    (Some(k), Some(v)) => (k, v),
                    _ => break,
                };
                for h in 0..hkv {
                    let src = (tok + i) * row + h * d;
                    let dst = ((block * hkv + h) * bs + off) * d;
                    if let (Some(kd), Some(ks)) = (kc.get_mut(dst..dst + d), k.get(src..src + d)) {
                        kd.copy_from_slice(ks);
                    }
                    if let (Some(vd), Some(vs)) = (vc.get_mut(dst..dst + d), v.get(src..src + d)) {
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
        let view = LayerView {
            kc,
            vc,
            hq,
            hkv,
            d,
            bs,
        };
        let mut out = vec![0f32; t * hq * d];
        out.par_chunks_mut(hq * d)
            .zip(jobs.par_iter())
            .enumerate()
            .for_each_init(AttnScratch::default, |scratch, (ti, (o, (table, pos)))| {
                let qrow = q.get(ti * hq * d..(ti + 1) * hq * d).unwrap_or(&[]);
                attend_token(&view, qrow, table, *pos, scratch, o);
            });
        Tensor::from_vec(out, (t, hq, d), &candle_core::Device::Cpu)
    }
}

/// One layer's cached keys and values and the shapes to read them with.
struct LayerView<'a> {
    kc: &'a [f32],
    vc: &'a [f32],
    hq: usize,
    hkv: usize,
    d: usize,
    bs: usize,
}

/// Per-worker buffers of [`attend_token`], reused across tokens and steps.
#[derive(Default)]
struct AttnScratch {
    /// Scores of one query group: (group, pos + 1).
    scores: Vec<f32>,
    /// 1 / softmax denominator of each head of the group.
    inv_sums: Vec<f32>,
}

/// `out += w * x`.
#[inline(always)]
fn axpy(out: &mut [f32], w: f32, x: &[f32]) {
    for (o, v) in out.iter_mut().zip(x) {
        *o = w.mul_add(*v, *o);
    }
}

/// One token's attention over positions `0..=pos`, all heads, into `out` (Hq * D). Runs the
/// AVX2+FMA build of [`attend_token_body`] where the CPU has it (checked once, cached by std).
fn attend_token(
    g: &LayerView,
    q: &[f32],
    table: &BlockTable,
    pos: usize,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2_fma() {
        // SAFETY: the CPU supports the features the function is compiled for (checked above).
        unsafe { attend_token_avx2(g, q, table, pos, scratch, out) };
        return;
    }
    attend_token_body(g, q, table, pos, scratch, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_token_avx2(
    g: &LayerView,
    q: &[f32],
    table: &BlockTable,
    pos: usize,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    attend_token_body(g, q, table, pos, scratch, out);
}

/// The attention of one token. The query heads that share a KV head are done together, and
/// that head's keys (then values) are read block by block, each block's rows contiguous, so
/// every cached row is read once per token. `scratch` belongs to the worker thread, so the
/// decode loop allocates nothing here.
#[inline(always)]
fn attend_token_body(
    g: &LayerView,
    q: &[f32],
    table: &BlockTable,
    pos: usize,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let (d, bs) = (g.d, g.bs);
    let scale = 1.0 / (d as f32).sqrt();
    let group = (g.hq / g.hkv.max(1)).max(1);
    // positions 0..n, and the blocks that hold them (a short table yields fewer positions)
    let n = (pos + 1).min(table.blocks.len() * bs);
    let blocks = &table.blocks[..n.div_ceil(bs)];
    let AttnScratch { scores, inv_sums } = scratch;
    scores.clear();
    scores.resize(group * n, 0.0);
    out.fill(0.0);
    for kvh in 0..g.hkv {
        let heads = kvh * group..(kvh + 1) * group;
        // 1. scores of every head of the group against each cached key
        for (bi, b) in blocks.iter().enumerate() {
            let len = bs.min(n - bi * bs);
            let base = (b.0 as usize * g.hkv + kvh) * bs * d;
            let keys = &g.kc[base..base + len * d];
            for (off, kk) in keys.chunks_exact(d).enumerate() {
                let p = bi * bs + off;
                for (j, h) in heads.clone().enumerate() {
                    scores[j * n + p] = dot(&q[h * d..(h + 1) * d], kk) * scale;
                }
            }
        }
        // 2. softmax per head (normalised at the end)
        inv_sums.clear();
        inv_sums.resize(group, 1.0);
        for (j, inv) in inv_sums.iter_mut().enumerate() {
            let sc = &mut scores[j * n..(j + 1) * n];
            let max = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let total = exp_sub_sum(sc, max);
            *inv = 1.0 / total;
        }
        // 3. weighted sum of the values
        for (bi, b) in blocks.iter().enumerate() {
            let len = bs.min(n - bi * bs);
            let base = (b.0 as usize * g.hkv + kvh) * bs * d;
            let values = &g.vc[base..base + len * d];
            for (off, vv) in values.chunks_exact(d).enumerate() {
                let p = bi * bs + off;
                for (j, h) in heads.clone().enumerate() {
                    axpy(&mut out[h * d..(h + 1) * d], scores[j * n + p], vv);
                }
            }
        }
        for (j, h) in heads.enumerate() {
            let inv = inv_sums[j];
            out[h * d..(h + 1) * d].iter_mut().for_each(|o| *o *= inv);
        }
    }
}
