// Quantized KV storage: shape checks, append + read against a per-element reference, the draft
// view's independence from the lower planes, and the bytes each view reads.
#include "kv/quantized_planes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace qs {
namespace {

KvPlanesShape make_shape(int layers, int heads, int hd, int g, int gv, int64_t capacity) {
  KvPlanesShape s;
  s.n_layers = layers;
  s.n_kv_heads = heads;
  s.head_dim = hd;
  s.group_size = g;
  s.value_group_size = gv;
  s.capacity = capacity;
  return s;
}

TEST(QuantizedPlanes, RejectsInvalidShapes) {
  struct Bad {
    KvPlanesShape shape;
    const char* needle;
  };
  const Bad bad[] = {
      {make_shape(0, 2, 64, 32, 0, 64), "n_layers"},
      {make_shape(2, 0, 64, 32, 0, 64), "n_kv_heads"},
      {make_shape(2, 2, 63, 32, 0, 64), "head_dim"},
      {make_shape(2, 2, 64, 48, 0, 96), "G"},
      {make_shape(2, 2, 64, 512, 0, 512), "G"},
      {make_shape(2, 2, 128, 32, 48, 64), "Gv"},
      {make_shape(2, 2, 64, 32, 0, 100), "multiple of G"},
      {make_shape(2, 2, 64, 32, 0, int64_t{1} << 45), "too large"},
  };
  for (const Bad& b : bad) {
    auto p = QuantizedPlanes::create(b.shape);
    ASSERT_FALSE(p.ok()) << b.needle;
    EXPECT_NE(p.error().message.find(b.needle), std::string::npos) << p.error().message;
  }
  auto ok = QuantizedPlanes::create(make_shape(1, 1, 64, 32, 0, 0));  // empty history is fine
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->shape().value_group_size, 64);
}

// Committed full-precision rows [rows, stride] with per-channel structure and some outliers.
std::vector<float> make_rows(std::mt19937& rng, int rows, int64_t stride) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * stride));
  for (int r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < stride; ++c) {
      const float spread = c % 11 == 0 ? 6.0f : 0.3f + 0.05f * static_cast<float>(c % 9);
      x[r * stride + c] = 0.2f * static_cast<float>(c % 5) - 0.4f + spread * d(rng);
    }
  }
  x[5] = 40.0f;  // an outlier token/channel
  return x;
}

// Dequantized reference of one element, straight from DESIGN §2: the key group of (token, channel)
// is the G tokens of its key group; the value group is Gv channels of its own token.
float reference_key(const std::vector<float>& k_rows, int64_t stride, const KvPlanesShape& s,
                    int head, int t_in_group, int d, KvQuantView view) {
  std::vector<float> group(s.group_size);
  for (int t = 0; t < s.group_size; ++t) group[t] = k_rows[t * stride + head * s.head_dim + d];
  auto [lo, hi] = std::minmax_element(group.begin(), group.end());
  Quant4Params p = choose_quant4_params(*lo, *hi);
  const float sc = f16_to_f32(p.scale), mn = f16_to_f32(p.min);
  KvCodes c = kv_encode(group[t_in_group], sc, mn);
  return view == KvQuantView::kDraftInt4 ? kv_decode_int4(c.upper, sc, mn)
                                         : kv_decode_int8(c.upper, c.lower, sc, mn);
}

float reference_value(const std::vector<float>& v_rows, int64_t stride, const KvPlanesShape& s,
                      int head, int t_in_group, int d, KvQuantView view) {
  const int gv = s.value_group_channels();
  const float* g = v_rows.data() + t_in_group * stride + head * s.head_dim + (d / gv) * gv;
  auto [lo, hi] = std::minmax_element(g, g + gv);
  Quant4Params p = choose_quant4_params(*lo, *hi);
  const float sc = f16_to_f32(p.scale), mn = f16_to_f32(p.min);
  KvCodes c = kv_encode(g[d % gv], sc, mn);
  return view == KvQuantView::kDraftInt4 ? kv_decode_int4(c.upper, sc, mn)
                                         : kv_decode_int8(c.upper, c.lower, sc, mn);
}

constexpr KvQuantView kViews[] = {KvQuantView::kDraftInt4, KvQuantView::kTargetInt8};

