// Attention on CUDA (split-KV flash-decoding, flash-attention prefill, the combine step)
// against the CPU backend, over sweeps of KV lengths, rows, head dims and GQA ratios.
//
// Tolerance (relative Frobenius error of the output): both sides compute in f32; they differ in
// summation order and in exp vs exp2 of pre-scaled scores. 2e-5 up to 4K positions; longer
// contexts add the CPU's sequential f32 sum over all positions (error ~ sqrt(n) ulp), so 5e-5 up
// to 33K and 2e-4 at 300K. The largest error of each test is printed for docs/cuda.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_test_util.h"

namespace qs {
namespace {

using testing::CudaOpsTest;
using testing::DeviceArray;
using testing::random_normal;
using testing::rel_error;

enum class Path { kAuto, kDecode, kPrefill };

double tolerance(int kv_len) {
  if (kv_len <= 4099) return 2e-5;
  if (kv_len <= 33000) return 5e-5;
  return 2e-4;
}

// K and V of num_kv_heads heads for kv_len positions, on the host and on the device.
struct KvData {
  int kv_len, num_kv_heads, head_dim;
  int64_t stride;
  std::vector<float> k, v;
  DeviceArray k_dev, v_dev;

  KvData(Backend& gpu, int len, int kvh, int hd, int64_t pad, uint64_t seed)
      : kv_len(len),
        num_kv_heads(kvh),
        head_dim(hd),
        stride(int64_t{kvh} * hd + pad),
        k(random_normal(size_t(len) * stride, seed)),
        v(random_normal(size_t(len) * stride, seed + 1)),
        k_dev(gpu, k),
        v_dev(gpu, v) {}
};

struct Case {
  int num_heads;
  int m;
  Path path = Path::kAuto;
  int splits = 0;  // 0 = heuristic
};

std::string describe(const KvData& kv, const Case& c) {
  return "kv_len=" + std::to_string(kv.kv_len) + " head_dim=" + std::to_string(kv.head_dim) +
         " heads=" + std::to_string(c.num_heads) + "/" + std::to_string(kv.num_kv_heads) +
         " m=" + std::to_string(c.m) + " splits=" + std::to_string(c.splits) +
         " stride=" + std::to_string(kv.stride);
}

// Queries are the last m positions of the view (pos = kv_len - m), as in decode/verify/prefill.
double run_case(CudaBackend& gpu, CpuBackend& cpu, const KvData& kv, const Case& c, uint64_t seed) {
  const int hd = kv.head_dim;
  const int pos = kv.kv_len - c.m;
  const AttentionShape shape{c.num_heads, kv.num_kv_heads, hd,
                             static_cast<float>(1.0 / std::sqrt(double(hd)))};
  const std::vector<float> q = random_normal(size_t(c.m) * c.num_heads * hd, seed);
  std::vector<float> want(q.size());
  cpu.attention(q.data(), c.m, pos, shape, KvView{kv.k.data(), kv.v.data(), kv.stride, kv.kv_len},
                want.data());
  DeviceArray qd(gpu, q), out(gpu, q.size());
  out.poison();
  const KvView view{kv.k_dev.data(), kv.v_dev.data(), kv.stride, kv.kv_len};
  switch (c.path) {
    case Path::kAuto:
      gpu.attention(qd.data(), c.m, pos, shape, view, out.data());
      break;
    case Path::kDecode:
      gpu.attention_decode(qd.data(), c.m, pos, shape, view, out.data(), c.splits);
      break;
    case Path::kPrefill:
      gpu.attention_prefill(qd.data(), c.m, pos, shape, view, out.data(), c.splits);
      break;
  }
  return rel_error(out.to_host(), want);
}

// Runs the cases on one KV, checks each against its tolerance and reports the worst error.
void check_cases(CudaBackend& gpu, CpuBackend& cpu, const KvData& kv,
                 const std::vector<Case>& cases, double& worst) {
  for (size_t i = 0; i < cases.size(); ++i) {
    if (cases[i].m > kv.kv_len) continue;
    const double err = run_case(gpu, cpu, kv, cases[i], 1000 + i);
    EXPECT_LT(err, tolerance(kv.kv_len)) << describe(kv, cases[i]);
    worst = std::isnan(err) ? err : std::max(worst, err);
  }
}

void report(const char* test, double worst) {
  std::printf("[ max rel error ] %s: %.3g\n", test, worst);
}

constexpr int kKvHeads = 2;
constexpr int kRatios[] = {1, 4, 8};

TEST_F(CudaOpsTest, AttentionDecodeEveryRowCount) {
  double worst = 0;
  for (int hd : {64, 128}) {
    KvData kv(gpu(), 1000, kKvHeads, hd, 0, hd);
    std::vector<Case> cases;
    for (int ratio : kRatios) {
      for (int m = 1; m <= 16; ++m) cases.push_back({kKvHeads * ratio, m, Path::kDecode});
    }
    check_cases(gpu(), cpu(), kv, cases, worst);
  }
  report("decode m=1..16", worst);
}

TEST_F(CudaOpsTest, AttentionDecodeLengthSweep) {
  double worst = 0;
  for (int len : {1, 7, 127, 128, 129, 1000, 4099, 33000}) {
    for (int hd : {64, 128}) {
      KvData kv(gpu(), len, kKvHeads, hd, 0, len + hd);
      std::vector<Case> cases;
      for (int ratio : kRatios) {
        for (int m : {1, 4, 16}) cases.push_back({kKvHeads * ratio, m});
      }
      check_cases(gpu(), cpu(), kv, cases, worst);
    }
  }
  report("decode lengths 1..33000", worst);
}

TEST_F(CudaOpsTest, AttentionDecodeVeryLongContext) {
  double worst = 0;
  KvData kv(gpu(), 300000, 1, 128, 0, 77);
  check_cases(gpu(), cpu(), kv, {{8, 1}, {8, 3}}, worst);
  report("decode 300000", worst);
}

TEST_F(CudaOpsTest, AttentionOtherHeadDims) {
  double worst = 0;
  for (int hd : {32, 256}) {
    for (int len : {129, 1000}) {
      KvData kv(gpu(), len, kKvHeads, hd, 0, 5 * hd + len);
      check_cases(gpu(), cpu(), kv,
                  {{2, 1}, {8, 1}, {16, 16}, {8, 5, Path::kDecode, 3}, {8, 40}, {4, 100}}, worst);
    }
  }
  report("head_dim 32/256", worst);
}

TEST_F(CudaOpsTest, AttentionForcedSplitsAndCombine) {
  double worst = 0;
  KvData kv(gpu(), 1000, kKvHeads, 128, 0, 9);
  std::vector<Case> cases;
  for (int splits : {1, 2, 3, 7, 64, 1000}) {
    for (int m : {1, 5, 16}) cases.push_back({8, m, Path::kDecode, splits});
    cases.push_back({8, 40, Path::kPrefill, splits});
    cases.push_back({2, 300, Path::kPrefill, splits});
  }
  check_cases(gpu(), cpu(), kv, cases, worst);
  report("forced splits", worst);
}

TEST_F(CudaOpsTest, AttentionPrefillSweep) {
  double worst = 0;
  for (int hd : {32, 64, 128, 256}) {
    for (int pos : {0, 37, 1000}) {
      for (int m : {17, 64, 100, 257}) {
        KvData kv(gpu(), pos + m, kKvHeads, hd, 0, hd + pos + m);
        std::vector<Case> cases;
        for (int ratio : kRatios) cases.push_back({kKvHeads * ratio, m});
        check_cases(gpu(), cpu(), kv, cases, worst);
      }
    }
  }
  report("prefill sweep", worst);
}

TEST_F(CudaOpsTest, AttentionPrefillLongContext) {
  double worst = 0;
  KvData kv(gpu(), 33000, kKvHeads, 128, 0, 5);
  check_cases(gpu(), cpu(), kv, {{16, 100}, {2, 17}, {16, 16, Path::kDecode}}, worst);
  report("prefill at 33000", worst);
}

TEST_F(CudaOpsTest, AttentionPaddedRowStride) {
  double worst = 0;
  KvData kv(gpu(), 777, kKvHeads, 128, 8, 6);
  check_cases(gpu(), cpu(), kv, {{8, 1}, {8, 16}, {16, 50}, {2, 700}}, worst);
  report("padded stride", worst);
}

// A small, quick subset of every attention kernel (compute-sanitizer runs this one).
TEST_F(CudaOpsTest, AttentionSanitizerSubset) {
  double worst = 0;
  KvData kv(gpu(), 300, kKvHeads, 64, 4, 3);
  check_cases(gpu(), cpu(), kv,
              {{8, 1}, {8, 16, Path::kDecode, 3}, {2, 20, Path::kPrefill, 2}, {16, 300}}, worst);
  report("sanitizer subset", worst);
}

}  // namespace
}  // namespace qs
