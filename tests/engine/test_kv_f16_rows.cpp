// f16 full-precision KV rows on the CPU backend: every reader converts f16 to f32 on load and
// computes in f32, so attention over f16 rows (plain, sparse selection, the full-precision part
// of a hierarchical view) equals attention over f32 rows holding the same rounded values, bit for
// bit; the flush (quantize_kv) from f16 rows writes the same codes and metadata as from those f32
// rows; store_kv_rows rounds to nearest even and saturates at +-65504.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "kv/quantized_planes.h"
#include "tiny_model.h"

namespace qs {
namespace {

using testing::randn;

// Rows as f16 bits and as the f32 values those bits hold.
struct Rows {
  std::vector<uint16_t> f16;
  std::vector<float> f32;
  explicit Rows(const std::vector<float>& x) : f16(x.size()), f32(x.size()) {
    for (size_t i = 0; i < x.size(); ++i) {
      f16[i] = f32_to_f16_sat(x[i]);
      f32[i] = f16_to_f32(f16[i]);
    }
  }
};

KvView f16_view(const Rows& k, const Rows& v, int64_t stride, int len) {
  KvView view{k.f16.data(), v.f16.data(), stride, len};
  view.row_dtype = DType::F16;
  return view;
}

// Bit-identical f32 outputs.
void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b,
                      const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what;
}

TEST(StoreKvRows, RoundsToNearestEvenAndSaturates) {
  CpuBackend be(1);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> src = {1.0f,
                                  1.0f + 0x1p-11f,      // tie: down to the even 1.0
                                  1.0f + 3 * 0x1p-11f,  // tie: up to the even 1 + 2^-9
                                  0.1f,
                                  65504.0f,
                                  65519.0f,  // below the 65520 tie: 65504 anyway
                                  65520.0f,  // would round to inf: saturates
                                  70000.0f,
                                  -1e9f,
                                  0x1p-24f,  // smallest subnormal
                                  1e-8f,     // below half of it: +0
                                  -0.0f,
                                  inf,
                                  -inf,
                                  std::nanf("")};
  std::vector<uint16_t> got(src.size());
  be.store_kv_rows(got.data(), DType::F16, src.data(), src.size());
  const std::vector<float> want = {1.0f,      1.0f,     1.0f + 0x1p-9f, f16_to_f32(0x2e66),
                                   65504.0f,  65504.0f, 65504.0f,       65504.0f,
                                   -65504.0f, 0x1p-24f, 0.0f,           -0.0f,
                                   inf,       -inf};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(f16_to_f32(got[i]), want[i]) << "value " << src[i];
    EXPECT_EQ(got[i], f32_to_f16_sat(src[i]));
  }
  EXPECT_EQ(got[11], 0x8000u);  // -0 keeps its sign
  EXPECT_TRUE(std::isnan(f16_to_f32(got[14])));
  // F32 rows: a plain copy.
  std::vector<float> copy(src.size());
  be.store_kv_rows(copy.data(), DType::F32, src.data(), src.size());
  EXPECT_EQ(std::memcmp(copy.data(), src.data(), src.size() * sizeof(float)), 0);
}

TEST(F16Rows, PlainAttentionEqualsF32RowsOfTheSameValues) {
  for (int threads : {1, 3}) {
    CpuBackend be(threads);
    for (int ratio : {1, 4}) {
      for (int hd : {16, 64}) {
        const AttentionShape s{2 * ratio, 2, hd, static_cast<float>(1.0 / std::sqrt(double(hd)))};
        const int64_t stride = 2 * hd + 8;  // padded rows
        for (auto [m, pos] : {std::pair{1, 0}, {1, 77}, {5, 40}, {16, 3}, {40, 100}}) {
          const int len = pos + m;
          const Rows k(randn(size_t(len) * stride, 1 + pos, 3.0f));
          const Rows v(randn(size_t(len) * stride, 2 + pos));
          const std::vector<float> q = randn(size_t(m) * s.num_heads * hd, 3 + m);
          std::vector<float> want(q.size(), NAN), got(q.size(), NAN);
          KvReadBytes b32, b16;
          KvView v32{k.f32.data(), v.f32.data(), stride, len};
          v32.read_bytes = &b32;
          KvView v16 = f16_view(k, v, stride, len);
          v16.read_bytes = &b16;
          be.attention(q.data(), m, pos, s, v32, want.data());
          be.attention(q.data(), m, pos, s, v16, got.data());
          expect_same_bits(got, want,
                           "hd " + std::to_string(hd) + " m " + std::to_string(m) + " pos " +
                               std::to_string(pos));
          EXPECT_GT(b16.fp, 0);
          EXPECT_EQ(2 * b16.fp, b32.fp);  // 2-byte elements
        }
      }
    }
  }
}