TEST(QuantizedPlanes, AppendAndReadMatchTheReference) {
  std::mt19937 rng(30);
  for (int g : {32, 64, 128}) {
    for (int hd : {64, 128}) {
      for (int gv : {hd, 32}) {
        const KvPlanesShape shape = make_shape(2, 2, hd, g, gv, 3 * g);
        auto planes_or = QuantizedPlanes::create(shape);
        ASSERT_TRUE(planes_or.ok()) << planes_or.error().message;
        QuantizedPlanes& planes = *planes_or;
        const int64_t stride = shape.kv_dim() + 6;  // rows with padding, as a buffer may have
        // Layer 0 gets groups 2 then 0 (out of order), layer 1 group 1; group 1 of layer 0 stays
        // empty.
        struct Write {
          int layer;
          int64_t group;
          std::vector<float> k, v;
        };
        std::vector<Write> writes;
        for (auto [layer, group] : {std::pair{0, 2}, {0, 0}, {1, 1}}) {
          writes.push_back({layer, group, make_rows(rng, g, stride), make_rows(rng, g, stride)});
          planes.append_group(layer, writes.back().k.data(), writes.back().v.data(), group, stride);
        }
        const std::string where =
            "G=" + std::to_string(g) + " hd=" + std::to_string(hd) + " Gv=" + std::to_string(gv);
        std::vector<float> out(static_cast<size_t>(g * hd));
        for (const Write& w : writes) {
          for (int h = 0; h < shape.n_kv_heads; ++h) {
            for (KvQuantView view : kViews) {
              planes.read_keys(w.layer, h, w.group * g, g, view, out.data());
              for (int t = 0; t < g; ++t) {
                for (int d = 0; d < hd; ++d) {
                  ASSERT_EQ(out[t * hd + d], reference_key(w.k, stride, shape, h, t, d, view))
                      << where << " key layer " << w.layer << " head " << h << " t " << t;
                }
              }
              planes.read_values(w.layer, h, w.group * g, g, view, out.data());
              for (int t = 0; t < g; ++t) {
                for (int d = 0; d < hd; ++d) {
                  ASSERT_EQ(out[t * hd + d], reference_value(w.v, stride, shape, h, t, d, view))
                      << where << " value layer " << w.layer << " head " << h << " t " << t;
                }
              }
            }
          }
        }
        for (KvQuantView view : kViews) {  // never written: reads as zeros
          planes.read_keys(0, 1, g, g, view, out.data());
          EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return x == 0.0f; }));
        }
      }
    }
  }
}

TEST(QuantizedPlanes, ReadsAcrossGroupBoundariesAndOverwrites) {
  std::mt19937 rng(31);
  const KvPlanesShape shape = make_shape(1, 2, 64, 32, 32, 64);
  auto planes = QuantizedPlanes::create(shape);
  ASSERT_TRUE(planes.ok());
  const int64_t stride = shape.kv_dim();
  std::vector<float> k0 = make_rows(rng, 32, stride), v0 = make_rows(rng, 32, stride);
  std::vector<float> k1 = make_rows(rng, 32, stride), v1 = make_rows(rng, 32, stride);
  planes->append_group(0, k0.data(), v0.data(), 0);
  planes->append_group(0, k1.data(), v1.data(), 1);
  // Tokens 20..43 straddle both groups; the single-token reads must agree with the range read.
  std::vector<float> range(24 * 64), one(64);
  for (KvQuantView view : kViews) {
    planes->read_keys(0, 1, 20, 24, view, range.data());
    for (int i = 0; i < 24; ++i) {
      planes->read_keys(0, 1, 20 + i, 1, view, one.data());
      ASSERT_TRUE(std::equal(one.begin(), one.end(), range.begin() + i * 64)) << i;
    }
  }
  // Rewriting group 0 with the other data replaces it completely.
  planes->append_group(0, k1.data(), v1.data(), 0);
  std::vector<float> g0(32 * 64), g1(32 * 64);
  for (KvQuantView view : kViews) {
    planes->read_keys(0, 0, 0, 32, view, g0.data());
    planes->read_keys(0, 0, 32, 32, view, g1.data());
    EXPECT_EQ(g0, g1);
    planes->read_values(0, 1, 0, 32, view, g0.data());
    planes->read_values(0, 1, 32, 32, view, g1.data());
    EXPECT_EQ(g0, g1);
  }
}

