// Paged attention for the sampler (decode and chunked prefill) and the write of a step's keys and
// values into the paged cache. The CPU reference is src/sampler/kv_cache.rs; the layout is the
// same:
//
//   cache (per layer, K and V alike): [num_blocks][Hkv][block_size][D]
//   slot s = block * block_size + offset
//   q, out: [T][Hq][D]   new k, v: [T][Hkv][D]   (T = every token of the step, end to end)
//   token t belongs to sequence tok_seq[t] and sees keys at positions 0 .. tok_len[t]-1 through
//   that sequence's row of block_tables ([S][max_blocks], int32 block ids)
//
// One thread block per (token, KV head, key partition): the G query heads that share a KV head
// read each key and value row once. Each warp takes KB consecutive keys at a time; lane i holds
// elements [i*E, i*E+E) of the head dimension, so a warp reads a row in one coalesced sweep.
// Scores are reduced across the warp with shuffles, softmax is online (running max and sum),
// and the warps' partial results are merged in shared memory. Long contexts with few tokens in
// flight are split into partitions (split-K); paged_attn_reduce merges the partitions.
// Arithmetic is fp32 throughout; the cache holds T (fp32/bf16) or fp8 e4m3 (as is, no scale).

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#define KB 4

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__nv_fp8_e4m3 x) { return float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <> __device__ __forceinline__ __nv_fp8_e4m3 from_f<__nv_fp8_e4m3>(float x) {
  return __nv_fp8_e4m3(x);
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Writes new keys and values into their slots. Grid: one block per token; slot < 0 skips.
template <typename T, typename C>
__device__ void write_kv(const T* __restrict__ k, const T* __restrict__ v, C* __restrict__ kc,
                         C* __restrict__ vc, const int64_t* __restrict__ slots, int hkv, int d,
                         int bs) {
  const int t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  const int64_t block = slot / bs, off = slot % bs;
  for (int i = threadIdx.x; i < hkv * d; i += blockDim.x) {
    const int h = i / d, x = i % d;
    const int64_t dst = ((block * hkv + h) * bs + off) * d + x;
    const int64_t src = ((int64_t)t * hkv + h) * d + x;
    kc[dst] = from_f<C>(to_f(k[src]));
    vc[dst] = from_f<C>(to_f(v[src]));
  }
}

template <typename T, typename C, int E, int G>
__device__ void paged_attn(T* __restrict__ out, float* __restrict__ part_out,
                           float* __restrict__ part_ml, const T* __restrict__ q,
                           const C* __restrict__ kc, const C* __restrict__ vc,
                           const int* __restrict__ block_tables, const int* __restrict__ tok_seq,
                           const int* __restrict__ tok_len, int hq, int hkv, int d, int bs,
                           int max_blocks, int part_size, int num_parts, float scale) {
  extern __shared__ float smem[];
  const int t = blockIdx.x, kvh = blockIdx.y, p = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int len = tok_len[t];
  const int start = p * part_size;
  const int end = min(len, start + part_size);
  if (start >= end) {
    // An empty partition (shorter context than its neighbours): weight zero in the reduce.
    if (threadIdx.x < G) {
      const int64_t r = ((int64_t)t * hq + kvh * G + threadIdx.x) * num_parts + p;
      part_ml[2 * r] = -INFINITY;
      part_ml[2 * r + 1] = 0.f;
    }
    return;
  }
  const int* table = block_tables + (int64_t)tok_seq[t] * max_blocks;
  float qr[G][E];
#pragma unroll
  for (int g = 0; g < G; g++)
#pragma unroll
    for (int e = 0; e < E; e++) {
      const int x = lane * E + e;
      qr[g][e] = x < d ? to_f(q[((int64_t)t * hq + kvh * G + g) * d + x]) * scale : 0.f;
    }
  float m[G], l[G], acc[G][E];
#pragma unroll
  for (int g = 0; g < G; g++) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < E; e++) acc[g][e] = 0.f;
  }
  for (int j0 = start + warp * KB; j0 < end; j0 += nw * KB) {
    int64_t base[KB];
    float s[KB][G];
#pragma unroll
    for (int kb = 0; kb < KB; kb++) {
      const int j = j0 + kb;
      base[kb] = -1;
      if (j < end) {
        const int64_t blk = table[j / bs];
        base[kb] = ((blk * hkv + kvh) * bs + (j % bs)) * (int64_t)d;
      }
      float kr[E];
#pragma unroll
      for (int e = 0; e < E; e++) {
        const int x = lane * E + e;
        kr[e] = (base[kb] >= 0 && x < d) ? to_f(kc[base[kb] + x]) : 0.f;
      }
#pragma unroll
      for (int g = 0; g < G; g++) {
        float acc_s = 0.f;
#pragma unroll
        for (int e = 0; e < E; e++) acc_s += qr[g][e] * kr[e];
        s[kb][g] = acc_s;
      }
    }
#pragma unroll
    for (int kb = 0; kb < KB; kb++)
#pragma unroll
      for (int g = 0; g < G; g++) {
        const float x = warp_sum(s[kb][g]);
        s[kb][g] = base[kb] >= 0 ? x : -INFINITY;
      }
#pragma unroll
    for (int g = 0; g < G; g++) {
      float mx = m[g];
#pragma unroll
      for (int kb = 0; kb < KB; kb++) mx = fmaxf(mx, s[kb][g]);
      const float alpha = __expf(m[g] - mx);  // m = -inf on the first keys: alpha = 0
      l[g] *= alpha;
#pragma unroll
      for (int e = 0; e < E; e++) acc[g][e] *= alpha;
#pragma unroll
      for (int kb = 0; kb < KB; kb++) {
        s[kb][g] = __expf(s[kb][g] - mx);
        l[g] += s[kb][g];
      }
      m[g] = mx;
    }
#pragma unroll
    for (int kb = 0; kb < KB; kb++) {
      if (base[kb] < 0) continue;
      float vr[E];
#pragma unroll
      for (int e = 0; e < E; e++) {
        const int x = lane * E + e;
        vr[e] = x < d ? to_f(vc[base[kb] + x]) : 0.f;
      }
#pragma unroll
      for (int g = 0; g < G; g++)
#pragma unroll
        for (int e = 0; e < E; e++) acc[g][e] += s[kb][g] * vr[e];
    }
  }
  // Merge the warps: smem = m[nw][G], l[nw][G], acc[nw][G][d]
  float* sm_m = smem;
  float* sm_l = sm_m + nw * G;
  float* sm_acc = sm_l + nw * G;
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < G; g++) {
      sm_m[warp * G + g] = m[g];
      sm_l[warp * G + g] = l[g];
    }
  }
