// The query side shared by the tensor-core prefill attention kernels (attention_prefill_tc.cu on
// mma.sync, attention_prefill_wgmma.cu on wgmma): a lane's Q A-fragments of one 16-row tile.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/mma.cuh"

namespace qs::cuda {

// floor(log2(x)) for a normal positive x; -127 for 0 and subnormals, 128 for inf/NaN.
__device__ __forceinline__ int floor_log2(float x) {
  return static_cast<int>((__float_as_uint(x) >> 23) & 0xffu) - 127;
}

// The exponent e that puts max_abs * 2^e into [2^13, 2^14), clamped to [-30, 30]: the scale of
// every tensor-core operand of the prefill (Q rows, and the converted K/V tiles).
__device__ __forceinline__ int scale_exponent(float max_abs) {
  constexpr int kTargetExp = 13, kExpClamp = 30;
  return min(max(kTargetExp - floor_log2(max_abs), -kExpClamp), kExpClamp);
}

// The A fragments (mma m16n8k16 layout; per warp of a wgmma warpgroup the same) of query rows
// row_a and row_a + 8 of the block's tile starting at query r0 (rows >= `rows` are zeros), head
// `head`: q * scale_log2 * 2^fq with fq = q_exp[0] / q_exp[1] per row (the row's largest |q| in
// [2^13, 2^14)), rounded to f16 hi + lo (lo kept when LO). Fragment j of k-step ks: row a (j even)
// or b (j odd), dims 16 ks + 2 t4 (+ 8 for j >= 2). Two passes over the (cached) q rows, the row
// maxima first, so no f32 copy stays live.
template <int HD, bool LO>
__device__ __forceinline__ void load_q_fragments(const AttentionArgs& a, int r0, int rows, int head,
                                                 int row_a, int t4, uint32_t (&qhi)[HD / 16][4],
                                                 uint32_t (&qlo)[LO ? HD / 16 : 1][4],
                                                 int (&q_exp)[2]) {
  constexpr int KS = HD / 16;
  const int row_b = row_a + 8;
  const int64_t q_row_len = static_cast<int64_t>(a.num_heads) * HD;
  auto q_pair = [&](int ks, int j) {
    const int row = (j & 1) ? row_b : row_a;
    const int dim = 16 * ks + 2 * t4 + ((j & 2) ? 8 : 0);
    float2 val = make_float2(0.f, 0.f);
    if (row < rows) {
      val = *reinterpret_cast<const float2*>(a.q + (r0 + row) * q_row_len +
                                             static_cast<int64_t>(head) * HD + dim);
      val.x *= a.scale_log2, val.y *= a.scale_log2;
    }
    return val;
  };
  float mx[2] = {0.0f, 0.0f};
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 val = q_pair(ks, j);
      mx[j & 1] = fmaxf(mx[j & 1], fmaxf(fabsf(val.x), fabsf(val.y)));
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(kFullMask, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(kFullMask, mx[h], 2));
    q_exp[h] = scale_exponent(mx[h]);
  }
  const float fq[2] = {exp2i(q_exp[0]), exp2i(q_exp[1])};
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 val = q_pair(ks, j);
      uint32_t lo;
      split_f16x2(val.x * fq[j & 1], val.y * fq[j & 1], qhi[ks][j], lo);
      if constexpr (LO) qlo[ks][j] = lo;
    }
  }
}

}  // namespace qs::cuda
