//! The paged KV cache on CPU and the attention backend that reads it: the reference
//! implementation the CUDA kernels are tested against.
//!
//! ```text
//! per layer:  k : [num_blocks][Hkv][D][block_size]   (f32; a block's keys transposed)
//!             v : [num_blocks][Hkv][block_size][D]   (f32; vLLM's head-major block layout)
//! slot s = block * block_size + offset
//! a step:     tokens of several sequences end to end; sequence s brings num_new tokens
//!             starting at position start_pos, and its block table maps positions to slots
//! ```
//! Keys are stored dimension-major within a block (vLLM's CPU cache does the same), so a
//! query's scores against a block's keys are `D` multiply-adds of one query value into a row of
//! `block_size` scores, with no horizontal sums: with head_dim 32, the dot product of a query
//! and one key is only four vectors long, and reducing each to a scalar cost more than the
//! products. Where the block size and head_dim are multiples of 8, the scores of up to 4 query
//! heads over up to 8 runs of 8 keys (from several blocks), and the value sums of up to 4 heads
//! over up to 8 vectors of dimensions, are 8 vectors of independent chains in registers, each
//! key or value row loaded once for all heads: one or two chains would wait on the multiply-add
//! latency. Blocks are prefetched a few ahead (a block is less work than a memory latency), and
//! the cache asks for huge pages (blocks are scattered over it).
//!
//! `PagedAttention::attend` (1) writes the step's keys and values into their slots (tokens in
//! parallel when their slots differ, each asking for its `D` key lines before writing them),
//! then (2) lets each new token attend over its sequence's keys at positions `0..=pos`, read
//! through the block table, one (token, KV head) pair per parallel job, each starting the next
//! job's keys and values on their way to L2. A sliding-window layer keeps no blocks: its step
//! goes to the sequences' rings in their state slots (`window_ring`). Knows nothing of scheduling or
//! sampling; the caller reserves the slots (see `block_pool`) and copies shared blocks before
//! they are written.

use candle_core::{DType, Result, Tensor};
use rayon::prelude::*;

use super::block_pool::{BlockId, BlockTable};
use super::state_slots::{step_slots, StateSlots, StepSlots};
use super::window_ring::{self, RingSeq};
use crate::model::attention::{AttentionBackend, AttnShape};
use crate::model::ModelConfig;
use crate::simd::{exp_sub_sum, SendPtr};

#[derive(Debug, Clone)]
pub struct KvCache {
    pub block_size: usize,
    pub num_blocks: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Each model layer's place in `k` and `v` (none for a layer that keeps no keys).
    slots: Vec<Option<usize>>,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvCache {
    pub fn new(cfg: &ModelConfig, block_size: usize, num_blocks: usize) -> KvCache {
        let per_layer = num_blocks * block_size * cfg.num_kv_heads * cfg.head_dim;
        let layer = || {
            let v = vec![0f32; per_layer];
            huge_pages(&v);
            v
        };
        KvCache {
            block_size,
            num_blocks,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            k: cfg.kv_layers().iter().map(|_| layer()).collect(),
            v: cfg.kv_layers().iter().map(|_| layer()).collect(),
            slots: cfg.kv_slots(),
        }
    }

    /// Sets every cached key and value of every layer to `f(i)`, `i` counting through the layers'
    /// keys, then their values (benchmarks fill the cache without running a prefill).
    pub fn fill_with(&mut self, f: impl Fn(usize) -> f32 + Sync) {
        let per_layer = self.k.first().map_or(0, Vec::len);
        for (l, layer) in self.k.iter_mut().chain(self.v.iter_mut()).enumerate() {
            layer
                .par_iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = f(l * per_layer + i));
        }
    }

    /// The layers whose keys and values the blocks hold.
    pub fn num_layers(&self) -> usize {
        self.k.len()
    }

    /// Bytes one token's keys and values take over all layers (f32).
    pub fn bytes_per_token(cfg: &ModelConfig) -> usize {
        cfg.kv_values_per_token() * std::mem::size_of::<f32>()
    }

