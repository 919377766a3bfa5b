// The backend ops of the QuantSpec paths against plain references: the 4-bit draft matmul, and
// attention over the hierarchical view (quantized history + full-precision buffer, per-query
// boundary) against plain attention over the same rows materialized.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "kv/quantized_planes.h"
#include "quant/weight_quant.h"
#include "tiny_model.h"

namespace qs {
namespace {

using testing::randn;

TEST(MatmulQ4, MatchesTheReferenceWithBias) {
  CpuBackend be(2);
  for (int64_t cols : {128, 300, 64, 301}) {  // 301: odd, the row-expansion path
    const int64_t rows = 37;
    const std::vector<float> w = randn(rows * cols, 1);
    auto q = quantize_weight4(w.data(), DType::F32, rows, cols, 128, "w");
    ASSERT_TRUE(q.ok());
    std::vector<float> bias = randn(rows, 2);
    WeightView bv;
    bv.data = bias.data();
    bv.dtype = DType::F32;
    bv.rows = 1;
    bv.cols = rows;
    bv.name = "b";
    for (int m : {1, 3, 9}) {
      const std::vector<float> x = randn(m * cols, 3);
      std::vector<float> want(m * rows), got(m * rows);
      matmul_weight4(x.data(), m, *q, want.data());
      be.matmul_q4(x.data(), m, *q, &bv, got.data());
      for (int i = 0; i < m; ++i)
        for (int64_t j = 0; j < rows; ++j)
          ASSERT_NEAR(got[i * rows + j], want[i * rows + j] + bias[j], 1e-4) << cols << " " << m;
    }
  }
}

// Queries at [pos, pos + m) straddle group boundaries; GQA 3:1; both views.
TEST(HierarchicalAttention, MatchesPlainAttentionOverMaterializedRows) {
  CpuBackend be(2);
  const int G = 32, hd = 64, kvh = 2, nh = 6, kvd = kvh * hd;
  const int total = 200;
  const std::vector<float> k = randn(size_t(total) * kvd, 4), v = randn(size_t(total) * kvd, 5);
  KvPlanesShape shape{1, kvh, hd, G, 32, 256};
  auto planes = QuantizedPlanes::create(shape);
  ASSERT_TRUE(planes.ok());
  for (int g = 0; g < total / G; ++g) {
    planes->append_group(0, k.data() + size_t(g) * G * kvd, v.data() + size_t(g) * G * kvd, g);
  }
  const AttentionShape ash{nh, kvh, hd, 0.125f};
  for (KvQuantView view : {KvQuantView::kTargetInt8, KvQuantView::kDraftInt4}) {
    for (int pos : {0, 40, 63, 95, 100, 150, 190}) {
      // Blocks of <= 16 queries share dequantized rows; 40 queries take the per-query tasks.
      const int m = pos == 100 ? 40 : std::min(8, total - pos);
      const std::vector<float> q = randn(size_t(m) * nh * hd, 6 + pos);
      QuantizedKvSegment seg;
      const QuantizedPlanes& p = *planes;
      seg.key_upper = p.code_plane(KvCodePlane::kKeyUpper).data();
      seg.key_lower = p.code_plane(KvCodePlane::kKeyLower).data();
      seg.value_upper = p.code_plane(KvCodePlane::kValueUpper).data();
      seg.value_lower = p.code_plane(KvCodePlane::kValueLower).data();
      seg.key_scale = p.meta(KvMetaArray::kKeyScale).data();
      seg.key_min = p.meta(KvMetaArray::kKeyMin).data();
      seg.value_scale = p.meta(KvMetaArray::kValueScale).data();
      seg.value_min = p.meta(KvMetaArray::kValueMin).data();
      seg.capacity = 256;
      seg.group_size = G;
      seg.value_group_size = 32;
      seg.int8 = view == KvQuantView::kTargetInt8;
      if (!seg.int8) seg.key_lower = seg.value_lower = nullptr;  // must not be touched
      // Full-precision rows from the first query's boundary on (the buffer).
      const int base = quant_boundary(pos, G);
      KvView kv{k.data() + size_t(base) * kvd, v.data() + size_t(base) * kvd, kvd, pos + m};
      kv.fp_base = base;
      kv.quantized = &seg;
      KvReadBytes bytes;
      kv.read_bytes = &bytes;
      std::vector<float> got(size_t(m) * nh * hd);
      be.attention(q.data(), m, pos, ash, kv, got.data());
      if (!seg.int8) {
        EXPECT_EQ(bytes.lower, 0);
      } else if (quant_boundary(pos + m - 1, G) > 0) {
        EXPECT_EQ(bytes.lower, bytes.upper);
      }

      for (int i = 0; i < m; ++i) {
        const int t = pos + i, b = quant_boundary(t, G);
        std::vector<float> mk(k.begin(), k.begin() + size_t(t + 1) * kvd);
        std::vector<float> mv(v.begin(), v.begin() + size_t(t + 1) * kvd);
        std::vector<float> row(hd);
        for (int h = 0; h < kvh; ++h) {
          for (int r = 0; r < b; ++r) {
            p.read_keys(0, h, r, 1, view, row.data());
            std::copy(row.begin(), row.end(), mk.begin() + size_t(r) * kvd + h * hd);
            p.read_values(0, h, r, 1, view, row.data());
            std::copy(row.begin(), row.end(), mv.begin() + size_t(r) * kvd + h * hd);
          }
        }
        std::vector<float> want(size_t(nh) * hd);
        be.attention(q.data() + size_t(i) * nh * hd, 1, t, ash,
                     KvView{mk.data(), mv.data(), kvd, t + 1}, want.data());
        for (int j = 0; j < nh * hd; ++j) {
          ASSERT_NEAR(got[size_t(i) * nh * hd + j], want[j], 1e-5) << "pos " << t;
        }
      }
    }
  }
}

// A long quantized history (N(0,1) keys and values, so the mins are ~ -2.6 while the output is
// ~ 1/sqrt(n)): the result must keep f32 accuracy against a double-precision attention over the
// same dequantized rows (uncentred code sums lost ~1e-3 relative here).
TEST(HierarchicalAttention, LongHistoryKeepsF32Accuracy) {
  CpuBackend be(2);
  const int G = 128, hd = 64, total = 20000;
  const int cap = (total / G + 1) * G;
  const std::vector<float> k = randn(size_t(total) * hd, 11), v = randn(size_t(total) * hd, 12);
  const std::vector<float> q = randn(size_t(hd), 13);
  KvPlanesShape shape{1, 1, hd, G, hd, cap};
  auto planes = QuantizedPlanes::create(shape);
  ASSERT_TRUE(planes.ok());
  for (int g = 0; g < total / G; ++g) {
    planes->append_group(0, k.data() + size_t(g) * G * hd, v.data() + size_t(g) * G * hd, g);
  }
  const int t = total - 1, b = quant_boundary(t, G);
  for (KvQuantView view : {KvQuantView::kTargetInt8, KvQuantView::kDraftInt4}) {
    QuantizedKvSegment seg = planes->segment(0, view);
    KvView kv{k.data() + size_t(b) * hd, v.data() + size_t(b) * hd, hd, total};
    kv.fp_base = b;
    kv.quantized = &seg;
    std::vector<float> got(hd);
    be.attention(q.data(), 1, t, AttentionShape{1, 1, hd, 0.125f}, kv, got.data());
    // The reference: double precision over the dequantized history + the f32 rows.
    std::vector<double> s(total), want(hd, 0.0);
    std::vector<float> kr(hd), vr(hd);
    double mx = -1e300;
    for (int r = 0; r < total; ++r) {
      if (r < b) {
        planes->read_keys(0, 0, r, 1, view, kr.data());
      } else {
        std::copy(k.begin() + size_t(r) * hd, k.begin() + size_t(r + 1) * hd, kr.begin());
      }
      double dot = 0;
      for (int d = 0; d < hd; ++d) dot += double(q[d]) * kr[d];
      s[r] = dot * 0.125;
      mx = std::max(mx, s[r]);
    }
    double sum = 0;
    for (int r = 0; r < total; ++r) sum += (s[r] = std::exp(s[r] - mx));
    for (int r = 0; r < total; ++r) {
      if (r < b) {
        planes->read_values(0, 0, r, 1, view, vr.data());
      } else {
        std::copy(v.begin() + size_t(r) * hd, v.begin() + size_t(r + 1) * hd, vr.begin());
      }
      for (int d = 0; d < hd; ++d) want[d] += s[r] / sum * vr[d];
    }
    double num = 0, den = 0;
    for (int d = 0; d < hd; ++d) {
      num += (got[d] - want[d]) * (got[d] - want[d]);
      den += want[d] * want[d];
    }
    EXPECT_LT(std::sqrt(num / den), 5e-5) << (view == KvQuantView::kTargetInt8 ? "int8" : "int4");
  }
}

}  // namespace
}  // namespace qs
