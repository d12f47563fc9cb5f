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
// read each key and value row once. L lanes share a key row, 8 elements each (16-byte loads of
// bf16), so a warp reads 32/L rows per load instruction and several rounds of them before any
// arithmetic (see paged_attn). Scores are reduced with shuffles, softmax is online (running max
// and sum), and the warps' partial results are merged in shared memory. Long contexts with few tokens in
// flight are split into partitions (split-K); paged_attn_reduce merges the partitions.
// Arithmetic is fp32 throughout; the cache holds T (fp32/bf16) or fp8 e4m3 (as is, no scale).
// paged_attn is v4 (f32 caches, and blocks whose size is not a power of two); paged_attn_v5, the
// default for bf16 and fp8 caches, stages the block-table entries in shared memory and loads one
// iteration ahead (kernels/NOTES.md has each version's measurements).

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "dtype.cuh"


// the fp8 KV cache's conversions beside dtype.cuh's
__device__ __forceinline__ float to_f(__nv_fp8_e4m3 x) { return float(x); }
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

// Eight consecutive cache elements as floats: one 16-byte load (bf16), one 8-byte load (fp8),
// two 16-byte loads (f32). Rows start at multiples of D elements and D % 8 == 0, so the loads are
// aligned.
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float* o) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const float2 f = __bfloat1622float2(h[i]);
    o[2 * i] = f.x;
    o[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void load8(const __nv_fp8_e4m3* p, float* o) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const __nv_fp8_e4m3* e = reinterpret_cast<const __nv_fp8_e4m3*>(&u);
#pragma unroll
  for (int i = 0; i < 8; i++) o[i] = float(e[i]);
}
__device__ __forceinline__ void load8(const float* p, float* o) {
  const float4 a = reinterpret_cast<const float4*>(p)[0];
  const float4 b = reinterpret_cast<const float4*>(p)[1];
  o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
  o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
}

