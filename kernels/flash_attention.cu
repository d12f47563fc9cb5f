// FlashAttention-2 for training (issue 51): causal attention forward and backward over packed
// sequences, bf16 inputs, f32 accumulation, on the tensor cores through WMMA (16x16x16 bf16
// fragments). The tiling, masks and online softmax are src/model/attention/flash.rs's, which
// the CPU checks against the definition; tests/cuda.rs checks these kernels against it.
//
//   q, o, dO [T][Hq][D] (bf16)   k, v [T][Hkv][D] (bf16)   sequences end to end, starts[n + 1]
//   lse, delta [Hq][T] (f32)     dq [T][Hq][D] (f32, zeroed, added to atomically)
//   dk, dv [T][Hkv][D] (f32, written whole)
//
// Query head h reads KV head h / (Hq / Hkv). window > 0: query i sees keys [i + 1 - window, i].
// Scores are kept in log2 units (scale_log2 = log2(e) / sqrt(D)), so exp is exp2; lse is stored
// in natural units.
//
// forward  grid (query tiles, Hq, sequences), 4 warps; each warp owns 16 of the 64 query rows:
//          S = Q K^T by fragments into shared f32, the online softmax by two lanes per row,
//          P (bf16) V added to the row's f32 output in shared memory.
// backward grid (key tiles, Hkv, sequences), 4 warps; the program owns a key tile of one KV
//          head and loops over the head's query heads and the query tiles that see it:
//          S, dP = dO V^T, dS = P (dP - delta) scale; dV += P^T dO, dK += dS^T Q in shared
//          f32 (written once at the end: no atomics), dQ += dS K added atomically.

#include <cuda_bf16.h>
#include <mma.h>
#include <stdint.h>

using namespace nvcuda;
typedef __nv_bfloat16 bf16;

constexpr int WARPS = 4;
constexpr int THREADS = WARPS * 32;
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

// Shared tiles are padded (bf16 rows by 8, f32 rows by 4) so that the 16 rows of a fragment
// start in 8 different banks: unpadded, rows of 128 bf16 or 64 f32 all start in bank 0, and
// every fragment load or store is a 16-way bank conflict.
__host__ __device__ constexpr int ld_h(int cols) { return cols + 8; }
__host__ __device__ constexpr int ld_f(int cols) { return cols + 4; }

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> ARow;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> ACol;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> BRow;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> BCol;

// dst[r][c] (row stride LD) = src[((start + r0 + r) * heads + head) * D + c] for r < valid,
// else 0; N rows. 16-byte loads (D a multiple of 8, rows 16-byte aligned), unrolled so that
// many are in flight at once.
template <int D, int LD, int N>
__device__ __forceinline__ void load_rows(bf16* dst, const bf16* __restrict__ src, int start,
                                          int r0, int valid, int heads, int head) {
  constexpr int V = D / 8;
  static_assert((N * V) % THREADS == 0, "whole passes of the block");
#pragma unroll
  for (int pass = 0; pass < N * V / THREADS; pass++) {
    const int idx = pass * THREADS + threadIdx.x;
    const int r = idx / V, c = (idx % V) * 8;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (r < valid) {
      x = *reinterpret_cast<const uint4*>(src + ((int64_t)(start + r0 + r) * heads + head) * D + c);
    }
    *reinterpret_cast<uint4*>(dst + r * LD + c) = x;
  }
}

__device__ __forceinline__ bool sees(int i, int j, int len, int window) {
  return i < len && j < len && j <= i && (window <= 0 || j > i - window);
}

