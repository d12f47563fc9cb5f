// Row copies by index of 32-bit words, unchanged: between the recurrent layers' state-slot pool
// on the GPU and a step's gathered states (src/sampler/state_slots.rs; a pool is
// [slots][values] f32 per layer, a step's states [rows][values], row i belonging to slot
// rows[i]), and the sampler's row picks (src/cuda/rows.rs: the embedding lookup, RoPE rows and
// sampling rows, f32 or bf16 pairs). Knows nothing of what the values are.
//
// Grid: (rows, chunks); each block copies a grid-stride share of one row, 16 bytes at a time
// when `values` is a multiple of 4 (every Gated DeltaNet shape), else 4.

#include <stdint.h>

template <bool GATHER>
__device__ void copy_rows(float* __restrict__ dst, const float* __restrict__ src,
                          const int* __restrict__ rows, int64_t values) {
  const int64_t i = blockIdx.x;
  const int64_t slot = rows[i];
  const int64_t d = (GATHER ? i : slot) * values, s = (GATHER ? slot : i) * values;
  const int64_t stride = (int64_t)gridDim.y * blockDim.x;
  const int64_t first = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
  if (values % 4 == 0) {
    float4* d4 = reinterpret_cast<float4*>(dst + d);
    const float4* s4 = reinterpret_cast<const float4*>(src + s);
    for (int64_t j = first; j < values / 4; j += stride) d4[j] = s4[j];
  } else {
    for (int64_t j = first; j < values; j += stride) dst[d + j] = src[s + j];
  }
}

// dst[i] = pool[rows[i]]
extern "C" __global__ void gather_rows_f32(float* dst, const float* pool, const int* rows,
                                           int64_t values) {
  copy_rows<true>(dst, pool, rows, values);
}

// pool[rows[i]] = src[i] (rows distinct, but for a CUDA graph's padded rows, which share the
// padding slot: whichever write lands last is as good as any, and no real row reads that slot)
extern "C" __global__ void scatter_rows_f32(float* pool, const float* src, const int* rows,
                                            int64_t values) {
  copy_rows<false>(pool, src, rows, values);
}
