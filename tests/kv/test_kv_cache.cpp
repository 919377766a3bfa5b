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

// The prompt cache's kept rows (keep_rows_from): commits drop no buffer row at or above the kept
// position while at most max_rows rows lie below the quantization boundary, so truncate() can
// cut back below quantized groups. The groups above the cut are quantized again from the new
// rows, and the cache then holds what a cache that only ever committed those rows holds.
TEST(KvCache, KeptRowsLetTruncateCutBelowTheQuantizedGroups) {
  KvCache q = std::move(KvCache::create(small(KvMode::kQuantSpec), cpu())).value();
  q.keep_rows_from(16, 40);
  write_rows(q, 0, 45);
  q.commit(45);  // G = 8: planes [0, 40); rows from 16 kept (b(45) = 32)
  EXPECT_EQ(q.planes_length(), 40);
  EXPECT_EQ(q.fp_base(), 16);
  EXPECT_TRUE(q.can_truncate(24));   // b(24) = 16: the rows attention at 24 reads are held
  EXPECT_FALSE(q.can_truncate(23));  // b(23) = 8 < 16
  q.truncate(26);
  EXPECT_EQ(q.length(), 26);
  EXPECT_EQ(q.planes_length(), 24);  // groups [24, 40) are no longer committed
  EXPECT_EQ(q.fp_base(), 16);
  write_rows(q, 26, 25, 0.5f);
  q.commit(51);

  // The same rows committed by a cache that never held the dropped ones.
  KvCache fresh = std::move(KvCache::create(small(KvMode::kQuantSpec), cpu())).value();
  write_rows(fresh, 0, 26);
  write_rows(fresh, 26, 25, 0.5f);
  fresh.commit(51);
  ASSERT_EQ(q.planes_length(), 48);
  ASSERT_EQ(fresh.planes_length(), 48);
  std::vector<float> a(4), b(4);
  for (int p = 0; p < 48; ++p) {
    for (const KvQuantView view : {KvQuantView::kTargetInt8, KvQuantView::kDraftInt4}) {
      q.planes()->read_keys(1, 0, p, 1, view, a.data());
      fresh.planes()->read_keys(1, 0, p, 1, view, b.data());
      EXPECT_EQ(a, b) << p;
      q.planes()->read_values(1, 0, p, 1, view, a.data());
      fresh.planes()->read_values(1, 0, p, 1, view, b.data());
      EXPECT_EQ(a, b) << p;
    }
  }
  QuantizedKvSegment seg;
  const KvView v = q.view(0, KvQuantView::kTargetInt8, &seg);
  EXPECT_EQ(v.fp_base, 16);
  for (int p = v.fp_base; p < 51; ++p) {
    EXPECT_EQ(v.k_f32()[(p - v.fp_base) * 4], float(p) + (p >= 26 ? 0.5f : 0.0f)) << p;
  }
}

// Past max_rows below the boundary the rows go as without keep_rows_from; clear() ends it.
TEST(KvCache, KeptRowsAreDroppedPastTheirLimit) {
  KvCache q = std::move(KvCache::create(small(KvMode::kInt8), cpu())).value();
  q.keep_rows_from(8, 16);
  write_rows(q, 0, 30);
  q.commit(30);  // b(30) = 16: 8 rows below it
  EXPECT_EQ(q.fp_base(), 8);
  write_rows(q, 30, 6);
  q.commit(36);  // b(36) = 24: 16 rows
  EXPECT_EQ(q.fp_base(), 8);
  write_rows(q, 36, 4);
  q.commit(40);  // b(40) = 32: 24 rows, past the limit
  EXPECT_EQ(q.fp_base(), 32);
  EXPECT_FALSE(q.can_truncate(30));
  write_rows(q, 40, 10);
  q.commit(50);
  EXPECT_EQ(q.fp_base(), 40);  // not kept again

  q.clear();
  q.keep_rows_from(0, 100);
  q.clear();
  write_rows(q, 0, 30);
  q.commit(30);
  EXPECT_EQ(q.fp_base(), 16);
}