// out (M x N, f32, ld ldo) = a (M x K) b (K x N) by 16 x 16 fragments, spread over the warps.
// A_T: a is stored transposed (K x M row-major, ld lda); B_T: b is stored transposed (N x K).
// ACC: out is added to (loaded first) instead of overwritten.
template <int M, int N, int K, bool A_T, bool B_T, bool ACC>
__device__ __forceinline__ void gemm(float* out, int ldo, const bf16* a, int lda, const bf16* b,
                                     int ldb) {
  const int warp = threadIdx.x / 32;
  for (int f = warp; f < (M / 16) * (N / 16); f += WARPS) {
    const int mt = f / (N / 16), nt = f % (N / 16);
    Acc acc;
    if (ACC) {
      wmma::load_matrix_sync(acc, out + mt * 16 * ldo + nt * 16, ldo, wmma::mem_row_major);
    } else {
      wmma::fill_fragment(acc, 0.f);
    }
#pragma unroll 4
    for (int kk = 0; kk < K / 16; kk++) {
      if (A_T) {
        ACol fa;
        wmma::load_matrix_sync(fa, a + kk * 16 * lda + mt * 16, lda);
        if (B_T) {
          BCol fb;
          wmma::load_matrix_sync(fb, b + nt * 16 * ldb + kk * 16, ldb);
          wmma::mma_sync(acc, fa, fb, acc);
        } else {
          BRow fb;
          wmma::load_matrix_sync(fb, b + kk * 16 * ldb + nt * 16, ldb);
          wmma::mma_sync(acc, fa, fb, acc);
        }
      } else {
        ARow fa;
        wmma::load_matrix_sync(fa, a + mt * 16 * lda + kk * 16, lda);
        if (B_T) {
          BCol fb;
          wmma::load_matrix_sync(fb, b + nt * 16 * ldb + kk * 16, ldb);
          wmma::mma_sync(acc, fa, fb, acc);
        } else {
          BRow fb;
          wmma::load_matrix_sync(fb, b + kk * 16 * ldb + nt * 16, ldb);
          wmma::mma_sync(acc, fa, fb, acc);
        }
      }
    }
    wmma::store_matrix_sync(out + mt * 16 * ldo + nt * 16, acc, ldo, wmma::mem_row_major);
  }
}

// Shared memory of the forward: Q, K, V tiles (bf16), S (f32), O (f32), P (bf16), padded.
template <int D, int BR, int BC>
constexpr int fwd_shared() {
  return (BR + 2 * BC) * ld_h(D) * 2 + BR * ld_f(BC) * 4 + BR * ld_f(D) * 4 + BR * ld_h(BC) * 2;
}

template <int D, int BR, int BC>
__device__ void flash_fwd(const bf16* __restrict__ q, const bf16* __restrict__ k,
                          const bf16* __restrict__ v, bf16* __restrict__ o,
                          float* __restrict__ lse, const int* __restrict__ starts, int total,
                          int hq, int hkv, float scale_log2, int window) {
  static_assert(BR == WARPS * 16, "a warp owns 16 query rows");
  constexpr int LH = ld_h(D), LS = ld_f(BC), LO = ld_f(D), LP = ld_h(BC);
  const int seq = blockIdx.z, start = starts[seq], len = starts[seq + 1] - start;
  const int q0 = blockIdx.x * BR;
  if (q0 >= len) return;
  const int h = blockIdx.y, g = h / (hq / hkv);
  const int rows = min(BR, len - q0);
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sK = sQ + BR * LH;
  bf16* sV = sK + BC * LH;
  float* sS = reinterpret_cast<float*>(sV + BC * LH);
  float* sO = sS + BR * LS;
  bf16* sP = reinterpret_cast<bf16*>(sO + BR * LO);

  load_rows<D, LH, BR>(sQ, q, start, q0, rows, hq, h);
  for (int x = threadIdx.x; x < BR * LO; x += THREADS) sO[x] = 0.f;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = warp * 16 + lane / 2, half = lane & 1;  // two lanes per row
  const int i = q0 + r;
  float m = -INFINITY, l = 0.f;
  const int kb = window > 0 ? max(0, q0 + 1 - window) / BC * BC : 0;
  const int ke = q0 + rows;
  for (int k0 = kb; k0 < ke; k0 += BC) {
    const int n = min(BC, len - k0);
    __syncthreads();  // the last tile's K and V are no longer read
    load_rows<D, LH, BC>(sK, k, start, k0, n, hkv, g);
    load_rows<D, LH, BC>(sV, v, start, k0, n, hkv, g);
    __syncthreads();
    // this warp's 16 rows of S = Q K^T (K^T: K read column-major)
    for (int nt = 0; nt < BC / 16; nt++) {
      Acc acc;
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) {
        ARow fa;
        BCol fb;
        wmma::load_matrix_sync(fa, sQ + warp * 16 * LH + kk * 16, LH);
        wmma::load_matrix_sync(fb, sK + nt * 16 * LH + kk * 16, LH);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(sS + warp * 16 * LS + nt * 16, acc, LS, wmma::mem_row_major);
    }
    __syncwarp();
    float* srow = sS + r * LS;
    bf16* prow = sP + r * LP;
    const int c0 = half * (BC / 2);
    float mx = -INFINITY;
    for (int c = c0; c < c0 + BC / 2; c++) {
      const float s = sees(i, k0 + c, len, window) ? srow[c] * scale_log2 : -INFINITY;
      srow[c] = s;
      mx = fmaxf(mx, s);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, mx);
    float alpha = 1.f, sum = 0.f;
    if (m_new == -INFINITY) {
      for (int c = c0; c < c0 + BC / 2; c++) prow[c] = __float2bfloat16(0.f);
    } else {
      alpha = exp2f(m - m_new);
      for (int c = c0; c < c0 + BC / 2; c++) {
        const float p = exp2f(srow[c] - m_new);
        sum += p;
        prow[c] = __float2bfloat16(p);
      }
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    float* orow = sO + r * LO;
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); c++) orow[c] *= alpha;
    __syncwarp();
    // this warp's 16 rows of O += P V
    for (int dt = 0; dt < D / 16; dt++) {
      Acc acc;
      wmma::load_matrix_sync(acc, sO + warp * 16 * LO + dt * 16, LO, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < BC / 16; kk++) {
        ARow fa;
        BRow fb;
        wmma::load_matrix_sync(fa, sP + warp * 16 * LP + kk * 16, LP);
        wmma::load_matrix_sync(fb, sV + kk * 16 * LH + dt * 16, LH);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(sO + warp * 16 * LO + dt * 16, acc, LO, wmma::mem_row_major);
    }
  }
  __syncwarp();
  if (r < rows) {
    const float inv = 1.f / l;
    bf16* out = o + ((int64_t)(start + i) * hq + h) * D;
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); c++) {
      out[c] = __float2bfloat16(sO[r * LO + c] * inv);
    }
    if (half == 0) lse[(int64_t)h * total + start + i] = (m + log2f(l)) * LN2;
  }
}

