// 4-bit asymmetric group quantization primitives, shared by the hierarchical KV format
// (quant/kv_quant.h) and the draft's 4-bit weights (quant/weight_quant.h).
//
// Exact arithmetic contract (every backend must reproduce it bit for bit; docs/kv-format.md):
//  - scale and min are stored as fp16 and decoded to f32 before any use;
//  - rounding to an integer code is round-half-to-even (std::nearbyint in the default rounding
//    mode; CUDA rintf / __float2int_rn), never round-half-away;
//  - every division is an IEEE f32 division (CUDA: no --use_fast_math, or __fdiv_rn);
//  - clamping is fminf(fmaxf(v, lo), hi), which also maps NaN to `lo` (clamp_nan_to_lo: the same
//    codes, as compare-selects).
#pragma once

#include <cmath>
#include <cstdint>

namespace qs {

inline constexpr float kF16MaxFinite = 65504.0f;
inline constexpr int kQuant4MaxCode = 15;

// Stored parameters of one group: fp16 bit patterns. Decode with f16_to_f32 (core/dtype.h).
struct Quant4Params {
  uint16_t scale = 0;  // fp16, >= 0
  uint16_t min = 0;    // fp16
};

// fp16 rounding toward -inf / +inf (results saturate to +-65504; NaN maps to -65504).
uint16_t f32_to_f16_round_down(float x);
uint16_t f32_to_f16_round_up(float x);

// Smallest and largest non-NaN value of x[0], x[stride], ..., x[(n-1)*stride]; both 0 when there
// is none. ±inf count as values.
void group_range(const float* x, int64_t n, int64_t stride, float* lo, float* hi);

// Parameters for a group whose values lie in [lo, hi]. The min is rounded DOWN to fp16 and the
// scale UP from the stored min, so the grid [min, min + 15*scale] covers the group (to f32
// rounding) and no value is ever clamped by more than float rounding. Consequences:
//  - stored min <= lo;  stored scale >= (hi - lo)/15, and
//    scale <= (hi - lo + 2^-10*|lo| + 2^-24)/15 * (1 + 2^-10) + 2^-24 (plus f32 rounding);
//  - scale == 0 exactly when hi == lo and lo is fp16-representable: such a constant group
//    reconstructs exactly. A constant group whose value is not fp16-representable gets a tiny
//    scale (about ulp_fp16(value)/15) and obeys the usual error bounds.
// Values beyond +-65504 (and infinities) saturate to the fp16 range.
Quant4Params choose_quant4_params(float lo, float hi);

// Round-half-to-even of an already clamped float; the one rounding rule of this library.
inline float quant_round(float v) {
  return std::nearbyint(v);
}

// fminf(fmaxf(v, lo), hi), NaN -> lo, as two compare-selects: GCC emits std::fmin / std::fmax as
// library calls (no -ffinite-math-only), which were half of quant4_encode's time. Equal to them
// for every v but a zero equal to lo of the other sign (a zero either way).
inline float clamp_nan_to_lo(float v, float lo, float hi) {
  v = v > lo ? v : lo;
  return v < hi ? v : hi;
}

// U = round(clamp((x - min)/scale, 0, 15)); scale == 0 gives 0 without dividing.
// `scale` and `min` are the decoded stored values.
inline uint8_t quant4_encode(float x, float scale, float min) {
  if (scale == 0.0f) return 0;
  float t = clamp_nan_to_lo((x - min) / scale, 0.0f, static_cast<float>(kQuant4MaxCode));
  return static_cast<uint8_t>(quant_round(t));
}

// x4 = U*scale + min. U*scale is exact in f32 (4 x 11 significant bits), so this rounds once
// whether or not the compiler fuses it into an FMA.
inline float quant4_decode(uint8_t code, float scale, float min) {
  return static_cast<float>(code) * scale + min;
}

// Packing: two 4-bit codes per byte, code i in byte i/2, even i in the low nibble.
inline uint8_t get_nibble(const uint8_t* packed, int64_t i) {
  uint8_t b = packed[i >> 1];
  return (i & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0x0f);
}

inline void set_nibble(uint8_t* packed, int64_t i, uint8_t code) {
  uint8_t& b = packed[i >> 1];
  if (i & 1) {
    b = static_cast<uint8_t>((b & 0x0f) | (code << 4));
  } else {
    b = static_cast<uint8_t>((b & 0xf0) | (code & 0x0f));
  }
}

// codes: [n] values in 0..15; packed: [(n + 1) / 2] bytes (an odd n leaves the last high nibble 0).
void pack_nibbles(const uint8_t* codes, int64_t n, uint8_t* packed);
void unpack_nibbles(const uint8_t* packed, int64_t n, uint8_t* codes);

}  // namespace qs
