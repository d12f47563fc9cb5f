//! The candle pieces the layer ops of [`super::layer_ops::candle_ops`] are built from (RMS norm,
//! RoPE, the SwiGLU product, the projections), with the one decision of which implementation
//! runs where ([`OpPath`]), each adding the candle operations it issues to a [`Cost`].
//!
//! The model runs on three paths, and each op has one definition per path:
//! - **differentiable** ([`Exec::Differentiable`]): training and the references tests compare
//!   against. f32 on the CPU runs the single ops with hand-written backward passes of
//!   [`super::diff_ops`] and [`super::host_linear`]; other devices and dtypes compose candle ops,
//!   each of which records its backward.
//! - **composed** ([`Exec::Composed`]): the device-generic differentiable path, elementary candle
//!   ops everywhere, on the CPU too: what a GPU trains through, run on the CPU behind
//!   `[train] ops = "generic"` so that the tests check the GPU's code against PyTorch.
//! - **sampling on a device** ([`Exec::Sampling`]): candle's fused kernels, which record no
//!   backward pass (a model trained through them would get zero gradients upstream, silently).
//! - **sampling on the CPU host path**: [`super::layer_ops::host_ops`] over packed weights and
//!   plain buffers, with the row ops of [`super::packed`]; nothing here runs there.
//!
//! Knows nothing of layer kinds or weights' names.

use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::{Linear, VarBuilder};

use super::config::{Activation, LayerKind, ModelConfig, RopeParams, RopeScaling};
use super::cost::Cost;

/// How the candle path computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exec {
    /// Every op records a backward pass; our CPU ops where they exist (f32 on the CPU).
    Differentiable,
    /// Every op records a backward pass, composed from candle's elementary ops on every device.
    Composed,
    /// candle's fused kernels (no backward pass): sampling.
    Sampling,
}

/// The implementation an op runs.
enum OpPath {
    /// candle's fused kernel.
    Fused,
    /// Our single CPU op with its own backward (f32 on the CPU).
    HostDifferentiable,
    /// Elementary candle ops, on any device.
    Composed,
}

/// Rows of the 2-D `table` at the 1-D u32 `ids`, as one (ids, cols) tensor: candle's
/// `index_select` (and its gradient), or when sampling on a GPU our gather
/// ([`crate::cuda::rows::gather`]), the same copy without candle's upload of the index layout.
/// Either way one kernel into a new buffer.
pub fn pick_rows(table: &Tensor, ids: &Tensor, exec: Exec) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if exec == Exec::Sampling && table.device().is_cuda() {
        if let Some(t) = crate::cuda::rows::gather(table, ids)? {
            return Ok(t);
        }
    }
    let _ = exec;
    table.index_select(ids, 0)
}

/// The one place that picks an op's implementation for `x` under `exec`.
fn path(x: &Tensor, exec: Exec) -> OpPath {
    match exec {
        Exec::Sampling => OpPath::Fused,
        Exec::Differentiable if super::diff_ops::supported(x) => OpPath::HostDifferentiable,
        Exec::Differentiable | Exec::Composed => OpPath::Composed,
    }
}

/// RMS norm: `x / sqrt(mean(x^2) + eps) * s`, over the last dim, where the scale `s` is the
/// weight `w`, or `1 + w` for a zero-centred norm (Qwen3.5's).
#[derive(Debug, Clone)]
pub struct RmsNorm {
    pub(super) weight: Tensor,
    pub(super) eps: f64,
    /// Zero-centred: the scale is `1 + w`.
    pub(super) offset: bool,
}

impl RmsNorm {
    pub(super) fn new(size: usize, eps: f64, offset: bool, vb: VarBuilder) -> Result<Self> {
        Ok(RmsNorm {
            weight: vb.get(size, "weight")?,
            eps,
            offset,
        })
    }

    /// For sampling: the scale computed once and kept as the weight (a zero-centred norm's
    /// `1 + w` was an op per call). Not for training: the weight is no longer the variable.
    pub(super) fn freeze_scale(&mut self) -> Result<()> {
        if self.offset {
            self.weight = self.weight.affine(1.0, 1.0)?;
            self.offset = false;
        }
        Ok(())
    }

    /// The scale the normed values are multiplied by (differentiable in the weight).
    pub(super) fn scale(&self) -> Result<Tensor> {
        if self.offset {
            self.weight.affine(1.0, 1.0)
        } else {
            Ok(self.weight.clone())
        }
    }