// L lanes read one key row (8 elements each, so D <= 8L); a warp reads 32/L keys per load
// instruction, R such rounds per iteration, K and V rows all issued before any arithmetic. Lane
// (sub, sl) = (lane / L, lane % L) owns elements [8 sl, 8 sl + 8) of the keys sub, sub + 32/L, ...
// Scores are summed over the L lanes of a key with shuffles; the running max is warp-wide, while
// each sub-group accumulates the sum and output of its own keys (merged at the end).
template <typename T, typename C, int L, int G, int ROUNDS>
__device__ void paged_attn(T* __restrict__ out, float* __restrict__ part_out,
                           float* __restrict__ part_ml, const T* __restrict__ q,
                           const C* __restrict__ kc, const C* __restrict__ vc,
                           const int* __restrict__ block_tables, const int* __restrict__ tok_seq,
                           const int* __restrict__ tok_len, int hq, int hkv, int d, int bs,
                           int max_blocks, int part_size, int num_parts, float scale) {
  constexpr int KPW = 32 / L;  // keys per warp per round
  // rounds per iteration (0: the default for L)
  // (2 measured best at L = 16; more rounds cost registers and so resident warps)
  constexpr int R = ROUNDS > 0 ? ROUNDS : (KPW >= 2 ? 2 : 4);
  constexpr int STEP = KPW * R;  // keys per warp per iteration
  extern __shared__ float smem[];
  const int t = blockIdx.x, kvh = blockIdx.y, p = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int sub = lane / L, sl = lane % L;
  const bool active = sl * 8 < d;
  const int len = tok_len[t];
  const int start = p * part_size;
  const int end = min(len, start + part_size);
  if (start >= end) {
    if (threadIdx.x < G) {
      const int64_t r = ((int64_t)t * hq + kvh * G + threadIdx.x) * num_parts + p;
      part_ml[2 * r] = -INFINITY;
      part_ml[2 * r + 1] = 0.f;
    }
    return;
  }
  const int* table = block_tables + (int64_t)tok_seq[t] * max_blocks;
  float qr[G][8];
#pragma unroll
  for (int g = 0; g < G; g++)
#pragma unroll
    for (int e = 0; e < 8; e++) {
      const int x = sl * 8 + e;
      qr[g][e] = x < d ? to_f(q[((int64_t)t * hq + kvh * G + g) * d + x]) * scale : 0.f;
    }
  float m[G], l[G], acc[G][8];
#pragma unroll
  for (int g = 0; g < G; g++) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; e++) acc[g][e] = 0.f;
  }
  for (int j0 = start + warp * STEP; j0 < end; j0 += nw * STEP) {
    float kr[R][8], vr[R][8];
    bool valid[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int j = j0 + r * KPW + sub;
      valid[r] = j < end;
      if (valid[r] && active) {
        const int64_t blk = table[j / bs];
        const int64_t base = ((blk * hkv + kvh) * bs + (j % bs)) * (int64_t)d + sl * 8;
        load8(kc + base, kr[r]);
        load8(vc + base, vr[r]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; e++) kr[r][e] = vr[r][e] = 0.f;
      }
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
      float s[R];
#pragma unroll
      for (int r = 0; r < R; r++) {
        float a = 0.f;
#pragma unroll
        for (int e = 0; e < 8; e++) a += qr[g][e] * kr[r][e];
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
        s[r] = valid[r] ? a : -INFINITY;
      }
      float mx = m[g];
#pragma unroll
      for (int r = 0; r < R; r++) mx = fmaxf(mx, s[r]);
#pragma unroll
      for (int o = L; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float alpha = __expf(m[g] - mx);  // m = -inf on the first keys: alpha = 0
      m[g] = mx;
      l[g] *= alpha;
#pragma unroll
      for (int e = 0; e < 8; e++) acc[g][e] *= alpha;
#pragma unroll
      for (int r = 0; r < R; r++) {
        const float pr = __expf(s[r] - mx);
        l[g] += pr;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[g][e] += pr * vr[r][e];
      }
    }
  }
  // Merge the sub-groups of each warp (same max m within the warp)
#pragma unroll
  for (int g = 0; g < G; g++) {
#pragma unroll
    for (int o = L; o < 32; o <<= 1) {
      l[g] += __shfl_xor_sync(0xffffffffu, l[g], o);
#pragma unroll
      for (int e = 0; e < 8; e++) acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], o);
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
  if (sub == 0 && active) {
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
      for (int e = 0; e < 8; e++) {
        const int x = sl * 8 + e;
        if (x < d) sm_acc[(warp * G + g) * d + x] = acc[g][e];
      }
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

// Raw cache elements, eight at a time: what a lane keeps in registers between the load and its
// use (a bf16 row chunk in 4 registers, an fp8 one in 2), converted to floats only when used.
template <typename C> struct Raw8;
template <> struct Raw8<__nv_bfloat16> { using type = uint4; };
template <> struct Raw8<__nv_fp8_e4m3> { using type = uint2; };

__device__ __forceinline__ void cvt8(const uint4& u, float* o) {
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const uint32_t w = (&u.x)[i];
    o[2 * i] = __uint_as_float(w << 16);
    o[2 * i + 1] = __uint_as_float(w & 0xffff0000u);
  }
}
__device__ __forceinline__ void cvt8(const uint2& u, float* o) {
  const __nv_fp8_e4m3* e = reinterpret_cast<const __nv_fp8_e4m3*>(&u);
#pragma unroll
  for (int i = 0; i < 8; i++) o[i] = float(e[i]);
}

// v5 (bf16 or fp8 cache, block size a power of two): paged_attn's lanes and online softmax, with
//  - the partition's block-table entries staged in shared memory once, so a key's address needs
//    no global load of its own before the key's load (v4 chained the two on every key);
//  - the next iteration's K and V rows loaded (raw, 16 or 8 bytes per lane and row) before the
//    current iteration's arithmetic, two register stages, so loads stay in flight through the
//    arithmetic instead of alternating with it;
//  - shifts and masks for the block size instead of division, and the running output rescaled
//    only when the (warp-uniform) running max grows.
// Same arguments and outputs as paged_attn; dynamic shared memory holds the table entries after
// the warps' merge area (the host sizes it).
template <typename T, typename C, int L, int G, int R>
__device__ void paged_attn_v5(T* __restrict__ out, float* __restrict__ part_out,
                              float* __restrict__ part_ml, const T* __restrict__ q,
                              const C* __restrict__ kc, const C* __restrict__ vc,
                              const int* __restrict__ block_tables,
                              const int* __restrict__ tok_seq, const int* __restrict__ tok_len,
                              int hq, int hkv, int d, int bs, int max_blocks, int part_size,
                              int num_parts, float scale) {
  using R8 = typename Raw8<C>::type;
  constexpr int KPW = 32 / L;   // keys per warp per round
  constexpr int STEP = KPW * R; // keys per warp per stage
  extern __shared__ float smem[];
  const int t = blockIdx.x, kvh = blockIdx.y, p = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int sub = lane / L, sl = lane % L;
  const bool active = sl * 8 < d;
  const int len = tok_len[t];
  const int start = p * part_size;
  const int end = min(len, start + part_size);
  if (start >= end) {
    if (threadIdx.x < G) {
      const int64_t r = ((int64_t)t * hq + kvh * G + threadIdx.x) * num_parts + p;
      part_ml[2 * r] = -INFINITY;
      part_ml[2 * r + 1] = 0.f;
    }
    return;
  }
  const int sh = __ffs(bs) - 1, mask = bs - 1;
  float* sm_m = smem;
  float* sm_l = sm_m + nw * G;
  float* sm_acc = sm_l + nw * G;
  int* sm_tab = reinterpret_cast<int*>(sm_acc + nw * G * d);
  const int first = start >> sh;
  {
    const int* table = block_tables + (int64_t)tok_seq[t] * max_blocks;
    const int n = ((end - 1) >> sh) - first + 1;
    for (int i = threadIdx.x; i < n; i += blockDim.x) sm_tab[i] = table[first + i];
  }
  __syncthreads();
  float qr[G][8];
#pragma unroll
  for (int g = 0; g < G; g++)
#pragma unroll
    for (int e = 0; e < 8; e++) {
      const int x = sl * 8 + e;
      qr[g][e] = x < d ? to_f(q[((int64_t)t * hq + kvh * G + g) * d + x]) * scale : 0.f;
    }
  float m[G], l[G], acc[G][8];
#pragma unroll
  for (int g = 0; g < G; g++) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; e++) acc[g][e] = 0.f;
  }
  const int64_t head_off = (int64_t)kvh << sh;  // (kvh * bs) within a block's [Hkv][bs] rows
  auto issue = [&](int j0, R8 (&kr)[R], R8 (&vr)[R]) {
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int j = j0 + r * KPW + sub;
      if (j < end && active) {
        const int64_t blk = sm_tab[(j >> sh) - first];
        const int64_t base = (((blk * hkv) << sh) + head_off + (j & mask)) * d + sl * 8;
        kr[r] = *reinterpret_cast<const R8*>(kc + base);
        vr[r] = *reinterpret_cast<const R8*>(vc + base);
      } else {
        kr[r] = R8{};
        vr[r] = R8{};
      }
    }
  };
  auto compute = [&](int j0, const R8 (&kr)[R], const R8 (&vr)[R]) {
    float s[G][R];
#pragma unroll
    for (int r = 0; r < R; r++) {
      float k8[8];
      cvt8(kr[r], k8);
      const bool valid = j0 + r * KPW + sub < end;
#pragma unroll
      for (int g = 0; g < G; g++) {
        float a = 0.f;
#pragma unroll
        for (int e = 0; e < 8; e++) a += qr[g][e] * k8[e];
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
        s[g][r] = valid ? a : -INFINITY;
      }
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
      float mx = m[g];
#pragma unroll
      for (int r = 0; r < R; r++) mx = fmaxf(mx, s[g][r]);
#pragma unroll
      for (int o = L; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      if (mx > m[g]) {  // warp-uniform
        const float alpha = __expf(m[g] - mx);  // m = -inf on the first keys: alpha = 0
        m[g] = mx;
        l[g] *= alpha;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[g][e] *= alpha;
      }
#pragma unroll
      for (int r = 0; r < R; r++) s[g][r] = __expf(s[g][r] - m[g]);  // -inf: 0
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
      float v8[8];
      cvt8(vr[r], v8);
#pragma unroll
      for (int g = 0; g < G; g++) {
        l[g] += s[g][r];
#pragma unroll
        for (int e = 0; e < 8; e++) acc[g][e] += s[g][r] * v8[e];
      }
    }
  };
  const int stride = nw * STEP;
  R8 ka[R], va[R], kb[R], vb[R];
  int j0 = start + warp * STEP;
  issue(j0, ka, va);
  for (; j0 < end; j0 += 2 * stride) {
    issue(j0 + stride, kb, vb);
    compute(j0, ka, va);
    if (j0 + stride >= end) break;
    issue(j0 + 2 * stride, ka, va);
    compute(j0 + stride, kb, vb);
  }
  // Merge the sub-groups of each warp (same max m within the warp)
#pragma unroll
  for (int g = 0; g < G; g++) {
#pragma unroll
    for (int o = L; o < 32; o <<= 1) {
      l[g] += __shfl_xor_sync(0xffffffffu, l[g], o);
#pragma unroll
      for (int e = 0; e < 8; e++) acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], o);
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < G; g++) {
      sm_m[warp * G + g] = m[g];
      sm_l[warp * G + g] = l[g];
    }
  }
  if (sub == 0 && active) {
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
      for (int e = 0; e < 8; e++) {
        const int x = sl * 8 + e;
        if (x < d) sm_acc[(warp * G + g) * d + x] = acc[g][e];
      }
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

#define ATTN(NAME, T, C, LANES, G)                                                                 \
  extern "C" __global__ void paged_attn_##NAME##_l##LANES##_g##G(                                  \
      T* out, float* part_out, float* part_ml, const T* q, const C* kc, const C* vc,          \
      const int* block_tables, const int* tok_seq, const int* tok_len, int hq, int hkv, int d, \
      int bs, int max_blocks, int part_size, int num_parts, float scale) {                     \
    paged_attn<T, C, LANES, G, 0>(out, part_out, part_ml, q, kc, vc, block_tables, tok_seq, tok_len,  \
                           hq, hkv, d, bs, max_blocks, part_size, num_parts, scale);           \
  }

