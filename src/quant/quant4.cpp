#include "quant/quant4.h"

#include <limits>

#include "core/dtype.h"

namespace qs {

namespace {

constexpr uint16_t kF16SignBit = 0x8000u;

float clamp_to_f16_range(float x) {
  return clamp_nan_to_lo(x, -kF16MaxFinite, kF16MaxFinite);
}

// The next fp16 value toward -inf / +inf of a finite fp16 `h` that is not -65504 / +65504.
uint16_t f16_next_down(uint16_t h) {
  if ((h & 0x7fffu) == 0) return kF16SignBit | 1u;  // +-0 -> -2^-24
  return (h & kF16SignBit) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h - 1);
}

uint16_t f16_next_up(uint16_t h) {
  if ((h & 0x7fffu) == 0) return 1u;  // +-0 -> +2^-24
  return (h & kF16SignBit) ? static_cast<uint16_t>(h - 1) : static_cast<uint16_t>(h + 1);
}

}  // namespace

uint16_t f32_to_f16_round_down(float x) {
  x = clamp_to_f16_range(x);
  uint16_t h = f32_to_f16(x);
  if (f16_to_f32(h) > x) h = f16_next_down(h);
  return h;
}

uint16_t f32_to_f16_round_up(float x) {
  x = clamp_to_f16_range(x);
  uint16_t h = f32_to_f16(x);
  if (f16_to_f32(h) < x) h = f16_next_up(h);
  return h;
}

void group_range(const float* x, int64_t n, int64_t stride, float* lo, float* hi) {
  float mn = std::numeric_limits<float>::infinity();
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i * stride];
    if (v < mn) mn = v;  // NaN compares false: skipped
    if (v > mx) mx = v;
  }
  if (!(mn <= mx)) mn = mx = 0.0f;  // no non-NaN value
  *lo = mn;
  *hi = mx;
}

Quant4Params choose_quant4_params(float lo, float hi) {
  if (!(lo <= hi)) lo = hi = 0.0f;  // NaN or swapped bounds: a harmless all-zero group
  lo = clamp_to_f16_range(lo);
  hi = clamp_to_f16_range(hi);
  Quant4Params p;
  p.min = f32_to_f16_round_down(lo);
  // span >= +0 (hi >= lo >= min), and distinct floats never subtract to 0, so the scale is 0 only
  // when hi == min. span/15 <= 131008/15 stays far inside the fp16 range.
  float span = hi - f16_to_f32(p.min);
  p.scale = f32_to_f16_round_up(span / static_cast<float>(kQuant4MaxCode));
  return p;
}

void pack_nibbles(const uint8_t* codes, int64_t n, uint8_t* packed) {
  for (int64_t i = 0; i + 1 < n; i += 2) {
    packed[i >> 1] = static_cast<uint8_t>((codes[i] & 0x0f) | (codes[i + 1] << 4));
  }
  if (n & 1) packed[n >> 1] = static_cast<uint8_t>(codes[n - 1] & 0x0f);
}

void unpack_nibbles(const uint8_t* packed, int64_t n, uint8_t* codes) {
  for (int64_t i = 0; i < n; ++i) codes[i] = get_nibble(packed, i);
}

}  // namespace qs
