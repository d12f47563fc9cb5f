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

use crate::simd::{dot_portable, exp_sub_sum};

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
    {
        let rings: Vec<&[f32]> = rings.iter().map(|r| &**r).collect();
        let job = |scores: &mut Vec<f32>, (c, o): (usize, &mut [f32])| {
            let (ti, kvh) = (c / hkv, c % hkv);
            let (s, pos, first) = tokens[ti];
            let (kr, vr) = rings[s].split_at(window * row);
            let qg = &q[(ti * hq + kvh * group) * d..][..group * d];
            let at = Token {
                start: seqs[s].start,
                first,
                pos,
                kvh,
            };
            attend_token(qg, (kr, vr), (k, v), at, (window, hkv, d), scores, o);
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

/// Where one job's token is: its sequence's first new position, its own row in the step and
/// position, and the KV head whose query heads the job computes.
#[derive(Clone, Copy)]
struct Token {
    start: usize,
    first: usize,
    pos: usize,
    kvh: usize,
}

crate::simd::avx2_fma_dispatch! {
    /// One token's query heads `qg` (group x D) of one KV head over positions
    /// `pos + 1 - window ..= pos`: those before the step from the ring (`kr`, `vr`), the
    /// step's own from `k`, `v`; into `out` (group x D). The AVX2+FMA build where the CPU has
    /// it; the same bits either way (the dot products' lanes and the sums run in one order).
    fn attend_token(
        qg: &[f32],
        ring: (&[f32], &[f32]),
        step: (&[f32], &[f32]),
        at: Token,
        shape: (usize, usize, usize),
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) => attend_token_body
}

#[inline(always)]
fn attend_token_body(
    qg: &[f32],
    (kr, vr): (&[f32], &[f32]),
    (k, v): (&[f32], &[f32]),
    at: Token,
    (window, hkv, d): (usize, usize, usize),
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let row = hkv * d;
    let lo = (at.pos + 1).saturating_sub(window);
    // the row of position `p` (this KV head's `d` values) in the ring or in the step
    let at_row = |p: usize| -> std::ops::Range<usize> {
        let base = if p < at.start {
            (p % window) * row
        } else {
            (at.first + p - at.start) * row
        };
        base + at.kvh * d..base + at.kvh * d + d
    };
    let scale = 1.0 / (d as f32).sqrt();
    scores.clear();
    scores.resize(at.pos + 1 - lo, 0.0);
    for (qh, o) in qg.chunks(d).zip(out.chunks_mut(d)) {
        for (sc, p) in scores.iter_mut().zip(lo..=at.pos) {
            let r = at_row(p);
            let key = if p < at.start { &kr[r] } else { &k[r] };
            *sc = dot_portable(qh, key) * scale;
        }
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let inv = 1.0 / exp_sub_sum(scores, max);
        o.fill(0.0);
        for (pr, p) in scores.iter().zip(lo..=at.pos) {
            let r = at_row(p);
            let value = if p < at.start { &vr[r] } else { &v[r] };
            let w = pr * inv;
            for (o, x) in o.iter_mut().zip(value) {
                *o = w.mul_add(*x, *o);
            }
        }
    }
}