    /// The keys and values of model layer `layer`.
    fn layer_mut(&mut self, layer: usize) -> Option<(&mut Vec<f32>, &mut Vec<f32>)> {
        let slot = (*self.slots.get(layer)?)?;
        Some((self.k.get_mut(slot)?, self.v.get_mut(slot)?))
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

/// Asks the kernel to back `v`'s whole 2 MiB pages with huge pages (Linux, where transparent
/// huge pages are on `madvise`): a decode step reads each sequence's keys and values as small
/// blocks scattered over the whole cache, and with 4 KiB pages most block reads also miss the
/// TLB. A hint: nothing changes where the kernel declines. Call before the pages are first
/// touched (`vec![0; n]` of this size maps fresh zero pages).
fn huge_pages(v: &[f32]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = v.as_ptr() as usize;
        let end = start + std::mem::size_of_val(v);
        let (a, b) = (start.next_multiple_of(HUGE), end / HUGE * HUGE);
        if b > a {
            // SAFETY: [a, b) lies inside `v`'s allocation; MADV_HUGEPAGE changes no contents.
            unsafe { libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = v;
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
    /// The step's tokens in order: (block table, position, cache slot if reserved), the same
    /// for every layer, so worked out once per step.
    tokens: Vec<(&'a BlockTable, usize, Option<usize>)>,
    /// The tokens' cache slots, each checked against the cache's size, or why they cannot be
    /// written (the same for every layer, so worked out once per step).
    slots: std::result::Result<Vec<usize>, String>,
    /// Whether the slots are all different (the parallel write's premise).
    distinct_slots: bool,
    /// Wall time spent in [`AttentionBackend::attend`], summed over layers.
    pub seconds: f64,
    /// Tokens each sequence brings to the step, in order.
    seq_lens: Vec<usize>,
    /// Each sequence's first position and token count, for the sliding-window layers.
    ring_seqs: Vec<RingSeq>,
    /// The recurrent layers' state slots and each sequence's slot, in order.
    states: StepSlots<'a>,
}

fn to_vec(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
}

impl AttentionBackend for PagedAttention<'_> {
    /// The sequences' states from their slots.
    fn recurrent_state(
        &mut self,
        layer: usize,
        values: usize,
    ) -> Result<crate::model::attention::RecurrentStep> {
        let (states, slots) = step_slots(&mut self.states, layer)?;
        states.step_state(
            layer,
            values,
            slots,
            &self.seq_lens,
            &candle_core::Device::Cpu,
        )
    }

    fn store_recurrent_state(&mut self, layer: usize, state: Tensor) -> Result<()> {
        let (states, slots) = step_slots(&mut self.states, layer)?;
        states.store_step_state(layer, slots, &state)
    }

    /// The slots themselves are on the host.
    fn lends_recurrent_host(&self) -> bool {
        true
    }

    /// The slots themselves, lent in place (no copies on the CPU's decode path).
    fn lend_recurrent_host(
        &mut self,
        layer: usize,
        values: usize,
    ) -> Result<crate::model::attention::HostStates<'_>> {
        let (states, slots) = step_slots(&mut self.states, layer)?;
        let Some(parts) = states.lend(layer, slots) else {
            candle_core::bail!("layer {layer}: no state slots, or a slot given twice")
        };
        if parts.iter().any(|p| p.len() != values) {
            candle_core::bail!("layer {layer}: state slots of another size than {values} values")
        }
        Ok(crate::model::attention::HostStates {
            seq_lens: self.seq_lens.clone(),
            states: parts,
        })
    }

    fn attend(
        &mut self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        window: Option<usize>,
    ) -> Result<Tensor> {
        let (t, hq, d) = q.dims3()?;
        let hkv = k.dim(1)?;
        let (q, k, v) = (to_vec(q)?, to_vec(k)?, to_vec(v)?);
        let mut out = vec![0f32; t * hq * d];
        self.attend_host(layer, &q, &k, &v, (t, hq, hkv, d), window, &mut out)?;
        Tensor::from_vec(out, (t, hq, d), &candle_core::Device::Cpu)
    }

    fn attend_host(
        &mut self,
        layer: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        shape: AttnShape,
        window: Option<usize>,
        out: &mut [f32],
    ) -> Result<()> {
        let t0 = std::time::Instant::now();
        let r = self.attend_inner(layer, q, k, v, shape, window, out);
        self.seconds += t0.elapsed().as_secs_f64();
        r
    }
}

impl<'a> PagedAttention<'a> {
    pub fn new(cache: &'a mut KvCache, seqs: Vec<SeqStep<'a>>) -> Self {
        let bs = cache.block_size;
        let tokens: Vec<_> = seqs
            .iter()
            .flat_map(|s| {
                (s.start_pos..s.start_pos + s.num_new)
                    .map(|p| (s.block_table, p, s.block_table.slot(p, bs)))
            })
            .collect();
        let slots: std::result::Result<Vec<usize>, String> = tokens
            .iter()
            .map(|t| match t.2 {
                None => Err("slot not reserved".to_string()),
                Some(s) if s / bs >= cache.num_blocks => {
                    Err(format!("slot {s} is outside the cache"))
                }
                Some(s) => Ok(s),
            })
            .collect();
        let distinct_slots = slots.as_ref().is_ok_and(|slots| {
            let mut sorted = slots.clone();
            sorted.sort_unstable();
            sorted.windows(2).all(|w| w[0] != w[1])
        });
        PagedAttention {
            cache,
            tokens,
            slots,
            distinct_slots,
            seconds: 0.0,
            seq_lens: seqs.iter().map(|s| s.num_new).collect(),
            ring_seqs: seqs
                .iter()
                .map(|s| RingSeq {
                    start: s.start_pos,
                    num_new: s.num_new,
                })
                .collect(),
            states: None,
        }
    }

    /// The step with the recurrent layers' `states`: sequence `i` of the step owns slot
    /// `slots[i]`.
    pub fn with_states(mut self, states: &'a mut StateSlots, slots: Vec<usize>) -> Self {
        self.states = Some((states, slots));
        self
    }

    #[allow(clippy::too_many_arguments)]
    fn attend_inner(
        &mut self,
        layer: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        (t, hq, hkv_in, d_in): AttnShape,
        window: Option<usize>,
        out: &mut [f32],
    ) -> Result<()> {
        let bs = self.cache.block_size;
        let row = self.cache.row();
        let (hkv, d) = (self.cache.num_kv_heads, self.cache.head_dim);
        if (hkv_in, d_in) != (hkv, d)
            || q.len() != t * hq * d
            || k.len() != t * row
            || v.len() != t * row
            || out.len() != t * hq * d
            || hkv == 0
            || hq % hkv != 0
        {
            return Err(candle_core::Error::Msg(format!(
                "paged attention: {t} tokens of {hq} query heads, {hkv_in} KV heads of {d_in} \
                 (q {}, k {}, v {}, out {}) against a cache of {hkv} KV heads of {d}",
                q.len(),
                k.len(),
                v.len(),
                out.len()
            )));
        }
        if self.tokens.len() != t {
            return Err(candle_core::Error::Msg(format!(
                "step has {t} tokens but its sequences bring {}",
                self.tokens.len()
            )));
        }
        if let Some(w) = window {
            // a sliding-window layer: its keys and values are in each sequence's ring
            return self.attend_window(layer, q, k, v, (hq, hkv, d), w, out);
        }
        let num_blocks = self.cache.num_blocks;
        let Some((kc, vc)) = self.cache.layer_mut(layer) else {
            return Err(candle_core::Error::Msg(format!(
                "layer {layer} keeps no keys in the cache"
            )));
        };
        let slots = match &self.slots {
            Ok(slots) if (num_blocks * bs * row) == kc.len() => slots,
            Ok(_) => {
                return Err(candle_core::Error::Msg(
                    "cache layer of another size".into(),
                ))
            }
            Err(e) => return Err(candle_core::Error::Msg(e.clone())),
        };
        // 1. write the step's keys and values into their slots
        write_kv(kc, vc, k, v, slots, self.distinct_slots, (bs, hkv, d));
        // 2. each new token attends over its sequence's cached keys
        let view = LayerView {
            kc,
            vc,
            hq,
            hkv,
            d,
            bs,
        };
        attend_tokens(&self.tokens, &view, q, out);
        Ok(())
    }
}

impl PagedAttention<'_> {
    /// A sliding-window layer's step over the rings in the sequences' state slots.
    #[allow(clippy::too_many_arguments)]
    fn attend_window(
        &mut self,
        layer: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        heads: (usize, usize, usize),
        window: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let (states, slots) = step_slots(&mut self.states, layer)?;
        let Some(mut rings) = states.lend(layer, slots) else {
            candle_core::bail!("layer {layer}: no window rings, or a slot given twice")
        };
        window_ring::attend(&mut rings, &self.ring_seqs, q, k, v, heads, window, out)
            .map_err(|e| candle_core::Error::Msg(format!("layer {layer}: {e}")))
    }
}

/// Writes the step's keys `k` (transposed within their block) and values `v` (tokens x KV heads
/// x `d`) into their `slots` of one layer's `kc`, `vc`; tokens in parallel when `distinct`.
fn write_kv(
    kc: &mut [f32],
    vc: &mut [f32],
    k: &[f32],
    v: &[f32],
    slots: &[usize],
    distinct: bool,
    (bs, hkv, d): (usize, usize, usize),
) {
    let (t, row) = (slots.len(), hkv * d);
    // every slot's block inside the layer (the writes below rely on it; a pass over the step's
    // slots, next to the t * row values written)
    assert!(
        kc.len() == vc.len() && slots.iter().all(|&s| (s / bs + 1) * bs * row <= kc.len()),
        "a slot outside the cache layer"
    );
    let (kp, vp) = (SendPtr(kc.as_mut_ptr()), SendPtr(vc.as_mut_ptr()));
    // A token's keys go to `d` lines of its block (one per dimension), most of them not in
    // any cache by now: their lines are asked for first, so that the misses overlap.
    let write = |ti: usize| {
        let slot = slots[ti];
        let (block, off) = (slot / bs, slot % bs);
        let src = ti * row;
        for h in 0..hkv {
            let head = (block * hkv + h) * bs * d;
            for j in 0..d {
                crate::simd::prefetch(kp.get().wrapping_add(head + j * bs + off));
            }
            for c in (0..d).step_by(16) {
                crate::simd::prefetch(vp.get().wrapping_add(head + off * d + c));
            }
        }
        for h in 0..hkv {
            let head = (block * hkv + h) * bs * d;
            for (j, x) in k[src + h * d..src + (h + 1) * d].iter().enumerate() {
                // SAFETY: inside the layer (asserted above); tokens run in parallel only when
                // their slots are distinct, and nothing reads the cache meanwhile.
                unsafe { *kp.get().add(head + j * bs + off) = *x };
            }
            // SAFETY: as above; the d values of the slot's row.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    v[src + h * d..].as_ptr(),
                    vp.get().add(head + off * d),
                    d,
                )
            };
        }
    };
    if distinct && t * row >= WRITE_PARALLEL_MIN {
        // tokens write disjoint elements: spread over the workers, twice the misses in flight
        // (runs of at least a block's tokens: a prefill's neighbours share key lines)
        (0..t)
            .into_par_iter()
            .with_min_len(bs.max(4))
            .for_each(write);
    } else {
        // (sequences that share blocks may recompute the same positions in one step: the
        // same values into the same slots, written in token order)
        (0..t).for_each(write);
    }
}

