//! FlashAttention-2's tiling for training, written in Rust so that a CPU checks it before a GPU
//! runs it: the loop bounds, masks, online softmax and backward accumulation that the training
//! attention kernels (issue 51) follow tile for tile. One program per (sequence, query head,
//! query tile) in the forward; one per (sequence, KV head, key tile) in the backward, which
//! loops over the KV head's query heads so that dK and dV are summed without atomics (dQ is
//! what the kernel adds atomically, here a plain add).
//!
//! ```text
//! forward, query tile [q0, q0 + rows):  keys [key_begin, q0 + rows) in tiles of `keys`
//!   S = Q K^T * scale, masked (key > query, key before the window, beyond the sequence)
//!   m' = max(m, rowmax S); P = exp(S - m'); l = l e^(m - m') + rowsum P; O = O e^(m - m') + P V
//!   O /= l; lse = m + ln l
//! backward, key tile [k0, k0 + keys):  query tiles from the one holding k0 to the window's end
//!   P = exp(S - lse); dV += P^T dO; dP = dO V^T; dS = P (dP - D), D = rowsum(dO O)
//!   dK += dS^T Q * scale; dQ += dS K * scale
//! ```
//!
//! Layouts are the packed step's: q, o (T, Hq, D), k, v (T, Hkv, D), sequences end to end;
//! lse (Hq, T). f32 throughout (the kernel rounds P and dS to bf16 for its matrix
//! instructions, and keeps these f32 sums). Knows nothing of devices or candle.

/// Tile sizes: query rows per program (the forward) and keys per tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tiles {
    pub rows: usize,
    pub keys: usize,
}

/// What the kernels are built with: 64 x 64 (a 64 x 128 bf16 tile is 16 KiB of shared memory).
pub const KERNEL_TILES: Tiles = Tiles { rows: 64, keys: 64 };

/// The heads and the mask of one attention layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Heads {
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
    pub scale: f32,
    /// A query sees the `window` keys ending at its own (`None`: every earlier key).
    pub window: Option<usize>,
}

impl Heads {
    fn n_rep(&self) -> usize {
        self.hq / self.hkv
    }
}

/// Keys that query `i` sees (positions within its sequence): `[lo, i]`.
fn lowest_key(i: usize, window: Option<usize>) -> usize {
    window.map_or(0, |w| (i + 1).saturating_sub(w))
}

/// The keys a query tile `[q0, q0 + rows)` must visit: from the tile holding the first query's
/// lowest key to the last query.
pub fn key_span(q0: usize, rows: usize, keys: usize, window: Option<usize>) -> (usize, usize) {
    let lo = lowest_key(q0, window);
    (lo / keys * keys, q0 + rows)
}

/// The queries a key tile `[k0, k0 + n)` of a sequence of `len` tokens is seen by, as whole
/// query tiles: from the tile holding `k0` to the one holding the last query that still sees
/// the tile's last key.
pub fn query_span(
    k0: usize,
    n: usize,
    len: usize,
    t: Tiles,
    window: Option<usize>,
) -> (usize, usize) {
    let last = window.map_or(len, |w| (k0 + n - 1 + w).min(len));
    (k0 / t.rows * t.rows, last)
}

/// Whether query `i` sees key `j` (positions within a sequence of `len`).
fn sees(i: usize, j: usize, len: usize, window: Option<usize>) -> bool {
    j < len && j <= i && j >= lowest_key(i, window)
}

