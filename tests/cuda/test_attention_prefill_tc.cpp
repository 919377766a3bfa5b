// The tensor-core prefill attention (attention_prefill_tc.cu) and the f32 CUDA-core prefill
// kernel it replaces, both against the CPU backend: odd lengths, chunks at pos > 0, head_dim
// 64/128, GQA 1/4/8, m up to 600, forced splits, 33K positions, padded rows, and operands whose
// magnitudes span many decades (the per-tile power-of-two scaling of the f16 hi/lo halves).
//
// Tolerances are test_attention.cpp's (relative Frobenius error of the output): 2e-5 up to 4K
// positions, 5e-5 up to 33K. The tensor-core kernel carries 22 significant bits per operand
// (f16 hi + lo) and accumulates in f32, so it should land near the f32 kernel's errors. The
// largest error of each test and path is printed for docs/cuda.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/attention_prefill_tc.h"
#include "cuda_test_util.h"

namespace qs {
namespace {

using testing::CudaOpsTest;
using testing::DeviceArray;
using testing::random_normal;
using testing::rel_error;

double tolerance(int kv_len) {
  return kv_len <= 4099 ? 2e-5 : 5e-5;
}

// K and V of num_kv_heads heads for kv_len positions, on the host and on the device.
struct Kv {
  int kv_len, num_kv_heads, head_dim;
  int64_t stride;
  std::vector<float> k, v;

