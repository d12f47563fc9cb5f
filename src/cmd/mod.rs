//! Commands that are not pipeline stages: `grade`, `data inspect`, `status`, `preflight`, `bench`,
//! `sample`.
//!
//! Each reads files or the work dir and prints; none of them writes a stage.

pub mod bench;
pub mod bench_attention;
pub mod bench_sample;
pub mod bench_train;
pub mod eval;
pub mod grade;
pub mod inspect;
pub mod preflight;
pub mod sample;
pub mod status;
pub mod train;