/// Sequence starts of a packed step.
fn starts(seq_lens: &[usize]) -> Vec<usize> {
    seq_lens
        .iter()
        .scan(0, |s, &l| {
            let at = *s;
            *s += l;
            Some(at)
        })
        .collect()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The forward: (o (T, Hq, D), lse (Hq, T)).
pub fn forward(
    t: Tiles,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    seq_lens: &[usize],
    h: Heads,
) -> (Vec<f32>, Vec<f32>) {
    let total: usize = seq_lens.iter().sum();
    let (d, hq, hkv) = (h.d, h.hq, h.hkv);
    let mut o = vec![0f32; total * hq * d];
    let mut lse = vec![0f32; hq * total];
    let (mut s, mut acc) = (vec![0f32; t.rows * t.keys], vec![0f32; t.rows * d]);
    for (&base, &len) in starts(seq_lens).iter().zip(seq_lens) {
        for head in 0..hq {
            let g = head / h.n_rep();
            let qrow = |i: usize| &q[((base + i) * hq + head) * d..][..d];
            let krow = |j: usize| &k[((base + j) * hkv + g) * d..][..d];
            let vrow = |j: usize| &v[((base + j) * hkv + g) * d..][..d];
            for q0 in (0..len).step_by(t.rows) {
                let rows = t.rows.min(len - q0);
                let (mut m, mut l) = (vec![f32::NEG_INFINITY; rows], vec![0f32; rows]);
                acc[..rows * d].fill(0.0);
                let (kb, ke) = key_span(q0, rows, t.keys, h.window);
                for k0 in (kb..ke).step_by(t.keys) {
                    let n = t.keys.min(len - k0);
                    for r in 0..rows {
                        let i = q0 + r;
                        let srow = &mut s[r * t.keys..][..n];
                        for (c, x) in srow.iter_mut().enumerate() {
                            *x = if sees(i, k0 + c, len, h.window) {
                                dot(qrow(i), krow(k0 + c)) * h.scale
                            } else {
                                f32::NEG_INFINITY
                            };
                        }
                        let mx = srow.iter().copied().fold(m[r], f32::max);
                        if mx == f32::NEG_INFINITY {
                            continue; // nothing seen yet: this tile adds nothing to the row
                        }
                        let shrink = (m[r] - mx).exp();
                        let a = &mut acc[r * d..][..d];
                        a.iter_mut().for_each(|x| *x *= shrink);
                        let mut sum = 0f32;
                        for (c, x) in srow.iter().enumerate() {
                            let p = (x - mx).exp();
                            sum += p;
                            if p != 0.0 {
                                a.iter_mut()
                                    .zip(vrow(k0 + c))
                                    .for_each(|(y, vv)| *y += p * vv);
                            }
                        }
                        l[r] = l[r] * shrink + sum;
                        m[r] = mx;
                    }
                }
                for r in 0..rows {
                    let i = base + q0 + r;
                    let out = &mut o[(i * hq + head) * d..][..d];
                    out.iter_mut()
                        .zip(&acc[r * d..][..d])
                        .for_each(|(y, x)| *y = x / l[r]);
                    lse[head * total + i] = m[r] + l[r].ln();
                }
            }
        }
    }
    (o, lse)
}

/// The inputs of the backward besides q, k, v: the forward's output and log-sum-exp, and the
/// output's gradient.
pub struct Saved<'a> {
    pub o: &'a [f32],
    pub lse: &'a [f32],
    pub d_o: &'a [f32],
}

/// The backward: (dq, dk, dv) in the inputs' layouts.
pub fn backward(
    t: Tiles,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    saved: Saved<'_>,
    seq_lens: &[usize],
    h: Heads,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let total: usize = seq_lens.iter().sum();
    let (d, hq, hkv) = (h.d, h.hq, h.hkv);
    let (mut dq, mut dk, mut dv) = (
        vec![0f32; q.len()],
        vec![0f32; k.len()],
        vec![0f32; v.len()],
    );
    // D = rowsum(dO * O), per (query head, token): the kernel's pre-pass
    let mut delta = vec![0f32; hq * total];
    for i in 0..total {
        for head in 0..hq {
            let at = (i * hq + head) * d;
            delta[head * total + i] = dot(&saved.d_o[at..at + d], &saved.o[at..at + d]);
        }
    }
    for (&base, &len) in starts(seq_lens).iter().zip(seq_lens) {
        for g in 0..hkv {
            for k0 in (0..len).step_by(t.keys) {
                let n = t.keys.min(len - k0);
                // this program's dK and dV tile, summed over the KV head's query heads
                let (mut dkt, mut dvt) = (vec![0f32; n * d], vec![0f32; n * d]);
                for head in g * h.n_rep()..(g + 1) * h.n_rep() {
                    let (qb, qe) = query_span(k0, n, len, t, h.window);
                    for q0 in (qb..qe).step_by(t.rows) {
                        for i in q0..(q0 + t.rows).min(len) {
                            let row = base + i;
                            let at = (row * hq + head) * d;
                            let (qi, doi) = (&q[at..at + d], &saved.d_o[at..at + d]);
                            let (lse, di) =
                                (saved.lse[head * total + row], delta[head * total + row]);
                            for c in 0..n {
                                let j = k0 + c;
                                if !sees(i, j, len, h.window) {
                                    continue;
                                }
                                let kat = ((base + j) * hkv + g) * d;
                                let (kj, vj) = (&k[kat..kat + d], &v[kat..kat + d]);
                                let p = (dot(qi, kj) * h.scale - lse).exp();
                                let ds = p * (dot(doi, vj) - di);
                                dvt[c * d..][..d]
                                    .iter_mut()
                                    .zip(doi)
                                    .for_each(|(y, x)| *y += p * x);
                                dkt[c * d..][..d]
                                    .iter_mut()
                                    .zip(qi)
                                    .for_each(|(y, x)| *y += ds * h.scale * x);
                                dq[at..at + d]
                                    .iter_mut()
                                    .zip(kj)
                                    .for_each(|(y, x)| *y += ds * h.scale * x);
                            }
                        }
                    }
                }
                for c in 0..n {
                    let kat = ((base + k0 + c) * hkv + g) * d;
                    dk[kat..kat + d].copy_from_slice(&dkt[c * d..][..d]);
                    dv[kat..kat + d].copy_from_slice(&dvt[c * d..][..d]);
                }
            }
        }
    }
    (dq, dk, dv)
}

