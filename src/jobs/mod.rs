//! Jobs: what the stages and commands run, built on the engine and the trainer. A job reads its
//! inputs, runs, and writes its outputs resumably; it knows nothing of stages, configs or the
//! command line.
//!
//! - [`sample`]: problems in, a graded completions Parquet out (the sampler engine in a loop
//!   with the verifier, sharding and resume), on our engine or on [`mistralrs`] (the
//!   `mistralrs` feature).
//!
//! The evaluation job is [`crate::eval`], the pretraining job's pieces are [`crate::pretrain`],
//! and the training job is [`crate::train::trainer`].

#[cfg(feature = "mistralrs")]
pub mod mistralrs;
pub mod sample;
