//! Small numeric kernels for the CPU hot loops of sampling (the matmul of a decode step at
//! batch 1..=4, attention dot products and softmax, log-sum-exp over a vocab row): AVX2+FMA
//! intrinsics where the CPU has them (detected once by std), portable code elsewhere.
//!
//! Knows nothing of models or caches. Accuracy is stated per function and tested below.

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LO: f32 = -87.3;
const HI: f32 = 88.7;
/// ln 2 split in two for an exact `n * ln 2`.
const C1: f32 = 0.693_359_4;
const C2: f32 = -2.121_944_4e-4;
/// Cephes' minimax polynomial for `(exp(r) - 1 - r) / r^2` on [-ln2/2, ln2/2], highest first.
const P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// `exp(x)` in f32, within 2 ulp of libm over [-87, 88] (Cephes' range reduction and degree-6
/// polynomial); 0 below -87.3 (`-inf` included), `+inf` above 88.7; NaN gives a value below
/// 1e-37 (it counts as `-inf`, as the sampler treats NaN logits). The same operations as the
/// AVX2 version, so both give the same bits.
#[inline(always)]
pub fn fast_exp(x: f32) -> f32 {
    let xc = if x.is_nan() { LO } else { x.clamp(LO, HI) };
    let n = (xc * LOG2E).round_ties_even();
    let r = (-n).mul_add(C2, (-n).mul_add(C1, xc));
    let mut p = P[0];
    for c in &P[1..] {
        p = p.mul_add(r, *c);
    }
    let e = p.mul_add(r * r, r) + 1.0;
    let y = e * f32::from_bits(((n as i32 + 127) as u32) << 23);
    if x < LO {
        0.0
    } else if x > HI {
        f32::INFINITY
    } else {
        y
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{C1, C2, HI, LO, LOG2E, P};

    /// Eight [`super::fast_exp`]s.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub fn exp8(x: __m256) -> __m256 {
        let (lo, hi) = (_mm256_set1_ps(LO), _mm256_set1_ps(HI));
        // max_ps returns its second operand when the first is NaN: NaN -> LO
        let xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(xc, _mm256_set1_ps(LOG2E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(C1), xc);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(C2), r);
        let mut p = _mm256_set1_ps(P[0]);
        for c in &P[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
        }
        let e = _mm256_add_ps(
            _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
            _mm256_set1_ps(1.0),
        );
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        let y = _mm256_mul_ps(e, _mm256_castsi256_ps(bits));
        let y = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(x, lo), y);
        _mm256_blendv_ps(
            y,
            _mm256_set1_ps(f32::INFINITY),
            _mm256_cmp_ps::<_CMP_GT_OQ>(x, hi),
        )
    }

    fn hsum(v: __m256) -> f32 {
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` holds eight f32s.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
        lanes.iter().sum()
    }

    #[target_feature(enable = "avx2,fma")]
    pub fn max_sum_exp(row: &[f32]) -> (f32, f64) {
        let mut maxv = _mm256_set1_ps(f32::NEG_INFINITY);
        let lanes = row.chunks_exact(8);
        let mut max = lanes
            .remainder()
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        for c in lanes {
            // SAFETY: `c` holds eight f32s.
            let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
            maxv = _mm256_max_ps(v, maxv); // a NaN in v keeps maxv
        }
        let mut lane_max = [0f32; 8];
        // SAFETY: `lane_max` holds eight f32s.
        unsafe { _mm256_storeu_ps(lane_max.as_mut_ptr(), maxv) };
        max = lane_max.iter().copied().fold(max, f32::max);
        if max == f32::NEG_INFINITY || max.is_nan() {
            return (max, 0.0);
        }
        let m = _mm256_set1_ps(max);
        let mut total = 0f64;
        for chunk in row.chunks(1024) {
            let mut acc = _mm256_setzero_ps();
            let lanes = chunk.chunks_exact(8);
            let tail: f32 = lanes
                .remainder()
                .iter()
                .map(|&x| super::fast_exp(x - max))
                .sum();
            for c in lanes {
                // SAFETY: `c` holds eight f32s.
                let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
                acc = _mm256_add_ps(acc, exp8(_mm256_sub_ps(v, m)));
            }
            total += f64::from(hsum(acc) + tail);
        }
        (max, total)
    }

    fn lanes(v: __m256) -> [f32; 8] {
        let mut l = [0f32; 8];
        // SAFETY: `l` holds eight f32s.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), v) };
        l
    }

    /// See [`super::dot_tile`]: the same operations as [`super::dot_portable`] per element.
    #[target_feature(enable = "avx2,fma")]
    pub fn dot_tile(
        x: &[f32],
        w: &[f32],
        k: usize,
        mr: usize,
        nr: usize,
        tile: &mut [[f32; super::NR]; super::MR],
    ) {
        macro_rules! dispatch {
            ($(($a:literal, $b:literal)),*) => {
                match (mr, nr) {
                    $(($a, $b) => tile_n::<$a, $b>(x, w, k, tile),)*
                    _ => unreachable!("tile {mr}x{nr}"),
                }
            };
        }
        dispatch!(
            (4, 3),
            (4, 2),
            (4, 1),
            (3, 3),
            (3, 2),
            (3, 1),
            (2, 6),
            (2, 5),
            (2, 4),
            (2, 3),
            (2, 2),
            (2, 1),
            (1, 6),
            (1, 5),
            (1, 4),
            (1, 3),
            (1, 2),
            (1, 1)
        )
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn tile_n<const A: usize, const B: usize>(
        x: &[f32],
        w: &[f32],
        k: usize,
        tile: &mut [[f32; super::NR]; super::MR],
    ) {
        assert!(x.len() >= A * k && w.len() >= B * k);
        let k8 = k / 8 * 8;
        let mut acc = [[_mm256_setzero_ps(); B]; A];
        let mut p = 0;
        while p < k8 {
            let mut wv = [_mm256_setzero_ps(); B];
            for (b, v) in wv.iter_mut().enumerate() {
                // SAFETY: b * k + p + 8 <= B * k <= w.len() (asserted above).
                *v = unsafe { _mm256_loadu_ps(w.as_ptr().add(b * k + p)) };
            }
            for (a, row) in acc.iter_mut().enumerate() {
                // SAFETY: a * k + p + 8 <= A * k <= x.len().
                let xv = unsafe { _mm256_loadu_ps(x.as_ptr().add(a * k + p)) };
                for (b, c) in row.iter_mut().enumerate() {
                    *c = _mm256_fmadd_ps(xv, wv[b], *c);
                }
            }
            p += 8;
        }
        for a in 0..A {
            for b in 0..B {
                let tail =
                    super::dot_tail(&x[a * k + k8..(a + 1) * k], &w[b * k + k8..(b + 1) * k]);
                tile[a][b] = super::sum_lanes(lanes(acc[a][b])) + tail;
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub fn exp_sub_sum(xs: &mut [f32], max: f32) -> f32 {
        let m = _mm256_set1_ps(max);
        let mut acc = _mm256_setzero_ps();
        let mut lanes = xs.chunks_exact_mut(8);
        for c in &mut lanes {
            // SAFETY: `c` holds eight f32s.
            let v = exp8(_mm256_sub_ps(unsafe { _mm256_loadu_ps(c.as_ptr()) }, m));
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(c.as_mut_ptr(), v) };
            acc = _mm256_add_ps(acc, v);
        }
        let mut tail = 0f32;
        for x in lanes.into_remainder() {
            *x = super::fast_exp(*x - max);
            tail += *x;
        }
        hsum(acc) + tail
    }
}

/// `(max, sum(exp(x - max)))` over a row; NaN counts as `-inf`. The sum runs in eight f32
/// lanes per chunk of 1024 and in f64 across chunks: relative error about 1e-6.
pub fn max_sum_exp(row: &[f32]) -> (f32, f64) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        return unsafe { avx2::max_sum_exp(row) };
    }
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY || max.is_nan() {
        return (max, 0.0);
    }
    let total = row
        .chunks(1024)
        .map(|c| f64::from(c.iter().map(|&x| fast_exp(x - max)).sum::<f32>()))
        .sum();
    (max, total)
}

/// `x = exp(x - max)` over `xs`; returns the sum (the softmax denominator).
#[inline]
pub fn exp_sub_sum(xs: &mut [f32], max: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        return unsafe { avx2::exp_sub_sum(xs, max) };
    }
    let mut total = 0f32;
    for x in xs.iter_mut() {
        *x = fast_exp(*x - max);
        total += *x;
    }
    total
}

/// Rows of `x` per tile.
const MR: usize = 4;
/// Rows of `w` per tile (at most; 3 when `x` has 3 or more rows, so that the twelve
/// accumulators and the loads fit the 16 vector registers, 6 for 1 or 2 rows).
const NR: usize = 6;
/// Rows of `w` per parallel job (their `k` columns stay in L2 across the job).
const W_ROWS_PER_JOB: usize = 48;
/// Rows of `x` per pass over a job's rows of `w`.
const X_ROWS_PER_PASS: usize = 32;

/// `y (m x n) = x (m x k) @ w (n x k)^T`, **batch-invariant**: every `y[i][j]` is computed by the
/// same sequence of float operations whatever `m` is, whichever rows are in `x` with it, and
/// however the work is split across threads, so a sequence's logits do not depend on what else
/// is in the step. (The sampler promises that a sample's tokens do not depend on batch size or
/// composition; a gemm that picks its kernel and blocking by `m` would break that.)
///
/// Each `y[i][j]` is one dot product in the layout both operands already have (rows along
/// `k`): eight lanes of fused multiply-adds in order of `k`, the lanes summed in a fixed
/// order, then the `k % 8` tail. Tiles of 4 rows of `x` by 3 rows of `w` keep twelve
/// accumulators in registers; jobs own 48 rows of `w` (rayon), so `w` streams from memory
/// once per 32 rows of `x`. Nothing is packed.
pub fn matmul_bi(x: &[f32], w: &[f32], m: usize, n: usize, k: usize, y: &mut [f32]) {
    use rayon::prelude::*;
    assert!(x.len() >= m * k && w.len() >= n * k && y.len() >= m * n);
    let out = SendPtr(y.as_mut_ptr());
    let job = |jb: usize| {
        let j_end = ((jb + 1) * W_ROWS_PER_JOB).min(n);
        let nr_step = if m <= 2 { NR } else { 3 };
        for i0 in (0..m).step_by(X_ROWS_PER_PASS) {
            let i_end = (i0 + X_ROWS_PER_PASS).min(m);
            for j in (jb * W_ROWS_PER_JOB..j_end).step_by(nr_step) {
                let nr = nr_step.min(j_end - j);
                for i in (i0..i_end).step_by(MR) {
                    let mr = MR.min(i_end - i);
                    let mut tile = [[0f32; NR]; MR];
                    dot_tile(&x[i * k..], &w[j * k..], k, mr, nr, &mut tile);
                    for (a, row) in tile.iter().enumerate().take(mr) {
                        for (b, v) in row.iter().enumerate().take(nr) {
                            // SAFETY: (i + a, j + b) is inside y (m x n), and each job writes
                            // only its own columns j, so no two threads write one element.
                            unsafe { *out.get().add((i + a) * n + j + b) = *v };
                        }
                    }
                }
            }
        }
    };
    let jobs = n.div_ceil(W_ROWS_PER_JOB);
    if m * n * k < 1 << 15 {
        (0..jobs).for_each(job);
    } else {
        (0..jobs).into_par_iter().for_each(job);
    }
}

/// A raw pointer that may cross threads (the writers touch disjoint elements).
#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub(crate) *mut f32);
// SAFETY: used only for writes to disjoint elements (see `matmul_bi` and the fused attention).
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}
impl SendPtr {
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}

/// `tile[a][b] = x[a] · w[b]` for `a < mr`, `b < nr` (rows of length `k`, `k` apart).
#[inline]
fn dot_tile(x: &[f32], w: &[f32], k: usize, mr: usize, nr: usize, tile: &mut [[f32; NR]; MR]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        unsafe { avx2::dot_tile(x, w, k, mr, nr, tile) };
        return;
    }
    for a in 0..mr {
        for b in 0..nr {
            tile[a][b] = dot_portable(&x[a * k..(a + 1) * k], &w[b * k..(b + 1) * k]);
        }
    }
}

/// The eight lanes of a dot product summed in the fixed order every kernel here uses.
#[inline(always)]
fn sum_lanes(l: [f32; 8]) -> f32 {
    ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
}

/// The `k % 8` tail of a dot product, in order.
#[inline(always)]
fn dot_tail(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0f32, |acc, (x, y)| x.mul_add(*y, acc))
}

/// `a · b` in the order every kernel here uses: eight lanes of fused multiply-adds along the
/// vectors, [`sum_lanes`], then the tail. (A plain `zip().sum()` is a serial chain of adds the
/// compiler may not reorder, hence not vectorised.)
#[inline(always)]
pub fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for j in 0..8 {
            acc[j] = x[j].mul_add(y[j], acc[j]);
        }
    }
    sum_lanes(acc) + dot_tail(ra, rb)
}

/// Whether this x86-64 CPU has AVX2 and FMA (std caches the answer).
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn has_avx2_fma() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_matches_libm_within_2_ulp() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (fast_exp(x), x.exp());
            let ulp = (want.to_bits() as i64 - got.to_bits() as i64).abs();
            assert!(ulp <= 2, "exp({x}) = {got}, libm {want} ({ulp} ulp)");
            worst = worst.max((got as f64 / want as f64 - 1.0).abs());
            x += 0.0137;
        }
        assert!(worst < 3e-7, "{worst}");
        assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(fast_exp(-100.0), 0.0);
        assert_eq!(fast_exp(0.0), 1.0);
        assert_eq!(fast_exp(100.0), f32::INFINITY);
    }

    #[test]
    fn max_sum_exp_matches_f64_reference() {
        let row: Vec<f32> = (0..151_936)
            .map(|i| ((i as f32 * 0.618).sin() * 12.0) - if i % 97 == 0 { 1e9 } else { 0.0 })
            .chain([f32::NAN, f32::NEG_INFINITY])
            .collect();
        let (max, sum) = max_sum_exp(&row);
        let want_max = row
            .iter()
            .copied()
            .filter(|x| !x.is_nan())
            .fold(f32::MIN, f32::max);
        let want: f64 = row
            .iter()
            .filter(|x| !x.is_nan())
            .map(|&x| (f64::from(x) - f64::from(want_max)).exp())
            .sum();
        assert_eq!(max, want_max);
        assert!((sum / want - 1.0).abs() < 1e-5, "{sum} vs {want}");
        assert_eq!(max_sum_exp(&[f32::NEG_INFINITY; 3]).1, 0.0);
    }

    fn data(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7 + seed) * 2_654_435_761) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    #[test]
    fn matmul_bi_matches_f64_and_each_row_is_bitwise_independent_of_the_batch() {
        for &(m, n, k) in &[(1, 300, 70), (7, 1000, 256), (37, 257, 203), (70, 100, 40)] {
            let (x, w) = (data(m * k, 1), data(n * k, 2));
            let mut y = vec![0f32; m * n];
            matmul_bi(&x, &w, m, n, k, &mut y);
            for i in 0..m {
                // the same row alone, and inside another batch at another index
                let mut alone = vec![0f32; n];
                matmul_bi(&x[i * k..(i + 1) * k], &w, 1, n, k, &mut alone);
                let mut other = data(5 * k, 3);
                other[2 * k..3 * k].copy_from_slice(&x[i * k..(i + 1) * k]);
                let mut y5 = vec![0f32; 5 * n];
                matmul_bi(&other, &w, 5, n, k, &mut y5);
                for j in 0..n {
                    let want: f64 = (0..k)
                        .map(|p| f64::from(x[i * k + p]) * f64::from(w[j * k + p]))
                        .sum();
                    let got = y[i * n + j];
                    assert!((f64::from(got) - want).abs() <= 1e-4 * want.abs().max(1.0));
                    assert_eq!(got.to_bits(), alone[j].to_bits(), "row {i} col {j} alone");
                    assert_eq!(got.to_bits(), y5[2 * n + j].to_bits(), "row {i} col {j}");
                    // and the portable dot product (the order the AVX2 tiles must keep) too
                    let d = dot_portable(&x[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]);
                    assert_eq!(got.to_bits(), d.to_bits());
                }
            }
        }
    }

    #[test]
    fn exp_sub_sum_is_fast_exp_lane_for_lane() {
        let xs: Vec<f32> = (0..37).map(|i| i as f32 * 0.77 - 20.0).collect();
        let mut got = xs.clone();
        let sum = exp_sub_sum(&mut got, 3.0);
        for (g, x) in got.iter().zip(&xs) {
            assert_eq!(*g, fast_exp(x - 3.0), "{x}");
        }
        assert!((sum - got.iter().sum::<f32>()).abs() <= 1e-5 * sum);
    }
}
