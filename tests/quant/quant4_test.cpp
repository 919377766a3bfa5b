// Shared 4-bit primitives: nibble packing, directed fp16 rounding, group parameters.
#include "quant/quant4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"

namespace qs {
namespace {

TEST(Quant4Pack, LowNibbleHoldsTheEvenIndex) {
  const uint8_t codes[3] = {0x1, 0x2, 0xf};
  uint8_t packed[2] = {0xff, 0xff};
  pack_nibbles(codes, 3, packed);
  EXPECT_EQ(packed[0], 0x21);
  EXPECT_EQ(packed[1], 0x0f);  // odd count: the unused high nibble is 0
}

TEST(Quant4Pack, RoundTripAndSetGetAgree) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> code(0, 15);
  for (int64_t n : {1, 2, 7, 64, 129}) {
    std::vector<uint8_t> codes(n);
    for (auto& c : codes) c = static_cast<uint8_t>(code(rng));
    std::vector<uint8_t> packed((n + 1) / 2, 0xee);
    pack_nibbles(codes.data(), n, packed.data());

    std::vector<uint8_t> back(n, 0xff);
    unpack_nibbles(packed.data(), n, back.data());
    EXPECT_EQ(back, codes) << "n=" << n;

    std::vector<uint8_t> by_set((n + 1) / 2, 0);
    for (int64_t i = n - 1; i >= 0; --i) set_nibble(by_set.data(), i, codes[i]);  // any order
    EXPECT_EQ(by_set, packed) << "n=" << n;
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(get_nibble(packed.data(), i), codes[i]);
  }
}

TEST(Quant4Pack, SetNibbleLeavesTheNeighbourAlone) {
  uint8_t b[1] = {0x5a};
  set_nibble(b, 0, 0x3);
  EXPECT_EQ(b[0], 0x53);
  set_nibble(b, 1, 0xc);
  EXPECT_EQ(b[0], 0xc3);
}

// Values over the whole fp16 range, subnormals, signs and exact fp16 values.
std::vector<float> probe_values() {
  std::vector<float> v = {0.0f,     -0.0f,     1.0f,     -1.0f,   0.1f,    -0.1f,
                          65504.0f, -65504.0f, 65519.0f, 1e-8f,   -1e-8f,  6e-8f,
                          5.96e-8f, 3e-5f,     -3e-5f,   1000.1f, -1000.1f};
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-30, 16);
  for (int i = 0; i < 4000; ++i) {
    float x = std::ldexp(mant(rng), expo(rng));
    v.push_back(i % 2 ? x : -x);
  }
  return v;
}

TEST(Quant4Rounding, DirectedFp16RoundingBracketsTheValue) {
  for (float x : probe_values()) {
    uint16_t dn = f32_to_f16_round_down(x);
    uint16_t up = f32_to_f16_round_up(x);
    float fd = f16_to_f32(dn), fu = f16_to_f32(up);
    float clamped = std::fmin(std::fmax(x, -kF16MaxFinite), kF16MaxFinite);
    ASSERT_LE(fd, clamped) << x;
    ASSERT_GE(fu, clamped) << x;
    if (f16_to_f32(f32_to_f16(clamped)) == clamped) {
      ASSERT_EQ(fd, clamped) << x;
      ASSERT_EQ(fu, clamped) << x;
    } else {
      // Adjacent fp16 values: nothing representable strictly between them.
      float mid = f16_to_f32(f32_to_f16(0.5f * (fd + fu)));
      ASSERT_TRUE(mid == fd || mid == fu) << x;
      ASSERT_LT(fd, fu) << x;
    }
  }
}

TEST(Quant4Rounding, SaturatesAndSurvivesNonFinite) {
  EXPECT_EQ(f16_to_f32(f32_to_f16_round_up(1e9f)), kF16MaxFinite);
  EXPECT_EQ(f16_to_f32(f32_to_f16_round_down(-1e9f)), -kF16MaxFinite);
  EXPECT_EQ(f16_to_f32(f32_to_f16_round_down(std::numeric_limits<float>::infinity())),
            kF16MaxFinite);
  EXPECT_EQ(f16_to_f32(f32_to_f16_round_down(std::nanf(""))), -kF16MaxFinite);
}