#[cfg(test)]
mod tests {
    use num_traits::Float;

    use super::*;
    use crate::rng::SplitMix;

    /// Attention row by row, in `F`: the plain definition, and its gradients by the chain rule
    /// written out (dP = dO V^T, dS = P (dP - rowsum(P dP)), dQ = dS K s, dK = dS^T Q s,
    /// dV = P^T dO). Returns (o, lse, dq, dk, dv).
    #[allow(clippy::type_complexity)]
    fn naive<F: Float>(
        x: [&[f32]; 4],
        seq_lens: &[usize],
        h: Heads,
    ) -> (Vec<F>, Vec<F>, Vec<F>, Vec<F>, Vec<F>) {
        let [q, k, v, d_o] = x.map(|a| a.iter().map(|&y| F::from(y).unwrap()).collect::<Vec<F>>());
        let total: usize = seq_lens.iter().sum();
        let (d, hq, hkv) = (h.d, h.hq, h.hkv);
        let scale = F::from(h.scale).unwrap();
        let (mut o, mut lse) = (vec![F::zero(); q.len()], vec![F::zero(); hq * total]);
        let (mut dq, mut dk, mut dv) = (
            vec![F::zero(); q.len()],
            vec![F::zero(); k.len()],
            vec![F::zero(); v.len()],
        );
        let dotf = |a: &[F], b: &[F]| a.iter().zip(b).fold(F::zero(), |s, (x, y)| s + *x * *y);
        for (&base, &len) in starts(seq_lens).iter().zip(seq_lens) {
            for head in 0..hq {
                let g = head / (hq / hkv);
                for i in 0..len {
                    let at = ((base + i) * hq + head) * d;
                    let seen: Vec<usize> = (0..=i).filter(|&j| sees(i, j, len, h.window)).collect();
                    let kat = |j: usize| ((base + j) * hkv + g) * d;
                    let s: Vec<F> = seen
                        .iter()
                        .map(|&j| dotf(&q[at..at + d], &k[kat(j)..kat(j) + d]) * scale)
                        .collect();
                    let mx = s.iter().copied().fold(F::neg_infinity(), F::max);
                    let sum = s.iter().fold(F::zero(), |a, &x| a + (x - mx).exp());
                    lse[head * total + base + i] = mx + sum.ln();
                    let p: Vec<F> = s.iter().map(|&x| (x - mx).exp() / sum).collect();
                    let dp: Vec<F> = seen
                        .iter()
                        .map(|&j| dotf(&d_o[at..at + d], &v[kat(j)..kat(j) + d]))
                        .collect();
                    let pdp = p.iter().zip(&dp).fold(F::zero(), |a, (x, y)| a + *x * *y);
                    for (n, &j) in seen.iter().enumerate() {
                        let ds = p[n] * (dp[n] - pdp);
                        for c in 0..d {
                            o[at + c] = o[at + c] + p[n] * v[kat(j) + c];
                            dv[kat(j) + c] = dv[kat(j) + c] + p[n] * d_o[at + c];
                            dk[kat(j) + c] = dk[kat(j) + c] + ds * scale * q[at + c];
                            dq[at + c] = dq[at + c] + ds * scale * k[kat(j) + c];
                        }
                    }
                }
            }
        }
        (o, lse, dq, dk, dv)
    }

