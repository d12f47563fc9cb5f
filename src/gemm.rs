//! The CPU matmul of sampling, `y (m x n) = x (m x k) @ w (n x k)^T`, with `w` packed once (when
//! a model is set up for inference) into panels of 16 output columns laid along `k`, so that an
//! outer-product kernel reads each step of a panel as one aligned 64-byte line.
//!
//! **Batch-invariant**: every `y[i][j]` is one chain of fused multiply-adds over `k` in order,
//! from zero, whatever `m` is, whichever rows share the call, whichever tile shape or thread
//! computes it, and across the `k` blocks (a block's partial sums are stored in `y` and picked up
//! by the next block unchanged). The sampler's promise that a sample's tokens do not depend on
//! batch size or composition rests on this; a gemm that picks its kernel and blocking by `m`
//! (candle's does) would break it. The AVX-512 kernels (8 x 48 tiles in the 32 vector
//! registers), the AVX2 ones (6 x 16) and the portable ones give the same bits, so which one a
//! CPU runs ([`Kernel::best`]) changes speed alone.
//!
//! A panel is read from memory by its first row tile and from L1 or L2 by the others; each row
//! tile prefetches its share of the lines the job reads next (the next panels; with AVX-512 also
//! the next `k` block's, and after a job's last panels the next job's first ones, which the pool
//! usually hands the same worker), so that streaming weights (a decode step reads every weight once, far
//! more than the caches hold) does not stall the first tile. The AVX-512 tiles ask for them a
//! line or a few per step rather than all at once: a burst of misses fills the queue that the
//! tile's own loads wait in (on Zen 4, with the next `k` block and the next job added,
//! interleaved `bench sample` medians went from 4,145 to 4,689 tok/s at batch 32).
//!
//! Training uses the same kernels for all three products of a linear layer (`model::host_linear`):
//! `x` may also be given transposed (stored `k x m`, as the upstream gradient is when the weight's
//! gradient is `dy^T @ x`), a matrix may be packed from its transpose ([`PackedMatrix::pack_kn`]),
//! and a product may be added to `y` instead of written.
//!
//! Knows nothing of models or tensors; `model::transformer` decides what gets packed.

use rayon::prelude::*;

use crate::simd::SendPtr;

/// Output columns per panel (two AVX2 vectors).
pub const NR: usize = 16;
/// Rows of `x` per tile, at most (6 x 2 accumulators, 2 panel loads and a broadcast: 15 of the
/// 16 vector registers).
const MR: usize = 6;
/// `k` per block: a panel's block (16 KiB) stays in L1 while every row tile of `x` passes over
/// it; the hidden sizes of small models fit one block, so their tiles store `y` once.
const KC: usize = 256;
/// Rows of `x` per block (their `KC` columns stay in L2 while every panel passes).
const MC: usize = 96;
/// Panels per parallel job.
const PANELS_PER_JOB: usize = 6;
/// Below this many multiply-adds the call runs on the calling thread.
const PARALLEL_MIN: usize = 1 << 15;

/// One step of a panel: 16 columns' values at one `k`, on its own cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; NR]);

/// A weight matrix `(n, k)` in panels of [`NR`] rows, each stored `k`-major (one `Line` per
/// `k`); the last panel's missing rows are zeros.
pub struct PackedMatrix {
    n: usize,
    k: usize,
    lines: Vec<Line>,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedMatrix({} x {})", self.n, self.k)
    }
}

impl PackedMatrix {
    /// Packs `w` (`n` rows of `k`, row-major).
    pub fn pack(w: &[f32], n: usize, k: usize) -> Self {
        assert!(w.len() >= n * k, "pack: {} values for {n} x {k}", w.len());
        let panels = n.div_ceil(NR);
        let mut lines = vec![Line([0.0; NR]); panels * k];
        lines
            .par_chunks_mut(k.max(1))
            .enumerate()
            .for_each(|(p, panel)| {
                for c in 0..NR.min(n - p * NR) {
                    let row = &w[(p * NR + c) * k..][..k];
                    for (line, v) in panel.iter_mut().zip(row) {
                        line.0[c] = *v;
                    }
                }
            });
        PackedMatrix { n, k, lines }
    }