// Non-zero entries of `a` lie only inside `ranges` (half-open), and some do.
template <class T>
bool written_only_inside(std::span<const T> a,
                         const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  bool any = false;
  for (int64_t i = 0; i < static_cast<int64_t>(a.size()); ++i) {
    if (a[i] == 0) continue;
    bool inside = false;
    for (auto [b, e] : ranges) inside = inside || (i >= b && i < e);
    if (!inside) return false;
    any = true;
  }
  return any;
}

TEST(QuantizedPlanes, AppendWritesOnlyItsGroupOfItsLayer) {
  std::mt19937 rng(32);
  const KvPlanesShape shape = make_shape(3, 2, 64, 32, 32, 96);
  auto planes = QuantizedPlanes::create(shape);
  ASSERT_TRUE(planes.ok());
  std::vector<float> k = make_rows(rng, 32, shape.kv_dim()), v = make_rows(rng, 32, shape.kv_dim());
  for (auto& x : k) x += 3.0f;  // no group's min rounds to 0, so every metadata entry is non-zero
  for (auto& x : v) x += 3.0f;
  planes->append_group(1, k.data(), v.data(), 1);  // layer 1, tokens [32, 64)

  std::vector<std::pair<int64_t, int64_t>> codes, key_meta, value_meta;
  for (int h = 0; h < 2; ++h) {
    codes.push_back({shape.code_offset(1, h, 32), shape.code_offset(1, h, 64)});
    key_meta.push_back({shape.key_meta_offset(1, h, 1), shape.key_meta_offset(1, h, 2)});
    value_meta.push_back({shape.value_meta_offset(1, h, 32), shape.value_meta_offset(1, h, 64)});
  }
  const QuantizedPlanes& p = *planes;
  for (KvCodePlane plane : {KvCodePlane::kKeyUpper, KvCodePlane::kKeyLower,
                            KvCodePlane::kValueUpper, KvCodePlane::kValueLower}) {
    EXPECT_EQ(static_cast<int64_t>(p.code_plane(plane).size()), shape.code_plane_bytes());
    EXPECT_TRUE(written_only_inside(p.code_plane(plane), codes)) << static_cast<int>(plane);
  }
  for (KvMetaArray a : {KvMetaArray::kKeyScale, KvMetaArray::kKeyMin}) {
    EXPECT_EQ(static_cast<int64_t>(p.meta(a).size()), shape.key_meta_elems());
    EXPECT_TRUE(written_only_inside(p.meta(a), key_meta)) << static_cast<int>(a);
  }
  for (KvMetaArray a : {KvMetaArray::kValueScale, KvMetaArray::kValueMin}) {
    EXPECT_EQ(static_cast<int64_t>(p.meta(a).size()), shape.value_meta_elems());
    EXPECT_TRUE(written_only_inside(p.meta(a), value_meta)) << static_cast<int>(a);
  }
  // Every metadata entry of the written group is set.
  for (auto [b, e] : key_meta) {
    for (int64_t i = b; i < e; ++i) ASSERT_NE(p.meta(KvMetaArray::kKeyScale)[i], 0);
  }
  for (auto [b, e] : value_meta) {
    for (int64_t i = b; i < e; ++i) ASSERT_NE(p.meta(KvMetaArray::kValueMin)[i], 0);
  }
  EXPECT_EQ(shape.total_bytes(), 4 * shape.code_plane_bytes() + 4 * shape.key_meta_elems() +
                                     4 * shape.value_meta_elems());
}