#define ATTN_G(NAME, T, C, LANES) \
  ATTN(NAME, T, C, LANES, 1)      \
  ATTN(NAME, T, C, LANES, 2)      \
  ATTN(NAME, T, C, LANES, 4)      \
  ATTN(NAME, T, C, LANES, 8)

#define ATTN_ALL(NAME, T, C) \
  WRITE_KV(NAME, T, C)       \
  ATTN_G(NAME, T, C, 2)      \
  ATTN_G(NAME, T, C, 4)      \
  ATTN_G(NAME, T, C, 8)      \
  ATTN_G(NAME, T, C, 16)     \
  ATTN_G(NAME, T, C, 32)

// Variants of the Qwen3-4B shape (16 lanes per row, 4 query heads per KV head) with another
// number of rounds per iteration, for `pipeline bench attention`.
#define ATTN_R(NAME, T, C, R)                                                                  \
  extern "C" __global__ void paged_attn_##NAME##_l16_g4_r##R(                                  \
      T* out, float* part_out, float* part_ml, const T* q, const C* kc, const C* vc,          \
      const int* block_tables, const int* tok_seq, const int* tok_len, int hq, int hkv, int d, \
      int bs, int max_blocks, int part_size, int num_parts, float scale) {                     \
    paged_attn<T, C, 16, 4, R>(out, part_out, part_ml, q, kc, vc, block_tables, tok_seq,       \
                               tok_len, hq, hkv, d, bs, max_blocks, part_size, num_parts,      \
                               scale);                                                         \
  }