/// Each step token's attention over its sequence's cached keys and values in `view`, from the
/// queries `q` into `out` (tokens x query heads x `d`): one job per (token, KV head), whose query
/// heads are the contiguous run of `out` it writes.
fn attend_tokens(
    jobs: &[(&BlockTable, usize, Option<usize>)],
    view: &LayerView,
    q: &[f32],
    out: &mut [f32],
) {
    let (hq, hkv, d, bs) = (view.hq, view.hkv, view.d, view.bs);
    let group = hq / hkv;
    let work = |scratch: &mut AttnScratch, (c, o): (usize, &mut [f32])| {
        let (ti, kvh) = (c / hkv, c % hkv);
        let (table, pos, _) = jobs[ti];
        // the next job's first keys and values start on their way to L2 while this one
        // computes (a job is a few microseconds, most of it waiting on memory when they are
        // not); the job's own prefetch, a few blocks ahead, takes over from there
        if let Some(&(next, npos, _)) = jobs.get((c + 1) / hkv) {
            let nkvh = (c + 1) % hkv;
            let len = (npos + 1).min(next.blocks.len() * bs);
            let ahead = len.div_ceil(bs).min(NEXT_JOB_BLOCKS);
            for b in &next.blocks[..ahead] {
                let base = (b.0 as usize * hkv + nkvh) * bs * d;
                for l in (0..bs * d).step_by(16) {
                    crate::simd::prefetch_l2(view.kc.as_ptr().wrapping_add(base + l));
                    crate::simd::prefetch_l2(view.vc.as_ptr().wrapping_add(base + l));
                }
            }
        }
        let qg = &q[(ti * hq + kvh * group) * d..][..group * d];
        attend_group(view, qg, kvh, table, pos, scratch, o);
    };
    let flops: usize = jobs.iter().map(|(_, p, _)| (p + 1) * hq * d).sum();
    if flops < PARALLEL_MIN {
        let mut scratch = AttnScratch::default();
        out.chunks_mut(group * d)
            .enumerate()
            .for_each(|job| work(&mut scratch, job));
    } else {
        // runs of consecutive jobs, eight per thread: one scratch each, and a token's KV
        // heads (adjacent in a block) read one after another by one worker
        let jobs_n = out.len() / (group * d);
        let per = jobs_n.div_ceil(8 * rayon::current_num_threads()).max(1);
        out.par_chunks_mut(per * group * d)
            .enumerate()
            .for_each(|(r, run)| {
                let mut scratch = AttnScratch::default();
                for (j, o) in run.chunks_mut(group * d).enumerate() {
                    work(&mut scratch, (r * per + j, o));
                }
            });
    }
}

