// The hierarchical KV format's per-group math (DESIGN.md §2): codes, views, error bounds, and the
// key-group / value-row functions against a per-element reference.
#include "quant/kv_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace qs {
namespace {

// Float-rounding slack of the bounds in kv_quant.h: a few f32 ulps of the magnitudes involved.
float slack(float x, float scale, float min) {
  return 0x1p-21f * (std::fabs(x) + std::fabs(min) + 16.0f * scale);
}

struct GroupKind {
  std::string name;
  std::vector<float> (*make)(std::mt19937&, int);
};

std::vector<float> normal_group(std::mt19937& rng, int n) {
  std::normal_distribution<float> d(0.3f, 1.7f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
std::vector<float> outlier_group(std::mt19937& rng, int n) {
  std::vector<float> v = normal_group(rng, n);
  v[n / 3] = 48.0f;
  v[n / 2] = -23.5f;
  return v;
}
std::vector<float> positive_group(std::mt19937& rng, int n) {
  std::uniform_real_distribution<float> d(0.25f, 3.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
std::vector<float> negative_group(std::mt19937& rng, int n) {
  std::uniform_real_distribution<float> d(-7.0f, -0.2f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
std::vector<float> offset_group(std::mt19937& rng, int n) {  // |x| >> range: min rounding matters
  std::uniform_real_distribution<float> d(1000.1f, 1000.115f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
std::vector<float> tiny_group(std::mt19937& rng, int n) {  // fp16 subnormal scales
  std::normal_distribution<float> d(0.0f, 3e-6f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
std::vector<float> two_valued_group(std::mt19937&, int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = i % 3 ? -0.75f : 2.0f;
  return v;
}

const std::vector<GroupKind>& group_kinds() {
  static const std::vector<GroupKind> kinds = {
      {"normal", normal_group},        {"outliers", outlier_group}, {"positive", positive_group},
      {"negative", negative_group},    {"offset", offset_group},    {"tiny", tiny_group},
      {"two_valued", two_valued_group}};
  return kinds;
}

struct ErrorStats {
  int n = 0;
  int saturated = 0;  // lower code 15 with an error above s/32
};

// Checks every bound of kv_quant.h for one group, and that both codes are the best choices.
void check_group(const std::vector<float>& x, const std::string& what, ErrorStats* stats) {
  float lo, hi;
  group_range(x.data(), static_cast<int64_t>(x.size()), 1, &lo, &hi);
  Quant4Params p = choose_quant4_params(lo, hi);
  const float s = f16_to_f32(p.scale), m = f16_to_f32(p.min);
  for (float xi : x) {
    KvCodes c = kv_encode(xi, s, m);
    ASSERT_LE(c.upper, 15) << what;
    ASSERT_LE(c.lower, 15) << what;
    const float x4 = kv_decode_int4(c.upper, s, m);
    const float x8 = kv_decode_int8(c.upper, c.lower, s, m);
    const float eps = slack(xi, s, m);
    const float e4 = std::fabs(xi - x4), e8 = std::fabs(xi - x8);
    ASSERT_LE(e4, s / 2 + eps) << what << " x=" << xi << " s=" << s << " m=" << m;
    ASSERT_LE(e8, s / 16 + eps) << what << " x=" << xi;
    if (c.lower != 15) {
      ASSERT_LE(e8, s / 32 + eps) << what << " x=" << xi;
    }
    if (e8 > s / 32 + eps) ++stats->saturated;
    ++stats->n;
    // No other upper code is closer (ties aside), and no other lower code for this U.
    for (int u = 0; u <= 15; ++u) {
      ASSERT_LE(e4, std::fabs(xi - kv_decode_int4(static_cast<uint8_t>(u), s, m)) + eps) << what;
    }
    for (int l = 0; l <= 15; ++l) {
      float other = kv_decode_int8(c.upper, static_cast<uint8_t>(l), s, m);
      ASSERT_LE(e8, std::fabs(xi - other) + eps) << what;
    }
  }
}

TEST(KvQuant, ErrorBoundsOnEveryKindOfGroup) {
  std::mt19937 rng(10);
  ErrorStats stats;
  for (const GroupKind& kind : group_kinds()) {
    for (int n : {32, 64, 128}) {
      for (int rep = 0; rep < 20; ++rep) {
        check_group(kind.make(rng, n), kind.name + " n=" + std::to_string(n), &stats);
        if (HasFatalFailure()) return;
      }
    }
  }
  // The s/32 bound fails only where the lower code saturates at +7: a small minority.
  EXPECT_LT(stats.saturated, stats.n / 16);
}

TEST(KvQuant, Int8IsMuchCloserThanInt4) {
  std::mt19937 rng(11);
  double sum4 = 0, sum8 = 0;
  for (int rep = 0; rep < 50; ++rep) {
    std::vector<float> x = normal_group(rng, 128);
    float lo, hi;
    group_range(x.data(), 128, 1, &lo, &hi);
    Quant4Params p = choose_quant4_params(lo, hi);
    const float s = f16_to_f32(p.scale), m = f16_to_f32(p.min);
    for (float xi : x) {
      KvCodes c = kv_encode(xi, s, m);
      sum4 += std::fabs(xi - kv_decode_int4(c.upper, s, m));
      sum8 += std::fabs(xi - kv_decode_int8(c.upper, c.lower, s, m));
    }
  }
  EXPECT_LT(sum8 * 10, sum4);  // uniform residuals: mean errors s/4 vs about s/64
}

TEST(KvQuant, HalfToEvenAndTheSaturatedResidual) {
  // min 0, scale 1 (both exact in fp16): the upper grid is the integers, the lower step 1/16.
  KvCodes tie_up = kv_encode(3.5f, 1.0f, 0.0f);  // 3.5 -> 4 (even), residual -1/2 -> L = -8
  EXPECT_EQ(tie_up.upper, 4);
  EXPECT_EQ(tie_up.lower, 0);
  EXPECT_EQ(kv_decode_int8(tie_up.upper, tie_up.lower, 1.0f, 0.0f), 3.5f);
  // 2.5 -> 2 (even), residual +1/2 would need L = +8: clamped to 7, the worst case s/16.
  KvCodes tie_down = kv_encode(2.5f, 1.0f, 0.0f);
  EXPECT_EQ(tie_down.upper, 2);
  EXPECT_EQ(tie_down.lower, 15);
  EXPECT_EQ(kv_decode_int8(tie_down.upper, tie_down.lower, 1.0f, 0.0f), 2.4375f);
  // Residual 0.49 s: L rounds to 8, clamps to 7: error 0.0525 s, between s/32 and s/16.
  KvCodes c = kv_encode(3.49f, 1.0f, 0.0f);
  float err = std::fabs(3.49f - kv_decode_int8(c.upper, c.lower, 1.0f, 0.0f));
  EXPECT_GT(err, 1.0f / 32);
  EXPECT_LE(err, 1.0f / 16);
  // Residual 0.45 s rounds to L = 7 (7.2): within s/32.
  KvCodes ok = kv_encode(3.45f, 1.0f, 0.0f);
  EXPECT_EQ(ok.lower, 15);
  EXPECT_LE(std::fabs(3.45f - kv_decode_int8(ok.upper, ok.lower, 1.0f, 0.0f)), 1.0f / 32);
}

TEST(KvQuant, ConstantGroupsReconstructExactly) {
  for (float x : {0.0f, 1.0f, -2.5f, 0.375f, -65504.0f, 0x1p-20f}) {
    std::vector<float> v(64, x);
    float lo, hi;
    group_range(v.data(), 64, 1, &lo, &hi);
    Quant4Params p = choose_quant4_params(lo, hi);
    ASSERT_EQ(p.scale, 0);
    const float s = f16_to_f32(p.scale), m = f16_to_f32(p.min);
    KvCodes c = kv_encode(x, s, m);
    EXPECT_EQ(c.upper, 0);
    EXPECT_EQ(c.lower, kKvLowerBias);
    EXPECT_EQ(kv_decode_int4(c.upper, s, m), x);
    EXPECT_EQ(kv_decode_int8(c.upper, c.lower, s, m), x);
  }
  // Not fp16-representable: not exact, but within the bounds of a tiny scale.
  ErrorStats stats;
  for (float x : {0.1f, -3.3f, 1000.1f}) check_group(std::vector<float>(32, x), "const", &stats);
}

TEST(KvQuant, NonFiniteInputsGiveValidCodes) {
  std::vector<float> v = {1.0f,
                          std::nanf(""),
                          2.0f,
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::infinity(),
                          0.5f};
  float lo, hi;
  group_range(v.data(), static_cast<int64_t>(v.size()), 1, &lo, &hi);
  Quant4Params p = choose_quant4_params(lo, hi);
  const float s = f16_to_f32(p.scale), m = f16_to_f32(p.min);
  EXPECT_TRUE(std::isfinite(s) && std::isfinite(m));
  for (float x : v) {
    KvCodes c = kv_encode(x, s, m);
    EXPECT_LE(c.upper, 15);
    EXPECT_LE(c.lower, 15);
    EXPECT_TRUE(std::isfinite(kv_decode_int8(c.upper, c.lower, s, m)));
  }
  KvCodes nan_codes = kv_encode(std::nanf(""), s, m);
  EXPECT_EQ(nan_codes.upper, 0);
  EXPECT_EQ(nan_codes.lower, 0);
}

// The decode rounds once, so any evaluation order that only rounds the final "+ min" agrees:
// the literal U*s + L*s/16 + min, and an FMA of the combined code (what a kernel would use).
TEST(KvQuant, Int8DecodeIsOrderIndependent) {
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> val(-100.0f, 100.0f);
  for (int rep = 0; rep < 200; ++rep) {
    const float s = f16_to_f32(f32_to_f16_round_up(std::fabs(val(rng)) / 15.0f));
    const float m = f16_to_f32(f32_to_f16_round_down(val(rng)));
    for (int u = 0; u < 16; ++u) {
      for (int l = 0; l < 16; ++l) {
        const float x8 = kv_decode_int8(static_cast<uint8_t>(u), static_cast<uint8_t>(l), s, m);
        const float lv = static_cast<float>(l - 8);
        const float literal = (static_cast<float>(u) * s + lv * s / 16.0f) + m;
        const float fused = std::fma(static_cast<float>(16 * u + l - 8), s * 0.0625f, m);
        ASSERT_EQ(x8, literal);
        ASSERT_EQ(x8, fused);
      }
      ASSERT_EQ(kv_decode_int4(static_cast<uint8_t>(u), s, m),
                std::fma(static_cast<float>(u), s, m));
    }
  }
}

// ---- group functions vs a per-element reference ----

struct Shape {
  int group_size;
  int head_dim;
  int value_group_size;
};

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (int g : {32, 64, 128}) {
    for (int hd : {64, 128}) {
      out.push_back({g, hd, hd});
      out.push_back({g, hd, 32});
    }
  }
  return out;
}

// A key block like real post-RoPE keys: each channel has its own offset and spread, and a few
// channels carry large outliers.
std::vector<float> make_keys(std::mt19937& rng, int tokens, int64_t stride) {
  std::vector<float> k(static_cast<size_t>(tokens * stride));
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (int64_t c = 0; c < stride; ++c) {
    const float offset = 0.5f * static_cast<float>(c % 7) - 1.5f;
    const float spread = c % 13 == 0 ? 12.0f : 0.2f + 0.1f * static_cast<float>(c % 5);
    for (int t = 0; t < tokens; ++t) k[t * stride + c] = offset + spread * d(rng);
  }
  return k;
}

TEST(KvQuant, KeyGroupMatchesPerElementReference) {
  std::mt19937 rng(13);
  for (const Shape& sh : shapes()) {
    const int g = sh.group_size, hd = sh.head_dim;
    const int64_t stride = 3 * hd + 4;  // the head sits at column hd of a wider row
    std::vector<float> k = make_keys(rng, g, stride);
    const float* head = k.data() + hd;
    std::vector<uint8_t> upper(g * hd / 2), lower(g * hd / 2);
    std::vector<uint16_t> scale(hd), min(hd);
    quantize_key_group(head, stride, g, hd, upper.data(), lower.data(), scale.data(), min.data());

    std::vector<float> out4(hd), out8(hd);
    for (int d = 0; d < hd; ++d) {
      float lo = head[d], hi = head[d];
      for (int t = 0; t < g; ++t) {
        lo = std::fmin(lo, head[t * stride + d]);
        hi = std::fmax(hi, head[t * stride + d]);
      }
      Quant4Params p = choose_quant4_params(lo, hi);
      ASSERT_EQ(scale[d], p.scale) << "G=" << g << " hd=" << hd << " d=" << d;
      ASSERT_EQ(min[d], p.min);
    }
    for (int t = 0; t < g; ++t) {
      dequantize_key_row_int4(upper.data() + t * hd / 2, scale.data(), min.data(), hd, out4.data());
      dequantize_key_row_int8(upper.data() + t * hd / 2, lower.data() + t * hd / 2, scale.data(),
                              min.data(), hd, out8.data());
      for (int d = 0; d < hd; ++d) {
        const float s = f16_to_f32(scale[d]), m = f16_to_f32(min[d]);
        const float x = head[t * stride + d];
        KvCodes c = kv_encode(x, s, m);
        ASSERT_EQ(get_nibble(upper.data() + t * hd / 2, d), c.upper) << "t=" << t << " d=" << d;
        ASSERT_EQ(get_nibble(lower.data() + t * hd / 2, d), c.lower) << "t=" << t << " d=" << d;
        ASSERT_EQ(out4[d], kv_decode_int4(c.upper, s, m));
        ASSERT_EQ(out8[d], kv_decode_int8(c.upper, c.lower, s, m));
        ASSERT_LE(std::fabs(out4[d] - x), s / 2 + slack(x, s, m));
        ASSERT_LE(std::fabs(out8[d] - x), s / 16 + slack(x, s, m));
      }
    }
  }
}

TEST(KvQuant, ValueRowMatchesPerElementReference) {
  std::mt19937 rng(14);
  for (const Shape& sh : shapes()) {
    const int hd = sh.head_dim, gv = sh.value_group_size;
    for (int rep = 0; rep < 8; ++rep) {
      std::vector<float> v = rep % 2 ? outlier_group(rng, hd) : normal_group(rng, hd);
      if (rep == 2) v = negative_group(rng, hd);
      if (rep == 4) v = positive_group(rng, hd);
      if (rep == 6) std::fill(v.begin(), v.begin() + gv, 0.625f);  // one constant value group
      std::vector<uint8_t> upper(hd / 2), lower(hd / 2);
      std::vector<uint16_t> scale(hd / gv), min(hd / gv);
      quantize_value_row(v.data(), hd, gv, upper.data(), lower.data(), scale.data(), min.data());
      std::vector<float> out4(hd), out8(hd);
      dequantize_value_row_int4(upper.data(), scale.data(), min.data(), hd, gv, out4.data());
      dequantize_value_row_int8(upper.data(), lower.data(), scale.data(), min.data(), hd, gv,
                                out8.data());
      for (int grp = 0; grp < hd / gv; ++grp) {
        float lo = v[grp * gv], hi = v[grp * gv];
        for (int i = 0; i < gv; ++i) {
          lo = std::fmin(lo, v[grp * gv + i]);
          hi = std::fmax(hi, v[grp * gv + i]);
        }
        Quant4Params p = choose_quant4_params(lo, hi);
        ASSERT_EQ(scale[grp], p.scale);
        ASSERT_EQ(min[grp], p.min);
        const float s = f16_to_f32(p.scale), m = f16_to_f32(p.min);
        for (int i = 0; i < gv; ++i) {
          const int d = grp * gv + i;
          KvCodes c = kv_encode(v[d], s, m);
          ASSERT_EQ(get_nibble(upper.data(), d), c.upper);
          ASSERT_EQ(get_nibble(lower.data(), d), c.lower);
          ASSERT_EQ(out4[d], kv_decode_int4(c.upper, s, m));
          ASSERT_EQ(out8[d], kv_decode_int8(c.upper, c.lower, s, m));
          if (rep == 6 && grp == 0) {
            ASSERT_EQ(out4[d], 0.625f);
            ASSERT_EQ(out8[d], 0.625f);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace qs
