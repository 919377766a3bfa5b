// One row's RMSNorm by a block (rmsnorm_kernel / add_rmsnorm_kernel in elementwise.cu, and the
// GEMVs' fused add + RMSNorm epilogue in gemv_norm.cuh): the row in chunks of kNormPer elements
// per thread with their loads in flight together, the sum of squares in double (as the CPU
// reference), reduced over the block.
#pragma once

#include <cstdint>

#include "backend/cuda/device_util.cuh"

namespace qs::cuda {

// The sum of every thread's `sum` (blockDim.x a multiple of 32, at most 1024), in the same order
// for every kernel that calls it with the same block size. warp_sums: shared, 32 doubles.
__device__ __forceinline__ double block_sum(double sum, double* warp_sums) {
  sum = warp_sum(sum);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    const int num_warps = blockDim.x / 32;
    double s = lane < num_warps ? warp_sums[lane] : 0.0;
    s = warp_sum(s);
    if (lane == 0) warp_sums[0] = s;
  }
  __syncthreads();
  return warp_sums[0];
}

// 1 / sqrt(mean + eps) of a row of d values whose squares sum to sum_sq (the CPU's arithmetic).
__device__ __forceinline__ float inv_rms_of(double sum_sq, int64_t d, float eps) {
  const float variance = static_cast<float>(sum_sq / static_cast<double>(d));
  return 1.0f / sqrtf(variance + eps);
}

// A row's elements j = threadIdx.x + i * blockDim.x, kNormPer of them per thread at a time with
// their loads in flight together (one at a time, each a dependent L2 round trip, made a 4096-wide
// row cost ~6 us on the H200, session 23). Rows up to kNormPer * blockDim.x (8192 at 1024
// threads) take one chunk and stay in registers for the output.
constexpr int kNormPer = 8;

__device__ __forceinline__ int64_t norm_index(int64_t base, int i) {
  return base + threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
}

// COHERENT: through L2 (ld.global.cg), for rows that other blocks of the running kernel wrote.
template <bool COHERENT = false>
__device__ __forceinline__ void load_norm_chunk(const float* p, int64_t base, int64_t d,
                                                float (&v)[kNormPer]) {
#pragma unroll
  for (int i = 0; i < kNormPer; ++i) {
    const int64_t j = norm_index(base, i);
    v[i] = j < d ? (COHERENT ? __ldcg(p + j) : p[j]) : 0.0f;
  }
}

__device__ __forceinline__ void load_weight_chunk(const void* weight, DType weight_dtype,
                                                  int64_t base, int64_t d, float (&w)[kNormPer]) {
#pragma unroll
  for (int i = 0; i < kNormPer; ++i) {
    const int64_t j = norm_index(base, i);
    w[i] = j < d ? load_as_float(weight, weight_dtype, j) : 0.0f;
  }
}

// sum + the squares of the chunk's elements in index order (as one strided loop over the row).
__device__ __forceinline__ double add_squares(const float (&v)[kNormPer], int64_t base, int64_t d,
                                              double sum) {
#pragma unroll
  for (int i = 0; i < kNormPer; ++i) {
    if (norm_index(base, i) < d) sum += static_cast<double>(v[i] * v[i]);
  }
  return sum;
}

// out = weight * (src * inv_rms) over the row; v holds src's last chunk (its only one when
// the row fits in one), w the weight's first.
template <bool COHERENT = false>
__device__ __forceinline__ void store_normed(const float* src, const void* weight,
                                             DType weight_dtype, int64_t d, float inv_rms,
                                             float (&v)[kNormPer], float (&w)[kNormPer],
                                             float* out) {
  const int64_t span = static_cast<int64_t>(kNormPer) * blockDim.x;
  for (int64_t base = 0; base < d; base += span) {
    if (span < d) load_norm_chunk<COHERENT>(src, base, d, v);
    if (base > 0) load_weight_chunk(weight, weight_dtype, base, d, w);
#pragma unroll
    for (int i = 0; i < kNormPer; ++i) {
      const int64_t j = norm_index(base, i);
      if (j < d) out[j] = w[i] * (v[i] * inv_rms);
    }
  }
}

// The calling block's RMSNorm of one row: out = weight * (src * 1 / rms). ADD: src is h's row,
// and add's row goes into it first (each thread stores h + x and squares the sums in the order it
// squares src's elements without ADD: the same block size gives add-then-RMSNorm's bits). w: the
// weight's first chunk (load_weight_chunk, issued by the caller before its PDL wait); warp_sums:
// 32 doubles of shared memory. COHERENT: src read through L2 (rows other blocks wrote).
template <bool COHERENT, bool ADD>
__device__ __forceinline__ void normalize_row(const float* src, const float* add,
                                              const void* weight, DType weight_dtype, int64_t d,
                                              float eps, float (&w)[kNormPer], double* warp_sums,
                                              float* out) {
  float v[kNormPer];
  const int64_t span = static_cast<int64_t>(kNormPer) * blockDim.x;
  double sum = 0.0;
  for (int64_t base = 0; base < d; base += span) {
    load_norm_chunk<COHERENT>(src, base, d, v);
    if constexpr (ADD) {
      float a[kNormPer];
      load_norm_chunk(add, base, d, a);
      float* h = const_cast<float*>(src);  // ADD: src is the residual row being updated
#pragma unroll
      for (int i = 0; i < kNormPer; ++i) {
        const int64_t j = norm_index(base, i);
        v[i] += a[i];
        if (j < d) h[j] = v[i];
      }
    }
    sum = add_squares(v, base, d, sum);
  }
  const float inv_rms = inv_rms_of(block_sum(sum, warp_sums), d, eps);
  store_normed<COHERENT>(src, weight, weight_dtype, d, inv_rms, v, w, out);
}

}  // namespace qs::cuda
