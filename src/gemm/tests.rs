//! Tests of [`super`] (`gemm.rs`).

use super::*;

fn data(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (((i * 7 + seed) * 2_654_435_761) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

/// The order every kernel must keep: one fused multiply-add chain over `k` from zero.
fn chain(x: &[f32], w: &[f32]) -> f32 {
    x.iter().zip(w).fold(0f32, |acc, (a, b)| a.mul_add(*b, acc))
}

/// Every kernel this CPU runs (the AVX-512 one too, where it has it), on shapes that reach
/// each tile size, short last panels and tiles, several `k` blocks and several row blocks.
#[test]
fn matmul_is_the_fma_chain_and_each_row_is_bitwise_independent_of_the_batch() {
    let mm = |kern: Kernel, x: &[f32], m: usize, w: &PackedMatrix, y: &mut [f32]| {
        product_with(kern, x, XLayout::Rows, m, w, y, false)
    };
    for kern in Kernel::available() {
        for &(m, n, k) in &[
            (1, 300, 70),
            (7, 1000, 256),
            (37, 257, 203),
            (70, 100, 40),
            (3, 33, 300),
            (100, 50, 1),
            (13, 16, 129),
            (32, 520, 600),
            (23, 49, 17),
            // jobs of many panels whatever the thread count: groups of 4 panels (6 rows),
            // of 3 (8 rows), and the prefetch of each next group
            (6, 12_300, 9),
            (8, 12_300, 9),
            (2, 12_300, 5),
        ] {
            let (x, w) = (data(m * k, 1), data(n * k, 2));
            let packed = PackedMatrix::pack(&w, n, k);
            let mut y = vec![f32::NAN; m * n];
            mm(kern, &x, m, &packed, &mut y);
            for i in 0..m {
                // the same row alone, and inside another batch at another index
                let mut alone = vec![0f32; n];
                mm(kern, &x[i * k..(i + 1) * k], 1, &packed, &mut alone);
                let mut other = data(5 * k, 3);
                other[2 * k..3 * k].copy_from_slice(&x[i * k..(i + 1) * k]);
                let mut y5 = vec![0f32; 5 * n];
                mm(kern, &other, 5, &packed, &mut y5);
                for j in 0..n {
                    let want = chain(&x[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]);
                    let got = y[i * n + j];
                    let at = format!("{kern:?} {m}x{n}x{k} ({i}, {j})");
                    assert_eq!(got.to_bits(), want.to_bits(), "{at}");
                    assert_eq!(got.to_bits(), alone[j].to_bits(), "{at} alone");
                    assert_eq!(got.to_bits(), y5[2 * n + j].to_bits(), "{at} in 5");
                }
            }
        }
    }
}

#[test]
fn the_best_kernel_is_the_widest_this_cpu_runs() {
    let avail = Kernel::available();
    assert_eq!(avail.last(), Some(&Kernel::Portable));
    assert!(avail.iter().all(|k| k.runs()));
    if std::env::var_os("SELFDISTILL_GEMM").is_none() {
        assert_eq!(Kernel::best(), avail[0]);
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        assert_eq!(avail[0], Kernel::Avx512);
    }
}

#[test]
fn portable_tiles_give_the_avx2_bits_and_rows_unpack() {
    let (m, n, k) = (9, 70, 300);
    let (x, w) = (data(m * k, 4), data(n * k, 5));
    let packed = PackedMatrix::pack(&w, n, k);
    for j in [0, 15, 16, 69] {
        assert_eq!(packed.row(j), &w[j * k..(j + 1) * k]);
    }
    let mut y = vec![0f32; m * n];
    matmul(&x, m, &packed, &mut y);
    // the portable tiles over the same blocking
    let mut z = vec![0f32; m * n];
    for k0 in (0..k).step_by(KC) {
        let kc = KC.min(k - k0);
        for p in 0..n.div_ceil(NR) {
            let t = Tile {
                x: &x[k0..],
                ldx: k,
                xt: false,
                panels: [&packed.panel(p)[k0..k0 + kc], &[], &[]],
                y: z[p * NR..].as_mut_ptr(),
                ldy: n,
                cols: NR.min(n - p * NR),
                first: k0 == 0,
                prefetch: &[],
            };
            portable_tile(m, 1, &t);
        }
    }
    assert!(y.iter().zip(&z).all(|(a, b)| a.to_bits() == b.to_bits()));
}

/// Training's forms: `x` given transposed, a matrix packed from its transpose, and products
/// added to `y`; each is the same multiply-add chain as the plain product, from `y`'s value.
#[test]
fn transposed_operands_and_accumulation_keep_the_chain() {
    for &(m, n, k) in &[(37, 70, 300), (6, 16, 256), (100, 33, 513), (1, 5, 7)] {
        let (x, w) = (data(m * k, 6), data(n * k, 7));
        let xt: Vec<f32> = (0..k * m).map(|i| x[(i % m) * k + i / m]).collect();
        let wt: Vec<f32> = (0..k * n).map(|i| w[(i % n) * k + i / n]).collect();
        let packed = PackedMatrix::pack(&w, n, k);
        let from_t = PackedMatrix::pack_kn(&wt, k, n);
        assert_eq!(packed.bytes(), from_t.bytes());
        for j in 0..n {
            assert_eq!(packed.row(j), from_t.row(j), "{n}x{k} row {j}");
        }
        let y0 = data(m * n, 8);
        for kern in Kernel::available() {
            let mut y = y0.clone();
            product_with(kern, &xt, XLayout::Transposed, m, &from_t, &mut y, true);
            let mut plain = vec![0f32; m * n];
            product_with(kern, &x, XLayout::Rows, m, &packed, &mut plain, false);
            let mut transposed = vec![0f32; m * n];
            product_with(
                kern,
                &xt,
                XLayout::Transposed,
                m,
                &packed,
                &mut transposed,
                false,
            );
            for i in 0..m {
                for j in 0..n {
                    let (xr, wr) = (&x[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]);
                    let from = xr
                        .iter()
                        .zip(wr)
                        .fold(y0[i * n + j], |acc, (a, b)| a.mul_add(*b, acc));
                    let at = i * n + j;
                    assert_eq!(
                        y[at].to_bits(),
                        from.to_bits(),
                        "{kern:?} {m}x{n}x{k} ({i}, {j})"
                    );
                    assert_eq!(transposed[at].to_bits(), plain[at].to_bits());
                    assert_eq!(plain[at].to_bits(), chain(xr, wr).to_bits());
                }
            }
        }
    }
}
