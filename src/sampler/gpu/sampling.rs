//! The GPU half of sampling: `kernels/sampling.cu` picks each logits row's best candidates on the
//! device, and only those (k ids and values per row, plus the row's max and sum of exps) cross to
//! the host, where [`crate::sampler::sampling::sample_candidates`] finishes the draw with the
//! CPU sampler's code. Knows nothing of sequences or RNGs.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::{bail, DType, Result, Tensor};

use crate::cuda::kernels::{checked, module_fn, slice_ptr, tensor_ptr, SAMPLING_PTX};
use crate::sampler::sampling::{CandidateRow, MAX_CANDIDATES};

/// How the rows of a launch rank their values.
#[derive(Debug, Clone, PartialEq)]
pub enum Temperatures {
    /// Every row alike: greedy (the sanitized logits), or the logits divided by `temperature`.
    One { greedy: bool, temperature: f32 },
    /// Each row its own (rows of requests with their own settings): 0 for a greedy row. One
    /// upload of the values.
    PerRow(Vec<f32>),
}

/// The best `k` candidates of every row of `logits` (N, vocab), f32 or bf16 on a CUDA device,
/// each row ranked as `temperatures` says.
pub fn top_candidates(
    logits: &Tensor,
    k: usize,
    temperatures: &Temperatures,
) -> Result<Vec<CandidateRow>> {
    let (n, vocab) = logits.dims2()?;
    if k == 0 || k > MAX_CANDIDATES {
        bail!("top_candidates: k = {k} (1..={MAX_CANDIDATES})");
    }
    if let Temperatures::PerRow(t) = temperatures {
        if t.len() != n {
            bail!("top_candidates: {} temperatures for {n} rows", t.len());
        }
    }
    let logits = logits.contiguous()?;
    let dev = logits.device().as_cuda_device()?.clone();
    let name = match logits.dtype() {
        DType::F32 => "top_candidates_f32",
        DType::BF16 => "top_candidates_bf16",
        other => bail!("top_candidates: {other:?} logits"),
    };
    let f = module_fn(&dev, name, "selfdistill_sampling", SAMPLING_PTX)?;
    let ids = dev.alloc_zeros::<u32>(n * k)?;
    let vals = dev.alloc_zeros::<f32>(n * k)?;
    let raw = dev.alloc_zeros::<f32>(n * k)?;
    let count = dev.alloc_zeros::<u32>(n)?;
    let max = dev.alloc_zeros::<f32>(n)?;
    let sum = dev.alloc_zeros::<f32>(n)?;
    let (lp, ip, vp, rp, cp, mp, sp) = (
        tensor_ptr(&logits)?,
        slice_ptr(&dev, &ids),
        slice_ptr(&dev, &vals),
        slice_ptr(&dev, &raw),
        slice_ptr(&dev, &count),
        slice_ptr(&dev, &max),
        slice_ptr(&dev, &sum),
    );
    let stream = dev.cuda_stream();
    let (greedy, temperature, per_row) = match temperatures {
        Temperatures::One {
            greedy,
            temperature,
        } => (*greedy, *temperature, None),
        Temperatures::PerRow(t) => {
            let up = stream
                .clone_htod(t)
                .map_err(|e| candle_core::Error::Msg(format!("copy to the device: {e:?}")))?;
            (false, 0.0, Some(up))
        }
    };
    // a null pointer: the launch's temperature for every row
    let tp = per_row.as_ref().map_or(0, |t| slice_ptr(&dev, t));
    let (vocab_i, k_i, greedy_i) = (vocab as i32, k as i32, greedy as i32);
    let mut b = stream.launch_builder(&f);
    b.arg(&lp)
        .arg(&vocab_i)
        .arg(&k_i)
        .arg(&greedy_i)
        .arg(&temperature)
        .arg(&tp)
        .arg(&ip)
        .arg(&vp)
        .arg(&rp)
        .arg(&cp)
        .arg(&mp)
        .arg(&sp);
    let cfg = LaunchConfig {
        grid_dim: (n as u32, 1, 1),
        block_dim: (1024, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match `top_candidates_*` in kernels/sampling.cu; the buffers live
    // until the copies below, which wait for the kernel on the same stream.
    checked(unsafe { b.launch(cfg) })?;
    let (ids, count) = (to_host(&stream, &ids)?, to_host(&stream, &count)?);
    let (vals, raw) = (to_host(&stream, &vals)?, to_host(&stream, &raw)?);
    let (max, sum) = (to_host(&stream, &max)?, to_host(&stream, &sum)?);
    Ok((0..n)
        .map(|r| {
            let c = (count[r] as usize).min(k);
            let span = r * k..r * k + c;
            CandidateRow {
                ids: ids[span.clone()].to_vec(),
                values: vals[span.clone()].to_vec(),
                raw: raw[span].to_vec(),
                max: max[r],
                sum_exp: f64::from(sum[r]),
            }
        })
        .collect())
}

fn to_host<T: DeviceRepr>(stream: &Arc<CudaStream>, s: &CudaSlice<T>) -> Result<Vec<T>> {
    stream
        .clone_dtoh(s)
        .map_err(|e| candle_core::Error::Msg(format!("copy to host: {e:?}")))
}