TEST(Quant4Params, GridCoversTheGroupAndScaleIsTight) {
  std::mt19937 rng(3);
  std::vector<float> probes = probe_values();
  std::uniform_int_distribution<size_t> pick(0, probes.size() - 1);
  for (int i = 0; i < 20000; ++i) {
    float a = probes[pick(rng)], b = probes[pick(rng)];
    float lo = std::fmin(a, b), hi = std::fmax(a, b);
    if (std::fabs(lo) > kF16MaxFinite || std::fabs(hi) > kF16MaxFinite) continue;
    Quant4Params p = choose_quant4_params(lo, hi);
    float s = f16_to_f32(p.scale), m = f16_to_f32(p.min);
    ASSERT_GE(s, 0.0f);
    ASSERT_LE(m, lo) << lo << " " << hi;
    // Covers hi up to the f32 rounding of (hi - min) / 15.
    ASSERT_GE(15.0 * s + m, hi - 0x1p-21 * (std::fabs(hi) + std::fabs(m))) << lo << " " << hi;
    double bound = (static_cast<double>(hi) - lo + 0x1p-10 * std::fabs(lo) + 0x1p-24) / 15.0 *
                       (1.0 + 0x1p-10) * (1.0 + 0x1p-22) +
                   0x1p-24;
    ASSERT_LE(s, bound) << lo << " " << hi;
  }
}

TEST(Quant4Params, ConstantGroups) {
  for (float x : {0.0f, 1.0f, -2.5f, 65504.0f, -0.0f, 0x1p-24f, 3.140625f}) {
    Quant4Params p = choose_quant4_params(x, x);
    EXPECT_EQ(p.scale, 0) << x;  // exact: scale 0 and min == x
    EXPECT_EQ(f16_to_f32(p.min), x) << x;
    EXPECT_EQ(quant4_decode(quant4_encode(x, 0.0f, x), 0.0f, f16_to_f32(p.min)), x);
  }
  for (float x : {0.1f, -1000.1f, 1e-6f}) {  // not fp16-representable: tiny positive scale
    Quant4Params p = choose_quant4_params(x, x);
    float s = f16_to_f32(p.scale), m = f16_to_f32(p.min);
    EXPECT_GT(s, 0.0f) << x;
    EXPECT_LE(s, (x - m) / 15.0f * (1.0f + 0x1p-9f) + 0x1p-24f) << x;
    float x4 = quant4_decode(quant4_encode(x, s, m), s, m);
    EXPECT_LE(std::fabs(x4 - x), s / 2 + 0x1p-22f * std::fabs(x)) << x;
  }
}

TEST(Quant4Encode, NearestGridPointWithHalfToEvenTies) {
  // min 0, scale 1: the grid is the integers 0..15.
  EXPECT_EQ(quant4_encode(2.5f, 1.0f, 0.0f), 2);
  EXPECT_EQ(quant4_encode(3.5f, 1.0f, 0.0f), 4);
  EXPECT_EQ(quant4_encode(3.49f, 1.0f, 0.0f), 3);
  EXPECT_EQ(quant4_encode(-4.0f, 1.0f, 0.0f), 0);
  EXPECT_EQ(quant4_encode(99.0f, 1.0f, 0.0f), 15);
  EXPECT_EQ(quant4_encode(std::nanf(""), 1.0f, 0.0f), 0);
  EXPECT_EQ(quant4_encode(std::numeric_limits<float>::infinity(), 1.0f, 0.0f), 15);
  EXPECT_EQ(quant4_encode(7.0f, 0.0f, 7.0f), 0);  // scale 0: no division
}

}  // namespace
}  // namespace qs
