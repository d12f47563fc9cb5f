//! selfdistill: math self-distillation end to end in one binary.
//!
//! Layers: each imports only the ones below it, and no two files import each other
//! (`scripts/import-graph.py --check`, run by CI, checks for circles between modules and between
//! files, and for edges upward; `verify/`'s files are the one exception it allows, with why).
//!
//! ```text
//! main (argument parsing)  cmd (the commands)  report (reads the stage store)
//!   stages      the plan, the stage cache, the runner and one file per stage kind
//!   config      TOML -> a validated Config
//!   jobs        sample (jobs::sample), eval, pretrain, train (train::trainer)
//!   sampler     paged-KV engine: the sampling parameters (defined once), block pool, KV cache,
//!               scheduler, sampling, the device backend, engine, gpu
//!   train       differentiable model, losses, AdamW, checkpoints
//!   model       Hugging Face checkpoints, config readers, the decoder over layer kinds
//!               (model/layers: attention, Gated DeltaNet), ops and their paths, weight init
//!   data verify store digest arith progress loaders and schemas, the verifier, the work dir,
//!                                          progress bars and progress.json
//!   gemm simd cuda machine bytes rng fault logging names  the CPU kernels, our CUDA kernels,
//!                                          machine facts, logs, "did you mean"
//! ```
//! The binary (`main.rs`) only parses arguments, dispatches to `cmd` and prints errors.

pub mod arith;
pub mod bytes;
pub mod cmd;
pub mod config;
pub mod cuda;
pub mod data;
pub mod device;
pub mod digest;
pub mod eval;
pub mod fault;
pub mod gemm;
pub mod jobs;
pub mod logging;
pub mod machine;
pub mod model;
pub mod names;
pub mod pretrain;
pub mod progress;
pub mod report;
pub mod rng;
pub mod sampler;
pub mod simd;
pub mod stages;
pub mod store;
pub mod tensorboard;
pub mod train;
pub mod verify;