    pub fn forward(&self, x: &Tensor, exec: Exec) -> Result<Tensor> {
        self.forward_counted(x, exec, &mut Cost::default())
    }

    /// [`Self::forward`], adding the candle operations it issues to `spent`.
    pub(super) fn forward_counted(
        &self,
        x: &Tensor,
        exec: Exec,
        spent: &mut Cost,
    ) -> Result<Tensor> {
        let w = self.scale()?;
        *spent += Cost::kernels(u64::from(self.offset));
        match path(x, exec) {
            OpPath::Fused => {
                *spent += Cost::kernels(1);
                candle_nn::ops::rms_norm(x, &w, self.eps as f32)
            }
            OpPath::HostDifferentiable => {
                *spent += Cost::kernels(1);
                super::diff_ops::rms_norm(x, &w, self.eps)
            }
            OpPath::Composed => {
                // in f32 whatever the input's dtype, as transformers computes it: square, sum,
                // mean, + eps, sqrt, divide, scale, and the two casts below f32
                let dtype = x.dtype();
                *spent += Cost::kernels(7 + 2 * u64::from(dtype != DType::F32));
                let x = x.to_dtype(DType::F32)?;
                let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
                let x = x.broadcast_div(&(ms + self.eps)?.sqrt()?)?;
                x.to_dtype(dtype)?.broadcast_mul(&w)
            }
        }
    }
}

/// RoPE tables, (max_positions, D/2) each, gathered by position per token.
#[derive(Debug, Clone)]
pub(super) struct Rope {
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    /// The tables of RoPE `p` in `dtype` (the model's), computed in f32 as Hugging Face does,
    /// for the `rotary_dim` leading dims of a head.
    pub(super) fn new(
        cfg: &ModelConfig,
        p: RopeParams,
        device: &Device,
        dtype: DType,
    ) -> Result<Self> {
        let d = cfg.rotary_dim;
        let inv_freq: Vec<f32> = (0..d / 2)
            .map(|i| {
                let f = 1.0 / p.theta.powf(2.0 * i as f64 / d as f64);
                scale_frequency(f, p.scaling) as f32
            })
            .collect();
        let n = cfg.max_position_embeddings;
        let inv = Tensor::from_vec(inv_freq, (1, d / 2), device)?;
        let t = Tensor::arange(0u32, n as u32, device)?
            .to_dtype(DType::F32)?
            .reshape((n, 1))?;
        let freqs = t.matmul(&inv)?; // (n, D/2)
        Ok(Rope {
            cos: freqs.cos()?.to_dtype(dtype)?,
            sin: freqs.sin()?.to_dtype(dtype)?,
        })
    }

    /// The cos and sin rows of each token's position: (T, D/2) each.
    fn rows(&self, positions: &Tensor, exec: Exec) -> Result<(Tensor, Tensor)> {
        Ok((
            pick_rows(&self.cos, positions, exec)?,
            pick_rows(&self.sin, positions, exec)?,
        ))
    }
}

/// A model's RoPE tables: the one every layer uses, and the sliding-window layers' own when it
/// differs (Gemma 3).
#[derive(Debug, Clone)]
pub(super) struct Ropes {
    full: Rope,
    sliding: Option<Rope>,
}

impl Ropes {
    pub(super) fn new(cfg: &ModelConfig, device: &Device, dtype: DType) -> Result<Self> {
        let sliding = cfg.layer_kinds.contains(&LayerKind::SlidingAttention);
        let of = |kind| Rope::new(cfg, cfg.rope_of(kind), device, dtype);
        Ok(Ropes {
            full: of(LayerKind::Attention)?,
            sliding: (sliding && cfg.sliding_rope.is_some())
                .then(|| of(LayerKind::SlidingAttention))
                .transpose()?,
        })
    }
}

/// A step's RoPE rows of each table, gathered once and shared by the layers.
pub struct StepRope {
    full: RopeRows,
    sliding: Option<RopeRows>,
}

impl StepRope {
    /// The rows of `positions` for the ops of `exec`; the candle operations it issues added to
    /// `spent`.
    pub(super) fn new(
        ropes: &Ropes,
        positions: &Tensor,
        exec: Exec,
        spent: &mut Cost,
    ) -> Result<Self> {
        Ok(StepRope {
            full: RopeRows::new(&ropes.full, positions, exec, spent)?,
            sliding: ropes
                .sliding
                .as_ref()
                .map(|r| RopeRows::new(r, positions, exec, spent))
                .transpose()?,
        })
    }

