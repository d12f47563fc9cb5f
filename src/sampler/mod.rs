//! The sampler: a paged-KV engine that generates many completions per problem.
//!
//! `block_pool` (blocks, ref counts, block tables, copy on write) and `kv_cache` (the paged cache
//! and the CPU attention backend over it) are the memory layer; the scheduler, sampling and the
//! sample stage build on them. Knows nothing of Parquet or stages.

pub mod block_pool;
pub mod engine;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod job;
pub mod kv_cache;
pub mod sampling;
pub mod scheduler;

#[cfg(test)]
mod tests;