TEST(F16Rows, SelectionViewEqualsF32Rows) {
  CpuBackend be(2);
  const int hd = 32, kvh = 2, len = 90, dense_from = 70;
  const AttentionShape s{4, kvh, hd, 0.2f};
  const Rows k(randn(size_t(len) * kvh * hd, 11, 2.0f));
  const Rows v(randn(size_t(len) * kvh * hd, 12));
  // Head 0 keeps 5 positions, head 1 another 5 (ascending, below dense_from).
  const std::vector<int32_t> positions = {0, 3, 9, 40, 66, 1, 2, 30, 31, 69};
  KvSelection sel{positions.data(), 5, dense_from};
  for (int m : {1, 4}) {
    const int pos = len - m;
    const std::vector<float> q = randn(size_t(m) * 4 * hd, 13 + m);
    std::vector<float> want(q.size(), NAN), got(q.size(), NAN);
    KvView v32{k.f32.data(), v.f32.data(), kvh * hd, len};
    v32.selection = &sel;
    KvView v16 = f16_view(k, v, kvh * hd, len);
    v16.selection = &sel;
    be.attention(q.data(), m, pos, s, v32, want.data());
    be.attention(q.data(), m, pos, s, v16, got.data());
    expect_same_bits(got, want, "selection m " + std::to_string(m));
  }
}

// The hierarchical view: the quantized history is the same; the full-precision part [b(t), t]
// is f16 in one call and the same values as f32 in the other.
TEST(F16Rows, HierarchicalViewFullPrecisionPartEqualsF32Rows) {
  CpuBackend be(2);
  const int G = 32, hd = 64, kvh = 2, nh = 6, kvd = kvh * hd, total = 200;
  const Rows k(randn(size_t(total) * kvd, 4));
  const Rows v(randn(size_t(total) * kvd, 5));
  KvPlanesShape shape{1, kvh, hd, G, 32, 256};
  auto planes = QuantizedPlanes::create(shape);
  ASSERT_TRUE(planes.ok());
  for (int g = 0; g < total / G; ++g) {
    planes->append_group(0, k.f32.data() + size_t(g) * G * kvd, v.f32.data() + size_t(g) * G * kvd,
                         g);
  }
  const AttentionShape ash{nh, kvh, hd, 0.125f};
  for (KvQuantView qv : {KvQuantView::kTargetInt8, KvQuantView::kDraftInt4}) {
    QuantizedKvSegment seg = planes->segment(0, qv);
    for (int pos : {0, 63, 95, 150, 190}) {
      const int m = pos == 150 ? 40 : std::min(8, total - pos);
      const std::vector<float> q = randn(size_t(m) * nh * hd, 6 + pos);
      const int base = quant_boundary(pos, G);
      KvReadBytes b32, b16;
      KvView v32{k.f32.data() + size_t(base) * kvd, v.f32.data() + size_t(base) * kvd, kvd,
                 pos + m};
      v32.fp_base = base;
      v32.quantized = &seg;
      v32.read_bytes = &b32;
      KvView v16{k.f16.data() + size_t(base) * kvd, v.f16.data() + size_t(base) * kvd, kvd,
                 pos + m};
      v16.row_dtype = DType::F16;
      v16.fp_base = base;
      v16.quantized = &seg;
      v16.read_bytes = &b16;
      std::vector<float> want(q.size(), NAN), got(q.size(), NAN);
      be.attention(q.data(), m, pos, ash, v32, want.data());
      be.attention(q.data(), m, pos, ash, v16, got.data());
      expect_same_bits(got, want, "pos " + std::to_string(pos));
      EXPECT_EQ(2 * b16.fp, b32.fp);
      EXPECT_EQ(b16.upper, b32.upper);
      EXPECT_EQ(b16.meta, b32.meta);
    }
  }
}