    /// The rows a layer of `kind` rotates with.
    pub fn of(&self, kind: LayerKind) -> &RopeRows {
        match (kind, &self.sliding) {
            (LayerKind::SlidingAttention, Some(s)) => s,
            _ => &self.full,
        }
    }
}

/// Per-step RoPE tables of one [`Rope`], gathered once and shared by the layers that use it.
pub struct RopeRows {
    /// (T, D/2), for the fused kernel.
    cos: Tensor,
    sin: Tensor,
    /// (T, 1, D) = [cos, cos] and [sin, sin], for the composed path (none for sampling).
    full: Option<(Tensor, Tensor)>,
    /// `cos`, `sin` as host values, for the packed CPU layers (f32 on the CPU only).
    pub(super) host: Option<(Vec<f32>, Vec<f32>)>,
}

impl RopeRows {
    pub(super) fn new(
        rope: &Rope,
        positions: &Tensor,
        exec: Exec,
        spent: &mut Cost,
    ) -> Result<Self> {
        let (cos, sin) = rope.rows(positions, exec)?;
        *spent += Cost::kernels(2);
        let full = if exec == Exec::Sampling {
            None
        } else {
            *spent += cat_cost(2) * 2;
            let full = |x: &Tensor| Tensor::cat(&[x, x], D::Minus1)?.unsqueeze(1);
            Some((full(&cos)?, full(&sin)?))
        };
        let host = if cos.device().is_cpu() && cos.dtype() == DType::F32 {
            Some((cos.flatten_all()?.to_vec1()?, sin.flatten_all()?.to_vec1()?))
        } else {
            None
        };
        Ok(RopeRows {
            host,
            cos,
            sin,
            full,
        })
    }

    /// The step's cos and sin rows, (T, R/2) each in the model's dtype (R: the rotated dims).
    pub(super) fn tables(&self) -> (&Tensor, &Tensor) {
        (&self.cos, &self.sin)
    }

    /// x: (T, H, D) -> rotated x (the Hugging Face `rotate_half` layout). With partial RoPE
    /// (tables narrower than D) the leading dims rotate and the rest pass through.
    /// The candle operations it issues are added to `spent`.
    pub(super) fn apply_counted(&self, x: &Tensor, exec: Exec, spent: &mut Cost) -> Result<Tensor> {
        let (d, r) = (x.dim(D::Minus1)?, 2 * self.cos.dim(D::Minus1)?);
        if r < d {
            // the rotated part copied out, rotated, and joined to the rest
            let lead = x.narrow(D::Minus1, 0, r)?;
            *spent += copy_cost(&lead) + cat_cost(2);
            let rotated = self.apply_counted(&lead.contiguous()?, exec, spent)?;
            return Tensor::cat(&[&rotated, &x.narrow(D::Minus1, r, d - r)?], D::Minus1);
        }
        match path(x, exec) {
            OpPath::Fused => {
                // (T, H, D) -> (1, T, H, D) for the fused kernel.
                *spent += copy_cost(x) + Cost::kernels(1);
                let x = x.contiguous()?.unsqueeze(0)?;
                candle_nn::rotary_emb::rope_thd(&x, &self.cos, &self.sin)?.squeeze(0)
            }
            OpPath::HostDifferentiable => {
                *spent += Cost::kernels(1);
                super::diff_ops::rope(x, &self.cos, &self.sin)
            }
            OpPath::Composed => {
                // neg, the halves joined, two products and their sum
                *spent += Cost::kernels(4) + cat_cost(2);
                let half = x.dim(D::Minus1)? / 2;
                let x1 = x.narrow(D::Minus1, 0, half)?;
                let x2 = x.narrow(D::Minus1, half, half)?;
                let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
                let Some((cos, sin)) = &self.full else {
                    candle_core::bail!(
                        "RoPE rows gathered for sampling, applied on the composed path"
                    )
                };
                x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?
            }
        }
    }
}

