//! Small numeric kernels for the CPU hot loops of sampling (attention dot products and softmax,
//! log-sum-exp over a vocab row, a row's temperature step; the matmul is [`crate::gemm`]):
//! AVX2+FMA intrinsics where the CPU has them (detected once by std), portable code elsewhere.
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
    pub fn row_max(row: &[f32]) -> f32 {
        let mut maxv = _mm256_set1_ps(f32::NEG_INFINITY);
        let lanes = row.chunks_exact(8);
        let max = lanes
            .remainder()
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        for c in lanes {
            // SAFETY: `c` holds eight f32s.
            let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
            maxv = _mm256_max_ps(v, maxv); // a NaN in v keeps maxv
        }
        fold_lanes(maxv, max)
    }

    /// `max` folded with the eight lanes of `maxv`, in lane order.
    fn fold_lanes(maxv: __m256, max: f32) -> f32 {
        let mut lane_max = [0f32; 8];
        // SAFETY: `lane_max` holds eight f32s.
        unsafe { _mm256_storeu_ps(lane_max.as_mut_ptr(), maxv) };
        lane_max.iter().copied().fold(max, f32::max)
    }

    #[target_feature(enable = "avx2,fma")]
    pub fn sum_exp_from(row: &[f32], max: f32) -> f64 {
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
        total
    }

    #[target_feature(enable = "avx2,fma")]
    pub fn temper(row: &[f32], t: f32, out: &mut Vec<f32>) -> super::Tempered {
        out.clear();
        out.reserve(row.len());
        let (ninf, big, inf) = (
            _mm256_set1_ps(f32::NEG_INFINITY),
            _mm256_set1_ps(f32::MAX),
            _mm256_set1_ps(f32::INFINITY),
        );
        let tv = _mm256_set1_ps(t);
        // NaN -> -inf, +inf -> f32::MAX (`super::sanitize`)
        let clean = |v: __m256| {
            let v = _mm256_blendv_ps(v, ninf, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            _mm256_blendv_ps(v, big, _mm256_cmp_ps::<_CMP_EQ_OQ>(v, inf))
        };
        let mut maxv = ninf;
        let (mut infs, mut masked) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let lanes = row.chunks_exact(8);
        let tail = lanes.remainder();
        let mut max = tail.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut has_inf = tail.contains(&f32::INFINITY);
        let dst = out.spare_capacity_mut().as_mut_ptr() as *mut f32;
        for (i, c) in lanes.enumerate() {
            // SAFETY: `c` holds eight f32s.
            let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
            maxv = _mm256_max_ps(v, maxv); // a NaN in v keeps maxv, as in `row_max`
            infs = _mm256_or_ps(infs, _mm256_cmp_ps::<_CMP_EQ_OQ>(v, inf));
            let p = clean(_mm256_div_ps(clean(v), tv));
            masked = _mm256_or_ps(masked, _mm256_cmp_ps::<_CMP_EQ_OQ>(p, ninf));
            // SAFETY: 8 * i + 8 <= row.len() <= the reserved capacity.
            unsafe { _mm256_storeu_ps(dst.add(8 * i), p) };
        }
        let done = row.len() - tail.len();
        // SAFETY: the first `done` values were written above.
        unsafe { out.set_len(done) };
        out.extend(
            tail.iter()
                .map(|&x| super::sanitize(super::sanitize(x) / t)),
        );
        max = fold_lanes(maxv, max);
        has_inf |= _mm256_movemask_ps(infs) != 0;
        let masked = _mm256_movemask_ps(masked) != 0 || out[done..].contains(&f32::NEG_INFINITY);
        super::Tempered {
            max,
            has_inf,
            masked,
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub fn exp_sub_f64(xs: &[f32], max: f32, out: &mut Vec<f64>) {
        let m = _mm256_set1_ps(max);
        out.reserve(xs.len());
        let lanes = xs.chunks_exact(8);
        let tail = lanes.remainder();
        for c in lanes {
            // SAFETY: `c` holds eight f32s.
            let e = exp8(_mm256_sub_ps(unsafe { _mm256_loadu_ps(c.as_ptr()) }, m));
            let mut l = [0f32; 8];
            // SAFETY: `l` holds eight f32s.
            unsafe { _mm256_storeu_ps(l.as_mut_ptr(), e) };
            out.extend(l.iter().map(|&v| f64::from(v)));
        }
        out.extend(tail.iter().map(|&x| f64::from(super::fast_exp(x - max))));
    }

    #[target_feature(enable = "avx2,fma")]
    pub fn position_eq(xs: &[f32], x: f32) -> Option<usize> {
        let want = _mm256_set1_ps(x);
        let lanes = xs.chunks_exact(8);
        let tail = lanes.remainder();
        for (i, c) in lanes.enumerate() {
            // SAFETY: `c` holds eight f32s.
            let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
            let hits = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(v, want));
            if hits != 0 {
                return Some(8 * i + hits.trailing_zeros() as usize);
            }
        }
        let at = xs.len() - tail.len();
        tail.iter().position(|&v| v == x).map(|p| at + p)
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

/// The largest value of `xs`, in eight lanes (a fold of `f32::max` is one serial chain: it does
/// not vectorise). A NaN is skipped unless every value is NaN, as `f32::max` does.
#[inline(always)]
pub fn lane_max(xs: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = xs.chunks_exact(8);
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    for c in chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = if x > *m { x } else { *m };
        }
    }
    lanes.iter().fold(tail, |m, &x| m.max(x))
}

/// `(max, sum(exp(x - max)))` over a row; NaN counts as `-inf`. The sum runs in eight f32
/// lanes per chunk of 1024 and in f64 across chunks: relative error about 1e-6.
pub fn max_sum_exp(row: &[f32]) -> (f32, f64) {
    let max = row_max(row);
    if max == f32::NEG_INFINITY {
        return (max, 0.0);
    }
    (max, sum_exp_from(row, max))
}

/// The largest non-NaN value of a row (`-inf` when there is none), eight lanes at a time.
pub fn row_max(row: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        return unsafe { avx2::row_max(row) };
    }
    row.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// The sum half of [`max_sum_exp`] for a `max` already known (finite): the same bits as the
/// sum it returns.
pub fn sum_exp_from(row: &[f32], max: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        return unsafe { avx2::sum_exp_from(row, max) };
    }
    row.chunks(1024)
        .map(|c| f64::from(c.iter().map(|&x| fast_exp(x - max)).sum::<f32>()))
        .sum()
}

