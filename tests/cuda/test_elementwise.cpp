// Embedding, RMSNorm, RoPE, SwiGLU and add on CUDA against the CPU backend.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "backend/rope_freq.h"
#include "core/argmax.h"
#include "cuda_test_util.h"

namespace qs {
namespace {

using testing::CudaOpsTest;
using testing::DeviceArray;
using testing::HostWeight;
using testing::random_normal;
using testing::rel_error;

constexpr DType kDtypes[] = {DType::F32, DType::F16, DType::BF16};

TEST_F(CudaOpsTest, EmbeddingMatchesCpuExactly) {
  for (DType dt : kDtypes) {
    const int64_t vocab = 1000, d = 136;
    HostWeight table(random_normal(vocab * d, 1), dt, vocab, d, "embed");
    for (int m : {1, 7, 64, 65, 300}) {  // 64: largest inline-id launch; beyond: ids uploaded
      std::vector<int32_t> ids(m);
      for (int i = 0; i < m; ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13) % vocab);
      ids[0] = static_cast<int32_t>(vocab - 1);
      std::vector<float> want(m * d);
      cpu().embedding(table.view, ids.data(), m, want.data());
      DeviceArray out(gpu(), m * d);
      out.poison();
      gpu().embedding(table.view, ids.data(), m, out.data());
      EXPECT_EQ(out.to_host(), want) << dtype_name(dt) << " m=" << m;
    }
    gpu().release_weights();  // the host table dies here; its address may be reused
  }
}

TEST_F(CudaOpsTest, RmsNormMatchesCpu) {
  for (DType dt : kDtypes) {
    for (int64_t d : {64, 4096, 5003}) {
      for (int m : {1, 3, 33}) {
        HostWeight w(random_normal(d, 2, 0.3f, 1.0f), dt, 1, d, "norm");
        const std::vector<float> x = random_normal(m * d, 3 + d + m, 2.0f);
        std::vector<float> want(m * d);
        cpu().rmsnorm(x.data(), w.view, m, 1e-5f, want.data());
        DeviceArray xd(gpu(), x), out(gpu(), m * d);
        out.poison();
        gpu().rmsnorm(xd.data(), w.view, m, 1e-5f, out.data());
        EXPECT_LT(rel_error(out.to_host(), want), 1e-6) << dtype_name(dt) << " d=" << d;
        gpu().rmsnorm(xd.data(), w.view, m, 1e-5f, xd.data());  // in place
        EXPECT_LT(rel_error(xd.to_host(), want), 1e-6) << "in place, d=" << d;
        gpu().release_weights();
      }
    }
  }
}

TEST_F(CudaOpsTest, RopeMatchesCpu) {
  ModelConfig cfg;
  cfg.rope_theta = 500000.0f;
  cfg.rope_scaling.type = RopeScalingType::Llama3;
  cfg.rope_scaling.factor = 8.0f;
  cfg.rope_scaling.low_freq_factor = 1.0f;
  cfg.rope_scaling.high_freq_factor = 4.0f;
  cfg.rope_scaling.original_max_position_embeddings = 8192;
  for (int head_dim : {32, 64, 128, 256}) {
    cfg.head_dim = head_dim;
    const std::vector<float> inv_freq = rope_inv_freq(cfg);
    for (int pos : {0, 1000, 131000}) {
      for (int m : {1, 17}) {
        const int heads = 3;
        const std::vector<float> x = random_normal(size_t(m) * heads * head_dim, pos + m);
        std::vector<float> want = x;
        cpu().rope(want.data(), m, heads, head_dim, pos, inv_freq.data());
        DeviceArray xd(gpu(), x);
        gpu().rope(xd.data(), m, heads, head_dim, pos, inv_freq.data());
        EXPECT_LT(rel_error(xd.to_host(), want), 1e-6)
            << "head_dim=" << head_dim << " pos=" << pos << " m=" << m;
      }
    }
  }
}

TEST_F(CudaOpsTest, SwigluAndAddMatchCpu) {
  for (int64_t n : {1, 1023, 100000}) {
    const std::vector<float> g = random_normal(n, 10 + n, 3.0f), u = random_normal(n, 20 + n);
    std::vector<float> want(n);
    cpu().swiglu(g.data(), u.data(), n, want.data());
    DeviceArray gd(gpu(), g), ud(gpu(), u), out(gpu(), n);
    out.poison();
    gpu().swiglu(gd.data(), ud.data(), n, out.data());
    EXPECT_LT(rel_error(out.to_host(), want), 1e-6) << "swiglu n=" << n;
    gpu().swiglu(gd.data(), ud.data(), n, gd.data());  // aliasing gate
    EXPECT_LT(rel_error(gd.to_host(), want), 1e-6) << "swiglu in place n=" << n;

    std::vector<float> y = g;
    cpu().add(y.data(), u.data(), n);
    DeviceArray yd(gpu(), g);
    gpu().add(yd.data(), ud.data(), n);
    EXPECT_EQ(yd.to_host(), y) << "add n=" << n;
  }
  // Unaligned pointers and a length that is not a multiple of 4 take the scalar path.
  const int64_t n = 1001;
  const std::vector<float> a = random_normal(n + 1, 30), b = random_normal(n + 1, 31);
  std::vector<float> want(a.begin() + 1, a.end());
  for (int64_t i = 0; i < n; ++i) want[i] += b[i + 1];
  DeviceArray ad(gpu(), a), bd(gpu(), b);
  gpu().add(ad.data() + 1, bd.data() + 1, n);
  const std::vector<float> got = ad.to_host();
  EXPECT_EQ(std::vector<float>(got.begin() + 1, got.end()), want);
}

// The GPU argmax (cuda::launch_argmax_rows, Backend::argmax_rows unless QS_CUDA_ARGMAX=0) against
// the host's definition: lengths around the block's 1024 threads and the Llama-3 vocabulary, 1..16
// rows, ties (small integers), NaN (also at index 0), +-inf, all -inf, all NaN; and
// CudaBackend::argmax_rows itself (whichever path the process runs).
TEST_F(CudaOpsTest, ArgmaxRowsMatchesTheHost) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  uint64_t seed = 90;
  for (int n : {1, 5, 1023, 1024, 1025, 32000, 128256}) {
    for (int rows : {1, 4, 16}) {
      std::vector<float> x = random_normal(size_t(rows) * n, ++seed);
      for (int r = 0; r < rows; ++r) {
        float* row = x.data() + size_t(r) * n;
        switch (r % 6) {
          case 1:  // ties: small integers, the maximum several times
            for (int i = 0; i < n; ++i) row[i] = std::round(row[i] * 2.0f);
            break;
          case 2:
            row[0] = nan;
            break;
          case 3:
            row[n / 2] = nan, row[n - 1] = inf, row[0] = -inf;
            break;
          case 4:
            for (int i = 0; i < n; ++i) row[i] = -inf;
            break;
          case 5:
            for (int i = 0; i < n; ++i) row[i] = i % 3 ? nan : row[i];
            break;
          default:
            break;
        }
      }
      if (rows == 16) {  // one row of NaN only
        for (int i = 0; i < n; ++i) x[size_t(15) * n + i] = nan;
      }
      DeviceArray xd(gpu(), x);
      testing::DeviceBytes out(gpu(), std::vector<uint16_t>(size_t(rows) * 2, 0));
      cuda::launch_argmax_rows(xd.data(), rows, n, out.as<int32_t>(),
                               static_cast<cudaStream_t>(gpu().stream()));
      std::vector<int32_t> got(rows, -1), via_backend(rows, -1);
      const std::vector<uint8_t> bytes = out.to_host();
      std::memcpy(got.data(), bytes.data(), sizeof(int32_t) * rows);
      gpu().argmax_rows(xd.data(), rows, n, via_backend.data());
      for (int r = 0; r < rows; ++r) {
        const int32_t want = argmax(x.data() + size_t(r) * n, n);
        EXPECT_EQ(got[r], want) << "n=" << n << " row " << r;
        EXPECT_EQ(via_backend[r], want) << "n=" << n << " row " << r << " (backend)";
      }
    }
  }
}