/// A frequency under `scaling`: Llama 3.1's by wavelength, or linear (identity without one).
fn scale_frequency(freq: f64, scaling: Option<RopeScaling>) -> f64 {
    let s = match scaling {
        None => return freq,
        Some(RopeScaling::Linear(factor)) => return freq / factor,
        Some(RopeScaling::Llama3(s)) => s,
    };
    let wavelen = 2.0 * std::f64::consts::PI / freq;
    let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
    let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
    if wavelen < high_wavelen {
        freq
    } else if wavelen > low_wavelen {
        freq / s.factor
    } else {
        let smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor)
            / (s.high_freq_factor - s.low_freq_factor);
        (1.0 - smooth) * freq / s.factor + smooth * freq
    }
}

/// `act(g) * u`: SwiGLU, or GeGLU with tanh-approximated GELU (our CPU op, or candle's
/// `gelu`, whose backward the composed path records).
pub(super) fn gated(
    g: &Tensor,
    u: &Tensor,
    act: Activation,
    exec: Exec,
    spent: &mut Cost,
) -> Result<Tensor> {
    let fused_op = matches!(path(g, exec), OpPath::HostDifferentiable);
    *spent += Cost::kernels(if fused_op { 1 } else { 2 });
    match (act, path(g, exec)) {
        (Activation::Silu, OpPath::HostDifferentiable) => super::diff_ops::swiglu(g, u),
        (Activation::Silu, OpPath::Fused | OpPath::Composed) => candle_nn::ops::silu(g)? * u,
        (Activation::GeluTanh, OpPath::HostDifferentiable) => super::diff_ops::geglu(g, u),
        (Activation::GeluTanh, OpPath::Fused | OpPath::Composed) => g.gelu()? * u,
    }
}

/// `l(x)`: on the packed CPU gemm (with its backward) for f32 on the CPU on the differentiable
/// path, else candle's; the candle operations it issues added to `spent`.
pub(super) fn project_counted(
    l: &Linear,
    x: &Tensor,
    exec: Exec,
    spent: &mut Cost,
) -> Result<Tensor> {
    *spent += Cost::kernels(u64::from(l.bias().is_some()));
    if exec == Exec::Sampling
        || (exec == Exec::Composed || !super::host_linear::supported(x)) && x.rank() != 2
    {
        // candle's Linear: a (B, T, K) input is viewed as rows when contiguous
        *spent += Cost::kernels(1);
        return l.forward(x);
    }
    let y = if exec == Exec::Composed || !super::host_linear::supported(x) {
        *spent += matmul_cost(x);
        matmul(x, &l.weight().t()?)?
    } else {
        *spent += Cost::kernels(1);
        super::host_linear::linear(x, l.weight())?
    };
    match l.bias() {
        Some(b) => y.broadcast_add(b),
        None => Ok(y),
    }
}

/// What [`matmul`] issues for `a`: one product, or on a CPU in bf16 the two casts in, the
/// product and the cast out.
pub fn matmul_cost(a: &Tensor) -> Cost {
    Cost::kernels(if a.device().is_cpu() && a.dtype() == DType::BF16 {
        4
    } else {
        1
    })
}

/// A copy into a new contiguous buffer when `x` is not contiguous (`contiguous`, and `reshape`
/// of a strided view), else nothing.
pub(super) fn copy_cost(x: &Tensor) -> Cost {
    Cost::kernels(u64::from(!x.is_contiguous()))
}

/// `Tensor::cat` of `parts` tensors: one new buffer, a copy launched per part.
pub const fn cat_cost(parts: u64) -> Cost {
    Cost {
        launches: parts,
        allocations: 1,
        host_to_device: 0,
        device_to_host: 0,
        syncs: 0,
    }
}

/// `a @ b`, differentiable. bf16 on the CPU (whose gemm has none) computes as a GPU's bf16 GEMM
/// does: exact f32 products of the bf16 inputs, summed in f32, the result rounded to bf16; so
/// the device-generic path runs in bf16 on the CPU too, and its tests check the GPU's recipe.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if a.device().is_cpu() && a.dtype() == DType::BF16 {
        return a
            .to_dtype(DType::F32)?
            .matmul(&b.to_dtype(DType::F32)?)?
            .to_dtype(DType::BF16);
    }
    a.matmul(b)
}