    /// Packs the `(n, k)` matrix whose transpose `a` is given (`k` rows of `n`, row-major): each
    /// line of a panel is 16 consecutive values of one row of `a`.
    pub fn pack_kn(a: &[f32], k: usize, n: usize) -> Self {
        assert!(
            a.len() >= n * k,
            "pack_kn: {} values for {k} x {n}",
            a.len()
        );
        let panels = n.div_ceil(NR);
        let mut lines = vec![Line([0.0; NR]); panels * k];
        lines
            .par_chunks_mut(k.max(1))
            .enumerate()
            .for_each(|(p, panel)| {
                let c = NR.min(n - p * NR);
                for (s, line) in panel.iter_mut().enumerate() {
                    line.0[..c].copy_from_slice(&a[s * n + p * NR..][..c]);
                }
            });
        PackedMatrix { n, k, lines }
    }

    /// Rows of the original matrix (the output features).
    pub fn rows(&self) -> usize {
        self.n
    }

    /// Columns of the original matrix (the input features).
    pub fn cols(&self) -> usize {
        self.k
    }

    /// Row `j` of the original matrix (an embedding lookup from a tied, packed LM head).
    pub fn row(&self, j: usize) -> Vec<f32> {
        assert!(j < self.n, "row {j} of {}", self.n);
        let (p, c) = (j / NR, j % NR);
        self.lines[p * self.k..(p + 1) * self.k]
            .iter()
            .map(|l| l.0[c])
            .collect()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.lines.len() * std::mem::size_of::<Line>()
    }

    fn panel(&self, p: usize) -> &[Line] {
        &self.lines[p * self.k..(p + 1) * self.k]
    }
}

/// `y = x @ w^T` for `x` (`m` rows of `w.cols()`) into `y` (`m` rows of `w.rows()`), batch
/// invariant (see the module doc). Jobs of whole panels run on rayon's pool.
pub fn matmul(x: &[f32], m: usize, w: &PackedMatrix, y: &mut [f32]) {
    product(x, XLayout::Rows, m, w, y, false);
}

/// How the `m x k` left operand of [`product`] is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XLayout {
    /// Row-major `m x k`.
    Rows,
    /// Its transpose, row-major `k x m`.
    Transposed,
}

/// `y = x @ w^T` (`accumulate`: `y += x @ w^T`) with `x` stored as `layout` says. Each `y[i][j]`
/// is one multiply-add chain over `k` in order, starting from zero (or from `y[i][j]`).
pub fn product(
    x: &[f32],
    layout: XLayout,
    m: usize,
    w: &PackedMatrix,
    y: &mut [f32],
    accumulate: bool,
) {
    product_with(Kernel::best(), x, layout, m, w, y, accumulate);
}

/// The kernels [`product`] can run on; each gives the same bits (every output one multiply-add
/// chain over `k` in order), so the choice is speed alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// 16-lane tiles of up to 8 rows by 3 panels (or 6 rows by 4) in the 32 vector registers
    /// (x86-64 with AVX-512F).
    Avx512,
    /// 8-lane tiles of up to 6 rows by 16 columns (x86-64 with AVX2 and FMA).
    Avx2,
    /// Scalar `mul_add`, any CPU.
    Portable,
}

impl Kernel {
    /// The fastest kernel this CPU runs, unless `SELFDISTILL_GEMM` (`avx512`, `avx2` or
    /// `portable`) names a slower one, for comparisons; read once.
    pub fn best() -> Kernel {
        static BEST: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            let avail = Kernel::available();
            match std::env::var("SELFDISTILL_GEMM").ok().as_deref() {
                Some(name) => avail
                    .iter()
                    .copied()
                    .find(|k| k.name() == name)
                    .unwrap_or_else(|| {
                        panic!(
                            "SELFDISTILL_GEMM={name}: this CPU runs {}",
                            avail
                                .iter()
                                .map(|k| k.name())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    }),
                None => avail[0],
            }
        })
    }

    /// The kernels this CPU runs, fastest first.
    pub fn available() -> Vec<Kernel> {
        [Kernel::Avx512, Kernel::Avx2, Kernel::Portable]
            .into_iter()
            .filter(|k| k.runs())
            .collect()
    }

    /// Whether this CPU has the instructions the kernel is built from (std caches the answer).
    pub fn runs(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        let simd = match self {
            Kernel::Avx512 => {
                std::is_x86_feature_detected!("avx512f") && crate::simd::has_avx2_fma()
            }
            Kernel::Avx2 => crate::simd::has_avx2_fma(),
            Kernel::Portable => true,
        };
        #[cfg(not(target_arch = "x86_64"))]
        let simd = self == Kernel::Portable;
        simd
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Avx512 => "avx512",
            Kernel::Avx2 => "avx2",
            Kernel::Portable => "portable",
        }
    }
}

