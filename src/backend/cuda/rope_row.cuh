// The arithmetic of one RoPE rotation and of one stored K/V row value, shared by the kernels that
// rotate and store (elementwise.cu's rope and rope + store kernels, the q/k/v launches' RoPE
// epilogues in gemv.cu and gemv_q4.cu), so that each gives the others' bits.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace qs::cuda {

// The cos and sin of one rotation at position p and its inverse frequency: the angle in f32, its
// cos and sin in double then rounded to f32 (= the CPU reference).
__device__ __forceinline__ float2 rope_cos_sin(float p, float inv_freq) {
  const float angle = p * inv_freq;
  double s, c;
  sincos(static_cast<double>(angle), &s, &c);
  return make_float2(static_cast<float>(c), static_cast<float>(s));
}

// HF rotate_half with cs = rope_cos_sin(...): (x0 c - x1 s, x1 c + x0 s). The roundings are
// spelled out: left to the compiler, which of the two products it fuses into the FMA depends on
// the code around it, and every kernel that rotates must give the others' bits (these are the
// forms the rope kernels compiled to before session 45).
__device__ __forceinline__ float2 rope_apply(float x0, float x1, float2 cs) {
  return make_float2(__fmaf_rn(x0, cs.x, -__fmul_rn(x1, cs.y)),
                     __fmaf_rn(x0, cs.y, __fmul_rn(x1, cs.x)));
}

__device__ __forceinline__ float2 rope_rotate(float x0, float x1, float p, float inv_freq) {
  return rope_apply(x0, x1, rope_cos_sin(p, inv_freq));
}

// The epilogues that rotate (the q/k/v launches with their rows) take every rotation's cos and
// sin from a table in shared memory, filled by the block's threads before their PDL wait (pos
// and the frequencies are launch parameters), so that no sincos sits on a tile's critical path:
// cs[j] = rope_cos_sin(pos, inv_freq[j]) for j < half. The block barrier before the first
// epilogue makes it visible.
__device__ __forceinline__ void fill_rope_table(float2* cs, int half, float pos,
                                                const float* inv_freq) {
  for (int j = threadIdx.x; j < half; j += blockDim.x) cs[j] = rope_cos_sin(pos, inv_freq[j]);
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
