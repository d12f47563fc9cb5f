// The element conversions every kernel file shares (included, not compiled on its own): a
// value of the model's dtype (f32 or bf16) to f32 and back, and f32 rounded through a dtype,
// where a kernel follows the candle path that holds a value in the model's dtype. A file with
// more dtypes (the fp8 KV cache) adds its own overloads beside these.
#pragma once

#include <cuda_bf16.h>

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}

// x rounded to T and back
template <typename T> __device__ __forceinline__ float round_t(float x) { return to_f(from_f<T>(x)); }
