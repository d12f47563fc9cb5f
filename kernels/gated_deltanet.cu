// Qwen3.5's Gated DeltaNet for sampling steps, in two kernels that read and write each
// sequence's state once, whatever the number of tokens it brings (one in a decode step, a
// prompt's in a prefill): the conv update, then gating, l2norm, the delta rule and the gated
// RMSNorm, each looping over a sequence's tokens with its state in registers. The maths is the
// candle path's in src/model/layers/gated_deltanet.rs (the reference the GPU tests compare with);
// this file knows only the layouts:
//
//   qkv  [T][C] (T, rows ld_qkv apart)  the in_proj_qkv projection, C = 2 nk dk + nv dv: q heads,
//        k heads, v heads
//   a, b [T][nv], z [T][nv dv] (T, rows ld_a, ld_b, ld_z apart): in_proj_a, in_proj_b and the
//        gate in_proj_z (views of one stacked projection's output, or tensors of their own)
//   state rows (f32) [values]: the conv's last K-1 inputs [K-1][C], then per value head the
//        recurrent state [nv][dk][dv]; sequence s's row is ids[s] of `state` (a pool of state
//        slots), or row s when ids is null; updated in place
//   starts [S + 1] (int): sequence s brings tokens [starts[s], starts[s + 1]); null: one token
//        each (a decode step, T = S)
//   conv_w [C][K] (T), a_log, dt_bias [nv] (T), norm_w [dv] (T)
//   u [T][C] (f32): the conv's output after SiLU; y [T][nv dv] (T): the gated norm's output
//
// Value head hv reads key head hv / (nv / nk) (each key head serves consecutive value heads).

#include <stdint.h>

#include "dtype.cuh"

__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }

// Sequence s's tokens [*t0, *t1) and its state row.
__device__ __forceinline__ void seq_span(const int* __restrict__ starts,
                                         const int* __restrict__ ids, int s, int* t0, int* t1,
                                         int64_t* row) {
  *t0 = starts ? starts[s] : s;
  *t1 = starts ? starts[s + 1] : s + 1;
  *row = ids ? (int64_t)ids[s] : (int64_t)s;
}

// The causal depthwise conv over the last K inputs, then SiLU, token after token; each new input
// joins the window, which stays in registers from the state's read to its write. Grid-stride
// over S x C; K <= 8.
template <typename T>
__device__ void gdn_conv(const T* __restrict__ qkv, int64_t ld_qkv, float* __restrict__ state,
                         const int* __restrict__ ids, const int* __restrict__ starts,
                         const T* __restrict__ conv_w, float* __restrict__ u, int seqs, int c,
                         int k, int64_t values) {
  const int64_t n = (int64_t)seqs * c;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int s = (int)(i / c);
    const int ch = (int)(i % c);
    int t0, t1;
    int64_t row;
    seq_span(starts, ids, s, &t0, &t1, &row);
    float* st = state + row * values + ch;  // st[j * c], j < k - 1: oldest first
    // the taps on the window (oldest first) and on the new input, summed in the candle path's
    // order
    float w[7], win[7];
#pragma unroll
    for (int j = 0; j < 7; j++) {
      w[j] = j < k - 1 ? to_f(conv_w[(int64_t)ch * k + j]) : 0.f;
      win[j] = j < k - 1 ? st[(int64_t)j * c] : 0.f;
    }
    const float w_new = to_f(conv_w[(int64_t)ch * k + k - 1]);
    // a prompt's tokens: unrolled so that several tokens' loads are in flight at once
#pragma unroll 4
    for (int t = t0; t < t1; t++) {
      const float x = to_f(qkv[(int64_t)t * ld_qkv + ch]);
      float acc = win[0] * w[0];
#pragma unroll
      for (int j = 1; j < 7; j++)
        if (j < k - 1) acc += win[j] * w[j];
      acc += x * w_new;
      // shift: slot j takes what slot j + 1 held (the newest slot takes x)
#pragma unroll
      for (int j = 0; j < 7; j++)
        if (j < k - 1) win[j] = j == k - 2 ? x : win[j + 1 < 7 ? j + 1 : 6];
      u[(int64_t)t * c + ch] = silu(acc);
    }
#pragma unroll
    for (int j = 0; j < 7; j++)
      if (j < k - 1) st[(int64_t)j * c] = win[j];
  }
}

// Sum over the block (blockDim.x a power of two, <= 1024) through `red` (blockDim.x floats).
__device__ __forceinline__ float block_sum(float x, float* red) {
  red[threadIdx.x] = x;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  const float r = red[0];
  __syncthreads();
  return r;
}

