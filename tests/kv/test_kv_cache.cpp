#include <gtest/gtest.h>

#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "kv/kv_cache.h"

namespace qs {
namespace {

CpuBackend& cpu() {
  static CpuBackend backend{1};
  return backend;
}

KvCacheConfig small(KvMode mode) {
  KvCacheConfig c;
  c.mode = mode;
  c.num_layers = 2;
  c.num_kv_heads = 1;
  c.head_dim = 4;
  c.group_size = 8;
  c.max_gamma = 3;
  c.capacity = 200;
  return c;
}

// Rows whose every element is the position (+ 1000 for values), layer-independent.
void write_rows(KvCache& c, int pos, int m, float offset = 0.0f) {
  std::vector<float> k(static_cast<size_t>(m) * 4), v(k.size());
  for (int i = 0; i < m; ++i) {
    for (int d = 0; d < 4; ++d) {
      k[i * 4 + d] = float(pos + i) + offset;
      v[i * 4 + d] = float(pos + i) + 1000.0f + offset;
    }
  }
  ASSERT_TRUE(c.prepare_write(pos, m).ok());
  for (int l = 0; l < 2; ++l) c.write(l, pos, m, k.data(), v.data());
}

std::vector<uint8_t> snapshot(const KvCache& c) {
  auto p = c.planes()->code_plane(KvCodePlane::kKeyUpper);
  auto q = c.planes()->code_plane(KvCodePlane::kValueLower);
  std::vector<uint8_t> s(p.begin(), p.end());
  s.insert(s.end(), q.begin(), q.end());
  return s;
}

TEST(KvCache, FlushesCompleteCommittedGroupsOnceAndKeepsTheBufferWindow) {
  auto made = KvCache::create(small(KvMode::kQuantSpec), cpu());
  ASSERT_TRUE(made.ok()) << made.error().message;
  KvCache c = std::move(made).value();
  write_rows(c, 0, 13);  // prefill of 13 < 2G: nothing is dropped, one group quantized
  c.commit(13);
  EXPECT_EQ(c.planes_length(), 8);
  EXPECT_EQ(c.fp_base(), 0);
  EXPECT_EQ(c.flushes(), 1);
  int n = 13;
  for (int round = 0; round < 40; ++round) {
    const int gamma = round % 4;
    write_rows(c, n, gamma + 1, 0.5f);  // draft rows
    write_rows(c, n, gamma + 1);        // the target's overwrite
    const int k = round % (gamma + 1);
    const std::vector<uint8_t> before = snapshot(c);
    const int planes_before = c.planes_length();
    n += k + 1;
    c.commit(n);
    EXPECT_EQ(c.length(), n);
    EXPECT_EQ(c.planes_length(), 8 * (n / 8));
    EXPECT_EQ(c.fp_base(), quant_boundary(n, 8));
    EXPECT_GE(c.planes_length(), c.fp_base());
    if (c.planes_length() == planes_before) {
      EXPECT_EQ(snapshot(c), before);
    }
    // The buffer row of position p holds p (target K/V, not the rejected draft's).
    QuantizedKvSegment seg;
    const KvView v = c.view(1, KvQuantView::kTargetInt8, &seg);
    for (int p = c.fp_base(); p < n; ++p) EXPECT_EQ(v.k_f32()[(p - v.fp_base) * 4], float(p));
  }
  EXPECT_EQ(c.flushes(), n / 8);
  // The quantized rows reconstruct the committed values (position-valued rows are exact-ish).
  std::vector<float> out(4);
  c.planes()->read_keys(0, 0, 17, 1, KvQuantView::kTargetInt8, out.data());
  EXPECT_NEAR(out[0], 17.0f, 7.0f / 16 / 15 + 1e-3);
}

TEST(KvCache, FullPrecisionModeNeverQuantizes) {
  KvCache c = std::move(KvCache::create(small(KvMode::kFp), cpu())).value();
  EXPECT_EQ(c.planes(), nullptr);
  write_rows(c, 0, 150);
  c.commit(150);
  EXPECT_EQ(c.fp_base(), 0);
  EXPECT_EQ(c.planes_length(), 0);
  const KvView v = c.view(0, KvQuantView::kTargetInt8, nullptr);
  EXPECT_EQ(v.quantized, nullptr);
  EXPECT_EQ(v.k_f32()[149 * 4], 149.0f);
  EXPECT_FALSE(c.prepare_write(150, 51).ok());  // capacity 200
}

// The buffer grows geometrically, and straight to the capacity once more than half of it is
// needed (two large growths would hold 1.5x the final size at once); a prompt reserved up front
// is one allocation.
TEST(KvCache, GrowsToTheCapacityBeyondHalfOfIt) {
  KvCacheConfig cfg = small(KvMode::kFp);
  cfg.capacity = 1000;
  KvCache c = std::move(KvCache::create(cfg, cpu())).value();
  const size_t per_row = 2 * 2 * 4 * sizeof(float);  // K and V, 2 layers, kv_dim 4
  EXPECT_EQ(c.bytes(), 64 * per_row);                 // the steady buffer
  ASSERT_TRUE(c.prepare_write(0, 70).ok());
  EXPECT_EQ(c.bytes(), 128 * per_row);  // doubled
  ASSERT_TRUE(c.prepare_write(0, 300).ok());
  EXPECT_EQ(c.bytes(), 300 * per_row);  // what is asked for, when more than double
  ASSERT_TRUE(c.prepare_write(0, 501).ok());
  EXPECT_EQ(c.bytes(), 1000 * per_row);  // past half of the capacity: all of it, not 600
  write_rows(c, 0, 501);
  c.commit(501);
  ASSERT_TRUE(c.prepare_write(501, 499).ok());
  EXPECT_EQ(c.bytes(), 1000 * per_row);  // no further growth up to the capacity
  EXPECT_FALSE(c.prepare_write(501, 500).ok());
}

// A prompt cache keeps a prefix of the committed positions: any prefix in the fp mode; in the
// quantized modes none below the quantized groups (their rows left the buffer). After
// truncate(n) the cache continues as if it had only ever committed [0, n): new rows at n, the
// next flushes quantize them, and the planes below n are untouched.
TEST(KvCache, TruncatesToAPrefixTheBufferStillHolds) {
  KvCache fp = std::move(KvCache::create(small(KvMode::kFp), cpu())).value();
  write_rows(fp, 0, 50);
  fp.commit(50);
  EXPECT_TRUE(fp.can_truncate(0));
  EXPECT_FALSE(fp.can_truncate(51));
  fp.truncate(20);
  EXPECT_EQ(fp.length(), 20);
  EXPECT_EQ(fp.written_end(), 20);
  write_rows(fp, 20, 5, 0.5f);
  fp.commit(25);
  const KvView fv = fp.view(0, std::nullopt, nullptr);
  EXPECT_EQ(fv.k_f32()[19 * 4], 19.0f);
  EXPECT_EQ(fv.k_f32()[20 * 4], 20.5f);

  KvCache q = std::move(KvCache::create(small(KvMode::kQuantSpec), cpu())).value();
  write_rows(q, 0, 45);
  q.commit(45);  // G = 8: planes [0, 40), buffer [b(45) = 32, 45)
  ASSERT_EQ(q.planes_length(), 40);
  ASSERT_EQ(q.fp_base(), 32);
  EXPECT_FALSE(q.can_truncate(39));  // group [32, 40) is quantized: b(39) = 24 < fp_base
  EXPECT_FALSE(q.can_truncate(46));
  EXPECT_TRUE(q.can_truncate(40));
  const std::vector<uint8_t> planes = snapshot(q);
  q.truncate(41);
  EXPECT_EQ(q.length(), 41);
  EXPECT_EQ(q.planes_length(), 40);
  EXPECT_EQ(q.fp_base(), 32);
  EXPECT_EQ(snapshot(q), planes);
  // Rows 41.. are rewritten with other values; group [40, 48) is quantized from them.
  write_rows(q, 41, 10, 0.5f);
  q.commit(51);
  EXPECT_EQ(q.planes_length(), 48);
  EXPECT_EQ(q.fp_base(), quant_boundary(51, 8));
  QuantizedKvSegment seg;
  const KvView v = q.view(1, KvQuantView::kTargetInt8, &seg);
  for (int p = q.fp_base(); p < 51; ++p) {
    EXPECT_EQ(v.k_f32()[(p - v.fp_base) * 4], float(p) + (p >= 41 ? 0.5f : 0.0f)) << p;
  }
  std::vector<float> out(4);
  q.planes()->read_keys(0, 0, 45, 1, KvQuantView::kTargetInt8, out.data());
  EXPECT_NEAR(out[0], 45.5f, 0.05f);  // quantized from the new row, not the dropped one
  q.planes()->read_keys(0, 0, 35, 1, KvQuantView::kTargetInt8, out.data());
  EXPECT_NEAR(out[0], 35.0f, 0.05f);
}

TEST(KvCache, RejectsBadConfigurations) {
  KvCacheConfig c = small(KvMode::kInt8);
  c.max_gamma = 8;
  EXPECT_FALSE(c.validate().ok());
  c = small(KvMode::kQuantSpec);
  c.head_dim = 64;
  c.value_group_size = 48;
  EXPECT_NE(c.validate().error().message.find("Gv"), std::string::npos);
  c.value_group_size = 16;
  EXPECT_FALSE(c.validate().ok());
  c.value_group_size = 32;
  EXPECT_TRUE(c.validate().ok());
  c.group_size = 24;
  EXPECT_FALSE(c.validate().ok());
}

}  // namespace
}  // namespace qs