// A layer-major prefill keeps the rows from the kept position too: the state a chunk-major
// prefill of the same rows leaves.
TEST(KvCache, LayerMajorPrefillKeepsTheKeptRows) {
  KvCache lm = std::move(KvCache::create(small(KvMode::kQuantSpec), cpu())).value();
  KvCache cm = std::move(KvCache::create(small(KvMode::kQuantSpec), cpu())).value();
  lm.keep_rows_from(24, 64);
  cm.keep_rows_from(24, 64);
  ASSERT_TRUE(lm.begin_layer_prefill(61).ok());
  std::vector<float> k(61 * 4), v(61 * 4);
  for (int i = 0; i < 61 * 4; ++i) {
    k[i] = float(i / 4);
    v[i] = float(i / 4) + 1000.0f;
  }
  for (int l = 0; l < 2; ++l) {
    lm.write(l, 0, 61, k.data(), v.data());
    lm.end_layer_prefill(l);
  }
  write_rows(cm, 0, 61);
  cm.commit(61);
  EXPECT_EQ(lm.fp_base(), 24);
  EXPECT_EQ(cm.fp_base(), 24);
  EXPECT_EQ(lm.planes_length(), cm.planes_length());
  EXPECT_EQ(snapshot(lm), snapshot(cm));
  for (int l = 0; l < 2; ++l) {
    const KvView a = lm.view(l, std::nullopt, nullptr);
    const KvView b = cm.view(l, std::nullopt, nullptr);
    for (int p = 24; p < 61; ++p) {
      EXPECT_EQ(a.k_f32()[(p - 24) * 4], float(p));
      EXPECT_EQ(a.v_f32()[(p - 24) * 4], b.v_f32()[(p - 24) * 4]);
    }
  }
  EXPECT_TRUE(lm.can_truncate(33));
  EXPECT_FALSE(lm.can_truncate(31));
}

// A backend that has no memory for buffers of more than `limit` floats.
class LimitedCpuBackend : public CpuBackend {
 public:
  explicit LimitedCpuBackend(size_t limit) : CpuBackend(1), limit_(limit) {}
  std::unique_ptr<Buffer> try_alloc(size_t n) override {
    return n > limit_ ? nullptr : CpuBackend::try_alloc(n);
  }

 private:
  size_t limit_;
};

// Kept rows never make a write fail: when the buffer cannot grow, they are dropped first (the
// speculative rows past the committed ones stay). Nor do they grow the buffer past max_rows below
// the boundary and the steady rows above it, and clear() gives back what they grew.
TEST(KvCache, KeptRowsGiveWayWhenTheBufferCannotGrow) {
  LimitedCpuBackend backend(40 * 2 * 4);  // 40 rows of 2 layers x 4 floats
  const size_t per_row = 2 * 2 * 4 * sizeof(float);
  KvCache q = std::move(KvCache::create(small(KvMode::kQuantSpec), backend)).value();
  q.keep_rows_from(0, 1000);
  write_rows(q, 0, 38);
  q.commit(38);
  write_rows(q, 38, 2);  // a round's candidates
  EXPECT_EQ(q.fp_base(), 0);
  EXPECT_TRUE(q.can_truncate(3));
  ASSERT_TRUE(q.prepare_write(40, 5).ok());  // 45 rows do not fit: back to b(38) = 24
  EXPECT_EQ(q.fp_base(), 24);
  EXPECT_EQ(q.written_end(), 40);
  EXPECT_FALSE(q.can_truncate(30));
  const KvView v = q.view(1, std::nullopt, nullptr);
  for (int p = 24; p < 40; ++p) EXPECT_EQ(v.k_f32()[(p - 24) * 4], float(p)) << p;
  write_rows(q, 40, 5);
  q.commit(45);
  EXPECT_EQ(q.planes_length(), 40);

  KvCache c = std::move(KvCache::create(small(KvMode::kInt8), cpu())).value();
  c.keep_rows_from(0, 40);  // steady rows: 2G + gamma + 1 = 20
  write_rows(c, 0, 50);
  c.commit(50);  // b(50) = 40 rows kept below the boundary
  write_rows(c, 50, 3);
  EXPECT_EQ(c.bytes() - c.planes()->shape().total_bytes(), 60 * per_row);  // 40 + 20, not 2 x 50
  c.clear();
  EXPECT_EQ(c.bytes() - c.planes()->shape().total_bytes(), 20 * per_row);
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
