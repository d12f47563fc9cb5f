//! The sampler: a paged-KV engine that generates many completions per problem.
//!
//! `block_pool` (blocks, ref counts, block tables, copy on write), `kv_cache` (the paged cache
//! and the CPU attention backend over it), `state_slots` (per-sequence states of recurrent
//! layers, and the rings of sliding-window layers) and `window_ring` (attention over those
//! rings) are the memory layer; `scheduler`, `sampling` and
//! `engine` build on them, and `gpu` (the `cuda` feature) is the device side of the cache and the
//! draw, planned and its costs declared by `gpu_plan` (any build). The sampling job that feeds it problems and writes Parquet is [`crate::jobs::sample`].
//! Knows nothing of Parquet, grading or stages.

#[cfg(test)]
mod attention_conformance;
pub mod backend;
pub mod block_pool;
pub mod engine;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod gpu_plan;
pub mod kv_cache;
pub mod params;
pub mod sampling;
pub mod scheduler;
pub mod state_slots;
pub mod window_ring;

#[cfg(test)]
mod tests;
