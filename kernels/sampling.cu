// Top-k candidates of each logits row on the GPU, so that a decode step copies k (id, logit)
// pairs per row to the host instead of the whole vocabulary. The host then finishes the draw
// (top-p, min-p, the seeded uniform) with the same code as the CPU sampler; the CPU reference is
// `sampler::sampling::top_candidates` and the result equals `sampler::sampling::sample` on the
// dense row exactly (tests/cuda.rs).
//
// Per row (one block of 1024 threads):
//   value(x) = sanitize(x) when greedy, sanitize(x / temperature) otherwise (IEEE division, as
//              on the CPU); sanitize: NaN -> -inf, +inf -> FLT_MAX. The temperature is the
//              launch's, or the row's own where `temperatures` is given (rows of requests with
//              their own settings); a row's temperature 0 means greedy.
//   the kk = min(k, #finite values) best values, ordered by (value desc, token id asc), with
//   their ids and sanitized raw logits; and the raw row's max and sum of exp(x - max) for the
//   chosen token's log-probability under the raw model distribution.
// Selection is an exact radix select over order-preserving 32-bit keys (4 rounds of 8 bits),
// then the ties at the threshold are taken in id order, then the kk winners are ranked.

#include <cuda_bf16.h>
#include <float.h>
#include <stdint.h>

#include "dtype.cuh"

#define THREADS 1024
#define KMAX 1024


__device__ __forceinline__ float sanitize(float x) {
  if (isnan(x)) return -INFINITY;
  if (x == INFINITY) return FLT_MAX;
  return x;
}