/// [`product`] on a given kernel (one of [`Kernel::available`]).
///
/// Over 100 lines: the loop nest of the blocked product (panels of `w`, row blocks of `x`, the
/// edge tiles) is one piece, whose index arithmetic reads best whole.
pub fn product_with(
    kernel: Kernel,
    x: &[f32],
    layout: XLayout,
    m: usize,
    w: &PackedMatrix,
    y: &mut [f32],
    accumulate: bool,
) {
    assert!(kernel.runs(), "gemm kernel {kernel:?} on a CPU without it");
    let (n, k) = (w.n, w.k);
    assert!(
        x.len() >= m * k && y.len() >= m * n,
        "matmul: {m} x {k} @ ({n} x {k})^T"
    );
    if k == 0 {
        if !accumulate {
            y[..m * n].fill(0.0);
        }
        return;
    }
    let xt = layout == XLayout::Transposed;
    let xv = XView { m, k, xt };
    #[cfg(target_arch = "x86_64")]
    if kernel == Kernel::Avx512 {
        return wide::product(x, xv, w, y, accumulate);
    }
    let panels = n.div_ceil(NR);
    let out = SendPtr(y.as_mut_ptr());
    panel_jobs(panels, PANELS_PER_JOB, m * n * k, |p0, p1| {
        for i0 in (0..m).step_by(MC) {
            let i1 = (i0 + MC).min(m);
            // panels go through the row tiles `step` at a time (the smallest tile's width)
            let (mut i, mut step) = (i0, 3);
            while i < i1 {
                let r = tile_rows(i1 - i);
                step = step.min(max_panels(r));
                i += r;
            }
            for k0 in (0..k).step_by(KC) {
                let kc = KC.min(k - k0);
                let mut p = p0;
                while p < p1 {
                    // these panels' kc steps stay in L1 while every row tile passes over them
                    let g = step.min(p1 - p);
                    if step == 1 {
                        // every row tile takes one panel: one call runs them all
                        let tile = Tile {
                            x: &x[xv.at(i0, k0)..],
                            ldx: xv.ld(),
                            xt,
                            panels: [&w.panel(p)[k0..k0 + kc], &[], &[]],
                            // SAFETY: rows i0..i1 and the panel's columns are inside y; each
                            // job writes only its own panels' columns.
                            y: unsafe { out.get().add(i0 * n + p * NR) },
                            ldy: n,
                            cols: (n - p * NR).min(NR),
                            first: k0 == 0 && !accumulate,
                            prefetch: if p + 1 < panels {
                                &w.panel(p + 1)[k0..k0 + kc]
                            } else {
                                &[]
                            },
                        };
                        run_column(kernel, i1 - i0, &tile);
                        p += 1;
                        continue;
                    }
                    let mut i = i0;
                    while i < i1 {
                        let r = tile_rows(i1 - i);
                        let mut q = p;
                        while q < p + g {
                            let group = max_panels(r).min(p + g - q);
                            let cols = (n - q * NR).min(group * NR);
                            let tile = Tile {
                                x: &x[xv.at(i, k0)..],
                                ldx: xv.ld(),
                                xt,
                                panels: [q, q + 1, q + 2].map(|c| {
                                    if c < q + group {
                                        &w.panel(c)[k0..k0 + kc]
                                    } else {
                                        &[][..]
                                    }
                                }),
                                // SAFETY: rows i..i + r and columns q * NR..+cols are inside y
                                // (m x n); each job writes only its own panels' columns.
                                y: unsafe { out.get().add(i * n + q * NR) },
                                ldy: n,
                                cols,
                                first: k0 == 0 && !accumulate,
                                prefetch: &[],
                            };
                            run_tile(kernel, r, group, &tile);
                            q += group;
                        }
                        i += r;
                    }
                    p += g;
                }
            }
        }
    });
}

