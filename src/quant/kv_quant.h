// The per-group math of the hierarchical INT8/INT4 KV format (DESIGN.md §2, docs/kv-format.md):
// the reference every backend's quantize/dequantize kernels are tested against.
//
// For a group with stored (fp16, decoded to f32) scale s and min m, a value x gets
//   upper code  U = round(clamp((x - m) / s, 0, 15))               in 0..15
//   residual    r = x - x4,  x4 = U*s + m
//   lower code  L = round(clamp(r / (s/16), -8, 7))                in -8..7, stored as L + 8
//   draft view  x4 = U*s + m                       (upper plane + metadata)
//   target view x8 = (16*U + L) * (s/16) + m        (= U*s + L*s/16 + m, rounded once)
// with the arithmetic rules of quant/quant4.h (round-half-to-even, IEEE division, fmin/fmax clamp).
// s == 0 (a constant, fp16-representable group) gives U = 0, L = 0 without dividing.
//
// Error bounds, for x in its group's [lo, hi] and s the stored scale (eps: a few f32 ulps of
// |x| + 16 s, from the float rounding of the steps above):
//   |x - x4| <= s/2 + eps
//   |x - x8| <= s/32 + eps   unless the lower code saturates (r > 15s/32, stored lower == 15)
//   |x - x8| <= s/16 + eps   always: L = +8 does not exist, so a residual in (15s/32, s/2] is
//                            coded as L = 7 (the normative scheme; about 1/32 of uniform values).
#pragma once

#include <cstdint>

#include "quant/quant4.h"

namespace qs {

// Which planes a read uses: the draft reads the upper plane and metadata only; the target reads
// both planes (INT8).
enum class KvQuantView : uint8_t { kDraftInt4, kTargetInt8 };

inline constexpr uint8_t kKvLowerBias = 8;  // stored lower code = L + 8

struct KvCodes {
  uint8_t upper = 0;  // U in 0..15
  uint8_t lower = 0;  // L + 8 in 0..15
};

// `scale` and `min` are the decoded stored values of x's group.
inline KvCodes kv_encode(float x, float scale, float min) {
  if (scale == 0.0f) return {0, kKvLowerBias};
  uint8_t u = quant4_encode(x, scale, min);
  float r = x - quant4_decode(u, scale, min);
  // s/16 is exact (a power-of-two scaling of an fp16 value stays a normal f32).
  float l = clamp_nan_to_lo(r / (scale * 0.0625f), -8.0f, 7.0f);
  return {u, static_cast<uint8_t>(static_cast<int>(quant_round(l)) + kKvLowerBias)};
}

inline float kv_decode_int4(uint8_t upper, float scale, float min) {
  return quant4_decode(upper, scale, min);
}

// (16U + L) has at most 8 significant bits and s/16 at most 11, so the product is exact and the
// sum with min rounds once, with or without FMA contraction.
inline float kv_decode_int8(uint8_t upper, uint8_t lower, float scale, float min) {
  int q = 16 * static_cast<int>(upper) + static_cast<int>(lower) - kKvLowerBias;
  return static_cast<float>(q) * (scale * 0.0625f) + min;
}

// ---- Keys: per channel over a group of G consecutive tokens of one kv head ----

// k: element (token t, channel d) at k[t * k_row_stride + d], t < group_size, d < head_dim.
// Writes, for the group: upper, lower: [group_size][head_dim / 2] packed codes (token t's codes
// at byte t * head_dim/2, channel d in nibble d of that row); scale, min: [head_dim] fp16.
void quantize_key_group(const float* k, int64_t k_row_stride, int group_size, int head_dim,
                        uint8_t* upper, uint8_t* lower, uint16_t* scale, uint16_t* min);

// One token's key from its group's per-channel metadata. upper, lower: [head_dim / 2] packed;
// scale, min: [head_dim] fp16; out: [head_dim] f32.
void dequantize_key_row_int4(const uint8_t* upper, const uint16_t* scale, const uint16_t* min,
                             int head_dim, float* out);
void dequantize_key_row_int8(const uint8_t* upper, const uint8_t* lower, const uint16_t* scale,
                             const uint16_t* min, int head_dim, float* out);

// ---- Values: per token over groups of Gv consecutive channels of one kv head ----

// v: [head_dim] f32. Writes upper, lower: [head_dim / 2] packed codes;
// scale, min: [head_dim / value_group_size] fp16 (channel d uses entry d / value_group_size).
void quantize_value_row(const float* v, int head_dim, int value_group_size, uint8_t* upper,
                        uint8_t* lower, uint16_t* scale, uint16_t* min);

void dequantize_value_row_int4(const uint8_t* upper, const uint16_t* scale, const uint16_t* min,
                               int head_dim, int value_group_size, float* out);
void dequantize_value_row_int8(const uint8_t* upper, const uint8_t* lower, const uint16_t* scale,
                               const uint16_t* min, int head_dim, int value_group_size, float* out);

}  // namespace qs
