//! `pipeline bench checkpoint`: writes a random-weight model of a benchmark shape as a Hugging
//! Face folder (config.json, model.safetensors, a word-level tokenizer.json without EOS), the
//! input of whole jobs that measure speed and memory at real shapes without real weights (the
//! GPU acceptance script's `job` part, engine comparisons).
//!
//! Knows the shapes of `model::init`; nothing of stages. The weights are those `bench sample`
//! draws (seed 0), in the dtype asked for.

use std::path::PathBuf;

use anyhow::{bail, Result};
use candle_core::DType;

#[derive(Debug, clap::Args)]
pub struct CheckpointArgs {
    /// A benchmark shape (see `bench sample --shape`): tiny, 20m, qwen3-0.6b, qwen3-4b, ...
    #[arg(long)]
    pub shape: String,
    /// f32, bf16 or f16.
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    /// The folder to write (replaced when it exists).
    #[arg(long)]
    pub output: PathBuf,
}

pub fn run(a: &CheckpointArgs) -> Result<()> {
    let dtype = match a.dtype.as_str() {
        "f32" => DType::F32,
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        other => bail!("--dtype {other}: use f32, bf16 or f16"),
    };
    let t0 = std::time::Instant::now();
    crate::model::init::write_random_hf(&a.shape, &a.output, dtype)?;
    let cfg = crate::model::init::shape(&a.shape)?;
    let params: usize = crate::model::init::weight_shapes(&cfg)
        .iter()
        .map(|(_, s, _)| s.iter().product::<usize>())
        .sum();
    crate::outln!(
        "{}: shape {} ({:.1}M parameters, {dtype:?}) in {:.1}s",
        a.output.display(),
        a.shape,
        params as f64 / 1e6,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
