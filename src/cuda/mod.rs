//! Our CUDA kernels (`cuda` feature; [`shapes`] always, for counting on any machine): the PTX that build.rs compiles from `kernels/`, the device
//! the sampler runs on, and the helpers that launch a kernel on candle's stream. The model runs
//! on candle's CUDA backend (cuBLAS matmuls, candle's fused norm and RoPE kernels); the sampler's
//! GPU side (`sampler::gpu`: the paged KV cache, its attention backend, the candidate draw; the
//! recurrent layers' state slots), the Gated DeltaNet decode step (`gated_deltanet`) and
//! training's attention (`flash_attention`) use these kernels. Knows nothing of models, scheduling or sampling.

#[cfg(feature = "cuda")]
pub mod adamw;
#[cfg(feature = "cuda")]
pub mod cross_entropy;
#[cfg(feature = "cuda")]
pub mod flash_attention;
#[cfg(feature = "cuda")]
pub mod gated_deltanet;
#[cfg(feature = "cuda")]
pub mod kernels;
#[cfg(feature = "cuda")]
pub mod layer_ops;
#[cfg(feature = "cuda")]
pub mod rows;
pub mod shapes;

#[cfg(feature = "cuda")]
pub use kernels::{device_name, memory_info, sampler_device};