/// Where the left operand's elements are: `m x k`, stored row-major or transposed.
#[derive(Clone, Copy)]
struct XView {
    m: usize,
    k: usize,
    xt: bool,
}

impl XView {
    /// The index of element (row `i`, step `k0`).
    fn at(self, i: usize, k0: usize) -> usize {
        if self.xt {
            k0 * self.m + i
        } else {
            i * self.k + k0
        }
    }

    /// The distance between rows (or, transposed, between steps).
    fn ld(self) -> usize {
        if self.xt {
            self.m
        } else {
            self.k
        }
    }
}

/// Elements of a tile's left operand from its first one that `rows` rows by `kc` steps reach,
/// stored as [`XView`] says (`xt`: transposed, `ldx` apart).
fn x_extent(xt: bool, rows: usize, kc: usize, ldx: usize) -> usize {
    if xt {
        (kc - 1) * ldx + rows
    } else {
        (rows - 1) * ldx + kc
    }
}

/// Runs `job(p0, p1)` over `panels` panels in jobs of whole panels: at least four per thread
/// when the matrix has that many (a small projection in few large jobs leaves a thread idle),
/// at most `max`; on rayon's pool unless the product is below [`PARALLEL_MIN`] multiply-adds.
fn panel_jobs(panels: usize, max: usize, work: usize, job: impl Fn(usize, usize) + Sync) {
    let per_job = panels
        .div_ceil(4 * rayon::current_num_threads())
        .clamp(1, max);
    let run = |jb: usize| job(jb * per_job, ((jb + 1) * per_job).min(panels));
    let jobs = panels.div_ceil(per_job);
    if work < PARALLEL_MIN {
        (0..jobs).for_each(run);
    } else {
        (0..jobs).into_par_iter().for_each(run);
    }
}

/// Rows of the next tile when `left` rows remain: as even a split into tiles of at most `MR`
/// rows as there can be (32 rows are 6, 6, 5, 5, 5, 5, not 6 x 5 and a 2-row tile whose few
/// accumulators leave the multiply-add units waiting on their latency).
fn tile_rows(left: usize) -> usize {
    left.div_ceil(left.div_ceil(MR))
}

/// Panels per tile for `r` rows: as many as keep the accumulators (`r` x 2 per panel) in the 16
/// vector registers with the panel loads and the broadcast (3 rows x 2 panels is one over: the
/// compiler folds a panel load into the multiply-adds instead of spilling).
fn max_panels(r: usize) -> usize {
    match r {
        1 => 3,
        2 | 3 => 2,
        _ => 1,
    }
}

/// One tile: `r` rows of `x` (from column `k0`) times up to three panels' `kc` steps, added to
/// (or, on the first block, written into) `y`.
#[derive(Clone, Copy)]
struct Tile<'a> {
    /// From the tile's first element: row `a`, step `s` at `a * ldx + s`, or with `xt` (x
    /// transposed) at `s * ldx + a`.
    x: &'a [f32],
    ldx: usize,
    xt: bool,
    panels: [&'a [Line]; 3],
    y: *mut f32,
    ldy: usize,
    /// Columns of `y` this tile owns (up to 16 per panel; fewer in the matrix's last panel).
    cols: usize,
    first: bool,
    /// Lines of another panel to prefetch into the cache while this tile computes, one per `k`
    /// step from the first (the next panel of a column, spread over its row tiles, so that the
    /// first tile of the next panel does not wait on memory).
    prefetch: &'a [Line],
}