/// NaN as `-inf`, `+inf` as `f32::MAX`: the sampler's view of a logit.
#[inline(always)]
pub fn sanitize(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else if x == f32::INFINITY {
        f32::MAX
    } else {
        x
    }
}

/// What [`temper`] finds on its pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tempered {
    /// The raw row's max, as [`max_sum_exp`] finds it.
    pub max: f32,
    /// The raw row holds +inf.
    pub has_inf: bool,
    /// The tempered row holds `-inf` (a NaN or `-inf` logit, or an underflow).
    pub masked: bool,
}

/// A sampling row's temperature step in one pass over the raw logits: `out[i] =
/// sanitize(sanitize(row[i]) / t)`, the same bits as those scalar steps, and what its
/// log-softmax and draw need to know of the row ([`Tempered`]).
pub fn temper(row: &[f32], t: f32, out: &mut Vec<f32>) -> Tempered {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        return unsafe { avx2::temper(row, t, out) };
    }
    out.clear();
    out.extend(row.iter().map(|&x| sanitize(sanitize(x) / t)));
    Tempered {
        max: row_max(row),
        has_inf: row.contains(&f32::INFINITY),
        masked: out.contains(&f32::NEG_INFINITY),
    }
}

/// Appends `fast_exp(x - max)` of every `x`, widened to f64 (the sampler's weights), eight
/// lanes at a time where the CPU has AVX2: the same bits as the scalar [`fast_exp`].
pub fn exp_sub_f64(xs: &[f32], max: f32, out: &mut Vec<f64>) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        return unsafe { avx2::exp_sub_f64(xs, max, out) };
    }
    out.extend(xs.iter().map(|&x| f64::from(fast_exp(x - max))));
}

