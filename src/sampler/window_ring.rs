//! A sliding-window layer's cache: each sequence's keys and values of its last `window`
//! positions in a ring (position `p` in row `p % window`), kept in the sequence's state slot
//! (see `state_slots`) beside the recurrent layers' states, and the attention over it. Keys are
//! stored dimension-major (as in a KV block, see `kv_cache`): a query's scores over the ring are
//! runs of multiply-adds along positions, with no horizontal sums.
//!
//! ```text
//! a sequence's slot for the layer:  k ring [Hkv][D][window]  then  v ring [window][Hkv][D]
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
    // the step's keys dimension-major, [Hkv][D][T], read like the rings' keys
    let mut kt = vec![0f32; t * row];
    for (ti, key) in k.chunks(row).enumerate() {
        for (c, &x) in key.iter().enumerate() {
            kt[c * t + ti] = x;
        }
    }
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
                tokens: t,
            };
            attend_token(qg, (kr, vr), (&kt, v), at, (window, hkv, d), scores, o);
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
            let r = (seq.start + i) % window;
            let src = (first + i) * row;
            // keys dimension-major: value c of the row at (c, r)
            for (c, x) in k[src..src + row].iter().enumerate() {
                kr[c * window + r] = *x;
            }
            vr[r * row..(r + 1) * row].copy_from_slice(&v[src..src + row]);
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
    /// Tokens in the step.
    tokens: usize,
}

crate::simd::avx2_fma_dispatch! {
    /// One token's query heads `qg` (group x D) of one KV head over positions
    /// `pos + 1 - window ..= pos`: those before the step from the ring (`kr`, `vr`), the
    /// step's own from `kt` (its keys dimension-major) and `v`; into `out` (group x D). The AVX2+FMA build where the CPU has
    /// it; the same bits either way (every score and sum is one chain in one order, whether its
    /// key is in the ring or in the step, so a prompt's chunking does not change them).
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
    (kt, v): (&[f32], &[f32]),
    at: Token,
    (window, hkv, d): (usize, usize, usize),
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let row = hkv * d;
    let lo = (at.pos + 1).saturating_sub(window);
    let n = at.pos + 1 - lo;
    // positions lo..mid are in the ring, mid..=pos in the step; the ring's are at most two
    // runs of its rows (before and after the wrap)
    let mid = at.start.clamp(lo, at.pos + 1);
    let r0 = lo % window;
    let first_run = (mid - lo).min(window - r0);
    let runs = [(0, r0, first_run), (first_run, 0, mid - lo - first_run)];
    let scale = 1.0 / (d as f32).sqrt();
    scores.clear();
    scores.resize(n, 0.0);
    for (qh, o) in qg.chunks(d).zip(out.chunks_mut(d)) {
        // each score one multiply-add chain over the dimensions in order, from the ring (its
        // keys dimension-major: a run of positions per dimension) or from the step alike
        // (the step's keys too: `kt` is them dimension-major, [Hkv][D][T])
        scores.fill(0.0);
        let in_step = at.first + mid - at.start;
        for (j, &qj) in qh.iter().enumerate() {
            let keys = &kr[(at.kvh * d + j) * window..][..window];
            let step = &kt[(at.kvh * d + j) * at.tokens + in_step..];
            for &(at_score, at_ring, len) in &runs {
                let sc = &mut scores[at_score..at_score + len];
                for (s, &x) in sc.iter_mut().zip(&keys[at_ring..at_ring + len]) {
                    *s = qj.mul_add(x, *s);
                }
            }
            for (s, &x) in scores[mid - lo..].iter_mut().zip(step) {
                *s = qj.mul_add(x, *s);
            }
        }
        for sc in scores.iter_mut() {
            *sc *= scale;
        }
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let inv = 1.0 / exp_sub_sum(scores, max);
        o.fill(0.0);
        for (pr, p) in scores.iter().zip(lo..=at.pos) {
            let base = if p < at.start {
                (p % window) * row
            } else {
                (at.first + p - at.start) * row
            };
            let src = if p < at.start { vr } else { v };
            let value = &src[base + at.kvh * d..][..d];
            let w = pr * inv;
            for (o, x) in o.iter_mut().zip(value) {
                *o = w.mul_add(*x, *o);
            }
        }
    }
}