TEST_F(CudaOpsTest, CopyAndHostTransfersRoundTrip) {
  const std::vector<float> x = random_normal(12345, 40);
  DeviceArray a(gpu(), x), b(gpu(), x.size());
  gpu().copy(b.data(), a.data(), x.size());
  EXPECT_EQ(b.to_host(), x);
}

TEST(CudaSplitHeuristic, SplitsOnlyWhenBlocksAreFew) {
  // Many blocks already: no split.
  EXPECT_EQ(attention_num_splits(1 << 20, 10000, 132, 256), 1);
  // One block per kv head, long context: splits up to the block target.
  const int s = attention_num_splits(32768, 32, 132, 256);
  EXPECT_GT(s, 1);
  EXPECT_GE(s * 32, 132 * 2);
  // Never below the minimum split length, never above the cap, never 0.
  EXPECT_EQ(attention_num_splits(100, 1, 132, 256), 1);
  EXPECT_LE(attention_num_splits(1000, 1, 132, 256), 4);
  EXPECT_EQ(attention_num_splits(1 << 22, 1, 132, 7), 7);
  EXPECT_GE(attention_num_splits(1, 1, 1, 1), 1);
}

TEST(CudaSplitHeuristic, OneWaveRoundsDown) {
  // 264 slots (132 SMs x 2), 32 kv heads: 8 splits (256 blocks), not 9 (a second wave of 24).
  EXPECT_EQ(attention_num_splits_one_wave(32768, 32, 264, 256), 8);
  EXPECT_EQ(attention_num_splits_one_wave(32768, 8, 264, 256), 33);
  // More base blocks than slots, short contexts, the cap: at least 1, at most the cap.
  EXPECT_EQ(attention_num_splits_one_wave(32768, 1000, 264, 256), 1);
  EXPECT_EQ(attention_num_splits_one_wave(1000, 8, 264, 256), 4);
  EXPECT_EQ(attention_num_splits_one_wave(1 << 22, 1, 264, 7), 7);
  EXPECT_EQ(attention_num_splits_one_wave(1, 1, 1, 1), 1);
}

}  // namespace
}  // namespace qs