/// Blocks of the next job prefetched into L2 (more would push out what the job itself reads
/// at long contexts).
const NEXT_JOB_BLOCKS: usize = 8;

/// Keys and values (floats) a step writes below which one thread writes them.
const WRITE_PARALLEL_MIN: usize = 1 << 11;

/// Multiply-adds in a step's attention below which it runs on the calling thread.
const PARALLEL_MIN: usize = 1 << 15;

/// One layer's cached keys and values and the shapes to read them with.
struct LayerView<'a> {
    kc: &'a [f32],
    vc: &'a [f32],
    hq: usize,
    hkv: usize,
    d: usize,
    bs: usize,
}

/// Per-worker buffers of [`attend_group`], reused across jobs.
#[derive(Default)]
struct AttnScratch {
    /// The group's queries, scaled by 1 / sqrt(D): (group, D).
    q: Vec<f32>,
    /// Scores of the group: (group, pos + 1).
    scores: Vec<f32>,
    /// The job's runs of 8 keys (block sizes that are multiples of 8).
    units: Vec<Unit>,
}

crate::simd::avx2_fma_dispatch! {
    /// One token's attention over positions `0..=pos` for the query heads `q` (group x D) of
    /// KV head `kvh`, into `out`
    /// (group x D). Runs the AVX2+FMA build of [`attend_group_body`] where the CPU has it
    /// (checked once, cached by std).
    #[allow(clippy::too_many_arguments)]
    fn attend_group(
        g: &LayerView,
        q: &[f32],
        kvh: usize,
        table: &BlockTable,
        pos: usize,
        scratch: &mut AttnScratch,
        out: &mut [f32],
    ) => attend_group_body
}