// delta[h][t] = sum_c dO[t][h][c] O[t][h][c], one warp per (t, h).
extern "C" __global__ void flash_bwd_delta(const bf16* __restrict__ d_o,
                                           const bf16* __restrict__ o, float* __restrict__ delta,
                                           int total, int hq, int d) {
  const int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= (int64_t)total * hq) return;
  const int lane = threadIdx.x % 32;
  float s = 0.f;
  for (int c = lane; c < d; c += 32) {
    s += __bfloat162float(d_o[row * d + c]) * __bfloat162float(o[row * d + c]);
  }
  for (int w = 16; w > 0; w >>= 1) s += __shfl_xor_sync(0xffffffffu, s, w);
  if (lane == 0) {
    const int64_t t = row / hq, h = row % hq;
    delta[h * total + t] = s;
  }
}

// Shared memory of the backward, padded: K, V (bf16, BC rows), Q, dO (bf16, BR rows), S and dP
// (f32), P and dS (bf16), dK and dV (f32, BC rows), lse and delta (BR), a 16 x 20 f32 scratch
// per warp.
constexpr int SCRATCH = 16 * 20;
template <int D, int BR, int BC>
constexpr int bwd_shared() {
  return 2 * (BC + BR) * ld_h(D) * 2 + 2 * BR * ld_f(BC) * 4 + 2 * BR * ld_h(BC) * 2 +
         2 * BC * ld_f(D) * 4 + 2 * BR * 4 + WARPS * SCRATCH * 4;
}