TEST(QuantizedPlanes, DraftViewReadsTheUpperPlaneOnly) {
  std::mt19937 rng(33);
  const KvPlanesShape shape = make_shape(2, 2, 128, 64, 32, 128);
  auto planes = QuantizedPlanes::create(shape);
  ASSERT_TRUE(planes.ok());
  for (int layer = 0; layer < 2; ++layer) {
    for (int64_t group = 0; group < 2; ++group) {
      std::vector<float> k = make_rows(rng, 64, shape.kv_dim());
      std::vector<float> v = make_rows(rng, 64, shape.kv_dim());
      planes->append_group(layer, k.data(), v.data(), group);
    }
  }
  auto read_all = [&](KvQuantView view, KvReadStats* stats) {
    std::vector<float> all;
    std::vector<float> out(128 * 128);
    for (int layer = 0; layer < 2; ++layer) {
      for (int h = 0; h < 2; ++h) {
        planes->read_keys(layer, h, 0, 128, view, out.data(), stats);
        all.insert(all.end(), out.begin(), out.end());
        planes->read_values(layer, h, 0, 128, view, out.data(), stats);
        all.insert(all.end(), out.begin(), out.end());
      }
    }
    return all;
  };
  KvReadStats draft_stats, target_stats;
  const std::vector<float> draft = read_all(KvQuantView::kDraftInt4, &draft_stats);
  const std::vector<float> target = read_all(KvQuantView::kTargetInt8, &target_stats);

  // The bytes each view reads, per token and layer, are the documented ones.
  const double tokens = 128.0 * shape.n_layers;
  EXPECT_EQ(draft_stats.lower_bytes, 0);
  EXPECT_GT(target_stats.lower_bytes, 0);
  EXPECT_DOUBLE_EQ(draft_stats.total() / tokens,
                   kv_read_bytes_per_token(shape, KvQuantView::kDraftInt4));
  EXPECT_DOUBLE_EQ(target_stats.total() / tokens,
                   kv_read_bytes_per_token(shape, KvQuantView::kTargetInt8));
  EXPECT_EQ(target_stats.upper_bytes, target_stats.lower_bytes);
  EXPECT_LT(kv_read_bytes_per_token(shape, KvQuantView::kTargetInt8),
            fp16_kv_bytes_per_token(shape.n_kv_heads, shape.head_dim));

  // Poison both lower planes: the draft view is unchanged, the target view is not.
  std::uniform_int_distribution<int> byte(0, 255);
  for (KvCodePlane plane : {KvCodePlane::kKeyLower, KvCodePlane::kValueLower}) {
    for (uint8_t& b : planes->code_plane(plane)) b = static_cast<uint8_t>(byte(rng));
  }
  EXPECT_EQ(read_all(KvQuantView::kDraftInt4, nullptr), draft);
  EXPECT_NE(read_all(KvQuantView::kTargetInt8, nullptr), target);

  // Poisoning an upper plane does change the draft view (the check above can fail).
  for (uint8_t& b : planes->code_plane(KvCodePlane::kKeyUpper)) b ^= 0x11;
  EXPECT_NE(read_all(KvQuantView::kDraftInt4, nullptr), draft);
}

TEST(QuantizedPlanes, TargetViewIsCloseToTheCommittedRows) {
  std::mt19937 rng(34);
  const KvPlanesShape shape = make_shape(1, 4, 128, 128, 0, 128);
  auto planes = QuantizedPlanes::create(shape);
  ASSERT_TRUE(planes.ok());
  std::vector<float> k = make_rows(rng, 128, shape.kv_dim());
  std::vector<float> v = make_rows(rng, 128, shape.kv_dim());
  planes->append_group(0, k.data(), v.data(), 0);
  std::vector<float> out4(128 * 128), out8(128 * 128);
  for (int h = 0; h < 4; ++h) {
    for (bool keys : {true, false}) {
      const std::vector<float>& src = keys ? k : v;
      if (keys) {
        planes->read_keys(0, h, 0, 128, KvQuantView::kDraftInt4, out4.data());
        planes->read_keys(0, h, 0, 128, KvQuantView::kTargetInt8, out8.data());
      } else {
        planes->read_values(0, h, 0, 128, KvQuantView::kDraftInt4, out4.data());
        planes->read_values(0, h, 0, 128, KvQuantView::kTargetInt8, out8.data());
      }
      double e4 = 0, e8 = 0;
      for (int t = 0; t < 128; ++t) {
        for (int d = 0; d < 128; ++d) {
          const float x = src[t * shape.kv_dim() + h * 128 + d];
          e4 += std::fabs(x - out4[t * 128 + d]);
          e8 += std::fabs(x - out8[t * 128 + d]);
        }
      }
      EXPECT_GT(e4, 0.0);
      EXPECT_LT(e8 * 10, e4) << (keys ? "keys" : "values") << " head " << h;
    }
  }
}

}  // namespace
}  // namespace qs