#pragma unroll
  for (int g = 0; g < G; g++)
#pragma unroll
    for (int e = 0; e < E; e++) {
      const int x = lane * E + e;
      if (x < d) sm_acc[(warp * G + g) * d + x] = acc[g][e];
    }
  __syncthreads();
  for (int i = threadIdx.x; i < G * d; i += blockDim.x) {
    const int g = i / d, x = i % d;
    float mx = -INFINITY;
    for (int w = 0; w < nw; w++) mx = fmaxf(mx, sm_m[w * G + g]);
    float sum = 0.f, o = 0.f;
    for (int w = 0; w < nw; w++) {
      const float mw = sm_m[w * G + g];
      const float f = mw == -INFINITY ? 0.f : __expf(mw - mx);
      sum += sm_l[w * G + g] * f;
      o += sm_acc[(w * G + g) * d + x] * f;
    }
    const int h = kvh * G + g;
    if (num_parts == 1) {
      out[((int64_t)t * hq + h) * d + x] = from_f<T>(o / sum);
    } else {
      const int64_t r = ((int64_t)t * hq + h) * num_parts + p;
      part_out[r * d + x] = o / sum;
      if (x == 0) {
        part_ml[2 * r] = mx;
        part_ml[2 * r + 1] = sum;
      }
    }
  }
}

// Merges the partitions of paged_attn. Grid: (T, Hq); threads over d.
template <typename T>
__device__ void paged_attn_reduce(T* __restrict__ out, const float* __restrict__ part_out,
                                  const float* __restrict__ part_ml, int hq, int d,
                                  int num_parts) {
  const int t = blockIdx.x, h = blockIdx.y;
  const int64_t r0 = ((int64_t)t * hq + h) * num_parts;
  float mx = -INFINITY;
  for (int p = 0; p < num_parts; p++) mx = fmaxf(mx, part_ml[2 * (r0 + p)]);
  for (int x = threadIdx.x; x < d; x += blockDim.x) {
    float sum = 0.f, o = 0.f;
    for (int p = 0; p < num_parts; p++) {
      const float mp = part_ml[2 * (r0 + p)];
      if (mp == -INFINITY) continue;
      const float w = part_ml[2 * (r0 + p) + 1] * __expf(mp - mx);
      sum += w;
      o += part_out[(r0 + p) * d + x] * w;
    }
    out[((int64_t)t * hq + h) * d + x] = from_f<T>(o / sum);
  }
}

#define WRITE_KV(NAME, T, C)                                                                   \
  extern "C" __global__ void write_kv_##NAME(const T* k, const T* v, C* kc, C* vc,             \
                                              const int64_t* slots, int hkv, int d, int bs) {  \
    write_kv<T, C>(k, v, kc, vc, slots, hkv, d, bs);                                           \
  }

#define ATTN(NAME, T, C, E, G)                                                                 \
  extern "C" __global__ void paged_attn_##NAME##_e##E##_g##G(                                  \
      T* out, float* part_out, float* part_ml, const T* q, const C* kc, const C* vc,          \
      const int* block_tables, const int* tok_seq, const int* tok_len, int hq, int hkv, int d, \
      int bs, int max_blocks, int part_size, int num_parts, float scale) {                     \
    paged_attn<T, C, E, G>(out, part_out, part_ml, q, kc, vc, block_tables, tok_seq, tok_len,  \
                           hq, hkv, d, bs, max_blocks, part_size, num_parts, scale);           \
  }

#define ATTN_G(NAME, T, C, E) \
  ATTN(NAME, T, C, E, 1)      \
  ATTN(NAME, T, C, E, 2)      \
  ATTN(NAME, T, C, E, 4)      \
  ATTN(NAME, T, C, E, 8)

#define ATTN_ALL(NAME, T, C) \
  WRITE_KV(NAME, T, C)       \
  ATTN_G(NAME, T, C, 1)      \
  ATTN_G(NAME, T, C, 2)      \
  ATTN_G(NAME, T, C, 4)      \
  ATTN_G(NAME, T, C, 8)

ATTN_ALL(f32, float, float)
ATTN_ALL(bf16, __nv_bfloat16, __nv_bfloat16)
ATTN_ALL(bf16_fp8, __nv_bfloat16, __nv_fp8_e4m3)

extern "C" __global__ void paged_attn_reduce_f32(float* out, const float* part_out,
                                                 const float* part_ml, int hq, int d,
                                                 int num_parts) {
  paged_attn_reduce<float>(out, part_out, part_ml, hq, d, num_parts);
}
extern "C" __global__ void paged_attn_reduce_bf16(__nv_bfloat16* out, const float* part_out,
                                                  const float* part_ml, int hq, int d,
                                                  int num_parts) {
  paged_attn_reduce<__nv_bfloat16>(out, part_out, part_ml, hq, d, num_parts);
}