template <int D, int BR, int BC>
__device__ void flash_bwd(const bf16* __restrict__ q, const bf16* __restrict__ k,
                          const bf16* __restrict__ v, const bf16* __restrict__ d_o,
                          const float* __restrict__ lse, const float* __restrict__ delta,
                          float* __restrict__ dq, float* __restrict__ dk,
                          float* __restrict__ dv, const int* __restrict__ starts, int total,
                          int hq, int hkv, float scale, int window) {
  constexpr int LH = ld_h(D), LS = ld_f(BC), LP = ld_h(BC), LO = ld_f(D);
  const int seq = blockIdx.z, start = starts[seq], len = starts[seq + 1] - start;
  const int k0 = blockIdx.x * BC;
  if (k0 >= len) return;
  const int g = blockIdx.y, n_rep = hq / hkv;
  const int n = min(BC, len - k0);
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);
  bf16* sV = sK + BC * LH;
  bf16* sQ = sV + BC * LH;
  bf16* sdO = sQ + BR * LH;
  float* sS = reinterpret_cast<float*>(sdO + BR * LH);
  float* sdP = sS + BR * LS;
  bf16* sP = reinterpret_cast<bf16*>(sdP + BR * LS);
  bf16* sdS = sP + BR * LP;
  float* sdK = reinterpret_cast<float*>(sdS + BR * LP);
  float* sdV = sdK + BC * LO;
  float* sL = sdV + BC * LO;
  float* sD = sL + BR;
  float* scratch = sD + BR + (threadIdx.x / 32) * SCRATCH;

  load_rows<D, LH, BC>(sK, k, start, k0, n, hkv, g);
  load_rows<D, LH, BC>(sV, v, start, k0, n, hkv, g);
  for (int x = threadIdx.x; x < BC * LO; x += THREADS) {
    sdK[x] = 0.f;
    sdV[x] = 0.f;
  }
  const float scale_log2 = scale * LOG2E;
  const int qb = k0 / BR * BR;
  const int qe = window > 0 ? min(k0 + n - 1 + window, len) : len;
  for (int h = g * n_rep; h < (g + 1) * n_rep; h++) {
    for (int q0 = qb; q0 < qe; q0 += BR) {
      const int rows = min(BR, len - q0);
      __syncthreads();  // the last tile's Q, dO, P and dS are no longer read
      load_rows<D, LH, BR>(sQ, q, start, q0, rows, hq, h);
      load_rows<D, LH, BR>(sdO, d_o, start, q0, rows, hq, h);
      for (int r = threadIdx.x; r < BR; r += THREADS) {
        const bool in = r < rows;
        sL[r] = in ? lse[(int64_t)h * total + start + q0 + r] * LOG2E : 0.f;
        sD[r] = in ? delta[(int64_t)h * total + start + q0 + r] : 0.f;
      }
      __syncthreads();
      gemm<BR, BC, D, false, true, false>(sS, LS, sQ, LH, sK, LH);    // S = Q K^T
      gemm<BR, BC, D, false, true, false>(sdP, LS, sdO, LH, sV, LH);  // dP = dO V^T
      __syncthreads();
      for (int x = threadIdx.x; x < BR * BC; x += THREADS) {
        const int r = x / BC, c = x % BC;
        float p = 0.f;
        if (sees(q0 + r, k0 + c, len, window)) p = exp2f(sS[r * LS + c] * scale_log2 - sL[r]);
        sP[r * LP + c] = __float2bfloat16(p);
        sdS[r * LP + c] = __float2bfloat16(p * (sdP[r * LS + c] - sD[r]) * scale);
      }
      __syncthreads();
      gemm<BC, D, BR, true, false, true>(sdV, LO, sP, LP, sdO, LH);  // dV += P^T dO
      gemm<BC, D, BR, true, false, true>(sdK, LO, sdS, LP, sQ, LH);  // dK += dS^T Q
      // dQ += dS K, by fragments through this warp's scratch, added atomically
      const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
      for (int f = warp; f < (BR / 16) * (D / 16); f += WARPS) {
        const int mt = f / (D / 16), dt = f % (D / 16);
        if (mt * 16 >= rows) continue;
        Acc acc;
        wmma::fill_fragment(acc, 0.f);
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
          ARow fa;
          BRow fb;
          wmma::load_matrix_sync(fa, sdS + mt * 16 * LP + kk * 16, LP);
          wmma::load_matrix_sync(fb, sK + kk * 16 * LH + dt * 16, LH);
          wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(scratch, acc, 20, wmma::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {
          const int r = mt * 16 + e / 16;
          if (r < rows) {
            atomicAdd(dq + ((int64_t)(start + q0 + r) * hq + h) * D + dt * 16 + e % 16,
                      scratch[(e / 16) * 20 + e % 16]);
          }
        }
        __syncwarp();
      }
    }
  }
  __syncthreads();
  for (int x = threadIdx.x; x < n * D; x += THREADS) {
    const int c = x / D, e = x % D;
    const int64_t at = ((int64_t)(start + k0 + c) * hkv + g) * D + e;
    dk[at] = sdK[c * LO + e];
    dv[at] = sdV[c * LO + e];
  }
}

#define FLASH(D, BR, BC, BBR, BBC)                                                              \
  extern "C" __global__ void __launch_bounds__(THREADS) flash_fwd_d##D(                        \
      const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse, const int* starts,      \
      int total, int hq, int hkv, float scale_log2, int window) {                               \
    flash_fwd<D, BR, BC>(q, k, v, o, lse, starts, total, hq, hkv, scale_log2, window);         \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(THREADS) flash_bwd_d##D(                        \
      const bf16* q, const bf16* k, const bf16* v, const bf16* d_o, const float* lse,           \
      const float* delta, float* dq, float* dk, float* dv, const int* starts, int total,         \
      int hq, int hkv, float scale, int window) {                                               \
    flash_bwd<D, BBR, BBC>(q, k, v, d_o, lse, delta, dq, dk, dv, starts, total, hq, hkv, scale, \
                           window);                                                             \
  }

// head_dim, forward tiles (query rows, keys), backward tiles (query rows, keys)
FLASH(64, 64, 64, 64, 64)
FLASH(128, 64, 64, 64, 64)
FLASH(256, 64, 64, 64, 32)