ATTN_R(bf16, __nv_bfloat16, __nv_bfloat16, 1)
ATTN_R(bf16, __nv_bfloat16, __nv_bfloat16, 4)
ATTN_R(bf16, __nv_bfloat16, __nv_bfloat16, 8)
ATTN_R(bf16_fp8, __nv_bfloat16, __nv_fp8_e4m3, 4)
ATTN_R(bf16_fp8, __nv_bfloat16, __nv_fp8_e4m3, 8)

// v5's rounds per stage: 4 where measured best (16 lanes, up to 4 query heads per KV head:
// Qwen3-4B; H100, 2026-11-27), else 2
#define V5_ROUNDS(LANES, G) ((LANES) == 16 && (G) <= 4 ? 4 : 2)
#define ATTN5(NAME, T, C, LANES, G)                                                            \
  extern "C" __global__ void paged_attn_##NAME##_l##LANES##_g##G##_v5(                             \
      T* out, float* part_out, float* part_ml, const T* q, const C* kc, const C* vc,          \
      const int* block_tables, const int* tok_seq, const int* tok_len, int hq, int hkv, int d, \
      int bs, int max_blocks, int part_size, int num_parts, float scale) {                     \
    paged_attn_v5<T, C, LANES, G, V5_ROUNDS(LANES, G)>(out, part_out, part_ml, q, kc, vc,        \
                                                      block_tables, tok_seq,                   \
                                  tok_len, hq, hkv, d, bs, max_blocks, part_size, num_parts,   \
                                  scale);                                                      \
  }
