#include "core/dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace qs {
namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Decodes a 16-bit float format with `mant_bits` mantissa bits and `exp_bits` exponent bits,
// straight from the definition (independent of dtype.h).
double decode16(uint16_t h, int exp_bits, int mant_bits) {
  const int bias = (1 << (exp_bits - 1)) - 1;
  const int e = (h >> mant_bits) & ((1 << exp_bits) - 1);
  const int m = h & ((1 << mant_bits) - 1);
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == (1 << exp_bits) - 1) {
    return m ? std::numeric_limits<double>::quiet_NaN()
             : sign * std::numeric_limits<double>::infinity();
  }
  if (e == 0) return sign * std::ldexp(m, 1 - bias - mant_bits);
  return sign * std::ldexp((1 << mant_bits) + m, e - bias - mant_bits);
}

// Round-to-nearest-even by search over all codes of the format (the oracle).
class Oracle {
 public:
  Oracle(int exp_bits, int mant_bits) {
    for (uint32_t h = 0; h < 0x8000; ++h) {
      double v = decode16(static_cast<uint16_t>(h), exp_bits, mant_bits);
      if (std::isfinite(v)) values_.push_back({v, static_cast<uint16_t>(h)});
    }
    // Overflow: infinity behaves as the next code, one ulp above the largest finite value.
    const double max = values_.back().first;
    const double ulp = max - values_[values_.size() - 2].first;
    const uint16_t inf_code = static_cast<uint16_t>(((1u << exp_bits) - 1) << mant_bits);
    values_.push_back({max + ulp, inf_code});
  }
  uint16_t round(float x) const {
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double a = std::fabs(static_cast<double>(x));
    if (std::isinf(x)) return sign | values_.back().second;
    auto it = std::lower_bound(values_.begin(), values_.end(), std::pair<double, uint16_t>{a, 0});
    if (it == values_.end()) return sign | values_.back().second;
    if (it->first == a || it == values_.begin()) return sign | it->second;
    auto below = it - 1;
    const double up = it->first - a, down = a - below->first;
    if (up < down) return sign | it->second;
    if (down < up) return sign | below->second;
    return sign | ((below->second & 1) ? it->second : below->second);
  }

 private:
  std::vector<std::pair<double, uint16_t>> values_;  // ascending, non-negative
};

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::F16), 2u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_STREQ(dtype_name(DType::BF16), "BF16");
}

TEST(DType, F16DecodeMatchesDefinitionForAllCodes) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    float got = f16_to_f32(static_cast<uint16_t>(h));
    double want = decode16(static_cast<uint16_t>(h), 5, 10);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << std::hex << h;
      ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << std::hex << h;
    }
  }
}

TEST(DType, Bf16DecodeMatchesDefinitionForAllCodes) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    float got = bf16_to_f32(static_cast<uint16_t>(h));
    double want = decode16(static_cast<uint16_t>(h), 8, 7);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << std::hex << h;
    }
  }
}

TEST(DType, RoundTripOfEveryCode) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const auto c = static_cast<uint16_t>(h);
    float f = f16_to_f32(c);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f)))) << std::hex << h;
    } else {
      ASSERT_EQ(f32_to_f16(f), c) << std::hex << h;
    }
    float b = bf16_to_f32(c);
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(b)))) << std::hex << h;
    } else {
      ASSERT_EQ(f32_to_bf16(b), c) << std::hex << h;
    }
  }
}

TEST(DType, F16RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties go to the even mantissa.
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // halfway to the next binade: overflow
  EXPECT_EQ(f32_to_f16(-1e10f), 0xfc00);
  // Subnormals: the smallest is 2^-24.
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even (0)
  EXPECT_EQ(f32_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(3 * std::ldexp(1.0f, -25)), 0x0002);  // 1.5 ulp: tie to even (2)
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.0f, -24)), 0x03ff);   // largest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.5f, -24)), 0x0400);   // rounds up into the normals
  EXPECT_EQ(f32_to_f16(-std::ldexp(1.0f, -30)), 0x8000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00);
  uint16_t nan = f32_to_f16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  // A signalling NaN whose payload lives only in the low bits must stay a NaN.
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(from_bits(0x7f800001u)))));
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds past the max
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000u)), 0x0002);  // subnormal tie, odd -> even
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008000u)), 0x0000);  // subnormal tie, even stays
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0xffffffffu)))));
}

TEST(DType, RandomFloatsMatchTheOracle) {
  const Oracle f16(5, 10), bf16(8, 7);
  std::mt19937 rng(42);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = rng();
    if (i % 2) bits = (bits & 0x83ffffffu) | (static_cast<uint32_t>(100 + rng() % 50) << 23);
    float x = from_bits(bits);
    if (std::isnan(x)) continue;
    ASSERT_EQ(f32_to_f16(x), f16.round(x)) << std::hexfloat << x;
    ASSERT_EQ(f32_to_bf16(x), bf16.round(x)) << std::hexfloat << x;
  }
}

TEST(DType, ToF32ConvertsArrays) {
  const std::vector<float> src = {0.5f, -3.0f, 1e-3f, 65504.0f};
  std::vector<uint16_t> h(src.size()), b(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    h[i] = f32_to_f16(src[i]);
    b[i] = f32_to_bf16(src[i]);
  }
  std::vector<float> out(src.size());
  to_f32(DType::F32, src.data(), out.data(), src.size());
  EXPECT_EQ(out, src);
  to_f32(DType::F16, h.data(), out.data(), src.size());
  for (size_t i = 0; i < src.size(); ++i) EXPECT_EQ(out[i], f16_to_f32(h[i]));
  EXPECT_NEAR(out[2], 1e-3f, 1e-6f);
  to_f32(DType::BF16, b.data(), out.data(), src.size());
  for (size_t i = 0; i < src.size(); ++i) EXPECT_EQ(out[i], bf16_to_f32(b[i]));
  EXPECT_EQ(out[0], 0.5f);
}

}  // namespace
}  // namespace qs