/// The attention of one token's query heads that share KV head `kvh`. Each cached block is
/// read once for the whole group: its transposed keys give a row of scores per query value,
/// its values are added into every head's output weighted by that head's probabilities.
/// `scratch` belongs to the worker thread, so the decode loop allocates nothing here.
///
/// Every score is one multiply-add chain over the head's dimensions in order, every output
/// one chain over the positions in order: the same bits whichever job or thread runs it, and
/// whichever kernel below computes it.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_group_body(
    g: &LayerView,
    q: &[f32],
    kvh: usize,
    table: &BlockTable,
    pos: usize,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let (d, bs) = (g.d, g.bs);
    let group = g.hq / g.hkv;
    let scale = 1.0 / (d as f32).sqrt();
    // positions 0..n, and the blocks that hold them (a short table yields fewer positions)
    let n = (pos + 1).min(table.blocks.len() * bs);
    let blocks = &table.blocks[..n.div_ceil(bs)];
    let AttnScratch {
        q: qs,
        scores,
        units,
    } = scratch;
    qs.clear();
    qs.extend(q.iter().map(|x| x * scale));
    scores.clear();
    scores.resize(group * n, 0.0);
    let block_base = |bi: usize| (blocks[bi].0 as usize * g.hkv + kvh) * bs * d;
    // 1. scores
    if bs.is_multiple_of(8) {
        // runs of 8 keys ("units") from several blocks and several heads at once: at least
        // eight independent chains in registers, each key row loaded once for the heads
        units.clear();
        for bi in 0..blocks.len() {
            let len = bs.min(n - bi * bs);
            for c in (0..len).step_by(8) {
                units.push(Unit {
                    key: block_base(bi) + c,
                    dest: bi * bs + c,
                    count: 8.min(len - c),
                });
            }
        }
        let mut h = 0;
        while h < group {
            let heads = [4, 2, 1].into_iter().find(|&c| h + c <= group).unwrap_or(1);
            let (qh, sc) = (&qs[h * d..(h + heads) * d], &mut scores[h * n..]);
            match heads {
                4 => score_units::<4, 2>(qh, g.kc, units, bs, d, n, sc),
                2 => score_units::<2, 4>(qh, g.kc, units, bs, d, n, sc),
                _ => score_units::<1, 8>(qh, g.kc, units, bs, d, n, sc),
            }
            h += heads;
        }
    } else {
        let w = lanes(bs);
        for bi in 0..blocks.len() {
            let len = bs.min(n - bi * bs);
            let base = block_base(bi);
            let keys = &g.kc[base..base + bs * d];
            for j in 0..group {
                let sc = &mut scores[j * n + bi * bs..][..len];
                let qh = &qs[j * d..(j + 1) * d];
                match w {
                    4 => block_scores::<4>(qh, keys, bs, sc),
                    _ => block_scores::<1>(qh, keys, bs, sc),
                }
            }
        }
    }
    // 2. softmax per head
    for j in 0..group {
        let sc = &mut scores[j * n..(j + 1) * n];
        let max = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let inv = 1.0 / exp_sub_sum(sc, max);
        sc.iter_mut().for_each(|p| *p *= inv);
    }
    // 3. the weighted sum of the values
    if d.is_multiple_of(8) {
        // several heads and up to eight vectors of dimensions at once, each value row loaded
        // once for the heads
        let mut h = 0;
        while h < group {
            let heads = [4, 2, 1].into_iter().find(|&c| h + c <= group).unwrap_or(1);
            // vectors of 8 dimensions per pass: the most that divide d/8 and keep
            // heads x vectors <= 8 accumulators
            let vecs = [8, 4, 2, 1]
                .into_iter()
                .find(|&v| heads * v <= 8 && (d / 8).is_multiple_of(v))
                .unwrap_or(1);
            let v = ValueRun {
                vc: g.vc,
                blocks,
                hkv: g.hkv,
                kvh,
                bs,
                d,
                n,
            };
            let (pr, o) = (
                &scores[h * n..(h + heads) * n],
                &mut out[h * d..(h + heads) * d],
            );
            match (heads, vecs) {
                (4, 2) => value_units::<4, 2>(&v, pr, o),
                (4, _) => value_units::<4, 1>(&v, pr, o),
                (2, 4) => value_units::<2, 4>(&v, pr, o),
                (2, 2) => value_units::<2, 2>(&v, pr, o),
                (2, _) => value_units::<2, 1>(&v, pr, o),
                (_, 8) => value_units::<1, 8>(&v, pr, o),
                (_, 4) => value_units::<1, 4>(&v, pr, o),
                (_, 2) => value_units::<1, 2>(&v, pr, o),
                _ => value_units::<1, 1>(&v, pr, o),
            }
            h += heads;
        }
    } else {
        let w = lanes(d);
        for (j, o) in out.chunks_exact_mut(d).enumerate() {
            let probs = &scores[j * n..(j + 1) * n];
            let rows = |bi: usize| {
                let base = block_base(bi);
                &g.vc[base..base + bs.min(n - bi * bs) * d]
            };
            match w {
                4 => weighted_values::<4>(probs, bs, d, blocks.len(), rows, o),
                _ => weighted_values::<1>(probs, bs, d, blocks.len(), rows, o),
            }
        }
    }
}

