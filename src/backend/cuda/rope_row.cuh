// The arithmetic of one RoPE rotation and of one stored K/V row value, shared by the kernels that
// rotate and store (elementwise.cu's rope and rope + store kernels, the 4-bit layer chain's q/k/v
// epilogue in gemv_q4.cu), so that each gives the others' bits.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace qs::cuda {

// HF rotate_half for position p and the pair's inverse frequency: the angle in f32, its cos and
// sin in double then rounded to f32 (= the CPU reference), then (x0 c - x1 s, x1 c + x0 s).
__device__ __forceinline__ float2 rope_rotate(float x0, float x1, float p, float inv_freq) {
  const float angle = p * inv_freq;
  double s, c;
  sincos(static_cast<double>(angle), &s, &c);
  const float cos_v = static_cast<float>(c), sin_v = static_cast<float>(s);
  return make_float2(x0 * cos_v - x1 * sin_v, x1 * cos_v + x0 * sin_v);
}

// core/dtype.h's f32_to_f16_sat: round to nearest even; finite values beyond +-65504 saturate
// (__float2half_rn alone would give inf from 65520 on); inf and NaN pass through.
__device__ __forceinline__ __half to_f16_sat(float v) {
  if (isfinite(v)) v = fminf(fmaxf(v, -65504.0f), 65504.0f);
  return __float2half_rn(v);
}

// One element of a K/V row in the cache's dtype (F16: store_f16_kernel's rounding).
template <bool F16>
__device__ __forceinline__ void store_row_value(void* dst, int64_t i, float v) {
  if constexpr (F16) {
    static_cast<__half*>(dst)[i] = to_f16_sat(v);
  } else {
    static_cast<float*>(dst)[i] = v;
  }
}

}  // namespace qs::cuda
