//! The sampler's GPU side (`cuda` feature): the paged KV cache in device memory with its
//! attention backend, the draw's candidates picked on the device, a step's one upload and one
//! download into buffers kept from step to step (`step_io`), and the decode steps' CUDA graphs
//! (`graphs`). Launches the kernels of
//! [`crate::cuda`]; knows nothing of scheduling.

pub mod graphs;
pub mod paged;
pub mod sampling;
pub mod step_io;

pub use paged::{GpuKvCache, GpuPagedAttention, GpuStep};
