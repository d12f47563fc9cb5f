//! The GPU half of sampling: `kernels/sampling.cu` picks each logits row's best candidates on the
//! device, and only those (k ids and values per row, plus the row's max and sum of exps) cross to
//! the host, in one copy ([`super::step_io`]), where
//! [`crate::sampler::sampling::sample_candidates`] finishes the draw with the CPU sampler's code.
//! Knows nothing of sequences or RNGs.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::{bail, DType, Result, Tensor};

use super::step_io::{Staging, StepIo};
use crate::cuda::kernels::{checked, module_fn, tensor_ptr, SAMPLING_PTX};
use crate::sampler::sampling::{CandidateRow, MAX_CANDIDATES};

/// How the rows of a launch rank their values.
#[derive(Debug, Clone, PartialEq)]
pub enum Temperatures {
    /// Every row alike: greedy (the sanitized logits), or the logits divided by `temperature`.
    One { greedy: bool, temperature: f32 },
    /// Each row its own (rows of requests with their own settings): 0 for a greedy row. The
    /// values go up in the step's upload.
    PerRow(Vec<f32>),
}

/// The best `k` candidates of every row of `logits` (N, vocab), f32 or bf16 on a CUDA device,
/// each row ranked as `temperatures` says, on buffers of their own (tests; the sampler's steps
/// use [`top_candidates_with`] on the backend's).
pub fn top_candidates(
    logits: &Tensor,
    k: usize,
    temperatures: &Temperatures,
) -> Result<Vec<CandidateRow>> {
    let dev = logits.device().as_cuda_device()?.clone();
    let mut io = StepIo::new(&dev);
    let mut staging = Staging::new();
    let per_row = match temperatures {
        Temperatures::PerRow(t) => Some(staging.f32s(t.iter().copied())),
        Temperatures::One { .. } => None,
    };
    let (buf, _) = io.upload(&staging)?;
    top_candidates_with(
        logits,
        k,
        temperatures,
        per_row.map(|s| buf.ptr(s)),
        &mut io,
    )
}

/// [`top_candidates`] into `io`'s kept output buffer, in one copy to the host; with
/// [`Temperatures::PerRow`], `per_row` is the device address of those values (already in the
/// step's upload).
pub fn top_candidates_with(
    logits: &Tensor,
    k: usize,
    temperatures: &Temperatures,
    per_row: Option<u64>,
    io: &mut StepIo,
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
    // one buffer of 32-bit words: ids, values and raw logits (n x k each), then each row's
    // count, max and sum of exps; the kernel writes every count, max and sum, and the first
    // `count` of each row's ids, values and raw logits, all that is read back
    let words = 3 * n * k + 3 * n;
    let (base, _) = io.output(words)?;
    let at = |w: usize| base + 4 * w as u64;
    let (ip, vp, rp) = (at(0), at(n * k), at(2 * n * k));
    let (cp, mp, sp) = (at(3 * n * k), at(3 * n * k + n), at(3 * n * k + 2 * n));
    let lp = tensor_ptr(&logits)?;
    let (greedy, temperature, tp) = match temperatures {
        Temperatures::One {
            greedy,
            temperature,
        } => (*greedy, *temperature, 0u64),
        Temperatures::PerRow(_) => match per_row {
            Some(p) => (false, 0.0, p),
            None => bail!("top_candidates: per-row temperatures without their device address"),
        },
    };
    let (vocab_i, k_i, greedy_i) = (vocab as i32, k as i32, greedy as i32);
    let stream = dev.cuda_stream();
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
    // SAFETY: the arguments match `top_candidates_*` in kernels/sampling.cu (a null
    // temperature pointer: the launch's for every row); the output buffer holds `words` words
    // and lives in `io`, and the download below waits for the kernel on the same stream.
    checked(unsafe { b.launch(cfg) })?;
    let out = io.download(words)?;
    let (ids, rest) = out.split_at(n * k);
    let (vals, rest) = rest.split_at(n * k);
    let (raw, rest) = rest.split_at(n * k);
    let (count, rest) = rest.split_at(n);
    let (max, sum) = rest.split_at(n);
    let f = |w: &[u32]| -> Vec<f32> { w.iter().map(|&b| f32::from_bits(b)).collect() };
    Ok((0..n)
        .map(|r| {
            let c = (count[r] as usize).min(k);
            let span = r * k..r * k + c;
            CandidateRow {
                ids: ids[span.clone()].to_vec(),
                values: f(&vals[span.clone()]),
                raw: f(&raw[span]),
                max: f32::from_bits(max[r]),
                sum_exp: f64::from(f32::from_bits(sum[r])),
            }
        })
        .collect())
}