fn run_tile(kernel: Kernel, r: usize, p: usize, t: &Tile) {
    #[cfg(target_arch = "x86_64")]
    if kernel != Kernel::Portable {
        macro_rules! dispatch {
            ($(($a:literal, $b:literal)),*) => {
                match (r, p, t.xt) {
                    // SAFETY: the CPU has AVX2 and FMA (`product_with` checks that it runs the
                    // kernel); the tile's bounds are the caller's (see `matmul`).
                    $(
                        ($a, $b, false) => unsafe { avx2::tile::<$a, $b, false>(t) },
                        ($a, $b, true) => unsafe { avx2::tile::<$a, $b, true>(t) },
                    )*
                    _ => unreachable!("tile {r} x {p}"),
                }
            };
        }
        dispatch!(
            (6, 1),
            (5, 1),
            (4, 1),
            (3, 2),
            (3, 1),
            (2, 2),
            (2, 1),
            (1, 3),
            (1, 2),
            (1, 1)
        );
        return;
    }
    portable_tile(r, p, t);
}

/// `rows` rows of `x` (split by [`tile_rows`]) times one panel: the tiles of [`run_tile`] in
/// one call.
fn run_column(kernel: Kernel, rows: usize, t: &Tile) {
    #[cfg(target_arch = "x86_64")]
    if kernel != Kernel::Portable {
        // SAFETY: the CPU has AVX2 and FMA (`product_with` checks that it runs the kernel);
        // the rows are the caller's.
        unsafe {
            if t.xt {
                avx2::column::<true>(rows, t)
            } else {
                avx2::column::<false>(rows, t)
            }
        };
        return;
    }
    let mut i = 0;
    while i < rows {
        let r = tile_rows(rows - i);
        portable_tile(r, 1, &t.rows_from(i));
        i += r;
    }
}

impl Tile<'_> {
    /// The same tile from row `i` on.
    fn rows_from(&self, i: usize) -> Tile<'_> {
        Tile {
            x: &self.x[if self.xt { i } else { i * self.ldx }..],
            // SAFETY: the caller's rows from i on are inside y.
            y: unsafe { self.y.add(i * self.ldy) },
            ..*self
        }
    }
}