    /// (what, ours, the f64 definition, the f32 definition)
    type Compared<'a> = (&'a str, &'a [f32], &'a [f64], Vec<f32>);

    fn max_diff<F: Float>(a: &[f32], b: &[F]) -> f64 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (f64::from(*x) - y.to_f64().unwrap()).abs())
            .fold(0.0, f64::max)
    }

    fn to_f32<F: Float>(a: &[F]) -> Vec<f32> {
        a.iter().map(|x| x.to_f32().unwrap()).collect()
    }

    /// (query heads, KV heads, head_dim, sequence lengths, window, tiles)
    type Case<'a> = (usize, usize, usize, &'a [usize], Option<usize>, Tiles);

    /// The tiling equals the definition (f64) within 4x the f32 definition's own distance from
    /// it (and 1e-6, for outputs that f32 happens to hit almost exactly), forward and backward:
    /// GQA 1:1, 4:1 and 8:1, head_dim 64, 128 and 256, lengths that are not a multiple of a tile,
    /// one token, packed rows, sliding windows shorter and longer than a tile, and tiles of other
    /// shapes than the kernel's.
    #[test]
    fn the_tiling_equals_the_definition() {
        let cases: &[Case] = &[
            (4, 1, 64, &[130], None, KERNEL_TILES),
            (8, 1, 128, &[65, 1, 70], None, KERNEL_TILES),
            (4, 4, 64, &[200], Some(50), KERNEL_TILES),
            (4, 1, 256, &[67], None, KERNEL_TILES),
            (8, 2, 64, &[100, 33], Some(90), KERNEL_TILES),
            (2, 1, 64, &[77, 5], Some(3), Tiles { rows: 16, keys: 32 }),
            (2, 2, 64, &[96], None, Tiles { rows: 32, keys: 16 }),
        ];
        let mut rng = SplitMix(7);
        for &(hq, hkv, d, seq_lens, window, t) in cases {
            let total: usize = seq_lens.iter().sum();
            let mut draw = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.normal() as f32).collect() };
            let (q, k, v, d_o) = (
                draw(total * hq * d),
                draw(total * hkv * d),
                draw(total * hkv * d),
                draw(total * hq * d),
            );
            let h = Heads {
                hq,
                hkv,
                d,
                scale: 1.0 / (d as f32).sqrt(),
                window,
            };
            let (o, lse) = forward(t, &q, &k, &v, seq_lens, h);
            let saved = Saved {
                o: &o,
                lse: &lse,
                d_o: &d_o,
            };
            let (dq, dk, dv) = backward(t, &q, &k, &v, saved, seq_lens, h);
            let exact = naive::<f64>([&q, &k, &v, &d_o], seq_lens, h);
            let single = naive::<f32>([&q, &k, &v, &d_o], seq_lens, h);
            let what = format!("hq {hq} hkv {hkv} d {d} lens {seq_lens:?} window {window:?} {t:?}");
            let pairs: [Compared; 5] = [
                ("o", &o, &exact.0, to_f32(&single.0)),
                ("lse", &lse, &exact.1, to_f32(&single.1)),
                ("dq", &dq, &exact.2, to_f32(&single.2)),
                ("dk", &dk, &exact.3, to_f32(&single.3)),
                ("dv", &dv, &exact.4, to_f32(&single.4)),
            ];
            for (name, ours, reference, f32_reference) in pairs {
                let spread = max_diff(&f32_reference, reference);
                let err = max_diff(ours, reference);
                assert!(
                    err <= (4.0 * spread).max(1e-6),
                    "{what}: {name} off by {err:e}, the f32 definition by {spread:e}"
                );
            }
        }
    }

    /// A key tile is visited by exactly the query tiles that see one of its keys, and a query
    /// tile visits exactly the key tiles holding a key it sees.
    #[test]
    fn the_spans_cover_what_is_seen_and_no_more_tiles() {
        let t = Tiles { rows: 16, keys: 8 };
        for window in [None, Some(1), Some(5), Some(20)] {
            let len = 61;
            for q0 in (0..len).step_by(t.rows) {
                let rows = t.rows.min(len - q0);
                let (kb, ke) = key_span(q0, rows, t.keys, window);
                for k0 in (0..len).step_by(t.keys) {
                    let n = t.keys.min(len - k0);
                    let needed =
                        (q0..q0 + rows).any(|i| (k0..k0 + n).any(|j| sees(i, j, len, window)));
                    let visited = k0 >= kb && k0 < ke;
                    assert!(!needed || visited, "q0 {q0} k0 {k0} {window:?}");
                    let (qb, qe) = query_span(k0, n, len, t, window);
                    let from_keys = q0 + rows > qb && q0 < qe;
                    assert!(!needed || from_keys, "k0 {k0} q0 {q0} {window:?}");
                    // whole tiles past what is needed only at the span's ends
                    if visited && !needed {
                        assert!(k0 == kb || k0 + t.keys >= ke, "q0 {q0} k0 {k0} {window:?}");
                    }
                }
            }
        }
    }
}
