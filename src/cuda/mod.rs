//! The GPU side of the sampler (`cuda` feature): our kernels from `kernels/` (built to PTX by
//! build.rs) and the paged KV cache on the device with its attention backend. The model itself
//! runs on candle's CUDA backend (cuBLAS matmuls, candle's fused RMS norm and RoPE kernels); this
//! module adds only what candle lacks. Knows nothing of scheduling or sampling.

pub mod kernels;
pub mod paged;
pub mod sampling;

pub use kernels::sampler_device;
pub use paged::{GpuKvCache, GpuPagedAttention, GpuStep};
