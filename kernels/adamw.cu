// One parameter's AdamW update with f32 master weights and moments, in one pass, in place: the
// clipped gradient, both moments, the decayed weight less the step, the working copy, and the
// step's statistics as per-block partial sums. The maths is src/train/adamw.rs's `Step` (the
// reference: its host passes on the CPU), op for op in the same order, each product, sum,
// quotient and root rounded on its own (`__fmul_rn` and the like: no fused multiply-add), so
// that the same inputs give the same bits as the CPU. This file knows only the layouts:
//
//   p, m, v [n] (f32): the master weights and the moments, updated in place
//   g [n] (f32): the gradient
//   work [n] (bf16), or null: the model's working copy, set to the new weight
//   partials [gridDim.x][3] (f32): per block, sum (new - old)^2, sum old^2, and the count of
//        weights whose value in the stored dtype (0 f32, 1 bf16, 2 f16) changed; the squares
//        summed in f64 within the block
//
// Grid-stride over n; 256 threads a block. `sum_squares_f32` gives the gradient norm's partial
// sums the same way, one launch a gradient.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// `x * mul + add`, each rounded (candle's and the host's affine)
__device__ __forceinline__ float affine(float x, float mul, float add) {
  return __fadd_rn(__fmul_rn(x, mul), add);
}

__device__ __forceinline__ bool changed(float old_w, float new_w, int stored) {
  if (stored == 1) return __float2bfloat16_rn(new_w) != __float2bfloat16_rn(old_w);
  if (stored == 2) return __half2float(__float2half_rn(new_w)) != __half2float(__float2half_rn(old_w));
  return new_w != old_w;
}

// The step's constants as src/train/adamw.rs's `Step` holds them (f32): the gradient's clip
// multiplier (`has_clip` 0: none), the weight's decay multiplier (`has_decay` 0: none), the
// moments' factors, 1 / sqrt(1 - b2^t), eps and lr / (1 - b1^t).
extern "C" __global__ void __launch_bounds__(256)
    adamw_f32(float* __restrict__ p, float* __restrict__ m, float* __restrict__ v,
              const float* __restrict__ g, __nv_bfloat16* __restrict__ work,
              float* __restrict__ partials, int64_t n, float clip, int has_clip,
              float decay_mul, int has_decay, float b1, float one_b1, float b2, float one_b2,
              float inv_bias2_sqrt, float eps, float step_size, int stored) {
  struct {
    float clip, decay_mul, b1, one_b1, b2, one_b2, inv_bias2_sqrt, eps, step_size;
    int has_clip, has_decay, stored;
  } st = {clip, decay_mul, b1, one_b1, b2, one_b2, inv_bias2_sqrt, eps, step_size,
          has_clip, has_decay, stored};
  double upd = 0.0, par = 0.0, chg = 0.0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const float gr = st.has_clip ? affine(g[i], st.clip, 0.f) : g[i];
    // b1 m + (1 - b1) g; b2 v + (1 - b2) g^2
    const float mi = __fadd_rn(affine(m[i], st.b1, 0.f), affine(gr, st.one_b1, 0.f));
    const float vi =
        __fadd_rn(affine(v[i], st.b2, 0.f), affine(__fmul_rn(gr, gr), st.one_b2, 0.f));
    const float old_w = p[i];
    const float decayed = st.has_decay ? affine(old_w, st.decay_mul, 0.f) : old_w;
    const float denom = affine(affine(__fsqrt_rn(vi), st.inv_bias2_sqrt, 0.f), 1.f, st.eps);
    const float new_w = __fsub_rn(decayed, affine(__fdiv_rn(mi, denom), st.step_size, 0.f));
    m[i] = mi;
    v[i] = vi;
    p[i] = new_w;
    if (work) work[i] = __float2bfloat16_rn(new_w);
    // as the host sums them: the difference in f32, its square and the old weight's in f64
    const double d = (double)__fsub_rn(new_w, old_w);
    upd += d * d;
    par += (double)old_w * (double)old_w;
    chg += changed(old_w, new_w, st.stored) ? 1.0 : 0.0;
  }
  // the block's sums: warps by shuffles, then the warps' in shared memory
  __shared__ double red[3][8];
  for (int o = 16; o > 0; o >>= 1) {
    upd += __shfl_xor_sync(0xffffffffu, upd, o);
    par += __shfl_xor_sync(0xffffffffu, par, o);
    chg += __shfl_xor_sync(0xffffffffu, chg, o);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    red[0][warp] = upd;
    red[1][warp] = par;
    red[2][warp] = chg;
  }
  __syncthreads();
  if (threadIdx.x < 3) {
    double s = 0.0;
    for (int w = 0; w < (int)(blockDim.x / 32); w++) s += red[threadIdx.x][w];
    partials[(int64_t)blockIdx.x * 3 + threadIdx.x] = (float)s;
  }
}

// The gradient norm's share of one gradient: per block, the sum of g^2 in f64 (as the host
// sums it), written to partials[block] (f32). Grid-stride over n; 256 threads a block.
extern "C" __global__ void __launch_bounds__(256)
    sum_squares_f32(const float* __restrict__ g, float* __restrict__ partials, int64_t n) {
  double s = 0.0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const double x = (double)g[i];
    s += x * x;
  }
  __shared__ double red[8];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int w = 0; w < (int)(blockDim.x / 32); w++) t += red[w];
    partials[blockIdx.x] = (float)t;
  }
}