/// Eight keys of one block for [`score_units`]: the first at `key` in the layer's key cache
/// (dimension `i` at `key + i * bs`), their scores at `dest..dest + count` of a head's row.
#[derive(Clone, Copy, Debug)]
struct Unit {
    key: usize,
    dest: usize,
    count: usize,
}

/// Scores of `G` query heads (`qs`: G rows of `d`, scaled) against every unit of 8 keys, `U`
/// units at a time: `G x U` vectors of 8 chains in registers (8 of the 16), each key row loaded
/// once for all heads. Head `h`'s scores go to `scores[h * n + dest..]`. The units of the next
/// pass are prefetched while this one computes.
#[inline(always)]
fn score_units<const G: usize, const U: usize>(
    qs: &[f32],
    kc: &[f32],
    units: &[Unit],
    bs: usize,
    d: usize,
    n: usize,
    scores: &mut [f32],
) {
    debug_assert!(qs.len() == G * d && scores.len() >= (G - 1) * n + n);
    // a unit reads kc[key + i * bs + l] for i < d, l < 8
    let span = (d - 1) * bs + 8;
    assert!(units.iter().all(|u| u.key + span <= kc.len()));
    assert!(qs.len() >= G * d);
    let kp = kc.as_ptr();
    let simd = has_simd();
    for u in units.iter().take(2 * U) {
        for i in (0..d).step_by((64 / (4 * bs)).max(1)) {
            crate::simd::prefetch(kp.wrapping_add(u.key + i * bs));
        }
    }
    for (ci, chunk) in units.chunks(U).enumerate() {
        // two passes ahead: one pass's work is about a memory latency
        if let Some(next) = units.get((ci + 2) * U..((ci + 3) * U).min(units.len())) {
            for u in next {
                for i in (0..d).step_by((64 / (4 * bs)).max(1)) {
                    crate::simd::prefetch(kp.wrapping_add(u.key + i * bs));
                }
            }
        }
        // a short last pass repeats its last unit (computed, not stored)
        let at: [usize; U] = std::array::from_fn(|u| chunk[u.min(chunk.len() - 1)].key);
        let mut acc = [[[0f32; 8]; U]; G];
        #[cfg(target_arch = "x86_64")]
        if simd {
            // SAFETY: AVX2 and FMA are there (checked once above); every unit's rows are inside
            // kc (asserted above) and qs holds G rows of d.
            unsafe { avx2::score_pass::<G, U>(qs, d, kp, &at, bs, &mut acc) };
        }
        if !simd {
            for i in 0..d {
                for u in 0..U {
                    // SAFETY: at[u] + i * bs + 8 <= at[u] + span <= kc.len() (asserted above).
                    let row = unsafe { &*(kp.add(at[u] + i * bs) as *const [f32; 8]) };
                    for (h, a) in acc.iter_mut().enumerate() {
                        let qv = qs[h * d + i];
                        for (a, k) in a[u].iter_mut().zip(row) {
                            *a = qv.mul_add(*k, *a);
                        }
                    }
                }
            }
        }
        for (h, a) in acc.iter().enumerate() {
            for (u, unit) in chunk.iter().enumerate() {
                scores[h * n + unit.dest..][..unit.count].copy_from_slice(&a[u][..unit.count]);
            }
        }
    }
}

