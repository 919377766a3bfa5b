// The Hopper wgmma prefill kernel (attention_prefill_wgmma.cu, PrefillAttentionTuning::wgmma) over
// f16 K/V rows, against the mma.sync kernel's direct path (the same arithmetic) and the CPU
// reference over the same f16 rows: head_dim 64/128, GQA 1/4/8, chunks at pos 0/37/1000/5000,
// m from 1 to 2048 (lengths that cut the 128-key tiles and 128-row query tiles), forced splits,
// padded rows (8-element pads run on it, 4-element pads fall back), rows over many decades.
//
// Tolerances: the fast path (exact_prefill = false, f16 operands) is held to 3e-3 against the CPU
// (test_attention_prefill_tc.cpp's bound for the mma.sync fast path) and 1e-3 against the mma.sync
// fast path (both round the same Q and, up to the running maximum's tile size, the same P to f16);
// the exact path to the attention tolerance (2e-5 up to 4K positions, 5e-5 beyond) against both.
// Every case also checks that the wgmma kernel really ran (its launch counter), and on the fast
// path that its warp-specialized variant (PrefillAttentionTuning::wgmma_ws) gives the same bits.
// Skipped where the kernel is unavailable (a build without sm_90a, or a device other than sm_90).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/attention_prefill_tc.h"
#include "backend/cuda/attention_prefill_wgmma.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace qs {
namespace {

using testing::CudaOpsTest;
using testing::DeviceArray;
using testing::F16Kv;
using testing::random_normal;
using testing::rel_error;
using testing::wild_f16_rows;

constexpr double kFastVsCpuTol = 3e-3;
constexpr double kFastVsMmaTol = 1e-3;

double exact_tolerance(int kv_len) {
  return kv_len <= 4099 ? 2e-5 : 5e-5;
}

// f16 rows (bits on the host and in device memory) and the f32 values they hold.
std::string describe(const F16Kv& kv, int num_heads, int m, int splits, bool exact) {
  return std::string(exact ? "exact" : "fast") + " kv_len=" + std::to_string(kv.len) +
         " head_dim=" + std::to_string(kv.head_dim) + " heads=" + std::to_string(num_heads) + "/" +
         std::to_string(kv.kv_heads) + " m=" + std::to_string(m) +
         " splits=" + std::to_string(splits) + " stride=" + std::to_string(kv.stride);
}

// Restores the process-wide tuning when a test ends (also on a failed assertion).
struct TuningGuard {
  cuda::PrefillAttentionTuning saved = cuda::prefill_attention_tuning();
  ~TuningGuard() { cuda::set_prefill_attention_tuning(saved); }
};

// ws: the wgmma kernel's warp-specialized variant (fast path), else the block-barrier one.
cuda::PrefillAttentionTuning direct_tuning(bool wgmma, bool ws = false) {
  cuda::PrefillAttentionTuning t;
  t.tensor_cores = true;
  t.direct_f16 = true;
  t.wgmma = wgmma;
  t.wgmma_ws = ws;
  return t;
}

struct Worst {
  double vs_cpu = 0, vs_mma = 0;
  static void add(double& w, double err) {
    w = std::isnan(err) || std::isnan(w) ? NAN : std::max(w, err);
  }
};

// The last m positions of kv attend (pos = len - m). Runs the CPU reference, the wgmma kernel and
// the mma.sync direct path on `be` (its exact_prefill picks the path); expect_wgmma = false: the
// call must fall back (the launch counter stays).
void run_case(CudaBackend& be, CpuBackend& cpu, const F16Kv& kv, int num_heads, int m, int splits,
              uint64_t seed, Worst& worst, float q_scale = 1.0f, bool expect_wgmma = true) {
  if (m > kv.len) return;
  const bool exact = be.options().exact_prefill;
  const int hd = kv.head_dim, pos = kv.len - m;
  const AttentionShape shape{num_heads, kv.kv_heads, hd,
                             static_cast<float>(1.0 / std::sqrt(double(hd)))};
  const std::vector<float> q = random_normal(size_t(m) * num_heads * hd, seed, q_scale);
  std::vector<float> want(q.size());
  cpu.attention(q.data(), m, pos, shape, kv.cpu_view(), want.data());
  DeviceArray qd(be, q), out(be, q.size());
  std::vector<float> got[2];  // [0] mma.sync, [1] wgmma
  for (int w = 0; w < 2; ++w) {
    cuda::set_prefill_attention_tuning(direct_tuning(w == 1));
    const int64_t launches = cuda::attention_prefill_wgmma_launches();
    out.poison();
    be.attention_prefill(qd.data(), m, pos, shape, kv.gpu_view(), out.data(), splits);
    got[w] = out.to_host();
    const int64_t ran = cuda::attention_prefill_wgmma_launches() - launches;
    EXPECT_EQ(ran, w == 1 && expect_wgmma ? 1 : 0)
        << "wgmma launches " << describe(kv, num_heads, m, splits, exact);
  }
  const std::string what = describe(kv, num_heads, m, splits, exact);
  if (expect_wgmma && !exact) {
    // The warp-specialized variant (TMA producer, mbarriers): the same arithmetic in the same
    // order, so the same bits as the wgmma kernel's.
    cuda::set_prefill_attention_tuning(direct_tuning(true, true));
    const int64_t ws_launches = cuda::attention_prefill_wgmma_ws_launches();
    out.poison();
    be.attention_prefill(qd.data(), m, pos, shape, kv.gpu_view(), out.data(), splits);
    const std::vector<float> ws = out.to_host();
    EXPECT_EQ(cuda::attention_prefill_wgmma_ws_launches() - ws_launches, 1)
        << "warp-specialized launches " << what;
    EXPECT_EQ(testing::bitwise_differences(ws, got[1]), 0u) << "warp-specialized vs wgmma " << what;
    cuda::set_prefill_attention_tuning(direct_tuning(true));
  }
  if (expect_wgmma) {
    // Again, bit for bit: the kernel has no atomics and a fixed reduction order, so a difference
    // between two runs is a race (a K/V slot refilled while a wgmma still reads it, a missing
    // wait or fence), which the error bounds below might not catch.
    out.poison();
    be.attention_prefill(qd.data(), m, pos, shape, kv.gpu_view(), out.data(), splits);
    const std::vector<float> again = out.to_host();
    EXPECT_EQ(testing::bitwise_differences(again, got[1]), 0u) << "wgmma run to run " << what;
  }
  const double vs_cpu = rel_error(got[1], want), vs_mma = rel_error(got[1], got[0]);
  EXPECT_LT(vs_cpu, exact ? exact_tolerance(kv.len) : kFastVsCpuTol) << "vs CPU " << what;
  EXPECT_LT(vs_mma, exact ? exact_tolerance(kv.len) : kFastVsMmaTol) << "vs mma.sync " << what;
  if (expect_wgmma) {
    Worst::add(worst.vs_cpu, vs_cpu);
    Worst::add(worst.vs_mma, vs_mma);
  }
}

void report(const char* test, const Worst& w) {
  std::printf("[ max rel error ] %s: vs CPU %.3g, vs mma.sync %.3g\n", test, w.vs_cpu, w.vs_mma);
}

constexpr int kKvHeads = 2;
constexpr int kRatios[] = {1, 4, 8};

class AttentionPrefillWgmmaTest : public CudaOpsTest {
 protected:
  void SetUp() override {
    CudaOpsTest::SetUp();
    if (IsSkipped()) return;
    if (!cuda::attention_prefill_wgmma_available()) {
      GTEST_SKIP() << "wgmma prefill unavailable (needs an sm_90a build on an sm_90 device)";
    }
  }
  // A backend with exact_prefill = false (--prefill-matmul bf16): the fast path.
  static std::unique_ptr<CudaBackend> fast_backend() {
    CudaBackendOptions opt;
    opt.exact_prefill = false;
    auto made = CudaBackend::create(opt);
    EXPECT_TRUE(made.ok()) << made.error().message;
    return made.ok() ? std::move(made).value() : nullptr;
  }
};

TEST_F(AttentionPrefillWgmmaTest, FastSweep) {
  TuningGuard guard;
  auto fast = fast_backend();
  ASSERT_NE(fast, nullptr);
  Worst worst;
  uint64_t seed = 1;
  for (int hd : {128, 64}) {
    for (int pos : {0, 37, 1000, 5000}) {
      for (int m : {1, 17, 128, 257}) {
        F16Kv kv(*fast, pos + m, kKvHeads, hd, 0, 11 * hd + pos + m);
        for (int ratio : kRatios) run_case(*fast, cpu(), kv, kKvHeads * ratio, m, 0, ++seed, worst);
      }
    }
  }
  report("wgmma prefill fast sweep", worst);
}

// Whole 2048-query chunks (16 query tiles, the causal diagonal in every one), from position 0 and
// after a history that is not a multiple of the key tile.
TEST_F(AttentionPrefillWgmmaTest, FastLongChunks) {
  TuningGuard guard;
  auto fast = fast_backend();
  ASSERT_NE(fast, nullptr);
  Worst worst;
  uint64_t seed = 100;
  {
    F16Kv kv(*fast, 2048, kKvHeads, 128, 0, 3);
    run_case(*fast, cpu(), kv, kKvHeads * 8, 2048, 0, ++seed, worst);
    run_case(*fast, cpu(), kv, kKvHeads * 1, 2000, 0, ++seed, worst);
  }
  {
    F16Kv kv(*fast, 5000 + 2048, kKvHeads, 128, 0, 4);
    run_case(*fast, cpu(), kv, kKvHeads * 1, 2048, 0, ++seed, worst);
  }
  {
    F16Kv kv(*fast, 1000 + 2048, kKvHeads, 64, 0, 5);
    run_case(*fast, cpu(), kv, kKvHeads * 4, 2048, 0, ++seed, worst);
  }
  report("wgmma prefill fast 2048-query chunks", worst);
}

// Forced splits (partials + the combine; splits that cut 128-key tiles and leave some query
// tiles without keys), padded rows: a pad of 8 elements keeps rows 16-byte aligned (wgmma), a pad
// of 4 does not (the mma.sync planes path; the counter must not move).
TEST_F(AttentionPrefillWgmmaTest, FastSplitsAndPaddedRows) {
  TuningGuard guard;
  auto fast = fast_backend();
  ASSERT_NE(fast, nullptr);
  Worst worst;
  uint64_t seed = 200;
  {
    F16Kv kv(*fast, 1000, kKvHeads, 128, 8, 7);
    for (int splits : {1, 2, 3, 7, 64}) {
      run_case(*fast, cpu(), kv, 8, 100, splits, ++seed, worst);
      run_case(*fast, cpu(), kv, 2, 300, splits, ++seed, worst);
    }
  }
  {
    F16Kv kv(*fast, 777, kKvHeads, 64, 8, 8);
    run_case(*fast, cpu(), kv, 8, 700, 0, ++seed, worst);
    run_case(*fast, cpu(), kv, 4, 130, 3, ++seed, worst);
  }
  {
    F16Kv kv(*fast, 500, kKvHeads, 128, 4, 9);  // 8-byte aligned rows only: falls back
    Worst fallback;
    run_case(*fast, cpu(), kv, 8, 257, 0, ++seed, fallback, 1.0f, false);
  }
  report("wgmma prefill fast splits and padded rows", worst);
}

TEST_F(AttentionPrefillWgmmaTest, FastWildRows) {
  TuningGuard guard;
  auto fast = fast_backend();
  ASSERT_NE(fast, nullptr);
  Worst worst;
  uint64_t seed = 300;
  for (int hd : {128, 64}) {
    const int len = 700;
    const int64_t stride = int64_t{kKvHeads} * hd;
    F16Kv kv(*fast, len, kKvHeads, hd, 0, wild_f16_rows(len, stride, 8, true),
             wild_f16_rows(len, stride, 9, false));
    for (float q_scale : {0.1f, 1.0f, 3.0f}) {
      run_case(*fast, cpu(), kv, 8, 300, 0, ++seed, worst, q_scale);
    }
  }
  report("wgmma prefill fast wild rows", worst);
}

// The exact path (exact_prefill, the default: Q and P as f16 hi + lo, two MMAs per product).
TEST_F(AttentionPrefillWgmmaTest, ExactSweep) {
  TuningGuard guard;
  Worst worst;
  uint64_t seed = 400;
  for (int hd : {128, 64}) {
    for (int pos : {0, 37, 1000}) {
      for (int m : {1, 17, 257}) {
        F16Kv kv(gpu(), pos + m, kKvHeads, hd, 0, 5 * hd + pos + m);
        for (int ratio : kRatios) run_case(gpu(), cpu(), kv, kKvHeads * ratio, m, 0, ++seed, worst);
      }
    }
  }
  {
    F16Kv kv(gpu(), 5000 + 600, kKvHeads, 128, 8, 10);
    run_case(gpu(), cpu(), kv, 8, 600, 0, ++seed, worst);
    run_case(gpu(), cpu(), kv, 8, 600, 5, ++seed, worst);
  }
  report("wgmma prefill exact", worst);
}

// A layout check that says what went wrong where it fails: value rows one-hot (V[t] = e_t, head_dim
// keys, head_dim 128 and 64), so each output row is its softmax weights (O[i][d] = P[i][d]). A
// wrong V layout permutes the columns of O (the test prints, for the last row, which reference
// column each output column matches); a wrong K layout or Q / P fragment garbles the weights
// themselves. The largest error per 16 query rows (one warp of a warpgroup: rows 16 w..16 w + 15
// of warpgroup w / 4) separates a register-fragment mistake (some warps or rows) from a shared
// memory one (all rows). Both paths (fast, exact).
TEST_F(AttentionPrefillWgmmaTest, OneHotValuesShowTheWeights) {
  TuningGuard guard;
  auto fast = fast_backend();
  ASSERT_NE(fast, nullptr);
  for (int hd : {128, 64}) {
    for (bool exact : {false, true}) {
      CudaBackend& be = exact ? gpu() : *fast;
      ASSERT_EQ(be.options().exact_prefill, exact);
      const int len = hd;
      std::vector<float> kf = random_normal(size_t(len) * hd, 21), vf(size_t(len) * hd, 0.0f);
      for (int t = 0; t < len; ++t) vf[size_t(t) * hd + t] = 1.0f;
      F16Kv kv(be, len, 1, hd, 0, kf, vf);
      const AttentionShape shape{1, 1, hd, static_cast<float>(1.0 / std::sqrt(double(hd)))};
      const std::vector<float> q = random_normal(size_t(len) * hd, 22);
      std::vector<float> want(q.size());
      cpu().attention(q.data(), len, 0, shape, kv.cpu_view(), want.data());
      DeviceArray qd(be, q), out(be, q.size());
      cuda::set_prefill_attention_tuning(direct_tuning(true));
      const int64_t launches = cuda::attention_prefill_wgmma_launches();
      out.poison();
      be.attention_prefill(qd.data(), len, 0, shape, kv.gpu_view(), out.data(), 1);
      const std::vector<float> got = out.to_host();
      EXPECT_EQ(cuda::attention_prefill_wgmma_launches() - launches, 1);
      const double err = rel_error(got, want);
      const double tol = exact ? exact_tolerance(len) : kFastVsCpuTol;
      EXPECT_LT(err, tol) << (exact ? "exact" : "fast") << " head_dim=" << hd;
      std::printf("[ max rel error ] wgmma one-hot values, %s head_dim %d: %.3g\n",
                  exact ? "exact" : "fast", hd, err);
      if (err < tol) continue;
      std::string groups;
      for (int r0 = 0; r0 < len; r0 += 16) {
        double worst = 0.0;
        for (size_t i = size_t(r0) * hd; i < size_t(r0 + 16) * hd; ++i) {
          const double d = std::abs(double(got[i]) - want[i]);
          worst = std::isnan(d) ? INFINITY : std::max(worst, d);
        }
        char entry[48];
        std::snprintf(entry, sizeof(entry), " rows %d..%d: %.2g;", r0, r0 + 15, worst);
        groups += entry;
      }
      std::printf("largest error per 16 rows:%s\n", groups.c_str());
      const float* g = got.data() + size_t(len - 1) * hd;
      const float* w = want.data() + size_t(len - 1) * hd;
      std::string map;
      for (int d = 0; d < hd; ++d) {
        int best = 0;
        for (int e = 1; e < hd; ++e) {
          if (std::abs(g[d] - w[e]) < std::abs(g[d] - w[best])) best = e;
        }
        char entry[32];
        std::snprintf(entry, sizeof(entry), " %d<-%d", d, best);
        map += entry;
      }
      std::printf("last row, output column <- closest reference column:%s\n", map.c_str());
      std::printf("row 0 (one visible key): got %g %g %g, want %g %g %g\n", got[0], got[1], got[2],
                  want[0], want[1], want[2]);
    }
  }
}

// On by default; with it off the mma.sync kernel runs, with it on this one (the counter). The
// fast path's default is the warp-specialized variant.
TEST_F(AttentionPrefillWgmmaTest, OnByDefault) {
  TuningGuard guard;
  EXPECT_TRUE(cuda::PrefillAttentionTuning{}.wgmma);
  EXPECT_TRUE(cuda::PrefillAttentionTuning{}.wgmma_ws);
  F16Kv kv(gpu(), 300, kKvHeads, 128, 0, 12);
  const AttentionShape shape{8, kKvHeads, 128, static_cast<float>(1.0 / std::sqrt(128.0))};
  const std::vector<float> q = random_normal(size_t(100) * 8 * 128, 13);
  DeviceArray qd(gpu(), q), out(gpu(), q.size());
  for (bool on : {false, true}) {
    cuda::set_prefill_attention_tuning(direct_tuning(on));
    const int64_t launches = cuda::attention_prefill_wgmma_launches();
    gpu().attention_prefill(qd.data(), 100, 200, shape, kv.gpu_view(), out.data());
    EXPECT_EQ(cuda::attention_prefill_wgmma_launches() - launches, on ? 1 : 0);
  }
  auto fast = fast_backend();
  ASSERT_NE(fast, nullptr);
  F16Kv kv_fast(*fast, 300, kKvHeads, 128, 0, 12);
  DeviceArray qf(*fast, q), out_fast(*fast, q.size());
  for (bool exact_backend : {true, false}) {
    cuda::set_prefill_attention_tuning(cuda::PrefillAttentionTuning{});
    const int64_t ws = cuda::attention_prefill_wgmma_ws_launches();
    if (exact_backend) {
      gpu().attention_prefill(qd.data(), 100, 200, shape, kv.gpu_view(), out.data());
    } else {
      fast->attention_prefill(qf.data(), 100, 200, shape, kv_fast.gpu_view(), out_fast.data());
    }
    EXPECT_EQ(cuda::attention_prefill_wgmma_ws_launches() - ws, exact_backend ? 0 : 1);
  }
}

}  // namespace
}  // namespace qs