/// The first index of a value equal to `x` (`==`, so never of a NaN), eight lanes at a time.
pub fn position_eq(xs: &[f32], x: f32) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        return unsafe { avx2::position_eq(xs, x) };
    }
    xs.iter().position(|&v| v == x)
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

/// A raw pointer that may cross threads (the writers touch disjoint elements).
#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub(crate) *mut f32);
// SAFETY: used only for writes to disjoint elements (see `gemm::matmul` and the fused attention).
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}
impl SendPtr {
    pub(crate) fn get(self) -> *mut f32 {
        self.0
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
/// vectors, `sum_lanes`, then the tail. (A plain `zip().sum()` is a serial chain of adds the
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

/// A hint to bring the cache line holding `p` into L1 ahead of its use; nothing on other
/// architectures. Never faults, whatever the address.
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    prefetch_hint::<{ std::arch::x86_64::_MM_HINT_T0 }, T>(p);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// A hint to bring the cache line holding `p` into L2 (not L1) ahead of its use: for data
/// needed a little later, without pushing out what L1 holds now. Never faults.
#[inline(always)]
pub fn prefetch_l2<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    prefetch_hint::<{ std::arch::x86_64::_MM_HINT_T1 }, T>(p);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_hint<const HINT: i32, T>(p: *const T) {
    // SAFETY: a prefetch is a hint; it reads nothing and cannot fault.
    unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(p as *const i8) };
}

/// The sum of `xs` in 16 lanes (plain adds, which vectorise on any x86-64; for the bandwidth
/// benchmark, where the order of the additions does not matter).
pub fn sum(xs: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let chunks = xs.chunks_exact(16);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l += v;
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// Independent chains [`fma_chains`] keeps in registers (two more than a 5-cycle multiply-add
/// latency at two per cycle needs).
pub const FMA_CHAINS: usize = 12;

/// `iters` rounds of [`FMA_CHAINS`] independent 8-lane fused multiply-adds held in registers:
/// the machine's multiply-add peak when timed (`bench sample` prints it). Returns a value that
/// depends on every chain, so that none is optimised away.
pub fn fma_chains(iters: usize, seed: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        return unsafe { fma_chains_avx2(iters, seed) };
    }
    let mut acc = [[seed; 8]; FMA_CHAINS];
    let (x, y) = (
        std::hint::black_box(0.999_999f32),
        std::hint::black_box(1e-7f32),
    );
    for _ in 0..iters {
        for a in acc.iter_mut() {
            for v in a.iter_mut() {
                *v = v.mul_add(x, y);
            }
        }
    }
    acc.iter().flatten().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_chains_avx2(iters: usize, seed: f32) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_set1_ps(seed); FMA_CHAINS];
    let x = _mm256_set1_ps(std::hint::black_box(0.999_999f32));
    let y = _mm256_set1_ps(std::hint::black_box(1e-7f32));
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = _mm256_fmadd_ps(*a, x, y);
        }
    }
    let mut total = 0f32;
    for a in acc {
        let mut l = [0f32; 8];
        // SAFETY: `l` holds eight f32s.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), a) };
        total += l.iter().sum::<f32>();
    }
    total
}