/// The value rows of one job for [`value_units`]: KV head `kvh` of `blocks` in the layer's
/// value cache, `d` values a row; positions `0..n`.
struct ValueRun<'a> {
    vc: &'a [f32],
    blocks: &'a [BlockId],
    hkv: usize,
    kvh: usize,
    bs: usize,
    d: usize,
    n: usize,
}

impl ValueRun<'_> {
    /// Where block `bi`'s rows start.
    #[inline(always)]
    fn base(&self, bi: usize) -> usize {
        (self.blocks[bi].0 as usize * self.hkv + self.kvh) * self.bs * self.d
    }
}

/// `o[h] = sum_p probs[h][p] * value p` for `G` heads (`probs`: G rows of `n`, `o`: G rows of
/// `d`), `V` vectors of 8 dimensions per pass: `G x V` chains in registers, each value row
/// loaded once for all heads. Each output is one chain over the positions in order. The next
/// block's rows are prefetched while one is summed.
#[inline(always)]
fn value_units<const G: usize, const V: usize>(r: &ValueRun, probs: &[f32], o: &mut [f32]) {
    let (bs, d, n) = (r.bs, r.d, r.n);
    let vp = r.vc.as_ptr();
    assert!(probs.len() >= G * n && d.is_multiple_of(8 * V));
    let simd = has_simd();
    let ahead = (6144 / (4 * bs * d)).clamp(1, 4);
    for bi in 0..ahead.min(r.blocks.len()) {
        for l in (0..bs * d).step_by(16) {
            crate::simd::prefetch(vp.wrapping_add(r.base(bi) + l));
        }
    }
    for c in (0..d).step_by(8 * V) {
        let mut acc = [[[0f32; 8]; V]; G];
        for bi in 0..r.blocks.len() {
            let base = r.base(bi);
            let len = bs.min(n - bi * bs);
            assert!(base + len * d <= r.vc.len());
            // blocks about 6 KiB ahead: summing one is shorter than a memory latency
            if bi + ahead < r.blocks.len() {
                let next = r.base(bi + ahead);
                for l in (0..bs * d).step_by(16) {
                    crate::simd::prefetch(vp.wrapping_add(next + l));
                }
            }
            let rows = vp.wrapping_add(base + c);
            let pr = &probs[bi * bs..];
            #[cfg(target_arch = "x86_64")]
            if simd {
                // SAFETY: AVX2 and FMA are there (checked once above); rows p < len of the block
                // are inside vc (asserted above, c + 8 * V <= d), probs holds G rows of n.
                unsafe { avx2::value_pass::<G, V>(pr, n, rows, d, len, &mut acc) };
            }
            if !simd {
                for p in 0..len {
                    let w: [f32; G] = std::array::from_fn(|h| pr[h * n + p]);
                    for vi in 0..V {
                        // SAFETY: as above.
                        let row = unsafe { &*(rows.add(p * d + 8 * vi) as *const [f32; 8]) };
                        for (h, a) in acc.iter_mut().enumerate() {
                            for (a, x) in a[vi].iter_mut().zip(row) {
                                *a = w[h].mul_add(*x, *a);
                            }
                        }
                    }
                }
            }
        }
        for (h, a) in acc.iter().enumerate() {
            for (vi, v) in a.iter().enumerate() {
                o[h * d + c + 8 * vi..][..8].copy_from_slice(v);
            }
        }
    }
}