// One block per (sequence, value head), dv x P threads (P = DK / ROWS, ROWS = min(DK, 32)):
// thread (part, j) owns rows [part ROWS, (part + 1) ROWS) of column j of the head's state
// S [dk][dv], held in registers from its read, through every token of the sequence, to its
// write; the parts' partial sums meet in shared memory. dv x P must be a power of two.
template <typename T, int DK>
__device__ void gdn_recurrent(const float* __restrict__ u, const T* __restrict__ a, int64_t ld_a,
                              const T* __restrict__ bproj, int64_t ld_b, const T* __restrict__ z,
                              int64_t ld_z, const T* __restrict__ a_log,
                              const T* __restrict__ dt_bias, const T* __restrict__ norm_w,
                              float* __restrict__ state, const int* __restrict__ ids,
                              const int* __restrict__ starts, T* __restrict__ y, int nk, int nv,
                              int dv, int c, int64_t values, int64_t conv_len, float eps) {
  constexpr int ROWS = DK < 32 ? DK : 32;
  constexpr int P = DK / ROWS;
  extern __shared__ float sm[];
  float* qs = sm;              // [DK]
  float* ks = qs + DK;         // [DK]
  float* part_sum = ks + DK;   // [P][dv]
  float* red = part_sum + P * dv;  // [blockDim.x]
  const int seq = blockIdx.x, hv = blockIdx.y;
  const int j = threadIdx.x % dv, part = threadIdx.x / dv;
  const int hk = hv / (nv / nk);
  int t0, t1;
  int64_t row;
  seq_span(starts, ids, seq, &t0, &t1, &row);
  const int i0 = part * ROWS;
  float* S = state + row * values + conv_len + ((int64_t)hv * DK + i0) * dv + j;
  float s[ROWS];
#pragma unroll
  for (int i = 0; i < ROWS; i++) s[i] = S[(int64_t)i * dv];
  const float rate = -__expf(to_f(a_log[hv]));
  const float bias = to_f(dt_bias[hv]);
  const float w_norm = to_f(norm_w[j]);
  for (int t = t0; t < t1; t++) {
    const float* ub = u + (int64_t)t * c;
    float qq = 0.f, kk = 0.f;
    for (int i = threadIdx.x; i < DK; i += blockDim.x) {
      const float qv = ub[hk * DK + i], kv = ub[nk * DK + hk * DK + i];
      qs[i] = qv;
      ks[i] = kv;
      qq += qv * qv;
      kk += kv * kv;
    }
    // l2norm (x / sqrt(sum x^2 + 1e-6)), q also scaled by 1/sqrt(dk)
    const float qn = rsqrtf(block_sum(qq, red) + 1e-6f) * rsqrtf((float)DK);
    const float kn = rsqrtf(block_sum(kk, red) + 1e-6f);
    for (int i = threadIdx.x; i < DK; i += blockDim.x) {
      qs[i] *= qn;
      ks[i] *= kn;
    }
    __syncthreads();
    const float av = to_f(a[(int64_t)t * ld_a + hv]) + bias;
    const float sp = av > 20.f ? av : log1pf(__expf(av));
    const float decay = __expf(rate * sp);
    const float beta = 1.f / (1.f + __expf(-to_f(bproj[(int64_t)t * ld_b + hv])));
    float rem = 0.f;
#pragma unroll
    for (int i = 0; i < ROWS; i++) {
      s[i] *= decay;
      rem += ks[i0 + i] * s[i];
    }
    part_sum[part * dv + j] = rem;
    __syncthreads();
    rem = 0.f;
#pragma unroll
    for (int p = 0; p < P; p++) rem += part_sum[p * dv + j];
    __syncthreads();
    const float v = ub[2 * nk * DK + hv * dv + j];
    const float delta = (v - rem) * beta;
    float o = 0.f;
#pragma unroll
    for (int i = 0; i < ROWS; i++) {
      s[i] += ks[i0 + i] * delta;
      o += qs[i0 + i] * s[i];
    }
    part_sum[part * dv + j] = o;
    __syncthreads();
    o = 0.f;
#pragma unroll
    for (int p = 0; p < P; p++) o += part_sum[p * dv + j];
    // the gated RMSNorm of the head's output, each step rounded to T where the candle path is;
    // block_sum's barriers also end this token's reads of qs, ks and part_sum
    const float ot = round_t<T>(o);
    const float rstd = rsqrtf(block_sum(part == 0 ? ot * ot : 0.f, red) / dv + eps);
    if (part == 0) {
      const int64_t at = (int64_t)t * nv * dv + (int64_t)hv * dv + j;
      const float normed = round_t<T>(ot * rstd * w_norm);
      const float gate = round_t<T>(silu(to_f(z[(int64_t)t * ld_z + (int64_t)hv * dv + j])));
      y[at] = from_f<T>(normed * gate);
    }
  }
#pragma unroll
  for (int i = 0; i < ROWS; i++) S[(int64_t)i * dv] = s[i];
}

#define GDN(NAME, T)                                                                           \
  extern "C" __global__ void gdn_conv_##NAME(const T* qkv, int64_t ld_qkv, float* state,       \
                                             const int* ids, const int* starts,                \
                                             const T* conv_w, float* u, int seqs, int c,       \
                                             int k, int64_t values) {                          \
    gdn_conv<T>(qkv, ld_qkv, state, ids, starts, conv_w, u, seqs, c, k, values);               \
  }                                                                                            \
  GDN_DK(NAME, T, 16) GDN_DK(NAME, T, 32) GDN_DK(NAME, T, 64) GDN_DK(NAME, T, 128)

#define GDN_DK(NAME, T, DK)                                                                    \
  extern "C" __global__ void __launch_bounds__(512) gdn_recurrent_##NAME##_dk##DK(           \
      const float* u, const T* a, int64_t ld_a, const T* bproj, int64_t ld_b, const T* z,      \
      int64_t ld_z, const T* a_log, const T* dt_bias, const T* norm_w, float* state,           \
      const int* ids, const int* starts, T* y, int nk, int nv, int dv, int c, int64_t values,  \
      int64_t conv_len, float eps) {                                                           \
    gdn_recurrent<T, DK>(u, a, ld_a, bproj, ld_b, z, ld_z, a_log, dt_bias, norm_w, state, ids, \
                         starts, y, nk, nv, dv, c, values, conv_len, eps);                     \
  }

GDN(f32, float)
GDN(bf16, __nv_bfloat16)
