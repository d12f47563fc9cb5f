//! A sliding-window layer's cache: each sequence's keys and values of its last `window`
//! positions in a ring (position `p` in row `p % window`), kept in the sequence's state slot
//! (see `state_slots`) beside the recurrent layers' states, and the attention over it.
//!
//! ```text
//! a sequence's slot for the layer:  k ring [window][Hkv][D]  then  v ring [window][Hkv][D]
//! a step's token at position p (the step brings start..start+n) sees p+1-window..=p:
//!     positions before `start` from the ring (written by earlier steps, not yet overwritten),
//!     positions from `start` from the step's own keys and values
//! then the step's last min(n, window) positions are written into the ring
//! ```
//! A long generation holds `window` rows per sequence for the layer, not its length (vLLM frees
//! the blocks that fall out of a sliding layer's window; a ring per sequence needs no second
//! block table and shares the recurrent states' fork copy and preemption). Reading before
//! writing lets a prefill chunk longer than the window see its own earlier tokens. Each
//! (token, KV head) computes alone, its scores and sums in position order: a token's output
//! does not depend on the other sequences of the step or on how its prompt was chunked.
//! Knows nothing of blocks or scheduling.

use rayon::prelude::*;

use crate::simd::exp_sub_sum;

/// One sequence's share of a step: the position of its first new token and how many it brings.
#[derive(Debug, Clone, Copy)]
pub struct RingSeq {
    pub start: usize,
    pub num_new: usize,
}

/// The attention of a step's tokens over their sequences' windows, from the queries `q`
/// (T x Hq x D, sequences end to end) into `out`, then the step's keys `k` and values `v`
/// (T x Hkv x D) written into the `rings` (one per sequence, `2 * window * hkv * d` values).
#[allow(clippy::too_many_arguments)]
pub fn attend(
    rings: &mut [&mut [f32]],
    seqs: &[RingSeq],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (hq, hkv, d): (usize, usize, usize),
    window: usize,
    out: &mut [f32],
) -> Result<(), String> {
    let row = hkv * d;
    let t: usize = seqs.iter().map(|s| s.num_new).sum();
    let ring_len = 2 * window * row;
    if rings.len() != seqs.len()
        || rings.iter().any(|r| r.len() != ring_len)
        || window == 0
        || hkv == 0
        || !hq.is_multiple_of(hkv)
        || q.len() != t * hq * d
        || k.len() != t * row
        || v.len() != t * row
        || out.len() != t * hq * d
    {
        return Err(format!(
            "window attention: {t} tokens of {hq} query heads and {hkv} KV heads of {d} over \
             {} rings of {ring_len} values (window {window})",
            rings.len()
        ));
    }
    // each token's sequence, position and row in the step
    let mut tokens = Vec::with_capacity(t);
    let mut first = 0;
    for (s, seq) in seqs.iter().enumerate() {
        for i in 0..seq.num_new {
            tokens.push((s, seq.start + i, first));
        }
        first += seq.num_new;
    }
    let group = hq / hkv;
    let scale = 1.0 / (d as f32).sqrt();
    {
        let rings: Vec<&[f32]> = rings.iter().map(|r| &**r).collect();
        let job = |scores: &mut Vec<f32>, (c, o): (usize, &mut [f32])| {
            let (ti, kvh) = (c / hkv, c % hkv);
            let (s, pos, first) = tokens[ti];
            let start = seqs[s].start;
            let lo = (pos + 1).saturating_sub(window);
            // the key and value rows of position `p` for this KV head
            let (kr, vr) = rings[s].split_at(window * row);
            let key = |p: usize| -> &[f32] {
                let at = if p < start {
                    &kr[(p % window) * row..]
                } else {
                    &k[(first + p - start) * row..]
                };
                &at[kvh * d..kvh * d + d]
            };
            let value = |p: usize| -> &[f32] {
                let at = if p < start {
                    &vr[(p % window) * row..]
                } else {
                    &v[(first + p - start) * row..]
                };
                &at[kvh * d..kvh * d + d]
            };
            scores.clear();
            scores.resize(pos + 1 - lo, 0.0);
            for (h, o) in o.chunks_mut(d).enumerate() {
                let qh = &q[(ti * hq + kvh * group + h) * d..][..d];
                for (sc, p) in scores.iter_mut().zip(lo..=pos) {
                    let dot: f32 = qh.iter().zip(key(p)).map(|(a, b)| a * b).sum();
                    *sc = dot * scale;
                }
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let inv = 1.0 / exp_sub_sum(scores, max);
                o.fill(0.0);
                for (pr, p) in scores.iter().zip(lo..=pos) {
                    let w = pr * inv;
                    for (o, x) in o.iter_mut().zip(value(p)) {
                        *o += w * x;
                    }
                }
            }
        };
        out.par_chunks_mut(group * d)
            .enumerate()
            .with_min_len(16)
            .for_each_init(Vec::new, job);
    }
    // the step's last `window` positions into the rings
    let mut first = 0;
    for (ring, seq) in rings.iter_mut().zip(seqs) {
        let (kr, vr) = ring.split_at_mut(window * row);
        for i in seq.num_new.saturating_sub(window)..seq.num_new {
            let at = ((seq.start + i) % window) * row;
            let src = (first + i) * row;
            kr[at..at + row].copy_from_slice(&k[src..src + row]);
            vr[at..at + row].copy_from_slice(&v[src..src + row]);
        }
        first += seq.num_new;
    }
    Ok(())
}