/// Whether the AVX2 passes below run (else the portable loops, the same operations in the same
/// order).
#[inline(always)]
fn has_simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::simd::has_avx2_fma();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// One pass of [`super::score_units`]: `acc[h][u][l] = sum_i qs[h * d + i] * key`, the key
    /// at `kp + at[u] + i * bs + l`, one fused multiply-add chain over `i` in order per score.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn score_pass<const G: usize, const U: usize>(
        qs: &[f32],
        d: usize,
        kp: *const f32,
        at: &[usize; U],
        bs: usize,
        acc: &mut [[[f32; 8]; U]; G],
    ) {
        let mut a = [[_mm256_setzero_ps(); U]; G];
        let qp = qs.as_ptr();
        for i in 0..d {
            // SAFETY: the caller's (qs holds G rows of d; each unit's d rows are inside the
            // cache).
            let q: [__m256; G] =
                std::array::from_fn(|h| unsafe { _mm256_broadcast_ss(&*qp.add(h * d + i)) });
            for u in 0..U {
                let k = unsafe { _mm256_loadu_ps(kp.add(at[u] + i * bs)) };
                for h in 0..G {
                    a[h][u] = _mm256_fmadd_ps(q[h], k, a[h][u]);
                }
            }
        }
        for (row, v) in acc.iter_mut().zip(&a) {
            for (out, v) in row.iter_mut().zip(v) {
                // SAFETY: `out` holds eight f32s.
                unsafe { _mm256_storeu_ps(out.as_mut_ptr(), *v) };
            }
        }
    }

    /// One block of [`super::value_units`]: `acc[h][v] += probs[h * n + p] * row p` for the
    /// block's `len` rows (row `p`'s 8-dimension vector `v` at `rows + p * d + 8 * v`), in order
    /// of `p`, continuing the chains in `acc`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn value_pass<const G: usize, const V: usize>(
        probs: &[f32],
        n: usize,
        rows: *const f32,
        d: usize,
        len: usize,
        acc: &mut [[[f32; 8]; V]; G],
    ) {
        // SAFETY (loads and stores here): the caller's.
        let mut a: [[__m256; V]; G] = std::array::from_fn(|h| {
            std::array::from_fn(|v| unsafe { _mm256_loadu_ps(acc[h][v].as_ptr()) })
        });
        let pp = probs.as_ptr();
        for p in 0..len {
            let w: [__m256; G] =
                std::array::from_fn(|h| unsafe { _mm256_broadcast_ss(&*pp.add(h * n + p)) });
            let x: [__m256; V] =
                std::array::from_fn(|v| unsafe { _mm256_loadu_ps(rows.add(p * d + 8 * v)) });
            for (ah, wh) in a.iter_mut().zip(&w) {
                for (av, xv) in ah.iter_mut().zip(&x) {
                    *av = _mm256_fmadd_ps(*wh, *xv, *av);
                }
            }
        }
        for (row, v) in acc.iter_mut().zip(&a) {
            for (out, v) in row.iter_mut().zip(v) {
                unsafe { _mm256_storeu_ps(out.as_mut_ptr(), *v) };
            }
        }
    }
}

/// The widest of 32, 16, 8, 4 (or 1) that divides `n`: the accumulators a kernel below keeps
/// in registers (four 8-lane chains at 32, which hides the multiply-add latency).
fn lanes(n: usize) -> usize {
    [32, 16, 8, 4]
        .into_iter()
        .find(|w| n.is_multiple_of(*w))
        .unwrap_or(1)
}

/// `sc[c] = qh · key c` for the first `sc.len()` keys of a block stored transposed (`keys`: D
/// rows of `bs`), `W` keys at a time in registers (`W` divides `bs`; the lanes past the block's
/// last written key are computed from stale values and dropped). Each score is one chain of
/// multiply-adds over the dimensions in order.
#[inline(always)]
fn block_scores<const W: usize>(qh: &[f32], keys: &[f32], bs: usize, sc: &mut [f32]) {
    for c in (0..sc.len()).step_by(W) {
        let mut acc = [0f32; W];
        for (i, qv) in qh.iter().enumerate() {
            let row: &[f32; W] = keys[i * bs + c..i * bs + c + W].try_into().unwrap();
            for (a, k) in acc.iter_mut().zip(row) {
                *a = qv.mul_add(*k, *a);
            }
        }
        let m = W.min(sc.len() - c);
        sc[c..c + m].copy_from_slice(&acc[..m]);
    }
}

/// `o = sum_p probs[p] * value p` over the `blocks` blocks whose value rows `rows(bi)` gives,
/// `W` output dimensions at a time in registers (`W` divides D). Each output is one chain of
/// multiply-adds over the positions in order.
#[inline(always)]
fn weighted_values<'v, const W: usize>(
    probs: &[f32],
    bs: usize,
    d: usize,
    blocks: usize,
    rows: impl Fn(usize) -> &'v [f32],
    o: &mut [f32],
) {
    for c in (0..d).step_by(W) {
        let mut acc = [0f32; W];
        for bi in 0..blocks {
            let values = rows(bi);
            for (vv, p) in values.chunks_exact(d).zip(&probs[bi * bs..]) {
                let v: &[f32; W] = vv[c..c + W].try_into().unwrap();
                for (a, x) in acc.iter_mut().zip(v) {
                    *a = p.mul_add(*x, *a);
                }
            }
        }
        o[c..c + W].copy_from_slice(&acc);
    }
}
