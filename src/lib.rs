//! selfdistill: math self-distillation end to end in one binary.
//!
//! Layers (dependencies point one way, see ARCHITECTURE.md):
//! `verify` (pure answer checking) and `data` (loaders, Parquet schemas) sit at the bottom;
//! `store` owns the work dir (stage directories, manifests, the lock); `config` turns TOML into a
//! validated plan; `stages` run one stage each; `cmd` holds the non-stage CLI commands. The binary
//! (`main.rs`) only parses arguments and prints errors.

pub mod arith;
pub mod bytes;
pub mod cmd;
pub mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod data;
pub mod digest;
pub mod eval;
pub mod fault;
pub mod gemm;
pub mod machine;
pub mod model;
pub mod pretrain;
pub mod report;
pub mod rng;
pub mod sampler;
pub mod simd;
pub mod stages;
pub mod store;
pub mod train;
pub mod verify;
