// Layer operations of a sampling step as one kernel each where candle runs several. The maths
// is the candle path's in src/model/layer_ops/candle_ops.rs (the reference the GPU tests compare
// with), rounded to T where that path holds a value in the model's dtype; this file knows only
// the layouts.
//
// qkv_rope: the attention layer's q/k/v epilogue, one kernel where candle ran up to eight: the
// stacked q/k/v projection's rows split into q, k and v (and Qwen3.5's output gate), the
// per-head RMS norms of q and k, RoPE on each head's leading dims, the query scale.
//   y [T][W] (T, rows ld apart): per token the q part (hq heads of D, or with a gate hq x
//        [query D, gate D]), then hkv key heads of D, then hkv value heads of D
//   q_norm, k_norm [D] (T): the norms' scales (the offset of a zero-centred norm applied); null
//        for a model without per-head norms
//   cos, sin [T][R/2] (T): RoPE on dims [0, R) of each head, rotate-half pairs (i, i + R/2)
//   q [T][hq][D], k, v [T][hkv][D], gate [T][hq D] (T)
//   Grid (T, hq + 2 hkv (+ hq with a gate)); block D threads (D a multiple of 32, <= 512), one
//   element each.
//
// add_rms_norm: the residual add and the next norm, `s = x + y`, `h = rmsnorm(s) * w`:
//   x, y, s, h [T][H] (T), w [H] (T). One block per row, a grid-stride over its elements.
//
// gate_up_act: the gated MLP's activation product `act(g) * u` of the stacked gate/up
// projection's rows: SiLU, or GELU's tanh approximation (GeGLU).
//   y [T][2 I] (T, rows ld apart): g = y[t][0, I), u = y[t][I, 2 I); out [T][I] (T).

#include <stdint.h>

#include "dtype.cuh"

// Sum over the block's warps (blockDim.x a multiple of 32, <= 1024) through `red` (32 floats).
__device__ __forceinline__ float head_sum(float x, float* red) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) red[warp] = x;
  __syncthreads();
  float s = lane < warps ? red[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  __syncthreads();
  return s;
}

template <typename T>
__device__ void qkv_rope(const T* __restrict__ y, int64_t ld, const T* __restrict__ q_norm,
                         const T* __restrict__ k_norm, const T* __restrict__ cos,
                         const T* __restrict__ sin, T* __restrict__ q, T* __restrict__ k,
                         T* __restrict__ v, T* __restrict__ gate, int hq, int hkv, int d, int r,
                         int gated, float eps, float q_scale) {
  __shared__ float red[32];
  __shared__ float row[512];
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, i = threadIdx.x;
  const int head_cols = gated ? 2 * d : d;
  const T* yt = y + t * ld;
  const int64_t kv_at = (int64_t)hq * head_cols;
  if (h >= hq + hkv) {
    // a value head, or a gate: copied
    const int j = h - hq - hkv;
    if (j < hkv) {
      v[(t * hkv + j) * d + i] = yt[kv_at + (int64_t)(hkv + j) * d + i];
    } else {
      const int g = j - hkv;
      gate[(t * hq + g) * d + i] = yt[(int64_t)g * head_cols + d + i];
    }
    return;
  }
  const bool is_q = h < hq;
  const int head = is_q ? h : h - hq;
  float x = to_f(is_q ? yt[(int64_t)head * head_cols + i] : yt[kv_at + (int64_t)head * d + i]);
  const T* w = is_q ? q_norm : k_norm;
  if (w) {
    // candle's fused rms_norm: f32 sums, one rounding of x * rstd * w
    const float rstd = rsqrtf(head_sum(x * x, red) / d + eps);
    x = round_t<T>(x * rstd * to_f(w[i]));
  }
  row[i] = x;
  __syncthreads();
  if (i < r) {
    // candle's rope_thd: out[i] = x[i] cos - x[i + R/2] sin, out[i + R/2] = x[i + R/2] cos +
    // x[i] sin
    const int half = r / 2, p = i < half ? i : i - half;
    const float c = to_f(cos[t * half + p]), s = to_f(sin[t * half + p]);
    x = i < half ? row[i] * c - row[i + half] * s : row[i] * c + row[i - half] * s;
    x = round_t<T>(x);
  }
  if (is_q) {
    if (q_scale != 1.f) x = round_t<T>(x * q_scale);
    q[(t * hq + head) * d + i] = from_f<T>(x);
  } else {
    k[(t * hkv + head) * d + i] = from_f<T>(x);
  }
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024) through `red` (32 floats), for
// blocks that loop over a row.
__device__ __forceinline__ float block_sum(float x, float* red) { return head_sum(x, red); }

template <typename T>
__device__ void add_rms_norm(const T* __restrict__ x, const T* __restrict__ y,
                             const T* __restrict__ w, T* __restrict__ s, T* __restrict__ h, int hid,
                             float eps) {
  __shared__ float red[32];
  const int64_t at = (int64_t)blockIdx.x * hid;
  float ss = 0.f;
  for (int i = threadIdx.x; i < hid; i += blockDim.x) {
    // candle's add in T, then its fused rms_norm over the rounded sum
    const T sum = from_f<T>(to_f(x[at + i]) + to_f(y[at + i]));
    s[at + i] = sum;
    const float v = to_f(sum);
    ss += v * v;
  }
  const float rstd = rsqrtf(block_sum(ss, red) / hid + eps);
  for (int i = threadIdx.x; i < hid; i += blockDim.x)
    h[at + i] = from_f<T>(to_f(s[at + i]) * rstd * to_f(w[i]));
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.f + __expf(-x)); }
__device__ __forceinline__ float gelu_tanh_f(float x) {
  const float c = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.f + tanhf(c * (x + 0.044715f * x * x * x)));
}

template <typename T>
__device__ void gate_up_act(const T* __restrict__ y, int64_t ld, T* __restrict__ out, int inter,
                            int64_t n, int gelu) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = i / inter;
    const int j = (int)(i % inter);
    const float g = to_f(y[t * ld + j]), u = to_f(y[t * ld + inter + j]);
    // the activation rounded to T, then the product (candle's two ops)
    const float a = round_t<T>(gelu ? gelu_tanh_f(g) : silu_f(g));
    out[i] = from_f<T>(a * u);
  }
}

#define QKV_ROPE(NAME, T)                                                                       \
  extern "C" __global__ void qkv_rope_##NAME(                                                   \
      const T* y, int64_t ld, const T* q_norm, const T* k_norm, const T* cos, const T* sin,     \
      T* q, T* k, T* v, T* gate, int hq, int hkv, int d, int r, int gated, float eps,           \
      float q_scale) {                                                                          \
    qkv_rope<T>(y, ld, q_norm, k_norm, cos, sin, q, k, v, gate, hq, hkv, d, r, gated, eps,      \
                q_scale);                                                                       \
  }

#define ROW_OPS(NAME, T)                                                                        \
  extern "C" __global__ void add_rms_norm_##NAME(const T* x, const T* y, const T* w, T* s,      \
                                                 T* h, int hid, float eps) {                    \
    add_rms_norm<T>(x, y, w, s, h, hid, eps);                                                   \
  }                                                                                             \
  extern "C" __global__ void gate_up_act_##NAME(const T* y, int64_t ld, T* out, int inter,      \
                                                int64_t n, int gelu) {                          \
    gate_up_act<T>(y, ld, out, inter, n, gelu);                                                 \
  }

QKV_ROPE(f32, float)
QKV_ROPE(bf16, __nv_bfloat16)
ROW_OPS(f32, float)
ROW_OPS(bf16, __nv_bfloat16)
