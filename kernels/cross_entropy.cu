// The cross-entropy head's loss and gradient of each row of a chunk of logits, in place
// (src/cuda/cross_entropy.rs; the reference is `ce_grad_tensors` in src/train/grads.rs, the
// candle ops a GPU ran before, and `ce_grad_in_place` on the CPU):
//
//   m = max_i x_i, s = sum_i exp(x_i - m)                     (f32, x read in the logits' dtype)
//   loss[row] = w * (log(s) - (x_t - m))                       (t: the row's target, w its weight)
//   x_i <- (exp(x_i - m) / s - [i == t]) * ws, ws = (float)(w * scale)   (rounded to the dtype)
//
// ws is the weight times the scale in double, rounded once, as `ce_grad_in_place` takes it;
// candle's `wt * scale` rounds the scale to f32 first (1 ulp apart for weights other than
// powers of two; the trainer's are 0 or 1).
//
// One block of 1024 threads per row; three passes over the row (max, sum, write), each thread
// a strided share (adjacent threads, adjacent values: coalesced). Knows nothing of the
// model: the caller made the logits (c, V) with the head's matmul and reads the gradient back
// as its own input to the two products after.

#include <cuda_bf16.h>
#include <float.h>
#include <stdint.h>

#include "dtype.cuh"

#define THREADS 1024

__device__ __forceinline__ float block_reduce(float v, float* red, bool is_max) {
  for (int o = 16; o > 0; o >>= 1) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, u) : v + u;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < (THREADS / 32) ? red[lane] : (is_max ? -INFINITY : 0.f);
  for (int o = 16; o > 0; o >>= 1) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, u) : v + u;
  }
  return v;
}

template <typename T>
__device__ void ce_grad(T* __restrict__ logits, int64_t vocab, const uint32_t* __restrict__ targets,
                        const float* __restrict__ weights, double scale,
                        float* __restrict__ loss) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  T* x = logits + row * vocab;
  const int tid = threadIdx.x;
  float m = -INFINITY;
  for (int64_t i = tid; i < vocab; i += THREADS) m = fmaxf(m, to_f(x[i]));
  m = block_reduce(m, red, true);
  float s = 0.f;
  for (int64_t i = tid; i < vocab; i += THREADS) s += expf(to_f(x[i]) - m);
  s = block_reduce(s, red, false);
  const uint32_t t = targets[row];
  const float w = weights[row];
  const float ws = (float)((double)w * scale);
  // every thread has read its share twice; the target's logit is read before any write
  const float picked = to_f(x[t]);
  __syncthreads();
  if (tid == 0) loss[row] = w * (logf(s) - (picked - m));
  for (int64_t i = tid; i < vocab; i += THREADS) {
    const float p = expf(to_f(x[i]) - m) / s;
    x[i] = from_f<T>((i == (int64_t)t ? p - 1.f : p) * ws);
  }
}

#define CE(NAME, T)                                                                             \
  extern "C" __global__ void __launch_bounds__(THREADS)                                         \
      NAME(T* logits, int64_t vocab, const uint32_t* targets, const float* weights,             \
           double scale, float* loss) {                                                         \
    ce_grad<T>(logits, vocab, targets, weights, scale, loss);                                   \
  }

CE(ce_grad_f32, float)
CE(ce_grad_bf16, __nv_bfloat16)