  Kv(int len, int kvh, int hd, int64_t pad, uint64_t seed)
      : kv_len(len),
        num_kv_heads(kvh),
        head_dim(hd),
        stride(int64_t{kvh} * hd + pad),
        k(random_normal(size_t(len) * stride, seed)),
        v(random_normal(size_t(len) * stride, seed + 1)) {}
};

struct Case {
  int num_heads;
  int m;
  int splits = 0;  // 0 = heuristic
};

std::string describe(const Kv& kv, const Case& c) {
  return "kv_len=" + std::to_string(kv.kv_len) + " head_dim=" + std::to_string(kv.head_dim) +
         " heads=" + std::to_string(c.num_heads) + "/" + std::to_string(kv.num_kv_heads) +
         " m=" + std::to_string(c.m) + " splits=" + std::to_string(c.splits) +
         " stride=" + std::to_string(kv.stride);
}

// Worst errors of the two prefill paths over a test.
struct Worst {
  double tc = 0, f32 = 0;
  void add(double& w, double err) { w = std::isnan(err) || std::isnan(w) ? NAN : std::max(w, err); }
};

// Restores the process-wide tuning when a test ends (also on a failed assertion).
struct TuningGuard {
  cuda::PrefillAttentionTuning saved = cuda::prefill_attention_tuning();
  ~TuningGuard() { cuda::set_prefill_attention_tuning(saved); }
};

// Queries are the last m positions of the view (pos = kv_len - m); q_scale multiplies the
// random queries (peaked or flat softmax). Runs the CPU reference once and both GPU paths.
void run_case(CudaBackend& gpu, CpuBackend& cpu, const Kv& kv, const DeviceArray& k_dev,
              const DeviceArray& v_dev, const Case& c, uint64_t seed, Worst& worst,
              float q_scale = 1.0f) {
  const int hd = kv.head_dim;
  const int pos = kv.kv_len - c.m;
  const AttentionShape shape{c.num_heads, kv.num_kv_heads, hd,
                             static_cast<float>(1.0 / std::sqrt(double(hd)))};
  const std::vector<float> q = random_normal(size_t(c.m) * c.num_heads * hd, seed, q_scale);
  std::vector<float> want(q.size());
  cpu.attention(q.data(), c.m, pos, shape, KvView{kv.k.data(), kv.v.data(), kv.stride, kv.kv_len},
                want.data());
  DeviceArray qd(gpu, q), out(gpu, q.size());
  const KvView view{k_dev.data(), v_dev.data(), kv.stride, kv.kv_len};
  for (bool tc : {true, false}) {
    cuda::set_prefill_attention_tuning({tc});
    out.poison();
    gpu.attention_prefill(qd.data(), c.m, pos, shape, view, out.data(), c.splits);
    const double err = rel_error(out.to_host(), want);
    EXPECT_LT(err, tolerance(kv.kv_len))
        << (tc ? "tensor cores " : "f32 kernel ") << describe(kv, c);
    worst.add(tc ? worst.tc : worst.f32, err);
  }
}

void check_cases(CudaBackend& gpu, CpuBackend& cpu, const Kv& kv, const std::vector<Case>& cases,
                 Worst& worst, float q_scale = 1.0f) {
  const DeviceArray k_dev(gpu, kv.k), v_dev(gpu, kv.v);
  for (size_t i = 0; i < cases.size(); ++i) {
    if (cases[i].m > kv.kv_len) continue;
    run_case(gpu, cpu, kv, k_dev, v_dev, cases[i], 2000 + i, worst, q_scale);
  }
}

void report(const char* test, const Worst& worst) {
  std::printf("[ max rel error ] %s: tensor cores %.3g, f32 kernel %.3g\n", test, worst.tc,
              worst.f32);
}

constexpr int kKvHeads = 2;
constexpr int kRatios[] = {1, 4, 8};

TEST_F(CudaOpsTest, AttentionPrefillTcSweep) {
  TuningGuard guard;
  Worst worst;
  for (int hd : {64, 128}) {
    for (int pos : {0, 37, 1000}) {
      for (int m : {17, 64, 100, 129, 257, 600}) {
        if (m == 600 && pos == 37) continue;  // enough of the largest size
        Kv kv(pos + m, kKvHeads, hd, 0, hd + pos + m);
        std::vector<Case> cases;
        for (int ratio : kRatios) cases.push_back({kKvHeads * ratio, m});
        check_cases(gpu(), cpu(), kv, cases, worst);
      }
    }
  }
  report("prefill tc sweep", worst);
}

// Splits that start and end inside 64-key tiles, 128-row query tiles cut by m.
TEST_F(CudaOpsTest, AttentionPrefillTcForcedSplits) {
  TuningGuard guard;
  Worst worst;
  for (int hd : {64, 128}) {
    Kv kv(1000, kKvHeads, hd, 0, 9 + hd);
    std::vector<Case> cases;
    for (int splits : {1, 2, 3, 7, 64, 1000}) {
      cases.push_back({8, 40, splits});
      cases.push_back({2, 300, splits});
      cases.push_back({4, 129, splits});
    }
    check_cases(gpu(), cpu(), kv, cases, worst);
  }
  report("prefill tc forced splits", worst);
}

TEST_F(CudaOpsTest, AttentionPrefillTcLongContext) {
  TuningGuard guard;
  Worst worst;
  Kv kv(33000, kKvHeads, 128, 0, 5);
  check_cases(gpu(), cpu(), kv, {{16, 100}, {2, 17}, {8, 300}}, worst);
  report("prefill tc at 33000", worst);
}

TEST_F(CudaOpsTest, AttentionPrefillTcPaddedRowStride) {
  TuningGuard guard;
  Worst worst;
  Kv kv(777, kKvHeads, 128, 8, 6);
  check_cases(gpu(), cpu(), kv, {{16, 50}, {2, 700}, {8, 130}}, worst);
  Kv kv64(301, 4, 64, 4, 7);
  check_cases(gpu(), cpu(), kv64, {{4, 301}, {16, 64}}, worst);
  report("prefill tc padded stride", worst);
}

// Magnitudes over many decades: key rows scaled by 10^(u/2) (u in [-4, 1]), value rows by 10^u
// (u in [-4, 3]), whole 64-key tiles of tiny or zero values, a constant large key channel (LLM
// "massive" channels), queries from flat (0.05) to peaked (3x) softmax. The per-row and per-tile
// powers of two must keep every f16 half in range and accurate. (Scores stay within ~10 so that
// the f32 reference itself is well conditioned: softmax amplifies score rounding by |s|.)
TEST_F(CudaOpsTest, AttentionPrefillTcMagnitudes) {
  TuningGuard guard;
  Worst worst;
  for (int hd : {64, 128}) {
    const int len = 700;
    Kv kv(len, kKvHeads, hd, 0, 31 + hd);
    const std::vector<float> u = random_normal(size_t(len) * 2, 77);
    for (int t = 0; t < len; ++t) {
      const float ks = std::pow(10.0f, std::clamp(std::round(u[2 * t]), -4.0f, 1.0f) * 0.5f);
      float vs = std::pow(10.0f, std::clamp(std::round(u[2 * t + 1] * 2), -4.0f, 3.0f));
      if (t >= 128 && t < 192) vs = 1e-6f;  // a whole tile of tiny values
      if (t >= 256 && t < 320) vs = 0.0f;   // a whole tile of zeros
      for (int64_t i = 0; i < kv.stride; ++i) {
        kv.k[t * kv.stride + i] *= ks;
        kv.v[t * kv.stride + i] *= vs;
      }
      kv.k[t * kv.stride] = 20.0f;  // kv head 0, channel 0: constant and large
    }
    for (float q_scale : {0.05f, 1.0f, 3.0f}) {
      check_cases(gpu(), cpu(), kv, {{8, 700}, {2, 150}}, worst, q_scale);
    }
  }
  report("prefill tc magnitudes", worst);
}

// CudaBackendOptions::exact_prefill = false (--prefill-matmul bf16): one MMA per product on the
// f16 hi parts. Held to f16-operand accuracy (2^-11 per operand, power-of-two scaled) against
// the CPU, and it must really differ from the exact path (the lo terms are gone).
TEST_F(CudaOpsTest, AttentionPrefillTcFastIsF16Accurate) {
  CudaBackendOptions opt;
  opt.exact_prefill = false;
  auto fast = CudaBackend::create(opt);
  ASSERT_TRUE(fast.ok()) << fast.error().message;
  double worst = 0, least_diff = 1;
  for (int hd : {64, 128}) {
    for (int pos : {0, 1000}) {
      for (int m : {129, 600}) {
        Kv kv(pos + m, kKvHeads, hd, 0, 7 * hd + pos + m);
        for (int ratio : {1, 8}) {
          for (int splits : {0, 3}) {
            const Case c{kKvHeads * ratio, m, splits};
            const AttentionShape shape{c.num_heads, kKvHeads, hd,
                                       static_cast<float>(1.0 / std::sqrt(double(hd)))};
            const std::vector<float> q =
                random_normal(size_t(m) * c.num_heads * hd, 77 + pos + m + ratio);
            std::vector<float> want(q.size());
            cpu().attention(q.data(), m, pos, shape,
                            KvView{kv.k.data(), kv.v.data(), kv.stride, kv.kv_len}, want.data());
            std::vector<float> got[2];
            for (int e = 0; e < 2; ++e) {
              CudaBackend& be = e == 0 ? **fast : gpu();
              const DeviceArray k_dev(be, kv.k), v_dev(be, kv.v), qd(be, q);
              DeviceArray out(be, q.size());
              out.poison();
              be.attention_prefill(qd.data(), m, pos, shape,
                                   KvView{k_dev.data(), v_dev.data(), kv.stride, kv.kv_len},
                                   out.data(), splits);
              got[e] = out.to_host();
            }
            const double err = rel_error(got[0], want);
            EXPECT_LT(err, 3e-3) << "fast " << describe(kv, c);
            EXPECT_LT(rel_error(got[1], want), tolerance(kv.kv_len)) << "exact " << describe(kv, c);
            worst = std::max(worst, err);
            least_diff = std::min(least_diff, rel_error(got[0], got[1]));
          }
        }
      }
    }
  }
  EXPECT_GT(least_diff, 1e-6);  // the fast path ran
  std::printf(
      "[ max rel error ] prefill tc fast (f16 operands): %.3g (least difference from "
      "exact %.3g)\n",
      worst, least_diff);
}

}  // namespace
}  // namespace qs
