//! A linear layer `y = x @ w^T` as one candle op whose forward and backward products run on the
//! packed CPU gemm ([`crate::gemm`]), for f32 on the CPU (training).
//!
//! candle's CPU matmul (the `gemm` crate) ran the 50M model's layer products at 110-126 GFLOP/s
//! on two cores, and the LM head's weight gradient (a transposed view) at about 70; the packed
//! gemm takes every operand in the layout it comes in and ran the same products at 113-143. The
//! weight is packed per call (its `n x k` copy is small next to the `m x n x k` product at
//! training's row counts), so the op holds no state between steps.
//!
//! Knows nothing of layers or weights' names: `model::transformer` decides which projections
//! use it.

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use super::cpu_op::{slice, view};
use crate::gemm::{product, PackedMatrix, XLayout};

/// Rows of `x` below which the op is not used (packing the weight would cost about as much as
/// the product; inference on the CPU has its own packed weights anyway).
const MIN_ROWS: usize = 16;

/// Whether [`linear`] runs for `x`: f32 on the CPU, with enough rows.
pub fn supported(x: &Tensor) -> bool {
    super::diff_ops::supported(x)
        && x.dims()
            .last()
            .is_some_and(|&k| k > 0 && x.elem_count() / k >= MIN_ROWS)
}

/// `x @ w^T` over `x`'s last dimension (`x`: (..., k), `w`: (n, k)); differentiable in both.
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op2(&w.contiguous()?, Linear)
}

struct Linear;

/// `(rows, k)` of `x` and `n` of `w`, checked.
fn dims(x: &Layout, w: &Layout) -> Result<(usize, usize, usize)> {
    let &[n, k] = w.dims() else {
        candle_core::bail!("linear: weight of shape {:?}", w.dims())
    };
    if x.dims().last() != Some(&k) {
        candle_core::bail!("linear: input {:?} for weight {:?}", x.dims(), w.dims());
    }
    Ok((x.shape().elem_count() / k, k, n))
}

impl CustomOp2 for Linear {
    fn name(&self) -> &'static str {
        "linear-packed"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, w) = (slice(s1, l1)?, slice(s2, l2)?);
        let (m, k, n) = dims(l1, l2)?;
        let mut y = vec![0f32; m * n];
        crate::gemm::matmul(x, m, &PackedMatrix::pack(w, n, k), &mut y);
        let mut shape = l1.dims().to_vec();
        *shape.last_mut().expect("checked in dims") = n;
        Ok((CpuStorage::F32(y), Shape::from(shape)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let (xg, wg, gg) = (view(x)?, view(w)?, view(&grad)?);
        let (xv, wv, gv) = (xg.get()?, wg.get()?, gg.get()?);
        let (n, k) = w.dims2()?;
        let m = xv.len() / k;
        // dx (m, k) = grad (m, n) @ w: w^T (k, n) packed from w as stored
        let mut dx = vec![0f32; m * k];
        product(
            gv,
            XLayout::Rows,
            m,
            &PackedMatrix::pack_kn(wv, n, k),
            &mut dx,
            false,
        );
        // dw (n, k) = grad^T (n, m) @ x: grad as stored is grad^T transposed, and x^T (k, m)
        // packs from x as stored
        let mut dw = vec![0f32; n * k];
        product(
            gv,
            XLayout::Transposed,
            n,
            &PackedMatrix::pack_kn(xv, m, k),
            &mut dw,
            false,
        );
        Ok((
            Some(Tensor::from_vec(dx, x.shape(), x.device())?),
            Some(Tensor::from_vec(dw, w.shape(), w.device())?),
        ))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor, Var};

    use crate::model::tests::max_abs_diff;

    /// Output and both gradients equal candle's matmul and its backward, for row counts, widths
    /// and depths that are not multiples of the kernels' tiles and blocks, and a 3-d input.
    #[test]
    fn matches_candle_matmul_and_its_gradients() {
        for (xs, n) in [
            (vec![37, 70], 33),
            (vec![2, 20, 300], 16),
            (vec![64, 513], 130),
        ] {
            let k = *xs.last().unwrap();
            let x =
                Var::from_tensor(&Tensor::randn(0f32, 1.0, xs.as_slice(), &Device::Cpu).unwrap())
                    .unwrap();
            let w =
                Var::from_tensor(&Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu).unwrap()).unwrap();
            assert!(super::supported(&x));
            let a = super::linear(&x, &w).unwrap();
            let b = x.broadcast_matmul(&w.t().unwrap()).unwrap();
            assert_eq!(a.dims(), b.dims());
            let scale = (k as f32).sqrt();
            assert!(
                max_abs_diff(&a, &b) < 1e-5 * scale,
                "{xs:?} x {n}: outputs differ"
            );
            let up = Tensor::randn(0f32, 1.0, a.shape(), &Device::Cpu).unwrap();
            let ga = (a * &up).unwrap().sum_all().unwrap().backward().unwrap();
            let gb = (b * &up).unwrap().sum_all().unwrap().backward().unwrap();
            for (name, v) in [("x", &x), ("w", &w)] {
                let (ga, gb) = (ga.get(v).unwrap(), gb.get(v).unwrap());
                let big = max_abs_diff(gb, &gb.zeros_like().unwrap()).max(1.0);
                let d = max_abs_diff(ga, gb) / big;
                assert!(d < 1e-5, "{xs:?} x {n}: gradient of {name} differs by {d}");
            }
        }
    }
}