/// The same operations as the AVX2 tiles, element by element.
fn portable_tile(r: usize, p: usize, t: &Tile) {
    let kc = t.panels[0].len();
    for a in 0..r {
        let xr: Vec<f32> = (0..kc)
            .map(|s| t.x[if t.xt { s * t.ldx + a } else { a * t.ldx + s }])
            .collect();
        for c in 0..t.cols {
            let panel = t.panels[c / NR];
            // SAFETY: (a, c) is inside the tile (see `matmul`).
            let yp = unsafe { t.y.add(a * t.ldy + c) };
            let mut acc = if t.first { 0.0 } else { unsafe { *yp } };
            for (xv, line) in xr.iter().zip(panel) {
                acc = xv.mul_add(line.0[c % NR], acc);
            }
            // SAFETY: as above.
            unsafe { *yp = acc };
        }
    }
    debug_assert!(p * NR >= t.cols);
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{Tile, NR};

    /// Row tiles of up to 6 rows down `rows` rows, each times the tile's one panel.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn column<const XT: bool>(rows: usize, t: &Tile) {
        let tiles = rows.div_ceil(rows.div_ceil(super::MR));
        let per = t.prefetch.len().div_ceil(tiles.max(1));
        let (mut i, mut at) = (0, 0);
        while i < rows {
            let r = super::tile_rows(rows - i);
            let mut ti = t.rows_from(i);
            let end = (at + per).min(t.prefetch.len());
            ti.prefetch = &t.prefetch[at..end];
            at = end;
            // SAFETY: as for `column`.
            unsafe {
                match r {
                    6 => tile::<6, 1, XT>(&ti),
                    5 => tile::<5, 1, XT>(&ti),
                    4 => tile::<4, 1, XT>(&ti),
                    3 => tile::<3, 1, XT>(&ti),
                    2 => tile::<2, 1, XT>(&ti),
                    _ => tile::<1, 1, XT>(&ti),
                }
            }
            i += r;
        }
    }

    /// `R` rows by `P` panels: `R x 2P` accumulators in registers over the block's `k` steps.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tile<const R: usize, const P: usize, const XT: bool>(t: &Tile) {
        let kc = t.panels[0].len();
        let mut acc = [[_mm256_setzero_ps(); 6]; R];
        let full = t.cols == P * NR;
        if !t.first && full {
            for (a, row) in acc.iter_mut().enumerate() {
                for (c, v) in row.iter_mut().enumerate().take(2 * P) {
                    // SAFETY: the tile's P * 16 columns of row a are inside y (see `matmul`).
                    *v = unsafe { _mm256_loadu_ps(t.y.add(a * t.ldy + 8 * c)) };
                }
            }
        } else if !t.first {
            for (a, row) in acc.iter_mut().enumerate() {
                let mut buf = [0f32; 3 * NR];
                // SAFETY: the tile's columns of row a are inside y (see `matmul`).
                unsafe {
                    std::ptr::copy_nonoverlapping(t.y.add(a * t.ldy), buf.as_mut_ptr(), t.cols)
                };
                for (v, chunk) in row.iter_mut().zip(buf.chunks_exact(8)).take(2 * P) {
                    // SAFETY: chunk holds eight f32s.
                    *v = unsafe { _mm256_loadu_ps(chunk.as_ptr()) };
                }
            }
        }
        let xp = t.x.as_ptr();
        assert!(t.x.len() >= super::x_extent(XT, R, kc, t.ldx));
        let pf = t.prefetch;
        for s in 0..kc {
            if s < pf.len() {
                // SAFETY: a hint only; the address is inside `pf`.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(pf.as_ptr().add(s) as *const i8) };
            }
            let mut b = [_mm256_setzero_ps(); 6];
            for q in 0..P {
                let line = t.panels[q][s].0.as_ptr();
                // SAFETY: a line holds 16 f32s, 64-byte aligned.
                b[2 * q] = unsafe { _mm256_load_ps(line) };
                b[2 * q + 1] = unsafe { _mm256_load_ps(line.add(8)) };
            }
            for (a, row) in acc.iter_mut().enumerate() {
                let at = if XT { s * t.ldx + a } else { a * t.ldx + s };
                // SAFETY: at < x.len() (asserted above).
                let xv = unsafe { _mm256_broadcast_ss(&*xp.add(at)) };
                for (v, bv) in row.iter_mut().zip(&b).take(2 * P) {
                    *v = _mm256_fmadd_ps(xv, *bv, *v);
                }
            }
        }
        if full {
            for (a, row) in acc.iter().enumerate() {
                for (c, v) in row.iter().enumerate().take(2 * P) {
                    // SAFETY: as for the loads above.
                    unsafe { _mm256_storeu_ps(t.y.add(a * t.ldy + 8 * c), *v) };
                }
            }
            return;
        }
        for (a, row) in acc.iter().enumerate() {
            let mut buf = [0f32; 3 * NR];
            for (v, chunk) in row.iter().zip(buf.chunks_exact_mut(8)).take(2 * P) {
                // SAFETY: chunk holds eight f32s.
                unsafe { _mm256_storeu_ps(chunk.as_mut_ptr(), *v) };
            }
            // SAFETY: as for the load above.
            unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), t.y.add(a * t.ldy), t.cols) };
        }
    }
}

/// The AVX-512 path of [`product`]: 16-lane tiles of up to [`wide::MR`] rows by up to four
/// panels (one vector per panel line); while a group of panels computes, the lines read next
/// (the next group, `k` block, row block or job) are prefetched a few per step.
#[cfg(target_arch = "x86_64")]
mod wide {
    use std::arch::x86_64::*;

    use super::{panel_jobs, Line, PackedMatrix, XView, NR, PANELS_PER_JOB};
    use crate::simd::SendPtr;

    /// Rows per tile, at most: 8 rows by 3 panels are 24 accumulators, leaving registers for
    /// the panel loads and the broadcast (measured on Zen 4: tiles of 12 rows by 2 panels run
    /// at the same rate, 6 rows by 4 slower).
    pub const MR: usize = 8;
    /// `k` per block: a group's panels (3 x 16 KiB at 8 rows) stay in L1 and L2 while its row
    /// tiles pass (blocks of 128 measured 5-10% slower at 32 and 64 rows).
    const KC: usize = 256;
    /// Rows of `x` per block.
    const MC: usize = 96;

