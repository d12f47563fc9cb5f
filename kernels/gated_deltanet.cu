// Qwen3.5's Gated DeltaNet for decode steps (one new token per sequence), in two kernels that
// read and write each sequence's state once. The maths is the candle path's in
// src/model/layers/gated_deltanet.rs (the reference the GPU tests compare with); this file knows
// only the layouts:
//
//   qkv  [B][C] (T)    the in_proj_qkv projection, C = 2 nk dk + nv dv: q heads, k heads, v heads
//   a, b [B][nv] (T)   the in_proj_a / in_proj_b projections; z [B][nv dv] (T), the gate
//   state [B][values] (f32): the conv's last K-1 inputs [K-1][C], then per value head the
//        recurrent state [nv][dk][dv]; updated in place
//   conv_w [C][K] (T), a_log, dt_bias [nv] (T), norm_w [dv] (T)
//   u [B][C] (f32): the conv's output after SiLU; y [B][nv dv] (T): the gated norm's output
//
// Value head hv reads key head hv / (nv / nk) (each key head serves consecutive value heads).

#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
// x rounded to T and back: where the candle path holds a value in the model's dtype
template <typename T> __device__ __forceinline__ float round_t(float x) { return to_f(from_f<T>(x)); }

__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }

// The causal depthwise conv over the last K inputs, then SiLU; the new input joins the state.
// Grid-stride over B x C; K <= 8.
template <typename T>
__device__ void gdn_conv(const T* __restrict__ qkv, float* __restrict__ state,
                         const T* __restrict__ conv_w, float* __restrict__ u, int rows, int c,
                         int k, int64_t values) {
  const int64_t n = (int64_t)rows * c;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t b = i / c;
    const int ch = (int)(i % c);
    float* st = state + b * values + ch;  // st[j * c], j < k - 1: oldest first
    const float x = to_f(qkv[i]);
    float acc = x * to_f(conv_w[(int64_t)ch * k + k - 1]);
    float prev = 0.f;
    for (int j = k - 2; j >= 0; j--) {
      const float s = st[(int64_t)j * c];
      acc += s * to_f(conv_w[(int64_t)ch * k + j]);
      // shift: slot j takes what slot j + 1 held (the newest slot takes x)
      st[(int64_t)j * c] = j == k - 2 ? x : prev;
      prev = s;
    }
    u[i] = silu(acc);
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
// S [dk][dv], held in registers between the two passes the delta rule needs; the parts' partial
// sums meet in shared memory. dv x P must be a power of two.
template <typename T, int DK>
__device__ void gdn_recurrent(const float* __restrict__ u, const T* __restrict__ a,
                              const T* __restrict__ bproj, const T* __restrict__ z,
                              const T* __restrict__ a_log, const T* __restrict__ dt_bias,
                              const T* __restrict__ norm_w, float* __restrict__ state,
                              T* __restrict__ y, int nk, int nv, int dv, int c, int64_t values,
                              int64_t conv_len, float eps) {
  constexpr int ROWS = DK < 32 ? DK : 32;
  constexpr int P = DK / ROWS;
  extern __shared__ float sm[];
  float* qs = sm;              // [DK]
  float* ks = qs + DK;         // [DK]
  float* part_sum = ks + DK;   // [P][dv]
  float* red = part_sum + P * dv;  // [blockDim.x]
  const int b = blockIdx.x, hv = blockIdx.y;
  const int j = threadIdx.x % dv, part = threadIdx.x / dv;
  const int hk = hv / (nv / nk);
  const float* ub = u + (int64_t)b * c;
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
  const float av = to_f(a[(int64_t)b * nv + hv]) + to_f(dt_bias[hv]);
  const float sp = av > 20.f ? av : log1pf(__expf(av));
  const float decay = __expf(-__expf(to_f(a_log[hv])) * sp);
  const float beta = 1.f / (1.f + __expf(-to_f(bproj[(int64_t)b * nv + hv])));
  const int i0 = part * ROWS;
  float* S = state + (int64_t)b * values + conv_len + ((int64_t)hv * DK + i0) * dv + j;
  float s[ROWS];
  float rem = 0.f;
#pragma unroll
  for (int i = 0; i < ROWS; i++) {
    s[i] = S[(int64_t)i * dv] * decay;
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
    S[(int64_t)i * dv] = s[i];
  }
  part_sum[part * dv + j] = o;
  __syncthreads();
  o = 0.f;
#pragma unroll
  for (int p = 0; p < P; p++) o += part_sum[p * dv + j];
  // the gated RMSNorm of the head's output, each step rounded to T where the candle path is
  const float ot = round_t<T>(o);
  const float rstd = rsqrtf(block_sum(part == 0 ? ot * ot : 0.f, red) / dv + eps);
  if (part == 0) {
    const int64_t at = (int64_t)b * nv * dv + (int64_t)hv * dv + j;
    const float normed = round_t<T>(ot * rstd * to_f(norm_w[j]));
    const float gate = round_t<T>(silu(to_f(z[at])));
    y[at] = from_f<T>(normed * gate);
  }
}

#define GDN(NAME, T)                                                                           \
  extern "C" __global__ void gdn_conv_##NAME(const T* qkv, float* state, const T* conv_w,      \
                                             float* u, int rows, int c, int k,                 \
                                             int64_t values) {                                 \
    gdn_conv<T>(qkv, state, conv_w, u, rows, c, k, values);                                    \
  }                                                                                            \
  GDN_DK(NAME, T, 16) GDN_DK(NAME, T, 32) GDN_DK(NAME, T, 64) GDN_DK(NAME, T, 128)

#define GDN_DK(NAME, T, DK)                                                                    \
  extern "C" __global__ void __launch_bounds__(512) gdn_recurrent_##NAME##_dk##DK(           \
      const float* u, const T* a, const T* bproj, const T* z, const T* a_log,                  \
      const T* dt_bias, const T* norm_w, float* state, T* y, int nk, int nv, int dv, int c,    \
      int64_t values, int64_t conv_len, float eps) {                                           \
    gdn_recurrent<T, DK>(u, a, bproj, z, a_log, dt_bias, norm_w, state, y, nk, nv, dv, c,      \
                         values, conv_len, eps);                                               \
  }

GDN(f32, float)
GDN(bf16, __nv_bfloat16)