// The eight arrays of a flush, poisoned around what it writes.
struct FlushOut {
  std::vector<uint8_t> ku, kl, vu, vl;
  std::vector<uint16_t> ks, km, vs, vm;
  QuantizedKvPlanesOut out;
  FlushOut(int heads, int hd, int G, int Gv, int64_t capacity) {
    const size_t codes = size_t(heads) * capacity * hd / 2;
    const size_t kmeta = size_t(heads) * (capacity / G) * hd;
    const size_t vmeta = size_t(heads) * capacity * (hd / Gv);
    ku.assign(codes, 0xA5);
    kl.assign(codes, 0xA5);
    vu.assign(codes, 0xA5);
    vl.assign(codes, 0xA5);
    ks.assign(kmeta, 0xBEEF);
    km.assign(kmeta, 0xBEEF);
    vs.assign(vmeta, 0xBEEF);
    vm.assign(vmeta, 0xBEEF);
    out = QuantizedKvPlanesOut{ku.data(), kl.data(), vu.data(), vl.data(), ks.data(), km.data(),
                               vs.data(), vm.data(), capacity,  G,         Gv};
  }
  bool operator==(const FlushOut& o) const {
    return ku == o.ku && kl == o.kl && vu == o.vu && vl == o.vl && ks == o.ks && km == o.km &&
           vs == o.vs && vm == o.vm;
  }
};

TEST(F16Rows, QuantizeKvFromF16RowsIsBitIdenticalToF32Rows) {
  CpuBackend be(2);
  const int heads = 3, hd = 64, G = 32, Gv = 32;
  const int64_t capacity = 8 * G, stride = heads * hd + 4;
  const int first_group = 2, n_groups = 4;
  std::vector<float> x = randn(size_t(n_groups) * G * stride, 21, 4.0f);
  std::vector<float> y = randn(x.size(), 22, 0.01f);
  // Values that matter to the min/max scan and the fp16 metadata: signed zeros, the f16 range
  // ends, subnormals, a constant channel, non-finite values.
  for (int t = 0; t < n_groups * G; ++t) {
    float* kr = x.data() + size_t(t) * stride;
    float* vr = y.data() + size_t(t) * stride;
    kr[0] = t % 2 ? 0.0f : -0.0f;
    kr[1] = 3.25f;
    kr[2] = t % 5 == 0 ? 65504.0f : kr[2];
    kr[3] = t % 7 == 0 ? -1e6f : kr[3];  // saturates to -65504 in f16
    vr[hd] = 0x1p-20f * (t % 9);         // subnormal in f16
    if (t == 40) kr[hd + 5] = std::nanf("");
    if (t == 41) vr[7] = std::numeric_limits<float>::infinity();
  }
  const Rows k(x), v(y);
  FlushOut a(heads, hd, G, Gv, capacity), b(heads, hd, G, Gv, capacity);
  be.quantize_kv(k.f32.data(), v.f32.data(), stride, heads, hd, first_group, n_groups, a.out);
  be.quantize_kv(k.f16.data(), v.f16.data(), DType::F16, stride, heads, hd, first_group, n_groups,
                 b.out);
  EXPECT_TRUE(a == b);
  // And the flush really wrote something: the untouched groups keep the poison.
  EXPECT_EQ(a.ks[0], 0xBEEF);
  EXPECT_NE(a.ks[size_t(first_group) * hd], 0xBEEF);
}

}  // namespace
}  // namespace qs