    /// Panels per tile of `r` rows: as many as keep `r` x panels accumulators within 24 of the
    /// 32 vector registers (at most 4).
    fn max_panels(r: usize) -> usize {
        (24 / r.max(1)).clamp(1, 4)
    }

    /// One tile: `r` rows of `x` from column `k0` times up to four panels' `kc` steps.
    struct Tile<'a> {
        /// From the tile's first element: row `a`, step `s` at `a * ldx + s`, or with `xt` at
        /// `s * ldx + a`.
        x: &'a [f32],
        ldx: usize,
        panels: [&'a [Line]; 4],
        y: *mut f32,
        ldy: usize,
        cols: usize,
        first: bool,
        /// Lines to ask for while the tile computes: slices of equal length (or empty, at the
        /// end), taken step by step across the slices.
        prefetch: [&'a [Line]; 4],
    }

    /// `y = x @ w^T` (or `+=`), as `super::product` promises, on AVX-512F.
    pub fn product(x: &[f32], xv: XView, w: &PackedMatrix, y: &mut [f32], acc: bool) {
        let (m, n, k, xt) = (xv.m, w.n, w.k, xv.xt);
        let panels = n.div_ceil(NR);
        let out = SendPtr(y.as_mut_ptr());
        panel_jobs(panels, 2 * PANELS_PER_JOB, m * n * k, |p0, p1| {
            for i0 in (0..m).step_by(MC) {
                let i1 = (i0 + MC).min(m);
                // the block's row tiles: as even a split as tiles of at most MR rows allow
                let count = (i1 - i0).div_ceil(MR);
                let rows = |t: usize| (i1 - i0) / count + usize::from(t < (i1 - i0) % count);
                // the job's panels in groups as even as groups of at most g allow (4 panels
                // are 2 + 2, not 3 + 1: a one-panel tile reloads each broadcast for one FMA)
                let g = (0..count).map(|t| max_panels(rows(t))).min().unwrap_or(1);
                let groups = (p1 - p0).div_ceil(g);
                let size = |j: usize| (p1 - p0) / groups + usize::from(j < (p1 - p0) % groups);
                for k0 in (0..k).step_by(KC) {
                    let kc = KC.min(k - k0);
                    let mut p = p0;
                    for j in 0..groups {
                        let gp = size(j);
                        // the lines read next, spread over this group's row tiles: the next
                        // group of this `k` block, else the first group of the next block, else
                        // the first group of the next row block, else the next job's first
                        // panels (the pool usually hands a worker consecutive jobs)
                        let (next, nk0) = if j + 1 < groups {
                            (p + gp..p + gp + size(j + 1), k0)
                        } else if k0 + KC < k {
                            (p0..p0 + size(0), k0 + KC)
                        } else if i1 < m {
                            (p0..p0 + size(0), 0)
                        } else {
                            (p1..(p1 + size(0)).min(panels), 0)
                        };
                        // at most this block's `kc` steps of them (a short last block asks for
                        // part of the next one), so that each step asks for at most four lines
                        let nkc = KC.min(k - nk0).min(kc);
                        let share = nkc.div_ceil(count);
                        let mut i = i0;
                        for t in 0..count {
                            let r = rows(t);
                            let (s0, s1) = ((t * share).min(nkc), ((t + 1) * share).min(nkc));
                            let lines = |q: usize| -> &[Line] {
                                if q < gp {
                                    &w.panel(p + q)[k0..k0 + kc]
                                } else {
                                    &[]
                                }
                            };
                            let ahead = |q: usize| -> &[Line] {
                                if next.start + q < next.end {
                                    &w.panel(next.start + q)[nk0 + s0..nk0 + s1]
                                } else {
                                    &[]
                                }
                            };
                            let tile = Tile {
                                x: &x[xv.at(i, k0)..],
                                ldx: xv.ld(),
                                panels: [0, 1, 2, 3].map(lines),
                                // SAFETY: rows i..i + r and the group's columns are inside y
                                // (m x n); each job writes only its own panels' columns.
                                y: unsafe { out.get().add(i * n + p * NR) },
                                ldy: n,
                                cols: (n - p * NR).min(gp * NR),
                                first: k0 == 0 && !acc,
                                prefetch: [0, 1, 2, 3].map(ahead),
                            };
                            run(r, gp, xt, &tile);
                            i += r;
                        }
                        p += gp;
                    }
                }
            }
        });
    }

    fn run(r: usize, p: usize, xt: bool, t: &Tile) {
        macro_rules! dispatch {
            ($(($a:literal, [$($b:literal),*])),*) => {
                match (r, p, xt) {
                    // SAFETY: `super::product_with` checked that the CPU has AVX-512F; the
                    // tile's bounds are the caller's.
                    $($(
                        ($a, $b, false) => unsafe { tile::<$a, $b, false>(t) },
                        ($a, $b, true) => unsafe { tile::<$a, $b, true>(t) },
                    )*)*
                    _ => unreachable!("tile {r} x {p}"),
                }
            };
        }
        dispatch!(
            (8, [3, 2, 1]),
            (7, [3, 2, 1]),
            (6, [4, 3, 2, 1]),
            (5, [4, 3, 2, 1]),
            (4, [4, 3, 2, 1]),
            (3, [4, 3, 2, 1]),
            (2, [4, 3, 2, 1]),
            (1, [4, 3, 2, 1])
        );
    }

    /// `R` rows by `P` panels: `R x P` accumulators over the block's `k` steps, each lane one
    /// multiply-add chain (the same chain as every other kernel).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile<const R: usize, const P: usize, const XT: bool>(t: &Tile) {
        let kc = t.panels[0].len();
        // the columns of each panel this tile owns (the matrix's last panel may be short)
        let mask = |q: usize| -> __mmask16 {
            let c = t.cols.saturating_sub(q * NR).min(NR);
            ((1u32 << c) - 1) as __mmask16
        };
        let mut acc = [[_mm512_setzero_ps(); P]; R];
        if !t.first {
            for (a, row) in acc.iter_mut().enumerate() {
                for (q, v) in row.iter_mut().enumerate() {
                    // SAFETY: the masked columns of row a are inside y (see `product`); the
                    // others are not read.
                    *v = unsafe { _mm512_maskz_loadu_ps(mask(q), t.y.add(a * t.ldy + q * NR)) };
                }
            }
        }
        let xp = t.x.as_ptr();
        assert!(t.x.len() >= super::x_extent(XT, R, kc, t.ldx));
        // the prefetches trickle at the fewest lines per step that finish them within the
        // block, round the panels (step s of each, then s + 1): a burst of misses fills the
        // queue that the block's own loads wait in
        let pf = t.prefetch;
        let np = pf.iter().filter(|l| !l.is_empty()).count();
        let per = pf[0].len();
        let rate = (np * per).div_ceil(kc);
        let (mut pq, mut ps) = (0, 0);
        for s in 0..kc {
            for _ in 0..rate {
                if ps < per {
                    crate::simd::prefetch(pf[pq][ps].0.as_ptr());
                    pq += 1;
                    if pq == np {
                        (pq, ps) = (0, ps + 1);
                    }
                }
            }
            let mut b = [_mm512_setzero_ps(); P];
            for (q, v) in b.iter_mut().enumerate() {
                // SAFETY: a line holds 16 f32s, 64-byte aligned.
                *v = unsafe { _mm512_load_ps(t.panels[q][s].0.as_ptr()) };
            }
            for (a, row) in acc.iter_mut().enumerate() {
                let at = if XT { s * t.ldx + a } else { a * t.ldx + s };
                // SAFETY: at < x.len() (asserted above).
                let xv = _mm512_set1_ps(unsafe { *xp.add(at) });
                for (v, bv) in row.iter_mut().zip(&b) {
                    *v = _mm512_fmadd_ps(xv, *bv, *v);
                }
            }
        }
        for (a, row) in acc.iter().enumerate() {
            for (q, v) in row.iter().enumerate() {
                // SAFETY: as for the loads above.
                unsafe { _mm512_mask_storeu_ps(t.y.add(a * t.ldy + q * NR), mask(q), *v) };
            }
        }
    }
}

#[cfg(test)]
mod tests;
