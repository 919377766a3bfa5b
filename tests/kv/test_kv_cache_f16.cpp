// The KV cache with f16 full-precision rows (KvCacheConfig::row_dtype = F16): every row operation
// of the cache (write, commit, rollback, the buffer shift after a flush, the buffer's growth and
// shrink) keeps the rows as f16(x) (round to nearest even, saturating), the flush quantizes
// exactly what an f32 cache holding the same rounded values quantizes, and the memory halves.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "kv/kv_cache.h"

namespace qs {
namespace {

CpuBackend& cpu() {
  static CpuBackend backend{1};
  return backend;
}

constexpr int kLayers = 2, kHeads = 2, kHd = 8, kDim = kHeads * kHd;

KvCacheConfig config(KvMode mode, DType rows) {
  KvCacheConfig c;
  c.mode = mode;
  c.num_layers = kLayers;
  c.num_kv_heads = kHeads;
  c.head_dim = kHd;
  c.group_size = 8;
  c.max_gamma = 3;
  c.capacity = 400;
  c.row_dtype = rows;
  return c;
}

KvCache make(KvMode mode, DType rows) {
  auto made = KvCache::create(config(mode, rows), cpu());
  EXPECT_TRUE(made.ok()) << made.error().message;
  return std::move(made).value();
}

// Element d of position p's key (value: + 0.5), layer l, in a version `tag` (draft rows vs the
// target's): exact in f32 (integer arithmetic and powers of two, so no evaluation order can
// change it) but mostly not representable in f16, so the stored values are really rounded; a
// few huge ones must saturate.
float key_value(int p, int l, int d, int tag) {
  if (d == 3 && p % 17 == 5) return (p % 2 ? -1.0f : 1.0f) * (70000.0f + p);  // beyond f16
  uint32_t h = static_cast<uint32_t>(p) * 2654435761u ^
               static_cast<uint32_t>(l * 40503 + d * 977 + tag * 7919);
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  // At most 20 significant bits: exact in f32 (also after + 0.5), f16 keeps 11.
  return static_cast<float>(static_cast<int>(h % 131071) - 65535) * 0x1p-14f *
         static_cast<float>(1 + p % 7);
}

float rounded(float x) {
  return f16_to_f32(f32_to_f16_sat(x));
}

void write_rows(KvCache& c, int pos, int m, int tag = 0) {
  ASSERT_TRUE(c.prepare_write(pos, m).ok());
  std::vector<float> k(static_cast<size_t>(m) * kDim), v(k.size());
  for (int l = 0; l < kLayers; ++l) {
    for (int i = 0; i < m; ++i) {
      for (int d = 0; d < kDim; ++d) {
        k[size_t(i) * kDim + d] = key_value(pos + i, l, d, tag);
        v[size_t(i) * kDim + d] = key_value(pos + i, l, d, tag) + 0.5f;
      }
    }
    c.write(l, pos, m, k.data(), v.data());
  }
}

// Every readable row [fp_base, end) of every layer holds the rounded values of version `tag`.
void expect_rows(const KvCache& c, int end, int tag = 0) {
  for (int l = 0; l < kLayers; ++l) {
    const KvView v = c.view(l, std::nullopt, nullptr);
    ASSERT_EQ(v.row_dtype, DType::F16);
    ASSERT_EQ(v.row_stride, kDim);
    for (int p = c.fp_base(); p < end; ++p) {
      for (int d = 0; d < kDim; ++d) {
        const size_t i = size_t(p - v.fp_base) * kDim + d;
        ASSERT_EQ(f16_to_f32(v.k_f16()[i]), rounded(key_value(p, l, d, tag)))
            << "layer " << l << " pos " << p << " d " << d;
        ASSERT_EQ(f16_to_f32(v.v_f16()[i]), rounded(key_value(p, l, d, tag) + 0.5f))
            << "layer " << l << " pos " << p << " d " << d;
      }
    }
  }
}

TEST(KvCacheF16, ValidateAcceptsF32AndF16Only) {
  EXPECT_TRUE(config(KvMode::kFp, DType::F32).validate().ok());
  EXPECT_TRUE(config(KvMode::kQuantSpec, DType::F16).validate().ok());
  for (DType bad : {DType::BF16, DType::I32, DType::U8}) {
    const Status st = config(KvMode::kFp, bad).validate();
    ASSERT_FALSE(st.ok()) << dtype_name(bad);
    EXPECT_NE(st.error().message.find("F32 or F16"), std::string::npos) << st.error().message;
    EXPECT_NE(st.error().message.find(dtype_name(bad)), std::string::npos);
    EXPECT_FALSE(KvCache::create(config(KvMode::kInt8, bad), cpu()).ok());
  }
}

TEST(KvCacheF16, FullPrecisionWriteCommitRollbackAndGrowth) {
  KvCache c = make(KvMode::kFp, DType::F16);
  EXPECT_EQ(c.row_dtype(), DType::F16);
  write_rows(c, 0, 150);  // grows the buffer from 64 rows (copies of the f16 rows)
  c.commit(150);
  expect_rows(c, 150);
  // Speculative rows past n, then a commit of only two of them: the rest is dropped.
  write_rows(c, 150, 5, /*tag=*/1);
  c.commit(152);
  EXPECT_EQ(c.written_end(), 152);
  write_rows(c, 152, 3, /*tag=*/2);
  c.commit(155);
  expect_rows(c, 150);
  for (int l = 0; l < kLayers; ++l) {
    const KvView v = c.view(l, std::nullopt, nullptr);
    for (int d = 0; d < kDim; ++d) {
      EXPECT_EQ(f16_to_f32(v.k_f16()[151 * kDim + d]), rounded(key_value(151, l, d, 1)));
      EXPECT_EQ(f16_to_f32(v.k_f16()[153 * kDim + d]), rounded(key_value(153, l, d, 2)));
    }
  }
  // Saturation: 70000 + p is stored as 65504, never inf.
  const KvView v = c.view(0, std::nullopt, nullptr);
  EXPECT_EQ(f16_to_f32(v.k_f16()[5 * kDim + 3]), -65504.0f);  // p = 5: odd, negative
  EXPECT_EQ(f16_to_f32(v.k_f16()[22 * kDim + 3]), 65504.0f);
}

// The quantized modes: the buffer shifts after flushes, grows for a long prefill and shrinks
// back; the planes equal those of an f32 cache that was given the f16-rounded rows.
TEST(KvCacheF16, QuantSpecBufferKeepsRowsAndQuantizesTheRoundedValues) {
  KvCache c16 = make(KvMode::kQuantSpec, DType::F16);
  KvCache c32 = make(KvMode::kQuantSpec, DType::F32);
  auto write_both = [&](int pos, int m, int tag) {
    write_rows(c16, pos, m, tag);
    // The same rows, rounded to f16 first, into the f32 cache.
    ASSERT_TRUE(c32.prepare_write(pos, m).ok());
    std::vector<float> k(static_cast<size_t>(m) * kDim), v(k.size());
    for (int l = 0; l < kLayers; ++l) {
      for (int i = 0; i < m; ++i) {
        for (int d = 0; d < kDim; ++d) {
          k[size_t(i) * kDim + d] = rounded(key_value(pos + i, l, d, tag));
          v[size_t(i) * kDim + d] = rounded(key_value(pos + i, l, d, tag) + 0.5f);
        }
      }
      c32.write(l, pos, m, k.data(), v.data());
    }
  };
  write_both(0, 300, 0);  // a long prefill: the buffer grows past 2 * (2G + gamma + 1)
  const size_t grown = c16.bytes();
  c16.commit(300);
  c32.commit(300);
  EXPECT_LT(c16.bytes(), grown);  // given back
  EXPECT_EQ(c16.fp_base(), quant_boundary(300, 8));
  expect_rows(c16, 300);
  int n = 300;
  for (int round = 0; round < 30; ++round) {
    const int gamma = round % 4;
    write_both(n, gamma + 1, 1);  // draft rows
    write_both(n, gamma + 1, 0);  // the target's overwrite
    n += round % (gamma + 1) + 1;
    c16.commit(n);
    c32.commit(n);
    ASSERT_EQ(c16.fp_base(), quant_boundary(n, 8));
    expect_rows(c16, n);
  }
  EXPECT_GT(c16.flushes(), 30);
  // Bit-identical planes (codes and metadata) to the f32 cache's.
  const QuantizedPlanes& a = *c16.planes();
  const QuantizedPlanes& b = *c32.planes();
  for (KvCodePlane plane : {KvCodePlane::kKeyUpper, KvCodePlane::kKeyLower,
                            KvCodePlane::kValueUpper, KvCodePlane::kValueLower}) {
    const auto x = a.code_plane(plane), y = b.code_plane(plane);
    ASSERT_EQ(x.size(), y.size());
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size()), 0);
  }
  for (KvMetaArray m : {KvMetaArray::kKeyScale, KvMetaArray::kKeyMin, KvMetaArray::kValueScale,
                        KvMetaArray::kValueMin}) {
    const auto x = a.meta(m), y = b.meta(m);
    ASSERT_EQ(x.size(), y.size());
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])), 0);
  }
}

