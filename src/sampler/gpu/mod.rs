//! The sampler's GPU side (`cuda` feature): the paged KV cache in device memory with its
//! attention backend, and the draw's candidates picked on the device. Launches the kernels of
//! [`crate::cuda`]; knows nothing of scheduling.

pub mod paged;
pub mod sampling;

pub use paged::{GpuKvCache, GpuPagedAttention, GpuStep};