/// The sum of every element of `x` as a scalar tensor, in two levels: rows of [`SUM_ROW`]
/// summed in parallel, then the row sums. candle's CUDA reduction gives each output element one
/// thread block, so its `sum_all` of a 16M-element slice ran on one SM of 132: the optimizer's
/// statistics alone took 9 s of a Qwen3-4B step. Not differentiable (statistics, norms).
pub fn sum_all_wide(x: &Tensor) -> Result<Tensor> {
    let flat = x.flatten_all()?;
    let n = flat.elem_count();
    if n < 2 * SUM_ROW {
        return flat.sum_all();
    }
    let rows = n / SUM_ROW;
    let body = flat
        .narrow(0, 0, rows * SUM_ROW)?
        .reshape((rows, SUM_ROW))?
        .sum(1)?;
    let body = sum_all_wide(&body)?;
    if rows * SUM_ROW == n {
        return Ok(body);
    }
    body + flat
        .narrow(0, rows * SUM_ROW, n - rows * SUM_ROW)?
        .sum_all()?
}

/// What [`sum_all_wide`] of `n` elements issues.
pub fn sum_all_wide_cost(n: usize) -> Cost {
    if n < 2 * SUM_ROW {
        return Cost::kernels(1);
    }
    let rows = n / SUM_ROW;
    let tail = if rows * SUM_ROW == n { 0 } else { 2 }; // the tail's sum, added
    Cost::kernels(1 + tail) + sum_all_wide_cost(rows)
}

/// Values on the device (scalars, or vectors of partial sums), read back together in order:
/// one wait for the device (none when there are none). What it issues beyond the copies its
/// callers declare (one per tensor) is [`READ_BACK`].
pub fn read_back(sums: &[Tensor]) -> Result<Vec<f32>> {
    match sums {
        [] => Ok(Vec::new()),
        // candle's cat of one is the tensor itself: copy it, as a cat copies each
        [one] => one
            .flatten_all()?
            .copy()?
            .to_dtype(DType::F32)?
            .to_vec1::<f32>(),
        _ => {
            let flat = sums
                .iter()
                .map(Tensor::flatten_all)
                .collect::<Result<Vec<_>>>()?;
            Tensor::cat(&flat, 0)?
                .to_dtype(DType::F32)?
                .to_vec1::<f32>()
        }
    }
}

/// What [`read_back`] issues once, besides a copy per scalar: the buffer they are copied into,
/// and the download that waits for the device.
pub const READ_BACK: Cost = Cost {
    launches: 0,
    allocations: 1,
    host_to_device: 0,
    device_to_host: 1,
    syncs: 1,
};

/// Elements per row of [`sum_all_wide`]'s first level.
const SUM_ROW: usize = 1024;

pub(super) fn linear(i: usize, o: usize, bias: bool, vb: VarBuilder) -> Result<Linear> {
    if bias {
        candle_nn::linear(i, o, vb)
    } else {
        candle_nn::linear_no_bias(i, o, vb)
    }
}

/// One matrix from projections that read the same input: the weights (and biases, if all have
/// them) stacked by output rows. Returns it and the parts as views into it.
pub(super) fn stack_linears(parts: &[&Linear]) -> Result<(Linear, Vec<Linear>)> {
    let weights: Vec<&Tensor> = parts.iter().map(|l| l.weight()).collect();
    let w = Tensor::cat(&weights, 0)?;
    let b = match parts.iter().map(|l| l.bias()).collect::<Option<Vec<_>>>() {
        Some(bs) if !bs.is_empty() => Some(Tensor::cat(&bs, 0)?),
        _ => None,
    };
    let mut views = Vec::with_capacity(parts.len());
    let mut start = 0;
    for l in parts {
        let n = l.weight().dim(0)?;
        let bias = b.as_ref().map(|b| b.narrow(0, start, n)).transpose()?;
        views.push(Linear::new(w.narrow(0, start, n)?, bias));
        start += n;
    }
    Ok((Linear::new(w, b), views))
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    /// The two-level sum equals the f64 sum for lengths below, at and around its row size and
    /// for a 16M-element slice with a remainder.
    #[test]
    fn the_wide_sum_equals_the_plain_sum() {
        for n in [1, 5, 2047, 2048, 2049, 1 << 20, (1 << 24) + 7] {
            let v: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 - 48.0) / 7.0).collect();
            let want: f64 = v.iter().map(|&x| f64::from(x)).sum();
            let t = Tensor::from_vec(v, n, &Device::Cpu).unwrap();
            let got = f64::from(super::sum_all_wide(&t).unwrap().to_scalar::<f32>().unwrap());
            let tol = 1e-6 * (n as f64).max(1.0);
            assert!((got - want).abs() <= tol, "n {n}: {got} vs {want}");
        }
    }
}