#define ATTN5_G(NAME, T, C, LANES) \
  ATTN5(NAME, T, C, LANES, 1)      \
  ATTN5(NAME, T, C, LANES, 2)      \
  ATTN5(NAME, T, C, LANES, 4)      \
  ATTN5(NAME, T, C, LANES, 8)
#define ATTN5_ALL(NAME, T, C) \
  ATTN5_G(NAME, T, C, 2)      \
  ATTN5_G(NAME, T, C, 4)      \
  ATTN5_G(NAME, T, C, 8)      \
  ATTN5_G(NAME, T, C, 16)     \
  ATTN5_G(NAME, T, C, 32)
ATTN5_ALL(bf16, __nv_bfloat16, __nv_bfloat16)
ATTN5_ALL(bf16_fp8, __nv_bfloat16, __nv_fp8_e4m3)
// v5 with one or two rounds per stage, for `pipeline bench attention`
#define ATTN5_R(NAME, T, C, R)                                                                 \
  extern "C" __global__ void paged_attn_##NAME##_l16_g4_v5r##R(                                \
      T* out, float* part_out, float* part_ml, const T* q, const C* kc, const C* vc,          \
      const int* block_tables, const int* tok_seq, const int* tok_len, int hq, int hkv, int d, \
      int bs, int max_blocks, int part_size, int num_parts, float scale) {                     \
    paged_attn_v5<T, C, 16, 4, R>(out, part_out, part_ml, q, kc, vc, block_tables, tok_seq,    \
                                  tok_len, hq, hkv, d, bs, max_blocks, part_size, num_parts,   \
                                  scale);                                                      \
  }
ATTN5_R(bf16, __nv_bfloat16, __nv_bfloat16, 1)
ATTN5_R(bf16, __nv_bfloat16, __nv_bfloat16, 2)
ATTN5_R(bf16_fp8, __nv_bfloat16, __nv_fp8_e4m3, 1)
ATTN5_R(bf16_fp8, __nv_bfloat16, __nv_fp8_e4m3, 2)

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