// Larger key <=> larger float (for non-NaN values).
__device__ __forceinline__ uint32_t key_of(float v) {
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float block_max(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < (THREADS / 32) ? red[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ double block_sum(double v, double* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < (THREADS / 32) ? red[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__device__ void top_candidates(const T* __restrict__ logits, int vocab, int k, int greedy,
                               float temperature, uint32_t* __restrict__ out_ids,
                               float* __restrict__ out_vals, float* __restrict__ out_raw,
                               uint32_t* __restrict__ out_count, float* __restrict__ out_max,
                               float* __restrict__ out_sum) {
  __shared__ uint32_t hist[256];
  __shared__ float redf[32];
  __shared__ double redd[32];
  __shared__ uint32_t s_prefix, s_mask, s_remaining, s_taken, s_nfinite;
  __shared__ uint32_t c_ids[KMAX];
  __shared__ float c_vals[KMAX];
  __shared__ uint32_t warp_ties[32];
  const int row = blockIdx.x, tid = threadIdx.x;
  const T* x = logits + (int64_t)row * vocab;
  auto value = [&](int i) {
    const float r = sanitize(to_f(x[i]));
    return greedy ? r : sanitize(to_f(x[i]) / temperature);
  };
  // 1. raw max and sum of exp (NaN skipped, +inf as FLT_MAX), and the count of finite values
  float mx = -INFINITY;
  uint32_t nfin = 0;
  for (int i = tid; i < vocab; i += THREADS) {
    mx = fmaxf(mx, sanitize(to_f(x[i])));
    nfin += value(i) > -INFINITY;
  }
  mx = block_max(mx, redf);
  double se = 0.0;
  if (mx > -INFINITY) {
    for (int i = tid; i < vocab; i += THREADS) {
      const float r = sanitize(to_f(x[i]));
      if (r > -INFINITY) se += (double)expf(r - mx);
    }
  }
  se = block_sum(se, redd);
  if (tid == 0) s_nfinite = 0;
  __syncthreads();
  atomicAdd(&s_nfinite, nfin);
  __syncthreads();
  const uint32_t kk = min((uint32_t)k, s_nfinite);
  if (tid == 0) {
    out_max[row] = mx;
    out_sum[row] = (float)se;
    out_count[row] = kk;
    s_prefix = 0;
    s_mask = 0;
    s_remaining = kk;
  }
  __syncthreads();
  if (kk == 0) return;
  // 2. radix select: the key of the kk-th best value, and how many of its ties to take
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = tid; b < 256; b += THREADS) hist[b] = 0;
    __syncthreads();
    const uint32_t prefix = s_prefix, mask = s_mask;
    for (int i = tid; i < vocab; i += THREADS) {
      const uint32_t key = key_of(value(i));
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (tid == 0) {
      uint32_t rem = s_remaining, above = 0;
      int b = 255;
      for (; b > 0; b--) {
        if (above + hist[b] >= rem) break;
        above += hist[b];
      }
      s_remaining = rem - above;
      s_prefix = prefix | ((uint32_t)b << shift);
      s_mask = mask | (255u << shift);
    }
    __syncthreads();
  }
  const uint32_t kth = s_prefix;
  const uint32_t ties_wanted = s_remaining;
  const uint32_t n_above = kk - ties_wanted;
  if (tid == 0) s_taken = 0;
  __syncthreads();
  // 3a. every value above the threshold (any order; ranked below)
  for (int i = tid; i < vocab; i += THREADS) {
    const float v = value(i);
    if (key_of(v) > kth && v > -INFINITY) {
      const uint32_t slot = atomicAdd(&s_taken, 1u);
      if (slot < KMAX) {
        c_ids[slot] = i;
        c_vals[slot] = v;
      }
    }
  }
  __syncthreads();
  // 3b. ties at the threshold, lowest ids first, in tiles of THREADS ids
  uint32_t ties_done = 0;
  for (int base = 0; base < vocab && ties_done < ties_wanted; base += THREADS) {
    const int i = base + tid;
    float v = -INFINITY;
    bool tie = false;
    if (i < vocab) {
      v = value(i);
      tie = key_of(v) == kth;
    }
    const uint32_t ballot = __ballot_sync(0xffffffffu, tie);
    const int lane = tid & 31, warp = tid >> 5;
    if (lane == 0) warp_ties[warp] = __popc(ballot);
    __syncthreads();
    uint32_t before = 0, total = 0;
    for (int w = 0; w < THREADS / 32; w++) {
      if (w < warp) before += warp_ties[w];
      total += warp_ties[w];
    }
    before += __popc(ballot & ((1u << lane) - 1u));
    if (tie && ties_done + before < ties_wanted) {
      const uint32_t slot = n_above + ties_done + before;
      if (slot < KMAX) {
        c_ids[slot] = i;
        c_vals[slot] = v;
      }
    }
    ties_done += total;
    __syncthreads();
  }
  // 4. rank the kk winners by (value desc, id asc) and write them
  for (uint32_t a = tid; a < kk; a += THREADS) {
    const float va = c_vals[a];
    const uint32_t ia = c_ids[a];
    uint32_t rank = 0;
    for (uint32_t b = 0; b < kk; b++) {
      const float vb = c_vals[b];
      rank += (vb > va) || (vb == va && c_ids[b] < ia);
    }
    const int64_t o = (int64_t)row * k + rank;
    out_ids[o] = ia;
    out_vals[o] = va;
    out_raw[o] = sanitize(to_f(x[ia]));
  }
}

#define TOPK(NAME, T)                                                                          \
  extern "C" __global__ void __launch_bounds__(THREADS) top_candidates_##NAME(                 \
      const T* logits, int vocab, int k, int greedy, float temperature,                        \
      const float* temperatures, uint32_t* out_ids, float* out_vals, float* out_raw,           \
      uint32_t* out_count, float* out_max, float* out_sum) {                                   \
    if (temperatures != nullptr) {                                                             \
      temperature = temperatures[blockIdx.x];                                                  \
      greedy = !(temperature > 0.0f);                                                          \
    }                                                                                          \
    top_candidates<T>(logits, vocab, k, greedy, temperature, out_ids, out_vals, out_raw,       \
                      out_count, out_max, out_sum);                                            \
  }

TOPK(f32, float)
TOPK(bf16, __nv_bfloat16)