TEST(KvCacheF16, BytesCountTheRealRowSize) {
  for (KvMode mode : {KvMode::kFp, KvMode::kInt8, KvMode::kQuantSpec}) {
    KvCache c16 = make(mode, DType::F16);
    KvCache c32 = make(mode, DType::F32);
    const size_t planes =
        c16.planes() ? static_cast<size_t>(c16.planes()->shape().total_bytes()) : 0;
    ASSERT_GT(c32.bytes(), planes);
    EXPECT_EQ((c32.bytes() - planes), 2 * (c16.bytes() - planes)) << kv_mode_name(mode);
    // After growing to the same rows, still half.
    write_rows(c16, 0, 200);
    ASSERT_TRUE(c32.prepare_write(0, 200).ok());
    EXPECT_EQ((c32.bytes() - planes), 2 * (c16.bytes() - planes)) << kv_mode_name(mode);
  }
}

// A buffer that cannot be had (2^48 bytes per K or V: more than any address space) is an error
// naming its real size.
TEST(KvCacheF16, AllocationFailureNamesTheRealSize) {
  KvCacheConfig cfg;
  cfg.mode = KvMode::kFp;
  cfg.num_layers = 1;
  cfg.num_kv_heads = 512;
  cfg.head_dim = 256;  // kv_dim 2^17
  cfg.capacity = 1 << 30;
  cfg.row_dtype = DType::F16;
  auto made = KvCache::create(cfg, cpu());  // 64 rows: 16 MiB per buffer
  ASSERT_TRUE(made.ok()) << made.error().message;
  const Status st = made->prepare_write(0, 1 << 30);
  ASSERT_FALSE(st.ok());
  // 2 buffers x 2^30 rows x 2^17 elements x 2 bytes = 2^49 bytes = 524288 GiB (f32: twice).
  EXPECT_NE(st.error().message.find("cannot allocate 524288"), std::string::npos)
      << st.error().message;
  EXPECT_NE(st.error().message.find("f16"), std::string::npos) << st.error().message;
}

}  // namespace
}  // namespace qs