/// A kernel written once and compiled twice: defines `fn $name(args)` that runs `$body` compiled
/// for AVX2 and FMA where the CPU has them (the runtime check of [`has_avx2_fma`]), else `$body`
/// as the portable build compiles it. `$body::<SIMD>` with `generic`: the body takes a `const`
/// telling it which, to choose its own vector code. `unsafe fn` for a body that is unsafe to
/// call (the caller's promise is passed on).
macro_rules! avx2_fma_dispatch {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) => $($body:tt)+) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            if $crate::simd::has_avx2_fma() {
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                fn avx2($($arg: $ty),*) {
                    $crate::simd::avx2_fma_dispatch!(@call true, $($body)+; $($arg),*)
                }
                // SAFETY: the CPU has AVX2 and FMA (checked above).
                return unsafe { avx2($($arg),*) };
            }
            $crate::simd::avx2_fma_dispatch!(@call false, $($body)+; $($arg),*)
        }
    };
    ($(#[$m:meta])* $vis:vis unsafe fn $name:ident($($arg:ident: $ty:ty),* $(,)?) => $($body:tt)+) => {
        $(#[$m])*
        $vis unsafe fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            if $crate::simd::has_avx2_fma() {
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2($($arg: $ty),*) {
                    // SAFETY: passed on from the caller.
                    unsafe { $crate::simd::avx2_fma_dispatch!(@call true, $($body)+; $($arg),*) }
                }
                // SAFETY: the CPU has AVX2 and FMA (checked above); the rest is the caller's.
                return unsafe { avx2($($arg),*) };
            }
            // SAFETY: the caller's promise.
            unsafe { $crate::simd::avx2_fma_dispatch!(@call false, $($body)+; $($arg),*) }
        }
    };
    (@call $simd:tt, generic $body:ident; $($arg:ident),*) => { $body::<$simd>($($arg),*) };
    (@call $simd:tt, $body:ident; $($arg:ident),*) => { $body($($arg),*) };
}
pub(crate) use avx2_fma_dispatch;

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
    fn position_eq_is_the_first_equal_index() {
        for len in [0usize, 1, 7, 8, 9, 31, 32, 33, 1000] {
            let row: Vec<f32> = (0..len)
                .map(|i| match i % 11 {
                    3 => f32::NAN,
                    5 => -0.0,
                    _ => ((i * 7919) % 13) as f32,
                })
                .collect();
            for x in [0.0, -0.0, 12.0, 5.0, 99.0, f32::NAN] {
                let want = row.iter().position(|&v| v == x);
                assert_eq!(position_eq(&row, x), want, "len {len}, {x}");
            }
            if let Some(last) = row.last() {
                // only the tail holds it
                let mut r = vec![-1.0; len];
                r[len - 1] = *last;
                assert_eq!(position_eq(&r, *last), r.iter().position(|&v| v == *last));
            }
        }
    }

    #[test]
    fn temper_is_the_scalar_steps_and_finds_the_rows_max() {
        let special = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            0.0,
            f32::MAX,
            -f32::MAX,
        ];
        for len in [0usize, 3, 8, 13, 64, 1031, 4100] {
            for with_inf in [false, true] {
                let row: Vec<f32> = (0..len)
                    .map(|i| match (i * 7919) % 97 {
                        0 => special[i % special.len()],
                        1 if with_inf => f32::INFINITY,
                        1 => f32::NAN,
                        r => (r as f32 - 48.0) * 0.37,
                    })
                    .filter(|x| with_inf || *x != f32::INFINITY)
                    .collect();
                for t in [0.6f32, 1.0, 1.7] {
                    let mut out = vec![9.0; 5];
                    let Tempered {
                        max,
                        has_inf,
                        masked,
                    } = temper(&row, t, &mut out);
                    assert_eq!(out.len(), row.len());
                    for (o, &x) in out.iter().zip(&row) {
                        assert_eq!(
                            o.to_bits(),
                            sanitize(sanitize(x) / t).to_bits(),
                            "{x} / {t}"
                        );
                    }
                    assert_eq!(has_inf, row.contains(&f32::INFINITY), "len {len}");
                    assert_eq!(masked, out.contains(&f32::NEG_INFINITY), "len {len}");
                    let (want, sum) = max_sum_exp(&row);
                    assert_eq!(max.to_bits(), want.to_bits(), "len {len}");
                    if !has_inf && max.is_finite() {
                        assert_eq!(sum_exp_from(&row, max).to_bits(), sum.to_bits());
                    }
                }
            }
        }
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

    #[test]
    fn exp_sub_f64_is_fast_exp_lane_for_lane() {
        let xs: Vec<f32> = (0..37)
            .map(|i| i as f32 * 0.77 - 20.0)
            .chain([f32::NEG_INFINITY, 90.0, -100.0])
            .collect();
        let mut got = vec![7.0];
        exp_sub_f64(&xs, 3.0, &mut got);
        assert_eq!(got.len(), 1 + xs.len());
        for (g, x) in got[1..].iter().zip(&xs) {
            assert_eq!(*g, f64::from(fast_exp(x - 3.0)), "{x}");
        }
    }
}
